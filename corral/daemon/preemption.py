"""Serve's preemption: tenancy's planner (corral.tenancy.preemption) over serve's jobs; the daemon carries it out.

choose(head, running jobs)    -> the victims, named by their jobs, the preemptor's grant, each victim's words
protected(head, running jobs) -> when preemption could help, once the victims' minimum runtime is over
PREEMPTING                    the reason prefix a victim carries from its SIGTERM to its exit
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from corral.daemon.scheduler import PREEMPTING, QueueOf, own_queue, running_of, work_of
from corral.jobs.model import Job
from corral.model.resources import Allocation, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig
from corral.tenancy import preemption
from corral.tenancy.preemption import SEARCH_BUDGET, Protected, Rules, span_text

#: Default grace between SIGTERM and SIGKILL (`corral serve --preempt-grace`).
DEFAULT_GRACE_S = 30.0


@dataclass(frozen=True)
class JobVictim:
    """A victim named by its job (what the daemon stops and records)."""

    job: Job
    why: str
    seconds: float
    gpu_seconds: float
    min_runtime_s: float = 0.0


@dataclass(frozen=True)
class JobChoice:
    preemptor: Job
    victims: tuple[JobVictim, ...]
    allocation: Allocation
    placements: int
    words: dict[str, str]

    @property
    def gpu_seconds(self) -> float:
        return sum(v.gpu_seconds for v in self.victims)


def choose(
    snapshot: ClusterSnapshot,
    preemptor: Job,
    request: Request,
    running: Sequence[Job],
    config: PlacementConfig,
    now: float,
    rules: Rules | None = None,
    budget: int = SEARCH_BUDGET,
    queue_of: QueueOf = own_queue,
) -> JobChoice | None:
    """Tenancy's preemption planner (corral.tenancy.preemption.choose) for `preemptor`, whose placement request is
    `request` (`request_of`), among serve's `running` jobs."""
    by_id = {j.id: j for j in running}
    work = replace(work_of(preemptor, queue_of(preemptor)), request=request)
    found = preemption.choose(snapshot, work, [running_of(j, queue_of(j)) for j in running], config, now, rules, budget)
    if found is None:
        return None
    victims = tuple(JobVictim(by_id[v.job.id], v.why, v.seconds, v.gpu_seconds, v.min_runtime_s) for v in found.victims)
    return JobChoice(preemptor, victims, found.allocation, found.placements, found.words)


def protected(
    snapshot: ClusterSnapshot,
    preemptor: Job,
    request: Request,
    running: Sequence[Job],
    config: PlacementConfig,
    now: float,
    rules: Rules,
    queue_of: QueueOf = own_queue,
) -> Protected | None:
    """Tenancy's `protected` (when preemption could help, once the victims' minimum runtime is over) over jobs."""
    work = replace(work_of(preemptor, queue_of(preemptor)), request=request)
    return preemption.protected(snapshot, work, [running_of(j, queue_of(j)) for j in running], config, now, rules)


__all__ = ["DEFAULT_GRACE_S", "PREEMPTING", "Rules", "span_text"]
