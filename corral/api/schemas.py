"""What goes over the wire: a submission in, a job out."""

from __future__ import annotations

from pydantic import BaseModel, Field

from corral.daemon.tokens import MAX_NAME, Token
from corral.jobs.model import Job


class SubmitIn(BaseModel):
    """A job to run. Resource fields read like the CLI flags of `corral submit`."""

    command: list[str] = Field(min_length=1)
    gpus: int | None = None
    gpu_fraction: float | None = None
    gpu_memory: str | None = None
    cpus: str = "1"
    memory: str = "1GiB"
    gpu_model: list[str] = Field(default_factory=list)
    priority: int = 0
    name: str = ""
    retries: int = 0
    time_limit: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str = "/"


class GpuOut(BaseModel):
    index: int
    uuid: str
    milli: int
    memory_mib: int


class JobOut(BaseModel):
    id: str
    name: str
    user: str
    state: str
    command: list[str]
    priority: int
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    exit_code: int | None
    attempts: int
    gpus: list[GpuOut]
    reason: str
    origin: str = ""  # "" for `corral submit`; else the definition that made it (e.g. a scheduled job's run)

    @classmethod
    def of(cls, job: Job) -> JobOut:
        uuids = list(job.gpu_uuids) + [""] * max(0, len(job.gpus) - len(job.gpu_uuids))
        return cls(
            id=job.id,
            name=job.spec.name,
            user=job.spec.user,
            state=job.state.value,
            command=list(job.spec.command),
            priority=job.spec.request.priority,
            submitted_at=job.submitted_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            exit_code=job.exit_code,
            attempts=job.attempts,
            gpus=[
                GpuOut(index=g.index, uuid=u, milli=g.milli, memory_mib=g.memory_mib)
                for g, u in zip(job.gpus, uuids, strict=False)
            ],
            reason=job.reason,
            origin=job.spec.origin,
        )


class CancelManyIn(BaseModel):
    """Which jobs to cancel: `ids`, or those in `state` and/or with `name` (all given must hold)."""

    ids: list[str] | None = Field(default=None, max_length=100_000)
    state: str | list[str] | None = None  # queued, running, ... (a list, or comma-separated)
    name: str | None = None
    user: str | None = None  # root: that user's jobs
    all: bool = False  # root: every user's jobs


class CancelManyOut(BaseModel):
    cancelled: list[str]  # were queued: cancelled now
    cancelling: list[str]  # were starting or running: signalled, cancelled when they exit
    ended: list[str]  # had already ended: left alone
    not_found: list[str]  # no such job (or not the caller's)


class ExplainOut(BaseModel):
    state: str
    reason: str


class TokenIn(BaseModel):
    name: str = Field(min_length=1, max_length=MAX_NAME)
    user: str | None = None  # root only: a token for another user


class TokenOut(BaseModel):
    id: str
    name: str
    user: str
    created_at: float
    token: str | None = None  # the secret: only in the answer that created it

    @classmethod
    def of(cls, token: Token, secret: str | None = None) -> TokenOut:
        return cls(id=token.id, name=token.name, user=token.user, created_at=token.created_at, token=secret)


class ErrorDetail(BaseModel):
    field: str
    message: str


class ErrorOut(BaseModel):
    """Every error: which field (or part of the request) was wrong, and the rule it broke."""

    detail: ErrorDetail
