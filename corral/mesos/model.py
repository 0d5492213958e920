"""What Metronome jobs, Chronos jobs and Marathon apps become in corral: plain, frozen dataclasses the daemon can
store, built only by `corral.mesos.{metronome,chronos,marathon}` (the edge where outside units are converted).

    Metronome job  --\\                          /-- JobSpec (one run's attempt, via `job_spec`)
    Chronos job    ----> JobDefinition --------+
    Marathon app   ----> ServiceDefinition      \\-- schedules, restart/retry rules, parents: for the daemon

Resources become a `Request` in corral's integer units: CPUs to milli-CPU (rounded, at least 1), memory to whole MiB
(rounded up, so a job never gets less than it asked for), `gpus` (a whole number in all three formats) to that many
whole GPUs. Disk has no dimension in corral's engine and is kept as `disk_mib` for the executor. Labels are carried
on the request, so `GPU_SCHEDULING_BEHAVIOR` overrides the global behaviour per job, as in Marathon.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Literal

from corral.jobs.model import JobSpec
from corral.model.errors import InvalidRequest
from corral.model.resources import MILLI_PER_GPU, Constraint, Request
from corral.schedule.clock import ConcurrencyPolicy, Schedule, TickPolicy
from corral.schedule.cron import CronSchedule
from corral.schedule.iso8601 import parse_duration, parse_repeating_interval

Source = Literal["metronome", "chronos", "marathon"]


@dataclass(frozen=True, slots=True)
class ContainerImage:
    """A job that names an image: it runs only through a configured container runtime (refused at admission
    otherwise). `runtime` is the source's containerizer: "docker" (Docker containerizer) or "mesos" (UCR)."""

    image: str
    runtime: Literal["docker", "mesos"]
    kind: Literal["docker", "appc"] = "docker"
    force_pull: bool = False
    privileged: bool = False
    parameters: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Artifact:
    uri: str
    executable: bool = False
    extract: bool = True
    cache: bool = False


@dataclass(frozen=True, slots=True)
class RestartRule:
    """Metronome's restart policy: NEVER, or ON_FAILURE until `active_deadline_s` after the run was created."""

    policy: Literal["NEVER", "ON_FAILURE"] = "NEVER"
    active_deadline_s: float | None = None


@dataclass(frozen=True, slots=True)
class RetryRule:
    """Chronos' retries: up to `retries` more attempts, `delay_s` apart; `soft_error` fires children even after the
    final failure."""

    retries: int = 0
    delay_s: float = 60.0
    soft_error: bool = False


@dataclass(frozen=True, slots=True)
class ScheduleRule:
    id: str
    kind: Literal["cron", "iso8601"]
    expression: str
    timezone: str = "UTC"  # cron: IANA zone; iso8601: scheduleTimeZone ("" = the start's own offset)
    starting_deadline_s: float | None = 900.0
    concurrency: ConcurrencyPolicy = ConcurrencyPolicy.ALLOW
    enabled: bool = True
    #: iso8601 with an empty start: the instant "now" meant when the job was submitted (so the schedule is stable)
    anchor: datetime | None = None

    def schedule(self) -> Schedule:
        if self.kind == "cron":
            return CronSchedule.parse(self.expression, self.timezone)
        if self.anchor is None:
            raise InvalidRequest("schedule", "an ISO 8601 schedule needs the submission time as its anchor")
        return parse_repeating_interval(self.expression, self.timezone, now=self.anchor)

    def tick_policy(self) -> TickPolicy:
        return TickPolicy(self.starting_deadline_s, self.concurrency, self.enabled)


@dataclass(frozen=True, slots=True)
class JobDefinition:
    """A named, reusable batch job (Metronome job or Chronos job)."""

    name: str
    source: Source
    command: tuple[str, ...]  # argv; () = the image's own entrypoint
    request: Request
    disk_mib: int = 0
    description: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Mapping[str, str] = field(default_factory=dict)  # env var -> secret name (resolved at launch)
    labels: Mapping[str, str] = field(default_factory=dict)
    image: ContainerImage | None = None
    artifacts: tuple[Artifact, ...] = ()
    restart: RestartRule = RestartRule()
    retry: RetryRule = RetryRule()
    schedules: tuple[ScheduleRule, ...] = ()
    parents: tuple[str, ...] = ()
    user: str | None = None
    kill_grace_s: float | None = None
    time_limit_s: float | None = None  # Chronos maxCompletionTime
    max_launch_delay_s: float | None = None  # Metronome: how long a run may wait for resources
    disabled: bool = False
    run_once_now: bool = False  # Chronos: neither schedule nor parents = one run at submission


class ConstraintOperator(StrEnum):
    UNIQUE = "UNIQUE"  # no two instances share the field's value
    CLUSTER = "CLUSTER"  # all instances on the given value (or on the first instance's value)
    GROUP_BY = "GROUP_BY"  # spread evenly over the field's values (optionally: over at least n values)
    LIKE = "LIKE"  # the value matches the regular expression (whole string)
    UNLIKE = "UNLIKE"  # the value is absent or does not match
    MAX_PER = "MAX_PER"  # at most n instances per value
    IS = "IS"  # the value equals (numbers: within 0.001)


@dataclass(frozen=True, slots=True)
class ServiceConstraint:
    """A Marathon constraint `[field, operator, value?]` (parsed and checked by `corral.mesos.constraints`)."""

    field: str
    operator: ConstraintOperator
    value: str | None = None

    def __str__(self) -> str:
        return f"{self.field} {self.operator.value}" + (f" {self.value}" if self.value is not None else "")


@dataclass(frozen=True, slots=True)
class HealthCheckRule:
    protocol: Literal["HTTP", "HTTPS", "TCP", "COMMAND", "MESOS_HTTP", "MESOS_HTTPS", "MESOS_TCP"]
    grace_period_s: float = 300.0
    interval_s: float = 60.0
    timeout_s: float = 20.0
    max_consecutive_failures: int = 3  # 0 = never kill for failing checks
    path: str = "/"
    port_index: int | None = None
    port: int | None = None
    command: str | None = None
    delay_s: float = 15.0


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    backoff_s: float = 1.0
    factor: float = 1.15
    max_delay_s: float = 300.0


@dataclass(frozen=True, slots=True)
class UpgradeRule:
    minimum_health_capacity: float = 1.0
    maximum_over_capacity: float = 1.0


@dataclass(frozen=True, slots=True)
class ServiceDefinition:
    """A long-running service (Marathon app): keep `instances` running."""

    name: str
    command: tuple[str, ...]
    request: Request
    instances: int = 1
    disk_mib: int = 0
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    image: ContainerImage | None = None
    artifacts: tuple[Artifact, ...] = ()
    backoff: BackoffPolicy = BackoffPolicy()
    health_checks: tuple[HealthCheckRule, ...] = ()
    constraints: tuple[ServiceConstraint, ...] = ()
    kill_selection: Literal["YOUNGEST_FIRST", "OLDEST_FIRST"] = "YOUNGEST_FIRST"
    upgrade: UpgradeRule = UpgradeRule()
    ports: tuple[int, ...] = ()
    require_ports: bool = False
    user: str | None = None
    kill_grace_s: float | None = None


def to_request(
    cpus: float,
    mem: float,
    gpus: int,
    labels: Mapping[str, str],
    constraints: tuple[Constraint, ...] = (),
    priority: int = 0,
) -> Request:
    """Mesos units (fractional CPUs, MiB as a float, whole GPUs) to a corral `Request`."""
    return Request(
        cpu_milli=max(1, round(cpus * 1000)),
        memory_mib=math.ceil(mem),
        gpu_count=gpus,
        gpu_milli=MILLI_PER_GPU if gpus else 0,
        constraints=constraints,
        labels=dict(labels),
        priority=priority,
    )


def job_spec(definition: JobDefinition, *, user: str, uid: int, gid: int, cwd: str = "/") -> JobSpec:
    """One attempt of a job definition as corral's `JobSpec`. Jobs that need a container runtime are refused here;
    the daemon routes them to one, or refuses them at admission."""
    if definition.image is not None:
        raise InvalidRequest(
            "container",
            f"job {definition.name} names the image {definition.image.image!r}: "
            "it needs a configured container runtime",
        )
    return JobSpec(
        command=definition.command,
        request=definition.request,
        user=user,
        uid=uid,
        gid=gid,
        name=definition.name,
        retries=definition.retry.retries,
        time_limit_s=definition.time_limit_s,
        env=dict(definition.env),
        cwd=cwd,
    )


def duration_seconds(text: str, field_name: str) -> float:
    """An ISO 8601 duration with no calendar part (Chronos `epsilon`) in seconds."""
    d = parse_duration(text, field_name)
    if d.years or d.months:
        raise InvalidRequest(field_name, f"{text!r}: a window cannot be in months or years")
    return (d.weeks * 7 + d.days) * 86400 + float(d.time_seconds)
