"""Fidelity end to end (issue 24, item 4): openb's default trace as real Pod objects on the real plane, placed by
`corral k8s scheduler`, against `corral sim run --order` with the same policy.

    PYTHONPATH=. CORRAL_K8S_CONTROL_PLANE=../shared/k8s/control-plane.sh \\
        python -m benchmarks.k8s_fidelity [--policy fgd] [--seed 42] [--nodes N] [--write BENCHMARKS.md]

    trace nodes (1,213) --Node objects, status on create--> plane      sim: the same nodes, the order file's ranks
    order file (seed 42) --Pod objects, created one by one in arrival order, before the scheduler starts--> plane
    corral k8s scheduler --policy P --behavior unrestricted --workload <pod list>  (fgd's target workload as sim's)
    settled: every pod bound, or pending with its PodScheduled condition Unschedulable
    compare: final GPU allocation (% of all GPU milli), and pod by pod: node and GPUs

How the plane's objects say what the trace says:
- Node `n<rank>-<sn>`: the study's tie-break ranks (the order file's NODE lines) become name order, which is the
  scheduler's node order and so its tie-break (ClusterSnapshot ranks by position when given none); the trace's CPU,
  memory and GPUs (model; memory unknown, 0) as corral's device plugin publishes them.
- Pod `p<arrival>-<name>`: arrival order becomes name order (and creation order): whichever of list order, creation
  time or resource version the scheduler follows, it is the trace's. CPU and memory from the trace; whole GPUs as
  `corral.dev/gpu: N`, a share as `corral.dev/gpu-milli: M`. Pods never end (no kubelet).
- A pod the simulator drops (it fits nowhere when it arrives) stays pending on the plane; the books only fill, so it
  can never fit later and binding it would be a difference.

`--nodes N` takes a slice: every k-th node of the trace (k = 1213 // N), ranks kept in their order, and the first pods
of the arrival order up to 1.3 x the slice's GPU capacity (the study's tuning ratio); tests/k8s/test_scheduler_fidelity
runs a 100-node slice.
"""

from __future__ import annotations

import argparse
import datetime
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._k8s_plane import SchedulerProcess, Writer
from corral.k8s.convert import ANN_GPU_COUNT, GPU, GPU_MILLI, parse_assignment
from corral.model.resources import MILLI_PER_GPU, GpuBehavior, GpuDevice, Node, Request
from corral.placement import PlacementConfig
from corral.sim.experiment import order_arrivals
from corral.sim.openb import load_nodes, load_order, load_pods, target_workload
from corral.sim.replay import replay
from tests.k8s.plane import Plane, gpu_node, pod

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "openb"
POD_LIST = "openb_pod_list_default.csv"
NODE_LIST = "openb_node_list_gpu_node.csv"
TUNE = 1.3


@dataclass(frozen=True)
class Trace:
    nodes: list[Node]  # the trace's names
    ranks: list[int]  # per node: tie-break rank (0..n-1 over these nodes)
    requests: list[Request]  # arrival order; id = the order file's pod name
    pod_list: Path  # the whole pod list (fgd's target workload is its typical pods, as in `corral sim`)

    def k8s_node(self, i: int) -> str:
        return f"n{self.ranks[i]:04d}-{self.nodes[i].name.lower()}"

    def k8s_pod(self, i: int) -> str:
        return f"p{i:05d}-{self.requests[i].id.lower()}"


def load_trace(traces: Path = TRACES, seed: int = 42, nodes: int | None = None) -> Trace:
    """The default list in the study's order `seed` (its order file), whole or as a slice of about `nodes` nodes."""
    node_list = load_nodes(traces / NODE_LIST)
    pods = load_pods(traces / POD_LIST)
    arrivals = order_arrivals(node_list, pods, load_order(traces / "orders" / f"{POD_LIST[:-4]}.seed{seed}.order.gz"))
    trace = Trace(node_list, arrivals.ranks, arrivals.requests, traces / POD_LIST)
    return trace if nodes is None or nodes >= len(node_list) else slice_trace(trace, nodes)


def slice_trace(trace: Trace, nodes: int) -> Trace:
    step = max(1, len(trace.nodes) // nodes)
    picked = list(range(0, len(trace.nodes), step))[:nodes]
    order = sorted(picked, key=lambda i: trace.ranks[i])
    rank = {i: r for r, i in enumerate(order)}
    capacity = sum(len(trace.nodes[i].gpus) for i in picked) * MILLI_PER_GPU
    requests: list[Request] = []
    demand = 0
    for r in trace.requests:
        if demand + r.gpu_demand_milli > TUNE * capacity:
            break
        requests.append(r)
        demand += r.gpu_demand_milli
    return Trace([trace.nodes[i] for i in picked], [rank[i] for i in picked], requests, trace.pod_list)


def config(trace: Trace, policy: str) -> PlacementConfig:
    return PlacementConfig(policy=policy, gpu_behavior=GpuBehavior.UNRESTRICTED,
                           workload=target_workload(load_pods(trace.pod_list)))  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    """Where each pod went: pod index -> (k8s node name, GPU indices with milli); and the allocation in percent."""

    placed: dict[int, tuple[str, tuple[tuple[int, int], ...]]]
    allocated_milli: int
    capacity_milli: int

    @property
    def alloc_pct(self) -> float:
        return 100.0 * self.allocated_milli / self.capacity_milli


def simulate(trace: Trace, policy: str, seed: int = 42) -> Outcome:
    """`corral sim run --order` on the trace (the same replay, in process), with pods placed as it placed them."""
    cfg = config(trace, policy)
    events, snapshot = replay(trace.nodes, trace.requests, cfg, trace.ranks, seed)
    by_name = {n.name: i for i, n in enumerate(trace.nodes)}
    placed: dict[int, tuple[str, tuple[tuple[int, int], ...]]] = {}
    for i, req in enumerate(trace.requests):
        alloc = snapshot.allocations.get(req.id)
        if alloc is not None:
            placed[i] = (trace.k8s_node(by_name[alloc.node]), tuple((g.index, g.milli) for g in alloc.gpus))
    assert len(placed) == int(np.sum(events.placed))
    return Outcome(placed, int(events.allocated_milli[-1]) if len(trace.requests) else 0, events.capacity_milli)


# -------------------------------------------------------------------------------------------------- the plane
def node_objects(trace: Trace) -> list[dict[str, Any]]:
    out = []
    for i, n in enumerate(trace.nodes):
        name = trace.k8s_node(i)
        model = n.gpus[0].model if n.gpus else "none"
        obj = gpu_node(name, len(n.gpus), model=model, memory_mib=0, cpu=f"{n.cpu_milli}m", memory=f"{n.memory_mib}Mi")
        devices = tuple(GpuDevice(g.index, g.model, g.memory_mib, f"GPU-{name}-{g.index}") for g in n.gpus)
        if devices and len({g.model for g in devices}) > 1:  # one model per node in openb; say so if not
            raise ValueError(f"node {n.name}: mixed GPU models")
        obj["status"]["capacity"]["pods"] = obj["status"]["allocatable"]["pods"] = "1000"
        out.append(obj)
    return out


def pod_object(trace: Trace, i: int, scheduler: str = "corral") -> dict[str, Any]:
    r = trace.requests[i]
    limits: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if r.gpu_count and r.gpu_milli == MILLI_PER_GPU:
        limits[GPU] = str(r.gpu_count)
    elif r.gpu_count:
        limits[GPU_MILLI] = str(r.gpu_milli)
        if r.gpu_count > 1:
            annotations[ANN_GPU_COUNT] = str(r.gpu_count)
    if r.gpu_models:
        raise ValueError(f"pod {r.id}: GPU model constraints are not carried to the plane (the default list has none)")
    return pod(trace.k8s_pod(i), limits, annotations, cpu=f"{r.cpu_milli}m", memory=f"{r.memory_mib}Mi",
               scheduler=scheduler)  # fmt: skip


def create_in_order(writer: Writer, trace: Trace) -> float:
    """Every pod, one at a time in arrival order (creation order = arrival order); returns seconds."""
    t = time.monotonic()
    for i in range(len(trace.requests)):
        writer.request("POST", "/api/v1/namespaces/default/pods", pod_object(trace, i))
    return time.monotonic() - t


def unschedulable(obj: dict[str, Any]) -> bool:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return True
    return False


def settle(writer: Writer, total: int, proc: SchedulerProcess | None, timeout: float, quiet: float = 10.0) -> str:
    """Wait until every pod is bound or marked Unschedulable ("settled"), or nothing changed for `quiet` seconds
    ("quiet": a scheduler that does not write the condition for every pod); "timeout" otherwise."""
    deadline = time.monotonic() + timeout
    last: tuple[int, int] = (-1, -1)
    since = time.monotonic()
    while time.monotonic() < deadline:
        if proc is not None and proc.proc is not None and proc.proc.poll() is not None:
            raise RuntimeError(f"the scheduler exited: {proc.log_tail()}")
        items = writer.pods()
        bound = sum(1 for p in items if p["spec"].get("nodeName"))
        waiting = sum(1 for p in items if not p["spec"].get("nodeName") and unschedulable(p))
        if bound + waiting == total:
            return "settled"
        if (bound, waiting) != last:
            last, since = (bound, waiting), time.monotonic()
        elif bound and time.monotonic() - since > quiet:
            return "quiet"
        time.sleep(0.5)
    return "timeout"


def read_plane(writer: Writer, trace: Trace) -> Outcome:
    """Where the plane's pods went, from spec.nodeName and corral's assignment annotation; checks that no GPU holds
    more than 1000 milli and that every assignment names the pod's node."""
    index = {trace.k8s_pod(i): i for i in range(len(trace.requests))}
    per_gpu: dict[tuple[str, int], int] = {}
    placed: dict[int, tuple[str, tuple[tuple[int, int], ...]]] = {}
    total = 0
    for p in writer.pods():
        node = p["spec"].get("nodeName")
        if not node:
            continue
        a = parse_assignment(p["metadata"].get("annotations"))
        gpus: tuple[tuple[int, int], ...] = ()
        if a is not None:
            if a.node != node:
                raise AssertionError(f"pod {p['metadata']['name']}: assignment names {a.node}, bound to {node}")
            gpus = tuple(sorted((s.index, s.milli) for s in a.slots))
        for g, milli in gpus:
            per_gpu[(node, g)] = per_gpu.get((node, g), 0) + milli
            total += milli
        placed[index[p["metadata"]["name"]]] = (node, gpus)
    over = {k: v for k, v in per_gpu.items() if v > MILLI_PER_GPU}
    if over:
        raise AssertionError(f"GPUs charged over 1000 milli: {dict(list(over.items())[:5])}")
    capacity = sum(len(n.gpus) for n in trace.nodes) * MILLI_PER_GPU
    return Outcome(placed, total, capacity)


def compare(sim: Outcome, plane: Outcome) -> dict[str, Any]:
    same = sum(1 for i, where in sim.placed.items() if plane.placed.get(i) == where)
    only_sim = sorted(set(sim.placed) - set(plane.placed))
    only_plane = sorted(set(plane.placed) - set(sim.placed))
    moved = sorted(i for i in set(sim.placed) & set(plane.placed) if sim.placed[i] != plane.placed[i])
    return {
        "sim_alloc_pct": round(sim.alloc_pct, 3), "plane_alloc_pct": round(plane.alloc_pct, 3),
        "diff_pp": round(plane.alloc_pct - sim.alloc_pct, 3),
        "sim_placed": len(sim.placed), "plane_placed": len(plane.placed), "same_node_and_gpus": same,
        "first_moved": moved[:5], "placed_only_in_sim": only_sim[:5], "placed_only_on_plane": only_plane[:5],
    }  # fmt: skip


def run_on_plane(plane: Plane, writer: Writer, trace: Trace, policy: str, where: Path, *extra: str,
                 timeout: float = 900) -> tuple[Outcome, dict[str, Any]]:  # fmt: skip
    """Nodes, then every pod in order, then the scheduler; its outcome once settled, and the timings."""
    t = time.monotonic()
    writer.create_nodes(node_objects(trace))
    nodes_s = time.monotonic() - t
    pods_s = create_in_order(writer, trace)
    proc = SchedulerProcess(plane.kubeconfig, where / "scheduler.log", "--policy", policy, "--behavior",
                            "unrestricted", "--workload", str(trace.pod_list), "--qps", "5000", "--burst", "10000",
                            *extra)  # fmt: skip
    proc.start()
    try:
        how = settle(writer, len(trace.requests), proc, timeout)
        settle_s = time.monotonic() - proc.started
    finally:
        proc.stop()
    timings = {"nodes_s": round(nodes_s, 1), "pods_create_s": round(pods_s, 1),
               "scheduler_to_settled_s": round(settle_s, 1), "settled": how}  # fmt: skip
    return read_plane(writer, trace), timings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--policy", default="fgd")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--nodes", type=int, help="a slice of about this many nodes (default: all 1,213)")
    ap.add_argument("--scheduler-arg", action="append", default=[])
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    trace = load_trace(args.traces, args.seed, args.nodes)
    t = time.monotonic()
    sim = simulate(trace, args.policy, args.seed)
    sim_s = time.monotonic() - t
    print(f"sim: {len(trace.nodes)} nodes, {len(trace.requests)} pods, {len(sim.placed)} placed, "
          f"{sim.alloc_pct:.3f} % allocated ({sim_s:.1f} s)", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="corral-k8s-fidelity-") as tmp:
        where = Path(tmp)
        plane = Plane.find(where / "plane")
        if plane is None:
            raise SystemExit("no control plane: set CORRAL_K8S_CONTROL_PLANE to control-plane.sh")
        try:
            writer = Writer(plane.up())
            got, timings = run_on_plane(plane, writer, trace, args.policy, where, *args.scheduler_arg)
        finally:
            plane.down()
    result = {**compare(sim, got), **timings, "nodes": len(trace.nodes), "pods": len(trace.requests),
              "policy": args.policy, "seed": args.seed}  # fmt: skip
    print(result)
    if args.write:
        from benchmarks.k8s_standalone import machine

        with args.write.open("a") as fh:
            fh.write(f"\nFidelity run {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on {machine()}: "
                     f"{result}\n")  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
