"""Issue 25's round on a real plane: `corral k8s scheduler --queues` over 10,000 pending pods in 4 queues and 5,000
nodes, timed by the scheduler itself (its `corral_scheduler_batch_duration_seconds`: the CPU side of one round, under
the books' lock: every waiting pod read and fenced, `_plan`, each waiting pod's words).

    CORRAL_K8S_CONTROL_PLANE=../shared/k8s/control-plane.sh python -m benchmarks.k8s_round_plane \\
        [--nodes 5000] [--pending 10000] [--trickle 20]

The books as `benchmarks/k8s_round.py` builds them in process, but as API objects on a real etcd + kube-apiserver
(no kubelet): `--nodes` nodes of 8 A100s (corral's device-plugin annotation); 8 pods bound on each (7 on the first
100: those keep a GPU free), one GPU each, with corral's assignment annotations, in namespaces team-0..3 (team-0
holds twice its guaranteed quarter, team-3 about half of its own); the queues file guarantees each team a quarter,
with a minimum runtime of 1 h. The scheduler starts on those books, then `--pending` pods of 1, 2, 4 and 8 GPUs
(4:3:2:1, time limits 1-4 h) are created over the four namespaces: the free GPUs are bound, the rest wait, and the
head of team-3 (below its guarantee) would preempt team-0's borrowers, all still within their minimum runtime: every
round works out when preemption would first help (the in-process `--recent` case). Once the scheduler has written
every waiting pod's words (no condition or event written for 5 s: the burst's writes, and the watch events they
cause, done), `--trickle` more pods, one a second, each making a round over every waiting pod; the rounds counted are
those from the first trickled pod on. Scheduler, API server and etcd share the machine's cores.

`--churn`: with each trickled pod, one bound pod of team-0 (the borrower) ends (deleted at once, as its kubelet would
once it exits): the round binds a waiting pod on the GPU it frees, so the next one sees the bound pods changed, as a
cluster where pods come and go does (in process: `k8s_round --churn`).
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks._k8s_plane import SchedulerProcess, Writer, plane_in
from benchmarks.k8s_round import QUEUES, queues_file
from benchmarks.k8s_standalone import CORRAL, machine
from corral.k8s.convert import Assignment, GpuSlot, assignment_annotations
from tests.k8s.plane import gpu_node, pod

GPUS = 8
GPU_MEMORY = 81920
BUCKET = 0.2  # the target, and one of the histogram's bounds (metrics.LATENCY_BUCKETS)
HISTOGRAM = "corral_scheduler_batch_duration_seconds"


def namespaced(obj: dict[str, Any], ns: str) -> dict[str, Any]:
    obj["metadata"]["namespace"] = ns
    return obj


def bound_pods(nodes: int) -> list[tuple[str, dict[str, Any]]]:
    """(namespace, pod) for every bound pod: the in-process harness's split of the GPUs over the queues."""
    quarter = nodes * GPUS // QUEUES
    edges = [2 * quarter, 3 * quarter, 4 * quarter]  # team-0 up to 2 quarters, then team-1, team-2, team-3
    out = []
    k = 0
    for n in range(nodes):
        node = f"n{n:04d}"
        for j in range(GPUS - (1 if n < 100 else 0)):
            q = next((i for i, e in enumerate(edges) if k < e), QUEUES - 1)
            slot = GpuSlot(j, f"GPU-{node}-{j}", 1000, GPU_MEMORY)
            ann = assignment_annotations(Assignment(node, {"main": (slot,)}), "nvidia")
            obj = pod(f"bound-{k}", {"nvidia.com/gpu": "1"}, annotations=ann, cpu="1", memory="4Gi",
                      scheduler=CORRAL)  # fmt: skip
            obj["spec"]["nodeName"] = node
            obj["spec"]["activeDeadlineSeconds"] = 4 * 3600
            out.append((f"team-{q}", namespaced(obj, f"team-{q}")))
            k += 1
    return out


def pending_pod(i: int) -> tuple[str, dict[str, Any]]:
    sizes = (1, 1, 1, 1, 2, 2, 2, 4, 4, 8)
    ns = f"team-{i % QUEUES}"
    obj = pod(f"p{i}", {"nvidia.com/gpu": str(sizes[i % len(sizes)])}, cpu="1", memory="4Gi",
              scheduler=CORRAL)  # fmt: skip
    obj["spec"]["activeDeadlineSeconds"] = 3600 * (1 + i % 4)
    return ns, namespaced(obj, ns)


def create(w: Writer, objs: list[tuple[str, dict[str, Any]]]) -> float:
    """POST every pod to its namespace, in the list's order (the namespaces interleaved), from the writer's threads."""
    t = time.monotonic()
    with ThreadPoolExecutor(w.threads) as pool:
        list(pool.map(lambda o: w.request("POST", f"/api/v1/namespaces/{o[0]}/pods", o[1]), objs))
    return time.monotonic() - t


def histogram(m: dict[str, float]) -> tuple[float, float, float]:
    """(rounds, seconds in all, rounds within BUCKET) from the scheduler's /metrics."""
    le = next((v for k, v in m.items() if k.startswith(f"{HISTOGRAM}_bucket") and f'le="{BUCKET}"' in k), 0.0)
    return m.get(f"{HISTOGRAM}_count", 0.0), m.get(f"{HISTOGRAM}_sum", 0.0), le


def writes(m: dict[str, float]) -> float:
    """The scheduler's condition patches and events so far."""
    return sum(v for k, v in m.items() if k.startswith(("corral_scheduler_condition_patches_total",
                                                        "corral_scheduler_events_total")))  # fmt: skip


def settle(proc: SchedulerProcess, quiet: float = 5.0, limit: float = 300.0) -> float:
    """Wait until the scheduler has written nothing for `quiet` seconds (at most `limit`); the seconds waited."""
    t0 = time.monotonic()
    last, since = writes(proc.metrics()), time.monotonic()
    while time.monotonic() - t0 < limit:
        time.sleep(1.0)
        now = writes(proc.metrics())
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pending", type=int, default=10000)
    ap.add_argument("--trickle", type=int, default=20)
    ap.add_argument("--churn", action="store_true", help="a bound pod of team-0 ends with each trickled pod")
    args = ap.parse_args()
    with plane_in("corral-k8s-round-") as (plane, where):
        proc: SchedulerProcess | None = None
        try:
            w = Writer(plane.kubeconfig, threads=16)
            for q in range(QUEUES):
                w.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": f"team-{q}"}})  # fmt: skip
            t = time.monotonic()
            w.create_nodes(gpu_node(f"n{i:04d}", GPUS, cpu="128", memory="1024Gi") for i in range(args.nodes))
            print(f"{args.nodes} nodes in {time.monotonic() - t:.0f} s", flush=True)
            bound = bound_pods(args.nodes)
            print(f"{len(bound)} bound pods in {create(w, bound):.0f} s", flush=True)
            qfile = where / "queues.toml"
            qfile.write_text(queues_file(QUEUES, args.nodes * GPUS).replace('"5m"', '"1h"'))
            proc = SchedulerProcess(plane.kubeconfig, where / "scheduler.log", "--policy", "binpack", "--queues",
                                    str(qfile), "--qps", "5000", "--burst", "10000")  # fmt: skip
            proc.start(wait=True, timeout=600)
            print(f"scheduler ready {time.monotonic() - proc.started:.1f} s after its start", flush=True)
            pending = [pending_pod(i) for i in range(args.pending)]
            print(f"{len(pending)} pending pods in {create(w, pending):.0f} s", flush=True)
            settled = settle(proc)  # (the burst's rounds done and each pod's words written: the plane quiet again)
            print(f"writes settled {settled:.0f} s after the last pending pod", flush=True)
            before = histogram(proc.metrics())
            load0 = os.getloadavg()[0]
            for i in range(args.trickle):
                ns, obj = pending_pod(args.pending + i)
                w.request("POST", f"/api/v1/namespaces/{ns}/pods", obj)
                if args.churn:  # (team-0's bound pods are bound-0 .. bound-(2 quarters - 1))
                    w.request("DELETE", f"/api/v1/namespaces/team-0/pods/bound-{i}", {"gracePeriodSeconds": 0})
                time.sleep(1.0)
            after = histogram(proc.metrics())
            rounds = after[0] - before[0]
            if rounds <= 0:
                raise SystemExit("no round ran while pods were trickled in")
            mean = (after[1] - before[1]) / rounds
            within = (after[2] - before[2]) / rounds
            binds, said = {}, ""
            for q in range(QUEUES):
                got = [p for p in w.pods(namespace=f"team-{q}") if p["metadata"]["name"].startswith("p")]
                binds[f"team-{q}"] = sum(1 for p in got if p["spec"].get("nodeName"))
                for p in got if q == QUEUES - 1 else ():
                    for c in (p.get("status") or {}).get("conditions") or ():
                        if c.get("type") == "PodScheduled" and not said:
                            said = f"{p['metadata']['name']}: {c.get('message', '')}"
            churn = " and as many bound pods ended" if args.churn else ""
            print(f"rounds over {args.pending}+ waiting pods while {args.trickle} were trickled in{churn}: "
                  f"{rounds:.0f}; "
                  f"mean {mean * 1000:.0f} ms; within {BUCKET * 1000:.0f} ms: {within * 100:.0f} %")  # fmt: skip
            print(f"pending pods bound per namespace: {binds}; a waiting team-3 pod's condition: {said[:300]}")
            print(f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}; "
                  f"{machine()}; {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")  # fmt: skip
        finally:
            if proc is not None:
                proc.stop()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
