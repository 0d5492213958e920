"""Chronos' REST API, mounted under `/chronos` (a Chronos client's base URL is `http://HOST:PORT/chronos`); every
route is there both as `/v1/scheduler/...` (Chronos 3) and `/scheduler/...` (Chronos 2).

    POST   /v1/scheduler/iso8601             a scheduled job (or one run now, with neither schedule nor parents);
    POST   /v1/scheduler/dependency          a dependent job (parents); posting an existing name updates it; 204
    GET    /v1/scheduler/jobs                every job, with its counters and the schedule as it stands now
    GET    /v1/scheduler/jobs/search?name=   jobs whose name contains the text
    PUT    /v1/scheduler/job/{name}[?arguments=a,b]   run it now (arguments appended when `shell` is false)
    DELETE /v1/scheduler/job/{name}          delete it (running tasks are killed)
    DELETE /v1/scheduler/task/kill/{name}    kill its running tasks
    PUT    /v1/scheduler/job/success/{name}  count a success, so that its dependants run (Chronos issue #600)

Bad jobs get 400 (Chronos' status) with the details shape of `corral.mesos.errors`.
"""

from __future__ import annotations

import pwd
import threading
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body
from fastapi.responses import JSONResponse, Response

from corral.api.app import Caller, Peer
from corral.api.limits import SafeJSONResponse
from corral.jobs.controller import Entry, JobsController
from corral.jobs.definitions import Conflict, DefinitionNotFound, NameTaken, Owner, instant, iso
from corral.mesos import chronos as c
from corral.mesos import metronome
from corral.mesos.errors import ErrorDetail, ObjectNotValid, Problems
from corral.model.errors import InvalidRequest
from corral.model.limits import command_problems
from corral.schedule.iso8601 import RepeatingInterval

STATUS = c.STATUS


def owner(who: Peer) -> Owner:
    return Owner(who.user, who.uid, who.gid)


def job_json(ctl: JobsController, entry: Entry, now: float) -> dict[str, Any]:
    """The job as Chronos shows it: the resources it gets (defaults for 0), its counters, and the schedule rewritten
    from the ticks handled so far (`Rn` counting down); a job with no tick left is disabled."""
    assert entry.chronos is not None
    d = entry.definition
    state = ctl.state(entry.name)
    out = entry.chronos.model_dump(by_alias=True, exclude_none=True)
    out["cpus"] = d.request.cpu_milli / 1000
    out["mem"] = d.request.memory_mib
    out["disk"] = d.disk_mib
    disabled = entry.chronos.disabled or state["auto_disabled"]
    for rule, sched in entry.schedules:
        if isinstance(sched, RepeatingInterval):
            cursor = instant(state["cursors"].get(rule.id, now))
            out["schedule"] = sched.rewritten(cursor)
            disabled = disabled or sched.remaining_after(cursor) == 0
    out["disabled"] = disabled
    out["successCount"] = state["success_count"]
    out["errorCount"] = state["failure_count"]
    out["lastSuccess"] = iso(state["last_success_at"]) or ""
    out["lastError"] = iso(state["last_failure_at"]) or ""
    out["errorsSinceLastSuccess"] = state["errors_since_last_success"]
    out["owner"] = entry.chronos.owner or entry.owner.user
    return out


def _answer(status: int, body: Any) -> JSONResponse:
    return SafeJSONResponse(status_code=status, content=body)


def _problem(path: str, message: str) -> ObjectNotValid:
    return ObjectNotValid([ErrorDetail(path, (message,))], STATUS)


def run_as(requested: str | None, who: Owner) -> Owner:
    if requested is None or requested == who.user:
        return who
    if not who.root:
        raise _problem("/runAsUser", f"corral runs a job as its creator ({who.user}); only root may name {requested}")
    try:
        entry = pwd.getpwnam(requested)
    except KeyError:
        raise _problem("/runAsUser", f"no user {requested!r} on this machine") from None
    return Owner(entry.pw_name, entry.pw_uid, entry.pw_gid)


def chronos_router(
    ctl: JobsController, lock: threading.Lock, wake: Callable[[], None], clock: Callable[[], float]
) -> APIRouter:
    router = APIRouter(prefix="/chronos", tags=["chronos"])

    def guarded(work: Callable[[], Response]) -> Response:
        try:
            with lock:
                return work()
        except ObjectNotValid as exc:
            return _answer(exc.status, exc.to_json())
        except DefinitionNotFound as exc:
            return _answer(404, {"message": f"Job '{exc.name}' not found"})
        except NameTaken as exc:
            return _answer(409, {"message": f"a job named {exc.name} already exists"})
        except Conflict as exc:
            return _answer(409, {"message": str(exc)})
        except InvalidRequest as exc:
            return _answer(STATUS, {"message": exc.message})

    def post(data: Any, who: Peer, dependent: bool) -> Response:
        def work() -> Response:
            me = owner(who)
            now = clock()
            known = ctl.known_chronos(me)
            job = c.parse_job(data, now=instant(now), known_jobs=known)
            if dependent and not job.parents:
                raise _problem("/parents", "a dependent job needs parents (post a scheduled job to /iso8601)")
            problems = Problems(status=STATUS)
            metronome.check_dependencies(job.name, job.parents, known, problems)
            problems.raise_if_any()
            spec = job.model_dump(by_alias=True, exclude_none=True)
            existing = ctl.entry(job.name)
            if existing is not None:
                if existing.source != "chronos" or not me.may_see(existing.owner):
                    raise NameTaken(job.name)
                ctl.replace(job.name, spec, me, now, STATUS)
            else:
                ctl.create("chronos", job.name, spec, run_as(job.run_as_user, me), now, STATUS)
            wake()
            return Response(status_code=204)

        return guarded(work)

    def iso8601(who: Caller, data: Annotated[Any, Body()] = None) -> Response:
        return post(data, who, dependent=False)

    def dependency(who: Caller, data: Annotated[Any, Body()] = None) -> Response:
        return post(data, who, dependent=True)

    def jobs(who: Caller) -> Response:
        def work() -> Response:
            now = clock()
            return _answer(200, [job_json(ctl, e, now) for e in ctl.entries(owner(who), "chronos")])

        return guarded(work)

    def search(who: Caller, name: str = "") -> Response:
        def work() -> Response:
            now = clock()
            found = [e for e in ctl.entries(owner(who), "chronos") if name.lower() in e.name.lower()]
            return _answer(200, [job_json(ctl, e, now) for e in found])

        return guarded(work)

    def run(name: str, who: Caller, arguments: str = "") -> Response:
        def work() -> Response:
            ctl.visible(name, owner(who), "chronos")
            args = [a for a in arguments.split(",") if a] if arguments else []
            for _, why in command_problems(args):  # appended to the job's command: the same bounds
                raise InvalidRequest("arguments", f"arguments {why}")
            ctl.start_run(name, owner(who), clock(), arguments=args)
            wake()
            return Response(status_code=204)

        return guarded(work)

    def delete(name: str, who: Caller) -> Response:
        def work() -> Response:
            ctl.visible(name, owner(who), "chronos")
            ctl.delete(name, owner(who), stop_runs=True)
            wake()
            return Response(status_code=204)

        return guarded(work)

    def kill(name: str, who: Caller) -> Response:
        def work() -> Response:
            ctl.visible(name, owner(who), "chronos")
            ctl.stop_all(name, owner(who), clock())
            wake()
            return Response(status_code=204)

        return guarded(work)

    def success(name: str, who: Caller) -> Response:
        def work() -> Response:
            ctl.visible(name, owner(who), "chronos")
            ctl.mark_success(name, owner(who), clock())
            wake()
            return Response(status_code=204)

        return guarded(work)

    routes: list[tuple[str, str, Callable[..., Response]]] = [
        ("POST", "/iso8601", iso8601),
        ("POST", "/dependency", dependency),
        ("GET", "/jobs", jobs),
        ("GET", "/jobs/search", search),
        ("PUT", "/job/success/{name}", success),
        ("PUT", "/job/{name}", run),
        ("DELETE", "/job/{name}", delete),
        ("DELETE", "/task/kill/{name}", kill),
    ]
    for method, path, endpoint in routes:
        for base, documented in (("/v1/scheduler", True), ("/scheduler", False)):
            router.add_api_route(
                base + path,
                endpoint,
                methods=[method],
                include_in_schema=documented,
                name=f"chronos{'' if documented else '_v0'}_{endpoint.__name__}",
                response_model=None,
            )
    return router
