"""A reservation for the head of the queue, and the view a backfilled job must fit in so it does not delay it.

    expected end of a running job = its start + its time limit, never earlier than now (it is being stopped);
                                    without one: its start + the default, or + 2, 3 ... times it once past it
    future = the snapshot now; for T over the distinct expected ends, earliest first:
                 release the jobs that end by T; place(head) on what is left -> the first fit is the reservation
    shadow = future + the reservation's grant: what the machine has left at T beside the reservation
    view   = per resource min(now, shadow): what is free now AND not needed by the reservation at T

A lower job that ends by T (its time limit, or the default, from now) may take anything free now: it is gone when the
reservation starts. One that runs past T must fit in `view`, so it takes nothing the reservation needs (Slurm's
backfill rule). Only the head gets a reservation; the jobs behind it are held back only by it.

Cheap by construction: one machine has few running jobs, so few distinct ends, one placement per end at most, and
one copy of the snapshot per pass (plus one per start, since starts change `view`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from corral.model.errors import AllocationError
from corral.model.holdings import Holdings, give_back
from corral.model.resources import MILLI_PER_GPU, Allocation, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place

#: A job without a time limit is expected to run this long (seconds) when planning a reservation: `corral serve
#: --default-time-limit`. For planning only: such a job is not stopped when it is over.
DEFAULT_TIME_LIMIT_S = 3600.0


@dataclass(frozen=True)
class Reservation:
    """Where and when the head of the queue starts, if the running jobs end when their time limits say."""

    job_id: str
    start: float  # epoch seconds: the estimated start
    allocation: Allocation  # the GPUs (and CPU, memory) set aside for it
    waits_for: tuple[str, ...]  # the running jobs whose ends free what it is given, earliest end first


class Booking:
    """A reservation and the views of the machine that backfill is checked against, kept up to date as jobs start."""

    def __init__(self, reservation: Reservation, shadow: ClusterSnapshot, now: ClusterSnapshot,
                 shared: bool = False) -> None:  # fmt: skip
        self.reservation = reservation
        self.shadow = shadow
        self.now = now
        self._view: ClusterSnapshot | None = None
        self._shared = shared  # `shadow` is another's (FastBooker's kept one): copied before the first change

    @property
    def start(self) -> float:
        return self.reservation.start

    def view(self) -> ClusterSnapshot:
        """What a job that runs past the reservation's start may take (rebuilt after each start)."""
        if self._view is None:
            self._view = intersect(self.now, self.shadow)
        return self._view

    def took(self, allocation: Allocation, outlives: bool) -> None:
        """A job started with `allocation` (already granted in `now`); if it runs past the start, it holds its
        resources in the shadow too (it fit in the view, so it fits there)."""
        if outlives:
            if self._shared:
                self.shadow, self._shared = self.shadow.copy(), False
            self.shadow.allocate(allocation)
            if self._view is not None:
                # It was placed on the view: min(now - a, shadow - a) is the view less a, without a new intersect
                # (a copy of the whole cluster per backfilled start: k8s_round, BENCHMARKS.md)
                try:
                    self._view.allocate(allocation)
                    return
                except AllocationError:
                    pass
        if self._view is not None:  # only its node changed: that row of the view made again, not the whole view
            intersect_row(self._view, self.now, self.shadow, allocation.node_index)


def expected_end(started_at: float | None, time_limit_s: float | None, default_s: float, now: float) -> float:
    """When a running job should end: its start plus its time limit, not before now (it is being stopped).

    A job without a time limit is expected to run the default, and once past it, to the next multiple of it: it is
    not stopped, and "any moment now" would have the head's reservation hold free GPUs idle for as long as, say, a
    service runs, where a rolling estimate lets jobs shorter than the default use them meanwhile."""
    start = now if started_at is None else started_at
    if time_limit_s is not None:
        return max(now, start + time_limit_s)
    periods = max(1, math.ceil((now - start) / default_s))
    return start + periods * default_s


def book(
    snapshot: ClusterSnapshot, request: Request, ends: Mapping[str, float], config: PlacementConfig
) -> Booking | None:
    """The earliest reservation for `request` (its `id` is the job's) as the jobs in `ends` (allocation id -> expected
    end) leave `snapshot`; None when it does not fit even once they have all ended (e.g. memory other processes
    hold). Leaves `snapshot` unchanged."""
    held = snapshot.allocations
    by_end: dict[float, list[str]] = {}
    for job_id, end in ends.items():
        if job_id in held:
            by_end.setdefault(end, []).append(job_id)
    return _book(snapshot, request, ((t, by_end[t]) for t in sorted(by_end)), config, ends)


def _book(
    snapshot: ClusterSnapshot,
    request: Request,
    leaving: Iterable[tuple[float, Sequence[str]]],
    config: PlacementConfig,
    ends: Mapping[str, float],
) -> Booking | None:
    """`book` over the jobs leaving at each time, earliest first: after each time's jobs are released, a placement.
    The jobs it waits for are named by their own ends (`ends`), earliest first."""
    future = snapshot.copy()
    released: list[tuple[float, Allocation]] = []
    rng = np.random.default_rng(0)  # its own seed: planning must not change the daemon's draws
    for t, jobs in leaving:
        released.extend((t, a) for a in future.release_many(jobs))
        decision = place(future, request, config, rng, explain_placed=False, explain_refused=False)  # (a grant only)
        if decision.allocation is None:
            continue
        grant = decision.allocation
        future.allocate(grant)
        reserved = set(grant.gpu_indices)
        at = grant.node_index
        freeing = [a.request_id for _, a in released if a.node_index == at and reserved & set(a.gpu_indices)]
        waits = tuple(sorted(freeing or [a.request_id for _, a in released], key=lambda r: (ends[r], r)))
        return Booking(Reservation(request.id, t, grant, waits), future, snapshot)
    return None


def intersect_row(both: ClusterSnapshot, now: ClusterSnapshot, shadow: ClusterSnapshot, i: int) -> None:
    """Node `i` of `both` (an `intersect` of the two) made again from them, after one of them changed there."""
    static = now.STATIC_COLUMNS
    for key, value in now.__dict__.items():
        if isinstance(value, np.ndarray) and key not in static and key != "version":
            getattr(both, key)[i] = value[i]
    _intersect_rows(both, now, shadow, slice(i, i + 1))


def intersect(now: ClusterSnapshot, shadow: ClusterSnapshot) -> ClusterSnapshot:
    """A snapshot whose free resources are, per node and GPU, the smaller of `now`'s and `shadow`'s. A GPU whose
    shares belong to different owners in the two is not offered at all."""
    both = now.copy(allocations=False)  # (a view to place on: no job is released from it by id)
    _intersect_rows(both, now, shadow, slice(None))
    return both


def _intersect_rows(both: ClusterSnapshot, now: ClusterSnapshot, shadow: ClusterSnapshot, rows: slice) -> None:
    """`intersect` on the nodes of `rows`, where `both` holds `now`'s columns: the smaller free resources, the
    shadow's share owners (where `both`'s GPU has none; one of another owner is not offered at all), the totals
    counted again, and the version moved (what the engine memoised for `now` does not hold here)."""
    both.cpu_free[rows] = np.minimum(now.cpu_free[rows], shadow.cpu_free[rows])
    both.mem_free[rows] = np.minimum(now.mem_free[rows], shadow.mem_free[rows])
    both.gpu_milli_free[rows] = np.minimum(now.gpu_milli_free[rows], shadow.gpu_milli_free[rows])
    both.gpu_mem_free[rows] = np.minimum(now.gpu_mem_free[rows], shadow.gpu_mem_free[rows])
    names = {v: k for k, v in shadow.owner_ids.items()}
    first = rows.start or 0
    for r, j in zip(*np.nonzero(shadow.gpu_owner[rows] >= 0), strict=True):
        i = first + int(r)
        theirs = both.owner_id(names[int(shadow.gpu_owner[i, j])])
        mine = int(both.gpu_owner[i, j])
        if mine == -1:
            both.gpu_owner[i, j] = theirs
            both.gpu_owner_shares[i, j] = shadow.gpu_owner_shares[i, j]
        elif mine != theirs:
            both.gpu_milli_free[i, j] = 0
            both.gpu_mem_free[i, j] = 0
    present = both.gpu_present[rows]
    both.gpu_free_total[rows] = np.where(present, both.gpu_milli_free[rows], 0).sum(axis=1)
    whole = present & (both.gpu_milli_free[rows] == MILLI_PER_GPU) & (both.gpu_mem_free[rows] == both.gpu_mem_cap[rows])
    both.gpu_full_free[rows] = whole.sum(axis=1)
    both.version[rows] += 1


def book_fast(
    snapshot: ClusterSnapshot,
    request: Request,
    ends: Mapping[str, float],
    config: PlacementConfig,
    holdings: Holdings | None = None,
) -> Booking | None:
    """`book`, with the expected end it starts at found by bisection first.

    `book` tries a placement at every distinct expected end in turn: fine for one machine's few jobs, thousands of
    placements a round for a cluster's. Whether the request fits once the jobs ending by T have left only grows with
    T (free resources only grow), so the first T where it fits is found with log2(ends) placements, and `book` is
    handed ends where every one before that T is moved to the last T where it does not fit: it then places twice,
    at the same T, by the same rule. `holdings`: the columns kept between rounds (FastBooker)."""
    held = snapshot.allocations
    ids = list(ends)  # (a cluster's tens of thousands: read without a Python loop where none is missing)
    end = np.fromiter(ends.values(), dtype=np.float64, count=len(ids))
    try:
        allocs: list[Allocation] = list(map(held.__getitem__, ids))
    except KeyError:  # ends of allocations not in the snapshot are left out
        kept = np.fromiter((i in held for i in ids), dtype=np.bool_, count=len(ids))
        end, ids = end[kept], [i for i in ids if i in held]
        allocs = list(map(held.__getitem__, ids))
    times = np.unique(end)
    if len(times) <= 2:
        return book(snapshot, request, ends, config)

    # The running jobs' holdings as columns, so each probe frees the jobs ending by T with a few vectorised adds
    # instead of one `release` per job (a probe only answers "fits or not": `book` makes the reservation).
    node, cpu, mem, tag, shared, g_milli, g_mem, _ = (holdings or Holdings()).of(allocs, snapshot.max_gpus)
    if shared.any():
        return book(snapshot, request, ends, config)

    def fits(i: int) -> bool:
        future = snapshot.copy(allocations=False)  # (a probe: only where it would fit)
        gone = end <= times[i]
        give_back(future, node[gone], cpu[gone], mem[gone], tag[gone], g_milli[gone], g_mem[gone])
        return place(
            future, request, config, np.random.default_rng(0), explain_placed=False, explain_refused=False
        ).placed

    # (no probe with every job gone first: where nothing ever fits, the search ends at the last end and `book`
    # finds nothing there either; one whole-GPU request no node can ever hold is known without a placement)
    lo, hi = _earliest(snapshot, request, times, end, node, g_milli, g_mem), len(times) - 1
    if lo > hi:
        return None
    if lo < hi:  # the bound is mostly the answer: tried first
        if fits(lo):
            hi = lo
        else:
            lo += 1
    while lo < hi:  # invariant: fits(hi) unless nothing fits; everything before lo does not fit
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    # `book` from the last end where it does not fit (every job ending by then released at once), from the columns
    first = lo - 1 if lo > 0 else 0

    def leaving() -> Iterator[tuple[float, list[str]]]:
        yield float(times[first]), [ids[i] for i in np.flatnonzero(end <= times[first]).tolist()]
        for t in times[first + 1 :]:
            yield float(t), [ids[i] for i in np.flatnonzero(end == t).tolist()]

    return _book(snapshot, request, leaving(), config, ends)


def _earliest(
    snapshot: ClusterSnapshot,
    request: Request,
    times: npt.NDArray[np.float64],
    end: npt.NDArray[np.float64],
    node: npt.NDArray[np.int64],
    g_milli: npt.NDArray[np.int64],
    g_mem: npt.NDArray[np.int64],
) -> int:
    """The first of `times` at which some node could have the request's whole GPUs free (0: no bound): a GPU is
    whole once it is whole now, or every job holding part of it is among those leaving, at the last of their ends
    (held by anything else, it never is). Before that no placement can fit, so the search starts there;
    len(times) when no node ever could."""
    k = request.gpu_count
    width = snapshot.max_gpus
    if not request.whole_gpus or not 0 < k <= width:
        return 0
    n = len(snapshot)
    held = (g_milli > 0) | (g_mem > 0)
    jobs, gpu = np.nonzero(held)
    cells = node[jobs] * width + gpu
    last = np.full(n * width, -np.inf)
    np.maximum.at(last, cells, end[jobs])
    milli = np.bincount(cells, weights=g_milli[jobs, gpu], minlength=n * width).reshape(n, width)
    mem = np.bincount(cells, weights=g_mem[jobs, gpu], minlength=n * width).reshape(n, width)
    cap = snapshot.gpu_mem_cap
    whole_now = snapshot.gpu_present & (snapshot.gpu_milli_free == MILLI_PER_GPU) & (snapshot.gpu_mem_free == cap)
    leaving = (milli == MILLI_PER_GPU - snapshot.gpu_milli_free) & (mem == cap - snapshot.gpu_mem_free)
    free_at = np.where(whole_now, -np.inf, np.where(snapshot.gpu_present & leaving, last.reshape(n, width), np.inf))
    bound = float(np.sort(free_at, axis=1)[:, k - 1].min())
    return int(np.searchsorted(times, bound, side="left"))  # len(times): never (held by what never ends)


class FastBooker:
    """`book_fast` with its columns kept between rounds: one per face (a Booker).

    It also keeps its last answer: a full cluster's rounds (pods arrive, none starts) book the same head on the same
    books again and again (10 ms a round, k8s_round). The answer is given again only for the very same request
    object and ends mapping (a face hands the same ones while nothing changed) and config, on a snapshot whose
    nodes are the same objects and whose every changing column, share owners and number of allocations equal
    those of then; its shadow is shared until a start changes it (Booking copies it first)."""

    def __init__(self) -> None:
        self.holdings = Holdings()
        self._last: tuple[Request, Mapping[str, float], PlacementConfig, dict[str, Any], Booking | None] | None = None

    def __call__(
        self, snapshot: ClusterSnapshot, request: Request, ends: Mapping[str, float], config: PlacementConfig
    ) -> Booking | None:
        last = self._last
        if (last is not None and last[0] is request and last[1] is ends and last[2] is config
                and _same_books(snapshot, last[3])):  # fmt: skip
            kept = last[4]
            return None if kept is None else Booking(kept.reservation, kept.shadow, snapshot, shared=True)
        booking = book_fast(snapshot, request, ends, config, self.holdings)
        kept = None if booking is None else Booking(booking.reservation, booking.shadow.copy(), snapshot)
        self._last = (request, ends, config, _books_of(snapshot), kept)
        return booking


def _books_of(snapshot: ClusterSnapshot) -> dict[str, Any]:
    """What `_same_books` compares: every attribute of the snapshot but its allocation records and memo (the
    changing columns copied, the rest as they are), and how many allocations it holds."""
    static = snapshot.STATIC_COLUMNS
    out: dict[str, Any] = {"#allocations": len(snapshot.allocations)}
    for key, value in snapshot.__dict__.items():
        if key in ("allocations", "memo"):
            continue
        if isinstance(value, np.ndarray):
            out[key] = value if key in static else value.copy()
        elif isinstance(value, dict):
            out[key] = dict(value)
        else:
            out[key] = value
    return out


def _same_books(snapshot: ClusterSnapshot, kept: dict[str, Any]) -> bool:
    """Whether `snapshot` holds what `kept` (`_books_of`) held: the same nodes and static columns (the very objects),
    equal changing columns and maps, as many allocations."""
    if len(snapshot.allocations) != kept["#allocations"] or len(snapshot.__dict__) != len(kept) + 1:
        return False
    static = snapshot.STATIC_COLUMNS
    missing = object()
    for key, value in snapshot.__dict__.items():
        if key in ("allocations", "memo"):
            continue
        then = kept.get(key, missing)
        if isinstance(value, np.ndarray):
            same = (
                value is then
                if key in static
                else isinstance(then, np.ndarray) and np.array_equal(value, then, equal_nan=value.dtype.kind == "f")
            )  # (a GPU's utilisation is NaN where unknown)
        elif isinstance(value, dict):
            same = value == then
        else:
            same = value is then
        if not same:
            return False
    return True


#: How a round finds the head's reservation: `book`, or `book_fast` (the same reservation on a cluster).
Booker = Callable[[ClusterSnapshot, Request, Mapping[str, float], PlacementConfig], Booking | None]
