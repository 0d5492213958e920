"""One round of tenancy, in one call: what a batch scheduler asks each round.

    plan_round(config, waiting, running, cluster, usage, now) -> RoundPlan
        queues   Tenancy.plan_queues: holdings measured from `running`, the order (priority, weighted DRF fair share
                 with decay, age) and the limits (guarantee, limit, borrow; a gang counted whole)
        held     a work that may not be preempted and whose queue has no guarantee left for it waits (NOT_PREEMPTIBLE)
        pass     round.schedule: in order, each placed on what is free; the head (the first GPU work that does not
                 fit) gets a reservation; work behind it starts only if it does not delay it (backfill); a gang all
                 or none
        preempt  the first work in order that still waits (due, placeable, not a gang member, allowed to start)
                 may preempt: preemption.choose (the fewest, then cheapest, borrowers past their minimum runtime),
                 or, when they are still protected, preemption.protected says from when
    -> RoundPlan(starts, preemptions, reservations, reasons, order)

Serve's round is this call (corral.daemon.core.Daemon.tick, its jobs converted by corral.daemon.scheduler.work_of);
sim fair's (corral.sim.fair.replay) runs the same pass and preemption planner in its own order;
tests/tenancy/test_three_faces.py gives one workload to all three and checks they decide alike. A batch scheduler
(next: `corral k8s scheduler`) maps each pending pod to a `Work` (namespace or queue label -> `queue`, PodGroup ->
`gang`, minMember -> `gang_size`), each bound pod to a `Running`, its nodes and their pods' grants to a
`ClusterView`, and carries the plan out.

Pure: no clock (`now` is given), no I/O; `cluster.snapshot` is not changed (the plan is made on a copy).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from corral.model.resources import MILLI_PER_GPU, Allocation
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig
from corral.tenancy.config import QueuesConfig
from corral.tenancy.fairshare import UsageLedger, amount
from corral.tenancy.model import Running, Work
from corral.tenancy.preemption import Rules, candidates, choose, protected
from corral.tenancy.queues import Tenancy
from corral.tenancy.quota import NOT_PREEMPTIBLE, free_of
from corral.tenancy.reservation import DEFAULT_TIME_LIMIT_S, Booker, Reservation, book
from corral.tenancy.round import ShapeCache, Start, same, schedule

T = TypeVar("T")


@dataclass(frozen=True)
class RoundConfig:
    """How a round decides: the placement engine's config and the queues file (None: no file, so priority then age
    and no limits; preemption by priority only)."""

    placement: PlacementConfig
    queues: QueuesConfig | None = None
    default_time_limit_s: float = DEFAULT_TIME_LIMIT_S  # how long work without a time limit is planned to run
    max_starts: int | None = None  # at most this many starts a round (the rest wait for the next)
    seed: int = 0  # the placement engine's draws (policies that draw: random)


@dataclass(frozen=True)
class ClusterView:
    """What is free now: a snapshot whose allocations are the running work's, each named by its `Running.id` (and
    whatever else the face holds back, e.g. memory of processes it did not start), and when each is expected to end
    (allocation id -> epoch seconds; one not named never ends) for the head's reservation."""

    snapshot: ClusterSnapshot
    ends: Mapping[str, float] = field(default_factory=dict)
    #: The snapshot is the face's own copy for this round: the round grants its starts in it without a copy of its own
    #: (a cluster's 40,000 allocations a round)
    owned: bool = False


@dataclass(frozen=True)
class Preemption:
    """Victims to stop so that `preemptor` starts on `allocation` once they are gone."""

    preemptor: str
    victims: tuple[str, ...]
    allocation: Allocation
    why: Mapping[str, str]  # victim id -> "priority" | "guarantee"
    words: Mapping[str, str]  # victim id -> the reason it keeps
    gpu_seconds: Mapping[str, float] = field(default_factory=dict)  # victim id -> the GPU time its stop loses


@dataclass(frozen=True)
class RoundPlan:
    starts: tuple[Start, ...]
    preemptions: tuple[Preemption, ...]
    reservations: tuple[Reservation, ...]  # the head's (one at most today)
    reasons: Mapping[str, str]  # why each work that waits does, in words
    order: tuple[str, ...]  # the ids offered, in queue order
    unresolvable: frozenset[str] = frozenset()  # works no node can ever hold
    unplaced: int = 0  # request shapes that could not be placed


def tenancy_for(config: RoundConfig, snapshot: ClusterSnapshot, usage: UsageLedger | None = None) -> Tenancy:
    """A `Tenancy` for one call of `plan_round` on `snapshot`'s nodes, its fair-share history `usage` (none: a fresh
    ledger). A face that keeps one across rounds (serve's `Queues`) passes it to `plan_round` instead."""
    present = snapshot.gpu_present
    memory = np.where(present, snapshot.gpu_mem_cap, 0)
    capacity = amount(
        int(present.sum()) * MILLI_PER_GPU, int(memory.sum()), int(snapshot.cpu_cap.sum()), int(snapshot.mem_cap.sum())
    )
    # A GPU's memory by its index, for a whole-GPU grant that names none (the largest at that index on any node).
    by_index = [int(x) for x in memory.max(axis=0)] if len(snapshot) else []
    queues = config.queues if config.queues is not None else QueuesConfig.single()
    t = Tenancy(
        queues,
        capacity,
        max(by_index, default=0),
        lambda i: by_index[i] if 0 <= i < len(by_index) else 0,
        active=config.queues is not None,
    )
    if usage is not None:
        t.ledger = usage
    return t


def plan_round(
    config: RoundConfig,
    waiting: Sequence[T],
    running: Sequence[Running],
    cluster: ClusterView,
    usage: Tenancy | UsageLedger | None,
    now: float,
    *,
    work_of: Callable[[T], Work] = same,  # type: ignore[assignment]
    cache: ShapeCache | None = None,
    rng: np.random.Generator | None = None,
    preempt: bool = True,
    rules: Rules | None = None,
    booker: Booker = book,
    prefilter: bool = False,
) -> RoundPlan:
    """One round (see the module). `waiting`: `Work`, or a face's own objects with `work_of` (once per object, kept
    in `cache` across rounds); `usage`: the face's `Tenancy` (kept across rounds), or only its fair-share history;
    `preempt` False: no preemption this round (one is still being carried out); `rules`: who may preempt whom, in
    place of the queues' (`Tenancy.preemption_rules`); `booker` and `prefilter` for a cluster's scale
    (round.schedule). With a `Tenancy`, its own configuration is the queues file (`config.queues` is not read)."""
    snapshot = cluster.snapshot if cluster.owned else cluster.snapshot.copy()
    tenancy = usage if isinstance(usage, Tenancy) else tenancy_for(config, snapshot, usage)
    cache = cache if cache is not None else ShapeCache()
    works = cache.works(waiting, work_of)  # each converted once per object (the cache keeps it)
    by_id = {w.id: w for w in works}
    queues = tenancy.plan_queues(
        {w.id: w.queue for w in works}, running, free_of(snapshot), now, config.default_time_limit_s
    )
    rules = rules if rules is not None else tenancy.preemption_rules()
    # (without a `may_borrow` rule, a long queue is not walked for it)
    held = set() if rules.borrows_freely else {w.id for w in works if not w.preemptible and not rules.may_borrow(w)}
    offered = [item for item, w in zip(waiting, works, strict=True) if w.id not in held] if held else waiting
    plan = schedule(
        snapshot, offered, config.placement, now, rng if rng is not None else np.random.default_rng(config.seed),
        work_of, cache, config.max_starts, cluster.ends, config.default_time_limit_s, queues, booker=booker,
        prefilter=prefilter,
    )  # fmt: skip
    reasons = dict(plan.waiting)
    for i in held:
        reasons[i] = NOT_PREEMPTIBLE
    preemptions: list[Preemption] = []
    if preempt and (config.max_starts is None or len(plan.starts) < config.max_starts):
        started = {s.job_id for s in plan.starts}
        first = next((i for i in plan.order if i not in started), None)  # a few steps, not a walk of the queue
        head = None if first is None else by_id[first]
        if (
            head is not None
            and head.not_before <= now
            and head.id not in plan.unresolvable
            and head.id in reasons
            and not head.gang  # one member's room is not the gang's: a gang does not preempt (yet)
            and (head.preemptible or rules.may_borrow(head))
        ):
            # (a job being stopped is never a candidate; found once, for choose and then protected)
            found = candidates(snapshot, head, running, now, rules)
            choice = choose(snapshot, head, running, config.placement, now, rules, found=found)
            if choice is not None:
                ids = tuple(v.job.id for v in choice.victims)
                why = {v.job.id: v.why for v in choice.victims}
                lost = {v.job.id: v.gpu_seconds for v in choice.victims}
                preemptions.append(Preemption(head.id, ids, choice.allocation, why, choice.words, lost))
            else:
                later = protected(snapshot, head, running, config.placement, now, rules, found)
                if later is not None:
                    reasons[head.id] += f"; {later.text()}"
    reservation = () if plan.reservation is None else (plan.reservation,)
    return RoundPlan(
        tuple(plan.starts), tuple(preemptions), reservation, reasons, tuple(plan.order),
        frozenset(plan.unresolvable), plan.unplaced,
    )  # fmt: skip
