"""Metronome's REST API for jobs, mounted under `/metronome` (a Metronome client's base URL is
`http://HOST:PORT/metronome`; corral's own `/v1/jobs` is for one-off jobs).

    GET    /v1/jobs[?embed=activeRuns|schedules|history|historySummary][&corral=true]
    POST   /v1/jobs                                   201 | 409 "Job with this id already exists" | 422
    GET    /v1/jobs/{id}[?embed=...][&corral=true]    404 {"id", "message": "Job not found"}
    PUT    /v1/jobs/{id}                              replaces the spec, keeps its schedules (the URL's id wins)
    DELETE /v1/jobs/{id}[?stopCurrentJobRuns=true]    409 while runs are active, or when another job depends on it
    GET|POST /v1/jobs/{id}/schedules, GET|PUT|DELETE /v1/jobs/{id}/schedules/{sid}
    POST   /v1/jobs/{id}/runs                         201 a manual run
    GET    /v1/jobs/{id}/runs[/{runId}][?corral=true] active runs (one run: finished ones too)
    POST   /v1/jobs/{id}/runs/{runId}/actions/stop
    GET    /v1/queue                                  runs waiting to start
    POST   /v0/scheduled-jobs, PUT /v0/scheduled-jobs/{id}   the older API (PUT replaces the schedules too)
    GET    /ping, /leader                             "pong"; {"leader": "host:port"}
    the rest of Metronome's routes (corral.mesos.metronome.ENDPOINTS): 501 "... is not supported by corral"

Objects are Metronome's, field for field; corral's own data about runs (`trigger`, `reason`) comes only with
`?corral=true` (docs/compat/metronome.md).

Answers use Metronome's shapes: 422 `{"message": "Object is not valid", "details": [{"path", "errors"}]}`, 400 "Not
a valid id: ...", 404/409 `{"message": ...}`. Bodies are read raw and validated by `corral.mesos.metronome`, so the
answer is Metronome's and not FastAPI's.
"""

from __future__ import annotations

import pwd
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from corral.api.app import Caller, Peer
from corral.api.limits import SafeJSONResponse
from corral.jobs.controller import Entry, JobsController
from corral.jobs.definitions import (
    STARTING,
    Conflict,
    DefinitionNotFound,
    NameTaken,
    Owner,
    RunNotFound,
    instant,
    iso,
    run_json,
)
from corral.mesos import metronome as m
from corral.mesos.errors import ErrorDetail, ObjectNotValid, Problems
from corral.model.errors import InvalidRequest

STATUS = 422
R = TypeVar("R", bound=Response)


def owner(who: Peer) -> Owner:
    return Owner(who.user, who.uid, who.gid)


def run_as(requested: str | None, who: Owner) -> Owner:
    """`run.user`: corral runs a job as the user who created it; root may name another user of this machine."""
    if requested is None or requested == who.user:
        return who
    if not who.root:
        why = f"corral runs a job as its creator ({who.user}); only root may name {requested}"
        raise ObjectNotValid([ErrorDetail("/run/user", (why,))])
    try:
        entry = pwd.getpwnam(requested)
    except KeyError:
        raise ObjectNotValid([ErrorDetail("/run/user", (f"no user {requested!r} on this machine",))]) from None
    return Owner(entry.pw_name, entry.pw_uid, entry.pw_gid)


def run_out(run: dict[str, Any], extras: bool = False) -> dict[str, Any]:
    """A run in Metronome's JobRun shape (id, jobId, status, createdAt, completedAt, tasks): a task's `completedAt`
    is left out until it has one, as Metronome writes an empty Option. corral's `trigger` and `reason` come only with
    `extras` (`?corral=true`): clients that parse runs strictly (dcos-metronome's protobuf models) refuse any other
    field."""
    out = run_json(run)
    trigger, reason = out.pop("trigger"), out.pop("reason")
    for task in out["tasks"]:
        if task["completedAt"] is None:
            del task["completedAt"]
    if extras:
        out["trigger"], out["reason"] = trigger, reason
    return out


def history(ctl: JobsController, name: str, full: bool) -> dict[str, Any]:
    state = ctl.state(name)
    out: dict[str, Any] = {
        "successCount": state["success_count"],
        "failureCount": state["failure_count"],
        "lastSuccessAt": iso(state["last_success_at"]),
        "lastFailureAt": iso(state["last_failure_at"]),
    }
    if full:
        # Metronome's JobRunInfo names the run's tasks too; a run pruned from the store has none left to name.
        tasks = {r["id"]: [t["job"] for t in r["tasks"]] for r in ctl.runs(name, fresh=False)}
        for key, listed in (("successfulFinishedRuns", "successful_runs"), ("failedFinishedRuns", "failed_runs")):
            out[key] = [
                {
                    "id": r["id"],
                    "createdAt": iso(r["createdAt"]),
                    "finishedAt": iso(r["finishedAt"]),
                    "tasks": tasks.get(r["id"], []),
                }
                for r in reversed(state[listed])
            ]
    return out


def job_json(
    ctl: JobsController, entry: Entry, now: float, embed: frozenset[str] = frozenset(), extras: bool = False
) -> dict[str, Any]:
    assert entry.metronome is not None
    out = m.job_to_json(entry.metronome, _next_from(ctl, entry, now))
    if "activeRuns" in embed:
        out["activeRuns"] = [run_out(r, extras) for r in ctl.runs(entry.name, active_only=True)]
    if "history" in embed:
        out["history"] = history(ctl, entry.name, True)
    if "historySummary" in embed:
        out["historySummary"] = history(ctl, entry.name, False)
    return out


def _next_from(ctl: JobsController, entry: Entry, now: float) -> datetime:
    """`nextRunAt` counts from the later of now and the schedule's cursor (a tick already handled is not next)."""
    cursors = ctl.state(entry.name)["cursors"]
    return instant(max([now, *cursors.values()]))


def _answer(status: int, body: Any) -> JSONResponse:
    return SafeJSONResponse(status_code=status, content=body)


def metronome_router(
    ctl: JobsController, lock: threading.Lock, wake: Callable[[], None], clock: Callable[[], float]
) -> APIRouter:
    router = APIRouter(prefix="/metronome", tags=["metronome"])

    def guarded(work: Callable[[], R], job_id: str | None = None) -> R | JSONResponse:
        """Run `work` under the daemon's lock and answer errors as Metronome does."""
        try:
            if job_id is not None:
                m.check_job_id(job_id)
            with lock:
                return work()
        except ObjectNotValid as exc:
            return _answer(exc.status, exc.to_json())
        except m.MetronomeError as exc:
            return _answer(exc.status, exc.body)
        except DefinitionNotFound as exc:
            return _answer(404, {"id": exc.name, "message": m.JOB_NOT_FOUND})
        except NameTaken:
            return _answer(409, {"message": m.JOB_EXISTS})
        except Conflict as exc:
            return _answer(409, {"message": str(exc)})
        except RunNotFound:
            return _answer(404, {"message": m.RUN_NOT_FOUND})
        except InvalidRequest as exc:
            return _answer(400, {"message": exc.message})

    def mine(job_id: str, who: Peer) -> Entry:
        return ctl.visible(job_id, owner(who), "metronome")

    @router.get("/v1/jobs")
    def list_jobs(
        who: Caller,
        embed: Annotated[list[str], Query()] = [],  # noqa: B006
        corral: bool = False,
    ) -> JSONResponse:
        def work() -> JSONResponse:
            wanted = m.parse_embed(embed)
            now = clock()
            return _answer(200, [job_json(ctl, e, now, wanted, corral) for e in ctl.entries(owner(who), "metronome")])

        return guarded(work)

    @router.post("/v1/jobs", status_code=201)
    @router.post("/v0/scheduled-jobs", status_code=201)  # the older API took the same document (schedules inline)
    def create(who: Caller, data: Annotated[Any, Body()] = None) -> JSONResponse:
        def work() -> JSONResponse:
            me = owner(who)
            job = m.parse_job(data, known_jobs=ctl.known_metronome(me))
            runner = run_as(job.run.user, me)
            now = clock()
            entry = ctl.create("metronome", job.id, _dump(job), runner, now, STATUS)
            return _answer(201, job_json(ctl, entry, now))

        return guarded(work)

    @router.get("/v1/jobs/{job_id}")
    def show(
        job_id: str,
        who: Caller,
        embed: Annotated[list[str], Query()] = [],  # noqa: B006
        corral: bool = False,
    ) -> JSONResponse:
        def work() -> JSONResponse:
            wanted = m.parse_embed(embed)
            return _answer(200, job_json(ctl, mine(job_id, who), clock(), wanted, corral))

        return guarded(work, job_id)

    def replace_with(job_id: str, who: Peer, data: Any, keep_schedules: bool) -> JSONResponse:
        def work() -> JSONResponse:
            old = mine(job_id, who)
            assert old.metronome is not None
            job = m.parse_job(data, known_jobs=ctl.known_metronome(owner(who)), url_id=job_id)
            if job.run.user not in (None, old.owner.user):
                why = f"the user a job runs as is fixed when it is created ({old.owner.user})"
                raise ObjectNotValid([ErrorDetail("/run/user", (why,))])
            merged = m.replace_job(old.metronome, job) if keep_schedules else job
            _check(merged)
            now = clock()
            entry = ctl.replace(job_id, _dump(merged), owner(who), now, STATUS)
            return _answer(200, job_json(ctl, entry, now))

        return guarded(work, job_id)

    @router.put("/v1/jobs/{job_id}")
    def replace(job_id: str, who: Caller, data: Annotated[Any, Body()] = None) -> JSONResponse:
        return replace_with(job_id, who, data, keep_schedules=True)

    @router.put("/v0/scheduled-jobs/{job_id}")
    def replace_scheduled(job_id: str, who: Caller, data: Annotated[Any, Body()] = None) -> JSONResponse:
        """The older API replaces the schedules with the job (a body without them leaves none)."""
        return replace_with(job_id, who, data, keep_schedules=False)

    @router.delete("/v1/jobs/{job_id}")
    def delete(job_id: str, who: Caller, stopCurrentJobRuns: bool = False) -> JSONResponse:
        def work() -> JSONResponse:
            now = clock()
            entry = mine(job_id, who)
            body = job_json(ctl, entry, now)
            ctl.delete(job_id, owner(who), stopCurrentJobRuns)
            wake()
            return _answer(200, body)

        return guarded(work, job_id)

    # ------------------------------------------------------------------------------------------ schedules
    def schedule_of(entry: Entry, sid: str) -> m.ScheduleSpec:
        assert entry.metronome is not None
        for s in entry.metronome.schedules:
            if s.id == sid:
                return s
        raise m.MetronomeError(404, {"message": m.SCHEDULE_NOT_FOUND})

    def save(entry: Entry, job: m.MetronomeJob, who: Peer) -> Entry:
        _check(job)
        return ctl.replace(entry.name, _dump(job), owner(who), clock(), STATUS)

    @router.get("/v1/jobs/{job_id}/schedules")
    def schedules(job_id: str, who: Caller) -> JSONResponse:
        def work() -> JSONResponse:
            entry = mine(job_id, who)
            assert entry.metronome is not None
            when = _next_from(ctl, entry, clock())
            return _answer(200, [m.schedule_to_json(s, when) for s in entry.metronome.schedules])

        return guarded(work, job_id)

    @router.post("/v1/jobs/{job_id}/schedules", status_code=201)
    def add_schedule(job_id: str, who: Caller, data: Annotated[Any, Body()] = None) -> JSONResponse:
        def work() -> JSONResponse:
            entry = mine(job_id, who)
            assert entry.metronome is not None
            spec = m.parse_schedule(data)
            saved = save(entry, m.add_schedule(entry.metronome, spec), who)
            return _answer(201, m.schedule_to_json(spec, _next_from(ctl, saved, clock())))

        return guarded(work, job_id)

    @router.get("/v1/jobs/{job_id}/schedules/{schedule_id}")
    def show_schedule(job_id: str, schedule_id: str, who: Caller) -> JSONResponse:
        def work() -> JSONResponse:
            entry = mine(job_id, who)
            return _answer(200, m.schedule_to_json(schedule_of(entry, schedule_id), _next_from(ctl, entry, clock())))

        return guarded(work, job_id)

    @router.put("/v1/jobs/{job_id}/schedules/{schedule_id}")
    def replace_schedule(
        job_id: str, schedule_id: str, who: Caller, data: Annotated[Any, Body()] = None
    ) -> JSONResponse:
        def work() -> JSONResponse:
            entry = mine(job_id, who)
            assert entry.metronome is not None
            schedule_of(entry, schedule_id)
            spec = m.parse_schedule(data, url_id=schedule_id)
            kept = [spec if s.id == schedule_id else s for s in entry.metronome.schedules]
            saved = save(entry, entry.metronome.model_copy(update={"schedules": kept}), who)
            return _answer(200, m.schedule_to_json(spec, _next_from(ctl, saved, clock())))

        return guarded(work, job_id)

    @router.delete("/v1/jobs/{job_id}/schedules/{schedule_id}")
    def delete_schedule(job_id: str, schedule_id: str, who: Caller) -> Response:
        def work() -> Response:
            entry = mine(job_id, who)
            assert entry.metronome is not None
            schedule_of(entry, schedule_id)
            kept = [s for s in entry.metronome.schedules if s.id != schedule_id]
            save(entry, entry.metronome.model_copy(update={"schedules": kept}), who)
            return Response(status_code=200)  # Metronome answers a bare `Ok`

        return guarded(work, job_id)

    # ------------------------------------------------------------------------------------------ runs
    @router.post("/v1/jobs/{job_id}/runs", status_code=201)
    def start_run(job_id: str, who: Caller) -> JSONResponse:
        def work() -> JSONResponse:
            mine(job_id, who)
            run = ctl.start_run(job_id, owner(who), clock())
            wake()
            return _answer(201, run_out(run))

        return guarded(work, job_id)

    @router.get("/v1/jobs/{job_id}/runs")
    def active_runs(job_id: str, who: Caller, corral: bool = False) -> JSONResponse:
        def work() -> JSONResponse:
            mine(job_id, who)
            return _answer(200, [run_out(r, corral) for r in ctl.runs(job_id, active_only=True)])

        return guarded(work, job_id)

    @router.get("/v1/jobs/{job_id}/runs/{run_id}")
    def show_run(job_id: str, run_id: str, who: Caller, corral: bool = False) -> JSONResponse:
        def work() -> JSONResponse:
            mine(job_id, who)
            return _answer(200, run_out(ctl.run(job_id, run_id), corral))

        return guarded(work, job_id)

    @router.post("/v1/jobs/{job_id}/runs/{run_id}/actions/stop")
    def stop_run(job_id: str, run_id: str, who: Caller) -> JSONResponse:
        def work() -> JSONResponse:
            run = ctl.stop_run(job_id, run_id, owner(who), clock())
            wake()
            return _answer(200, run_out(run))

        return guarded(work, job_id)

    @router.get("/v1/queue")
    def queue(who: Caller) -> JSONResponse:
        def work() -> JSONResponse:
            out = []
            for e in ctl.entries(owner(who), "metronome"):
                waiting = [{"runId": r["id"]} for r in ctl.runs(e.name, active_only=True) if r["status"] == STARTING]
                if waiting:
                    out.append({"jobId": e.name, "runs": waiting})
            return _answer(200, out)

        return guarded(work)

    # ------------------------------------------------------------------------------------------ the rest
    @router.get("/ping")
    def ping() -> Response:
        return PlainTextResponse("pong")

    @router.get("/leader")
    def leader(request: Request) -> JSONResponse:
        return _answer(200, {"leader": request.url.netloc})

    for endpoint in m.ENDPOINTS:
        if not endpoint.served:
            router.add_api_route(
                endpoint.path.replace("{file}", "{file:path}"),
                _refuse(endpoint.method, endpoint.path),
                methods=[endpoint.method],
                include_in_schema=False,
            )

    return router


def _refuse(method: str, path: str) -> Callable[[], JSONResponse]:
    def refuse() -> JSONResponse:
        err = m.not_supported(method, path)
        return _answer(err.status, err.body)

    return refuse


def _dump(job: m.MetronomeJob) -> dict[str, Any]:
    return job.model_dump(by_alias=True, exclude_none=True)


def _check(job: m.MetronomeJob) -> None:
    """The rules over a job put together from its stored parts (one schedule; not with dependencies)."""
    problems = Problems()
    m.check_job(job, None, problems)
    problems.raise_if_any()
