"""A job: a command to run with a resource request, and its life cycle.

    QUEUED --(scheduler grants resources)--> STARTING --(process spawned)--> RUNNING
    RUNNING --> SUCCEEDED (exit 0) | FAILED (non-zero, signal, time limit) | CANCELLED (user) | LOST (daemon
    restarted and the process was gone or not ours)
    FAILED / LOST with attempts left --> QUEUED again after a back-off (`not_before`)
    STARTING / RUNNING --(preempted: SIGTERM, grace, SIGKILL; corral.tenancy.preemption)--> QUEUED, attempts kept
    QUEUED / STARTING --> CANCELLED

A job's resources are held from STARTING until it reaches a final state, so a job that has just started keeps its
reservation before it has allocated anything (no launch race).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import orjson

from corral.jobs.usage import Usage
from corral.model import limits
from corral.model.errors import InvalidRequest
from corral.model.resources import Constraint, GpuBehavior, GpuGrant, Request

if TYPE_CHECKING:
    from corral.jobs.array import ArrayTask
    from corral.jobs.batch import Script
    from corral.jobs.dependency import Dependency


class JobState(StrEnum):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"

    @property
    def final(self) -> bool:
        return self in FINAL_STATES

    @property
    def holds_resources(self) -> bool:
        return self in (JobState.STARTING, JobState.RUNNING)


FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST})

#: Allowed transitions (from -> to). A retry is FAILED/LOST -> QUEUED.
TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.STARTING, JobState.CANCELLED}),
    # -> QUEUED: a preempted job goes back to the queue in one write (not through FAILED: it did not fail).
    JobState.STARTING: frozenset(
        {JobState.RUNNING, JobState.FAILED, JobState.CANCELLED, JobState.LOST, JobState.QUEUED}
    ),
    JobState.RUNNING: frozenset(
        {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST, JobState.QUEUED}
    ),
    JobState.FAILED: frozenset({JobState.QUEUED}),
    JobState.LOST: frozenset({JobState.QUEUED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class InvalidTransition(InvalidRequest):
    def __init__(self, job_id: str, current: JobState, wanted: JobState) -> None:
        super().__init__("state", f"job {job_id} is {current.value}; it cannot become {wanted.value}")
        self.current = current


#: Most jobs one gang group may have (a Marathon app's instances launched as one gang).
MAX_GANG_GROUP = 1000


@dataclass(frozen=True)
class Change:
    """One change to a waiting job after submission: when, by whom, which field, from what to what (as text)."""

    at: float
    by: str
    field: str
    old: str
    new: str

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "by": self.by, "field": self.field, "old": self.old, "new": self.new}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Change:
        return cls(float(d["at"]), str(d["by"]), str(d["field"]), str(d["old"]), str(d["new"]))


@dataclass(frozen=True)
class JobSpec:
    """What was submitted. Validated by `Request` for resources; the rest here."""

    command: tuple[str, ...]
    request: Request
    user: str
    uid: int
    gid: int
    name: str = ""
    retries: int = 0
    time_limit_s: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "/"
    #: What made this job: "" for `corral submit`; otherwise "<kind>:<name>[:<run>]" of the definition it runs
    #: (a scheduled job's run, a service's instance), so the definition's controller can follow it.
    origin: str = ""
    #: False: never chosen as a victim of preemption (docs/preemption.md); once queues land, it starts only within
    #: its queue's guarantee (`corral.tenancy.preemption.Rules.may_borrow`).
    preemptible: bool = True
    #: A gang (corral.daemon.gang): `instances` processes, each with its own grant of `request`, all started or none.
    instances: int = 1
    gang: bool = False
    #: The queue it was submitted to ("" before queues existed, or from a face that names none: the default queue).
    queue: str = ""
    #: A gang of jobs (a Marathon app's instances with the label corral.gang): the jobs that share this group start
    #: together or none does (corral.tenancy.round), and only once all `gang_size` of them are queued.
    gang_group: str = ""
    gang_size: int = 0
    #: Jobs it waits for, in Slurm's words (corral.jobs.dependency): afterok:3, singleton, ...; () for none.
    dependency: tuple[Dependency, ...] = ()
    #: A dependency that can never be met (afterok on a job that failed) cancels it, instead of leaving it waiting.
    kill_on_invalid_dep: bool = False
    #: Held (`corral hold`): the user who held it, "" when not held. A held job is not offered to the scheduler.
    held_by: str = ""
    #: Changes made after submission (hold, release, update), oldest first: `show` lists them (docs/hold-update.md).
    history: tuple[Change, ...] = ()
    #: A batch script (corral.jobs.batch): its text, stored here so that a retry or a requeue runs the same text
    #: whatever became of the file; `command` is its name and arguments. None: an ordinary command.
    script: Script | None = None
    #: --output / --error patterns (%j %A %a %u %x %%), "" for corral's own log; opened as the job's user at launch.
    output: str = ""
    error: str = ""
    #: A task of a job array (corral.jobs.array): the array's id, this task's id, the array's tasks; None otherwise.
    array: ArrayTask | None = None

    def __post_init__(self) -> None:
        if not self.command or not self.command[0]:
            raise InvalidRequest("command", "give the command to run (after --)")
        if not 1 <= self.instances <= 64:
            raise InvalidRequest("instances", f"must be in 1..64, got {self.instances}")
        if self.instances > 1 and not self.gang:
            raise InvalidRequest(
                "instances", "several instances run as a gang (all or none): ask for gang too, or submit the job again"
            )
        if self.gang_group and not 1 <= self.gang_size <= MAX_GANG_GROUP:
            raise InvalidRequest("gang_size", f"a gang group has 1..{MAX_GANG_GROUP} jobs, got {self.gang_size}")
        if self.gang_group and self.instances > 1:
            raise InvalidRequest("gang_group", "a job of several instances is a gang already: it joins no group")
        if self.retries < 0 or self.retries > 100:
            raise InvalidRequest("retries", f"must be in 0..100, got {self.retries}")
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise InvalidRequest("time_limit", f"must be > 0 seconds, got {self.time_limit_s}")
        if len(self.name) > limits.MAX_NAME:
            raise InvalidRequest("name", f"must be at most {limits.MAX_NAME} characters")


def admission_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """Everything that would make `spec` fail at launch or garble a listing, as (field, message) pairs.

    Not in `__post_init__`: a job stored by an older corral must still be readable (and shown, escaped), so these
    rules guard admission (the API, each face, and `Store.add`), not decoding."""
    out: list[tuple[str, str]] = []
    out += [(limits.joined("command", sub), why) for sub, why in limits.command_problems(spec.command)]
    out += [(limits.joined("env", sub), why) for sub, why in limits.env_problems(spec.env)]
    if spec.script is not None or spec.output or spec.error:
        from corral.jobs import batch

        out += batch.admission_problems(spec.script, spec.output, spec.error, spec.instances)
    for name, problem in (
        ("name", limits.name_problem(spec.name)),
        ("cwd", limits.cwd_problem(spec.cwd)),
        ("user", limits.text_problem(spec.user)),
        ("origin", limits.free_text_problem(spec.origin, limits.MAX_PATH)),
    ):
        if problem is not None:
            out.append((name, problem))
    return out


def check_admissible(spec: JobSpec) -> None:
    """Raise InvalidRequest naming the first field of `spec` that cannot be admitted (see `admission_problems`)."""
    problems = admission_problems(spec)
    if problems:
        field, message = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InvalidRequest(field, message + more)


@dataclass(frozen=True)
class Preempted:
    """A job's preemptions: how many, and the last one's time and reason in words (what `explain` tells)."""

    count: int
    at: float  # epoch seconds: when the last one was decided (its SIGTERM)
    reason: str  # "preempted by job N (user U, priority P) at T: ..."

    def to_json(self) -> str:
        return json.dumps({"count": self.count, "at": self.at, "reason": self.reason}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Preempted:
        d = json.loads(text)
        return cls(int(d["count"]), float(d["at"]), str(d["reason"]))


@dataclass(frozen=True)
class Job:
    id: str
    spec: JobSpec
    state: JobState
    submitted_at: float
    attempts: int = 0  # times it was started
    not_before: float = 0.0  # earliest next start (retry back-off)
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    pid: int | None = None
    pid_start_time: int | None = None  # /proc/<pid>/stat start time (clock ticks): tells a reused PID apart
    gpus: tuple[GpuGrant, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    reason: str = ""  # why it waits / how it ended, in words
    version: int = 0  # bumped by the store on every write (compare-and-set)
    preempted: Preempted | None = None  # None: never preempted
    usage: Usage | None = None  # its GPUs' use in its last attempt, stored with its end (corral.jobs.usage)

    @property
    def failures(self) -> int:
        """Attempts that used up a retry: a preempted attempt did not fail."""
        return self.attempts - (self.preempted.count if self.preempted is not None else 0)

    def evolve(self, **changes: Any) -> Job:
        return replace(self, **changes)


# ---------------------------------------------------------------------------------------------- serialisation
def request_to_dict(r: Request) -> dict[str, Any]:
    d = asdict(r)
    d["gpu_models"] = sorted(r.gpu_models) if r.gpu_models is not None else None
    d["constraints"] = [[c.attribute, c.op.value, c.value] for c in r.constraints]
    d["gpu_behavior"] = r.gpu_behavior.value if r.gpu_behavior else None
    d["labels"] = dict(r.labels)
    return d


def request_from_dict(d: Mapping[str, Any]) -> Request:
    d = dict(d)
    d["gpu_models"] = frozenset(d["gpu_models"]) if d.get("gpu_models") is not None else None
    d["constraints"] = tuple(Constraint.parse(*c) for c in d.get("constraints", ()))
    d["gpu_behavior"] = GpuBehavior(d["gpu_behavior"]) if d.get("gpu_behavior") else None
    return Request(**d)


def spec_to_json(s: JobSpec) -> str:
    return json.dumps(
        {
            "command": list(s.command),
            "request": request_to_dict(s.request),
            "user": s.user,
            "uid": s.uid,
            "gid": s.gid,
            "name": s.name,
            "retries": s.retries,
            "time_limit_s": s.time_limit_s,
            "env": dict(s.env),
            "cwd": s.cwd,
            "origin": s.origin,
            # only when not the default: the JSON of every job stored before this field existed stays as it was
            **({} if s.preemptible else {"preemptible": False}),
            **({} if s.instances == 1 and not s.gang else {"instances": s.instances, "gang": s.gang}),
            **({"queue": s.queue} if s.queue else {}),  # absent when unset: specs stored before queues read the same
            **({"gang_group": s.gang_group, "gang_size": s.gang_size} if s.gang_group else {}),
            **({"dependency": dependency_text(s.dependency)} if s.dependency else {}),
            **({"kill_on_invalid_dep": True} if s.kill_on_invalid_dep else {}),
            **({"held_by": s.held_by} if s.held_by else {}),
            **({"history": [c.to_dict() for c in s.history]} if s.history else {}),
            **({"script": s.script.to_dict()} if s.script is not None else {}),
            **({"output": s.output} if s.output else {}),
            **({"error": s.error} if s.error else {}),
            **({"array": array_dict(s.array)} if s.array is not None else {}),
        },
        sort_keys=True,
    )


def dependency_text(deps: tuple[Dependency, ...]) -> str:
    from corral.jobs import dependency

    return dependency.text(deps)


def loads(text: str | bytes) -> Any:
    """JSON decoded by orjson (a stored spec about 2x faster than json: a restart reads every job of the history),
    or by json where orjson refuses what json takes (the escape of a lone surrogate, which an older corral stored)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def array_dict(a: ArrayTask) -> dict[str, Any]:
    return {"job": a.job_id, "task": a.task, "spec": a.spec.text}


def array_from(d: Mapping[str, Any]) -> ArrayTask:
    from corral.jobs import array

    return array.ArrayTask(str(d["job"]), int(d["task"]), array.parse(str(d["spec"])))


def spec_from_json(text: str) -> JobSpec:
    d = loads(text)
    deps: tuple[Dependency, ...] = ()
    if d.get("dependency"):
        from corral.jobs import dependency

        deps = dependency.parse(str(d["dependency"]))
    script: Script | None = None
    if d.get("script"):
        from corral.jobs.batch import Script

        script = Script.from_dict(d["script"])
    return JobSpec(
        command=tuple(d["command"]),
        request=request_from_dict(d["request"]),
        user=d["user"],
        uid=d["uid"],
        gid=d["gid"],
        name=d["name"],
        retries=d["retries"],
        time_limit_s=d["time_limit_s"],
        env=d["env"],
        cwd=d["cwd"],
        origin=d.get("origin", ""),  # absent in jobs stored before origins existed
        preemptible=bool(d.get("preemptible", True)),
        instances=int(d.get("instances", 1)),
        gang=bool(d.get("gang", False)),
        queue=d.get("queue", ""),
        gang_group=d.get("gang_group", ""),
        gang_size=int(d.get("gang_size", 0)),
        dependency=deps,
        kill_on_invalid_dep=bool(d.get("kill_on_invalid_dep", False)),
        held_by=str(d.get("held_by", "")),  # absent in jobs stored before hold existed, or never held
        history=tuple(Change.from_dict(c) for c in d.get("history", ())),
        script=script,  # absent for an ordinary command, and in every job stored before batch scripts
        output=str(d.get("output", "")),
        error=str(d.get("error", "")),
        array=array_from(d["array"]) if d.get("array") else None,  # absent: not an array's task
    )
