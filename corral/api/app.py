"""The HTTP API of `corral serve`.

    POST /v1/jobs                      submit (201, the job)
    GET  /v1/jobs                      the caller's jobs (root: everyone's), oldest first, 1000 at most a page;
         &state=&user=&name=&since=&limit=&order=newest&after=ID&fields=   filters, paging (X-Corral-Next-After)
         &array=ID | ID_[1-5]          a job array's tasks, or some of them (docs/arrays.md)
         &layout=columns               the page as a list per field ({"id": [...], "state": [...]}): `corral ps`
    POST /v1/jobs/cancel               bulk cancel: {"ids": [...]} | {"state": "queued"} | {"name": "..."}
    {id} in the routes below: a job, an array's task (12_7); an array's id, or a range of its tasks (12_[1-5]), in
    cancel, hold, release, PATCH (each task) and explain (its tasks counted, then the first waiting task's)
    GET  /v1/jobs/{id}                 one job
    GET  /v1/jobs/{id}/script          a batch job's script as stored (text/plain; docs/batch-scripts.md)
    POST /v1/jobs/{id}/cancel          cancel it
    GET  /v1/jobs/{id}/explain         {"state": ..., "reason": ...}: why it waits, or how it ended; a queued job's
                                       position, the jobs holding what it waits for, its reservation and estimated
                                       start (docs/backfill.md)
    GET  /v1/jobs/{id}/logs?offset=N   its output from byte N (text/plain); ?tail=N: its last N bytes; a gang's
         &instance=K                   instance K's (default 0; X-Corral-Instances: how many it has)
    GET  /v1/gpus                      each GPU: who holds which share, live use, memory of foreign processes
    GET  /v1/acct, /v1/acct/summary    jobs that ended, with hours and GPU efficiency (corral.api.acct)
    GET  /metrics                      Prometheus text format (docs/metrics.md); per-job series for root only
    GET  /healthz, /readyz             alive; ready (store answers, a scheduling round ended recently): no caller needed
    POST /v1/tokens, GET /v1/tokens, DELETE /v1/tokens/{id}   bearer tokens for TCP (Unix socket only)

The caller is whoever is on the other end of the Unix socket: the server puts (uid, gid, user) from SO_PEERCRED into
`scope["corral.peer"]` and "unix" into `scope["corral.via"]`; over TCP it is the owner of the bearer token ("token").
Users see and cancel only their own jobs (another user's job is "no job N"); uid 0 sees all.
Errors are `{"detail": {"field": ..., "message": ...}}`: 422 for a bad request, 404 for an unknown job (or route),
405 for a method a route does not take, 400 for a body that is not JSON, 409 for an idempotency key used for another
request, 413 for a body over 1 MiB, 415 for a body that is not JSON by its content type, 503 when the store fails.
Under the peers' prefixes (/metronome, /marathon, /chronos) the same errors come in the peer's shape
(`corral.api.limits`). Every limit on input is in docs/limits.md.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import pwd
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from corral.api.limits import MAX_OFFSET, InputLimits, SafeJSONResponse, clean, face_of, message_answer
from corral.api.schemas import (
    IDEMPOTENCY_KEY,
    CancelManyIn,
    CancelManyOut,
    ErrorOut,
    ExplainOut,
    GpuOut,
    HolderOut,
    JobColumns,
    JobOut,
    JobRow,
    ReservationOut,
    SubmitIn,
    TokenIn,
    TokenOut,
    UpdateIn,
    job_columns,
    job_row,
    unknown_field,
)
from corral.daemon.core import Daemon, Targets
from corral.daemon.gang import MAX_INSTANCES, instance_log
from corral.daemon.preemption import PREEMPTING, Rules
from corral.daemon.queues import Forbidden
from corral.daemon.scheduler import clock_text, running_of, work_of
from corral.daemon.tokens import TokenFileError, TokenNotFound, TokenStore
from corral.daemon.waiting import queue_story, wait_story
from corral.jobs import array, dependency
from corral.jobs.batch import Script
from corral.jobs.environment import admitted_environment
from corral.jobs.model import Job, JobSpec, JobState, check_admissible, spec_to_json
from corral.metrics import CONTENT_TYPE as METRICS_TYPE
from corral.metrics import render_daemon
from corral.model.errors import InvalidRequest
from corral.model.requests import build_request
from corral.model.units import parse_duration_seconds
from corral.store import JobNotFound, JobQuery, KeyInUse, StoreError

log = logging.getLogger("corral.api")

PEER_KEY = "corral.peer"
VIA_KEY = "corral.via"  # "unix" (SO_PEERCRED) or "token" (TCP with a bearer token)
MAX_LOG_CHUNK = 4 * 1024 * 1024
#: `GET /v1/jobs` answers at most this many jobs unless told otherwise (`limit`), and never more than the maximum.
DEFAULT_LIST_LIMIT = 1000
MAX_LIST_LIMIT = 10000
#: `explain` of a running job weighs at most this many waiting jobs as its possible preemptors.
EXPLAIN_WAITING = 1000
#: /readyz: the scheduling loop counts as running while a round has ended within this many seconds.
READY_WITHIN_S = 30.0


@dataclass(frozen=True)
class Peer:
    uid: int
    gid: int
    user: str
    via: str = "token"

    @property
    def root(self) -> bool:
        return self.uid == 0


def api_field(name: str) -> str:
    """CLI flag names in errors (`--gpu-fraction`) as API field names (`gpu_fraction`)."""
    return name.lstrip("-").replace("-", "_")


def error(status: int, field: str, message: str) -> JSONResponse:
    return SafeJSONResponse(status_code=status, content={"detail": {"field": field, "message": message}})


def peer(request: Request) -> Peer:
    value = request.scope.get(PEER_KEY)
    if value is None:
        raise HTTPException(401, {"field": "peer", "message": "unknown caller: connect over the corral Unix socket"})
    uid, gid, user = value
    return Peer(int(uid), int(gid), str(user), str(request.scope.get(VIA_KEY, "token")))


Caller = Annotated[Peer, Depends(peer)]

#: The priorities a user other than root may give (root, and the queues file's admins, whom root named: any 32-bit
#: priority; docs/queues.md "Priority bounds"). Higher runs first, so an unbounded priority let any user jump every
#: queue; the range leaves users room to order their own work.
USER_PRIORITY = (-100, 100)


def check_priority(priority: int, who: Peer) -> None:
    low, high = USER_PRIORITY
    if not who.root and not low <= priority <= high:
        raise HTTPException(
            403,
            {
                "field": "priority",
                "message": f"must be in {low}..{high} (only root or an admin of the queues file may go beyond), got "
                f"{priority}",
            },
        )


def spec_from(body: SubmitIn, who: Peer) -> JobSpec:
    """The JobSpec of a submission; raises InvalidRequest naming the bad field."""
    request = build_request(
        body.gpus,
        body.gpu_fraction,
        body.gpu_memory,
        body.cpus,
        body.memory,
        body.gpu_model,
        None,
        [],
        [],
        body.priority,
        None,
        body.name,
    )
    # A bare number is minutes, as Slurm's --time reads it; 45m, 2h, 1:30:00 and 2-12 say their unit.
    limit = (
        parse_duration_seconds(body.time_limit, "time_limit", bare="minutes") if body.time_limit is not None else None
    )
    return JobSpec(
        command=tuple(body.command),
        request=request,
        user=who.user,
        uid=who.uid,
        gid=who.gid,
        name=body.name,
        retries=body.retries,
        time_limit_s=limit,
        env=admitted_environment(body.env),  # never CORRAL_TOKEN & co (corral.jobs.environment)
        cwd=body.cwd,
        preemptible=body.preemptible,
        instances=body.instances,
        gang=body.gang,
        queue=body.queue or "",
        dependency=dependency.parse(body.dependency) if body.dependency is not None else (),
        kill_on_invalid_dep=body.kill_on_invalid_dep,
        script=None
        if body.script is None
        else Script(body.script.text, body.script.dialect, body.command[0], tuple(body.command[1:])),
        output=body.output or "",
        error=body.error or "",
        array=array_of(body.array),
    )


def check_outputs(spec: JobSpec) -> None:
    """Refuse an --output / --error the job's user could not write, where that is known at submission
    (corral.executor.outputs; the launch checks again, as the user)."""
    if not (spec.output or spec.error):
        return
    from corral.executor.outputs import reach_problem

    try:
        groups = frozenset(os.getgrouplist(spec.user, spec.gid))
    except (KeyError, OSError):
        groups = frozenset({spec.gid})
    for field, pattern in (("output", spec.output), ("error", spec.error)):
        problem = reach_problem(pattern, spec.cwd, spec.uid, groups) if pattern else None
        if problem is not None:
            raise InvalidRequest(field, problem)


def array_of(text: str | None) -> array.ArrayTask | None:
    """A submission's `array` as its first task (the store numbers them all); None for a single job."""
    if text is None:
        return None
    spec = array.parse(text)
    return array.ArrayTask("", spec.first, spec)


def preempted_story(job: Job) -> str:
    """A sentence on a job's preemptions (explain tells why a running job was stopped before), "" if none."""
    p = job.preempted
    if p is None:
        return ""
    times = "once" if p.count == 1 else f"{p.count} times"
    return clean(f"It was preempted {times} before; the last time: {p.reason}.")


def _grant_text(g: GpuOut) -> str:
    """One GPU a job holds: "GPU 0 (GPU-5d3c...)", a share with its compute and memory."""
    text = f"GPU {g.index} ({g.uuid})" if g.uuid else f"GPU {g.index}"
    if g.milli >= 1000:
        return text
    mib = g.memory_mib
    memory = f"{mib // 1024} GiB" if mib % 1024 == 0 else f"{mib} MiB"
    share = [f"{g.milli} milli of compute" if g.milli else "", f"{memory} of memory" if mib else ""]
    return f"{text}: {' and '.join(p for p in share if p)}"


def running_story(
    job: Job, out: JobOut, waiting: Sequence[Job], rules: Rules, queue: str | None, now: float, protected: str = ""
) -> RunningStory:
    """What `explain` says of a starting or running job: its GPUs, its start, its time left, and who may preempt it
    (the preemption planner's own rules, `Rules.why`, over the jobs waiting now). `protected`: the sentence on its
    minimum runtime while it is still in it (`Queues.protection_story`): until then nobody may."""
    said: list[str] = []
    n = job.spec.instances
    if not out.gpus:
        said.append("It holds no GPU.")
    elif n > 1 and len(out.gpus) % n == 0:
        k = len(out.gpus) // n
        each = "; ".join(
            f"instance {i}: " + ", ".join(_grant_text(g) for g in out.gpus[i * k : (i + 1) * k]) for i in range(n)
        )
        said.append(f"It holds {each}.")
    else:
        said.append(f"It holds {', '.join(_grant_text(g) for g in out.gpus)}.")
    started, limit = job.started_at, job.spec.time_limit_s
    if started is not None:
        said.append(f"Started at {clock_text(started)} ({_duration(now - started)} ago).")
    ends = None if started is None or limit is None else started + limit
    if ends is not None and limit is not None:
        said.append(
            f"Time left: {_duration(max(0.0, ends - now))} of its {_duration(limit)} limit (stopped at "
            f"{clock_text(ends)})."
        )
    elif started is not None:
        said.append("No time limit.")
    by: list[str] = []
    if job.reason.startswith(PREEMPTING):
        can = True
        said.append("It is being preempted (see the reason): it goes back to the queue when it has stopped.")
    elif not job.spec.preemptible:
        can = False
        said.append("It cannot be preempted: it was submitted with --no-preempt.")
    elif not rules.borrowing(running_of(job, queue)):
        can = False
        said.append(f"It cannot be preempted now: it runs within its queue {queue!r}'s guarantee.")
    else:
        can = True
        me = running_of(job, queue)
        by = [w.id for w in waiting if rules.why(work_of(w), me) is not None]
        whom = f"a waiting job of a priority above its {job.spec.request.priority}"
        if queue is not None:
            whom += " or of a queue below its guarantee (it borrows above its own queue's)"
        if protected:
            can, by = False, []
            said.append(f"It may be preempted by {whom}, but not yet. {protected}")
        elif by:
            shown = ", ".join(by[:10]) + (f" and {len(by) - 10} more" if len(by) > 10 else "")
            jobs = f"job{'s' if len(by) > 1 else ''} {shown}"
            said.append(f"It may be preempted by {whom}: {jobs} may, if they do not fit otherwise.")
        else:
            said.append(f"It may be preempted by {whom}; no job waiting now may.")
    return RunningStory(" ".join(said), ends, can, by)


def preemptable_story(job: Job, holding: Sequence[Job], rules: Rules) -> tuple[list[str], str]:
    """The running jobs a waiting job may preempt (the planner's `Rules.why`), and a sentence on them ("" if none)."""
    why = {"priority": "a lower priority", "guarantee": "borrowing above its queue's guarantee"}
    me = work_of(job)
    found = [(h.id, w) for h in holding if (w := rules.why(me, running_of(h))) is not None]
    if not found:
        return [], ""
    shown = ", ".join(f"{i} ({why.get(w, w)})" for i, w in found[:10])
    more = f" and {len(found) - 10} more" if len(found) > 10 else ""
    noun = "job" if len(found) == 1 else "jobs"
    text = f"It may preempt {noun} {shown}{more}, once it is first in the queue and does not fit otherwise."
    return [i for i, _ in found], text


@dataclass(frozen=True)
class RunningStory:
    text: str
    ends_at: float | None
    preemptible_now: bool
    preempted_by: list[str]


def _duration(seconds: float) -> str:
    """3725 -> "1h 2m", 45 -> "45s", 150 -> "2m 30s" (two units at most)."""
    s = int(seconds)
    d, h, m = s // 86400, s // 3600 % 24, s // 60 % 60
    units = [(d, "d"), (h, "h"), (m, "m"), (s % 60, "s")]
    first = next((i for i, (v, _) in enumerate(units) if v), 3)
    return " ".join(f"{v}{u}" for v, u in units[first : first + 2] if v) or "0s"


def dependency_hint(v: dependency.Verdict) -> str:
    """What `explain` adds for a dependency that can never be met."""
    if v.status is not dependency.Status.NEVER:
        return ""
    return "It can never start: cancel it (a job submitted with --kill-on-invalid-dep is cancelled by the daemon)."


#: Other words for a state: Slurm's (squeue's PENDING is corral's queued).
STATE_ALIASES = {"pending": JobState.QUEUED.value}


def list_fields(text: str | None) -> list[str] | None:
    """`GET /v1/jobs`'s `fields` ("id,state,reason"): JobOut's field names, in JobOut's order; None: all of them."""
    if text is None:
        return None
    asked = {f.strip() for f in text.split(",") if f.strip()}
    unknown = sorted(asked - JobOut.model_fields.keys())
    if unknown or not asked:
        raise InvalidRequest(
            "fields",
            f"unknown field {', '.join(map(repr, unknown))}; a job's fields: {', '.join(JobOut.model_fields)}"
            if unknown
            else f"name at least one of a job's fields: {', '.join(JobOut.model_fields)}",
        )
    return [f for f in JobOut.model_fields if f in asked]


def parse_states(values: Sequence[str] | None) -> frozenset[JobState] | None:
    """`state` filters, each repeatable or comma-separated ("queued,running"); InvalidRequest names a bad one."""
    if values is None:
        return None
    names = [part.strip() for value in values for part in value.split(",") if part.strip()]
    try:
        return frozenset(JobState(STATE_ALIASES.get(n.lower(), n.lower())) for n in names)
    except ValueError:
        valid = ", ".join(s.value for s in JobState)
        raise InvalidRequest(
            "state", f"must be one of {valid} (or pending, Slurm's word for queued); got {', '.join(names)}"
        ) from None


def create_app(
    daemon: Daemon,
    lock: threading.Lock,
    wake: Callable[[], None],
    tokens: TokenStore | None = None,
    clock: Callable[[], float] = time.time,
    routers: Sequence[APIRouter] = (),
) -> FastAPI:
    """`tokens`: bearer tokens for TCP. Live GPU use comes from the daemon's own NVML sample (none when simulated)."""
    documented: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorOut, "description": text}
        for code, text in (
            (400, "The body is not JSON (not UTF-8, a syntax error, NaN or Infinity)"),
            (401, "Unknown caller (no peer credentials, or no valid bearer token over TCP)"),
            (403, "Not allowed for this caller"),
            (404, "No such job or token (or not the caller's), or no such route"),
            (405, "The route does not take this method"),
            (413, "The body is larger than 1 MiB"),
            (415, "The body is not application/json"),
            (422, "Invalid request: the field and the rule it broke"),
            (503, "The job store failed"),
        )
    }
    # Not default_response_class=SafeJSONResponse: a custom class turns off FastAPI's fast path (pydantic straight
    # to JSON bytes) for every response model; JobOut cleans its own text instead.
    # No /docs or /redoc: FastAPI's pages load Swagger UI and ReDoc from a CDN, which a machine offline cannot reach
    # and a browser on a shared machine should not be sent to. The schema itself is served: /openapi.json.
    app = FastAPI(title="corral", version="1", responses=documented, docs_url=None, redoc_url=None)
    app.add_middleware(InputLimits)

    @app.exception_handler(RequestValidationError)
    def _malformed(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = exc.errors()
        if not errors:
            return message_answer(422, request.url.path, "request", "invalid request")
        first = errors[0]
        if first.get("type") == "json_invalid":  # InputLimits parses every body first; this is a fallback
            return message_answer(400, request.url.path, "body", f"the body is not valid JSON: {first.get('msg')}")
        if face_of(request.url.path) in ("corral", "definitions"):  # corral's own bodies refuse unknown fields
            route = request.scope.get("route")
            body = getattr(getattr(getattr(route, "body_field", None), "field_info", None), "annotation", None)
            unknown = unknown_field(errors, body)
            if unknown is not None:
                return message_answer(422, request.url.path, *unknown)
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
        field = ".".join(loc) or "request"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        text = f"{first.get('msg', 'invalid')}{more}"
        if face_of(request.url.path) in ("corral", "definitions"):
            return message_answer(422, request.url.path, field, text)
        return message_answer(400, request.url.path, field, f"{field}: {text}")  # a peer's query parameter

    @app.exception_handler(StarletteHTTPException)
    def _http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        path = request.url.path
        if isinstance(exc.detail, dict):
            return JSONResponse(status_code=exc.status_code, content={"detail": exc.detail}, headers=exc.headers)
        if exc.status_code == 404:
            return message_answer(404, path, "path", f"no route {request.method} {path}")
        if exc.status_code == 405:
            return message_answer(405, path, "method", f"{path} does not take {request.method}", headers=exc.headers)
        return message_answer(exc.status_code, path, "request", str(exc.detail), headers=exc.headers)

    @app.exception_handler(TokenNotFound)
    @app.exception_handler(JobNotFound)
    def _not_found(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, InvalidRequest)
        return error(404, exc.field, exc.message)

    @app.exception_handler(Forbidden)
    def _forbidden(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, InvalidRequest)
        return error(403, exc.field, exc.message)

    @app.exception_handler(InvalidRequest)
    def _invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, InvalidRequest)
        return error(422, api_field(exc.field), exc.message)

    @app.exception_handler(TokenFileError)
    def _token_file(_: Request, exc: Exception) -> JSONResponse:
        log.error("token file failed: %s", exc)
        return error(503, "tokens", str(exc))

    @app.exception_handler(StoreError)
    def _store(_: Request, exc: Exception) -> JSONResponse:
        log.error("job store failed: %s", exc)
        return error(503, "store", f"the job store failed: {exc}")

    @app.exception_handler(Exception)
    def _bug(_: Request, exc: Exception) -> JSONResponse:  # pragma: no cover - last resort
        log.exception("internal error", exc_info=exc)
        return error(500, "server", f"internal error: {type(exc).__name__}")

    def visible(job_id: str, who: Peer) -> Job:
        """The one job `job_id` names: an id, or an array's task (12_7); a range of tasks is refused here."""
        if "_" in job_id:
            found = targets(job_id, who)
            if len(found.jobs) != 1:
                raise InvalidRequest(
                    "job", f"{job_id} names {len(found.jobs)} tasks: give one (ID_TASK), or list them with "
                    f"GET /v1/jobs?array={job_id}",
                )  # fmt: skip
            return found.jobs[0]
        with lock:
            job = daemon.store.get(job_id)
        if job is None or not (who.root or job.spec.uid == who.uid):
            raise JobNotFound(job_id)
        return job

    def targets(job_id: str, who: Peer, uid: int | Literal["caller"] | None = "caller") -> Targets:
        """The jobs an id, an array's id, a task (12_7) or a range (12_[1-5]) names, that the caller may see."""
        with lock:
            return daemon.targets(job_id, (None if who.root else who.uid) if uid == "caller" else uid)

    def current(found: Targets) -> list[Job]:
        """The jobs named, as they are now (an array's from the store's memory copy: no read a task)."""
        with lock:
            if found.array_id is not None:
                return daemon.tasks(found.array_id)
            return [daemon.store.get(j.id) or j for j in found.jobs]

    def counted(found: Targets) -> dict[str, int] | None:
        """How many of the jobs named (an array's tasks, a range) are in each state now; None for one job."""
        return dict(Counter(j.state.value for j in current(found))) if found.many else None

    @app.post(
        "/v1/jobs",
        status_code=201,
        response_model=JobOut,
        responses={
            200: {"model": JobOut, "description": "The job made earlier with this Idempotency-Key (a retry)"},
            409: {"model": ErrorOut, "description": "The Idempotency-Key was used for another request"},
        },
    )
    def submit(
        body: SubmitIn,
        who: Caller,
        key_header: Annotated[str | None, Header(alias="Idempotency-Key", pattern=IDEMPOTENCY_KEY)] = None,
    ) -> Any:
        if not daemon.queues.is_admin(who.user, who.uid, who.gid):  # admins of the queues file: as root here
            check_priority(body.priority, who)
        try:
            spec = spec_from(body, who)
            check_admissible(spec)
            check_outputs(spec)
            spec = daemon.queues.admit(spec)  # the queue named (so a retry's spec compares equal), bounds checked
        except InvalidRequest:
            raise
        except (ValueError, TypeError, ArithmeticError) as exc:  # a malformed value that no check above named
            raise InvalidRequest("request", str(exc) or type(exc).__name__) from exc
        key = key_header if key_header is not None else body.idempotency_key
        # Admission needs no scheduler lock (the store is atomic; the daemon checks against an idle machine under a
        # lock of its own), so submissions are not held up by a scheduling round.
        try:
            job = daemon.submit(spec, idempotency_key=key)
        except KeyInUse as exc:
            # a hold since (and its history) is no part of the request: a retry of a held job's submission is the same
            was = dataclasses.replace(exc.job.spec, held_by="", history=())
            if was.array is not None:  # the request had no array id yet
                was = dataclasses.replace(was, array=dataclasses.replace(was.array, job_id=""))
            if spec_to_json(was) != spec_to_json(spec):
                return error(
                    409,
                    "idempotency_key",
                    f"the key {exc.key!r} was used for job {exc.job.id}, a different request; use a new key",
                )
            return JSONResponse(status_code=200, content=JobOut.of(exc.job).model_dump(mode="json"))
        wake()
        return JobOut.of(job)

    def scope(who: Peer, everyone: bool, user: str | None) -> tuple[str | None, int | None]:
        """(user name, uid) the caller may act on: root everyone's (all) or one user's; others their own only."""
        if who.root:
            return (user, None) if user is not None or everyone else (None, who.uid)
        if user is not None and user != who.user:
            raise HTTPException(403, {"field": "user", "message": "only root can see or cancel other users' jobs"})
        return None, who.uid

    @app.get("/v1/jobs", response_model=list[JobRow] | JobColumns)
    def list_jobs(
        who: Caller,
        everyone: Annotated[bool, Query(alias="all")] = False,
        state: Annotated[list[str] | None, Query()] = None,
        user: str | None = None,
        name: str | None = None,
        since: float | None = None,
        ended_after: float | None = None,
        after: str | None = None,
        limit: Annotated[int, Query(ge=0, le=MAX_LIST_LIMIT)] = DEFAULT_LIST_LIMIT,
        order: Literal["oldest", "newest"] = "oldest",
        fields: str | None = None,
        array: str | None = None,
        layout: Literal["rows", "columns"] = "rows",
    ) -> Response:
        """The caller's jobs (root: everyone's, as squeue shows an admin; `user=NAME` one user's), oldest first
        (`order=newest`: newest first), at most `limit` (default 1000). Filters: `state` (repeatable or
        comma-separated), `name`, `since` (submitted at or after, seconds since the epoch), `ended_after` (jobs not
        ended, or ended at or after that time). A full page carries `X-Corral-Next-After`: pass it as `after` for the
        next page. (`all=true` is kept for older clients: root sees everyone's without it.) `fields=id,state,...`:
        only those of each job's fields (a table's few: `corral ps` asks for ten, under half the bytes). `array=ID`
        (or `ID_[1-5]`, `ID_7`): only those tasks of an array (docs/arrays.md). `layout=columns`: the page as one
        object of the fields, each a list of the jobs' values in order (`{"id": ["7", "9"], "state": [...]}`): the same
        values, the names once and no object a job on either side (what `corral ps` reads)."""
        user_name, uid = scope(who, everyone or who.root, user)  # a listing: root's default is everyone's
        wanted = list_fields(fields)
        for field, value in (("since", since), ("ended_after", ended_after)):
            if value is not None and not math.isfinite(value):
                raise InvalidRequest(field, f"must be a finite number of seconds since the epoch, got {value}")
        query = JobQuery(
            states=parse_states(state), user=user_name, uid=uid, name=name, since=since, ended_after=ended_after,
            after=after, limit=limit, newest_first=order == "newest",
        )  # fmt: skip
        if array is not None:  # an array's tasks, filtered and paged as any listing
            unpaged = dataclasses.replace(query, limit=None)
            tasks = targets(array, who, None if uid is None else uid).jobs
            if query.newest_first:
                tasks.reverse()
            jobs = [j for j in tasks if unpaged.matches(j) and (user_name is None or j.spec.user == user_name)][:limit]
        else:
            jobs = daemon.store.query(query)  # a read of the store: no need to wait for a scheduling round
        headers = {"X-Corral-Next-After": jobs[-1].id} if jobs and len(jobs) == limit else {}
        if layout == "columns":
            body = orjson.dumps(job_columns(jobs, wanted))
        else:
            body = orjson.dumps([job_row(j, wanted) for j in jobs])  # JobOut's fields (those asked), no model a row
        return Response(body, media_type="application/json", headers=headers)

    @app.post("/v1/jobs/cancel", response_model=CancelManyOut)
    def cancel_many(body: CancelManyIn, who: Caller) -> CancelManyOut:
        """Cancel many jobs: by `ids`, or every job in `state` and/or with `name` (both: those that match both);
        users their own jobs, root anyone's (with a state or name: root's own unless `all` or `user`)."""
        if body.ids is None and body.state is None and body.name is None:
            raise InvalidRequest("request", "say which jobs to cancel: ids, state or name")
        user_name, uid = scope(who, body.all or body.ids is not None, body.user)
        states = parse_states([body.state] if isinstance(body.state, str) else body.state)
        query = JobQuery(states=states, user=user_name, name=body.name)
        ids, unknown, refs = body.ids, [], False
        if ids is not None and any("_" in i or not i.isdigit() for i in ids):  # tasks, ranges: each job they name
            ids, expanded, refs = [], ids, True
            for ref in expanded:
                try:
                    ids += [j.id for j in targets(ref, who, uid).jobs]  # an array's id: every task already
                except InvalidRequest:  # JobNotFound too: said in not_found, as for an unknown id
                    unknown.append(ref)
        with lock:  # plain ids: an array's id stands for every task (`whole_arrays`), a task's id for itself
            outcome = daemon.cancel_many(ids, query, uid, whole_arrays=not refs)
        wake()
        return CancelManyOut(**{**dataclasses.asdict(outcome), "not_found": [*outcome.not_found, *unknown]})

    @app.get("/v1/jobs/{job_id}", response_model=JobOut)
    def show(job_id: str, who: Caller) -> JobOut:
        """One job; an array's id: its first task, with `array_tasks` (its tasks by state); a task: 12_7."""
        job = visible(job_id, who)
        counts = None
        if "_" not in job_id and job.spec.array is not None and job.spec.array.job_id == job.id:
            counts = counted(targets(job_id, who))
        return JobOut.of(job, log_path=str(daemon.log_path(job.id)), array_tasks=counts)

    def many_answer(found: Targets, changed: int) -> JSONResponse:
        """The answer to an action on an array or a range: its first task, `array_tasks` (by state, after the action)
        and X-Corral-Changed (how many of its tasks the action changed)."""
        with lock:
            first = daemon.store.get(found.jobs[0].id) or found.jobs[0]
        out = JobOut.of(first, array_tasks=counted(found))
        return JSONResponse(out.model_dump(mode="json"), headers={"X-Corral-Changed": str(changed)})

    @app.get("/v1/jobs/{job_id}/script", response_class=Response)
    def script(job_id: str, who: Caller) -> Response:
        """A batch job's script, the text stored at submission (what every attempt runs): text/plain."""
        job = visible(job_id, who)
        if job.spec.script is None:
            return error(404, "script", f"job {job.id} is no batch script: it runs {job.spec.command[0]!r} as it is")
        return Response(job.spec.script.text.encode("utf-8", "surrogatepass"), media_type="text/plain; charset=utf-8")

    @app.post("/v1/jobs/{job_id}/cancel", response_model=JobOut)
    def cancel(job_id: str, who: Caller) -> Any:
        """Cancel a job; an array's id (or a range, 12_[1-5]) cancels each of its tasks."""
        found = targets(job_id, who)
        if found.many:
            with lock:
                outcome = daemon.cancel_many([j.id for j in found.jobs], None, None if who.root else who.uid)
            wake()
            return many_answer(found, len(outcome.cancelled) + len(outcome.cancelling))
        with lock:
            job = daemon.cancel(found.jobs[0].id, None if who.root else who.uid)
        wake()
        return JobOut.of(job)

    def acting(job_id: str, who: Peer) -> tuple[int | None, Targets]:
        """The uid whose jobs the caller may change (None: anyone's, for root and the queues file's admins), and the
        jobs `job_id` names."""
        admin = who.root or daemon.queues.is_admin(who.user, who.uid, who.gid)
        uid = None if admin else who.uid
        return uid, targets(job_id, who, uid)

    @app.post("/v1/jobs/{job_id}/hold", response_model=JobOut)
    def hold(job_id: str, who: Caller) -> Any:
        """Hold a waiting job: it is not started until released (docs/hold-update.md). An array's id (or a range):
        each of its waiting tasks."""
        uid, found = acting(job_id, who)
        if found.many:
            with lock:
                changed = daemon.hold_many([j.id for j in found.jobs], who.user, uid)
            return many_answer(found, len(changed))
        with lock:
            job = daemon.hold(found.jobs[0].id, who.user, uid)
        return JobOut.of(job)

    @app.post("/v1/jobs/{job_id}/release", response_model=JobOut)
    def release(job_id: str, who: Caller) -> Any:
        """Release a held job; a hold by root or an admin is released only by root or an admin. An array's id (or a
        range): each of its held tasks."""
        uid, found = acting(job_id, who)
        if found.many:
            with lock:
                changed = daemon.release_many([j.id for j in found.jobs], who.user, uid)
            wake()
            return many_answer(found, len(changed))
        with lock:
            job = daemon.release(found.jobs[0].id, who.user, uid)
        wake()
        return JobOut.of(job)

    @app.patch("/v1/jobs/{job_id}", response_model=JobOut)
    def update(job_id: str, body: UpdateIn, who: Caller) -> Any:
        """Change a waiting job's priority, time limit, queue, GPUs or name, checked as a submission is
        (docs/hold-update.md). Users within their bounds; root and the queues file's admins beyond them. An array's
        id (or a range): each of its waiting tasks."""
        uid, found = acting(job_id, who)
        changes: dict[str, object] = {}
        if body.priority is not None:
            if uid is not None:
                check_priority(body.priority, who)
            changes["priority"] = body.priority
        if body.time_limit is not None:
            changes["time_limit_s"] = parse_duration_seconds(body.time_limit, "time_limit", bare="minutes")
        if body.queue is not None:
            changes["queue"] = body.queue
        if body.gpus is not None:
            changes["gpus"] = body.gpus
        if body.name is not None:
            changes["name"] = body.name
        if not changes:
            raise InvalidRequest("request", "say what to change: priority, time_limit, queue, gpus or name")
        if found.many:
            with lock:
                changed = daemon.update_many([j.id for j in found.jobs], changes, who.user, uid)
            wake()
            return many_answer(found, len(changed))
        with lock:
            job = daemon.update(found.jobs[0].id, changes, who.user, uid)
        wake()
        return JobOut.of(job)

    @app.get("/v1/jobs/{job_id}/explain", response_model=ExplainOut)
    def explain(job_id: str, who: Caller) -> ExplainOut:
        """Why a job waits, or how it ended. An array's id (or a range): its tasks by state, then the explain of
        the first task that waits (else the first that runs, else the last)."""
        found = targets(job_id, who)
        if not found.many:
            return explained(found.jobs[0], who)
        jobs = current(found)
        pick = next((j for j in jobs if j.state is JobState.QUEUED), None)
        pick = pick or next((j for j in jobs if not j.state.final), jobs[-1])
        out = explained(pick, who)
        counts = dict(Counter(j.state.value for j in jobs))
        what = f"Array {found.array_id}" if found.array_id else f"Tasks {found.ref.text}"
        a = pick.spec.array
        task = f"{a.job_id}_{a.task}" if a is not None else pick.id
        head = f"{what}: {array.tasks_text(counts)}. Task {task} (job {pick.id}) is {pick.state.value}:"
        out.story = clean(" ".join(t for t in (head, out.reason, out.story) if t))
        return out

    def explained(job: Job, who: Peer) -> ExplainOut:
        was = JobOut.of(job).preempted
        before = preempted_story(job)
        if job.state in (JobState.STARTING, JobState.RUNNING):
            out = JobOut.of(job)
            queues = daemon.queues
            rules = daemon.preemption_rules or queues.preemption_rules()
            # the waiting jobs to name (the oldest; a long queue's tail is not read for one job's explain)
            queued = daemon.store.query(JobQuery(states=(JobState.QUEUED,), limit=EXPLAIN_WAITING))
            queue_name = queues.queue_of(job) if queues.active else None
            guard = queues.protection_story(job, daemon.clock())  # its minimum runtime, if still in it
            ran = running_story(job, out, queued, rules, queue_name, daemon.clock(), guard)
            preempting = job.reason.startswith(PREEMPTING)
            return ExplainOut(
                state=job.state.value,
                reason=clean(job.reason),
                # being preempted: the reason says by whom; the record of it is this preemption, not one before
                story=clean(" ".join(t for t in (ran.text, "" if preempting else before) if t)),
                preempted=was,
                gpus=out.gpus,
                started_at=job.started_at,
                time_limit_s=job.spec.time_limit_s,
                ends_at=ran.ends_at,
                preemptible_now=ran.preemptible_now,
                may_be_preempted_by=ran.preempted_by,
            )
        if job.state is not JobState.QUEUED:  # it has ended: no minimum runtime to tell of
            return ExplainOut(state=job.state.value, reason=clean(job.reason), story=before or None, preempted=was)
        if job.spec.dependency:
            v = daemon.dependency_verdict(job)
            if v.status is not dependency.Status.READY:  # not offered to the scheduler yet: no place in any queue
                said = " ".join(t for t in (f"It waits for its dependency ({dependency.text(job.spec.dependency)}): "
                                            f"{v.text}.", dependency_hint(v), before) if t)  # fmt: skip
                return ExplainOut(state=job.state.value, reason=clean(job.reason), story=clean(said), preempted=was)
        holding = daemon.store.list([JobState.STARTING, JobState.RUNNING])
        a = job.spec.array
        if a is not None and a.spec.throttle and not job.spec.held_by:  # held back by its array's %N: in no queue
            with lock:
                tasks = [t for t in daemon.tasks(a.job_id) if t.state is JobState.QUEUED and not t.spec.held_by]
            running = [h for h in holding if h.spec.array is not None and h.spec.array.job_id == a.job_id]
            if job.id in array.throttle(tasks, running)[1]:
                said = " ".join(t for t in (array.throttle_story(a.job_id, a.spec.throttle, len(running)), before) if t)
                return ExplainOut(state=job.state.value, reason=clean(job.reason), story=clean(said), preempted=was)
        queues = daemon.queues
        waiting = [i for i in daemon.queue_order if i not in queues.started]  # the last round's, less its starts
        told = queue_story(job.id, queues.queue_of(job), waiting, queues.queue_of_id, queues.limited.get(job.id))
        story = wait_story(
            job, holding, daemon.queue_order, daemon.reservation, daemon.default_time_limit_s, daemon.clock(),
            None if who.root else who.uid, told if queues.active else None,
        )  # fmt: skip
        r = story.reservation
        gpus = [] if r is None else list(r.allocation.gpu_indices)
        reserved = None if r is None else ReservationOut(job=r.job_id, gpus=gpus, start=r.start)
        victims, would = preemptable_story(job, holding, daemon.preemption_rules or queues.preemption_rules())
        return ExplainOut(
            state=job.state.value,
            reason=clean(job.reason),
            story=clean(" ".join(t for t in (story.text, would, before) if t)) or None,
            may_preempt=victims,
            preempted=was,
            queue=clean(told.queue),
            queue_position=told.position,
            queue_queued=told.queued,
            ahead=told.ahead,
            limit=told.limit,
            position=story.position,
            queued=story.queued,
            holders=[HolderOut(**dataclasses.asdict(h)) for h in story.holders],
            reservation=reserved,
            estimated_start=story.estimated_start,
            default_time_limit_s=story.default_time_limit_s,
        )

    @app.get("/v1/gpus")
    def gpus(who: Caller, response: Response) -> list[dict[str, Any]]:
        """Each GPU, who holds which share of it (other users' jobs by number only), and live use where known.
        A daemon that cannot contain jobs in cgroups says so in the X-Corral-Containment header."""
        if not daemon.contained and daemon.containment:
            response.headers["X-Corral-Containment"] = daemon.containment
        holding = daemon.store.list([JobState.STARTING, JobState.RUNNING])
        rows = []
        for dev in daemon.node.gpus:
            held = [
                {
                    "job": j.id,
                    "user": j.spec.user if who.root or j.spec.uid == who.uid else None,
                    "milli": g.milli,
                    "memory_mib": g.memory_mib,
                }
                for j in holding
                for g in j.gpus
                if g.index == dev.index
            ]
            use = daemon.gpu_use.get(dev.uuid)
            rows.append(
                {
                    "index": dev.index,
                    "uuid": dev.uuid,
                    "model": dev.model,
                    "memory_mib": dev.memory_mib,
                    "granted_milli": sum(g.milli for j in holding for g in j.gpus if g.index == dev.index),
                    "held": held,
                    "used_memory_mib": None if use is None else use.used_mib,
                    "utilization_pct": None if use is None else use.utilization_pct,
                    # memory of processes corral did not start (never granted); None where not measured
                    "foreign_memory_mib": None if use is None or use.unknown else use.foreign_mib,
                }
            )
        return rows

    @app.get(
        "/v1/jobs/{job_id}/logs",
        response_class=Response,
        responses={200: {"description": "The log's bytes", "content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    def logs(
        job_id: str,
        who: Caller,
        offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
        tail: Annotated[int | None, Query(ge=0, le=MAX_LOG_CHUNK)] = None,
        instance: Annotated[int, Query(ge=0, le=MAX_INSTANCES)] = 0,
    ) -> Response:
        """The log's bytes from `offset` (at most 4 MiB), or its last `tail` bytes (the dashboard's view of a long
        log); `X-Corral-Next-Offset` says where the next read starts and `X-Corral-Job-State` whether more can come (a
        final state: no more output), for `corral logs -f`. A gang's instances each have a log: `instance` (default
        0) picks one, `X-Corral-Instances` says how many the job has (`corral logs` reads them all)."""
        job = visible(job_id, who)
        count = job.spec.instances
        if instance >= count:
            last = "instance 0 only" if count == 1 else f"instances 0..{count - 1}"
            raise InvalidRequest("instance", f"job {job_id} has {last}, not instance {instance}")
        path = daemon.log_path(job.id)
        if instance:
            path = instance_log(path, instance)
        try:
            # Only the daemon writes in the logs folder; still never through a link, and only a regular file (a FIFO
            # would block the read), checked on the open descriptor.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise InvalidRequest("logs", f"the log of job {job_id} is not a regular file")
                if tail is not None:
                    offset = max(0, f.seek(0, 2) - tail)
                f.seek(offset)
                data = f.read(MAX_LOG_CHUNK)
        except FileNotFoundError:
            data = b""
        except OSError as exc:
            raise InvalidRequest("logs", f"cannot read the log of job {job_id}: {exc}") from exc
        # Raw bytes: a chunk may end inside a multi-byte character, which the next chunk completes.
        headers = {
            "X-Corral-Next-Offset": str(offset + len(data)),
            "X-Corral-Job-State": job.state.value,
            "X-Corral-Instances": str(count),
        }
        redirected = [name for name, to in (("stdout", job.spec.output), ("stderr", job.spec.error or job.spec.output))
                      if to]  # fmt: skip
        if redirected:  # --output / --error: that output is in the user's file, not in this log
            headers["X-Corral-Redirected"] = ",".join(redirected)
        return Response(data, media_type="text/plain; charset=utf-8", headers=headers)

    # -------------------------------------------------------------------------------------------- tokens
    def token_store(who: Peer) -> TokenStore:
        if tokens is None:
            raise HTTPException(404, {"field": "tokens", "message": "this daemon has no TCP tokens"})
        if who.via != "unix":
            raise HTTPException(
                403, {"field": "tokens", "message": "tokens are created, listed and revoked over the Unix socket only"}
            )
        return tokens

    @app.post("/v1/tokens", status_code=201, response_model=TokenOut)
    def create_token(body: TokenIn, who: Caller) -> TokenOut:
        store = token_store(who)
        uid, gid, user = who.uid, who.gid, who.user
        if body.user is not None and body.user != who.user:
            if not who.root:
                raise HTTPException(403, {"field": "user", "message": "only root can create tokens for other users"})
            try:
                entry = pwd.getpwnam(body.user)
            except KeyError:
                raise InvalidRequest("user", f"no user {body.user!r} on this machine") from None
            uid, gid, user = entry.pw_uid, entry.pw_gid, entry.pw_name
        token, secret = store.create(body.name, uid, gid, user, clock())
        return TokenOut.of(token, secret)

    @app.get("/v1/tokens", response_model=list[TokenOut])
    def list_tokens(who: Caller) -> list[TokenOut]:
        return [TokenOut.of(t) for t in token_store(who).list(None if who.root else who.uid)]

    @app.delete("/v1/tokens/{token_id}", status_code=204)
    def revoke_token(token_id: str, who: Caller) -> Response:
        token_store(who).revoke(token_id, None if who.root else who.uid)
        return Response(status_code=204)

    # -------------------------------------------------------------------------------------------- observability
    @app.get("/metrics", response_class=Response, include_in_schema=False)
    def metrics(who: Caller) -> Response:
        """Prometheus' text format (docs/metrics.md). Per-job series (job ids, users) for root only."""
        return Response(render_daemon(daemon, jobs=who.root), media_type=METRICS_TYPE)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        """The process answers (no caller needed: it tells nothing)."""
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    def readyz() -> JSONResponse:
        """Ready: the store answers and a scheduling round ended in the last READY_WITHIN_S seconds."""
        problems = []
        try:
            daemon.store.get("0")
        except Exception as exc:  # any failure of the store means not ready; what it was is in the answer
            problems.append(f"the job store fails: {type(exc).__name__}: {exc}")
        since = time.monotonic() - daemon.ticked_at
        if since > READY_WITHIN_S:
            ago = "no round has ended yet" if math.isinf(since) else f"the last round ended {since:.0f} s ago"
            problems.append(f"the scheduling loop is not running: {ago}")
        # a daemon that cannot contain jobs in cgroups is still ready, and says so
        contained = {} if daemon.contained or not daemon.containment else {"containment": daemon.containment}
        if problems:
            return SafeJSONResponse(status_code=503, content={"status": "not ready", "problems": problems, **contained})
        return JSONResponse({"status": "ready", **contained})

    from corral.api.acct import acct_router  # here: it takes Caller from this module

    app.include_router(acct_router(daemon))  # corral acct: /v1/acct, /v1/acct/summary
    for router in routers:  # the faces installed by corral.daemon.extensions
        app.include_router(router)
    return app
