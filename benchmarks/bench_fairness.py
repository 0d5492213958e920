"""How long `corral sim fair` takes per queue policy on the README's example (issue 14, the simulator half).

    python -m benchmarks.bench_fairness [--traces DIR] [--limit N] [--node-stride K] [--time-compression F]

Replays openb's default pod list (users drawn as `corral sim fair` draws them) on every K-th GPU node with arrivals
F times denser, once per policy, and prints a Markdown table: wall seconds, rounds, ms per round, the queue at its
longest, and the load average of the machine before and after (others share the CPU).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from corral.model.resources import GpuBehavior
from corral.placement import PlacementConfig
from corral.sim.fair.replay import POLICIES, run_fair
from corral.sim.fair.workload import make_jobs, offered_load
from corral.sim.online import compress_time
from corral.sim.openb import load_nodes, load_pods, target_workload

DEFAULT_TRACES = Path(
    os.environ.get("CORRAL_TRACES", Path(__file__).resolve().parents[2] / "shared" / "traces" / "openb")
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--node-stride", type=int, default=16)
    parser.add_argument("--time-compression", type=float, default=4000.0)
    parser.add_argument("--round", type=float, default=30.0)
    args = parser.parse_args()
    nodes = load_nodes(args.traces / "openb_node_list_gpu_node.csv")[:: args.node_stride]
    pods = sorted(load_pods(args.traces / "openb_pod_list_default.csv"), key=lambda p: (p.creation_time or 0, p.name))
    if args.limit:
        pods = pods[: args.limit]
    pods = compress_time(pods, args.time_compression)
    jobs = make_jobs(pods, 50, 1.1, 2.0, 42)
    config = PlacementConfig(policy="fgd", gpu_behavior=GpuBehavior.UNRESTRICTED, workload=target_workload(pods))
    gpus = sum(len(n.gpus) for n in nodes)
    load_before = os.getloadavg()[0]
    print(
        f"{len(jobs)} pods, {len(nodes)} nodes ({gpus} GPUs), arrivals {args.time_compression:g}x denser, "
        f"offered GPU load {offered_load(jobs, gpus * 1000):.2f}, rounds every {args.round:g} s"
    )
    print("| policy | wall (s) | rounds | ms per round | longest queue (jobs) |")
    print("|---|---:|---:|---:|---:|")
    for policy in POLICIES:
        start = time.perf_counter()
        r = run_fair(nodes, jobs, policy, config, 3600.0, args.round, 42)
        wall = time.perf_counter() - start
        per = 1000.0 * wall / max(r.rounds, 1)
        print(f"| {policy} | {wall:.1f} | {r.rounds} | {per:.1f} | {int(r.queued.max()) if len(r.queued) else 0} |")
    print(f"load average (1 min): {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
