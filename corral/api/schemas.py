"""What goes over the wire: a submission in, a job out."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from corral.api.limits import clean
from corral.daemon.tokens import MAX_NAME, Token
from corral.jobs import array, dependency
from corral.jobs.batch import MAX_PATTERN, MAX_SCRIPT_BYTES
from corral.jobs.dependency import MAX_DEPENDENCY_TEXT
from corral.jobs.model import Job
from corral.model import limits
from corral.model.resources import MAX_PRIORITY, MAX_QUANTITY
from corral.model.units import MAX_QUANTITY_TEXT

#: An Idempotency-Key (header or field): printable ASCII, as the IETF draft's examples (a UUID fits).
IDEMPOTENCY_KEY = r"^[\x21-\x7e]{1,128}$"


class ScriptIn(BaseModel):
    """A batch script (docs/batch-scripts.md): its text, stored with the job and run from a private copy; the job's
    `command` is the script's name and arguments. `dialect`: "sbatch" when it had #SBATCH directives (arrays then
    also get Slurm's SLURM_ARRAY_* variables), else "corral"."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=2, max_length=MAX_SCRIPT_BYTES)  # characters here; UTF-8 bytes at admission
    dialect: Literal["corral", "sbatch"] = "corral"


class ScriptOut(BaseModel):
    """A job's batch script without its text (GET /v1/jobs/ID/script has the text)."""

    name: str
    dialect: str
    args: list[str]
    bytes: int


class SubmitIn(BaseModel):
    """A job to run. Resource fields read like the CLI flags of `corral submit`. Bounds: docs/limits.md. A field it
    does not know is refused (422, `unknown_field`): `"time_limit_s": 4` once gave a job no time limit at all."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    command: list[str] = Field(min_length=1, max_length=limits.MAX_ARGS)
    gpus: int | None = Field(default=None, ge=0, le=MAX_QUANTITY["gpu_count"])
    gpu_fraction: float | None = Field(default=None, gt=0, lt=1)
    gpu_memory: str | None = Field(default=None, max_length=MAX_QUANTITY_TEXT)
    cpus: str = Field(default="1", max_length=MAX_QUANTITY_TEXT)
    memory: str = Field(default="1GiB", max_length=MAX_QUANTITY_TEXT)
    gpu_model: list[str] = Field(default_factory=list, max_length=64)
    #: users: USER_PRIORITY; root: up to MAX_PRIORITY
    priority: int = Field(default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    name: str = Field(default="", max_length=limits.MAX_NAME)
    #: The queue (docs/queues.md); none: the default queue
    queue: str | None = Field(default=None, max_length=64)
    retries: int = Field(default=0, ge=0, le=100)
    time_limit: str | None = Field(default=None, max_length=MAX_QUANTITY_TEXT)
    env: dict[str, str] = Field(default_factory=dict, max_length=limits.MAX_ENV_VARS)
    cwd: str = Field(default="/", max_length=limits.MAX_PATH)
    #: The same job for the same key (the `Idempotency-Key` header does the same; the header wins)
    idempotency_key: str | None = Field(default=None, pattern=IDEMPOTENCY_KEY)
    #: false: never preempted (docs/preemption.md); with queues, it starts only within its queue's guarantee
    preemptible: bool = True
    #: A gang: `instances` processes, each with its own grant of the request, all started or none (needs `gang`)
    instances: int = Field(default=1, ge=1, le=64)
    gang: bool = False
    #: Jobs it waits for, in Slurm's words: "afterok:12:13,afterany:14,afternotok:15,after:16,singleton"
    #: (docs/dependencies.md); only jobs the caller may see
    dependency: str | None = Field(default=None, max_length=MAX_DEPENDENCY_TEXT)
    #: A dependency that can never be met (afterok on a job that failed) cancels the job instead of leaving it waiting
    kill_on_invalid_dep: bool = False
    #: A batch script: its text and dialect (the command is its name and arguments)
    script: ScriptIn | None = None
    #: Files for the job's output and stderr (patterns %j %A %a %u %x %%; relative to cwd), opened as the job's user;
    #: none: corral's own log. Output alone takes stderr too, as sbatch's --output does.
    output: str | None = Field(default=None, min_length=1, max_length=MAX_PATTERN)
    error: str | None = Field(default=None, min_length=1, max_length=MAX_PATTERN)
    #: A job array, in Slurm's words: "0-99", "1,3,5-7", "0-99:2", each with "%N" to run at most N tasks at once
    #: (docs/arrays.md): one job per task, the answer is the first (its id is the array's)
    array: str | None = Field(default=None, max_length=array.MAX_ARRAY_TEXT)


class GpuOut(BaseModel):
    index: int
    uuid: str
    milli: int
    memory_mib: int


class RequestOut(BaseModel):
    """What a job asked for, in the daemon's units: shown by `corral show` for a job that waits as for one that runs."""

    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_milli: int  # per GPU; 1000 = whole GPUs
    gpu_memory_mib: int  # per GPU, for a share
    gpu_models: list[str] | None
    time_limit_s: float | None
    retries: int
    cwd: str
    env_count: int  # how many variables, not their values (they may hold secrets)


class PreemptedOut(BaseModel):
    """A job's preemptions: how many, and the last one (docs/preemption.md)."""

    count: int
    at: float  # epoch seconds: when the last one was decided
    reason: str  # "preempted by job N (user U, priority P) at T: ...; it stopped (...)"


class ChangeOut(BaseModel):
    """One change to a waiting job after submission (hold, release, update): docs/hold-update.md."""

    at: float
    by: str
    field: str
    old: str
    new: str


class UpdateIn(BaseModel):
    """Changes to a waiting job (PATCH /v1/jobs/ID); only the fields given change. A field it does not know is
    refused (422): a dependency cannot be added after submission."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    #: users: USER_PRIORITY and their queue's bounds; root and admins: up to MAX_PRIORITY
    priority: int | None = Field(default=None, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    time_limit: str | None = Field(default=None, max_length=MAX_QUANTITY_TEXT)
    queue: str | None = Field(default=None, max_length=64)
    gpus: int | None = Field(default=None, ge=0, le=MAX_QUANTITY["gpu_count"])
    name: str | None = Field(default=None, max_length=limits.MAX_NAME)


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
    queue: str = ""  # its queue ("" for a job stored before queues existed: the default queue)
    request: RequestOut | None = None
    log_path: str | None = None  # only in one job's answer (GET /v1/jobs/ID)
    preemptible: bool = True
    preempted: PreemptedOut | None = None  # None: never preempted
    instances: int = 1  # a gang's processes (gpus lists every instance's grants, instance by instance)
    gang: bool = False
    dependency: str = ""  # what it waits for ("afterok:12,singleton"; "" for none): docs/dependencies.md
    kill_on_invalid_dep: bool = False
    held_by: str = ""  # "" when not held (corral hold / release)
    history: list[ChangeOut] = Field(default_factory=list)  # changes after submission, oldest first
    script: ScriptOut | None = None  # a batch script's name, dialect, arguments and size (None: a plain command)
    output: str = ""  # --output / --error as submitted (patterns unexpanded); "": corral's log
    error: str = ""
    # A task of a job array (docs/arrays.md): the array's id and this task's id ("" and None for other jobs), and the
    # array's --array text
    array_job_id: str = ""
    array_task_id: int | None = None
    array: str = ""
    #: Only in one job's answer (GET /v1/jobs/ID), of an array's id: how many of its tasks are in each state
    array_tasks: dict[str, int] | None = None

    @classmethod
    def of(cls, job: Job, *, log_path: str | None = None, array_tasks: dict[str, int] | None = None) -> JobOut:
        uuids = list(job.gpu_uuids) + [""] * max(0, len(job.gpus) - len(job.gpu_uuids))
        r = job.spec.request
        # clean(): a job stored by an older corral may hold a lone surrogate; the answer must still encode.
        return cls(
            id=job.id,
            name=clean(job.spec.name),
            user=clean(job.spec.user),
            state=job.state.value,
            command=[clean(a) for a in job.spec.command],
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
            reason=clean(job.reason),
            origin=clean(job.spec.origin),
            queue=clean(job.spec.queue),
            request=RequestOut(
                cpu_milli=r.cpu_milli,
                memory_mib=r.memory_mib,
                gpu_count=r.gpu_count,
                gpu_milli=r.gpu_milli,
                gpu_memory_mib=r.gpu_memory_mib,
                gpu_models=None if r.gpu_models is None else sorted(clean(m) for m in r.gpu_models),
                time_limit_s=job.spec.time_limit_s,
                retries=job.spec.retries,
                cwd=clean(job.spec.cwd),
                env_count=len(job.spec.env),
            ),
            log_path=log_path,
            preemptible=job.spec.preemptible,
            instances=job.spec.instances,
            gang=job.spec.gang,
            dependency=dependency.text(job.spec.dependency),
            kill_on_invalid_dep=job.spec.kill_on_invalid_dep,
            preempted=None if job.preempted is None else PreemptedOut(**dataclasses.asdict(job.preempted)),
            held_by=clean(job.spec.held_by),
            history=[
                ChangeOut(at=c.at, by=clean(c.by), field=c.field, old=clean(c.old), new=clean(c.new))
                for c in job.spec.history
            ],
            script=None if job.spec.script is None else ScriptOut(**script_row(job)),
            output=clean(job.spec.output),
            error=clean(job.spec.error),
            array_job_id=job.spec.array.job_id if job.spec.array is not None else "",
            array_task_id=job.spec.array.task if job.spec.array is not None else None,
            array=job.spec.array.spec.text if job.spec.array is not None else "",
            array_tasks=array_tasks,
        )


def script_row(job: Job) -> dict[str, Any]:
    s = job.spec.script
    assert s is not None
    size = len(s.text.encode("utf-8", "surrogatepass"))
    return {"name": clean(s.name), "dialect": s.dialect, "args": [clean(a) for a in s.args], "bytes": size}


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


#: A listing's row (GET /v1/jobs): JobOut's fields, none required, as `fields=id,state` leaves the others out; the
#: OpenAPI document says so (a client must not expect a field it did not ask for).
JobRow = create_model(  # type: ignore[call-overload]
    "JobRow", **{name: (info.annotation, None) for name, info in JobOut.model_fields.items()}
)


def job_row(job: Job, fields: Sequence[str] | None = None) -> dict[str, Any]:
    """`JobOut.of(job).model_dump()` built directly, for a listing: a page of 10,000 jobs through pydantic models
    costs about 80 ms of the daemon's time (16 us a job), this about a tenth of that. The same keys, values and types
    (tests/api/test_list_and_bulk_cancel.py holds them equal); a field added to JobOut is added here and to ROW.

    `fields` (JobOut's names, in its order): only those, each built alone by ROW (`corral ps` asks for 13 of 33: a
    page of 5,000 rows in 15 ms instead of 24). A whole row is written out here, which is faster than ROW's 33 calls
    (26 ms instead of 34); the tests hold the two equal, field by field."""
    if fields is not None:
        return {name: ROW_FIELD[name](job) for name in fields}
    spec = job.spec
    r = spec.request
    preempted = job.preempted
    return {
        "id": job.id,
        "name": clean(spec.name),
        "user": clean(spec.user),
        "state": job.state.value,
        "command": [clean(a) for a in spec.command],
        "priority": r.priority,
        "submitted_at": float(job.submitted_at),
        "started_at": _float(job.started_at),
        "finished_at": _float(job.finished_at),
        "exit_code": job.exit_code,
        "attempts": job.attempts,
        "gpus": _gpus(job),
        "reason": clean(job.reason),
        "origin": clean(spec.origin),
        "queue": clean(spec.queue),
        "request": _request(job),
        "log_path": None,
        "preemptible": spec.preemptible,
        "preempted": None
        if preempted is None
        else {"count": preempted.count, "at": float(preempted.at), "reason": preempted.reason},
        "instances": spec.instances,
        "gang": spec.gang,
        "dependency": dependency.text(spec.dependency),
        "kill_on_invalid_dep": spec.kill_on_invalid_dep,
        "held_by": clean(spec.held_by),
        "history": [
            {"at": float(c.at), "by": clean(c.by), "field": c.field, "old": clean(c.old), "new": clean(c.new)}
            for c in spec.history
        ],
        "script": None if spec.script is None else script_row(job),
        "output": clean(spec.output),
        "error": clean(spec.error),
        "array_job_id": spec.array.job_id if spec.array is not None else "",
        "array_task_id": spec.array.task if spec.array is not None else None,
        "array": spec.array.spec.text if spec.array is not None else "",
        "array_tasks": None,
    }


def _gpus(job: Job) -> list[dict[str, Any]]:
    uuids = job.gpu_uuids
    return [
        {"index": g.index, "uuid": uuids[i] if i < len(uuids) else "", "milli": g.milli, "memory_mib": g.memory_mib}
        for i, g in enumerate(job.gpus)
    ]


def _request(job: Job) -> dict[str, Any]:
    spec = job.spec
    r = spec.request
    return {
        "cpu_milli": r.cpu_milli,
        "memory_mib": r.memory_mib,
        "gpu_count": r.gpu_count,
        "gpu_milli": r.gpu_milli,
        "gpu_memory_mib": r.gpu_memory_mib,
        "gpu_models": None if r.gpu_models is None else sorted(clean(m) for m in r.gpu_models),
        "time_limit_s": _float(spec.time_limit_s),
        "retries": spec.retries,
        "cwd": clean(spec.cwd),
        "env_count": len(spec.env),
    }


def _preempted(job: Job) -> dict[str, Any] | None:
    p = job.preempted
    return None if p is None else {"count": p.count, "at": float(p.at), "reason": p.reason}


#: A listing row's fields in JobOut's order, each a function of the job: the one place a row's values are written.
ROW: tuple[tuple[str, Callable[[Job], Any]], ...] = (
    ("id", lambda j: j.id),
    ("name", lambda j: clean(j.spec.name)),
    ("user", lambda j: clean(j.spec.user)),
    ("state", lambda j: j.state.value),
    ("command", lambda j: [clean(a) for a in j.spec.command]),
    ("priority", lambda j: j.spec.request.priority),
    ("submitted_at", lambda j: float(j.submitted_at)),
    ("started_at", lambda j: _float(j.started_at)),
    ("finished_at", lambda j: _float(j.finished_at)),
    ("exit_code", lambda j: j.exit_code),
    ("attempts", lambda j: j.attempts),
    ("gpus", _gpus),
    ("reason", lambda j: clean(j.reason)),
    ("origin", lambda j: clean(j.spec.origin)),
    ("queue", lambda j: clean(j.spec.queue)),
    ("request", _request),
    ("log_path", lambda j: None),
    ("preemptible", lambda j: j.spec.preemptible),
    ("preempted", _preempted),
    ("instances", lambda j: j.spec.instances),
    ("gang", lambda j: j.spec.gang),
    ("dependency", lambda j: dependency.text(j.spec.dependency)),
    ("kill_on_invalid_dep", lambda j: j.spec.kill_on_invalid_dep),
    ("held_by", lambda j: clean(j.spec.held_by)),
    (
        "history",
        lambda j: [
            {"at": float(c.at), "by": clean(c.by), "field": c.field, "old": clean(c.old), "new": clean(c.new)}
            for c in j.spec.history
        ],
    ),
    ("script", lambda j: None if j.spec.script is None else script_row(j)),
    ("output", lambda j: clean(j.spec.output)),
    ("error", lambda j: clean(j.spec.error)),
    ("array_job_id", lambda j: j.spec.array.job_id if j.spec.array is not None else ""),
    ("array_task_id", lambda j: j.spec.array.task if j.spec.array is not None else None),
    ("array", lambda j: j.spec.array.spec.text if j.spec.array is not None else ""),
    ("array_tasks", lambda j: None),
)
ROW_FIELD = dict(ROW)


def _each(field: Callable[[Job], Any]) -> Callable[[Sequence[Job]], list[Any]]:
    return lambda jobs: list(map(field, jobs))


def _texts(texts: list[str]) -> list[str]:
    """A column of text as ROW writes it: `clean` only where a value is not ASCII (a listing's texts nearly never)."""
    return texts if all(map(str.isascii, texts)) else list(map(clean, texts))


def _commands(jobs: Sequence[Job]) -> list[Sequence[str]]:
    """The jobs' commands: their own tuples (orjson writes a tuple as an array), no new list a job."""
    commands: list[Sequence[str]] = [j.spec.command for j in jobs]
    if all(map(str.isascii, map("".join, commands))):
        return commands
    return [[clean(a) for a in command] for command in commands]


#: The GPUs of a job that holds none, one list for all of a page's: sent at once, never changed.
_NO_GPUS: list[dict[str, Any]] = []


def _array_column(part: Callable[[array.ArrayTask], Any], none: Any) -> Callable[[Sequence[Job]], list[Any]]:
    def column(jobs: Sequence[Job]) -> list[Any]:
        tasks = [j.spec.array for j in jobs]
        if not any(tasks):
            return [none] * len(tasks)
        return [none if t is None else part(t) for t in tasks]

    return column


#: A listing's fields a column at a time (`GET /v1/jobs?layout=columns`): each a function of the page's jobs giving
#: ROW's values of them in order, as JSON writes them (tests/api/test_list_and_bulk_cancel.py holds the two equal,
#: field by field). The fields `corral ps` asks for are written out as comprehensions, a field at a time, and make
#: no new container a job (a command is its spec's tuple, no GPUs one shared list): 5,000 jobs in about 3 ms, against
#: 15 for the rows, and nothing for the garbage collector, whose full passes over the daemon's heap a page of 10,000
#: new lists and dicts set off every few listings (6 ms a listing on average, measured). The rest are ROW's function
#: mapped over the jobs.
COLUMN: dict[str, Callable[[Sequence[Job]], list[Any]]] = {
    **{name: _each(field) for name, field in ROW},
    "id": lambda jobs: [j.id for j in jobs],
    "name": lambda jobs: _texts([j.spec.name for j in jobs]),
    "user": lambda jobs: _texts([j.spec.user for j in jobs]),
    "reason": lambda jobs: _texts([j.reason for j in jobs]),
    "state": lambda jobs: [j.state._value_ for j in jobs],  # the member's value without Enum's property
    "command": _commands,
    "submitted_at": lambda jobs: [float(j.submitted_at) for j in jobs],
    "finished_at": lambda jobs: [None if (t := j.finished_at) is None else float(t) for j in jobs],
    "gpus": lambda jobs: [_gpus(j) if j.gpus else _NO_GPUS for j in jobs],
    "preempted": lambda jobs: [None if j.preempted is None else _preempted(j) for j in jobs],
    "array_job_id": _array_column(lambda t: t.job_id, ""),
    "array_task_id": _array_column(lambda t: t.task, None),
    "array": _array_column(lambda t: t.spec.text, ""),
}


def job_columns(jobs: Sequence[Job], fields: Sequence[str] | None = None) -> dict[str, list[Any]]:
    """A listing's page as columns: each of JobOut's fields (or those asked, in JobOut's order), a list of the
    jobs' values in order; the values of `job_row`, without an object a job on either side of the wire."""
    return {name: COLUMN[name](jobs) for name in (JobOut.model_fields if fields is None else fields)}


#: `layout=columns`'s answer in the OpenAPI spec: JobOut's fields, each a list of the page's values (none required,
#: as `fields=id,state` leaves the others out).
JobColumns = create_model(  # type: ignore[call-overload]
    "JobColumns",
    __doc__="A page of jobs as columns: each of JobOut's fields (those asked), a list of the jobs' values in order.",
    **{name: (list[info.annotation] | None, None) for name, info in JobOut.model_fields.items()},  # type: ignore[name-defined]
)


class CancelManyIn(BaseModel):
    """Which jobs to cancel: `ids`, or those in `state` and/or with `name` (all given must hold)."""

    model_config = ConfigDict(extra="forbid")

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


class HolderOut(BaseModel):
    job: str
    owner: str | None  # None: another user's job
    gpus: list[int]
    expected_end: float  # epoch seconds
    expected_end_from: str  # "time limit" or "default time limit"


class ReservationOut(BaseModel):
    job: str
    gpus: list[int]
    start: float  # epoch seconds


class ExplainOut(BaseModel):
    state: str
    reason: str
    # A queued job's place and prospects (docs/backfill.md); None / empty for other states.
    position: int | None = None
    queued: int | None = None
    holders: list[HolderOut] = []
    reservation: ReservationOut | None = None
    estimated_start: float | None = None
    default_time_limit_s: float | None = None
    # The above in sentences (clock times in UTC): what `corral explain` prints after the reason. Kept apart from
    # `reason`, which stays the job's own why (the one `GET /v1/jobs` and `corral ps` show).
    story: str | None = None
    preempted: PreemptedOut | None = None  # a job preempted before (any state): the last time, in `story` too
    # Its queue (docs/queues.md): position among that queue's waiting jobs, jobs ahead across the machine, and the
    # limit (queue, user, group, borrowing) that held it back in the last round, if one did.
    queue: str | None = None
    queue_position: int | None = None
    queue_queued: int | None = None
    ahead: int | None = None
    limit: str | None = None
    # A starting or running job (in `story` too): its GPUs, when it started, when its time limit stops it, and who may
    # preempt it: the waiting jobs the preemption rules let stop it now, or why none may ("cannot be preempted: ...").
    gpus: list[GpuOut] = []
    started_at: float | None = None
    time_limit_s: float | None = None
    ends_at: float | None = None
    preemptible_now: bool | None = None
    may_be_preempted_by: list[str] = []
    may_preempt: list[str] = []  # a queued job: the running jobs the preemption rules let it stop (in `story` too)


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=MAX_NAME)
    user: str | None = Field(default=None, min_length=1, max_length=256)  # root only: a token for another user


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


def unknown_field(errors: Sequence[Mapping[str, Any]], model: Any) -> tuple[str, str] | None:
    """For a corral body with fields it does not know (pydantic's `extra_forbidden`): the first one's name and the
    message, with the nearest known field when one is close ("unknown field (did you mean 'time_limit'?) ...");
    None for other errors. `model`: the route's body model, whose fields are listed."""
    names = [str(e["loc"][-1]) for e in errors if e.get("type") == "extra_forbidden" and e.get("loc")]
    if not names:
        return None
    fields = list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []
    close = difflib.get_close_matches(names[0], fields, n=1, cutoff=0.6)
    text = "unknown field" + (f" (did you mean {close[0]!r}?)" if close else "")
    if len(names) > 1:
        text += f"; also unknown: {', '.join(names[1:6])}" + (" ..." if len(names) > 6 else "")
    if fields:
        text += f"; the fields are: {', '.join(fields)}"
    return names[0], text
