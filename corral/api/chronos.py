"""Chronos' REST API, mounted under `/chronos` (a Chronos client's base URL is `http://HOST:PORT/chronos`); every
scheduler route is there both as `/v1/scheduler/...` (Chronos 3) and `/scheduler/...` (Chronos 2).

`ENDPOINTS` is Chronos' whole API, endpoint by endpoint, served or not; docs/compat/chronos.md holds the same table
and a test keeps the two equal. What corral serves:

    POST   /v1/scheduler/iso8601             a scheduled job (or one run now, with neither schedule nor parents);
    POST   /v1/scheduler/dependency          a dependent job (parents); posting an existing name updates it; 204
                                             (PUT on both: Chronos 2's update, which chronos-python sends without v1)
    GET    /v1/scheduler/jobs                every job, with its counters and the schedule as it stands now
    GET    /v1/scheduler/jobs/search         ?name=&command=&any=&limit=10&offset=0, as Chronos matched them
    GET    /v1/scheduler/jobs/summary        {"jobs": [{name, status, state, schedule, parents, disabled}]}
    GET    /v1/scheduler/job/{name}          one job
    PUT    /v1/scheduler/job/{name}[?arguments=a,b]   run it now (arguments appended when `shell` is false)
    DELETE /v1/scheduler/job/{name}          delete it (running tasks are killed; its children are re-parented)
    DELETE /v1/scheduler/task/kill/{name}    kill its running tasks
    PUT    /v1/scheduler/job/success/{name}  count a success, so that its dependants run (Chronos issue #600)
    GET    /v1/scheduler/job/stat/{name}     run-time histogram (ms) and task history, from corral's run history
    GET    /v1/scheduler/stats/{percentile}  every job's run time at that percentile, slowest first (seconds)
    GET    /v1/scheduler/graph/dot|csv       the dependency graph (DOT; Chronos' node/link CSV)
    GET    /v1/scheduler/leader              {"leader": "host:port"}: this corral
    GET    /ping, /metrics                   "pong"; Dropwizard metrics JSON (per-job run times and outcome counters)

The GET routes that answer jobs take `corral=true`, which adds a `corral` object (the user the job runs as, its
recent runs and their corral job ids); without it a job has exactly Chronos' fields (`corral.mesos.chronos.job_shape`).
Errors come in Chronos' ApiResult shape, `{"status": "Bad Request", "message": "..."}`; a bad job's answer (400, as
Chronos) also lists `details` by JSON pointer (`corral.mesos.errors`).
"""

from __future__ import annotations

import pwd
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from corral.api.app import Caller, Peer
from corral.api.limits import SafeJSONResponse
from corral.jobs.controller import Entry, JobsController
from corral.jobs.definitions import Conflict, DefinitionNotFound, NameTaken, Owner, instant, iso
from corral.mesos import chronos as c
from corral.mesos.common import Endpoint
from corral.mesos.errors import ErrorDetail, ObjectNotValid
from corral.model.errors import InvalidRequest
from corral.model.limits import command_problems
from corral.schedule.iso8601 import RepeatingInterval

STATUS = c.STATUS
NOT_SUPPORTED = 501  # Not Implemented: the endpoint exists in Chronos, and corral does not do it
TASK_STATUS = {  # Mesos task states (corral's runs keep them) as Chronos' task-stat history names them
    "TASK_FINISHED": "Success",
    "TASK_FAILED": "Fail",
    "TASK_KILLED": "Fail",
    "TASK_RUNNING": "Running",
    "TASK_STARTING": "Running",
    "TASK_CREATED": "Idle",
}
CORRAL_RUNS_SHOWN = 5  # runs in the `corral` object of a job asked for with corral=true


# Chronos' REST API. `path` is relative to the mount (`/chronos`); `/v1/scheduler/...` rows are also served (or
# refused) as `/scheduler/...` (Chronos 2); `/scheduler/...` rows are Chronos 2's alone. Unserved rows answer 501 in
# Chronos' shape, saying why.
ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("POST", "/v1/scheduler/iso8601", True, "a scheduled job; an existing name is updated"),
    Endpoint("PUT", "/v1/scheduler/iso8601", True, "Chronos 2's update; the same as POST"),
    Endpoint("POST", "/v1/scheduler/dependency", True, "a dependent job; an existing name is updated"),
    Endpoint("PUT", "/v1/scheduler/dependency", True, "Chronos 2's update; the same as POST"),
    Endpoint("GET", "/v1/scheduler/jobs", True, "every job the caller may see"),
    Endpoint("GET", "/v1/scheduler/jobs/search", True, "name, command, any, limit (10), offset (0)"),
    Endpoint("GET", "/v1/scheduler/jobs/summary", True, "name, status, state, schedule, parents, disabled"),
    Endpoint("GET", "/v1/scheduler/job/{name}", True, "one job"),
    Endpoint("PUT", "/v1/scheduler/job/{name}", True, "run now; `arguments` appended when `shell` is false"),
    Endpoint("DELETE", "/v1/scheduler/job/{name}", True, "kills its tasks; children re-parented as in Chronos"),
    Endpoint("PUT", "/v1/scheduler/job/success/{name}", True, "counts a success; dependants run"),
    Endpoint("GET", "/v1/scheduler/job/stat/{name}", True, "histogram (ms) and taskStatHistory from corral's runs"),
    Endpoint(
        "POST",
        "/v1/scheduler/job/{name}/task/{task}/progress",
        False,
        "data-processing progress counters need Chronos' Cassandra task statistics, which corral does not keep",
    ),
    Endpoint("GET", "/v1/scheduler/stats/{percentile}", True, "99thPercentile, 98th, 95th, 75th, median, mean"),
    Endpoint("DELETE", "/v1/scheduler/task/kill/{name}", True, "kills the job's running tasks"),
    Endpoint(
        "PUT",
        "/scheduler/task/{task}",
        False,
        "Chronos 2's callback for asynchronous jobs (removed in Chronos 3): a corral task's outcome is its exit",
    ),
    Endpoint(
        "DELETE",
        "/scheduler/task/all",
        False,
        "Chronos 2's purge of every queued task of every job; kill a job's tasks with /task/kill/{name}",
    ),
    Endpoint("GET", "/v1/scheduler/graph/dot", True, "JGraphT's DOT format"),
    Endpoint("GET", "/v1/scheduler/graph/csv", True, "node,NAME,LAST_STATE,JOB_STATE and link,PARENT,CHILD lines"),
    Endpoint("GET", "/v1/scheduler/leader", True, "this corral's address: it is always the leader"),
    Endpoint("GET", "/ping", True, "pong"),
    Endpoint("GET", "/metrics", True, "Dropwizard JSON: per-job run-time histograms and outcome counters"),
    Endpoint("GET", "/logging", False, "Chronos' log-level servlet: corral's log level is set when it starts"),
    Endpoint("POST", "/logging", False, "Chronos' log-level servlet: corral's log level is set when it starts"),
    Endpoint("GET", "/", False, "Chronos' web UI: use corral's dashboard"),
)


def owner(who: Peer) -> Owner:
    return Owner(who.user, who.uid, who.gid)


def counters(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "successCount": state["success_count"],
        "errorCount": state["failure_count"],
        "lastSuccess": iso(state["last_success_at"]) or "",
        "lastError": iso(state["last_failure_at"]) or "",
        "errorsSinceLastSuccess": state["errors_since_last_success"],
    }


def schedule_now(ctl: JobsController, entry: Entry, now: float) -> tuple[str | None, bool]:
    """The schedule as it stands now (the ticks handled so far rewritten out of it, `Rn` counting down) and whether
    no tick is left. A job posted with neither schedule nor parents is Chronos' `R1/<posted>/PT24H`, R0 once run."""
    assert entry.chronos is not None
    state = ctl.state(entry.name)
    if entry.definition.run_once_now:
        ran = bool(ctl.runs(entry.name, fresh=False))
        return f"R{0 if ran else 1}/{iso(entry.created_at)}/PT24H", ran
    for rule, sched in entry.schedules:
        if isinstance(sched, RepeatingInterval):
            cursor = instant(state["cursors"].get(rule.id, now))
            return sched.rewritten(cursor), sched.remaining_after(cursor) == 0
    return None, False


def job_json(ctl: JobsController, entry: Entry, now: float, *, listing: bool = False, extra: bool = False) -> Any:
    """The job as Chronos shows it: the resources it gets (defaults for 0), its counters, and the schedule rewritten
    from the ticks handled so far; a job with no tick left is disabled. `extra`: corral's own object too."""
    assert entry.chronos is not None
    d = entry.definition
    state = ctl.state(entry.name)
    schedule, exhausted = schedule_now(ctl, entry, now)
    out = c.job_shape(
        entry.chronos,
        schedule=schedule,
        run_as=entry.owner.user,
        cpus=d.request.cpu_milli / 1000,
        mem=d.request.memory_mib,
        disk=d.disk_mib,
        counters=counters(state),
        disabled=entry.chronos.disabled or state["auto_disabled"] or exhausted,
        listing=listing,
    )
    if extra:
        runs = ctl.runs(entry.name, fresh=False)[-CORRAL_RUNS_SHOWN:]
        out["corral"] = {
            "user": entry.owner.user,
            "runs": [
                {
                    "id": r["id"],
                    "status": r["status"],
                    "trigger": r["trigger"],
                    "createdAt": iso(r["created_at"]),
                    "completedAt": iso(r["completed_at"]),
                    "reason": r["reason"],
                    "jobs": [t["job"] for t in r["tasks"]],  # corral job ids: `corral explain ID`, `corral logs ID`
                }
                for r in runs
            ],
        }
    return out


def chronos_error(status: int, message: str, **extra: Any) -> JSONResponse:
    """Chronos' ApiResult: `status` is the reason phrase, as JAX-RS' Status.toString() wrote it."""
    return SafeJSONResponse(
        status_code=status, content={"status": HTTPStatus(status).phrase, "message": message, **extra}
    )


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


def _fmt_time(t: float | None) -> str:
    """Chronos' task-stat times: Joda's `MM/dd/yy HH:mm:ss` (UTC), or N/A."""
    return "N/A" if t is None else datetime.fromtimestamp(t, UTC).strftime("%m/%d/%y %H:%M:%S")


def _fmt_duration(seconds: float) -> str:
    """Joda's period format in Chronos' task stats: hours, minutes when not zero, seconds always (`1h0s`, `2m5s`)."""
    total = int(seconds)
    h, m, s = total // 3600, total % 3600 // 60, total % 60
    return f"{f'{h}h' if h else ''}{f'{m}m' if m else ''}{s}s"


def _tasks(ctl: JobsController, entry: Entry) -> list[dict[str, Any]]:
    return [t for r in ctl.runs(entry.name, fresh=False) for t in r["tasks"]]


def _durations_ms(tasks: Sequence[dict[str, Any]]) -> list[float]:
    """Run times of the tasks that succeeded: Chronos fed its histogram on each finished task, and only then."""
    return [
        (t["completed_at"] - t["started_at"]) * 1000.0
        for t in tasks
        if t["status"] == "TASK_FINISHED" and t["started_at"] is not None and t["completed_at"] is not None
    ]


def _task_stat(name: str, node: str, task: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "taskId": task["job"],
        "jobName": name,
        "slaveId": node,
        "startTime": _fmt_time(task["started_at"]),
        "endTime": _fmt_time(task["completed_at"]),
    }
    if task["started_at"] is not None and task["completed_at"] is not None:
        out["duration"] = _fmt_duration(task["completed_at"] - task["started_at"])
    out["status"] = TASK_STATUS.get(task["status"], "Idle")
    return out


def chronos_router(
    ctl: JobsController, lock: threading.Lock, wake: Callable[[], None], clock: Callable[[], float]
) -> APIRouter:
    router = APIRouter(prefix="/chronos", tags=["chronos"])

    def guarded(work: Callable[[], Response]) -> Response:
        try:
            with lock:
                return work()
        except ObjectNotValid as exc:
            return chronos_error(exc.status, str(exc), details=exc.to_json()["details"])
        except DefinitionNotFound as exc:
            return chronos_error(404, f"Job '{exc.name}' not found")
        except NameTaken as exc:
            return chronos_error(409, f"a job named {exc.name} already exists")
        except Conflict as exc:
            return chronos_error(409, str(exc))
        except InvalidRequest as exc:
            return chronos_error(STATUS, exc.message)

    def post(data: Any, who: Peer, dependent: bool) -> Response:
        def work() -> Response:
            me = owner(who)
            now = clock()
            known = ctl.known_chronos(me)
            job = c.parse_job(data, now=instant(now), known_jobs=known)
            if dependent and not job.parents:
                raise _problem("/parents", "a dependent job needs parents (post a scheduled job to /iso8601)")
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

    def jobs(who: Caller, corral: bool = False) -> Response:
        def work() -> Response:
            now = clock()
            found = ctl.entries(owner(who), "chronos")
            return _answer(200, [job_json(ctl, e, now, listing=True, extra=corral) for e in found])

        return guarded(work)

    def search(
        who: Caller,
        name: str = "",
        command: str = "",
        any: str = "",
        limit: int = 10,
        offset: int = 0,
        corral: bool = False,
    ) -> Response:
        """Chronos' search: each given term (lower case) is contained in the job's name / command; `any` lets a job
        that failed those through when the term is in its name or command; then `offset` and `limit` (10)."""

        def matches(e: Entry) -> bool:
            job_name, cmd = e.name.lower(), e.chronos.command.lower() if e.chronos else ""
            ok = (not name or name.lower() in job_name) and (not command or command.lower() in cmd)
            return ok or bool(any and (any.lower() in job_name or any.lower() in cmd))

        def work() -> Response:
            now = clock()
            found = [e for e in ctl.entries(owner(who), "chronos") if matches(e)]
            page = found[max(offset, 0) : max(offset, 0) + max(limit, 0)]
            return _answer(200, [job_json(ctl, e, now, extra=corral) for e in page])

        return guarded(work)

    def one(name: str, who: Caller, corral: bool = False) -> Response:
        def work() -> Response:
            entry = ctl.visible(name, owner(who), "chronos")
            return _answer(200, job_json(ctl, entry, clock(), extra=corral))

        return guarded(work)

    def summary(who: Caller) -> Response:
        def work() -> Response:
            now = clock()
            out = []
            for e in ctl.entries(owner(who), "chronos"):
                shown = job_json(ctl, e, now)
                queued, running = _activity(e)
                out.append(
                    {
                        "name": e.name,
                        "status": c.last_state(shown["lastSuccess"], shown["lastError"]),
                        "state": c.job_state(queued, running),
                        "schedule": shown.get("schedule", ""),
                        "parents": shown.get("parents", []),
                        "disabled": shown["disabled"],
                    }
                )
            return _answer(200, {"jobs": out})

        return guarded(work)

    def _activity(entry: Entry) -> tuple[int, int]:
        """Tasks of the job's active runs that wait for a place, and that run (runs brought up to date first)."""
        queued = running = 0
        for r in ctl.runs(entry.name, active_only=True):
            task = r["tasks"][-1] if r["tasks"] else None
            if task is not None and task["status"] in ("TASK_RUNNING", "TASK_STARTING"):
                running += 1
            else:
                queued += 1
        return queued, running

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
            me = owner(who)
            entry = ctl.visible(name, me, "chronos")
            now = clock()
            reparent(entry, me, now)
            ctl.delete(name, me, stop_runs=True)
            wake()
            return Response(status_code=204)

        return guarded(work)

    def reparent(entry: Entry, me: Owner, now: float) -> None:
        """Chronos' delete keeps the graph whole: a dependent job's children take its parents instead; a scheduled
        job's children become scheduled jobs with its schedule as it stands. Children the caller may not change
        are left alone, and the delete is then refused (409) by the controller."""
        assert entry.chronos is not None
        children = [e for e in ctl.entries(None, "chronos") if entry.name in e.parents]
        if not children or not all(me.may_see(ch.owner) for ch in children):
            return
        schedule, _ = schedule_now(ctl, entry, now)
        for child in children:
            assert child.chronos is not None
            spec = child.chronos.model_dump(by_alias=True, exclude_none=True)
            if entry.parents:
                spec["parents"] = [p for p in child.parents if p != entry.name] + [
                    p for p in entry.parents if p not in child.parents
                ]
            else:
                spec.pop("parents", None)
                spec["schedule"] = schedule
                spec["scheduleTimeZone"] = entry.chronos.schedule_time_zone
            ctl.replace(child.name, spec, me, now, STATUS)

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
            return PlainTextResponse(f"marked job {name} as successful: true")

        return guarded(work)

    def stat(name: str, who: Caller) -> Response:
        def work() -> Response:
            entry = ctl.visible(name, owner(who), "chronos")
            tasks = _tasks(ctl, entry)
            history = sorted(tasks, key=lambda t: t["started_at"] or 0.0, reverse=True)  # the newest first
            node = ctl.daemon.node.name
            return _answer(
                200,
                {
                    "histogram": c.histogram(_durations_ms(tasks)),
                    "taskStatHistory": [_task_stat(name, node, t) for t in history],
                },
            )

        return guarded(work)

    def stats(percentile: str, who: Caller) -> Response:
        """Chronos' StatsResource: jobs by their run time at `percentile`, slowest first, in seconds; an unknown
        percentile matches no job (an empty list, as in Chronos)."""

        def work() -> Response:
            if percentile not in c.PERCENTILES:
                return _answer(200, [])
            times = [
                (e.name, float(c.histogram(_durations_ms(_tasks(ctl, e)))[percentile]))
                for e in ctl.entries(owner(who), "chronos")
            ]
            times.sort(key=lambda nt: nt[1], reverse=True)
            return _answer(200, [{"jobNameLabel": n, "time": t / 1000.0} for n, t in times])

        return guarded(work)

    def _graph(who: Peer) -> tuple[list[Entry], list[tuple[str, str]]]:
        found = ctl.entries(owner(who), "chronos")
        names = {e.name for e in found}
        edges = [(p, e.name) for e in found for p in e.parents if p in names]
        return found, edges

    def graph_dot(who: Caller) -> Response:
        def work() -> Response:
            found, edges = _graph(who)
            return PlainTextResponse(c.dot_graph([e.name for e in found], edges))

        return guarded(work)

    def graph_csv(who: Caller) -> Response:
        def work() -> Response:
            found, edges = _graph(who)
            nodes = []
            for e in found:
                shown = counters(ctl.state(e.name))
                nodes.append(
                    (e.name, c.last_state(shown["lastSuccess"], shown["lastError"]), c.job_state(*_activity(e)))
                )
            return PlainTextResponse(c.csv_graph(nodes, edges))

        return guarded(work)

    def leader(request: Request, who: Caller) -> Response:
        return _answer(200, {"leader": request.headers.get("host") or request.url.netloc})

    def ping(who: Caller) -> Response:
        return PlainTextResponse("pong\n")

    def metrics(who: Caller) -> Response:
        """Dropwizard's MetricsServlet JSON with the metrics Chronos registered per job and corral can state
        truthfully: `jobs.run.time.NAME` (successful run times, ms) and `jobs.run.success|failure.NAME` counters."""

        def work() -> Response:
            histograms: dict[str, Any] = {}
            count: dict[str, Any] = {}
            for e in ctl.entries(owner(who), "chronos"):
                histograms[f"jobs.run.time.{e.name}"] = c.dropwizard_histogram(_durations_ms(_tasks(ctl, e)))
                state = ctl.state(e.name)
                count[f"jobs.run.failure.{e.name}"] = {"count": state["failure_count"]}
                count[f"jobs.run.success.{e.name}"] = {"count": state["success_count"]}
            body = {"version": "3.0.0", "gauges": {}, "counters": count, "histograms": histograms}
            return _answer(200, {**body, "meters": {}, "timers": {}})

        return guarded(work)

    def refuse(method: str, path: str, why: str) -> Callable[..., Response]:
        def not_supported(who: Caller) -> Response:
            return chronos_error(NOT_SUPPORTED, f"{method} {path} is not supported by corral: {why}")

        return not_supported

    served: dict[tuple[str, str], Callable[..., Response]] = {
        ("POST", "/v1/scheduler/iso8601"): iso8601,
        ("PUT", "/v1/scheduler/iso8601"): iso8601,
        ("POST", "/v1/scheduler/dependency"): dependency,
        ("PUT", "/v1/scheduler/dependency"): dependency,
        ("GET", "/v1/scheduler/jobs"): jobs,
        ("GET", "/v1/scheduler/jobs/search"): search,
        ("GET", "/v1/scheduler/jobs/summary"): summary,
        ("PUT", "/v1/scheduler/job/success/{name}"): success,
        ("GET", "/v1/scheduler/job/stat/{name}"): stat,
        ("GET", "/v1/scheduler/job/{name}"): one,
        ("PUT", "/v1/scheduler/job/{name}"): run,
        ("DELETE", "/v1/scheduler/job/{name}"): delete,
        ("GET", "/v1/scheduler/stats/{percentile}"): stats,
        ("DELETE", "/v1/scheduler/task/kill/{name}"): kill,
        ("GET", "/v1/scheduler/graph/dot"): graph_dot,
        ("GET", "/v1/scheduler/graph/csv"): graph_csv,
        ("GET", "/v1/scheduler/leader"): leader,
        ("GET", "/ping"): ping,
        ("GET", "/metrics"): metrics,
    }
    assert {(e.method, e.path) for e in ENDPOINTS if e.served} == set(served), "ENDPOINTS and the routes differ"
    # Fixed paths before templated ones (job/success/x before job/{name}; task/all before task/{task}).
    for e in sorted(ENDPOINTS, key=lambda e: ("{" in e.path, e.path)):
        endpoint = served[(e.method, e.path)] if e.served else refuse(e.method, e.path, e.note)
        bases = [(e.path, True)]
        if e.path.startswith("/v1/scheduler/"):
            bases.append((e.path.removeprefix("/v1"), False))  # Chronos 2
        for path, documented in bases:
            router.add_api_route(
                path,
                endpoint,
                methods=[e.method],
                include_in_schema=documented and e.served,  # the refusals are in docs/compat/chronos.md
                name=f"chronos_{e.method.lower()}_{path}",
                response_model=None,
            )
    return router
