"""Marathon app JSON (`POST /v2/apps`): model with Marathon's defaults, validation in the 422 shape, mapping onto a
corral `ServiceDefinition`.

    parse_app(data)     -> MarathonApp          (ObjectNotValid)
    to_service(app)     -> ServiceDefinition

Unknown properties are ignored (an app exported with `GET /v2/apps` carries read-only ones such as `tasksRunning`).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field

from corral.mesos.common import (
    ID_SEGMENT,
    MAX_CPUS,
    MAX_GPUS,
    MAX_ID,
    MAX_INSTANCES,
    MAX_MIB,
    MAX_SECONDS,
    FetchUri,
    MesosModel,
    check_command,
    check_env,
    check_labels,
    check_shell,
)
from corral.mesos.constraints import parse_constraints
from corral.mesos.errors import Problems, validate_model
from corral.mesos.model import (
    Artifact,
    BackoffPolicy,
    ConstraintOperator,
    ContainerImage,
    HealthCheckRule,
    ServiceDefinition,
    UpgradeRule,
    to_request,
)
from corral.model.resources import Constraint

GPU_NEEDS_MESOS = "GPU resources only work with the Mesos containerizer"
GPU_FEATURE_OFF = "Feature gpu_resources is not enabled. Enable with --enable_features gpu_resources"
NO_COMMAND = "AppDefinition must either contain one of 'cmd' or 'args', and/or a 'container'."
CMD_AND_ARGS = "AppDefinition must either contain a 'cmd' or 'args', but not both."
SINGLE_INSTANCE_LABEL = "MARATHON_SINGLE_INSTANCE_APP"

SEGMENT = re.compile(ID_SEGMENT)


def resolve_id(raw: str) -> str | None:
    """Marathon's canonical path of an app id, relative to the root group as Marathon resolves it (`PathId`): empty
    segments dropped, `.` skipped, `..` up one (never above the root). `./web`, `web`, `/web/` and `a/../web` are all
    `/web`. None when a segment is not a valid id segment, or nothing is left (the root is a group, not an app)."""
    path: list[str] = []
    for segment in raw.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            path = path[:-1]
        elif SEGMENT.fullmatch(segment):
            path.append(segment)
        else:
            return None
    return "/" + "/".join(path) if path else None


class CommandCheck(MesosModel):
    value: str = Field(min_length=1)


class HealthCheck(MesosModel):
    protocol: Literal["HTTP", "HTTPS", "TCP", "COMMAND", "MESOS_HTTP", "MESOS_HTTPS", "MESOS_TCP"] = "HTTP"
    path: str = "/"
    port_index: int | None = Field(default=None, ge=0, le=65535)
    port: int | None = Field(default=None, ge=0, le=65535)
    command: CommandCheck | None = None
    grace_period_seconds: int = Field(default=300, ge=0, le=MAX_SECONDS)
    interval_seconds: int = Field(default=60, ge=1, le=MAX_SECONDS)
    timeout_seconds: int = Field(default=20, ge=1, le=MAX_SECONDS)
    max_consecutive_failures: int = Field(default=3, ge=0, le=2**31 - 1)
    delay_seconds: int = Field(default=15, ge=0, le=MAX_SECONDS)


class UpgradeStrategy(MesosModel):
    minimum_health_capacity: float = Field(default=1.0, ge=0, le=1)
    maximum_over_capacity: float = Field(default=1.0, ge=0, le=1)


class DockerImage(MesosModel):
    image: str = Field(min_length=1)
    force_pull_image: bool = False
    privileged: bool = False


class Container(MesosModel):
    type: Literal["DOCKER", "MESOS"] = "DOCKER"
    docker: DockerImage | None = None


class PortDefinition(MesosModel):
    port: int = Field(default=0, ge=0, le=65535)
    name: str | None = None
    protocol: str = "tcp"


class SecretSource(MesosModel):
    source: str = Field(min_length=1)


class MarathonApp(MesosModel):
    id: str
    cmd: str | None = Field(default=None, min_length=1)
    args: list[str] | None = None
    instances: int = Field(default=1, ge=0, le=MAX_INSTANCES)
    cpus: float = Field(default=1.0, ge=0.001, le=MAX_CPUS)
    mem: float = Field(default=128.0, ge=0, le=MAX_MIB)
    disk: float = Field(default=0.0, ge=0, le=MAX_MIB)
    gpus: int = Field(default=0, ge=0, le=MAX_GPUS)
    constraints: list[Any] = []  # [[field, OP, value?]]: checked by corral.mesos.constraints
    backoff_seconds: float = Field(default=1.0, ge=0, le=MAX_SECONDS)
    backoff_factor: float = Field(default=1.15, ge=1.0, le=1000.0)
    max_launch_delay_seconds: float = Field(default=300.0, ge=0, le=MAX_SECONDS)
    health_checks: list[HealthCheck] = []
    upgrade_strategy: UpgradeStrategy | None = None
    kill_selection: Literal["YOUNGEST_FIRST", "OLDEST_FIRST"] = "YOUNGEST_FIRST"
    unreachable_strategy: Any = None
    container: Container | None = None
    port_definitions: list[PortDefinition] = []
    require_ports: bool = False
    env: dict[str, Any] = {}
    secrets: dict[str, SecretSource] = {}
    labels: dict[str, str] = {}
    fetch: list[FetchUri] = []
    accepted_resource_roles: list[str] = []
    user: str | None = None
    residency: Any = None
    task_kill_grace_period_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)


def _check_unreachable(value: Any, problems: Problems) -> None:
    if value is None or value == "disabled":
        return
    if not isinstance(value, dict):
        problems.add("/unreachableStrategy", 'must be "disabled" or {inactiveAfterSeconds, expungeAfterSeconds}')
        return
    inactive = value.get("inactiveAfterSeconds", 0)
    expunge = value.get("expungeAfterSeconds", 0)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (inactive, expunge)):
        problems.add("/unreachableStrategy", "inactiveAfterSeconds and expungeAfterSeconds must be whole numbers >= 0")
    elif inactive > expunge:
        problems.add("/unreachableStrategy", "inactiveAfterSeconds must be <= expungeAfterSeconds")


def parse_app(data: Any, *, gpu_feature_enabled: bool = True) -> MarathonApp:
    """Validate a Marathon app; the app returned carries its canonical id ("/web" for "web" or "./web").
    `gpu_feature_enabled` False refuses GPU apps as Marathon without
    `--enable_features gpu_resources` did; corral's daemon keeps them pending with a reason instead."""
    app = validate_model(MarathonApp, data)
    problems = Problems()
    resolved = resolve_id(app.id)
    if len(app.id) > MAX_ID:
        problems.add("/id", f"must be at most {MAX_ID} characters, got {len(app.id)}")
    elif resolved is None:
        problems.add(
            "/id",
            f"must be a path of segments of lowercase letters, digits and hyphens (not starting or ending with a "
            f"hyphen; '.' and '..' are relative to the root group), naming an app below '/', got {app.id!r}",
        )
    else:
        app = app.model_copy(update={"id": resolved})
    has_image = app.container is not None and app.container.docker is not None
    if app.cmd is None and app.args is None and not has_image:
        problems.add("/", NO_COMMAND)
    if app.cmd is not None and app.args is not None:
        problems.add("/", CMD_AND_ARGS)
    if app.gpus > 0:
        if not gpu_feature_enabled:
            problems.add("/gpus", GPU_FEATURE_OFF)
        if app.container is not None and app.container.type == "DOCKER":
            problems.add("/gpus", GPU_NEEDS_MESOS)
    for i, hc in enumerate(app.health_checks):
        path = f"/healthChecks/{i}"
        if hc.protocol == "COMMAND" and hc.command is None:
            problems.add(path, "a COMMAND health check needs command.value")
        if hc.protocol != "COMMAND" and hc.port_index is not None and hc.port is not None:
            problems.add(path, "give portIndex or port, not both")
        if hc.port_index is not None and app.port_definitions and hc.port_index >= len(app.port_definitions):
            problems.add(f"{path}/portIndex", f"there are only {len(app.port_definitions)} port definitions")
    for name, value in app.env.items():
        ok = isinstance(value, str) or (
            isinstance(value, dict) and set(value) == {"secret"} and value["secret"] in app.secrets
        )
        if not ok:
            problems.add(f"/env/{name}", 'must be a string or {"secret": "<name of a defined secret>"}')
    check_shell(problems, app.cmd, "/cmd")
    if app.args is not None:
        check_command(problems, app.args, "/args")
    check_env(problems, app.env, "/env")
    check_labels(problems, app.labels, "/labels")
    _check_unreachable(app.unreachable_strategy, problems)
    parse_constraints(app.constraints, "/constraints", problems)
    problems.raise_if_any()
    return app


def upgrade_rule(app: MarathonApp) -> UpgradeRule:
    if app.upgrade_strategy is not None:
        return UpgradeRule(app.upgrade_strategy.minimum_health_capacity, app.upgrade_strategy.maximum_over_capacity)
    if app.residency is not None:
        return UpgradeRule(0.5, 0.0)
    if app.labels.get(SINGLE_INSTANCE_LABEL, "").lower() == "true":
        return UpgradeRule(0.0, 0.0)
    return UpgradeRule()


def to_service(app: MarathonApp) -> ServiceDefinition:
    problems = Problems()
    constraints = parse_constraints(app.constraints, "/constraints", problems)
    problems.raise_if_any()
    # Attribute rules the placement engine understands travel on the request too; the instance-spreading ones
    # (UNIQUE, MAX_PER, GROUP_BY, CLUSTER) need the placed instances and are checked by the daemon.
    simple = tuple(
        Constraint.parse("hostname" if c.field in ("@hostname", "hostname") else c.field, c.operator.value, c.value)
        for c in constraints
        if c.operator in (ConstraintOperator.IS, ConstraintOperator.LIKE, ConstraintOperator.UNLIKE)
        and c.value is not None
    )
    image = None
    if app.container is not None and app.container.docker is not None:
        d = app.container.docker
        runtime: Literal["docker", "mesos"] = "docker" if app.container.type == "DOCKER" else "mesos"
        image = ContainerImage(d.image, runtime, "docker", d.force_pull_image, d.privileged)
    command = ("/bin/sh", "-c", app.cmd) if app.cmd is not None else tuple(app.args or ())
    return ServiceDefinition(
        name=app.id.lstrip("/"),
        command=command,
        request=to_request(app.cpus, app.mem, app.gpus, app.labels, simple),
        instances=app.instances,
        disk_mib=round(app.disk),
        env={k: v for k, v in app.env.items() if isinstance(v, str)},
        secret_env={k: app.secrets[v["secret"]].source for k, v in app.env.items() if isinstance(v, dict)},
        labels=dict(app.labels),
        image=image,
        artifacts=tuple(Artifact(f.uri, f.executable, f.extract, f.cache) for f in app.fetch),
        backoff=BackoffPolicy(app.backoff_seconds, app.backoff_factor, app.max_launch_delay_seconds),
        health_checks=tuple(
            HealthCheckRule(
                protocol=h.protocol,
                grace_period_s=float(h.grace_period_seconds),
                interval_s=float(h.interval_seconds),
                timeout_s=float(h.timeout_seconds),
                max_consecutive_failures=h.max_consecutive_failures,
                path=h.path,
                # Marathon checks the first port when an HTTP/TCP check names neither a port nor a port index.
                port_index=(h.port_index or 0) if h.port is None and h.protocol != "COMMAND" else None,
                port=h.port,
                command=h.command.value if h.command is not None else None,
                delay_s=float(h.delay_seconds),
            )
            for h in app.health_checks
        ),
        constraints=constraints,
        kill_selection=app.kill_selection,
        upgrade=upgrade_rule(app),
        ports=tuple(p.port for p in app.port_definitions),
        require_ports=app.require_ports,
        user=app.user,
        kill_grace_s=app.task_kill_grace_period_seconds,
    )
