"""One offline experiment of `corral sim run`, as the FGD study ran it (fgd-experiment.md section 2.2):

    pods sorted by name -> seeded shuffle -> tune to `tune` x GPU capacity:
        below: append i.i.d. draws (with replacement) of the name-sorted list, named <name>-tuned-<i>, stopping at
               the first draw whose per-GPU milli would overshoot (the study's quirk)
        above: remove uniformly random pods until the demand fits
    nodes sorted by name -> a seeded permutation gives each its tie-break rank
    target workload for fragmentation = typical pods of the untuned list
    replay: every pod once, never leaves; a pod that does not fit is dropped

The random numbers are numpy's (PCG64), not Go's, so orders differ from the authors' runs; `--order FILE` replays one
of their exact orders instead.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from corral.model.errors import InvalidRequest
from corral.model.resources import MILLI_PER_GPU, GpuBehavior, Node, Request
from corral.placement import PlacementConfig
from corral.sim.openb import Order, TracePod, base_name, target_workload
from corral.sim.replay import COLUMNS, Events, replay


@dataclass(frozen=True)
class Arrivals:
    requests: list[Request]  # in arrival order, ids unique (tuned copies: <name>-tuned-<i>)
    ranks: list[int]  # per node (in the given node order): tie-break rank, smallest wins


def study_arrivals(nodes: Sequence[Node], pods: Sequence[TracePod], seed: int, tune: float) -> Arrivals:
    if not math.isfinite(tune) or tune <= 0:
        raise InvalidRequest("--tune", f"must be a positive ratio of GPU capacity, got {tune}")
    rng = np.random.default_rng(seed)
    ordered = sorted(pods, key=lambda p: p.name)
    shuffled = [ordered[i] for i in rng.permutation(len(ordered))]
    requests = [dataclasses.replace(p.request, id=p.name) for p in shuffled]
    capacity = sum(len(n.gpus) for n in nodes) * MILLI_PER_GPU
    target = tune * capacity
    total = sum(r.gpu_demand_milli for r in requests)
    if total < target:
        i = 0
        while True:
            drawn = ordered[int(rng.integers(len(ordered)))].request
            if total + drawn.gpu_milli > target:  # the study tests the per-GPU milli, then adds the pod's total
                break
            requests.append(dataclasses.replace(drawn, id=f"{drawn.id}-tuned-{i}"))
            total += drawn.gpu_demand_milli
            i += 1
    else:
        while total > target and requests:
            total -= requests.pop(int(rng.integers(len(requests)))).gpu_demand_milli
    by_name = sorted(range(len(nodes)), key=lambda i: nodes[i].name)
    perm = rng.permutation(len(nodes))
    ranks = [0] * len(nodes)
    for pos, i in enumerate(by_name):
        ranks[i] = int(perm[pos])
    return Arrivals(requests, ranks)


def order_arrivals(nodes: Sequence[Node], pods: Sequence[TracePod], order: Order) -> Arrivals:
    by_name = {p.name: p.request for p in pods}
    missing = sorted({base_name(n) for n in order.pods} - by_name.keys())
    if missing:
        raise InvalidRequest("--order", f"names pods that are not in the pod list: {', '.join(missing[:5])}")
    unranked = [n.name for n in nodes if n.name not in order.node_rank]
    if unranked:
        raise InvalidRequest("--order", f"has no rank for node(s) {', '.join(unranked[:5])}")
    requests = [dataclasses.replace(by_name[base_name(n)], id=n) for n in order.pods]
    return Arrivals(requests, [order.node_rank[n.name] for n in nodes])


@dataclass(frozen=True)
class RunResult:
    events: Events
    requests: list[Request]
    alloc: list[float]
    frag: list[float]
    summary: dict[str, Any]


def run_experiment(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    policy: str,
    seed: int,
    tune: float = 1.3,
    order: Order | None = None,
    behavior: GpuBehavior = GpuBehavior.UNRESTRICTED,
    progress: Callable[[int, int], None] | None = None,
    label: str = "",
) -> RunResult:
    start = time.perf_counter()
    arrivals = order_arrivals(nodes, pods, order) if order else study_arrivals(nodes, pods, seed, tune)
    config = PlacementConfig(policy=policy, gpu_behavior=behavior, workload=target_workload(list(pods)))
    total = len(arrivals.requests)
    step = max(1, total // 200)

    def tick(i: int) -> None:
        if progress is not None and (i % step == 0 or i == total - 1):
            progress(i + 1, total)

    events, snapshot = replay(nodes, arrivals.requests, config, arrivals.ranks, seed, tick, track=True)
    alloc, frag = events.curves()
    failed = ~events.placed
    no_gpu = np.array([r.gpu_count == 0 for r in arrivals.requests], dtype=np.bool_)
    summary: dict[str, Any] = {
        "pod_list": label,
        "policy": policy,
        "behavior": behavior.value,
        "seed": seed,
        "tune": tune if order is None else None,
        "order": order is not None,
        "nodes": len(nodes),
        "gpus": snapshot.total_gpus,
        "pods": total,
        "failed_pods": int(failed.sum()),
        "failed_gpu_pods": int((failed & ~no_gpu).sum()),
        "failed_pods_without_gpu": int((failed & no_gpu).sum()),
        "alloc_at_100": alloc[100],
        "alloc_at_130": alloc[130],
        "frag_at_100": frag[100],
        "final_alloc": round(100 * int(events.allocated_milli[-1]) / events.capacity_milli, 2) if total else 0.0,
        "wall_seconds": round(time.perf_counter() - start, 2),
    }
    return RunResult(events, arrivals.requests, alloc, frag, summary)


@contextmanager
def atomic_dir(out: Path) -> Iterator[Path]:
    """Write into a fresh sibling folder and move the files into `out` only when everything succeeded."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        if out.exists() and not out.is_dir():
            raise InvalidRequest("--out", f"{out} exists and is not a folder")
        out.mkdir(exist_ok=True)
        for item in tmp.iterdir():
            os.replace(item, out / item.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_run(out: Path, result: RunResult, title: str) -> list[Path]:
    """events.csv, curves.csv, summary.json, allocation.png, fragmentation.png, report.html."""
    from corral.sim.report import write_run_report  # matplotlib only when writing

    ev = result.events
    with (out / "events.csv").open("w") as fh:
        fh.write("i,pod,gpu_milli,arrived_milli,allocated_milli,fragmentation_milli,outcome\n")
        for i, req in enumerate(result.requests):
            outcome = ev.outcomes[i].replace('"', "'")
            fh.write(
                f"{i},{req.id},{req.gpu_demand_milli},{ev.arrived_milli[i]},{ev.allocated_milli[i]},"
                f'{ev.frag_milli[i]:.2f},"{"placed " if ev.placed[i] else "failed: "}{outcome}"\n'
            )
    s = result.summary
    head = ["metric", "workload", "sc_policy", "tune", "seed", "total_gpus", *(str(j) for j in COLUMNS)]
    with (out / "curves.csv").open("w") as fh:
        fh.write(",".join(head) + "\n")
        for metric, values in (("allocation", result.alloc), ("fragmentation", result.frag)):
            cells = ["" if math.isnan(v) else f"{v:.2f}" for v in values]
            fh.write(
                ",".join([metric, s["pod_list"], s["policy"], str(s["tune"]), str(s["seed"]), str(s["gpus"]), *cells])
            )
            fh.write("\n")
    (out / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    paths = [out / "events.csv", out / "curves.csv", out / "summary.json"]
    return paths + write_run_report(out, s, result.alloc, result.frag, title)
