"""The extender's case (issue 16): policies fed the engine's DEFAULT_WORKLOAD instead of the pod list's own.

    python -m benchmarks.default_workload [--traces DIR] [--lists default,cpu100,...] [--seeds 42]
        [--policies binpack,fgd,fgd-priced]

`corral sim` gives fgd and fgd-priced the replayed pod list's target workload (its typical pods, with their
probabilities). The Kubernetes extender and `corral serve` cannot: they do not know their future pods, and the
engine falls back to DEFAULT_WORKLOAD (the FGD study's four generic types: 1 and 2 whole GPUs, shares of 500 and 250
milli). So fgd-priced there prices only 500- and 250-milli shares and keeps no hosts for multi-GPU pods (the default
workload has no tail). This replays the FGD study's experiment (the authors' exact order where `DIR/orders` has one,
else corral's shuffle tuned to 130 %, as `benchmarks.beyond_fgd`) with each policy under both workloads and prints
allocation % at arrived 100 % / 130 %, means over seeds.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.beyond_fgd import DEFAULT_TRACES, LISTS, arrivals_for, seeds_of
from corral.model.resources import GpuBehavior
from corral.placement import PlacementConfig
from corral.sim.openb import load_nodes, load_pods, target_workload
from corral.sim.replay import replay


def run_one(traces: Path, pod_list: str, policy: str, seed: int, own: bool) -> tuple[float, float, float]:
    """(alloc@100, alloc@130, seconds) of one replay, with the list's own target workload or the default one."""
    nodes = load_nodes(traces / "openb_node_list_gpu_node.csv")
    pods = load_pods(traces / f"openb_pod_list_{pod_list}.csv")
    arrivals, _ = arrivals_for(traces, nodes, pods, pod_list, seed)
    config = PlacementConfig(
        policy=policy, gpu_behavior=GpuBehavior.UNRESTRICTED, workload=target_workload(pods) if own else None
    )
    start = time.perf_counter()
    events, _ = replay(nodes, arrivals.requests, config, arrivals.ranks, seed)
    wall = time.perf_counter() - start
    alloc, _ = events.curves()
    return alloc[100], alloc[130], wall


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.default_workload", description=__doc__.splitlines()[0])
    p.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    p.add_argument("--lists", default=",".join(LISTS))
    p.add_argument("--seeds", default="42")
    p.add_argument("--policies", default="binpack,fgd,fgd-priced")
    args = p.parse_args()
    lists = [x for x in args.lists.split(",") if x]
    policies = [x for x in args.policies.split(",") if x]
    seeds = seeds_of(args.seeds)
    columns = [(policy, own) for policy in policies for own in ((False,) if policy == "binpack" else (True, False))]
    head = " | ".join(f"{pol} ({'list' if own else 'default'} workload)" for pol, own in columns)
    print(f"| pod list | {head} |")
    print("|---|" + "---:|" * len(columns))
    for pod_list in lists:
        cells = []
        for policy, own in columns:
            runs = [run_one(args.traces, pod_list, policy, s, own) for s in seeds]
            a100, a130 = np.mean([r[0] for r in runs]), np.mean([r[1] for r in runs])
            cells.append(f"{a100:.2f} / {a130:.2f}")
        print(f"| {pod_list} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
