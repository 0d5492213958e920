"""Where the idle GPUs are at the moment arrived demand reaches 100 % of capacity (one offline replay).

    python -m benchmarks.idle_at_100 [--traces DIR] [--list default] [--policy fgd-priced] [--seed 42]

At that moment the allocation is 100 % minus the GPU demand that failed so far, which equals the idle GPU milli.
Prints the allocation, the idle milli split into residues beside shares (by size) and whole free GPUs (by node
kind and the node's free cores), and the pods that failed by shape (GPUs, milli, cores), biggest GPU demand first.
Uses the exact order file where one exists, corral's own shuffle otherwise (as `benchmarks.beyond_fgd`).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks.beyond_fgd import DEFAULT_TRACES, arrivals_for, register_ablations
from corral.model.resources import MILLI_PER_GPU, GpuBehavior
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.sim.openb import load_nodes, load_pods, target_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--list", default="default")
    ap.add_argument("--policy", default="fgd-priced")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()
    register_ablations()
    nodes = load_nodes(args.traces / "openb_node_list_gpu_node.csv")
    pods = load_pods(args.traces / f"openb_pod_list_{args.list}.csv")
    arrivals, exact = arrivals_for(args.traces, nodes, pods, args.list, args.seed)
    config = PlacementConfig(policy=args.policy, gpu_behavior=GpuBehavior.UNRESTRICTED, workload=target_workload(pods))
    snap = ClusterSnapshot(nodes, arrivals.ranks)
    rng = np.random.default_rng(args.seed)
    capacity = snap.total_gpus * MILLI_PER_GPU
    arrived = 0
    failed: Counter[tuple[int, int, int]] = Counter()
    failed_milli: Counter[tuple[int, int, int]] = Counter()
    for request in arrivals.requests:
        if arrived + request.gpu_demand_milli > capacity:
            break
        decision = place(snap, request, config, rng)
        if decision.allocation is not None:
            snap.allocate(decision.allocation)
        else:
            shape = (request.gpu_count, request.gpu_milli, request.cpu_milli // 1000)
            failed[shape] += 1
            failed_milli[shape] += request.gpu_demand_milli
        arrived += request.gpu_demand_milli
    free, present = snap.gpu_milli_free, snap.gpu_present
    partial = present & (free > 0) & (free < MILLI_PER_GPU)
    whole = present & (free == MILLI_PER_GPU)
    source = "exact order" if exact else "own shuffle"
    allocated = 100 * snap.gpu_allocated_milli / capacity
    print(f"{args.list} {args.policy} seed {args.seed} ({source}): allocation {allocated:.2f} % at arrived "
          f"{100 * arrived / capacity:.2f} %")  # fmt: skip
    residues = Counter(free[partial].tolist())
    print(f"idle: {free[partial].sum() / 1000:.1f} GPUs' worth in residues on {int(partial.sum())} GPUs, "
          f"{int(whole.sum())} whole GPUs free")  # fmt: skip
    top = sorted(residues.items(), key=lambda kv: -kv[0] * kv[1])[:12]
    print("  residues (milli x GPUs, GPUs' worth):", ", ".join(f"{u} x {n} ({u * n / 1000:.1f})" for u, n in top))
    kinds: Counter[tuple[str, int, int]] = Counter()
    for i in np.flatnonzero(whole.any(axis=1)):
        kinds[(nodes[i].gpus[0].model, len(nodes[i].gpus), int(snap.cpu_free[i] // 1000))] += int(whole[i].sum())
    print("  whole free GPUs by (model, GPUs per node, free cores):", dict(kinds.most_common(10)))
    worst = sorted(failed, key=lambda k: -failed_milli[k])[:12]
    print(f"failed: {sum(failed_milli.values()) / 1000:.1f} GPUs of demand; by (GPUs, milli, cores):",
          ", ".join(f"{k} x {failed[k]} ({failed_milli[k] / 1000:.1f})" for k in worst))  # fmt: skip


if __name__ == "__main__":
    main()
