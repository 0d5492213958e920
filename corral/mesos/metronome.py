"""Metronome job JSON (`POST /v1/jobs`): the model with Metronome's defaults, its validation with Metronome's error
texts in the 422 shape, the JSON echoed back, the mapping onto corral, and the run-level rules (restart policy,
dependencies, run ids).

    parse_job(data, known_jobs=...)  -> MetronomeJob      (ObjectNotValid: 422 with details[].path)
    job_to_json(job, now)            -> dict              (defaults filled in, EQ shown as IS, nextRunAt computed)
    to_definition(job)               -> JobDefinition     (corral's model)

The checks run in Metronome's order: the JSON schema (required properties, no unknown properties at the top level
or in `run`, types and bounds), then the rules that look at several fields. If the schema fails, the rules are not
checked (their messages would only repeat the schema's).
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field

from corral.mesos.common import (
    ID_SEGMENT,
    MAX_CPUS,
    MAX_GPUS,
    MAX_ID,
    MAX_MIB,
    MAX_SECONDS,
    Endpoint,
    FetchUri,
    KeyValue,
    MesosModel,
    check_command,
    check_env,
    check_labels,
    check_shell,
    check_text,
)
from corral.mesos.errors import Problems, validate_model
from corral.mesos.model import (
    Artifact,
    ContainerImage,
    JobDefinition,
    RestartRule,
    ScheduleRule,
    to_request,
)
from corral.model.errors import CorralError, InvalidRequest
from corral.model.resources import Constraint, GpuBehavior
from corral.schedule.clock import ConcurrencyPolicy
from corral.schedule.cron import DAY_OF_MONTH_MUST_EXIST, CronSchedule, CronSyntaxError

# Texts Metronome answers with (verbatim).
NO_COMMAND = "Cmd, Docker or UCR image must be specified"
DOCKER_AND_UCR = "Either Docker or UCR should be provided, but not both"
GPUS_WITH_DOCKER = "GPUs are not supported with Docker"
FILE_SECRETS_UCR_ONLY = "File based secrets are only supported by UCR"
SECRETS_UNDEFINED = "The following secrets are referenced, but undefined: "
SECRETS_UNREFERENCED = "The following secrets are defined, but not referenced: "
DEPENDENCIES_AND_SCHEDULES = "Jobs may not have both dependencies and schedules specified"
DEPENDENCIES_UNKNOWN = "Dependencies contain unknown jobs. unknown="
DEPENDENCIES_CYCLE = "Dependencies have a cycle."
ONE_SCHEDULE_ONLY = "Only one schedule supported at the moment"
NETWORKS_MIXED = "You may not mix host, container, or container/bridge networking. Only define one kind of network."
NETWORKS_ONE_HOST_OR_BRIDGE = "Only one host or container/bridge network modes are allowed"
NETWORKS_DOCKER_ONE = "Docker does not allow specification of multiple networks"
NETWORKS_CONTAINERS_ONLY = "Only containers may join container or bridge networks"
NETWORKS_NAMES_UNIQUE = "network names must be unique"
JOB_EXISTS = "Job with this id already exists"
JOB_NOT_FOUND = "Job not found"
SCHEDULE_NOT_FOUND = "Schedule not found"
RUN_NOT_FOUND = "Job Run not found"
ACTIVE_RUNS = "There are active job runs. Override with stopCurrentJobRuns=true"

JOB_ID = re.compile(rf"{ID_SEGMENT}(?:\.{ID_SEGMENT})*")
SCHEDULE_ID = re.compile(ID_SEGMENT)
RUN_ID = re.compile(r"\d{14}[A-Za-z0-9]{5}")
MIN_STARTING_DEADLINE_S = 60


class Docker(MesosModel):
    image: str = Field(min_length=1)
    force_pull_image: bool = False
    privileged: bool = False
    parameters: list[KeyValue] = []


class UcrImage(MesosModel):
    id: str = Field(min_length=1)
    kind: Literal["docker", "appc"] = "docker"
    force_pull: bool = False


class Ucr(MesosModel):
    image: UcrImage
    privileged: bool = False


class PlacementConstraint(MesosModel):
    attribute: str = Field(min_length=1)
    operator: Literal["IS", "EQ", "LIKE", "UNLIKE"]
    value: str | None = None


class Placement(MesosModel):
    constraints: list[PlacementConstraint] = []


class Restart(MesosModel):
    policy: Literal["NEVER", "ON_FAILURE"]
    active_deadline_seconds: int | None = Field(default=None, ge=0, le=MAX_SECONDS)  # Metronome reads any >= 0


class VolumeSpec(MesosModel):
    container_path: str = Field(min_length=1)
    host_path: str | None = None
    mode: Literal["RO", "RW"] | None = None
    secret: str | None = None


class NetworkSpec(MesosModel):
    mode: Literal["host", "container", "container/bridge"]
    name: str | None = None
    labels: dict[str, str] = {}


class SecretSource(MesosModel):
    source: str = Field(min_length=1)


class Run(MesosModel):
    model_config = ConfigDict(extra="forbid")

    cpus: float = Field(ge=0.01, le=MAX_CPUS)
    mem: float = Field(ge=32, le=MAX_MIB)
    disk: float = Field(ge=0, le=MAX_MIB)
    gpus: int = Field(default=0, ge=0, le=MAX_GPUS)
    cmd: str | None = Field(default=None, min_length=1)
    args: list[str] | None = None
    docker: Docker | None = None
    ucr: Ucr | None = None
    env: dict[str, Any] = {}  # a string, or {"secret": name}: checked by the rules
    secrets: dict[str, SecretSource] = {}
    placement: Placement = Placement()
    artifacts: list[FetchUri] = []
    max_launch_delay: int = Field(default=3600, ge=1, le=MAX_SECONDS)
    restart: Restart = Restart(policy="NEVER")
    user: str | None = None
    task_kill_grace_period_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    volumes: list[VolumeSpec] = []
    networks: list[NetworkSpec] = []


class ScheduleSpec(MesosModel):
    id: str
    cron: str
    timezone: str = "UTC"
    starting_deadline_seconds: int = Field(default=900, ge=1, le=MAX_SECONDS)
    concurrency_policy: Literal["ALLOW", "FORBID"] = "ALLOW"
    enabled: bool = True


class Dependency(MesosModel):
    id: str


class MetronomeJob(MesosModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    description: str | None = None
    labels: dict[str, str] = {}
    run: Run
    schedules: list[ScheduleSpec] = []
    dependencies: list[Dependency] = []


# --------------------------------------------------------------------------------------------------- validation
def check_job_id(text: str) -> str:
    """A job id from a URL path: Metronome answers 400 "Not a valid id: ..." for a malformed one."""
    if not JOB_ID.fullmatch(text):
        raise InvalidRequest("id", f"Not a valid id: {text}")
    return text


ID_RULE = "lowercase letters, digits and hyphens, not starting or ending with a hyphen"


def check_schedule(spec: ScheduleSpec, path: str, problems: Problems) -> None:
    if not SCHEDULE_ID.fullmatch(spec.id):
        problems.add(f"{path}/id", f"must be {ID_RULE}, got {spec.id!r}")
    try:
        CronSchedule.parse(spec.cron, "UTC")
    except CronSyntaxError as exc:
        # Metronome's own text for an impossible day stands alone; corral's texts name the cron field.
        problems.add(f"{path}/cron", exc.reason if exc.reason == DAY_OF_MONTH_MUST_EXIST else exc.message)
    try:
        CronSchedule.parse("* * * * *", spec.timezone)
    except InvalidRequest as exc:
        problems.add(f"{path}/timezone", exc.message)
    if spec.starting_deadline_seconds < MIN_STARTING_DEADLINE_S:
        problems.add(
            f"{path}/startingDeadlineSeconds",
            f"must be >= {MIN_STARTING_DEADLINE_S} seconds, got {spec.starting_deadline_seconds}",
        )


def _secret_refs(run: Run, problems: Problems) -> set[str]:
    refs: set[str] = set()
    for name, value in run.env.items():
        if isinstance(value, str):
            continue
        if isinstance(value, dict) and set(value) == {"secret"} and isinstance(value["secret"], str):
            refs.add(value["secret"])
        else:
            problems.add(f"/run/env/{name}", 'must be a string or {"secret": "<secret name>"}')
    for v in run.volumes:
        if v.secret is not None:
            refs.add(v.secret)
    return refs


def check_dependencies(
    job_id: str, parents: Sequence[str], known_jobs: Mapping[str, Sequence[str]] | None, problems: Problems
) -> None:
    """Unique, known and acyclic. `known_jobs` maps every stored job id to its own parents (None: not checked)."""
    if len(set(parents)) != len(parents):
        problems.add("/dependencies", f"must be unique, got {list(parents)}")
    if known_jobs is None:
        return
    unknown = sorted({p for p in parents if p not in known_jobs and p != job_id})
    if unknown:
        problems.add("/dependencies", f"{DEPENDENCIES_UNKNOWN}[{', '.join(unknown)}]")
        return
    graph = {**{k: list(v) for k, v in known_jobs.items()}, job_id: list(parents)}
    seen: set[str] = set()
    stack = list(parents)
    while stack:
        node = stack.pop()
        if node == job_id:
            problems.add("/dependencies", DEPENDENCIES_CYCLE)
            return
        if node not in seen:
            seen.add(node)
            stack.extend(graph.get(node, ()))


def check_networks(run: Run, problems: Problems) -> None:
    """Metronome's network rules (JobRunSpec's networkingValidation and Network's validator), in its words."""
    modes = {n.mode for n in run.networks}
    if len(modes) > 1:
        problems.add("/run/networks", NETWORKS_MIXED)
    if run.docker is None and run.ucr is None:
        if modes - {"host"}:
            problems.add("/run/networks", NETWORKS_CONTAINERS_ONLY)
    elif run.docker is not None and modes == {"container"} and len(run.networks) > 1:
        problems.add("/run/networks", NETWORKS_DOCKER_ONE)
    if modes - {"container"} and len(run.networks) > 1:
        problems.add("/run/networks", NETWORKS_ONE_HOST_OR_BRIDGE)
    names = [n.name for n in run.networks if n.name is not None]
    if len(set(names)) != len(names):
        problems.add("/run/networks", NETWORKS_NAMES_UNIQUE)
    for i, n in enumerate(run.networks):
        path = f"/run/networks/{i}"
        if n.mode == "host":
            if n.name is not None:
                problems.add(f"{path}/name", "must be empty for host network")
            if n.labels:
                problems.add(f"{path}/labels", "must be empty for host network")
        elif n.mode == "container/bridge":
            if n.name is not None:
                problems.add(f"{path}/name", "must be empty for container/bridge networks")
        elif not n.name:
            problems.add(f"{path}/name", "must not be empty for container networks")


def check_job(job: MetronomeJob, known_jobs: Mapping[str, Sequence[str]] | None, problems: Problems) -> None:
    run = job.run
    if len(job.id) > MAX_ID:
        problems.add("/id", f"must be at most {MAX_ID} characters, got {len(job.id)}")
    elif not JOB_ID.fullmatch(job.id):
        problems.add("/id", f"must be dot-separated segments of {ID_RULE}, got {job.id!r}")
    check_shell(problems, run.cmd, "/run/cmd")
    if run.args is not None:
        check_command(problems, run.args, "/run/args")
    check_env(problems, run.env, "/run/env")
    check_text(problems, job.description, "/description")
    check_labels(problems, job.labels, "/labels")
    if run.cmd is None and run.docker is None and run.ucr is None:
        problems.add("/run", NO_COMMAND)
    if run.docker is not None and run.ucr is not None:
        problems.add("/run", DOCKER_AND_UCR)
    if run.gpus > 0 and run.docker is not None:
        problems.add("/run/gpus", GPUS_WITH_DOCKER)
    refs = _secret_refs(run, problems)
    undefined = sorted(refs - set(run.secrets))
    unreferenced = sorted(set(run.secrets) - refs)
    if undefined:
        problems.add("/run/secrets", SECRETS_UNDEFINED + ", ".join(undefined))
    if unreferenced:
        problems.add("/run/secrets", SECRETS_UNREFERENCED + ", ".join(unreferenced))
    for i, v in enumerate(run.volumes):
        path = f"/run/volumes/{i}"
        if v.secret is not None:
            # Metronome refuses file secrets only beside Docker (a bare command's sandbox takes them too).
            if run.docker is not None:
                problems.add(path, FILE_SECRETS_UCR_ONLY)
            if v.host_path is not None or v.mode is not None:
                problems.add(path, "a secret volume takes only containerPath and secret")
        elif v.host_path is None or v.mode is None:
            problems.add(path, "a volume needs hostPath and mode (RO or RW), or a secret")
    check_networks(run, problems)
    for i, c in enumerate(run.placement.constraints):
        path = f"/run/placement/constraints/{i}"
        if c.value is None:
            problems.add(path, f"{c.operator} needs a value")
        elif c.operator in ("LIKE", "UNLIKE"):
            try:
                re.compile(c.value)
            except re.error as exc:
                problems.add(f"{path}/value", f"is not a valid regular expression: {c.value!r} ({exc})")
    if len(job.schedules) > 1:
        problems.add("/schedules", ONE_SCHEDULE_ONLY)
    for i, s in enumerate(job.schedules):
        check_schedule(s, f"/schedules/{i}", problems)
    if job.dependencies and job.schedules:
        problems.add("/", DEPENDENCIES_AND_SCHEDULES)
    check_dependencies(job.id, [d.id for d in job.dependencies], known_jobs, problems)


def parse_job(
    data: Any, *, known_jobs: Mapping[str, Sequence[str]] | None = None, url_id: str | None = None
) -> MetronomeJob:
    """Validate a Metronome job document. `known_jobs`: every stored job id -> its dependencies (to check the
    job's own dependencies are known and acyclic); None skips that check. `url_id` (PUT): the job is the one the URL
    names whatever id the body gives, as Metronome's `jsonWith(_.copy(id = id))` does; the body's id must still be
    a valid id (Metronome's schema checks it first)."""
    job = validate_model(MetronomeJob, data)
    problems = Problems()
    if url_id is not None and job.id != url_id:
        if not JOB_ID.fullmatch(job.id):
            problems.add("/id", f"must be dot-separated segments of {ID_RULE}, got {job.id!r}")
        job = job.model_copy(update={"id": url_id})
    check_job(job, known_jobs, problems)
    problems.raise_if_any()
    return job


def parse_schedule(data: Any, *, url_id: str | None = None) -> ScheduleSpec:
    """A schedule posted on its own (`POST /v1/jobs/{id}/schedules`). `url_id` (PUT): the schedule the URL names,
    whatever id the body gives (Metronome copies the URL's id over the body's)."""
    spec = validate_model(ScheduleSpec, data)
    problems = Problems()
    if url_id is not None and spec.id != url_id:
        if not SCHEDULE_ID.fullmatch(spec.id):
            problems.add("/id", f"must be {ID_RULE}, got {spec.id!r}")
        spec = spec.model_copy(update={"id": url_id})
    check_schedule(spec, "", problems)
    problems.raise_if_any()
    return spec


# ------------------------------------------------------------------------------------------ REST-level rules
EMBED_OPTIONS = ("activeRuns", "schedules", "history", "historySummary")


# Every route Metronome has. The unserved ones answer NOT_SUPPORTED in Metronome's error shape (routes registered
# from this list); docs/compat/metronome.md carries the same table, and a test keeps the two equal.
ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("GET", "/ping", True, '"pong" (text/plain)'),
    Endpoint("GET", "/info", False, "Metronome's version and configuration: corral has neither"),
    Endpoint("GET", "/leader", True, '{"leader": "host:port"}: the daemon is always its own leader'),
    Endpoint("GET", "/v1/metrics", False, "Dropwizard metrics of the JVM and Marathon internals"),
    Endpoint("GET", "/v1/queue", True, "`[{jobId, runs: [{runId}]}]`: runs waiting to start"),
    Endpoint("GET", "/v1/jobs", True, "`embed=...`; `corral=true`"),
    Endpoint("POST", "/v1/jobs", True, "201; 409 exists; 422 invalid"),
    Endpoint("GET", "/v1/jobs/{jobId}", True, "same `embed` values; `corral=true`; 404 `{id, message}`"),
    Endpoint("PUT", "/v1/jobs/{jobId}", True, "keeps the schedules; the URL's id wins"),
    Endpoint("DELETE", "/v1/jobs/{jobId}", True, "`stopCurrentJobRuns=true`; 409 busy or depended on"),
    Endpoint("GET", "/v1/jobs/{jobId}/schedules", True, "a list with at most one schedule"),
    Endpoint("POST", "/v1/jobs/{jobId}/schedules", True, "201; 409 a second schedule"),
    Endpoint("GET", "/v1/jobs/{jobId}/schedules/{scheduleId}", True, "404 `Schedule not found`"),
    Endpoint("PUT", "/v1/jobs/{jobId}/schedules/{scheduleId}", True, "the URL's schedule id wins over the body's"),
    Endpoint("DELETE", "/v1/jobs/{jobId}/schedules/{scheduleId}", True, "200 with an empty body"),
    Endpoint("POST", "/v1/jobs/{jobId}/runs", True, "201 a manual run"),
    Endpoint("GET", "/v1/jobs/{jobId}/runs", True, "active runs; `corral=true` adds `trigger` and `reason`"),
    Endpoint("GET", "/v1/jobs/{jobId}/runs/{runId}", True, "finished runs too (while kept); `corral=true`"),
    Endpoint("POST", "/v1/jobs/{jobId}/runs/{runId}/actions/stop", True, "kills the run's task"),
    Endpoint("POST", "/v0/scheduled-jobs", True, "the older API: a job with its schedules (same as POST /v1/jobs)"),
    Endpoint("PUT", "/v0/scheduled-jobs/{jobId}", True, "the older API: replaces the job and its schedules"),
    Endpoint("GET", "/public/{file}", False, "Metronome's bundled API documents (RAML, JSON schemas)"),
)


def not_supported(method: str, path: str) -> MetronomeError:
    """A route of Metronome's that corral does not serve: 501 in Metronome's `{"message"}` shape."""
    return MetronomeError(501, {"message": f"{method} {path} is not supported by corral"})


class MetronomeError(CorralError):
    """An answer other than 422 that Metronome's API gives for jobs and schedules: `status` and the JSON `body`."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(str(body.get("message", "")))
        self.status = status
        self.body = body


def job_not_found(job_id: str) -> MetronomeError:
    return MetronomeError(404, {"id": job_id, "message": JOB_NOT_FOUND})


def job_exists() -> MetronomeError:
    return MetronomeError(409, {"message": JOB_EXISTS})


def parse_embed(values: Sequence[str]) -> frozenset[str]:
    """`?embed=` values (repeated or comma-separated); unknown ones are a 400."""
    wanted = {v.strip() for value in values for v in value.split(",") if v.strip()}
    unknown = sorted(wanted - set(EMBED_OPTIONS))
    if unknown:
        raise MetronomeError(
            400,
            {"message": f"Unknown embed options: {', '.join(unknown)}. Valid options are: {', '.join(EMBED_OPTIONS)}"},
        )
    return frozenset(wanted)


def add_schedule(job: MetronomeJob, spec: ScheduleSpec) -> MetronomeJob:
    """`POST /v1/jobs/{id}/schedules`: a job has at most one schedule, and none when it has dependencies."""
    if any(s.id == spec.id for s in job.schedules):
        raise MetronomeError(409, {"message": f"A schedule with id {spec.id} already exists"})
    if job.schedules:
        raise MetronomeError(409, {"message": ONE_SCHEDULE_ONLY})
    if job.dependencies:
        problems = Problems()
        problems.add("/", DEPENDENCIES_AND_SCHEDULES)
        problems.raise_if_any()
    return job.model_copy(update={"schedules": [spec]})


def replace_job(old: MetronomeJob, new: MetronomeJob) -> MetronomeJob:
    """`PUT /v1/jobs/{id}` replaces the spec but keeps the job's schedules (they have their own endpoints)."""
    return new.model_copy(update={"schedules": list(old.schedules)})


GPU_BEHAVIOR_SETTINGS = ("undefined", "restricted", "unrestricted", "preferential")


def gpu_scheduling_behavior(value: str | None) -> GpuBehavior | None:
    """The global GPU behaviour from `METRONOME_GPU_SCHEDULING_BEHAVIOR` (None: unset, no GPU opt-in). An unknown
    value stops the daemon at start-up, as in Marathon; corral adds `preferential`."""
    if value is None:
        return None
    if value not in GPU_BEHAVIOR_SETTINGS:
        raise InvalidRequest(
            "gpu_scheduling_behavior",
            f"Setting {value} is invalid. Valid settings are {', '.join(GPU_BEHAVIOR_SETTINGS)}",
        )
    return GpuBehavior(value)


# ---------------------------------------------------------------------------------------------------- echoing
def _instant(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def schedule_to_json(spec: ScheduleSpec, now: datetime | None) -> dict[str, Any]:
    out = spec.model_dump(by_alias=True)
    if now is not None and spec.enabled:
        nxt = CronSchedule.parse(spec.cron, spec.timezone).next_after(now)
        if nxt is not None:
            out["nextRunAt"] = _instant(nxt)
    return out


def job_to_json(job: MetronomeJob, now: datetime | None = None) -> dict[str, Any]:
    """The job as Metronome echoes it: defaults filled in, `EQ` shown as `IS`, `nextRunAt` per schedule."""
    out = job.model_dump(by_alias=True, exclude_none=True)
    for c in out["run"]["placement"]["constraints"]:
        if c["operator"] == "EQ":
            c["operator"] = "IS"
    out["schedules"] = [schedule_to_json(s, now) for s in job.schedules]
    return out


# ---------------------------------------------------------------------------------------------------- mapping
def _image(run: Run) -> ContainerImage | None:
    if run.docker is not None:
        d = run.docker
        params = tuple((p.key, p.value) for p in d.parameters)
        return ContainerImage(d.image, "docker", "docker", d.force_pull_image, d.privileged, params)
    if run.ucr is not None:
        u = run.ucr
        return ContainerImage(u.image.id, "mesos", u.image.kind, u.image.force_pull, u.privileged)
    return None


def _command(cmd: str | None, args: Sequence[str] | None) -> tuple[str, ...]:
    if cmd is not None:
        # Mesos runs a shell command as `/bin/sh -c cmd` and ignores arguments then.
        return ("/bin/sh", "-c", cmd)
    return tuple(args or ())


def to_schedule_rule(spec: ScheduleSpec) -> ScheduleRule:
    return ScheduleRule(
        id=spec.id,
        kind="cron",
        expression=spec.cron,
        timezone=spec.timezone,
        starting_deadline_s=float(spec.starting_deadline_seconds),
        concurrency=ConcurrencyPolicy(spec.concurrency_policy),
        enabled=spec.enabled,
    )


def to_definition(job: MetronomeJob) -> JobDefinition:
    run = job.run
    constraints = tuple(
        Constraint.parse("hostname" if c.attribute in ("@hostname", "hostname") else c.attribute, c.operator, c.value)
        for c in run.placement.constraints
        if c.value is not None
    )
    return JobDefinition(
        name=job.id,
        source="metronome",
        command=_command(run.cmd, run.args),
        request=to_request(run.cpus, run.mem, run.gpus, job.labels, constraints),
        disk_mib=round(run.disk),
        description=job.description or "",
        env={k: v for k, v in run.env.items() if isinstance(v, str)},
        secret_env={k: v["secret"] for k, v in run.env.items() if isinstance(v, dict)},
        labels=dict(job.labels),
        image=_image(run),
        artifacts=tuple(Artifact(a.uri, a.executable, a.extract, a.cache) for a in run.artifacts),
        restart=RestartRule(
            run.restart.policy,
            float(run.restart.active_deadline_seconds) if run.restart.active_deadline_seconds is not None else None,
        ),
        schedules=tuple(to_schedule_rule(s) for s in job.schedules),
        parents=tuple(d.id for d in job.dependencies),
        user=run.user,
        kill_grace_s=run.task_kill_grace_period_seconds,
        max_launch_delay_s=float(run.max_launch_delay),
    )


# ------------------------------------------------------------------------------------------------------- runs
TaskStatus = Literal["TASK_FINISHED", "TASK_FAILED", "TASK_KILLED", "TASK_ERROR", "TASK_LOST"]
RunOutcome = Literal["SUCCESS", "FAILED", "RELAUNCH"]


def after_task(rule: RestartRule, status: TaskStatus, run_created_at: datetime, now: datetime) -> RunOutcome:
    """What a run does when its task ends. FINISHED is success; anything else (killed included) is a failure,
    relaunched at once under ON_FAILURE while the active deadline (counted from the run's creation) has not passed;
    there is no retry counter and no back-off, as in Metronome."""
    if status == "TASK_FINISHED":
        return "SUCCESS"
    if rule.policy == "ON_FAILURE":
        deadline = rule.active_deadline_s
        if deadline is None or (now - run_created_at).total_seconds() < deadline:
            return "RELAUNCH"
    return "FAILED"


def dependencies_met(
    parents_latest: Mapping[str, tuple[str, datetime | None] | None],
    child_last_success: datetime | None,
    child_last_start: datetime | None,
) -> bool:
    """Metronome's trigger for a dependent job: every parent's latest run is SUCCESS and finished after the child's
    last success, and the child has not been started since the last of those parents finished.
    `parents_latest`: parent id -> (status of its latest run, when it finished), or None if it never ran."""
    finishes: list[datetime] = []
    for latest in parents_latest.values():
        if latest is None or latest[0] != "SUCCESS" or latest[1] is None:
            return False
        if child_last_success is not None and latest[1] <= child_last_success:
            return False
        finishes.append(latest[1])
    if not finishes:
        return False
    return child_last_start is None or child_last_start < max(finishes)


_RUN_ID_CHARS = string.ascii_letters + string.digits


def new_run_id(now: datetime, rng: random.Random) -> str:
    """`yyyyMMddHHmmss` (UTC) and five letters or digits, as Metronome names runs."""
    return now.astimezone(UTC).strftime("%Y%m%d%H%M%S") + "".join(rng.choice(_RUN_ID_CHARS) for _ in range(5))
