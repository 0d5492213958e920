"""Accounting: one record per job that ended, as `corral acct` lists and sums them (docs/acct.md).

    Store.transition(.., to=<final state>) --same write--> acct record (SQLite: a row of `acct`, clustered by end
                                                           time; the memory store derives it from the job)
    Store.acct(AcctQuery)          -> [AcctRecord]  in end order, one page (cursor: end time and id)
    Store.acct_columns(AcctQuery)  -> AcctColumns   the same page column by column: a list per field, no object a
                                                    record (what `corral acct` reads 100,000 records as)
    Store.acct_summary(AcctQuery)  -> [SummaryRow]  per user and queue: jobs, GPU-hours, CPU-hours, mean utilisation
    Store.prune_ended(before, n)   -> how many of the oldest records (and their jobs) ended before `before` were
                                      deleted, at most n at a time (corral.store.retention)

A record is the job's last attempt (Slurm's sacct shows the same without --duplicates): a failed job that is retried
leaves the accounts while it waits and runs again, and comes back with its next end. A job cancelled before it
started has no end time of its own: its submission time stands in, and its elapsed time is 0.

GPU-hours are the elapsed time times the GPUs it held (a share counts its part: 300 milli for 2 hours is 0.6
GPU-hours); CPU-hours the elapsed time times the CPUs it asked for (each instance of a gang its own).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, fields

from corral.jobs.model import FINAL_STATES, Job, JobState
from corral.model.errors import InvalidRequest
from corral.model.times import MAX_TIME


@dataclass(frozen=True)
class AcctQuery:
    """Which records `Store.acct` and `Store.acct_summary` read: every filter given must hold (None: no filter)."""

    since: float | None = None  # ended at or after
    until: float | None = None  # ended before
    uid: int | None = None
    user: str | None = None
    states: Collection[JobState] | None = None  # final states only (held as a frozenset)
    queue: str | None = None
    after: tuple[float, int] | None = None  # the cursor: records after this (end time, job id)
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"a query's limit cannot be negative, got {self.limit}")
        if self.states is not None:
            object.__setattr__(self, "states", frozenset(JobState(s) for s in self.states))

    def matches(self, r: AcctRecord) -> bool:
        """The filters and the cursor for one record: the reference the SQL store must agree with."""
        if self.since is not None and r.ended_at < self.since:
            return False
        if self.until is not None and r.ended_at >= self.until:
            return False
        if self.uid is not None and r.uid != self.uid:
            return False
        if self.user is not None and r.user != self.user:
            return False
        if self.states is not None and JobState(r.state) not in self.states:
            return False
        if self.queue is not None and r.queue != self.queue:
            return False
        return self.after is None or (r.ended_at, int(r.id)) > self.after


@dataclass(frozen=True)
class AcctRecord:
    """A job that ended, as accounting sees it."""

    id: str
    name: str
    user: str
    uid: int
    queue: str
    state: str
    exit_code: int | None
    submitted_at: float
    started_at: float | None
    ended_at: float
    elapsed_s: float
    gpu_milli: int  # the GPUs it held, 1000 a whole one (never started: what it asked for)
    gpu_ids: tuple[int, ...]  # their indexes
    cpu_milli: int
    gpu_util_pct: float | None
    gpu_mem_peak_mib: int | None
    gpu_samples: int
    simulated: bool

    @property
    def gpu_hours(self) -> float:
        return self.elapsed_s * self.gpu_milli / 1000 / 3600

    @property
    def cpu_hours(self) -> float:
        return self.elapsed_s * self.cpu_milli / 1000 / 3600

    @property
    def cursor(self) -> str:
        return cursor_text(self.ended_at, int(self.id))


@dataclass(frozen=True)
class AcctColumns:
    """A page of records column by column: each list is one field of `AcctRecord`, in the page's order (so the
    records of a page of 10,000 cost a few list comprehensions, not 10,000 objects)."""

    id: list[str]
    name: list[str]
    user: list[str]
    uid: list[int]
    queue: list[str]
    state: list[str]
    exit_code: list[int | None]
    submitted_at: list[float]
    started_at: list[float | None]
    ended_at: list[float]
    elapsed_s: list[float]
    gpu_milli: list[int]
    gpu_ids: list[tuple[int, ...]]
    cpu_milli: list[int]
    gpu_util_pct: list[float | None]
    gpu_mem_peak_mib: list[int | None]
    gpu_samples: list[int]
    simulated: list[bool]

    def __len__(self) -> int:
        return len(self.id)

    @property
    def cursor(self) -> str:
        """The cursor after the page's last record (the page must not be empty)."""
        return cursor_text(self.ended_at[-1], int(self.id[-1]))

    @property
    def gpu_hours(self) -> list[float]:
        """Each record's `AcctRecord.gpu_hours`, computed the same way (so the same floats)."""
        return [e * g / 1000 / 3600 for e, g in zip(self.elapsed_s, self.gpu_milli, strict=True)]

    @property
    def cpu_hours(self) -> list[float]:
        return [e * c / 1000 / 3600 for e, c in zip(self.elapsed_s, self.cpu_milli, strict=True)]

    @classmethod
    def of(cls, records: Sequence[AcctRecord]) -> AcctColumns:
        """The columns of these records (the reference the SQL store's own reading agrees with)."""
        return cls(**{f.name: [getattr(r, f.name) for r in records] for f in fields(AcctRecord)})

    def records(self) -> list[AcctRecord]:
        """The page as records again."""
        columns = [getattr(self, f.name) for f in fields(AcctRecord)]
        return [AcctRecord(*values) for values in zip(*columns, strict=True)]


@dataclass(frozen=True)
class SummaryRow:
    """One user's jobs in one queue (`corral acct --summary`)."""

    user: str
    queue: str
    jobs: int
    elapsed_s: float
    gpu_hours: float
    cpu_hours: float
    gpu_util_pct: float | None  # mean over the GPU-hours that were sampled (None: none was)
    simulated: bool  # some of its figures come from simulated GPUs


def record_of(job: Job) -> AcctRecord:
    """The accounting record of a job in a final state."""
    if job.state not in FINAL_STATES:
        raise ValueError(f"job {job.id} is {job.state.value}: only a job that ended has an accounting record")
    spec, request = job.spec, job.spec.request
    ended = job.finished_at if job.finished_at is not None else job.submitted_at
    elapsed = 0.0 if job.started_at is None else max(0.0, ended - job.started_at)
    asked = request.gpu_count * request.gpu_milli * spec.instances
    gpu_milli = sum(g.milli for g in job.gpus) if job.gpus else asked
    usage = job.usage
    return AcctRecord(
        id=job.id,
        name=spec.name,
        user=spec.user,
        uid=spec.uid,
        queue=spec.queue,
        state=job.state.value,
        exit_code=job.exit_code,
        submitted_at=job.submitted_at,
        started_at=job.started_at,
        ended_at=ended,
        elapsed_s=elapsed,
        gpu_milli=gpu_milli,
        gpu_ids=tuple(g.index for g in job.gpus),
        cpu_milli=request.cpu_milli * spec.instances,
        gpu_util_pct=None if usage is None else usage.gpu_util_pct,
        gpu_mem_peak_mib=None if usage is None else usage.gpu_mem_peak_mib,
        gpu_samples=0 if usage is None else usage.samples,
        simulated=usage is not None and usage.simulated,
    )


def summarize(records: Iterable[AcctRecord]) -> list[SummaryRow]:
    """Per (user, queue), sorted by user then queue: the reference `SqliteStore.acct_summary` agrees with."""
    groups: dict[tuple[str, str], list[AcctRecord]] = {}
    for r in records:
        groups.setdefault((r.user, r.queue), []).append(r)
    out = []
    for (user, queue), rs in sorted(groups.items()):
        weight = sum(r.elapsed_s * r.gpu_milli for r in rs if r.gpu_util_pct is not None)
        util = sum(r.elapsed_s * r.gpu_milli * (r.gpu_util_pct or 0.0) for r in rs)
        out.append(
            SummaryRow(
                user=user,
                queue=queue,
                jobs=len(rs),
                elapsed_s=sum(r.elapsed_s for r in rs),
                gpu_hours=sum(r.elapsed_s * r.gpu_milli for r in rs) / 1000 / 3600,
                cpu_hours=sum(r.elapsed_s * r.cpu_milli for r in rs) / 1000 / 3600,
                gpu_util_pct=util / weight if weight > 0 else None,
                simulated=any(r.simulated for r in rs),
            )
        )
    return out


def cursor_text(ended_at: float, job_id: int) -> str:
    """A page's cursor as the API hands it out: "END:ID" (the end time exactly, as repr writes a float)."""
    return f"{ended_at!r}:{job_id}"


def parse_cursor(text: str) -> tuple[float, int]:
    """The (end time, job id) of a cursor from `cursor_text`; InvalidRequest("after") for anything else."""
    end, sep, job_id = text.partition(":")
    try:
        if not sep or len(text) > 64:
            raise ValueError
        value = (float(end), int(job_id))
        if not math.isfinite(value[0]) or value[1] < 0:
            raise ValueError
    except ValueError:
        raise InvalidRequest(
            "after", f"not a page cursor: {text[:64]!r} (pass X-Corral-Next-After as it came)"
        ) from None
    return value


def check_window(since: float | None, until: float | None) -> None:
    """InvalidRequest naming since or until: a time that is not a number of seconds from 1970 to 9999, or a window
    whose start is not before its end."""
    for field, value in (("since", since), ("until", until)):
        if value is not None and not (math.isfinite(value) and 0 <= value <= MAX_TIME):
            raise InvalidRequest(
                field, f"must be a time between 1970 and 9999 (seconds since the epoch, 0..{MAX_TIME:.0f}), got {value}"
            )
    if since is not None and until is not None and since >= until:
        raise InvalidRequest("since", f"must be before until ({since:.0f} is not before {until:.0f})")
