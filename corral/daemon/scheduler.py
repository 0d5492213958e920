"""One scheduling pass: waiting jobs in queue order, each placed by the engine on what is free now.

    for job in queue_order(waiting):
        not yet due (retry back-off)          -> waits, "retrying after ..."
        same request shape already failed     -> waits, with that explanation (free resources only shrink in a pass)
        place(snapshot, job.request)          -> Start (snapshot updated, so the next job sees it) or waits, explained

Backfill: a job that fits starts even when an earlier one does not, except that once the head of the queue has
waited `starvation_s`, jobs behind it that ask for GPUs wait too, so GPUs freed up reach it (small work without
GPUs still flows). Pure: snapshot + jobs + config + clock value in, a plan out; the daemon carries it out.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from corral.jobs.model import Job
from corral.model.errors import InvalidRequest
from corral.model.resources import Allocation
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place, render
from corral.queue import queue_order


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


def schedule(
    snapshot: ClusterSnapshot,
    waiting: Sequence[Job],
    config: PlacementConfig,
    now: float,
    rng: np.random.Generator | None = None,
    starvation_s: float = 300.0,
    max_starts: int | None = None,
) -> Plan:
    """Decide which waiting jobs start now. Grants go into `snapshot` as they are decided. With `max_starts`, the
    pass places nothing more once that many are decided: the rest wait for the next pass, unplaced."""
    plan = Plan()
    failed: dict[Hashable, tuple[str, bool]] = {}
    head_starving = False
    generator = rng if rng is not None else np.random.default_rng(0)
    for position, job in enumerate(queue_order(waiting)):
        if max_starts is not None and len(plan.starts) >= max_starts:
            plan.waiting[job.id] = f"waiting for the next round: at most {max_starts} jobs start in one round"
            continue
        if job.not_before > now:
            plan.waiting[job.id] = f"retrying after back-off in {job.not_before - now:.0f} s"
            continue
        request = replace(job.spec.request, id=job.id)
        if head_starving and request.wants_gpu:
            plan.waiting[job.id] = "waiting behind a job that has waited too long for GPUs"
            continue
        shape = request.placement_key()
        if shape in failed:
            text, never = failed[shape]
            plan.waiting[job.id] = text
            if never:
                plan.unresolvable.add(job.id)
            continue
        try:
            decision = place(snapshot, request, config, generator)
        except InvalidRequest as exc:  # e.g. a GPU model this machine no longer has: can never start
            failed[shape] = (str(exc), True)
            plan.waiting[job.id] = str(exc)
            plan.unresolvable.add(job.id)
            continue
        if decision.allocation is not None:
            snapshot.allocate(decision.allocation)
            plan.starts.append(Start(job.id, decision.allocation, decision.explanation.notes))
            continue
        text = render(decision.explanation)
        never = all(decision.unresolvable(i) for i in range(len(snapshot)))
        failed[shape] = (text, never)
        plan.waiting[job.id] = text
        if never:
            plan.unresolvable.add(job.id)
        elif position == 0 and now - job.submitted_at >= starvation_s and request.wants_gpu:
            head_starving = True
    return plan
