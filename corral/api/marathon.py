"""Marathon's REST API under `/marathon` (a Marathon client's base URL is http://HOST:PORT/marathon).

    GET    /ping                                  "pong" (text/plain)
    GET    /v2/info, GET /v2/leader               this daemon as a Marathon leader
    POST   /v2/apps                               create (201, the app); 409 when the id exists; 422 invalid
    GET    /v2/apps[?embed=apps.tasks&cmd=&id=&label=]   {"apps": [...]}: the caller's apps (root: all)
    GET    /v2/apps/{id}                          {"app": {..., "tasks": [...]}}
    PUT    /v2/apps (a list), PATCH               update or create each (all checked first)
    PUT    /v2/apps/{id}, PATCH                   update; fields not given keep their values ({"instances": 3}
                                                  scales; {"version": V} rolls back); creates when there is none
    DELETE /v2/apps/{id}                          remove it, kill its instances
    POST   /v2/apps/{id}/restart                  replace every instance (a new version)
    GET    /v2/apps/{id}/tasks                    {"tasks": [...]}: instances with ports and health
    DELETE /v2/apps/{id}/tasks[/{task}]?scale=    kill instances (scale=true: and shrink the app by as many)
    GET    /v2/apps/{id}/versions[/{version}]     the versions kept, newest first; the app at one of them
    GET    /v2/tasks, POST /v2/tasks/delete       every visible instance; kill instances by id
    GET    /v2/deployments, DELETE .../{id}       apps not yet at their target; cancel one (a rollback)
    GET    /v2/queue, DELETE /v2/queue/{id}/delay instances waiting to launch; reset the launch delay (204)
    GET    /v2/events                             Server-Sent Events: task status, health, deployments, app removal
    everything else of Marathon's v2 API          501 {"message": "... is not supported by corral ..."}
                                                  (`NOT_SUPPORTED`; docs/compat/marathon.md has the whole table)

Answers carry exactly Marathon's fields. corral's own view (the job behind each task, its GPUs, why instances wait)
is added as a `corral` object only when asked for with `?corral=true` on a GET: marathon-python builds its model
objects from every key it gets, and fails on one it does not know.

Errors in Marathon's shapes: 422 `{"message": "Object is not valid", "details": [...]}`, 409 and 404
`{"message": ...}` ("App '/x' does not exist"), 400 for a body that is not JSON. Bodies are read raw and checked by
`corral.mesos.marathon` (FastAPI body models would answer in corral's own error shape). An app belongs to the user
who created it (its instances run as that user); other users get 404, root sees every app.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from corral import __version__
from corral.api.app import Caller, Peer
from corral.api.limits import SafeJSONResponse
from corral.daemon.core import CANCELLING, Daemon
from corral.jobs.model import Job, JobState
from corral.mesos import marathon as mr
from corral.mesos.errors import ErrorDetail, ObjectNotValid
from corral.services.controller import (
    LIVE,
    App,
    AppExists,
    AppNotFound,
    Owner,
    ServicesController,
    canonical,
    counts,
    instance_ports,
    instance_version,
    iso,
    launch_delay_left,
    parse_origin,
)
from corral.services.ports import PortAllocator, range_from_env

PREFIX = "/marathon"
DOCS = "docs/compat/marathon.md"

#: Marathon's endpoints corral does not serve: (methods, path as Marathon's docs write it, what it is). Each answers
#: 501 in Marathon's shape; docs/compat/marathon.md lists the same rows (a test keeps the two in step).
NOT_SUPPORTED: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("GET", "POST", "PUT", "DELETE"), "/v2/groups", "groups"),
    (("GET", "POST", "PUT", "DELETE"), "/v2/groups/{group_id}", "groups"),
    (("GET",), "/v2/groups/{group_id}/versions", "groups"),
    (("GET", "PUT"), "/v2/groups/{group_id}/versions/{version}", "groups"),
    (("HEAD", "GET", "POST"), "/v2/pods", "pods"),
    (("GET",), "/v2/pods/::status", "pods"),
    (("GET", "PUT", "DELETE"), "/v2/pods/{pod_id}", "pods"),
    (("GET",), "/v2/pods/{pod_id}::status", "pods"),
    (("GET",), "/v2/pods/{pod_id}::versions", "pods"),
    (("GET",), "/v2/pods/{pod_id}::versions/{version}", "pods"),
    (("DELETE",), "/v2/pods/{pod_id}::instances", "pods"),
    (("DELETE",), "/v2/pods/{pod_id}::instances/{instance_id}", "pods"),
    (("GET", "POST", "DELETE"), "/v2/eventSubscriptions", "event subscriptions (callbacks)"),
    (("DELETE",), "/v2/leader", "leader abdication (corral serve is one daemon, with no election)"),
    (("GET",), "/v2/plugins", "plugins"),
    (("GET", "PUT", "POST", "DELETE"), "/v2/plugins/{plugin_id}/{path}", "plugins"),
    (("POST",), "/v2/artifacts", "the artifact store"),
    (("GET", "PUT", "DELETE"), "/v2/artifacts/{path}", "the artifact store"),
    (("GET",), "/metrics", "Marathon's metrics"),
    (("GET", "POST"), "/logging", "changing the log level"),
)

#: The route families the rows above fall in: any path below one answers 501 too (a Marathon path corral does not
#: know is an endpoint it does not serve, not a 404).
_FAMILIES = {
    "/v2/groups": "groups",
    "/v2/pods": "pods",
    "/v2/eventSubscriptions": "event subscriptions (callbacks)",
    "/v2/plugins": "plugins",
    "/v2/artifacts": "the artifact store",
    "/metrics": "Marathon's metrics",
    "/logging": "changing the log level",
}

#: Marathon's repeated `embed` query parameter.
Embed = Annotated[list[str], Query()]

#: `embed` values (apps./app./group.apps. prefixes stripped) and what each adds to an app.
_EMBEDS = {"tasks", "counts", "deployments", "readiness", "lastTaskFailure", "failures", "taskStats"}


SCALE_AND_WIPE = "You cannot use scale and wipe at the same time."
MANY = "must be an array of apps, each with its id"
DELETE_IDS = 'must be an array of task ids: {"ids": ["web.1", ...]}'


def not_supported_text(method: str, path: str, what: str) -> str:
    return f"{method} {path}: {what} is not supported by corral (see {DOCS})"


def _message(status: int, text: str) -> JSONResponse:
    return SafeJSONResponse(status_code=status, content={"message": text})


def embeds(values: Iterable[str]) -> set[str]:
    """Marathon's `embed` values without their prefix: apps.tasks, app.tasks and group.apps.tasks are all "tasks";
    unknown ones are ignored (as Marathon does). `failures` means lastTaskFailure, tasks, counts and deployments."""
    out: set[str] = set()
    for value in values:
        for item in value.split(","):
            name = item.strip().rpartition(".")[2]
            if name in _EMBEDS:
                out.add(name)
    if "failures" in out:
        out |= {"lastTaskFailure", "tasks", "counts", "deployments"}
    return out


def task_state(app: App, job: Job) -> str:
    if job.state not in LIVE:  # a kill that ended it at once (an instance still queued)
        return "TASK_KILLED"
    if job.reason == CANCELLING or job.id in app.killing:
        return "TASK_KILLING"
    return {JobState.RUNNING: "TASK_RUNNING", JobState.STARTING: "TASK_STARTING"}.get(job.state, "TASK_STAGING")


def task_json(
    app: App, job: Job, controller: ServicesController, daemon: Daemon, extras: bool = False
) -> dict[str, Any]:
    parsed = parse_origin(job.spec.origin)
    task_id = parsed[1] if parsed else job.id
    h = controller.health_of(job.id)
    checks = []
    if h is not None:
        for i, s in enumerate(h.states):
            checks.append(
                {
                    "alive": s.healthy is True,
                    "consecutiveFailures": s.consecutive_failures,
                    "firstSuccess": None if h.first_success[i] is None else iso(h.first_success[i] or 0),
                    "lastSuccess": None if h.last_success[i] is None else iso(h.last_success[i] or 0),
                    "lastFailure": None if h.last_failure[i] is None else iso(h.last_failure[i] or 0),
                    "lastFailureCause": None if s.healthy is not False else h.last_message[i],
                    "taskId": task_id,
                }
            )
    body: dict[str, Any] = {
        "id": task_id,
        "appId": app.key,
        "host": daemon.node.name,
        "ports": instance_ports(job),
        "servicePorts": [],
        "stagedAt": iso(job.submitted_at),
        "startedAt": None if job.started_at is None else iso(job.started_at),
        "version": instance_version(job),
        "state": task_state(app, job),
        "healthCheckResults": checks,
    }
    if extras:
        by_index = {g.index: g for g in daemon.node.gpus}
        body["corral"] = {
            "job": job.id,
            "gpus": [{"index": g.index, "model": by_index[g.index].model} for g in job.gpus if g.index in by_index],
            "reason": job.reason,
        }
    return body


def definition_json(raw: dict[str, Any], version: str, model: mr.MarathonApp | None = None) -> dict[str, Any]:
    """An app definition as Marathon shows it: every field with its default, the effective upgrade strategy, the
    port definitions an app without any gets (one port), at `version`. `model`: `raw` already parsed."""
    model = model or mr.parse_app(raw)
    upgrade = mr.upgrade_rule(model)
    body = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    body["id"] = model.id
    body["upgradeStrategy"] = {
        "minimumHealthCapacity": upgrade.minimum_health_capacity,
        "maximumOverCapacity": upgrade.maximum_over_capacity,
    }
    body.setdefault("unreachableStrategy", {"inactiveAfterSeconds": 0, "expungeAfterSeconds": 0})
    if "portDefinitions" in raw:
        ports = [
            {"port": p.port, "protocol": p.protocol, **({"name": p.name} if p.name else {})}
            for p in model.port_definitions
        ]
    else:
        listed = raw.get("ports")
        ports = [{"port": 0, "protocol": "tcp"} for _ in (listed if isinstance(listed, list) else [0])]
    body["portDefinitions"] = ports
    body["version"] = version
    return body


def _settled(app: App, jobs: Sequence[Job], controller: ServicesController) -> bool:
    """Whether the app is at its target: as many instances as wanted, all of the current version and ready
    (running, and healthy when it has health checks), none being killed. Until then it has a deployment."""
    if len(jobs) != app.model.instances:
        return False
    return all(
        j.reason != CANCELLING and j.id not in app.killing and instance_version(j) == app.config_version
        and controller.ready(app, j)
        for j in jobs
    )  # fmt: skip


def _task_stats(app: App, jobs: Sequence[Job], controller: ServicesController, now: float) -> dict[str, Any]:
    """Marathon's taskStats: counts and lifetimes of all tasks, and of those of the current config."""

    def stats(group: Sequence[Job]) -> dict[str, Any]:
        c = counts(app, group, controller)
        lives = [now - j.started_at for j in group if j.started_at is not None and j.state is JobState.RUNNING]
        life = {"averageSeconds": statistics.fmean(lives), "medianSeconds": statistics.median(lives)} if lives else {}
        return {
            "stats": {
                "counts": {
                    "staged": c["tasksStaged"],
                    "running": c["tasksRunning"],
                    "healthy": c["tasksHealthy"],
                    "unhealthy": c["tasksUnhealthy"],
                },
                "lifeTime": life,
            }
        }

    out: dict[str, Any] = {}
    latest = [j for j in jobs if instance_version(j) == app.config_version]
    outdated = [j for j in jobs if instance_version(j) != app.config_version]
    scaled = str(app.doc.get("scalingVersion", app.config_version))
    after = [j for j in jobs if iso(j.submitted_at) >= scaled]
    for name, group in (
        ("startedAfterLastScaling", after),
        ("withLatestConfig", latest),
        ("withOutdatedConfig", outdated),
        ("totalSummary", list(jobs)),
    ):
        if group:
            out[name] = stats(group)
    return out


def app_json(
    app: App,
    jobs: list[Job],
    controller: ServicesController,
    daemon: Daemon,
    embed: set[str] = frozenset(),  # type: ignore[assignment]
    extras: bool = False,
) -> dict[str, Any]:
    """The app as `GET /v2/apps` shows it: its definition, versionInfo, counts and deployments (Marathon embeds
    those two by default), and what `embed` asks for."""
    body = definition_json(app.doc["app"], str(app.doc["version"]), app.model)
    body["versionInfo"] = {
        "lastScalingAt": app.doc.get("scalingVersion", app.doc["version"]),
        "lastConfigChangeAt": app.config_version,
    }
    body.update(counts(app, jobs, controller))
    body["deployments"] = [] if _settled(app, jobs, controller) else [{"id": app.doc.get("deployment", "")}]
    if "readiness" in embed:
        body["readinessCheckResults"] = []
    if "lastTaskFailure" in embed and app.state.get("lastTaskFailure"):
        body["lastTaskFailure"] = app.state["lastTaskFailure"]
    if "taskStats" in embed:
        body["taskStats"] = _task_stats(app, jobs, controller, daemon.clock())
    if "tasks" in embed:
        body["tasks"] = [task_json(app, j, controller, daemon, extras) for j in jobs]
    if extras:
        body["corral"] = {
            "user": app.owner.user,
            "waiting": app.waiting,
            "launchDelaySeconds": launch_delay_left(app, daemon.clock()),
        }
    return body


def _deployment_json(app: App) -> dict[str, Any]:
    """An app on its way to its target, as a Marathon deployment of one step."""
    action = {"start": "StartApplication", "scale": "ScaleApplication", "restart": "RestartApplication"}.get(
        str(app.doc.get("change", "")), "RestartApplication"
    )
    step = {"action": action, "app": app.key}
    return {
        "id": app.doc.get("deployment", ""),
        "version": app.doc["version"],
        "affectedApps": [app.key],
        "affectedPods": [],
        "steps": [{"actions": [step]}],
        "currentActions": [{**step, "readinessCheckResults": []}],
        "currentStep": 1,
        "totalSteps": 1,
    }


#: How often the event stream looks at the apps (a change shows within this long).
EVENT_POLL_S = 0.25
#: A comment line this often keeps proxies from closing a quiet stream.
EVENT_KEEPALIVE_S = 15.0
#: How an instance that has ended is reported (Mesos task states).
_ENDED = {
    JobState.SUCCEEDED: "TASK_FINISHED",
    JobState.FAILED: "TASK_FAILED",
    JobState.LOST: "TASK_LOST",
    JobState.CANCELLED: "TASK_KILLED",
}


@dataclass(frozen=True)
class _Seen:
    """What the event stream last saw of one app: its tasks (id -> state, health, job, version, ports)."""

    deployment: str
    settled: bool
    tasks: dict[str, tuple[str, bool | None, str, str, tuple[int, ...]]]


def _sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['eventType']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


def router(daemon: Daemon, lock: threading.Lock, wake: Callable[[], None], controller: ServicesController) -> APIRouter:
    # Routes answer plain dicts of stored documents: SafeJSONResponse encodes text an older corral stored unchecked.
    api = APIRouter(prefix=PREFIX, tags=["marathon"], default_response_class=SafeJSONResponse)

    def sees(app: App, who: Peer) -> bool:
        return who.root or app.owner.uid == who.uid or app.doc.get("createdBy") == who.user

    def mine(app: App | None, who: Peer, app_id: str) -> App:
        if app is None or not sees(app, who):
            raise AppNotFound(f"App '{canonical(app_id)}' does not exist")
        return app

    def answer(work: Callable[[], Any]) -> Any:
        """Run `work` under the daemon's lock; Marathon's error shapes for what it raises."""
        try:
            with lock:
                result = work()
        except ObjectNotValid as exc:
            return SafeJSONResponse(status_code=422, content=exc.to_json())
        except AppExists as exc:
            return _message(409, str(exc))
        except AppNotFound as exc:
            return _message(404, str(exc))
        wake()
        return result

    async def body_of(request: Request) -> Any:
        raw = await request.body()
        try:
            return json.loads(raw or b"null")
        except ValueError as exc:
            return _message(400, f"Invalid JSON: {exc}")

    def jobs_of(key: str) -> list[Job]:
        return controller.live_jobs(daemon).get(key, [])

    def visible(who: Peer) -> list[App]:
        return [a for a in controller.all(daemon) if sees(a, who)]

    def change(app: App, deployment: str | None = None) -> dict[str, Any]:
        return {"version": app.doc["version"], "deploymentId": deployment or app.doc.get("deployment", "")}

    def find_task(task_id: str, who: Peer, app: App | None = None) -> tuple[App, Job] | None:
        live = controller.live_jobs(daemon)
        for a in [app] if app is not None else visible(who):
            for job in live.get(a.key, []):
                parsed = parse_origin(job.spec.origin)
                if parsed is not None and parsed[1] == task_id:
                    return a, job
        return None

    def kill(app: App, jobs: list[Job], scale: bool) -> App:
        return controller.kill_instances(daemon, app.key, [j.id for j in jobs], scale)

    # ------------------------------------------------------------------------------------------ misc
    @api.get("/ping", response_class=PlainTextResponse)
    def ping() -> str:
        return "pong"

    @api.get("/v2/info", response_model=None)
    def info(request: Request, who: Caller) -> Any:
        leader = request.url.netloc or daemon.node.name
        return {
            "name": "corral",
            "version": __version__,
            "buildref": "corral",
            "elected": True,
            "leader": leader,
            "frameworkId": f"corral-{daemon.node.name}",
            "marathon_config": {
                "checkpoint": True,
                "executor": "//cmd",
                "failover_timeout": 604800,
                "features": ["gpu_resources"],
                "framework_name": "corral",
                "ha": False,
                "hostname": daemon.node.name,
                "local_port_min": controller.ports.low,
                "local_port_max": controller.ports.high,
                "master": "corral",
                "mesos_role": "*",
                "mesos_user": who.user,
                "webui_url": None,
            },
            "zookeeper_config": {},
            "event_subscriber": None,
            "http_config": {"http_port": request.url.port, "https_port": None},
        }

    @api.get("/v2/leader", response_model=None)
    def leader(request: Request, who: Caller) -> Any:
        return {"leader": request.url.netloc or daemon.node.name}

    # ------------------------------------------------------------------------------------------ apps
    @api.post("/v2/apps", status_code=201, response_model=None)
    async def create(request: Request, who: Caller) -> Any:
        raw = await body_of(request)
        if isinstance(raw, Response):
            return raw

        def work() -> Any:
            app = controller.create(daemon, raw, Owner(who.uid, who.gid, who.user))
            body = app_json(app, [], controller, daemon)
            return SafeJSONResponse(status_code=201, content=body, headers={"Location": f"{PREFIX}/v2/apps{app.key}"})

        return await run_in_threadpool(answer, work)

    @api.get("/v2/apps", response_model=None)
    def list_apps(
        who: Caller,
        embed: Embed = [],  # noqa: B006 - FastAPI copies the default
        cmd: str | None = None,
        id: str | None = None,
        label: str | None = None,
        corral: bool = False,
    ) -> Any:
        wanted = embeds(embed)

        def work() -> Any:
            live = controller.live_jobs(daemon)
            apps = visible(who)
            if cmd:
                apps = [a for a in apps if cmd in (a.model.cmd or "")]
            if id:
                apps = [a for a in apps if id.lower() in a.key]
            if label:
                apps = [a for a in apps if _labels_match(a.model.labels, label)]
            return {"apps": [app_json(a, live.get(a.key, []), controller, daemon, wanted, corral) for a in apps]}

        return answer(work)

    async def _update_many(request: Request, who: Peer) -> Any:
        raw = await body_of(request)
        if isinstance(raw, Response):
            return raw
        if not isinstance(raw, list):
            return SafeJSONResponse(status_code=422, content=ObjectNotValid([ErrorDetail("/", (MANY,))]).to_json())

        def work() -> Any:
            for item in raw:
                existing = controller.get(daemon, item["id"]) if isinstance(item, dict) and "id" in item else None
                if existing is not None:
                    mine(existing, who, existing.key)
            last = controller.update_many(daemon, raw, Owner(who.uid, who.gid, who.user))
            return change(last) if last is not None else {"version": iso(daemon.clock()), "deploymentId": ""}

        return await run_in_threadpool(answer, work)

    @api.put("/v2/apps", response_model=None)
    async def update_many(request: Request, who: Caller, force: bool = False) -> Any:
        return await _update_many(request, who)

    @api.patch("/v2/apps", response_model=None)
    async def patch_many(request: Request, who: Caller, force: bool = False) -> Any:
        return await _update_many(request, who)

    @api.get("/v2/apps/{app_id:path}/tasks", response_model=None)
    def tasks(app_id: str, who: Caller, corral: bool = False) -> Any:
        def work() -> Any:
            app = mine(controller.get(daemon, app_id), who, app_id)
            return {"tasks": [task_json(app, j, controller, daemon, corral) for j in jobs_of(app.key)]}

        return answer(work)

    @api.delete("/v2/apps/{app_id:path}/tasks/{task_id}", response_model=None)
    def kill_task(app_id: str, task_id: str, who: Caller, scale: bool = False, wipe: bool = False) -> Any:
        if scale and wipe:
            return _message(400, SCALE_AND_WIPE)

        def work() -> Any:
            app = mine(controller.get(daemon, app_id), who, app_id)
            found = find_task(task_id, who, app)
            if found is None:
                return _message(404, f"Task '{task_id}' does not exist")
            job = found[1]
            app = kill(app, [job], scale)
            if scale:
                return change(app)
            killed = daemon.store.get(job.id) or job
            return {"task": task_json(app, killed, controller, daemon)}

        return answer(work)

    @api.delete("/v2/apps/{app_id:path}/tasks", response_model=None)
    def kill_tasks(app_id: str, who: Caller, scale: bool = False, wipe: bool = False, host: str | None = None) -> Any:
        if scale and wipe:
            return _message(400, SCALE_AND_WIPE)

        def work() -> Any:
            app = mine(controller.get(daemon, app_id), who, app_id)
            jobs = [j for j in jobs_of(app.key) if host in (None, "", daemon.node.name)]
            app = kill(app, jobs, scale)
            if scale:
                return change(app)
            return {"tasks": [task_json(app, daemon.store.get(j.id) or j, controller, daemon) for j in jobs]}

        return answer(work)

    @api.get("/v2/apps/{app_id:path}/versions/{version}", response_model=None)
    def app_version(app_id: str, version: str, who: Caller) -> Any:
        def work() -> Any:
            app = mine(controller.get(daemon, app_id), who, app_id)
            return definition_json(controller.definition_at(app, version), version)

        return answer(work)

    @api.get("/v2/apps/{app_id:path}/versions", response_model=None)
    def app_versions(app_id: str, who: Caller) -> Any:
        def work() -> Any:
            app = mine(controller.get(daemon, app_id), who, app_id)
            return {"versions": controller.versions(app)}

        return answer(work)

    @api.post("/v2/apps/{app_id:path}/restart", response_model=None)
    def restart(app_id: str, who: Caller, force: bool = False) -> Any:
        def work() -> Any:
            mine(controller.get(daemon, app_id), who, app_id)
            return change(controller.restart(daemon, app_id))

        return answer(work)

    @api.get("/v2/apps/{app_id:path}", response_model=None)
    def show(app_id: str, who: Caller, embed: Embed = [], corral: bool = False) -> Any:  # noqa: B006
        # Marathon embeds these in one app whatever `embed` says.
        wanted = embeds(embed) | {"counts", "tasks", "lastTaskFailure", "deployments", "readiness"}

        def work() -> Any:
            app = mine(controller.get(daemon, app_id), who, app_id)
            return {"app": app_json(app, jobs_of(app.key), controller, daemon, wanted, corral)}

        return answer(work)

    async def _update(app_id: str, request: Request, who: Peer) -> Any:
        raw = await body_of(request)
        if isinstance(raw, Response):
            return raw

        def work() -> Any:
            existing = controller.get(daemon, app_id)
            if existing is not None:
                mine(existing, who, app_id)
            app, created = controller.update(daemon, app_id, raw, Owner(who.uid, who.gid, who.user))
            return SafeJSONResponse(status_code=201 if created else 200, content=change(app))

        return await run_in_threadpool(answer, work)

    @api.put("/v2/apps/{app_id:path}", response_model=None)
    async def update(app_id: str, request: Request, who: Caller, force: bool = False) -> Any:
        return await _update(app_id, request, who)

    @api.patch("/v2/apps/{app_id:path}", response_model=None)
    async def patch(app_id: str, request: Request, who: Caller, force: bool = False) -> Any:
        return await _update(app_id, request, who)

    @api.delete("/v2/apps/{app_id:path}", response_model=None)
    def delete(app_id: str, who: Caller, force: bool = False) -> Any:
        def work() -> Any:
            mine(controller.get(daemon, app_id), who, app_id)
            deployment = controller.delete(daemon, app_id)
            return {"version": iso(daemon.clock()), "deploymentId": deployment}

        return answer(work)

    # ------------------------------------------------------------------------------------------ tasks
    @api.get("/v2/tasks", response_model=None)
    def all_tasks(who: Caller, status: str | None = None, corral: bool = False) -> Any:
        def work() -> Any:
            live = controller.live_jobs(daemon)
            out = []
            for app in visible(who):
                for job in live.get(app.key, []):
                    t = task_json(app, job, controller, daemon, corral)
                    if status is None or t["state"] == "TASK_" + status.upper():
                        out.append(t)
            return {"tasks": out}

        return answer(work)

    @api.post("/v2/tasks/delete", response_model=None)
    async def delete_tasks(
        request: Request, who: Caller, scale: bool = False, wipe: bool = False, force: bool = False
    ) -> Any:
        raw = await body_of(request)
        if isinstance(raw, Response):
            return raw
        if scale and wipe:
            return _message(400, SCALE_AND_WIPE)
        ids = raw.get("ids") if isinstance(raw, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return SafeJSONResponse(
                status_code=422,
                content={"message": "Object is not valid", "details": [{"path": "/ids", "errors": [DELETE_IDS]}]},
            )

        def work() -> Any:
            by_app: dict[str, tuple[App, list[Job]]] = {}
            for task_id in ids:
                found = find_task(task_id, who)
                if found is not None:  # ids of tasks that are gone (or not the caller's) are skipped, as Marathon
                    by_app.setdefault(found[0].key, (found[0], []))[1].append(found[1])
            last: App | None = None
            killed: list[dict[str, Any]] = []
            for app, jobs in by_app.values():
                last = kill(app, jobs, scale)
                killed += [task_json(last, daemon.store.get(j.id) or j, controller, daemon) for j in jobs]
            if scale:
                return change(last) if last is not None else {"version": iso(daemon.clock()), "deploymentId": ""}
            return {"tasks": killed}

        return await run_in_threadpool(answer, work)

    # ------------------------------------------------------------------------------------------ deployments
    @api.get("/v2/deployments", response_model=None)
    def deployments(who: Caller) -> Any:
        def work() -> Any:
            live = controller.live_jobs(daemon)
            return [_deployment_json(a) for a in visible(who) if not _settled(a, live.get(a.key, []), controller)]

        return answer(work)

    @api.delete("/v2/deployments/{deployment_id}", response_model=None)
    def cancel_deployment(deployment_id: str, who: Caller, force: bool = False) -> Any:
        def work() -> Any:
            live = controller.live_jobs(daemon)
            for app in visible(who):
                if app.doc.get("deployment") == deployment_id and not _settled(app, live.get(app.key, []), controller):
                    if app.doc.get("change") == "start":  # cancelling an app's creation removes it (Marathon)
                        result = {"version": iso(daemon.clock()), "deploymentId": controller.delete(daemon, app.key)}
                    elif len(controller.versions(app)) < 2:
                        return _message(409, f"App '{app.key}' has no earlier version kept to roll back to")
                    else:
                        result = change(controller.rollback(daemon, app.key))
                    return Response(status_code=202) if force else result
            return _message(404, f"DeploymentPlan {deployment_id} does not exist")

        return answer(work)

    # ------------------------------------------------------------------------------------------ events
    def look(who: Peer) -> dict[str, _Seen]:
        """Each visible app as the event stream compares it (under the daemon's lock)."""
        out: dict[str, _Seen] = {}
        with lock:
            live = controller.live_jobs(daemon)
            for app in visible(who):
                jobs = live.get(app.key, [])
                tasks = {}
                for job in jobs:
                    parsed = parse_origin(job.spec.origin)
                    h = controller.health_of(job.id)
                    alive = None
                    if h is not None and app.service.health_checks and all(x.healthy is not None for x in h.states):
                        alive = all(x.healthy is True for x in h.states)
                    key = parsed[1] if parsed else job.id
                    ports = tuple(instance_ports(job))
                    tasks[key] = (task_state(app, job), alive, job.id, instance_version(job), ports)
                out[app.key] = _Seen(str(app.doc.get("deployment", "")), _settled(app, jobs, controller), tasks)
        return out

    def changes(before: dict[str, _Seen], after: dict[str, _Seen]) -> list[dict[str, Any]]:
        """Marathon's events for what changed between two looks."""
        now = iso(daemon.clock())
        host = daemon.node.name
        events: list[dict[str, Any]] = []

        def status(app_id: str, task_id: str, state: str, version: str, ports: tuple[int, ...]) -> None:
            events.append({
                "eventType": "status_update_event", "timestamp": now, "slaveId": host, "taskId": task_id,
                "taskStatus": state, "message": "", "appId": app_id, "host": host, "ipAddresses": [],
                "ports": list(ports), "version": version,
            })  # fmt: skip

        for app_id, seen in after.items():
            old = before.get(app_id)
            old_tasks = old.tasks if old is not None else {}
            for task_id, (state, alive, _, version, ports) in seen.tasks.items():
                was = old_tasks.get(task_id)
                if was is None or was[0] != state:
                    status(app_id, task_id, state, version, ports)
                if alive is not None and (was is None or was[1] != alive):
                    events.append({
                        "eventType": "health_status_changed_event", "timestamp": now, "appId": app_id,
                        "taskId": task_id, "instanceId": task_id, "version": version, "alive": alive,
                    })  # fmt: skip
            for task_id, (_, _, job_id, version, ports) in old_tasks.items():
                if task_id not in seen.tasks:
                    job = daemon.store.get(job_id)
                    status(
                        app_id, task_id, _ENDED.get(job.state, "TASK_KILLED") if job else "TASK_KILLED", version, ports
                    )
            if seen.settled and old is not None and (not old.settled or old.deployment != seen.deployment):
                events.append({"eventType": "deployment_success", "timestamp": now, "id": seen.deployment})
        for app_id, old in before.items():
            if app_id not in after:
                for task_id, (_, _, job_id, version, ports) in old.tasks.items():
                    job = daemon.store.get(job_id)
                    status(
                        app_id, task_id, _ENDED.get(job.state, "TASK_KILLED") if job else "TASK_KILLED", version, ports
                    )
                events.append({"eventType": "app_terminated_event", "timestamp": now, "appId": app_id})
        return events

    def step(seen: dict[str, _Seen], who: Peer) -> tuple[dict[str, _Seen], list[dict[str, Any]]]:
        now = look(who)
        with lock:
            return now, changes(seen, now)

    # Out of the OpenAPI schema: a generated client (or a fuzzer) that reads the whole answer would wait forever.
    @api.get("/v2/events", response_model=None, include_in_schema=False)
    async def events(request: Request, who: Caller, event_type: Embed = []) -> Any:  # noqa: B006
        """Marathon's event bus as Server-Sent Events, for the caller's apps. corral has no event bus: the stream
        compares the apps every EVENT_POLL_S and says what changed, so a change shorter than that may be missed."""
        wanted = {t for value in event_type for t in value.split(",") if t}
        remote = request.client.host if request.client else ""

        async def stream() -> AsyncIterator[bytes]:
            attached = {"eventType": "event_stream_attached", "timestamp": iso(daemon.clock()), "remoteAddress": remote}
            if not wanted or attached["eventType"] in wanted:
                yield _sse(attached)
            seen = await run_in_threadpool(look, who)
            quiet = 0.0
            while True:
                await asyncio.sleep(EVENT_POLL_S)
                seen, found = await run_in_threadpool(step, seen, who)
                found = [e for e in found if not wanted or e["eventType"] in wanted]
                for event in found:
                    yield _sse(event)
                quiet = 0.0 if found else quiet + EVENT_POLL_S
                if quiet >= EVENT_KEEPALIVE_S:
                    quiet = 0.0
                    yield b":\n\n"

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    # ------------------------------------------------------------------------------------------ queue
    @api.get("/v2/queue", response_model=None)
    def queue(who: Caller, embed: Embed = [], corral: bool = False) -> Any:  # noqa: B006
        offers = "lastUnusedOffers" in embed

        def work() -> Any:
            live = controller.live_jobs(daemon)
            now = daemon.clock()
            items = []
            for app in visible(who):
                jobs = live.get(app.key, [])
                up = [
                    j
                    for j in jobs
                    if j.state in (JobState.STARTING, JobState.RUNNING) and j.reason != CANCELLING
                    and j.id not in app.killing and instance_version(j) == app.config_version
                ]  # fmt: skip
                count = app.model.instances - len(up)
                if count <= 0:
                    continue
                left = launch_delay_left(app, now)
                since = min((j.submitted_at for j in jobs if j not in up), default=now)
                item: dict[str, Any] = {
                    "app": definition_json(app.doc["app"], str(app.doc["version"]), app.model),
                    "count": count,
                    "delay": {"timeLeftSeconds": round(left), "overdue": left <= 0},
                    "since": iso(since),
                    # One machine makes no offers: nothing to summarise (why instances wait: ?corral=true).
                    "processedOffersSummary": {
                        "processedOffersCount": 0,
                        "unusedOffersCount": 0,
                        "rejectSummaryLastOffers": [],
                        "rejectSummaryLaunchAttempt": [],
                    },
                }
                if offers:
                    item["lastUnusedOffers"] = []
                if corral:
                    item["corral"] = {"waiting": app.waiting, "launchDelaySeconds": left}
                items.append(item)
            return {"queue": items}

        return answer(work)

    @api.delete("/v2/queue/{app_id:path}/delay", status_code=204, response_model=None)
    def reset_delay(app_id: str, who: Caller) -> Any:
        def work() -> Any:
            mine(controller.get(daemon, app_id), who, app_id)
            controller.reset_delay(daemon, app_id)
            return Response(status_code=204)

        return answer(work)

    # ------------------------------------------------------------------------------------------ not supported
    def refuse(what: str) -> Callable[[Request, Peer], JSONResponse]:
        def handler(request: Request, who: Caller) -> JSONResponse:
            path = request.url.path.removeprefix(PREFIX)
            return _message(501, not_supported_text(request.method, path, what))

        return handler

    for methods, path, what in NOT_SUPPORTED:
        if not any(path.startswith(family) for family in _FAMILIES):
            api.add_api_route(path, refuse(what), methods=list(methods), response_model=None, include_in_schema=False)
    everything = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
    for family, what in _FAMILIES.items():
        for route in (family, family + "/{rest:path}"):
            api.add_api_route(route, refuse(what), methods=everything, response_model=None, include_in_schema=False)

    return api


def _labels_match(labels: dict[str, str], query: str) -> bool:
    """Marathon's label selector, in its common forms: `key`, `key==value`, `key!=value` (comma-separated, all
    must hold). Set-based selectors (`in`, `notin`) match nothing."""
    for raw in query.split(","):
        term = raw.strip()
        if not term:
            continue
        if "!=" in term:
            k, _, v = term.partition("!=")
            if labels.get(k.strip()) == v.strip():
                return False
        elif "==" in term:
            k, _, v = term.partition("==")
            if labels.get(k.strip()) != v.strip():
                return False
        elif " " in term or term not in labels:
            return False
    return True


def install(daemon: Daemon, lock: threading.Lock, wake: Callable[[], None]) -> APIRouter:
    """Give the daemon its services controller (ports from CORRAL_SERVICE_PORTS); return the Marathon routes."""
    low, high = range_from_env()
    controller = ServicesController(PortAllocator(low, high))
    daemon.controllers.append(controller)
    return router(daemon, lock, wake, controller)
