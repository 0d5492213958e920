"""Preemption: which running jobs a waiting job may stop, and which of them it stops (pure; the daemon carries it out).

    the preemptor = the first job in queue order that waits (due, not unresolvable), once no preemption is pending
    candidates    = running jobs that are preemptible, not already being stopped, that `Rules.borrowing` says hold
                    more than their queue's guarantee, and that the preemptor outranks (`Rules.outranks`: a strictly
                    higher priority class) or may reclaim from (`Rules.below_guarantee`: its queue is below its own)
    all of them released on a copy of the snapshot, and the preemptor still does not fit  -> no preemption at all
    otherwise, for k = 1, 2, ...: every k candidates released on a copy, place(preemptor) on it; the first k with a
                    fit wins, and among its sets the one losing the least run time (GPU-seconds, then seconds)
                    (past a budget of placements, the whole set pared down greedily, the costliest first)
    -> Choice: the victims, the grant the preemptor gets on what they free, and why (the words each victim keeps)

Shares count exactly: a victim's release gives back exactly its grant on its GPU (ClusterSnapshot.release), so a
0.5-GPU share frees half a GPU and nothing more. The freed resources are the preemptor's: during the grace period
the victims' expected ends are their kill deadlines, so the head's reservation (corral.daemon.reservation) holds
them and backfill does not take them; the preemptor is first in queue order when they come free.

The seam for queues (docs/preemption.md): `Rules` holds three predicates. With no queues nothing is guaranteed, so
every running job "borrows", no queue is below its guarantee, and any job may borrow: a job of strictly higher
priority may preempt preemptible jobs of lower priority, and that is all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from corral.daemon.gang import place_gang
from corral.daemon.scheduler import clock_text
from corral.jobs.model import Job, JobState
from corral.model.resources import Allocation, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place

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
    queue's guarantee, the price of not being preemptible)."""

    borrowing: JobRule = _always
    below_guarantee: JobRule = _never
    outranks: Callable[[Job, Job], bool] = higher_priority
    may_borrow: JobRule = _always

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
    victims: list[Victim] = []
    for job in running:
        why = rules.why(preemptor, job)
        if why is not None and job.id in snapshot.allocations:
            gpu_s, s = cost(job, now)
            victims.append(Victim(job, why, s, gpu_s))
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
        # Its own seed: planning must not change the daemon's draws (as corral.daemon.reservation).
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


def words(preemptor: Job, victim: Victim, now: float) -> str:
    """The reason a victim keeps: by whom, when, and why it was allowed."""
    p = preemptor.spec
    rule = (
        f"a higher priority than this job's {victim.job.spec.request.priority}"
        if victim.why == "priority"
        else "its queue was below its guarantee, and this job borrowed above its own queue's"
    )
    who = f"job {preemptor.id} (user {p.user}, priority {p.request.priority})"
    return f"preempted by {who} at {clock_text(now)}: {rule}"
