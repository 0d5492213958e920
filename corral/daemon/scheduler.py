"""One scheduling pass: waiting jobs in queue order, each placed by the engine on what is free now.

    for job in queue_order(waiting):
        not yet due (retry back-off)          -> waits, "retrying after ..."
        same request shape already failed     -> waits, with that explanation (free resources only shrink in a pass)
        place(snapshot, job.request)          -> Start (snapshot updated, so the next job sees it) or waits, explained

Backfill: a job that fits starts even when an earlier one does not, except that once the head of the queue has
waited `starvation_s`, jobs behind it that ask for GPUs wait too, so GPUs freed up reach it (small work without
GPUs still flows). Pure: snapshot + jobs + config + clock value in, a plan out; the daemon carries it out.

A long queue: jobs of one shape (the fields of the request that decide where it can go, plus its MPS owner) fit or
fail together within a pass, so a pass makes at most one failed placement attempt per shape, however many jobs wait;
the rest of that shape get the same words without a call. What is left per job is a few dictionary look-ups: each
job's queue key and shape are computed once in its life and kept in a `ShapeCache` the daemon holds across rounds
(keyed by the job object itself, which the store keeps unchanged until the job is written).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter

import numpy as np

from corral.jobs.model import Job
from corral.model.errors import InvalidRequest
from corral.model.resources import Allocation
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place, render
from corral.queue import queue_key

#: The MPS owner a job's one-GPU share carries ("" when shares are not tied to a user): part of its shape.
Owner = Callable[[Job], str]


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
    placements: int = 0  # calls to the engine this pass (starts + one per shape that failed)


@dataclass(frozen=True)
class _Entry:
    job: Job  # the very object the entry was made for: another object with this id is a changed job
    key: tuple[int, float, int, str]
    shape: int  # an index into ShapeCache.shapes, so a look-up hashes an int, not the request's fields
    wants_gpu: bool
    owner: str


class ShapeCache:
    """Each job's queue key and shape, computed once per job object and kept across passes.

    Safe against change: an entry is used only for the object it was made for (`is`), and a job the store writes is
    a new object. Entries of jobs that left the queue are dropped when the cache has grown to twice the queue.
    """

    def __init__(self) -> None:
        self.entries: dict[str, _Entry] = {}
        self.shapes: dict[Hashable, int] = {}  # shape -> its index

    def entry(self, job: Job, owner: Owner | None) -> _Entry:
        found = self.entries.get(job.id)
        if found is not None and found.job is job:
            return found
        request = job.spec.request
        who = owner(job) if owner is not None else ""
        shape = (request.placement_key(), who)
        index = self.shapes.setdefault(shape, len(self.shapes))
        made = _Entry(job, queue_key(job), index, request.wants_gpu, who)
        self.entries[job.id] = made
        return made

    def prune(self, keep: int) -> None:
        """Forget jobs that have left the queue once the cache holds more than twice `keep` of them."""
        if len(self.entries) > 2 * keep + 64:
            self.entries.clear()
        if len(self.shapes) > 4 * keep + 1024:
            self.shapes.clear()
            self.entries.clear()


def schedule(
    snapshot: ClusterSnapshot,
    waiting: Sequence[Job],
    config: PlacementConfig,
    now: float,
    rng: np.random.Generator | None = None,
    starvation_s: float = 300.0,
    owner: Owner | None = None,
    cache: ShapeCache | None = None,
    max_starts: int | None = None,
) -> Plan:
    """Decide which waiting jobs start now. Grants go into `snapshot` as they are decided.

    `owner`: the MPS owner of a job's share (see `Request.share_owner`), part of its shape; `cache`: the keys and
    shapes of earlier passes (a fresh one if None). With `max_starts`, the pass places nothing more once that many
    are decided: the rest wait for the next pass, unplaced, keeping the reason they had (a job that has none yet is
    told it waits for the next round), so a burst does not rewrite every queued job's reason."""
    cache = cache if cache is not None else ShapeCache()
    known = cache.entries.get  # inlined look-up: this line runs once per queued job every round
    entries = [e if (e := known(job.id)) is not None and e.job is job else cache.entry(job, owner) for job in waiting]
    cache.prune(len(entries))
    entries.sort(key=attrgetter("key"))
    starts: list[Start] = []
    reasons: dict[str, str] = {}
    unresolvable: set[str] = set()
    failed: dict[int, tuple[str, bool]] = {}
    placements = 0
    head_starving = False
    generator = rng if rng is not None else np.random.default_rng(0)
    shape_failed = failed.get
    for position, entry in enumerate(entries):
        job = entry.job
        if max_starts is not None and len(starts) >= max_starts:
            if not job.reason:
                reasons[job.id] = f"waiting for the next round: at most {max_starts} jobs start in one round"
            continue
        if job.not_before > now:
            reasons[job.id] = f"retrying after back-off in {job.not_before - now:.0f} s"
            continue
        if head_starving and entry.wants_gpu:
            reasons[job.id] = "waiting behind a job that has waited too long for GPUs"
            continue
        same = shape_failed(entry.shape)
        if same is not None:
            reasons[job.id] = same[0]
            if same[1]:
                unresolvable.add(job.id)
            continue
        request = replace(job.spec.request, id=job.id, share_owner=entry.owner or job.spec.request.share_owner)
        placements += 1
        try:
            decision = place(snapshot, request, config, generator)
        except InvalidRequest as exc:  # e.g. a GPU model this machine no longer has: can never start
            failed[entry.shape] = (str(exc), True)
            reasons[job.id] = str(exc)
            unresolvable.add(job.id)
            continue
        if decision.allocation is not None:
            snapshot.allocate(decision.allocation)
            starts.append(Start(job.id, decision.allocation, decision.explanation.notes))
            continue
        text = render(decision.explanation)
        never = all(decision.unresolvable(i) for i in range(len(snapshot)))
        failed[entry.shape] = (text, never)
        reasons[job.id] = text
        if never:
            unresolvable.add(job.id)
        elif position == 0 and now - job.submitted_at >= starvation_s and entry.wants_gpu:
            head_starving = True
    return Plan(starts, reasons, unresolvable, placements)
