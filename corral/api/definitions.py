"""corral's own routes for named job definitions (what `corral job ...` talks to), and `install_jobs`, which gives
the daemon its jobs controller and the three routers (this one, Metronome's, Chronos').

    POST   /v1/definitions                      a Metronome or Chronos job JSON (detected), 201 its summary
    GET    /v1/definitions                      the caller's definitions (root: everyone's)
    GET    /v1/definitions/{name}               summary + the definition as its source system echoes it + runs
    DELETE /v1/definitions/{name}[?stop_runs=true]
    POST   /v1/definitions/{name}/runs          run it now (201, the run)
    GET    /v1/definitions/{name}/runs          every run kept (active and finished), oldest first

Errors are corral's `{"detail": {"field", "message"}}`: a Metronome/Chronos validation error names the JSON path of
its first problem and lists all of them in the message.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body
from fastapi.responses import JSONResponse

from corral.api import chronos as chronos_api
from corral.api import metronome as metronome_api
from corral.api.app import Caller, Peer
from corral.api.limits import SafeJSONResponse
from corral.daemon.core import Daemon
from corral.jobs.controller import Entry, JobsController
from corral.jobs.definitions import (
    Conflict,
    DefinitionNotFound,
    NameTaken,
    Owner,
    RunNotFound,
    instant,
    iso,
    run_json,
)
from corral.mesos import chronos as c
from corral.mesos import metronome as m
from corral.mesos.errors import ObjectNotValid
from corral.model.errors import CorralError, InvalidRequest


def install_jobs(daemon: Daemon, lock: threading.Lock, wake: Callable[[], None]) -> list[APIRouter]:
    """Give the daemon its jobs controller; return corral's, Metronome's and Chronos' routes for it."""
    ctl = JobsController(daemon)
    daemon.controllers.append(ctl)
    clock = daemon.clock
    return [
        definitions_router(ctl, lock, wake, clock),
        metronome_api.metronome_router(ctl, lock, wake, clock),
        chronos_api.chronos_router(ctl, lock, wake, clock),
    ]


def detect(data: Any) -> str:
    """ "metronome" (an `id` and a `run` object) or "chronos" (a `name`); InvalidRequest for anything else."""
    if isinstance(data, dict):
        if "run" in data or ("id" in data and "name" not in data):
            return "metronome"
        if "name" in data:
            return "chronos"
    raise InvalidRequest(
        "definition",
        'not a Metronome job ({"id": ..., "run": {...}}) or a Chronos job ({"name": ..., "command": ...})',
    )


def summary(ctl: JobsController, entry: Entry, now: float) -> dict[str, Any]:
    """What `corral job list` shows: where it came from, when it runs next, how its runs went."""
    state = ctl.state(entry.name)
    schedules = []
    next_at = math.inf
    for rule, sched in entry.schedules:
        cursor = state["cursors"].get(rule.id, now)
        enabled = rule.enabled and not state["auto_disabled"]
        nxt = sched.next_after(instant(max(cursor, now))) if enabled else None
        if nxt is not None:
            next_at = min(next_at, nxt.timestamp())
        schedules.append(
            {
                "id": rule.id,
                "kind": rule.kind,
                "expression": rule.expression,
                "timezone": rule.timezone or None,
                "enabled": enabled,
                "concurrency_policy": rule.concurrency.value,
                "starting_deadline_s": rule.starting_deadline_s,
                "next_run_at": iso(nxt.timestamp()) if nxt is not None else None,
            }
        )
    latest = state["latest"]
    active = ctl.runs(entry.name, active_only=True)
    d = entry.definition
    return {
        "name": entry.name,
        "source": entry.source,
        "user": entry.owner.user,
        "description": d.description,
        "command": list(d.command),
        "image": d.image.image if d.image is not None else None,
        "cpus": d.request.cpu_milli / 1000,
        "memory_mib": d.request.memory_mib,
        "gpus": d.request.gpu_count,
        "schedules": schedules,
        "parents": list(entry.parents),
        "next_run_at": iso(next_at) if next_at != math.inf else None,
        "active_runs": len(active),
        "last_status": latest["status"] if latest else None,
        "last_finished_at": iso(latest["finished_at"]) if latest else None,
        "success_count": state["success_count"],
        "failure_count": state["failure_count"],
        "missed_ticks": state["missed_ticks"],
        "created_at": iso(entry.created_at),
    }


def _error(status: int, field: str, message: str) -> JSONResponse:
    return SafeJSONResponse(status_code=status, content={"detail": {"field": field, "message": message}})


def definitions_router(
    ctl: JobsController, lock: threading.Lock, wake: Callable[[], None], clock: Callable[[], float]
) -> APIRouter:
    router = APIRouter(prefix="/v1/definitions", tags=["definitions"])

    def owner(who: Peer) -> Owner:
        return Owner(who.user, who.uid, who.gid)

    def guarded(work: Callable[[], JSONResponse]) -> JSONResponse:
        try:
            with lock:
                return work()
        except ObjectNotValid as exc:
            # field: the first invalid path; message: its errors, then the other paths with theirs
            if not exc.details:
                return _error(422, "/", str(exc))
            first, rest = exc.details[0], exc.details[1:]
            text = "; ".join([", ".join(first.errors), *(f"{d.path}: {', '.join(d.errors)}" for d in rest)])
            return _error(422, first.path, text)
        except m.MetronomeError as exc:
            return _error(exc.status, "definition", str(exc))
        except DefinitionNotFound as exc:
            return _error(404, "name", str(exc))
        except RunNotFound as exc:
            return _error(404, "run", str(exc))
        except (NameTaken, Conflict) as exc:
            return _error(409, "name", str(exc))
        except InvalidRequest as exc:
            return _error(422, exc.field, exc.message)
        except CorralError as exc:  # pragma: no cover - a rule without a better home
            return _error(422, "definition", str(exc))

    @router.post("", status_code=201)
    def create(who: Caller, data: Annotated[Any, Body()] = None) -> JSONResponse:
        def work() -> JSONResponse:
            me = owner(who)
            now = clock()
            if detect(data) == "metronome":
                job = m.parse_job(data, known_jobs=ctl.known_metronome(me))
                runner = metronome_api.run_as(job.run.user, me)
                spec = job.model_dump(by_alias=True, exclude_none=True)
                entry = ctl.create("metronome", job.id, spec, runner, now, metronome_api.STATUS)
            else:
                cjob = c.parse_job(data, now=instant(now), known_jobs=ctl.known_chronos(me))
                runner = chronos_api.run_as(cjob.run_as_user, me)
                spec = cjob.model_dump(by_alias=True, exclude_none=True)
                entry = ctl.create("chronos", cjob.name, spec, runner, now, c.STATUS)
            wake()
            return SafeJSONResponse(status_code=201, content=summary(ctl, entry, now))

        return guarded(work)

    @router.get("")
    def list_definitions(who: Caller) -> JSONResponse:
        def work() -> JSONResponse:
            now = clock()
            return SafeJSONResponse([summary(ctl, e, now) for e in ctl.entries(owner(who))])

        return guarded(work)

    @router.get("/{name}")
    def show(name: str, who: Caller) -> JSONResponse:
        def work() -> JSONResponse:
            now = clock()
            entry = ctl.visible(name, owner(who))
            out = summary(ctl, entry, now)
            if entry.source == "metronome":
                out["spec"] = metronome_api.job_json(ctl, entry, now)
            else:
                out["spec"] = chronos_api.job_json(ctl, entry, now)
            out["runs"] = [run_json(r) for r in ctl.runs(name)]
            return SafeJSONResponse(out)

        return guarded(work)

    @router.delete("/{name}")
    def delete(name: str, who: Caller, stop_runs: bool = False) -> JSONResponse:
        def work() -> JSONResponse:
            entry = ctl.delete(name, owner(who), stop_runs)
            wake()
            return SafeJSONResponse({"name": entry.name, "deleted": True})

        return guarded(work)

    @router.post("/{name}/runs", status_code=201)
    def start_run(name: str, who: Caller) -> JSONResponse:
        def work() -> JSONResponse:
            run = ctl.start_run(name, owner(who), clock())
            wake()
            return SafeJSONResponse(status_code=201, content=run_json(run))

        return guarded(work)

    @router.get("/{name}/runs")
    def runs(name: str, who: Caller) -> JSONResponse:
        def work() -> JSONResponse:
            ctl.visible(name, owner(who))
            return SafeJSONResponse([run_json(r) for r in ctl.runs(name)])

        return guarded(work)

    return router
