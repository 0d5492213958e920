"""Marathon's REST API for apps, under `/marathon` (a Marathon client's base URL is http://HOST:PORT/marathon).

    POST   /marathon/v2/apps                      create (201, the app); 409 when the id exists; 422 invalid
    GET    /marathon/v2/apps                      {"apps": [...]}: the caller's apps (root: all)
    GET    /marathon/v2/apps/{id}                 {"app": {..., "tasks": [...]}}
    PUT    /marathon/v2/apps/{id}                 update; fields not given keep their values ({"instances": 3}
                                                  scales); creates the app when there is none (201)
    DELETE /marathon/v2/apps/{id}                 remove it, kill its instances
    POST   /marathon/v2/apps/{id}/restart         replace every instance (a new version)
    GET    /marathon/v2/apps/{id}/tasks           {"tasks": [...]}: instances with ports and health
    DELETE /marathon/v2/queue/{id}/delay          reset the launch delay (204)

Answers use Marathon's shapes: 422 `{"message": "Object is not valid", "details": [...]}`, 409 and 404
`{"message": ...}` ("App '/x' does not exist"), 400 for a body that is not JSON. Bodies are read raw and checked by
`corral.mesos.marathon` (FastAPI body models would answer in corral's own error shape). An app belongs to the user
who created it (its instances run as that user); other users get 404, root sees every app.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from corral.api.app import Caller, Peer
from corral.api.limits import SafeJSONResponse
from corral.daemon.core import CANCELLING, Daemon
from corral.jobs.model import Job, JobState
from corral.mesos.errors import ObjectNotValid
from corral.services.controller import (
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


def _message(status: int, text: str) -> JSONResponse:
    return SafeJSONResponse(status_code=status, content={"message": text})


def task_json(app: App, job: Job, controller: ServicesController, daemon: Daemon) -> dict[str, Any]:
    parsed = parse_origin(job.spec.origin)
    state = {JobState.RUNNING: "TASK_RUNNING", JobState.STARTING: "TASK_STARTING"}.get(job.state, "TASK_STAGING")
    if job.reason == CANCELLING or job.id in app.killing:
        state = "TASK_KILLING"
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
                    "taskId": parsed[1] if parsed else job.id,
                }
            )
    by_index = {g.index: g for g in daemon.node.gpus}
    return {
        "id": parsed[1] if parsed else job.id,
        "appId": app.key,
        "host": daemon.node.name,
        "ports": instance_ports(job),
        "stagedAt": iso(job.submitted_at),
        "startedAt": None if job.started_at is None else iso(job.started_at),
        "version": instance_version(job),
        "state": state,
        "healthCheckResults": checks,
        "corral": {
            "job": job.id,
            "gpus": [{"index": g.index, "model": by_index[g.index].model} for g in job.gpus if g.index in by_index],
            "reason": job.reason,
        },
    }


def app_json(
    app: App, jobs: list[Job], controller: ServicesController, daemon: Daemon, tasks: bool = False
) -> dict[str, Any]:
    body = app.model.model_dump(by_alias=True, mode="json", exclude_none=True)
    body["id"] = app.key
    body["portDefinitions"] = [
        {"port": p.port, "protocol": p.protocol, **({"name": p.name} if p.name else {})}
        for p in app.model.port_definitions
    ] or [{"port": 0, "protocol": "tcp"} for _ in app.port_names]
    body["version"] = app.doc["version"]
    body["versionInfo"] = {
        "lastScalingAt": app.doc.get("scalingVersion", app.doc["version"]),
        "lastConfigChangeAt": app.config_version,
    }
    body.update(counts(app, jobs, controller))
    active = [j for j in jobs if j.reason != CANCELLING and j.id not in app.killing]
    settled = len(active) == app.model.instances and all(instance_version(j) == app.config_version for j in active)
    body["deployments"] = [] if settled else [{"id": app.doc.get("deployment", "")}]
    if app.state.get("lastTaskFailure"):
        body["lastTaskFailure"] = app.state["lastTaskFailure"]
    body["corral"] = {
        "user": app.owner.user,
        "waiting": app.waiting,
        "launchDelaySeconds": launch_delay_left(app, daemon.clock()),
    }
    if tasks:
        body["tasks"] = [task_json(app, j, controller, daemon) for j in jobs]
    return body


def router(daemon: Daemon, lock: threading.Lock, wake: Callable[[], None], controller: ServicesController) -> APIRouter:
    # Routes answer plain dicts of stored documents: SafeJSONResponse encodes text an older corral stored unchecked.
    api = APIRouter(prefix=PREFIX, tags=["marathon"], default_response_class=SafeJSONResponse)

    def mine(app: App | None, who: Peer, app_id: str) -> App:
        if app is None or not (who.root or app.owner.uid == who.uid or app.doc.get("createdBy") == who.user):
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

    def change(app: App, deployment: str | None = None) -> dict[str, Any]:
        return {"version": app.doc["version"], "deploymentId": deployment or app.doc.get("deployment", "")}

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
    def list_apps(who: Caller) -> Any:
        def work() -> Any:
            live = controller.live_jobs(daemon)
            apps = [a for a in controller.all(daemon) if who.root or a.owner.uid == who.uid]
            return {"apps": [app_json(a, live.get(a.key, []), controller, daemon) for a in apps]}

        return answer(work)

    @api.get("/v2/apps/{app_id:path}/tasks", response_model=None)
    def tasks(app_id: str, who: Caller) -> Any:
        def work() -> Any:
            app = mine(controller.get(daemon, app_id), who, app_id)
            return {"tasks": [task_json(app, j, controller, daemon) for j in jobs_of(app.key)]}

        return answer(work)

    @api.post("/v2/apps/{app_id:path}/restart", response_model=None)
    def restart(app_id: str, who: Caller) -> Any:
        def work() -> Any:
            mine(controller.get(daemon, app_id), who, app_id)
            return change(controller.restart(daemon, app_id))

        return answer(work)

    @api.get("/v2/apps/{app_id:path}", response_model=None)
    def show(app_id: str, who: Caller) -> Any:
        def work() -> Any:
            app = mine(controller.get(daemon, app_id), who, app_id)
            return {"app": app_json(app, jobs_of(app.key), controller, daemon, tasks=True)}

        return answer(work)

    @api.put("/v2/apps/{app_id:path}", response_model=None)
    async def update(app_id: str, request: Request, who: Caller) -> Any:
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

    @api.delete("/v2/apps/{app_id:path}", response_model=None)
    def delete(app_id: str, who: Caller) -> Any:
        def work() -> Any:
            mine(controller.get(daemon, app_id), who, app_id)
            deployment = controller.delete(daemon, app_id)
            return {"version": iso(daemon.clock()), "deploymentId": deployment}

        return answer(work)

    @api.delete("/v2/queue/{app_id:path}/delay", status_code=204, response_model=None)
    def reset_delay(app_id: str, who: Caller) -> Any:
        def work() -> Any:
            mine(controller.get(daemon, app_id), who, app_id)
            controller.reset_delay(daemon, app_id)
            return Response(status_code=204)

        return answer(work)

    return api


def install(daemon: Daemon, lock: threading.Lock, wake: Callable[[], None]) -> APIRouter:
    """Give the daemon its services controller (ports from CORRAL_SERVICE_PORTS); return the Marathon routes."""
    low, high = range_from_env()
    controller = ServicesController(PortAllocator(low, high))
    daemon.controllers.append(controller)
    return router(daemon, lock, wake, controller)
