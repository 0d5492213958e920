"""Chronos job JSON (`POST /v1/scheduler/iso8601`, `/v1/scheduler/dependency`): model with Chronos' defaults,
validation, mapping onto corral, and Chronos' retry / softError / auto-disable rules as pure functions.

    parse_job(data, now=..., known_jobs=...)  -> ChronosJob     (ObjectNotValid, status 400 as Chronos answered)
    to_definition(job, now, defaults)         -> JobDefinition

Differences from Chronos, on purpose:
* `gpus` (whole number) is accepted: upstream Chronos never merged GPU support (issue #764, PR #810), and the seed
  shows users running the patched build with exactly this field.
* a job with both `schedule` and `parents` is refused (Chronos decided by the endpoint it was posted to).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import Field

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
STATUS = 400  # Chronos answered bad jobs with 400 Bad Request


@dataclass(frozen=True, slots=True)
class ChronosDefaults:
    """Chronos' command-line defaults that shape jobs (`--mesos_task_cpu` and friends)."""

    cpus: float = 0.1
    mem: float = 128.0
    disk: float = 256.0
    failure_retry_s: float = 60.0  # --failure_retry
    disable_after_failures: int = 0  # --disable_after_failures; 0 = never


class ChronosVolume(MesosModel):
    container_path: str = Field(min_length=1)
    host_path: str | None = None
    mode: Literal["RO", "RW"] = "RW"


class Container(MesosModel):
    type: Literal["DOCKER", "MESOS"] = "DOCKER"
    image: str = Field(min_length=1)
    force_pull_image: bool = False
    network: Literal["BRIDGE", "HOST", "USER"] = "HOST"
    volumes: list[ChronosVolume] = []
    parameters: list[KeyValue] = []


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
    max_completion_time: int | None = Field(default=None, ge=1, le=MAX_SECONDS)
    constraints: list[list[str]] = []
    owner: str = ""
    description: str = ""


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


def parse_job(data: Any, *, now: datetime, known_jobs: Mapping[str, Any] | None = None) -> ChronosJob:
    """Validate a Chronos job. `now` (aware) anchors an empty schedule start; `known_jobs` (names of stored jobs)
    checks the parents; None skips that check. A submission (`known_jobs` given) is also held to the schedules'
    minimum period; a stored job (None) is read as it was admitted, so one stored by an older corral still loads."""
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
    if known_jobs is not None:
        unknown = sorted(p for p in set(job.parents) if p not in known_jobs)
        if unknown:
            problems.add("/parents", f"unknown parent jobs: {', '.join(unknown)}")
    if job.name in job.parents:
        problems.add("/parents", "a job cannot be its own parent")
    _constraints(job, problems)
    problems.raise_if_any()
    return job


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
        time_limit_s=float(job.max_completion_time) if job.max_completion_time is not None else None,
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
