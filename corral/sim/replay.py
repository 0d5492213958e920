"""Offline replay of the FGD study: pods arrive in a fixed order, never leave, and are dropped if they do not fit.

    for pod in order:  decision = place(snapshot, pod)  ->  allocate if placed  ->  record (arrived, allocated)

Arrived counts every pod's GPU demand (placed or failed); allocated is the GPU milli granted. The result columns
bucket events by arrived percent of capacity (`curve_column`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from corral.model.arrays import IntArray
from corral.model.resources import GpuBehavior, Node, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, TargetWorkload, place
from corral.placement.workload import cluster_fragmentation


@dataclass(frozen=True)
class Events:
    arrived_milli: IntArray  # cumulative GPU demand after each pod
    allocated_milli: IntArray  # GPU milli granted after each pod
    placed: npt.NDArray[np.bool_]
    capacity_milli: int

    def column(self, j: int) -> float:
        """Allocation % at arrived j % of capacity, as the published files bucket it."""
        return curve_column(self.arrived_milli, self.allocated_milli, self.capacity_milli, j)


def curve_column(arrived: IntArray, allocated: IntArray, capacity_milli: int, j: int) -> float:
    """Mean of per-event allocation % (rounded to 2 decimals) over events whose arrived % rounds to j.

    With no such event, the events within j-1..j+1; the mean itself is rounded to 2 decimals (fgd-experiment.md
    sections 4.2 and 7 C3). Python's round() is half-to-even, like the study's analysis scripts.
    """
    pct = capacity_milli / 100
    x = np.array([round(a / pct) for a in arrived.tolist()])
    y = np.array([round(a / pct, 2) for a in allocated.tolist()])
    sel = x == j
    if not sel.any():
        sel = (x >= j - 1) & (x <= j + 1)
    if not sel.any():
        return float("nan")
    return round(float(y[sel].mean()), 2)


def replay(
    nodes: Sequence[Node],
    arrivals: Sequence[Request],
    config: PlacementConfig,
    ranks: Sequence[int] | None = None,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> tuple[Events, ClusterSnapshot]:
    snapshot = ClusterSnapshot(nodes, ranks)
    rng = np.random.default_rng(seed)
    n = len(arrivals)
    arrived = np.zeros(n, dtype=np.int64)
    allocated = np.zeros(n, dtype=np.int64)
    placed = np.zeros(n, dtype=np.bool_)
    total = 0
    for i, request in enumerate(arrivals):
        decision = place(snapshot, request, config, rng)
        if decision.allocation is not None:
            snapshot.allocate(decision.allocation)
            placed[i] = True
        total += request.gpu_demand_milli
        arrived[i] = total
        allocated[i] = snapshot.gpu_allocated_milli
        if progress is not None:
            progress(i)
    return Events(arrived, allocated, placed, snapshot.total_gpus * 1000), snapshot


def study_config(policy: str, workload: TargetWorkload) -> PlacementConfig:
    """The FGD study's setting: pods without GPUs may use any node, fgd measures against the given workload."""
    return PlacementConfig(policy=policy, gpu_behavior=GpuBehavior.UNRESTRICTED, workload=workload)


def arrivals_from_order(by_name: dict[str, Request], order: Sequence[str], base: Callable[[str], str]) -> list[Request]:
    """The requests in an order file's arrival order, each carrying its own (tuned) name as id."""
    return [dataclasses.replace(by_name[base(name)], id=name) for name in order]


__all__ = ["Events", "arrivals_from_order", "cluster_fragmentation", "curve_column", "replay", "study_config"]
