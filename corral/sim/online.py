"""Online replay: the trace's creation and deletion times are real, pods depart and wait in a pending queue.

    events in time order; at one instant, departures first, then arrivals by (creation_time, name)
    arrival    place(pod): placed -> start now, depart at now + runtime
                           every node unresolvable for it -> rejected (dropped, never queued)
                           otherwise -> appended to the FIFO pending queue
    departure  release(pod) -> one retry round over the pending queue, in arrival order (backfill: a later pod
               starts if it fits even when an earlier one does not)

runtime = deletion_time - creation_time; a pod without deletion_time, once started, holds its resources to the end.
After every event (arrival or departure, with the retries it triggered) the cluster's allocated GPU milli is
recorded, giving a step function of time (curves.csv). Each pod's arrival, start (node, GPUs), end and failure
(rejected at arrival, or still pending when the trace ends) is logged as an `OnlineEvent` (events.csv).

Keeping a retry round to useful work, with results identical to calling `place` for every pending pod in order:
- within a round, once a request shape failed, other pending pods of that shape are skipped (free resources only
  shrink during a round);
- every pending pod fails on the cluster as it is after each event, so after a release on node i it can only fit
  node i: shapes that node i cannot take (a vectorised test at the start of the round, the engine's filters on
  node i just before each try) are not handed to `place` at all.
Neither skip is taken for a shape that once failed on a scarce-GPU decline (restricted / preferential behaviour for
work without GPUs): such declines clear on any node as GPUs fill up, so those shapes always go to `place`.
"""

from __future__ import annotations

import csv
import dataclasses
import heapq
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from corral.model.arrays import FloatArray, IntArray
from corral.model.errors import InvalidRequest
from corral.model.resources import MILLI_PER_GPU, Allocation, Node, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, Reason, place
from corral.placement.engine import validate_against
from corral.placement.filters import fits_node_now
from corral.placement.reasons import UNRESOLVABLE_BITS
from corral.sim.openb import TracePod

#: Node reasons that can clear when free resources shrink: a failure that has them says nothing about same-shape pods.
NON_MONOTONE_BITS = Reason.DECLINED_SCARCE.bit | Reason.GPU_RESERVE.bit

PROGRESS_EVERY = 1000  # events between progress callbacks


@dataclass(frozen=True, slots=True)
class OnlineEvent:
    """One line of events.csv. kind: arrival | start | end | rejected (fits no node, dropped at arrival) |
    unplaced (still pending when the trace ends, logged at the last event's time)."""

    time: int  # seconds, the trace's clock (after any time compression)
    kind: str
    pod: str
    node: str = ""
    gpus: str = ""  # GPU indices on the node, "0,1"
    gpu_milli: int = 0  # GPU milli granted in all (1000 = one whole GPU)
    wait_s: int | None = None  # start only: start - arrival


EVENT_COLUMNS = ("policy", "time_s", "event", "pod", "node", "gpus", "gpu_milli", "wait_s")
CURVE_COLUMNS = ("policy", "time_s", "allocated_gpu_milli", "capacity_gpu_milli", "allocated_pct")


def _grant(alloc: Allocation) -> tuple[str, int]:
    return ",".join(str(i) for i in alloc.gpu_indices), sum(g.milli for g in alloc.gpus)


@dataclass(frozen=True)
class OnlineResult:
    policy: str
    times: FloatArray  # time (s) of each event (arrival or departure), non-decreasing
    allocated_milli: IntArray  # cluster GPU milli allocated right after each event
    capacity_milli: int
    delays: FloatArray  # queueing delay (start - creation) of every pod that was placed, in arrival order
    rejected: int  # pods that can never fit any node: dropped at once
    never_placed: int  # pods still pending when the trace ends
    pods: int
    wall_seconds: float
    arrivals_end: float = float("nan")  # time of the last arrival
    events: tuple[OnlineEvent, ...] = field(default=(), repr=False)  # in the order they happened

    @property
    def placed(self) -> int:
        return len(self.delays)

    def alloc_mean_pct(self, until: float | None = None) -> float:
        """Time-weighted mean of allocated / capacity (%) over [first arrival, `until`] (default: the last event)."""
        if not len(self.times) or not self.capacity_milli:
            return 0.0
        end = float(self.times[-1]) if until is None else min(until, float(self.times[-1]))
        span = end - float(self.times[0])
        if span <= 0:
            mean = float(self.allocated_milli[-1])
        else:
            # the step after event i holds until event i+1 (or `end`), clipped to the window
            edges = np.minimum(np.append(self.times[1:], end), end)
            widths = np.maximum(edges - np.minimum(self.times, end), 0.0)
            mean = float(np.dot(self.allocated_milli.astype(np.float64), widths)) / span
        return 100.0 * mean / self.capacity_milli

    def alloc_peak_pct(self) -> float:
        if not len(self.allocated_milli) or not self.capacity_milli:
            return 0.0
        return 100.0 * float(self.allocated_milli.max()) / self.capacity_milli

    def summary(self) -> dict[str, float | int]:
        """Counts, queueing-delay statistics (seconds; 0 when nothing was placed) and GPU allocation (%)."""
        d = self.delays
        pct: list[float] = [float(v) for v in np.percentile(d, [50, 90, 99])] if len(d) else [0.0, 0.0, 0.0]
        return {
            "pods": self.pods,
            "placed": self.placed,
            "rejected": self.rejected,
            "never_placed": self.never_placed,
            "delay_mean_s": float(d.mean()) if len(d) else 0.0,
            "delay_p50_s": pct[0],
            "delay_p90_s": pct[1],
            "delay_p99_s": pct[2],
            "delay_max_s": float(d.max()) if len(d) else 0.0,
            "delayed_pods": int(np.count_nonzero(d > 0)),
            "alloc_mean_pct": self.alloc_mean_pct(),
            # while work still arrives: the window where a policy's packing shows (a long tail of late departures
            # otherwise dominates the mean)
            "alloc_mean_arrivals_pct": self.alloc_mean_pct(self.arrivals_end)
            if self.arrivals_end == self.arrivals_end
            else self.alloc_mean_pct(),
            "alloc_peak_pct": self.alloc_peak_pct(),
            "wall_seconds": self.wall_seconds,
        }


def _requests(pods: Sequence[TracePod]) -> list[Request]:
    """Each pod's request with a unique id (its name; a repeated name gets '#2', '#3', ...); checks the times."""
    seen: dict[str, int] = {}
    used: set[str] = {p.name for p in pods}
    out = []
    for pod in pods:
        if pod.creation_time is None:
            where = f" (line {pod.line})" if pod.line else ""
            raise InvalidRequest(
                f"{pod.name}",
                f"online mode needs creation_time and deletion_time{where}; this pod has no creation_time "
                "(pod lists without times, such as the multigpu lists, can only be replayed offline)",
            )
        if pod.deletion_time is not None and pod.deletion_time < pod.creation_time:
            raise InvalidRequest(
                f"{pod.name}", f"deletion_time {pod.deletion_time} is before creation_time {pod.creation_time}"
            )
        k = seen.get(pod.name, 0) + 1
        seen[pod.name] = k
        rid = pod.name
        if k > 1:
            while f"{pod.name}#{k}" in used:
                k += 1
            seen[pod.name] = k
            rid = f"{pod.name}#{k}"
            used.add(rid)
        out.append(pod.request if pod.request.id == rid else dataclasses.replace(pod.request, id=rid))
    return out


class _Shapes:
    """Request shapes as columns, for the cheap per-node test that decides which pending shapes to retry."""

    def __init__(self, requests: Sequence[Request]) -> None:
        ids: dict[Hashable, int] = {}
        self.of = [ids.setdefault(r.placement_key(), len(ids)) for r in requests]
        first: dict[int, Request] = {}
        for s, r in zip(self.of, requests, strict=True):
            first.setdefault(s, r)
        reps = [first[s] for s in range(len(ids))]
        self.cpu: IntArray = np.array([r.cpu_milli for r in reps], dtype=np.int64)
        self.mem: IntArray = np.array([r.memory_mib for r in reps], dtype=np.int64)
        self.count: IntArray = np.array([r.gpu_count for r in reps], dtype=np.int64)
        self.milli: IntArray = np.array([r.gpu_milli for r in reps], dtype=np.int64)
        self.gpu_mem: IntArray = np.array([r.gpu_memory_mib for r in reps], dtype=np.int64)

    def may_fit(self, snapshot: ClusterSnapshot, node: int, shapes: IntArray) -> IntArray:
        """The shapes that node's free resources do not rule out (a necessary condition only: models, constraints
        and whole-GPU memory are left to `place`)."""
        ok = (self.cpu[shapes] <= snapshot.cpu_free[node]) & (self.mem[shapes] <= snapshot.mem_free[node])
        gpu_ok = (snapshot.gpu_milli_free[node][None, :] >= self.milli[shapes][:, None]) & (
            snapshot.gpu_mem_free[node][None, :] >= self.gpu_mem[shapes][:, None]
        )
        ok &= np.count_nonzero(gpu_ok, axis=1) >= self.count[shapes]
        fitting: IntArray = shapes[ok]
        return fitting


class _Replay:
    """The event loop of `run_online`; pods are numbered by arrival position."""

    def __init__(self, nodes: Sequence[Node], pods: Sequence[TracePod], config: PlacementConfig, seed: int) -> None:
        requests = _requests(pods)
        order = sorted(range(len(pods)), key=lambda i: (pods[i].creation_time or 0, pods[i].name))
        self.arrival = [pods[i].creation_time or 0 for i in order]
        self.runtime: list[int | None] = []
        for i in order:
            deletion = pods[i].deletion_time
            self.runtime.append(None if deletion is None else deletion - (pods[i].creation_time or 0))
        self.requests = [requests[i] for i in order]
        self.shapes = _Shapes(self.requests)
        self.snapshot = ClusterSnapshot(nodes)
        self.config = config
        self.rng = np.random.default_rng(seed)
        self.delays = np.full(len(pods), np.nan, dtype=np.float64)
        self.departures: list[tuple[int, int, int]] = []  # heap of (time, start sequence, pod)
        self.started = 0
        #: Pending pods by shape, each list in arrival order. Invariant after every event: each pending pod fails on
        #: the snapshot as it is, so a release on node i can only help shapes that node i's free resources allow.
        self.pending: dict[int, list[int]] = {}
        #: Shapes that once failed on a scarce-GPU decline: such a failure can clear on any node, so always retried.
        self.sticky: set[int] = set()
        self.log: list[OnlineEvent] = []

    def fits_node(self, request: Request, node: int) -> bool:
        """Whether `request` fits `node` as it is now, scarce-GPU behaviour aside (the engine's filters, one node)."""
        return fits_node_now(self.snapshot, request, node)

    def attempt(self, k: int, now: int) -> tuple[bool, bool, bool]:
        """Try to start pod k now: (placed, unresolvable on every node, failure may clear as resources shrink)."""
        request = self.requests[k]
        try:
            validate_against(self.snapshot, request)
        except InvalidRequest:  # names a GPU model or GPU memory this cluster lacks: it can never fit
            return False, True, False
        decision = place(self.snapshot, request, self.config, self.rng)
        if decision.allocation is not None:
            self.snapshot.allocate(decision.allocation)
            self.delays[k] = now - self.arrival[k]
            gpus, milli = _grant(decision.allocation)
            self.log.append(
                OnlineEvent(now, "start", request.id, decision.allocation.node, gpus, milli, now - self.arrival[k])
            )
            runtime = self.runtime[k]
            if runtime is not None:
                heapq.heappush(self.departures, (now + runtime, self.started, k))
            self.started += 1
            return True, False, False
        bits = decision.node_reasons
        return False, bool(np.all(bits & UNRESOLVABLE_BITS)), bool(np.any(bits & NON_MONOTONE_BITS))

    def arrive(self, k: int) -> bool:
        """Pod k arrives: start it, queue it, or (returned True) reject it."""
        self.log.append(OnlineEvent(self.arrival[k], "arrival", self.requests[k].id))
        placed, never, non_monotone = self.attempt(k, self.arrival[k])
        if placed:
            return False
        if never:
            self.log.append(OnlineEvent(self.arrival[k], "rejected", self.requests[k].id))
            return True
        s = self.shapes.of[k]
        self.pending.setdefault(s, []).append(k)
        if non_monotone:
            self.sticky.add(s)
        return False

    def depart(self) -> int:
        """The next departure: release it, then one retry round over the pending pods in arrival order."""
        now, _, k = heapq.heappop(self.departures)
        alloc = self.snapshot.allocations[self.requests[k].id]
        node = alloc.node_index
        self.snapshot.release(self.requests[k].id)
        gpus, milli = _grant(alloc)
        self.log.append(OnlineEvent(now, "end", self.requests[k].id, alloc.node, gpus, milli))
        if not self.pending:
            return now
        shapes = np.fromiter(self.pending, dtype=np.int64, count=len(self.pending))
        candidates = set(self.shapes.may_fit(self.snapshot, node, shapes).tolist())
        candidates |= self.sticky & self.pending.keys()
        # Merge the candidate shapes' queues by arrival position; a shape leaves the round at its first failure that
        # more allocation cannot undo (free resources only shrink during a round).
        heads = [(self.pending[s][0], s, 0) for s in candidates]
        heapq.heapify(heads)
        started: dict[int, set[int]] = {}
        while heads:
            k, s, p = heapq.heappop(heads)
            if s not in self.sticky and not self.fits_node(self.requests[k], node):
                continue  # it failed everywhere else before, and node alone cannot take it now
            placed, _, non_monotone = self.attempt(k, now)
            if placed:
                started.setdefault(s, set()).add(k)
            elif non_monotone:
                self.sticky.add(s)
            else:
                continue
            queue = self.pending[s]
            if p + 1 < len(queue):
                heapq.heappush(heads, (queue[p + 1], s, p + 1))
        for s, gone in started.items():
            left = [k for k in self.pending[s] if k not in gone]
            if left:
                self.pending[s] = left
            else:
                del self.pending[s]
        return now


def run_online(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    config: PlacementConfig,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> OnlineResult:
    """Replay `pods` against their creation and deletion times on a cluster of `nodes` (see the module docstring).

    `progress(done, total)` is called every PROGRESS_EVERY events and at the end; `total` is the arrivals plus the
    departures still possible (it shrinks when a pod is rejected, and equals `done` at the end).
    """
    start_wall = time.perf_counter()
    sim = _Replay(nodes, pods, config, seed)
    n = len(pods)
    times: list[int] = []
    allocated: list[int] = []
    rejected = 0
    done = 0
    total = n + sum(r is not None for r in sim.runtime)
    a = 0
    while a < n or sim.departures:
        if sim.departures and (a >= n or sim.departures[0][0] <= sim.arrival[a]):
            now = sim.depart()
        else:
            now = sim.arrival[a]
            if sim.arrive(a):
                rejected += 1
                if sim.runtime[a] is not None:
                    total -= 1  # its departure will not happen
            a += 1
        times.append(now)
        allocated.append(sim.snapshot.gpu_allocated_milli)
        done += 1
        if progress is not None and done % PROGRESS_EVERY == 0:
            progress(done, total)
    if progress is not None:
        progress(done, done)
    last = times[-1] if times else 0
    for k in sorted(k for queue in sim.pending.values() for k in queue):
        sim.log.append(OnlineEvent(last, "unplaced", sim.requests[k].id))
    return OnlineResult(
        policy=config.policy,
        times=np.array(times, dtype=np.float64),
        allocated_milli=np.array(allocated, dtype=np.int64),
        capacity_milli=sim.snapshot.total_gpus * MILLI_PER_GPU,
        delays=sim.delays[~np.isnan(sim.delays)],
        rejected=rejected,
        never_placed=sum(len(q) for q in sim.pending.values()),
        pods=n,
        wall_seconds=time.perf_counter() - start_wall,
        arrivals_end=float(max((p.creation_time or 0) for p in pods)) if pods else float("nan"),
        events=tuple(sim.log),
    )


def write_events(path: Path, results: Mapping[str, OnlineResult]) -> Path:
    """events.csv: every policy's events in the order they happened (EVENT_COLUMNS)."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(EVENT_COLUMNS)
        for policy, result in results.items():
            for e in result.events:
                wait = "" if e.wait_s is None else e.wait_s
                writer.writerow([policy, e.time, e.kind, e.pod, e.node, e.gpus, e.gpu_milli, wait])
    return path


def write_curves(path: Path, results: Mapping[str, OnlineResult]) -> Path:
    """curves.csv: the step function online.png plots, one row per event (the allocation right after it)."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(CURVE_COLUMNS)
        for policy, r in results.items():
            cap = max(r.capacity_milli, 1)
            for t, milli in zip(r.times.tolist(), r.allocated_milli.tolist(), strict=True):
                writer.writerow([policy, int(t), milli, r.capacity_milli, f"{100.0 * milli / cap:.4f}"])
    return path


def compress_time(pods: Sequence[TracePod], factor: float) -> list[TracePod]:
    """Arrivals `factor` times denser, each pod's runtime unchanged: offered load x `factor`.

    A sampled trace (openb holds a sample of its cluster's pods) replayed on the whole cluster barely loads it;
    compressing the arrival times is how to ask "what if the same kind of work arrived this much faster".
    """
    if not factor > 0:
        raise InvalidRequest("--time-compression", f"must be > 0, got {factor}")
    out = []
    for p in pods:
        if p.creation_time is None:
            out.append(p)
            continue
        start = round(p.creation_time / factor)
        end = None if p.deletion_time is None else start + (p.deletion_time - p.creation_time)
        out.append(dataclasses.replace(p, creation_time=start, deletion_time=end))
    return out
