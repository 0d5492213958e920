"""`corral k8s scheduler --queues` on a REAL plane: serve's no-starvation and fair-share scenarios (issue 25).

    PYTHONPATH=. CORRAL_K8S_CONTROL_PLANE=../shared/k8s/control-plane.sh python -m benchmarks.k8s_tenancy

One plane (tests/k8s/plane.py: etcd + kube-apiserver, no kubelet), one node of 4 GPUs. Pods never run there, so this
script is their kubelet: a pod bound for its duration (annotation bench/duration) is deleted (grace 0), which frees
its GPUs as a pod that ends. Each scenario runs twice, with `--queues` and without (arrival order, micro-batches);
fair first (starvation's stream would make ns-b the heavier user, and DRF would then rightly serve ns-a first).

starvation  1-GPU pods of 2 s (activeDeadlineSeconds 2) arrive every 0.5 s for 15 s in ns-b; at 1 s a 4-GPU pod of
            2 s arrives. With queues it is the head: its reservation is when the running pods end, pods behind it
            that would run past that wait, and it starts at its reservation. Without, it waits for the stream to end.
fair        ns-a submits 24 pods of 1 GPU, 2 s each, at 0 s; ns-b one pod at 1 s. Queues team-a (ns-a) and team-b
            (ns-b), equal weights: with queues ns-b's pod starts at the next free GPU (its fair turn); without, after
            ns-a's whole burst.
"""

from __future__ import annotations

import datetime
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._k8s_plane import SchedulerProcess, Writer
from tests.k8s.plane import Plane, gpu_node, pod

QUEUES = """
[queues.team-a]
namespaces = ["ns-a"]
[queues.team-b]
namespaces = ["ns-b"]
"""
_ESTIMATE = re.compile(r"estimated start (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC")


@dataclass
class Run:
    t0: float = field(default_factory=time.time)
    bound_at: dict[str, float] = field(default_factory=dict)  # "ns/name" -> seconds since t0
    estimate: dict[str, float] = field(default_factory=dict)  # first estimated start seen, seconds since t0


def bench_pod(name: str, ns: str, gpus: int, seconds: int) -> dict[str, Any]:
    p = pod(name, {"nvidia.com/gpu": str(gpus)}, scheduler="corral", cpu="100m", memory="128Mi")
    p["metadata"]["namespace"] = ns
    p["metadata"]["annotations"] = {"bench/duration": str(seconds)}
    p["spec"]["activeDeadlineSeconds"] = seconds
    return p


def drive(w: Writer, arrivals: list[tuple[float, dict[str, Any]]], until: float, watch: str) -> Run:
    """Create each pod at its time, end each bound pod after its duration, record binds and `watch`'s estimate."""
    run = Run()
    todo = sorted(arrivals, key=lambda a: a[0])
    while True:
        now = time.time() - run.t0
        while todo and todo[0][0] <= now:
            _, obj = todo.pop(0)
            w.request("POST", f"/api/v1/namespaces/{obj['metadata']['namespace']}/pods", obj)
        for ns in ("ns-a", "ns-b"):
            for p in w.pods(namespace=ns):
                meta, key = p["metadata"], f"{ns}/{p['metadata']['name']}"
                if p["spec"].get("nodeName"):
                    run.bound_at.setdefault(key, now)
                    if now - run.bound_at[key] >= float(meta["annotations"]["bench/duration"]):
                        w.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{meta['name']}", {"gracePeriodSeconds": 0})
                elif key == watch and key not in run.estimate:
                    conds = (p.get("status") or {}).get("conditions") or []
                    for c in conds:
                        m = _ESTIMATE.search(str(c.get("message") or ""))
                        if m:
                            at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
                            run.estimate[key] = at.replace(tzinfo=datetime.UTC).timestamp() - run.t0
        if (now > until and not todo) or (watch in run.bound_at and not todo and now > until / 2):
            return run
        time.sleep(0.05)


def clean(w: Writer) -> None:
    for ns in ("ns-a", "ns-b"):
        w.delete_pods(namespace=ns)


def starvation(w: Writer) -> Run:
    arrivals = [(0.5 * i, bench_pod(f"s{i}", "ns-b", 1, 2)) for i in range(30)]
    arrivals.append((1.0, bench_pod("big", "ns-b", 4, 2)))
    return drive(w, arrivals, 25.0, "ns-b/big")


def fair(w: Writer) -> Run:
    arrivals = [(0.0, bench_pod(f"a{i}", "ns-a", 1, 2)) for i in range(24)]
    arrivals.append((1.0, bench_pod("b0", "ns-b", 1, 2)))
    return drive(w, arrivals, 20.0, "ns-b/b0")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="k8s-tenancy-") as tmp:
        where = Path(tmp)
        plane = Plane.find(where)
        if plane is None:
            raise SystemExit("no control plane here (../shared/k8s/control-plane.sh)")
        try:
            kubeconfig = plane.up()
            w = Writer(kubeconfig)
            for ns in ("ns-a", "ns-b"):
                w.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": ns}})  # fmt: skip
            w.create_nodes([gpu_node("node-0", 4)])
            queues = where / "queues.toml"
            queues.write_text(QUEUES)
            for label, extra in (("--queues", ("--queues", str(queues))), ("no queues file", ())):
                s = SchedulerProcess(kubeconfig, where / f"scheduler-{len(extra)}.log", "--policy", "binpack", *extra)
                s.start(wait=True)
                try:
                    r = fair(w)
                    clean(w)
                    b0 = r.bound_at.get("ns-b/b0")
                    a_before = sum(1 for k, t in r.bound_at.items() if k.startswith("ns-a/") and t < (b0 or 1e9))
                    print(f"[{label}] fair: ns-b's first pod (arrived 1.0 s) bound at "
                          f"{'never' if b0 is None else f'{b0:.1f} s'}, after {a_before} of ns-a's 24")  # fmt: skip
                    r = starvation(w)
                    clean(w)
                    big, est = r.bound_at.get("ns-b/big"), r.estimate.get("ns-b/big")
                    late = {f"ns-b/s{i}" for i in range(30) if 0.5 * i > 1.0}  # arrived after the big pod
                    behind = sum(1 for k, t in r.bound_at.items() if k in late and big is not None and t < big)
                    print(f"[{label}] starvation: the 4-GPU pod (arrived 1.0 s) bound at "
                          f"{'never' if big is None else f'{big:.1f} s'}; its first estimated start "
                          f"{'none' if est is None else f'{est:.1f} s'}; 1-GPU pods that arrived after it and were "
                          f"bound before it: {behind}")  # fmt: skip
                finally:
                    s.stop()
        finally:
            plane.down()
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
          f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")  # fmt: skip


if __name__ == "__main__":
    main()
