"""What tenancy is asked about: waiting work and running work, as small frozen records any face can make.

    face              waiting -> Work                              running -> Running
    corral serve      a queued Job (JobSpec: queue, user, gang)    a STARTING/RUNNING Job and its grant
    corral sim fair   a FairJob not running                        a FairJob's run
    k8s scheduler     a pending pod: queue = its namespace's or    a bound pod; `stopping`: being evicted
                      its queue label's; gang = its PodGroup
                      (`gang_size` = minMember), one Work per pod

No face's own type reaches tenancy: the face converts at its edge (ARCHITECTURE.md rule 4), once per object it
keeps (serve keeps each job's Work while the job object is unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from corral.model.resources import GpuGrant, Request
from corral.tenancy.config import DEFAULT_QUEUE


@dataclass(frozen=True, slots=True)
class Work:
    """One waiting unit: a job, a pod, a gang member."""

    id: str
    request: Request  # one instance's ask (its priority); `placing` gives it this work's id and share owner
    queue: str = DEFAULT_QUEUE
    user: str = ""
    gid: int = -1  # the user's primary group (group limits and weights); -1: none known
    submitted_at: float = 0.0
    instances: int = 1  # one job of N instances placed together on one node (serve's gang: JobSpec.instances)
    gang: str = ""  # a gang of separate works (a PodGroup, a Marathon app with corral.gang): all start or none
    gang_size: int = 0  # how many members the gang needs before any starts (PodGroup minMember)
    time_limit_s: float | None = None  # how long it runs at most (None: the round's default, for planning only)
    preemptible: bool = True  # False: never a victim, and so it starts only within its queue's guarantee
    not_before: float = 0.0  # not due before this time (a retry's back-off)
    reason: str = ""  # what it was told last (a round that places nothing more keeps it)
    share_owner: str = ""  # the user its GPU share is tied to (MPS), "" for the request's own

    @property
    def placing(self) -> Request:
        """The request the engine places: its id this work's, its share owner this work's if set. Made only when
        placed (a face converts thousands of waiting objects a round; a copy of each request would cost that)."""
        r = self.request
        owner = self.share_owner or r.share_owner
        if r.id == self.id and r.share_owner == owner:
            return r
        return replace(r, id=self.id, share_owner=owner)

    @property
    def priority(self) -> int:
        return self.request.priority

    @property
    def whole_instances(self) -> int:
        """How many of its request it asks for in all, for quotas: a gang member counts its whole gang."""
        return max(1, self.gang_size) if self.gang else self.instances


@dataclass(frozen=True, slots=True)
class Running:
    """One running unit and what it was granted (the snapshot holds its allocation under `id`)."""

    id: str
    request: Request
    started_at: float | None  # None: not yet started (being launched)
    gpus: tuple[GpuGrant, ...] = ()  # its grants (every instance's)
    queue: str = DEFAULT_QUEUE
    user: str = ""
    gid: int = -1
    instances: int = 1
    preemptible: bool = True
    stopping: bool = False  # already being stopped (preempted, evicted, cancelled): no victim again

    @property
    def priority(self) -> int:
        return self.request.priority

    @property
    def gpu_milli(self) -> int:
        return sum(g.milli for g in self.gpus)
