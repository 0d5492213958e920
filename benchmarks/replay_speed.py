"""One offline replay, timed, with a fingerprint of every placement (issue 16: speed-ups must not change decisions).

    python -m benchmarks.replay_speed LIST POLICY SEED [--traces DIR] [--profile FILE]

Prints CPU and wall seconds of the replay (as `benchmarks.beyond_fgd` runs it: exact order where `DIR/orders` has
one, no fragmentation curve; timed once the compiled kernels are loaded, `placement.native`, whose load, once per
process, is printed apart as load=), allocation % at arrived 100 % and 130 %, the sha256 (first 12 hex digits) of every
granted (pod, node, GPU, milli) in order, and peak RSS. Run it on two trees, one replay at a time: equal
fingerprints mean identical decisions. `--profile` writes cProfile stats and prints the top 30 by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import pstats
import resource
import time
from pathlib import Path

from benchmarks.beyond_fgd import DEFAULT_TRACES, arrivals_for, register_ablations
from corral.model.resources import GpuBehavior
from corral.placement import PlacementConfig
from corral.placement.native import kernels
from corral.sim.openb import load_nodes, load_pods, target_workload
from corral.sim.replay import replay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pod_list")
    ap.add_argument("policy")
    ap.add_argument("seed", type=int)
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--profile", type=Path)
    args = ap.parse_args()
    register_ablations()
    nodes = load_nodes(args.traces / "openb_node_list_gpu_node.csv")
    pods = load_pods(args.traces / f"openb_pod_list_{args.pod_list}.csv")
    arrivals, _ = arrivals_for(args.traces, nodes, pods, args.pod_list, args.seed)
    config = PlacementConfig(policy=args.policy, gpu_behavior=GpuBehavior.UNRESTRICTED, workload=target_workload(pods))
    load0 = time.perf_counter()
    kernels()  # numba's start and the compiled kernels' load: once per process, like an import (printed as load=)
    load = time.perf_counter() - load0
    prof = cProfile.Profile() if args.profile else None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if prof:
        prof.enable()
    events, snapshot = replay(nodes, arrivals.requests, config, arrivals.ranks, args.seed)
    if prof:
        prof.disable()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    alloc, _ = events.curves()
    granted = [(k, a.node, tuple((g.index, g.milli) for g in a.gpus)) for k, a in snapshot.allocations.items()]
    digest = hashlib.sha256(repr(granted).encode()).hexdigest()[:12]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(
        f"{args.pod_list} {args.policy} {args.seed} cpu={cpu:.2f}s wall={wall:.2f}s alloc100={alloc[100]:.4f} "
        f"alloc130={alloc[130]:.4f} hash={digest} rss={rss}MB load={load:.2f}s"
    )
    if prof and args.profile:
        prof.dump_stats(args.profile)
        pstats.Stats(str(args.profile)).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
