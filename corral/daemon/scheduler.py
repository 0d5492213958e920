"""Serve's edge to tenancy: its jobs as tenancy's records, and the round's pass and preemption planner over jobs.

    a queued Job        -> Work      (work_of: its queue named, its request's id the job's, its MPS share owner)
    a STARTING/RUNNING Job -> Running (running_of: `stopping` once it is being preempted or is not yet running)
    schedule(jobs)      -> corral.tenancy.round.schedule, each job's Work made once per job object (ShapeCache)
    (corral.daemon.preemption: tenancy's preemption planner over jobs, victims named by the jobs they are)

Everything that decides is in corral.tenancy (docs/tenancy.md); this module only converts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from corral.jobs.model import Job, JobState
from corral.model.resources import Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig
from corral.tenancy.config import DEFAULT_QUEUE
from corral.tenancy.model import Running, Work
from corral.tenancy.reservation import DEFAULT_TIME_LIMIT_S
from corral.tenancy.round import Plan, RoundQueues, ShapeCache, Start, clock_text
from corral.tenancy.round import schedule as run_pass

#: The reason a running job carries from its SIGTERM to its exit: its exit then sends it back to the queue.
PREEMPTING = "being preempted: "

#: The MPS owner a job's one-GPU share carries ("" when shares are not tied to a user): part of its shape.
Owner = Callable[[Job], str]
#: A job's queue (serve's: its own, or the file's default queue).
QueueOf = Callable[[Job], str]


def own_queue(job: Job) -> str:
    return job.spec.queue or DEFAULT_QUEUE


def request_of(job: Job, owner: str = "") -> Request:
    """The placement request of a waiting job: its id the job's, its share tied to `owner` (its MPS owner) if given."""
    return replace(job.spec.request, id=job.id, share_owner=owner or job.spec.request.share_owner)


def work_of(job: Job, queue: str | None = None, owner: str = "") -> Work:
    """A queued job as tenancy sees it."""
    s = job.spec
    return Work(
        job.id, s.request, queue or s.queue or DEFAULT_QUEUE, s.user, s.gid, job.submitted_at, s.instances,
        s.gang_group, s.gang_size, s.time_limit_s, s.preemptible, job.not_before, job.reason, owner,
    )  # fmt: skip


def running_of(job: Job, queue: str | None = None) -> Running:
    """A job that holds resources as tenancy sees it: one being preempted, or not yet running, is no victim."""
    s = job.spec
    stopping = job.state is not JobState.RUNNING or job.reason.startswith(PREEMPTING)
    return Running(
        job.id, s.request, job.started_at, job.gpus, queue or s.queue or DEFAULT_QUEUE, s.user, s.gid, s.instances,
        s.preemptible, stopping,
    )  # fmt: skip


def schedule(
    snapshot: ClusterSnapshot,
    waiting: Sequence[Job],
    config: PlacementConfig,
    now: float,
    rng: np.random.Generator | None = None,
    owner: Owner | None = None,
    cache: ShapeCache | None = None,
    max_starts: int | None = None,
    ends: Mapping[str, float] | None = None,
    default_time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    queues: RoundQueues | None = None,
    queue_of: QueueOf = own_queue,
) -> Plan:
    """Tenancy's pass (corral.tenancy.round.schedule) over serve's queued jobs; `owner`: each job's MPS owner."""

    def convert(job: Job) -> Work:
        return work_of(job, queue_of(job), owner(job) if owner is not None else "")

    return run_pass(snapshot, waiting, config, now, rng, convert, cache, max_starts, ends, default_time_limit_s, queues)


__all__ = ["Plan", "ShapeCache", "Start", "clock_text"]
