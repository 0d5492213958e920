"""The extender's case (issue 16): policies fed the engine's DEFAULT_WORKLOAD, the workload learned online, or the
pod list's own statistics.

    python -m benchmarks.default_workload [--traces DIR] [--lists default,cpu100,...] [--seeds 42]
        [--policies binpack,fgd,fgd-priced] [--modes default,learned,own] [--csv FILE]

`corral sim` gives fgd and fgd-priced the replayed pod list's target workload (its typical pods, with their
probabilities, and the rare ones as `tail`): `own`, which knows the whole list, the future included. The Kubernetes
extender does not know its future pods. Before issue 16 it fed the engine DEFAULT_WORKLOAD (`default`: the FGD
study's four generic types, shares of 500 and 250 milli, no multi-GPU tail); now it learns the workload from the pods
it has seen (`learned`): this replay feeds the engine, before each pod, the workload that
`corral.placement.learned.WorkloadLearner` (the extender's class and settings) has adopted from the pods arrived so
far, that pod included (the extender counts a pod at its filter, before it decides). The learner's time rule is
inert here (no clock in a replay): it adopts on the pod-count rule alone.

Each (list, seed) replays the authors' exact order where `DIR/orders` has one, else corral's shuffle tuned to 130 %
(as `benchmarks.beyond_fgd`), and prints allocation % at arrived 100 % / 130 %, means over seeds; `learned` cells
also give the workloads adopted in the replay. binpack ignores the workload and runs once. With `--csv`, one row per
run is appended and runs already there are skipped.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.beyond_fgd import DEFAULT_TRACES, LISTS, arrivals_for, seeds_of
from corral.model.resources import GpuBehavior, Node, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.placement.learned import LearnerConfig, WorkloadLearner
from corral.sim.openb import load_nodes, load_pods, target_workload
from corral.sim.replay import Events, replay

MODES = ("default", "learned", "own")
FIELDS = ("pod_list", "policy", "mode", "seed", "alloc_at_100", "alloc_at_130", "adoptions", "seconds")


def replay_learned(
    nodes: Sequence[Node],
    arrivals: Sequence[Request],
    config: PlacementConfig,
    ranks: Sequence[int],
    seed: int,
    learner_config: LearnerConfig | None = None,
) -> tuple[Events, WorkloadLearner]:
    """`corral.sim.replay.replay` with the workload learned from the pods arrived so far (the same loop, plus the
    learner: each pod is counted, then decided on with the workload the learner has adopted)."""
    snapshot = ClusterSnapshot(nodes, ranks)
    rng = np.random.default_rng(seed)
    learner = WorkloadLearner(learner_config)
    n = len(arrivals)
    arrived = np.zeros(n, dtype=np.int64)
    allocated = np.zeros(n, dtype=np.int64)
    placed = np.zeros(n, dtype=np.bool_)
    cfg = config
    total = 0
    for i, request in enumerate(arrivals):
        if learner.observe(request.id or str(i), request, 0.0):
            cfg = dataclasses.replace(config, workload=learner.workload)
        decision = place(snapshot, request, cfg, rng, explain_placed=False)
        if decision.allocation is not None:
            snapshot.allocate(decision.allocation)
            placed[i] = True
        total += request.gpu_demand_milli
        arrived[i] = total
        allocated[i] = snapshot.gpu_allocated_milli
    return Events(arrived, allocated, placed, snapshot.total_gpus * 1000), learner


def run_one(traces: Path, pod_list: str, policy: str, seed: int, mode: str) -> tuple[float, float, int, float]:
    """(alloc@100, alloc@130, workloads adopted, seconds) of one replay under `mode`'s workload."""
    nodes = load_nodes(traces / "openb_node_list_gpu_node.csv")
    pods = load_pods(traces / f"openb_pod_list_{pod_list}.csv")
    arrivals, _ = arrivals_for(traces, nodes, pods, pod_list, seed)
    config = PlacementConfig(
        policy=policy,
        gpu_behavior=GpuBehavior.UNRESTRICTED,
        workload=target_workload(pods) if mode == "own" else None,
    )
    start = time.perf_counter()
    adoptions = 0
    if mode == "learned":
        events, learner = replay_learned(nodes, arrivals.requests, config, arrivals.ranks, seed)
        adoptions = learner.rebuilds
    else:
        events, _ = replay(nodes, arrivals.requests, config, arrivals.ranks, seed)
    wall = time.perf_counter() - start
    alloc, _ = events.curves()
    return alloc[100], alloc[130], adoptions, wall


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.default_workload", description=__doc__.splitlines()[0])
    p.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    p.add_argument("--lists", default=",".join(LISTS))
    p.add_argument("--seeds", default="42")
    p.add_argument("--policies", default="binpack,fgd,fgd-priced")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--csv", type=Path, help="append one row per run here (and skip runs already in it)")
    args = p.parse_args()
    lists = [x for x in args.lists.split(",") if x]
    policies = [x for x in args.policies.split(",") if x]
    modes = [x for x in args.modes.split(",") if x]
    bad = [m for m in modes if m not in MODES]
    if bad:
        p.error(f"--modes: unknown {', '.join(bad)} (use {', '.join(MODES)})")
    seeds = seeds_of(args.seeds)
    done: dict[tuple[str, str, str, int], tuple[float, float, int, float]] = {}
    if args.csv and args.csv.exists():
        with args.csv.open() as fh:
            for r in csv.DictReader(fh):
                done[(r["pod_list"], r["policy"], r["mode"], int(r["seed"]))] = (
                    float(r["alloc_at_100"]), float(r["alloc_at_130"]), int(r["adoptions"]), float(r["seconds"])
                )  # fmt: skip
    columns = [(pol, m) for pol in policies for m in (("-",) if pol == "binpack" else modes)]
    head = " | ".join(pol if m == "-" else f"{pol} ({m})" for pol, m in columns)
    print(f"| pod list | {head} |")
    print("|---|" + "---:|" * len(columns))
    for pod_list in lists:
        cells = []
        for policy, mode in columns:
            runs = []
            for s in seeds:
                key = (pod_list, policy, mode, s)
                if key not in done:
                    done[key] = run_one(args.traces, pod_list, policy, s, "default" if mode == "-" else mode)
                    if args.csv:
                        new = not args.csv.exists()
                        with args.csv.open("a", newline="") as fh:
                            w = csv.writer(fh)
                            if new:
                                w.writerow(FIELDS)
                            w.writerow([*key, *done[key]])
                runs.append(done[key])
            a100, a130 = np.mean([r[0] for r in runs]), np.mean([r[1] for r in runs])
            extra = f" ({np.mean([r[2] for r in runs]):.0f} adopted)" if mode == "learned" else ""
            cells.append(f"{a100:.2f} / {a130:.2f}{extra}")
        print(f"| {pod_list} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
