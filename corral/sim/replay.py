"""Offline replay of the FGD study: pods arrive in a fixed order, never leave, and are dropped if they do not fit.

    for pod in order:  decision = place(snapshot, pod)  ->  allocate if placed  ->  record one event:
                       (arrived GPU milli, allocated GPU milli, cluster fragmentation, node or reason)

Arrived counts every pod's GPU demand (placed or failed); allocated is the GPU milli granted; fragmentation is the
sum of F(n) for the target workload (`placement.workload`), kept per node and updated only where a pod landed. The
result columns bucket events by arrived percent of capacity exactly as the study's analysis does (`Events.curves`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from corral.model.arrays import BoolArray, FloatArray, IntArray
from corral.model.resources import Node, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place, render
from corral.placement.workload import current_fragmentation

COLUMNS = range(131)  # arrived 0..130 % of capacity, as in the published files


@dataclass(frozen=True)
class Events:
    arrived_milli: IntArray  # cumulative GPU demand after each pod
    allocated_milli: IntArray  # GPU milli granted after each pod
    placed: BoolArray
    capacity_milli: int
    frag_milli: FloatArray = field(default_factory=lambda: np.zeros(0))  # cluster fragmentation after each pod
    outcomes: tuple[str, ...] = ()  # per pod: "node GPU i,j" where placed, else the engine's explanation

    def curves(self) -> tuple[list[float], list[float]]:
        """Columns 0..130 of allocation % and fragmentation % (of all GPUs), bucketed like the published files.

        Each event's arrived % is rounded half-to-even (Python's round, as the study's scripts); a column is the mean
        over the events in it, or over those within j-1..j+1 when none, rounded to 2 decimals: of the per-event
        allocation % (each rounded to 2 decimals), and of the per-event fragmentation in milli-GPU as logged (2
        decimals), then as % of capacity (fgd-experiment.md sections 4.2 and 7, C3/C4).
        """
        pct = self.capacity_milli / 100
        x = np.array([round(a / pct) for a in self.arrived_milli.tolist()], dtype=np.int64)
        alloc = np.array([round(a / pct, 2) for a in self.allocated_milli.tolist()])
        frag = np.array([round(f, 2) for f in self.frag_milli.tolist()]) if len(self.frag_milli) else None
        out_a: list[float] = []
        out_f: list[float] = []
        for j in COLUMNS:
            sel = x == j
            if not sel.any():
                sel = (x >= j - 1) & (x <= j + 1)
            if not sel.any():
                out_a.append(float("nan"))
                out_f.append(float("nan"))
                continue
            out_a.append(round(float(alloc[sel].mean()), 2))
            out_f.append(round(float(frag[sel].mean()) / pct, 2) if frag is not None else float("nan"))
        return out_a, out_f


def replay(
    nodes: Sequence[Node],
    arrivals: Sequence[Request],
    config: PlacementConfig,
    ranks: Sequence[int] | None = None,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    track: bool = False,
) -> tuple[Events, ClusterSnapshot]:
    """Replay `arrivals` in order. With `track`, also fragmentation and a per-pod outcome text (slower)."""
    snapshot = ClusterSnapshot(nodes, ranks)
    rng = np.random.default_rng(seed)
    workload = config.workload
    n = len(arrivals)
    arrived = np.zeros(n, dtype=np.int64)
    allocated = np.zeros(n, dtype=np.int64)
    placed = np.zeros(n, dtype=np.bool_)
    frag = np.zeros(n if track else 0, dtype=np.float64)
    outcomes: list[str] = []
    node_frag = (
        current_fragmentation(snapshot, workload, np.arange(len(snapshot), dtype=np.int64)).copy()
        if track and workload is not None
        else None
    )
    total = 0
    for i, request in enumerate(arrivals):
        # A refusal's explanation is read only for the per-pod outcomes of `track`.
        decision = place(snapshot, request, config, rng, explain_placed=False, explain_refused=track)
        alloc = decision.allocation
        if alloc is not None:
            snapshot.allocate(alloc)
            placed[i] = True
            if node_frag is not None and workload is not None:
                idx = np.array([alloc.node_index], dtype=np.int64)
                node_frag[alloc.node_index] = current_fragmentation(snapshot, workload, idx)[0]
        total += request.gpu_demand_milli
        arrived[i] = total
        allocated[i] = snapshot.gpu_allocated_milli
        if track:
            if node_frag is not None:
                frag[i] = node_frag.sum()
            if alloc is not None:
                gpus = ",".join(str(g) for g in alloc.gpu_indices)
                outcomes.append(alloc.node + (f" GPU {gpus}" if gpus else ""))
            else:
                outcomes.append(render(decision.explanation))
        if progress is not None:
            progress(i)
    events = Events(arrived, allocated, placed, snapshot.total_gpus * 1000, frag, tuple(outcomes))
    return events, snapshot
