"""Chronos job JSON (`POST /v1/scheduler/iso8601`, `/v1/scheduler/dependency`): model with Chronos' defaults,
validation, mapping onto corral, and Chronos' retry / softError / auto-disable rules as pure functions.

    parse_job(data, now=..., known_jobs=...)  -> ChronosJob     (ObjectNotValid, status 400 as Chronos answered)
    to_definition(job, now, defaults)         -> JobDefinition

    job_shape(job, ...)                       -> dict           (the job as Chronos 3's JobSerializer writes it)
    histogram, dot_graph, csv_graph, metrics   Chronos' stats, graph and Dropwizard metrics shapes

Differences from Chronos, on purpose (each one in docs/compat/chronos.md, "Deliberate differences"):
* `gpus` (whole number) is accepted: upstream Chronos never merged GPU support (issue #764, PR #810), and the seed
  shows users running the patched build with exactly this field.
* a job with both `schedule` and `parents` is refused (Chronos' deserializer silently dropped the schedule;
  chronos-python refuses such a job before sending it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import Field, field_validator

from corral.mesos.common import (
    MAX_CPUS,
    MAX_GPUS,
    MAX_ID,
    MAX_MIB,
    MAX_RETRIES,
    MAX_SECONDS,
    FetchUri,
    KeyValue,
    MesosModel,
    check_command,
    check_env,
    check_shell,
    check_text,
)
from corral.mesos.errors import Problems, validate_model
from corral.mesos.model import (
    Artifact,
    ContainerImage,
    JobDefinition,
    RetryRule,
    ScheduleRule,
    duration_seconds,
    to_request,
)
from corral.model.errors import InvalidRequest
from corral.model.resources import Constraint
from corral.schedule.clock import ConcurrencyPolicy
from corral.schedule.iso8601 import check_min_period, parse_repeating_interval

JOB_NAME = re.compile(r"[\w.-]+", re.ASCII)  # Java's \w: ASCII letters, digits, _
GPU_NEEDS_MESOS = "GPU resources only work with the Mesos containerizer"
FETCH_AND_URIS = "Use fetch or uris, not both (uris is deprecated)"
SCHEDULE_AND_PARENTS = "A job has either a schedule or parents, not both"
NO_EXECUTORS = "custom Mesos executors are not supported by corral (the command runs as a process on this machine)"
STATUS = 400  # Chronos answered bad jobs with 400 Bad Request


@dataclass(frozen=True, slots=True)
class ChronosDefaults:
    """Chronos' command-line defaults that shape jobs (`--mesos_task_cpu` and friends)."""

    cpus: float = 0.1
    mem: float = 128.0
    disk: float = 256.0
    failure_retry_s: float = 60.0  # --failure_retry
    disable_after_failures: int = 0  # --disable_after_failures; 0 = never


def _upper(value: Any) -> Any:
    """Chronos upper-cases the container type and a volume's mode before reading them (`"docker"` is DOCKER)."""
    return value.upper() if isinstance(value, str) else value


class ChronosVolume(MesosModel):
    container_path: str = Field(min_length=1)
    host_path: str | None = None
    mode: Literal["RO", "RW"] | None = None  # None: as Mesos defaults it (RW); Chronos shows no mode then

    _mode_case = field_validator("mode", mode="before")(_upper)


class Container(MesosModel):
    type: Literal["DOCKER", "MESOS"] = "DOCKER"
    image: str = Field(min_length=1)
    force_pull_image: bool = False
    network: Literal["BRIDGE", "HOST", "USER"] = "HOST"
    volumes: list[ChronosVolume] = []
    parameters: list[KeyValue] = []

    _type_case = field_validator("type", mode="before")(_upper)


class NameValue(MesosModel):
    name: str = Field(min_length=1)
    value: str


class ChronosJob(MesosModel):
    name: str
    command: str = ""
    shell: bool = True
    arguments: list[str] = []
    schedule: str | None = None
    schedule_time_zone: str = ""
    parents: list[str] = []
    epsilon: str | None = None
    retries: int = Field(default=2, ge=0, le=MAX_RETRIES)
    cpus: float = Field(default=0, ge=0, le=MAX_CPUS)
    mem: float = Field(default=0, ge=0, le=MAX_MIB)
    disk: float = Field(default=0, ge=0, le=MAX_MIB)
    gpus: int = Field(default=0, ge=0, le=MAX_GPUS)
    container: Container | None = None
    fetch: list[FetchUri] = []
    uris: list[str] = []
    environment_variables: list[NameValue] = []
    labels: list[NameValue] = []
    run_as_user: str | None = None
    disabled: bool = False
    concurrent: bool = False
    soft_error: bool = False
    high_priority: bool = False
    max_completion_time: int = Field(default=0, ge=-MAX_SECONDS, le=MAX_SECONDS)  # <= 0: no limit (Chronos shows 0)
    constraints: list[list[str]] = []
    owner: str = ""
    owner_name: str = ""
    description: str = ""
    executor: str = ""  # a custom Mesos executor: refused unless empty (NO_EXECUTORS)
    executor_flags: str = ""
    task_info_data: str = ""
    data_processing_job_type: bool = False  # only the task-progress endpoint reads it (not supported by corral)

    @field_validator("parents", mode="after")
    @classmethod
    def _parent_set(cls, parents: list[str]) -> list[str]:
        """Chronos keeps parents as a set: a repeated name counts once (the first place it appears is kept)."""
        return list(dict.fromkeys(parents))


_CONSTRAINT_OPS = {"EQUALS": "IS", "LIKE": "LIKE", "UNLIKE": "UNLIKE"}


def _constraints(job: ChronosJob, problems: Problems) -> tuple[Constraint, ...]:
    out = []
    for i, c in enumerate(job.constraints):
        path = f"/constraints/{i}"
        if len(c) != 3:
            problems.add(path, f"must be [attribute, EQUALS|LIKE|UNLIKE, value], got {c}")
            continue
        attribute, op, value = c
        if op not in _CONSTRAINT_OPS:
            problems.add(path, f"unknown operator {op!r}; use one of EQUALS, LIKE, UNLIKE")
            continue
        try:
            out.append(Constraint.parse(attribute, _CONSTRAINT_OPS[op], value))
        except InvalidRequest as exc:
            problems.add(path, exc.message)
    return tuple(out)


def parse_job(data: Any, *, now: datetime, known_jobs: Mapping[str, Sequence[str]] | None = None) -> ChronosJob:
    """Validate a Chronos job. `now` (aware) anchors an empty schedule start; `known_jobs` (stored job names -> their
    parents) checks that the parents exist and close no cycle; None skips that check. A submission (`known_jobs`
    given) is also held to the schedules' minimum period; a stored job (None) is read as it was admitted, so one
    stored by an older corral still loads."""
    job = validate_model(ChronosJob, data, STATUS)
    problems = Problems(status=STATUS)
    if len(job.name) > MAX_ID:
        problems.add("/name", f"must be at most {MAX_ID} characters, got {len(job.name)}")
    elif not JOB_NAME.fullmatch(job.name):
        problems.add("/name", f"must be letters, digits, '_', '.' or '-', got {job.name!r}")
    check_shell(problems, job.command, "/command")
    if not job.shell:
        check_command(problems, job.arguments, "/arguments")
    check_env(problems, {e.name: e.value for e in job.environment_variables}, "/environmentVariables")
    for path, text in (("/description", job.description), ("/owner", job.owner)):
        check_text(problems, text, path)
    if not job.command and job.container is None:
        problems.add("/command", "is required (it may be empty only for a container image)")
    if job.schedule is not None:
        try:
            interval = parse_repeating_interval(job.schedule, job.schedule_time_zone, now=now)
            if known_jobs is not None:
                check_min_period(interval)
        except InvalidRequest as exc:
            problems.add("/scheduleTimeZone" if exc.field == "scheduleTimeZone" else "/schedule", exc.message)
        if job.parents:
            problems.add("/", SCHEDULE_AND_PARENTS)
    if job.epsilon is not None:
        try:
            duration_seconds(job.epsilon, "epsilon")
        except InvalidRequest as exc:
            problems.add("/epsilon", exc.message)
    if job.fetch and job.uris:
        problems.add("/fetch", FETCH_AND_URIS)
    if job.gpus > 0 and job.container is not None and job.container.type == "DOCKER":
        problems.add("/gpus", GPU_NEEDS_MESOS)
    if job.executor:
        problems.add("/executor", NO_EXECUTORS)
    if job.name in job.parents:
        problems.add("/parents", "a job cannot be its own parent")
    elif known_jobs is not None:
        unknown = sorted(p for p in set(job.parents) if p not in known_jobs)
        if unknown:
            problems.add("/parents", f"unknown parent jobs: {', '.join(unknown)}")
        elif _closes_cycle(job.name, job.parents, known_jobs):
            problems.add("/parents", f"{job.name} would depend on itself through its parents (a cycle)")
    _constraints(job, problems)
    problems.raise_if_any()
    return job


def _closes_cycle(name: str, parents: Sequence[str], known: Mapping[str, Sequence[str]]) -> bool:
    """Whether `name` is among its own ancestors once its parents are `parents` (Chronos' job graph is a DAG)."""
    seen: set[str] = set()
    stack = list(parents)
    while stack:
        node = stack.pop()
        if node == name:
            return True
        if node not in seen:
            seen.add(node)
            stack.extend(known.get(node, ()))
    return False


def to_definition(job: ChronosJob, *, now: datetime, defaults: ChronosDefaults = ChronosDefaults()) -> JobDefinition:
    """Map a validated Chronos job. Zero or absent cpus/mem/disk take the configured defaults, as in Chronos."""
    problems = Problems(status=STATUS)
    constraints = _constraints(job, problems)
    problems.raise_if_any()
    labels = {lv.name: lv.value for lv in job.labels}
    if job.shell:
        command: tuple[str, ...] = ("/bin/sh", "-c", job.command) if job.command else ()
    else:
        command = (job.command, *job.arguments) if job.command else tuple(job.arguments)
    image = None
    if job.container is not None:
        c = job.container
        runtime: Literal["docker", "mesos"] = "docker" if c.type == "DOCKER" else "mesos"
        params = tuple((p.key, p.value) for p in c.parameters)
        image = ContainerImage(c.image, runtime, "docker", c.force_pull_image, False, params)
    schedules: tuple[ScheduleRule, ...] = ()
    if job.schedule is not None:
        deadline = duration_seconds(job.epsilon, "epsilon") if job.epsilon is not None else None
        schedules = (
            ScheduleRule(
                id="default",
                kind="iso8601",
                expression=job.schedule,
                timezone=job.schedule_time_zone,
                starting_deadline_s=deadline,
                concurrency=ConcurrencyPolicy.ALLOW if job.concurrent else ConcurrencyPolicy.FORBID,
                enabled=not job.disabled,
                anchor=now,
            ),
        )
    fetch = [Artifact(f.uri, f.executable, f.extract, f.cache) for f in job.fetch]
    fetch += [Artifact(u) for u in job.uris]
    return JobDefinition(
        name=job.name,
        source="chronos",
        command=command,
        request=to_request(
            job.cpus or defaults.cpus,
            job.mem or defaults.mem,
            job.gpus,
            labels,
            constraints,
            priority=1 if job.high_priority else 0,
        ),
        disk_mib=round(job.disk or defaults.disk),
        description=job.description,
        env={e.name: e.value for e in job.environment_variables},
        labels=labels,
        image=image,
        artifacts=tuple(fetch),
        retry=RetryRule(job.retries, defaults.failure_retry_s, job.soft_error),
        schedules=schedules,
        parents=tuple(job.parents),
        user=job.run_as_user,
        time_limit_s=float(job.max_completion_time) if job.max_completion_time > 0 else None,
        disabled=job.disabled,
        run_once_now=job.schedule is None and not job.parents,
    )


# ---------------------------------------------------------------------------------------------- run outcomes
@dataclass(frozen=True, slots=True)
class JobStats:
    """Chronos' per-job counters (also shown read-only in its JSON)."""

    success_count: int = 0
    error_count: int = 0
    last_success: datetime | None = None
    last_error: datetime | None = None
    errors_since_last_success: int = 0
    disabled: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    stats: JobStats
    retry_at: datetime | None  # when to start the next attempt; None = no retry
    fire_children: bool  # dependent jobs may start
    final: bool  # this run is over (success, or failure with no retry left)


def on_success(stats: JobStats, now: datetime) -> Outcome:
    new = replace(stats, success_count=stats.success_count + 1, last_success=now, errors_since_last_success=0)
    return Outcome(new, None, True, True)


def on_failure(
    stats: JobStats,
    rule: RetryRule,
    attempt: int,
    now: datetime,
    defaults: ChronosDefaults = ChronosDefaults(),
) -> Outcome:
    """Attempt `attempt` (0 = the first) failed. Chronos retries after the retry delay while attempt < retries, but
    only for a job with no error on record or whose last success is newer than its last error (a job that is
    failing already gets no retries). Once no retry is left: errorCount + 1, lastError, auto-disable after
    `disable_after_failures` consecutive failed runs (0 = never); softError lets children run all the same."""
    healthy = stats.last_error is None or (stats.last_success is not None and stats.last_success > stats.last_error)
    if attempt < rule.retries and healthy:
        return Outcome(stats, now + timedelta(seconds=rule.delay_s), False, False)
    failures = stats.errors_since_last_success + 1
    disable = defaults.disable_after_failures > 0 and failures >= defaults.disable_after_failures
    new = replace(
        stats,
        error_count=stats.error_count + 1,
        last_error=now,
        errors_since_last_success=failures,
        disabled=stats.disabled or disable,
    )
    return Outcome(new, None, rule.soft_error, True)


def remaining_repetitions(definition: JobDefinition, cursor: datetime) -> int | None:
    """How many ticks of the job's ISO 8601 schedule are left after `cursor` (None = forever, or no schedule); at 0
    Chronos disables the job."""
    if not definition.schedules or definition.schedules[0].kind != "iso8601":
        return None
    rule = definition.schedules[0]
    assert rule.anchor is not None
    return parse_repeating_interval(rule.expression, rule.timezone, now=rule.anchor).remaining_after(cursor)


# ---------------------------------------------------------------------------------------------- Chronos' shapes
def job_shape(
    job: ChronosJob,
    *,
    schedule: str | None,
    run_as: str,
    cpus: float,
    mem: float,
    disk: float,
    counters: Mapping[str, Any],
    disabled: bool,
    listing: bool = False,
) -> dict[str, Any]:
    """The job as Chronos 3's JobSerializer writes it: its fields, in its order, and no other. `schedule` is the
    schedule as it stands now (None for a dependent job); `run_as` the user it runs as (Chronos shows its `--user`
    when the job names none); `counters` successCount, errorCount, lastSuccess, lastError, errorsSinceLastSuccess.
    `listing`: GET /jobs, which copies `uris` into `fetch` (or the reverse), as Chronos' list did for old clients.

    Three fields that are not Chronos 3's appear only when the job sets them, because its poster asked for them:
    `gpus` (the patched build's, PR #810), `labels` (corral's per-job GPU behaviour) and `epsilon` (Chronos 2)."""
    fetch = [{"uri": f.uri, "executable": f.executable, "cache": f.cache, "extract": f.extract} for f in job.fetch]
    uris = list(job.uris)
    if listing:
        if not fetch:
            fetch = [{"uri": u, "executable": False, "cache": False, "extract": True} for u in uris]
        else:
            uris = [f.uri for f in job.fetch]
    out: dict[str, Any] = {
        "name": job.name,
        "command": job.command,
        "shell": job.shell,
        "executor": job.executor,
        "executorFlags": job.executor_flags,
        "taskInfoData": job.task_info_data,
        "retries": job.retries,
        "owner": job.owner,
        "ownerName": job.owner_name,
        "description": job.description,
        "successCount": counters["successCount"],
        "errorCount": counters["errorCount"],
        "lastSuccess": counters["lastSuccess"],
        "lastError": counters["lastError"],
        "cpus": cpus,
        "disk": disk,
        "mem": mem,
        "disabled": disabled,
        "softError": job.soft_error,
        "dataProcessingJobType": job.data_processing_job_type,
        "errorsSinceLastSuccess": counters["errorsSinceLastSuccess"],
        "fetch": fetch,
        "uris": uris,
        "environmentVariables": [{"name": e.name, "value": e.value} for e in job.environment_variables],
        "arguments": list(job.arguments),
        "highPriority": job.high_priority,
        "runAsUser": run_as,
        "concurrent": job.concurrent,
        "maxCompletionTime": job.max_completion_time,
    }
    if job.container is not None:
        c = job.container
        volumes = []
        for v in c.volumes:
            vol: dict[str, Any] = {} if v.host_path is None else {"hostPath": v.host_path}
            vol["containerPath"] = v.container_path
            if v.mode is not None:
                vol["mode"] = v.mode
            volumes.append(vol)
        out["container"] = {
            "type": c.type,
            "image": c.image,
            "network": c.network,
            "networkInfos": [],
            "volumes": volumes,
            "forcePullImage": c.force_pull_image,
            "parameters": [{"key": p.key, "value": p.value} for p in c.parameters],
        }
    out["constraints"] = [list(k) for k in job.constraints]
    if schedule is None:
        out["parents"] = list(job.parents)
    else:
        out["schedule"] = schedule
        out["scheduleTimeZone"] = job.schedule_time_zone
    if job.gpus:
        out["gpus"] = job.gpus
    if job.labels:
        out["labels"] = [{"name": lv.name, "value": lv.value} for lv in job.labels]
    if job.epsilon is not None:
        out["epsilon"] = job.epsilon
    return out


def quantile(ordered: Sequence[float], q: float) -> float:
    """Dropwizard's UniformSnapshot.getValue(q) (the snapshot Chronos' histograms serialise), over sorted values."""
    if not ordered:
        return 0.0
    pos = q * (len(ordered) + 1)
    if pos < 1:
        return float(ordered[0])
    if pos >= len(ordered):
        return float(ordered[-1])
    index = int(pos)
    lower, upper = ordered[index - 1], ordered[index]
    return float(lower + (pos - math.floor(pos)) * (upper - lower))


def histogram(durations_ms: Iterable[float]) -> dict[str, float | int]:
    """Chronos' job-stat histogram (HistogramSerializer): run times in milliseconds. Chronos wrote the median under
    `mean` too (`getValue(0.5)`, a bug); corral writes the mean there."""
    ordered = sorted(durations_ms)
    mean = sum(ordered) / len(ordered) if ordered else 0.0
    return {
        "75thPercentile": quantile(ordered, 0.75),
        "95thPercentile": quantile(ordered, 0.95),
        "98thPercentile": quantile(ordered, 0.98),
        "99thPercentile": quantile(ordered, 0.99),
        "median": quantile(ordered, 0.5),
        "mean": mean,
        "count": len(ordered),
    }


#: GET /v1/scheduler/stats/{percentile}: the names Chronos accepts, each a key of `histogram`.
PERCENTILES = ("99thPercentile", "98thPercentile", "95thPercentile", "75thPercentile", "median", "mean")


def dropwizard_histogram(durations_ms: Iterable[float]) -> dict[str, float | int]:
    """A histogram as Dropwizard's MetricsServlet (JSON, metrics 3) writes it, for /metrics."""
    ordered = sorted(durations_ms)
    n = len(ordered)
    mean = sum(ordered) / n if n else 0.0
    var = sum((x - mean) ** 2 for x in ordered) / (n - 1) if n > 1 else 0.0
    return {
        "count": n,
        "max": ordered[-1] if n else 0,
        "mean": mean,
        "min": ordered[0] if n else 0,
        "p50": quantile(ordered, 0.5),
        "p75": quantile(ordered, 0.75),
        "p95": quantile(ordered, 0.95),
        "p98": quantile(ordered, 0.98),
        "p99": quantile(ordered, 0.99),
        "p999": quantile(ordered, 0.999),
        "stddev": math.sqrt(var),
    }


def last_state(last_success: str, last_error: str) -> str:
    """Chronos' Exporter.getLastState: fresh (never ran), success or failure (the newer of the two)."""
    if not last_success and not last_error:
        return "fresh"
    if not last_success:
        return "failure"
    if not last_error:
        return "success"
    return "success" if last_success > last_error else "failure"  # both ISO 8601 in UTC: text order is time order


def job_state(queued: int, running: int) -> str:
    """Chronos' JobStats.getJobState: "N running" while tasks run, else queued or idle."""
    if running:
        return f"{running} running"
    return "queued" if queued else "idle"


def dot_graph(names: Sequence[str], edges: Sequence[tuple[str, str]]) -> str:
    """The dependency graph as JGraphT 1.0's DOTExporter writes it for Chronos (`GET /v1/scheduler/graph/dot`):
    vertices numbered from 1 in order, labelled with the job name; one `parent -> child` line per edge."""
    ids = {name: i for i, name in enumerate(names, start=1)}
    lines = ["digraph G {"]
    lines += [f'  {ids[n]} [ label="{_dot_text(n)}" ];' for n in names]
    lines += [f"  {ids[a]} -> {ids[b]};" for a, b in edges if a in ids and b in ids]
    return "\n".join(lines) + "\n}\n"


def _dot_text(name: str) -> str:
    return name.replace("\\", "\\\\").replace('"', '\\"')  # job names are [\w.-]+: never needed, kept safe


def csv_graph(nodes: Sequence[tuple[str, str, str]], edges: Sequence[tuple[str, str]]) -> str:
    """Chronos' Exporter (`GET /v1/scheduler/graph/csv`): `node,NAME,LAST_STATE,JOB_STATE` per job, then
    `link,PARENT,CHILD` per dependency."""
    rows = [f"node,{n},{last},{state}\n" for n, last, state in nodes]
    rows += [f"link,{a},{b}\n" for a, b in edges]
    return "".join(rows)
