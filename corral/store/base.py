"""The job store: where `corral serve` keeps every job, so that a restart (or a kill -9) loses nothing acknowledged.

    add(spec) ---> Job "1" QUEUED v1
    transition("1", STARTING, expect={QUEUED}, gpus=...) ---> Job "1" STARTING v2   (compare-and-set on the state)
    update("1", expect_version=2, pid=4242) ---> Job "1" STARTING v3                  (compare-and-set on the version)

Every write is durable before it returns and bumps the job's `version`. Two writers racing on one job cannot both
win: `transition` checks the current state against `TRANSITIONS` (and `expect`) inside the same atomic step that
writes, and `update(expect_version=...)` checks the version the same way.

Errors a caller can act on are `InvalidRequest`s (`JobNotFound`, `StaleJob`, `InvalidTransition`); a storage failure
(disk full, unreadable file, a file that is not a job store) is a `StoreError`, never a raw `sqlite3` exception.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

from corral.jobs.model import FINAL_STATES, TRANSITIONS, InvalidTransition, Job, JobSpec, JobState, Preempted
from corral.jobs.usage import Usage
from corral.model.errors import CorralError, InvalidRequest
from corral.model.resources import GpuGrant
from corral.store.acct import AcctColumns, AcctQuery, AcctRecord, SummaryRow


class JobNotFound(InvalidRequest):
    """No job has this id."""

    def __init__(self, job_id: str) -> None:
        super().__init__("job", f"no job {job_id}")
        self.job_id = job_id


class StaleJob(InvalidRequest):
    """An `update(expect_version=...)` lost a race: someone else wrote the job since it was read."""

    def __init__(self, job_id: str, expected: int, actual: int) -> None:
        super().__init__(
            "version", f"job {job_id} changed since it was read (version {actual}, expected {expected}); read it again"
        )
        self.job_id = job_id
        self.expected = expected
        self.actual = actual


class StaleDocument(InvalidRequest):
    """A `put_doc`/`delete_doc` with `expect_version` lost a race (or the document is not there)."""

    def __init__(self, kind: str, key: str, expected: int, actual: int) -> None:
        super().__init__(
            "version",
            f"{kind} {key!r} changed since it was read (version {actual}, expected {expected}); read it again",
        )
        self.expected = expected
        self.actual = actual


#: How long an idempotency key names its job: a retry within this time (of the job's submission) gets that job back;
#: later, the key is free again (the rule of Stripe's API, which the IETF Idempotency-Key draft follows).
IDEMPOTENCY_TTL_S = 24 * 3600.0


class KeyInUse(InvalidRequest):
    """`add(..., idempotency_key=k)`: the user already stored `job` under `k` (within IDEMPOTENCY_TTL_S); nothing new
    was stored. The caller compares the specs: the same request gets `job` back, another one is a conflict."""

    def __init__(self, key: str, job: Job) -> None:
        super().__init__("idempotency_key", f"the key {key!r} was already used for job {job.id}")
        self.key = key
        self.job = job


class StoreError(CorralError):
    """The store could not be read or written (an I/O error, a corrupt or foreign file, a closed store)."""


@dataclass(frozen=True)
class JobQuery:
    """Which jobs `Store.query` returns: every filter given must hold (None: no filter), in id order, one page.

    Paging is by cursor, not offset, so a page never repeats or skips a job when others are added meanwhile: pass the
    id of the last job of one page as `after` to get the next (ids that come after it in the chosen order).
    """

    states: Collection[JobState] | None = None  # held as a frozenset
    user: str | None = None  # the submitter's user name
    uid: int | None = None  # the submitter's uid (what the API authorises by)
    name: str | None = None  # the job's name, exactly
    since: float | None = None  # submitted at or after this time (seconds since the epoch)
    #: Jobs not yet ended, or that ended at or after this time (`corral ps` hides what ended long ago by default). A
    #: job cancelled while queued has no finished_at: its submission time stands in.
    ended_after: float | None = None
    after: str | None = None  # the cursor: only jobs after this id in the chosen order
    limit: int | None = None  # at most this many jobs (None: all)
    newest_first: bool = False  # by id descending (newest first) instead of ascending

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"a query's limit cannot be negative, got {self.limit}")
        if self.states is not None:
            object.__setattr__(self, "states", frozenset(JobState(s) for s in self.states))

    def matches(self, job: Job) -> bool:
        """The filters and the cursor (not the limit) for one job: the reference the SQL store must agree with."""
        if self.states is not None and job.state not in self.states:
            return False
        if self.user is not None and job.spec.user != self.user:
            return False
        if self.uid is not None and job.spec.uid != self.uid:
            return False
        if self.name is not None and job.spec.name != self.name:
            return False
        if self.since is not None and job.submitted_at < self.since:
            return False
        if self.ended_after is not None and job.state in FINAL_STATES:
            ended = job.finished_at if job.finished_at is not None else job.submitted_at
            if ended < self.ended_after:
                return False
        if self.after is not None:
            cursor = canonical_id(self.after)
            if cursor is None:
                return False
            return int(job.id) < cursor if self.newest_first else int(job.id) > cursor
        return True


@runtime_checkable
class Store(Protocol):
    """The jobs of one `corral serve`. Safe to share between threads; every write is atomic and durable."""

    def add(self, spec: JobSpec, now: float, *, idempotency_key: str | None = None) -> Job:
        """Store a new QUEUED job (version 1) submitted at `now`; ids are "1", "2", ..., never reused.

        A spec that `check_admissible` refuses (NUL, lone surrogates, oversized commands...) raises InvalidRequest
        and is never stored. `idempotency_key`: recorded with the job in the same atomic write; if `spec.uid`
        stored a job under the same key less than IDEMPOTENCY_TTL_S before `now`, nothing is stored and
        `KeyInUse` carries that job."""
        ...

    def add_array(self, spec: JobSpec, now: float, *, idempotency_key: str | None = None) -> builtins.list[Job]:
        """Store a job array (`spec.array` set; its job id "" and any task): one QUEUED job per task, with consecutive
        ids in task order, in one atomic write; the first id is the array's (`ArrayTask.job_id` of every task). The
        spec is stored once, each task in a few bytes (corral.jobs.array). `idempotency_key` as for `add`, naming
        the first task (`KeyInUse` carries it)."""
        ...

    def by_idempotency_key(self, uid: int, key: str, now: float) -> Job | None:
        """The job `uid` stored under `key` less than IDEMPOTENCY_TTL_S before `now`, or None."""
        ...

    def get(self, job_id: str) -> Job | None:
        """The job, or None if there is none with this id."""
        ...

    def list(self, states: Collection[JobState] | None = None, user: str | None = None) -> builtins.list[Job]:
        """Jobs in any of `states` (all if None) submitted by `user` (anyone if None), by id in numeric order."""
        ...

    def query(self, query: JobQuery) -> builtins.list[Job]:
        """One page of the jobs that match `query`, by id (ascending, or descending with `newest_first`).

        Cost follows the page and the jobs the filters select, not the whole table (the SQL store uses its indexes).
        An `after` that no job can have (not a job id) matches nothing."""
        ...

    def transition(
        self, job_id: str, to: JobState, *, expect: Collection[JobState] | None = None, **fields: Any
    ) -> Job:
        """Move a job to state `to`, setting `fields` in the same atomic step; returns the new job.

        Raises `JobNotFound` for an unknown id, `InvalidTransition` if `TRANSITIONS` does not allow the move from the
        current state or the current state is not in `expect`, `ValueError` for a field that cannot be set.
        """
        ...

    def transition_many(
        self, job_ids: Collection[str], to: JobState, *, expect: Collection[JobState] | None = None, **fields: Any
    ) -> builtins.list[Job]:
        """`transition` of many jobs in one atomic, durable write (bulk cancel: one commit, not one per job).

        Moves every job among `job_ids` that may move now (as `transition` would allow), setting `fields` on each;
        the others (unknown ids, jobs in another state) are left as they are, since a bulk action races with the
        scheduler by nature. Returns the moved jobs, by id. `ValueError`/`TypeError` for a field that cannot be set."""
        ...

    def update(self, job_id: str, *, expect_version: int | None = None, **fields: Any) -> Job:
        """Set `fields` without changing the state; returns the new job.

        Raises `JobNotFound` for an unknown id, `StaleJob` if `expect_version` is given and the stored version
        differs, `ValueError` for a field that cannot be set.
        """
        ...

    def update_many(self, changes: Mapping[str, Mapping[str, Any]]) -> builtins.list[Job]:
        """`update` of many jobs (job id -> fields) in one atomic, durable write: all of them or, when any id is
        unknown or any field cannot be set, none. Returns the new jobs in the order given."""
        ...

    # -------------------------------------------------------------------------------------------- accounting
    # Jobs that ended, one record each (corral.store.acct): written in the same atomic step as the job's end.

    def acct(self, query: AcctQuery) -> builtins.list[AcctRecord]:
        """One page of the records that match `query`, by end time then id. Cost follows the page and the records the
        filters select (the SQL store reads them from indexes by end time), not the whole history."""
        ...

    def acct_columns(self, query: AcctQuery) -> AcctColumns:
        """`acct`'s page column by column (the same records in the same order): no object per record."""
        ...

    def acct_summary(self, query: AcctQuery) -> builtins.list[SummaryRow]:
        """The records that match `query` (its cursor and limit ignored) summed per user and queue, by user, queue."""
        ...

    def prune_ended(self, before: float, limit: int) -> int:
        """Delete at most `limit` of the jobs that ended before `before` (oldest first), records and all, in one short
        write; returns how many. Call again until it returns less than `limit` (corral.store.retention)."""
        ...

    def close(self) -> None:
        """Release the store; further calls raise `StoreError`. Closing twice is harmless."""
        ...

    # -------------------------------------------------------------------------------------------- documents
    # Named JSON documents beside the jobs (job definitions, schedules' cursors, services...): durable like a job
    # write, with a version for compare-and-set. `kind` groups them ("metronome.job"), `key` names one.

    def put_doc(self, kind: str, key: str, body: Mapping[str, Any], *, expect_version: int | None = None) -> int:
        """Store `body` (JSON-able) under (kind, key); returns its new version (1 for a new document).

        `expect_version`: 0 = it must not exist yet, n = it must be at version n; else `StaleDocument`."""
        ...

    def get_doc(self, kind: str, key: str) -> tuple[dict[str, Any], int] | None:
        """(body, version), or None."""
        ...

    def list_docs(self, kind: str) -> builtins.list[tuple[str, dict[str, Any], int]]:
        """Every document of a kind as (key, body, version), by key."""
        ...

    def delete_doc(self, kind: str, key: str, *, expect_version: int | None = None) -> bool:
        """Delete it; False if there was none. `expect_version` as for `put_doc`."""
        ...


# ------------------------------------------------------------------------------------- shared by the implementations
#: Fields a write may set, with the types each accepts (None allowed where the field is optional).
_INT = (int,)
_FLOAT = (int, float)
FIELD_TYPES: Mapping[str, tuple[tuple[type, ...], bool]] = {
    "attempts": (_INT, False),
    "not_before": (_FLOAT, False),
    "started_at": (_FLOAT, True),
    "finished_at": (_FLOAT, True),
    "exit_code": (_INT, True),
    "pid": (_INT, True),
    "pid_start_time": (_INT, True),
    "gpus": ((tuple, builtins.list), False),
    "gpu_uuids": ((tuple, builtins.list), False),
    "reason": ((str,), False),
    "preempted": ((Preempted,), True),
    "usage": ((Usage,), True),  # its GPUs' use, stored with its end (corral acct)
    # a waiting job's hold and updates (corral.daemon.core.Daemon.hold/update; the user and uid never change)
    "spec": ((JobSpec,), False),
}
#: Fields no write may set: `state` only through `transition(to=...)`, the rest never change after `add`.
FIXED_FIELDS = frozenset({"id", "version", "submitted_at", "state"})

_unknown = {f.name for f in dataclasses.fields(Job)} ^ (set(FIELD_TYPES) | FIXED_FIELDS)
if _unknown:  # pragma: no cover - catches a Job field added without teaching the stores about it
    raise RuntimeError(f"corral.store does not know how to store Job fields {sorted(_unknown)}")


def check_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the fields of a write and normalise them, so both stores hold (and return) the same values.

    Unknown or fixed names raise ValueError; a value of the wrong type raises TypeError (both are bugs of the
    caller, not requests a user could correct).
    """
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if name not in FIELD_TYPES:
            if name == "state":
                raise ValueError("the state changes only through transition(job_id, to)")
            if name in FIXED_FIELDS:
                raise ValueError(f"job field {name!r} is set by the store and cannot be changed")
            known = ", ".join(sorted(FIELD_TYPES))
            raise ValueError(f"unknown job field {name!r}; a write may set {known}")
        types, nullable = FIELD_TYPES[name]
        if value is None:
            if not nullable:
                raise TypeError(f"job field {name!r} cannot be None")
            out[name] = None
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            raise TypeError(f"job field {name!r} cannot be {value!r}")
        value = cast(Any, value)  # isinstance with a tuple of types narrows to `object`
        if name == "gpus":
            grants = tuple(value)
            if not all(isinstance(g, GpuGrant) for g in grants):
                raise TypeError(f"job field 'gpus' must hold GpuGrant values, got {value!r}")
            out[name] = grants
        elif name == "gpu_uuids":
            uuids = tuple(value)
            if not all(isinstance(u, str) for u in uuids):
                raise TypeError(f"job field 'gpu_uuids' must hold strings, got {value!r}")
            out[name] = uuids
        elif types is _FLOAT:
            number = float(value)
            if math.isnan(number):
                raise ValueError(f"job field {name!r} cannot be NaN")
            out[name] = number
        else:
            out[name] = value
    return out


def array_jobs(spec: JobSpec, first_id: int, now: float) -> builtins.list[Job]:
    """The new QUEUED jobs of the array `spec` whose first job id is `first_id`, one per task in task order. Each is a
    copy of the first with its id and task (a Job built field by field costs 15 us: 150 ms for 10,000 tasks)."""
    from corral.jobs.array import task_spec

    a = spec.array
    if a is None:
        raise ValueError("add_array needs a spec with an array")
    array_id = str(first_id)
    head = Job(array_id, task_spec(spec, array_id, a.spec.first), JobState.QUEUED, submitted_at=float(now), version=1)
    jobs = [head]
    fields = head.__dict__
    for i, task in enumerate(a.spec.tasks[1:], start=1):
        job = object.__new__(Job)
        job.__dict__.update(fields)
        object.__setattr__(job, "id", str(first_id + i))
        object.__setattr__(job, "spec", task_spec(spec, array_id, task))
        jobs.append(job)
    return jobs


def check_transition(job: Job, to: JobState, expect: Collection[JobState] | None) -> None:
    """Raise InvalidTransition unless `job` may move to `to` now."""
    if not may_transition(job, to, expect):
        raise InvalidTransition(job.id, job.state, to)


def may_transition(job: Job, to: JobState, expect: Collection[JobState] | None) -> bool:
    """Whether `job` may move to `to` now (TRANSITIONS allows it, and its state is in `expect` if given)."""
    return to in TRANSITIONS[job.state] and (expect is None or job.state in expect)


def canonical_id(job_id: str) -> int | None:
    """The row id of a job id like "17", or None for anything that no job can have ("017", "x", "-1", "")."""
    if not isinstance(job_id, str) or not job_id.isascii() or not job_id.isdigit() or len(job_id) > 18:
        return None
    number = int(job_id)
    return number if str(number) == job_id and number > 0 else None


def check_doc_version(kind: str, key: str, expect: int | None, actual: int) -> None:
    """Raise StaleDocument unless the document is at the expected version (0: absent); None expects nothing."""
    if expect is not None and expect != actual:
        raise StaleDocument(kind, key, expect, actual)


def check_doc(kind: str, key: str, body: Mapping[str, Any]) -> str:
    """The document as stored (canonical JSON); ValueError/TypeError for a kind, key or body that cannot be stored."""
    if not isinstance(kind, str) or not kind or len(kind) > 100:
        raise ValueError(f"a document kind is 1..100 characters, got {kind!r}")
    if not isinstance(key, str) or not key or len(key) > 1000:
        raise ValueError(f"a document key is 1..1000 characters, got {key!r}")
    if not isinstance(body, Mapping):
        raise TypeError(f"a document body is a mapping, got {type(body).__name__}")
    return json.dumps(body, sort_keys=True, allow_nan=False)
