"""Preemption: which running jobs a waiting job may stop, and which of them it stops (pure; the daemon carries it out).

    the preemptor = the first job in queue order that waits (due, not unresolvable), once no preemption is pending
    candidates    = running jobs that are preemptible, not already being stopped, that `Rules.borrowing` says hold
                    more than their queue's guarantee, and that the preemptor outranks (`Rules.outranks`: a strictly
                    higher priority class) or may reclaim from (`Rules.below_guarantee`: its queue is below its own),
                    and that have run their minimum runtime since they (re)started (`Rules.min_runtime`, per queue,
                    5 minutes by default): a victim loses at most one run per minimum runtime, however often
                    higher-priority jobs come and go; one still protected is named in the preemptor's reason with the
                    time it may be preempted (`protected`)
    all of them released on a copy of the snapshot, and the preemptor still does not fit  -> no preemption at all
    otherwise, for k = 1, 2, ...: every k candidates released on a copy, place(preemptor) on it; the first k with a
                    fit wins, and among its sets the one losing the least run time (GPU-seconds, then seconds)
                    (past a budget of placements, the whole set pared down greedily, the costliest first)
    -> Choice: the victims, the grant the preemptor gets on what they free, and why (the words each victim keeps)

Shares count exactly: a victim's release gives back exactly its grant on its GPU (ClusterSnapshot.release), so a
0.5-GPU share frees half a GPU and nothing more. The freed resources are the preemptor's: during the grace period
the victims' expected ends are their kill deadlines, so the head's reservation (corral.tenancy.reservation) holds
them and backfill does not take them; the preemptor is first in queue order when they come free.

The seam for queues (docs/preemption.md): `Rules` holds three predicates. With no queues nothing is guaranteed, so
every running job "borrows", no queue is below its guarantee, and any job may borrow: a job of strictly higher
priority may preempt preemptible jobs of lower priority, and that is all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from corral.jobs.model import Job, JobState
from corral.model.resources import Allocation, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.tenancy.gang import place_gang
from corral.tenancy.round import clock_text

#: The reason a running job carries from its SIGTERM to its exit: its exit then sends it back to the queue.
PREEMPTING = "being preempted: "
#: Default grace between SIGTERM and SIGKILL (`corral serve --preempt-grace`).
DEFAULT_GRACE_S = 30.0
#: Placements tried per search before the greedy fallback: one machine has few running jobs, so the exhaustive
#: search is usually far below it; the bound keeps a round cheap when many small shares run.
SEARCH_BUDGET = 64

#: A predicate over a job. See `Rules`.
JobRule = Callable[[Job], bool]


def _always(_: Job) -> bool:
    return True


def _never(_: Job) -> bool:
    return False


def _no_min_runtime(_: Job) -> float:
    return 0.0


def span_text(seconds: float) -> str:
    """A minimum runtime as a person writes it: 300 -> "5m", 90 -> "1m30s", 3600 -> "1h", 0 -> "0s"."""
    s = round(seconds)
    parts = [f"{s // 3600}h" if s >= 3600 else "", f"{s % 3600 // 60}m" if s % 3600 >= 60 else "",
             f"{s % 60}s" if s % 60 or not s else ""]  # fmt: skip
    return "".join(parts)


def higher_priority(preemptor: Job, victim: Job) -> bool:
    """The priority-class rule: a strictly higher `priority` (equal priorities never preempt each other)."""
    return preemptor.spec.request.priority > victim.spec.request.priority


@dataclass(frozen=True)
class Rules:
    """Who may preempt whom. The defaults are the rules without queues; branch `queues` supplies the real ones.

    `borrowing(victim)`: it holds more than its queue's guarantee (only such jobs may be preempted).
    `below_guarantee(preemptor)`: its queue holds less than its guarantee (it may reclaim from any borrower).
    `outranks(preemptor, victim)`: a higher priority class.
    `may_borrow(job)`: a non-preemptible job may start now (without queues: always; with them: only within its
    queue's guarantee, the price of not being preemptible).
    `min_runtime(victim)`: seconds it runs after it (re)started before it may be preempted (the daemon's: its queue's,
    `corral.daemon.queues.Queues.preemption_rules`; here none)."""

    borrowing: JobRule = _always
    below_guarantee: JobRule = _never
    outranks: Callable[[Job, Job], bool] = higher_priority
    may_borrow: JobRule = _always
    min_runtime: Callable[[Job], float] = _no_min_runtime

    def protected_until(self, victim: Job) -> float:
        """Until when `victim` may not be preempted: its (re)start plus its minimum runtime (-inf: not protected)."""
        if victim.started_at is None:
            return -math.inf
        return victim.started_at + self.min_runtime(victim)

    @property
    def borrows_freely(self) -> bool:
        """No `may_borrow` rule (no queues): every job may start, preemptible or not."""
        return self.may_borrow is _always

    def why(self, preemptor: Job, victim: Job) -> str | None:
        """Why `preemptor` may preempt `victim` ("priority" or "guarantee"), None when it may not."""
        if not victim.spec.preemptible or victim.state is not JobState.RUNNING or victim.reason.startswith(PREEMPTING):
            return None
        if not self.borrowing(victim):
            return None
        if self.outranks(preemptor, victim):
            return "priority"
        if self.below_guarantee(preemptor):
            return "guarantee"
        return None


@dataclass(frozen=True)
class Victim:
    job: Job
    why: str  # "priority" | "guarantee"
    seconds: float  # run time lost: now - started_at
    gpu_seconds: float  # the same, times the GPUs it holds (shares as fractions)
    min_runtime_s: float = 0.0  # what it had to run first (Rules.min_runtime), said in its words


@dataclass(frozen=True)
class Choice:
    preemptor: Job
    victims: tuple[Victim, ...]
    allocation: Allocation  # where the preemptor fits once the victims are gone
    placements: int = 0  # engine calls the search made
    words: dict[str, str] = field(default_factory=dict)  # victim id -> its preemption reason

    @property
    def gpu_seconds(self) -> float:
        return sum(v.gpu_seconds for v in self.victims)


def cost(job: Job, now: float) -> tuple[float, float]:
    """(GPU-seconds, seconds) of run time lost if `job` is stopped now."""
    seconds = max(0.0, now - (job.started_at if job.started_at is not None else now))
    gpus = sum(g.milli for g in job.gpus) / 1000
    return seconds * gpus, seconds


def choose(
    snapshot: ClusterSnapshot,
    preemptor: Job,
    request: Request,
    running: Sequence[Job],
    config: PlacementConfig,
    now: float,
    rules: Rules | None = None,
    budget: int = SEARCH_BUDGET,
) -> Choice | None:
    """The fewest, then cheapest, running jobs whose release lets `request` (the preemptor's, its `id` the job's)
    be placed on `snapshot`; None when no eligible set does (then nothing is preempted). `snapshot` is not changed;
    each allocation in it is named by its job's id, as the daemon builds it."""
    rules = rules or Rules()
    victims = [v for v in candidates(snapshot, preemptor, running, now, rules) if rules.protected_until(v.job) <= now]
    if not victims:
        return None
    # Cheapest first: the search tries sets in this order, so within one size the first fits tend to be cheap.
    victims.sort(key=lambda v: (v.gpu_seconds, v.seconds, -int(v.job.id) if v.job.id.isdigit() else 0))
    calls = 0

    def fits(chosen: Sequence[Victim]) -> Allocation | None:
        nonlocal calls
        calls += 1
        left = snapshot.copy()
        for v in chosen:
            left.release(v.job.id)
        # Its own seed: planning must not change the daemon's draws (as corral.tenancy.reservation).
        rng = np.random.default_rng(0)
        if preemptor.spec.instances > 1:  # a gang: all its instances must fit on what the victims leave
            return place_gang(left, request, preemptor.spec.instances, config, rng).allocation
        return place(left, request, config, rng).allocation

    if fits(victims) is None:
        return None  # never preempt for a job that then cannot start
    if fits(()) is not None:
        return None  # it fits as things are (e.g. something ended since the pass): nothing to stop
    best: tuple[tuple[float, float], tuple[Victim, ...], Allocation] | None = None
    for k in range(1, len(victims) + 1):
        for chosen in combinations(victims, k):
            if calls >= budget:
                break
            grant = fits(chosen)
            if grant is not None:
                price = (sum(v.gpu_seconds for v in chosen), sum(v.seconds for v in chosen))
                if best is None or price < best[0]:
                    best = (price, chosen, grant)
        if best is not None or calls >= budget:
            break
    if best is None:
        # Past the budget: pare the whole set down, dropping the costliest first while the preemptor still fits.
        kept = list(victims)
        for v in sorted(victims, key=lambda v: (v.gpu_seconds, v.seconds), reverse=True):
            trial = [x for x in kept if x is not v]
            if trial and fits(trial) is not None:
                kept = trial
        grant = fits(kept)
        assert grant is not None  # the whole set fit, and every step kept a fit
        best = ((0.0, 0.0), tuple(kept), grant)
    said = {v.job.id: words(preemptor, v, now) for v in best[1]}
    return Choice(preemptor, best[1], best[2], calls, said)


def candidates(
    snapshot: ClusterSnapshot, preemptor: Job, running: Sequence[Job], now: float, rules: Rules
) -> list[Victim]:
    """The running jobs `preemptor` may preempt by the rules, protected by their minimum runtime or not."""
    out: list[Victim] = []
    for job in running:
        why = rules.why(preemptor, job)
        if why is not None and job.id in snapshot.allocations:
            gpu_s, s = cost(job, now)
            out.append(Victim(job, why, s, gpu_s, rules.min_runtime(job)))
    return out


@dataclass(frozen=True)
class Protected:
    """Preemption would help, but not before `at`: the victims it would need are still in their minimum runtime."""

    at: float
    job_ids: tuple[str, ...]
    min_runtime_s: float

    def text(self) -> str:
        """Words for the preemptor's reason (a fixed time: the same every round until something changes)."""
        ids = ", ".join(self.job_ids)
        return (
            f"it may preempt job{'s' if len(self.job_ids) > 1 else ''} {ids} from {clock_text(self.at)}, when "
            f"{'they have' if len(self.job_ids) > 1 else 'it has'} run the minimum runtime of "
            f"{span_text(self.min_runtime_s)} (docs/preemption.md)"
        )


def protected(
    snapshot: ClusterSnapshot,
    preemptor: Job,
    request: Request,
    running: Sequence[Job],
    config: PlacementConfig,
    now: float,
    rules: Rules,
) -> Protected | None:
    """When `choose` found nothing: the earliest time preemption would let `request` fit, counting the candidates
    still in their minimum runtime as they come out of it (None: it would not help even then)."""
    found = candidates(snapshot, preemptor, running, now, rules)
    waiting = sorted(
        (v for v in found if rules.protected_until(v.job) > now), key=lambda v: rules.protected_until(v.job)
    )
    if not waiting:
        return None
    free = [v for v in found if rules.protected_until(v.job) <= now]
    for k in range(1, len(waiting) + 1):
        left = snapshot.copy()
        for v in free + waiting[:k]:
            left.release(v.job.id)
        rng = np.random.default_rng(0)  # as `choose`: planning keeps the daemon's draws
        if preemptor.spec.instances > 1:
            grant = place_gang(left, request, preemptor.spec.instances, config, rng).allocation
        else:
            grant = place(left, request, config, rng).allocation
        if grant is not None:
            chosen = waiting[:k]
            at = rules.protected_until(chosen[-1].job)
            return Protected(at, tuple(v.job.id for v in chosen), max(v.min_runtime_s for v in chosen))
    return None


def words(preemptor: Job, victim: Victim, now: float) -> str:
    """The reason a victim keeps: by whom, when, and why it was allowed."""
    p = preemptor.spec
    rule = (
        f"a higher priority than this job's {victim.job.spec.request.priority}"
        if victim.why == "priority"
        else "its queue was below its guarantee, and this job borrowed above its own queue's"
    )
    who = f"job {preemptor.id} (user {p.user}, priority {p.request.priority})"
    ran = (
        f" (it had run {span_text(victim.seconds)}, past its minimum runtime of {span_text(victim.min_runtime_s)})"
        if victim.min_runtime_s > 0
        else ""
    )
    return f"preempted by {who} at {clock_text(now)}: {rule}{ran}"
