"""One scheduling pass: waiting jobs in queue order, each placed by the engine on what is free now.

    for work in queue_order(waiting):      (or the order the face's queues give: fair share, corral.tenancy.fairshare)
        not yet due (retry back-off)          -> waits, "retrying after ..."
        same request shape already failed     -> waits, with that explanation (free resources only shrink in a pass)
        place(snapshot, job.request)          -> Start (snapshot updated, so the next job sees it) or waits, explained
          behind a reservation and ending after its start: placed again on the reservation's view
                                              -> Start, or waits, "would delay the reservation of job N (GPUs ...)"
        the first GPU job that does not fit   -> the head: its reservation is booked (reservation.book)

Backfill with a reservation (corral.tenancy.reservation): the first job in queue order that asks for GPUs and does
not fit now (the head) gets a reservation: the earliest time, and the GPUs, that the expected ends of running jobs
(start + time limit, or the default run time) free for it. A job behind it starts now only if it does not delay that
reservation: it ends by the reservation's start (its time limit, or the default, from now), or it fits beside the
reservation on what is free now. Only the head gets one (Slurm reserves for more jobs; one is what keeps a big job
from starving, and keeps a round cheap). See docs/backfill.md. Pure: snapshot + jobs + expected ends + config + clock
value in, a plan out; the daemon carries it out.

A long queue: jobs of one shape (the fields of the request that decide where it can go, plus its MPS owner) fit or
fail together within a pass, so a pass makes at most one failed placement attempt per shape, however many jobs wait;
the rest of that shape get the same words without a call. What is left per job is a few dictionary look-ups: each
job's `Work` (the face's conversion, `work_of`), queue key and shape are computed once in its life and kept in a
`ShapeCache` the face holds across rounds (keyed by the face's object itself: serve's store keeps a job's object
unchanged until the job is written).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, TypeVar

import numpy as np

from corral.model.errors import InvalidRequest
from corral.model.resources import Allocation, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import Decision, PlacementConfig, place, render
from corral.tenancy.gang import GangDecision, combined_request, place_gang, place_members
from corral.tenancy.model import Work
from corral.tenancy.order import queue_key
from corral.tenancy.reservation import DEFAULT_TIME_LIMIT_S, Booker, Booking, Reservation, book


@dataclass(frozen=True)
class RoundQueues:
    """What the pass needs from the queues for one round (the face builds it: serve's `Queues.round`)."""

    order: Callable[[list[Any]], list[Any]]
    gate: Callable[[Any], str | None]
    took: Callable[[Any], None]
    #: A gang group's members checked together (their whole ask), before any of them is placed.
    gate_group: Callable[[list[Any]], str | None]


T = TypeVar("T")


def same(work: Work) -> Work:
    """`work_of` for a face that hands in `Work` itself."""
    return work


@dataclass(frozen=True)
class Start:
    job_id: str
    allocation: Allocation
    notes: tuple[str, ...] = ()  # the engine's notes on the placement (e.g. the undefined-behaviour warning)


@dataclass(frozen=True)
class Plan:
    starts: list[Start] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)  # job id -> why it waits, in words
    unresolvable: set[str] = field(default_factory=set)  # jobs no node can ever hold
    placements: int = 0  # calls to the engine this pass (one per shape that failed, one or two per start)
    unplaced: int = 0  # request shapes that could not be placed this pass (on what is free, or beside the reservation)
    reservation: Reservation | None = None  # the head's, if it has one
    order: list[str] = field(default_factory=list)  # the ids of the jobs offered, in queue order


_work_id = attrgetter("work.id")
_WORK = attrgetter("work")


@dataclass(frozen=True)
class _Entry:
    source: object  # the very object the entry was made for: another object with this id is a changed one
    work: Work
    key: tuple[int, float, int, str]
    shape: int  # an index into ShapeCache.shapes, so a look-up hashes an int, not the request's fields
    wants_gpu: bool
    group: str = ""  # its gang (Work.gang): its members start together or not at all


class ShapeCache:
    """Each job's queue key and shape, computed once per job object and kept across passes.

    Safe against change: an entry is used only for the object it was made for (`is`), and a job the store writes is
    a new object. Entries of jobs that left the queue are dropped when the cache has grown to twice the queue.
    """

    def __init__(self) -> None:
        self.entries: dict[str, _Entry] = {}
        self.shapes: dict[Hashable, int] = {}  # shape -> its index
        #: The same entries by their object's identity (the entry keeps its object, so no id is reused meanwhile):
        #: a face's item found without making its Work again (a cluster's 10,000 pending pods a round)
        self._by_object: dict[int, _Entry] = {}

    def known(self, item: object) -> _Entry | None:
        """The entry made for this very object, if any (without converting it)."""
        found = self._by_object.get(id(item))
        return found if found is not None and found.source is item else None

    def entry(self, item: T, work_of: Callable[[T], Work]) -> _Entry:
        found = self._by_object.get(id(item))
        if found is not None and found.source is item:
            return found
        work = work_of(item)
        found = self.entries.get(work.id)
        if found is not None and found.source is item:
            self._by_object[id(item)] = found
            return found
        request = work.request
        shape = (
            request.placement_key(),
            work.share_owner or request.share_owner,
            work.instances,
        )  # a gang of 3 fits where 2 fit, or not
        index = self.shapes.setdefault(shape, len(self.shapes))
        made = _Entry(item, work, queue_key(work), index, request.wants_gpu, work.gang)
        self.entries[work.id] = made
        self._by_object[id(item)] = made
        return made

    def work(self, item: T, work_of: Callable[[T], Work]) -> Work:
        """`item`'s Work: the one made for this very object, or a new one (kept)."""
        return self.entry(item, work_of).work

    def entries_for(self, items: Sequence[T], work_of: Callable[[T], Work]) -> list[_Entry]:
        """Each item's entry (`entry`, for a whole queue: the look-up of one already made inlined; this runs once
        per queued job every round)."""
        known, make = self._by_object.get, self.entry
        return [e if (e := known(id(item))) is not None and e.source is item else make(item, work_of) for item in items]

    def works(self, items: Sequence[T], work_of: Callable[[T], Work]) -> list[Work]:
        """Each item's Work (`work`, for a whole queue)."""
        return list(map(_WORK, self.entries_for(items, work_of)))

    def prune(self, keep: int) -> None:
        """Forget jobs that have left the queue once the cache holds more than twice `keep` of them."""
        if len(self.entries) > 2 * keep + 64 or len(self._by_object) > 2 * keep + 64:
            self.entries.clear()
            self._by_object.clear()
        if len(self.shapes) > 4 * keep + 1024:
            self.shapes.clear()
            self.entries.clear()
            self._by_object.clear()


def _place(
    snapshot: ClusterSnapshot, request: Request, instances: int, config: PlacementConfig, rng: np.random.Generator
) -> Decision | GangDecision:
    """One job's placement: the engine's, or for a gang all its instances together (corral.daemon.gang)."""
    return (
        place(snapshot, request, config, rng)
        if instances == 1
        else place_gang(snapshot, request, instances, config, rng)
    )


def _groups(entries: Sequence[_Entry]) -> dict[str, list[_Entry]]:
    """The queued members of each gang group, in queue order."""
    out: dict[str, list[_Entry]] = {}
    for e in entries:
        if e.group:
            out.setdefault(e.group, []).append(e)
    return out


def _place_group(
    members: Sequence[_Entry],
    snapshot: ClusterSnapshot,
    booking: Booking | None,
    queues: RoundQueues | None,
    config: PlacementConfig,
    rng: np.random.Generator,
) -> tuple[list[Start], str | None, int]:
    """A gang group's start: every member placed, one after the other, on a copy of what is free (of what the
    reservation leaves, with `booking`: the members run past its start), each seeing the earlier ones' grants; all
    fit, or none starts. Returns (the starts, or none; why not; calls to the engine). A group waits, without a call,
    until all `gang_size` members are queued (the controller submits them in one round)."""
    size = members[0].work.gang_size
    if len(members) < size:
        return [], f"gang: {len(members)} of {size} instances queued; they start together once all are", 0
    if queues is not None:
        # The members together against every limit: their whole ask, not one member's (issue 23).
        held_back = queues.gate_group(list(members))
        if held_back is not None:
            return [], f"gang: {held_back}", 0
    space = booking.view() if booking is not None else snapshot
    found = place_members(space, [m.work.placing for m in members], config, rng)
    tries = found.fitted + 1
    if found.error is not None:
        return [], f"gang: instance job {members[found.fitted].work.id}: {found.error}", tries
    if found.fitted < len(members):
        assert found.last is not None
        beside = f" beside the reservation of job {booking.reservation.job_id}" if booking is not None else ""
        return (
            [],
            (
                f"gang: {found.fitted} of {len(members)} instances fit{beside} (the app asked for corral.gang: all "
                f"start or none); instance {found.fitted + 1}: {render(found.last.explanation)}"
            ),
            tries,
        )
    starts = [
        Start(m.work.id, d.allocation, d.explanation.notes)
        for m, d in zip(members, found.placed, strict=True)
        if d.allocation is not None
    ]
    return starts, None, len(members)


#: Why a job waits when `may_fit` already says it cannot fit now (only with `prefilter`).
NO_ROOM_NOW = "no node has room for it now"


def may_fit(snapshot: ClusterSnapshot, request: Request) -> bool:
    """A necessary condition for `request` to fit now: some node has its CPU, its memory and as many GPUs as it asks
    for wholly free (whole GPUs), or with its GPU milli and memory free (a share; models are left to `place`). Far
    cheaper than a failed `place` on a cluster (sim fair's openb replay: fair-backfill 124 s without it, 40 s with
    it, BENCHMARKS.md)."""
    ok = (snapshot.cpu_free >= request.cpu_milli) & (snapshot.mem_free >= request.memory_mib)
    if request.gpu_count and request.whole_gpus:  # whole GPUs are granted only where nothing of them is held
        ok &= snapshot.gpu_full_free >= request.gpu_count
    elif request.gpu_count:  # a share: its milli and its memory free on one GPU, of at least its minimum memory
        gpu = (snapshot.gpu_milli_free >= request.gpu_milli) & (snapshot.gpu_mem_free >= request.gpu_memory_mib)
        if request.min_gpu_memory_mib:
            gpu &= snapshot.gpu_mem_cap >= request.min_gpu_memory_mib
        ok &= np.count_nonzero(gpu, axis=1) >= request.gpu_count
    return bool(ok.any())


def clock_text(t: float) -> str:
    """An epoch time as a user reads it in a reason: UTC, to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def schedule(
    snapshot: ClusterSnapshot,
    waiting: Sequence[T],
    config: PlacementConfig,
    now: float,
    rng: np.random.Generator | None = None,
    work_of: Callable[[T], Work] = same,  # type: ignore[assignment]
    cache: ShapeCache | None = None,
    max_starts: int | None = None,
    ends: Mapping[str, float] | None = None,
    default_time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    queues: RoundQueues | None = None,
    ordered: bool = False,
    words: bool = True,
    booker: Booker = book,
    prefilter: bool = False,
) -> Plan:
    """Decide which waiting jobs start now. Grants go into `snapshot` as they are decided.

    `waiting`: `Work`, or the face's own objects with `work_of` converting each (once per object, kept in `cache`:
    the keys, shapes and works of earlier passes, a fresh one if None). `ordered`: `waiting` is in the face's order
    already (sim fair's arrival or fair order) and no `queues` order is asked for. `words` False: the pass may end
    as soon as every shape waiting has failed now (a simulator asks only what starts; the jobs not reached have no
    reason). With `max_starts`, the pass places nothing more once that many are decided: the rest wait for the next
    pass, unplaced, keeping the reason they had (a job that has none yet is told it waits for the next round), so a
    burst does not rewrite every queued job's reason. `booker`: how the head's reservation is found
    (`reservation.book`; `reservation.book_fast` on a cluster: the same reservation with fewer placements).
    `prefilter`: a job that fails `may_fit` is not placed (a cluster's long queue; its words are NO_ROOM_NOW).
    `ends`: the expected end of each allocation in `snapshot` (allocation id -> epoch seconds; one not named never
    ends, e.g. memory of foreign processes); `default_time_limit_s`: how long a job without a time limit is expected
    to run. Together they place the head's reservation. `queues` (corral.daemon.queues): the order of the pass
    (priority, fair share, age) instead of priority then age, and the limits checked before a job is placed (a job
    held back by one waits with its words, and is not the head)."""
    cache = cache if cache is not None else ShapeCache()
    entries = cache.entries_for(waiting, work_of)
    cache.prune(len(entries))
    if queues is not None:
        entries = queues.order(entries)
    elif not ordered:
        entries.sort(key=attrgetter("key"))
    # Without words, the pass may stop once every shape has failed now: nothing behind can start (gangs aside).
    shapes = -1 if words or any(e.group for e in entries) else len({e.shape for e in entries})
    starts: list[Start] = []
    reasons: dict[str, str] = {}
    unresolvable: set[str] = set()
    # Per shape, why it cannot start, and whether never: on what is free now (`failed`), and, for jobs that would
    # run past the reservation's start, on what the reservation leaves (`delays`). Both only shrink within a pass.
    failed: dict[int, tuple[str, bool]] = {}
    delays: dict[int, str] = {}
    placements = 0
    # the expected ends, copied only once a start adds one: until then the booker sees the face's own mapping (a
    # FastBooker knows it again: a full cluster's rounds book the same reservation)
    expected: Mapping[str, float] = ends if ends is not None else {}
    booking: Booking | None = None
    booked = False  # the head has been found (with a reservation or without one)
    generator = rng if rng is not None else np.random.default_rng(0)
    shape_failed = failed.get
    groups: dict[str, list[_Entry]] | None = None  # gang groups' queued members, in queue order (made when needed)
    groups_done: set[str] = set()

    def planned_end(work: Work) -> float:
        limit = work.time_limit_s
        return now + (limit if limit is not None else default_time_limit_s)

    def take(entry: _Entry, start: Start, end: float, outlives: bool) -> None:
        """A start decided: granted in `snapshot` (and beside the reservation), expected to end at `end`."""
        snapshot.allocate(start.allocation)
        if booking is not None:
            booking.took(start.allocation, outlives)
        nonlocal expected
        if expected is ends:  # (still the caller's: copied before the first change)
            expected = dict(expected)
        expected[start.job_id] = end  # type: ignore[index]
        if queues is not None:
            queues.took(entry)
        starts.append(start)

    for entry in entries:
        job = entry.work
        if max_starts is not None and len(starts) >= max_starts:
            if not job.reason:
                reasons[job.id] = f"waiting for the next round: at most {max_starts} jobs start in one round"
            continue
        if job.not_before > now:
            reasons[job.id] = f"retrying after back-off in {job.not_before - now:.0f} s"
            continue
        if entry.group:  # a gang group: decided as a whole at its first member in queue order (see _place_group)
            if entry.group in groups_done:
                continue  # its reason (or its start) was given with the group's first member
            groups_done.add(entry.group)
            if groups is None:
                groups = _groups(entries)
            members = groups[entry.group]
            end = planned_end(job)
            outlives = booking is not None and end > booking.start
            group_starts, why, tries = _place_group(
                members, snapshot, booking if outlives else None, queues, config, generator
            )
            placements += tries
            for m, start in zip(members, group_starts, strict=False):
                take(m, start, end, outlives)
            if why is not None:
                for m in members:
                    reasons[m.work.id] = why
                if not booked and entry.wants_gpu and tries:  # did not fit now: the group is the head
                    booked = True
                    booking = booker(snapshot, combined_request(job.placing, len(members)), expected, config)
            continue
        if queues is not None:
            held_back = queues.gate(entry)
            if held_back is not None:
                reasons[job.id] = held_back
                continue
        same = shape_failed(entry.shape)
        if same is not None:
            reasons[job.id] = same[0]
            if same[1]:
                unresolvable.add(job.id)
            continue
        end = planned_end(job)
        outlives = booking is not None and end > booking.start
        if outlives:
            held = delays.get(entry.shape)
            if held is not None:
                reasons[job.id] = held
                continue
        request = job.placing
        if prefilter and job.instances == 1 and not may_fit(snapshot, request):
            # Cannot fit now by the necessary test: as a failed placement, without its call (a cluster's queue).
            failed[entry.shape] = (NO_ROOM_NOW, False)
            reasons[job.id] = NO_ROOM_NOW
            if not booked and entry.wants_gpu:
                booked = True  # the head, as below
                booking = booker(snapshot, request, expected, config)
            if len(failed) == shapes:
                break
            continue
        # One that runs past the reservation's start must fit beside it: placed there first (what is free beside it
        # is free now, so a fit there is a start); only where it does not fit there is it placed on what is free
        # now, to tell "no room now" from "would delay the reservation". One that fails the necessary test now
        # (may_fit; already passed with the prefilter) is placed on what is free now only. (Each shape fails once.)
        beside = (booking is not None and outlives
                  and ((prefilter and job.instances == 1) or may_fit(snapshot, request)))  # fmt: skip
        placements += 1
        try:
            space = booking.view() if beside and booking is not None else snapshot
            decision = _place(space, request, job.instances, config, generator)
            if beside and decision.allocation is None:
                placements += 1
                now_decision = _place(snapshot, request, job.instances, config, generator)
                if now_decision.allocation is None:
                    decision = now_decision
                    beside = False  # no room now: its words are the engine's, as for any job
        except InvalidRequest as exc:  # e.g. a GPU model this machine no longer has: can never start
            failed[entry.shape] = (str(exc), True)
            reasons[job.id] = str(exc)
            unresolvable.add(job.id)
            if len(failed) == shapes:
                break
            continue
        if beside and booking is not None and decision.allocation is None:
            r = booking.reservation
            gpus = ", ".join(map(str, r.allocation.gpu_indices)) or "none"
            delays[entry.shape] = (
                # No time in these words: a reason that changed every round would be rewritten for every
                # such job every round. `explain` gives the reservation's start.
                f"would delay the reservation of job {r.job_id} (GPUs {gpus}): a job behind it starts first "
                "only if it ends before the reservation starts (by its time limit, or the default) or fits "
                "beside it"
            )
            reasons[job.id] = delays[entry.shape]
            continue
        if decision.allocation is not None:
            take(entry, Start(job.id, decision.allocation, decision.explanation.notes), end, outlives)
            continue
        text = decision.reason() if isinstance(decision, GangDecision) else render(decision.explanation)
        never = all(decision.unresolvable(i) for i in range(len(snapshot)))
        failed[entry.shape] = (text, never)
        reasons[job.id] = text
        if never:
            unresolvable.add(job.id)
        elif not booked and entry.wants_gpu:
            booked = True  # the head: the first job that asks for GPUs and does not fit now
            booking = booker(snapshot, combined_request(request, job.instances), expected, config)
        if len(failed) == shapes:
            break  # every shape still waiting fails now: nothing behind can start
    reservation = booking.reservation if booking is not None else None
    order = list(map(_work_id, entries))
    return Plan(starts, reasons, unresolvable, placements, len(failed) + len(delays), reservation, order)
