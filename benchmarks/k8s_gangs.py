"""Gangs on `corral k8s scheduler` against a real kube-apiserver (issue 25's rows):

    whole: a 64-pod gang (PodGroup minMember 64, 1 GPU each) on a plane with room (32 nodes x 8 GPUs): the time from
           its last member's creation to the last member's bind (target: within 2 s)
    wait:  a 10-pod gang of whole-node pods (8 GPUs each) when only 5 nodes fit it: none bound after the scheduler
           has said why; then 5 more nodes: all 10 bound, and the time from the last node's creation to the last bind

    kill:  a 16-pod gang whose Bindings go through a gate (tests/k8s/binding_proxy.py, a second scheduler
           --scheduler-name corral-gate --gang-timeout-s 5): 8 let through, the scheduler killed (-9), the other 8
           reset unsent, the scheduler started again: with room, the time from its start to the gang whole; with the
           nodes cordoned meanwhile, the time from its start to the bound part deleted (none bound)

    python -m benchmarks.k8s_gangs [--runs 3] [--write BENCHMARKS.md]

Needs ../shared/k8s/control-plane.sh (or CORRAL_K8S_CONTROL_PLANE). The plane is made with the shipped PodGroup CRD.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from benchmarks._k8s_plane import BindWatch, SchedulerProcess, Writer, labelled
from benchmarks.k8s_standalone import machine
from tests.k8s.binding_proxy import BindingProxy
from tests.k8s.chart import DEPLOY
from tests.k8s.plane import Plane, gpu_node, pod

PG = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/default/podgroups"


GATE_TIMEOUT_S = 5


def _member(name: str, gang: str, gpus: int, run: str, scheduler: str = "corral") -> dict[str, Any]:
    p = pod(name, {"nvidia.com/gpu": str(gpus)}, scheduler=scheduler, cpu="100m", memory="128Mi")
    p["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": gang}
    return labelled(p, run)


def _group(w: Writer, name: str, n: int) -> None:
    w.request("POST", PG, {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                           "metadata": {"name": name, "namespace": "default"}, "spec": {"minMember": n}})  # fmt: skip


def _condition(p: dict[str, Any]) -> str:
    conds = (p.get("status") or {}).get("conditions") or []
    return str(next((c.get("message") or "" for c in conds if c.get("type") == "PodScheduled"), ""))


def whole(w: Writer, run: str, size: int = 64) -> dict[str, Any]:
    gang = f"whole-{run}"
    _group(w, gang, size)
    watch = BindWatch(w, run, size)
    try:
        w.create_pods(_member(f"{gang}-{i}", gang, 1, run) for i in range(size - 1))
        last = time.monotonic()  # just before the last member's creation
        w.create_pods([_member(f"{gang}-{size - 1}", gang, 1, run)])
        ok = watch.wait(60)
        took = max(watch.bound.values()) - last if ok else float("nan")
        early = sum(1 for t in watch.bound.values() if t < last)
    finally:
        watch.close()
    w.delete_pods(label=f"corral.dev/bench-run={run}")
    return {"case": f"a {size}-pod gang on a plane with room", "bound": len(watch.bound), "pods": size,
            "bound_before_last": early, "whole_after_last_s": round(took, 3)}  # fmt: skip


def wait_then_all(w: Writer, run: str, first_nodes: list[str], more_nodes: list[str]) -> dict[str, Any]:
    gang = f"wait-{run}"
    _group(w, gang, 10)
    watch = BindWatch(w, run, 10)
    try:
        w.create_pods(_member(f"{gang}-{i}", gang, 8, run) for i in range(10))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # all ten say the gang is whole and does not fit (a condition is
            pods = w.pods(label=f"corral.dev/bench-run={run}")  # rewritten at most every 10 s: this takes a while)
            if len(pods) == 10 and all("10 of 10 members pending" in _condition(p) for p in pods):
                break
            time.sleep(0.2)
        said = _condition(pods[0])
        bound_while_5 = len(watch.bound)
        w.create_nodes(gpu_node(n, 8) for n in more_nodes[:-1])
        last = time.monotonic()
        w.create_nodes([gpu_node(more_nodes[-1], 8)])
        ok = watch.wait(60)
        took = max(watch.bound.values()) - last if ok else float("nan")
    finally:
        watch.close()
    w.delete_pods(label=f"corral.dev/bench-run={run}")
    for n in more_nodes:
        w.request("DELETE", f"/api/v1/nodes/{n}")
    return {"case": f"a 10-pod gang when only {len(first_nodes)} nodes fit it, then 10",
            "bound_with_5": bound_while_5, "bound_with_10": len(watch.bound), "pods": 10,
            "all_after_last_node_s": round(took, 3), "reason_with_5": said}  # fmt: skip


def _until(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def kill_mid_gang(w: Writer, proxy: BindingProxy, sched: SchedulerProcess, run: str, room: bool,
                  nodes: list[str], size: int = 16, k: int = 8) -> dict[str, Any]:  # fmt: skip
    gang = f"kill-{run}"
    sel = f"corral.dev/bench-run={run}"

    def bound() -> set[str]:
        return {p["metadata"]["name"] for p in w.pods(label=sel) if p["spec"].get("nodeName")}

    _group(w, gang, size)
    proxy.hold()
    w.create_pods(_member(f"{gang}-{i}", gang, 1, run, scheduler="corral-gate") for i in range(size))
    _until(f"{size} Bindings at the gate", lambda: proxy.waiting() == size)
    proxy.allow(k)
    _until(f"{k} bound", lambda: len(bound()) == k and proxy.waiting() == size - k)
    sched.kill()
    proxy.drop()
    _until("the gate empty", lambda: proxy.waiting() == 0)
    proxy.open()
    part = bound()
    if not room:
        for n in nodes:
            obj = w.get(f"/api/v1/nodes/{n}")
            obj["spec"]["unschedulable"] = True
            w.request("PUT", f"/api/v1/nodes/{n}", obj)
    watch = BindWatch(w, run, size - k)
    try:
        sched.start(wait=False)
        t0 = sched.started
        if room:
            ok = watch.wait(60)
            took = max(watch.bound.values()) - t0 if ok else float("nan")
        else:
            _until("the bound part deleted", lambda: not part & {p["metadata"]["name"] for p in w.pods(label=sel)})
            took = time.monotonic() - t0
        left = bound()
    finally:
        watch.close()
    w.delete_pods(label=sel)
    case = "kill -9 after 8 of a 16-pod gang's Bindings, " + ("with room" if room else "the nodes cordoned meanwhile")
    return {"case": case, "bound_at_kill": len(part), "bound_at_end": len(left), "pods": size,
            ("whole_after_start_s" if room else "deleted_after_start_s"): round(took, 3)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--write", type=Path, help="append the results to this file (BENCHMARKS.md)")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="corral-k8s-gangs-") as tmp:
        where = Path(tmp)
        plane = Plane.find(where / "plane")
        if plane is None:
            raise SystemExit("no control plane: set CORRAL_K8S_CONTROL_PLANE to control-plane.sh")
        sched: SchedulerProcess | None = None
        gate: SchedulerProcess | None = None
        stack = contextlib.ExitStack()
        try:
            w = Writer(plane.up())
            [crd] = [d for d in yaml.safe_load_all((DEPLOY / "corral-standalone.yaml").read_text())
                     if d and d["kind"] == "CustomResourceDefinition"]  # fmt: skip
            w.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            time.sleep(2)  # the CRD is served a moment after it is created
            sched = SchedulerProcess(plane.kubeconfig, where / "scheduler.log", "--policy", "binpack")
            sched.start(wait=True)
            proxy = stack.enter_context(BindingProxy(plane.kubeconfig))
            gate = SchedulerProcess(proxy.kubeconfig(where / "gate-kubeconfig"), where / "gate.log", "--policy",
                                    "binpack", "--scheduler-name", "corral-gate", "--gang-timeout-s",
                                    str(GATE_TIMEOUT_S))  # fmt: skip
            gate.start(wait=True)
            for k in range(args.runs):
                w.create_nodes(gpu_node(f"room-{k}-{i}", 8) for i in range(32))
                rows.append(whole(w, f"g{k}"))
                print(rows[-1], flush=True)
                for i in range(32):
                    w.request("DELETE", f"/api/v1/nodes/room-{k}-{i}")
                first = [f"five-{k}-{i}" for i in range(5)]
                w.create_nodes(gpu_node(n, 8) for n in first)
                rows.append(wait_then_all(w, f"w{k}", first, [f"more-{k}-{i}" for i in range(5)]))
                print(rows[-1], flush=True)
                for n in first:
                    w.request("DELETE", f"/api/v1/nodes/{n}")
                for room in (True, False):
                    nodes = [f"kill-{k}-{int(room)}-{i}" for i in range(4)]
                    w.create_nodes(gpu_node(n, 8) for n in nodes)
                    rows.append(kill_mid_gang(w, proxy, gate, f"k{k}{int(room)}", room, nodes))
                    print(rows[-1], flush=True)
                    for n in nodes:
                        w.request("DELETE", f"/api/v1/nodes/{n}")
        finally:
            for p in (sched, gate):
                if p is not None:
                    p.stop()
            stack.close()
            plane.down()
    if args.write:
        when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        lines = [f"\n### Run of {when} ({machine()})\n", "| what | result |", "|---|---|"]
        for r in rows:
            if "whole_after_start_s" in r:
                res = (f"{r['bound_at_kill']}/{r['pods']} bound at the kill; {r['bound_at_end']}/{r['pods']} bound "
                       f"{r['whole_after_start_s']} s after the restart began (the bound part kept)")  # fmt: skip
            elif "deleted_after_start_s" in r:
                res = (f"{r['bound_at_kill']}/{r['pods']} bound at the kill; bound part deleted "
                       f"{r['deleted_after_start_s']} s after the restart began (--gang-timeout-s {GATE_TIMEOUT_S}), "
                       f"{r['bound_at_end']} bound after")  # fmt: skip
            elif "whole_after_last_s" in r:
                res = (f"{r['bound']}/{r['pods']} bound, {r['bound_before_last']} before the last member existed; "
                       f"whole {r['whole_after_last_s']} s after the last member's creation")  # fmt: skip
            else:
                res = (f"{r['bound_with_5']}/10 bound on 5 nodes (\"{r['reason_with_5']}\"); "
                       f"{r['bound_with_10']}/10 bound "
                       f"{r['all_after_last_node_s']} s after the 10th node's creation")  # fmt: skip
            lines.append(f"| {r['case']} | {res} |")
        with args.write.open("a") as fh:
            fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
