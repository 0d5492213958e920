"""Free GPUs that nodes' CPU or memory strand, at the moment arrived demand reaches 100 % (one offline replay each).

    python -m benchmarks.stranding [--traces DIR] [--lists multigpu50p,...] [--policies fgd,fgd-priced] [--seeds 42]

A free GPU (any milli left) is *stranded* when no pod shape of the list that asks for GPUs fits its node now: every
shape is too big for the node's free CPU, free memory or GPU room. Each stranded GPU is put down to what would let
some shape in: memory alone (the shape fits once the node's memory is not counted), CPU alone, either, or only both.
Shapes are the list's own (CPU, memory, GPU count, milli per GPU); GPU models are not counted (a constrained shape
counts as fitting any model), so the figure is a lower bound on stranding. Prints one line per (list, policy, seed)
with whole GPUs' worth of free milli.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.beyond_fgd import DEFAULT_TRACES, arrivals_for, register_ablations, seeds_of
from corral.model.arrays import BoolArray, IntArray
from corral.model.resources import MILLI_PER_GPU, GpuBehavior
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.sim.openb import load_nodes, load_pods, target_workload


def fits(snap: ClusterSnapshot, shapes: IntArray, cpu: bool, mem: bool) -> BoolArray:
    """Per node: whether at least one shape (rows: cpu, memory, GPU count, milli per GPU) fits it now, with the
    node's CPU and memory counted or not."""
    free = np.where(snap.gpu_present, snap.gpu_milli_free, -1)
    out = np.zeros(len(snap), dtype=np.bool_)
    for c, m, k, u in shapes:
        ok = (free >= u).sum(axis=1) >= k
        if cpu:
            ok &= snap.cpu_free >= c
        if mem:
            ok &= snap.mem_free >= m
        out |= ok
    return out


def measure(traces: Path, pod_list: str, policy: str, seed: int) -> dict[str, float]:
    nodes = load_nodes(traces / "openb_node_list_gpu_node.csv")
    pods = load_pods(traces / f"openb_pod_list_{pod_list}.csv")
    arrivals, _ = arrivals_for(traces, nodes, pods, pod_list, seed)
    config = PlacementConfig(policy=policy, gpu_behavior=GpuBehavior.UNRESTRICTED, workload=target_workload(pods))
    snap = ClusterSnapshot(nodes, arrivals.ranks)
    rng = np.random.default_rng(seed)
    capacity = snap.total_gpus * MILLI_PER_GPU
    arrived = 0
    for request in arrivals.requests:
        if arrived + request.gpu_demand_milli > capacity:
            break
        decision = place(snap, request, config, rng)
        if decision.allocation is not None:
            snap.allocate(decision.allocation)
        arrived += request.gpu_demand_milli
    shapes = np.array(
        sorted({(p.request.cpu_milli, p.request.memory_mib, p.request.gpu_count, p.request.gpu_milli)
                for p in pods if p.request.gpu_count > 0}),
        dtype=np.int64,
    )  # fmt: skip
    idle = np.where(snap.gpu_present & (snap.gpu_milli_free > 0), snap.gpu_milli_free, 0).sum(axis=1) / MILLI_PER_GPU
    both = fits(snap, shapes, True, True)
    no_mem = fits(snap, shapes, True, False)
    no_cpu = fits(snap, shapes, False, True)
    neither = fits(snap, shapes, False, False)
    stranded = ~both
    return {
        "alloc": 100 * snap.gpu_allocated_milli / capacity,
        "idle": float(idle.sum()),
        "stranded": float(idle[stranded].sum()),
        "memory": float(idle[stranded & no_mem & ~no_cpu].sum()),
        "cpu": float(idle[stranded & no_cpu & ~no_mem].sum()),
        "either": float(idle[stranded & no_cpu & no_mem].sum()),
        "both": float(idle[stranded & ~no_cpu & ~no_mem & neither].sum()),
        "gpu": float(idle[stranded & ~neither].sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--lists", default="multigpu50p")
    ap.add_argument("--policies", default="fgd,fgd-priced")
    ap.add_argument("--seeds", default="42")
    args = ap.parse_args()
    register_ablations()
    print("list policy seed: alloc % | idle GPUs | stranded (memory only / CPU only / either / only both / GPU room)")
    for pod_list in args.lists.split(","):
        for policy in args.policies.split(","):
            for seed in seeds_of(args.seeds):
                r = measure(args.traces, pod_list, policy, seed)
                print(f"{pod_list} {policy} {seed}: {r['alloc']:.2f} | {r['idle']:.1f} | {r['stranded']:.1f} "
                      f"({r['memory']:.1f} / {r['cpu']:.1f} / {r['either']:.1f} / {r['both']:.1f} / {r['gpu']:.1f})",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
