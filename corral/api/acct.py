"""Accounting on corral's API: the jobs that ended, with their hours and GPU efficiency (docs/acct.md).

    GET /v1/acct          records in end order, `limit` a page (default 1000, at most 10000); a full page carries
        ?since=&until=    X-Corral-Next-After: pass it as `after` for the next. Times in seconds since the epoch
        &user=&state=     (ended at or after `since`, before `until`); `state` repeatable or comma-separated, the
        &queue=&after=    states of ended jobs only (succeeded, failed, cancelled, lost; Slurm's completed too)
        &limit=
        &layout=columns   the page as one object of AcctOut's fields, each a list of the records' values in order
                          ({"id": ["7", "9"], "name": [...], ...}): the same values, the field names once, and no
                          object a record on either side (what `corral acct` reads 100,000 records as)
    GET /v1/acct/summary  per user and queue: jobs, elapsed, GPU-hours, CPU-hours, mean GPU utilisation
        (same filters)

Who sees what: a user their own jobs; root and the queues file's admins everyone's (`user=NAME`: one user's), as
`corral ps` and hold/update decide it. A user who names another user gets a 403. Figures from simulated GPUs say
`"simulated": true` on their row.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response
from pydantic import BaseModel, create_model

from corral.api.app import Caller, Peer
from corral.daemon.core import Daemon
from corral.jobs.model import FINAL_STATES, JobState
from corral.model.errors import InvalidRequest
from corral.store.acct import AcctColumns, AcctQuery, AcctRecord, SummaryRow, check_window, parse_cursor

DEFAULT_LIMIT = 1000
MAX_LIMIT = 10000
#: Slurm's words for the states of ended jobs (sacct's COMPLETED is corral's succeeded).
STATE_ALIASES = {"completed": JobState.SUCCEEDED.value, "cd": JobState.SUCCEEDED.value}
ENDED = ", ".join(sorted(s.value for s in FINAL_STATES))


class AcctOut(BaseModel):
    """One job that ended. `gpus` and `cpus` in units (0.3: a share of a GPU); hours are elapsed times those."""

    id: str
    name: str
    user: str
    uid: int
    queue: str
    state: str
    exit_code: int | None
    submitted_at: float
    started_at: float | None
    ended_at: float
    elapsed_s: float
    gpus: float
    gpu_ids: list[int]
    cpus: float
    gpu_hours: float
    cpu_hours: float
    gpu_util_pct: float | None  # mean over its samples; None: never sampled (no GPU, too short, no NVML)
    gpu_mem_peak_mib: int | None
    gpu_samples: int
    simulated: bool  # the GPU figures are made up (simulated GPUs), not measured


class SummaryOut(BaseModel):
    user: str
    queue: str
    jobs: int
    elapsed_s: float
    gpu_hours: float
    cpu_hours: float
    gpu_util_pct: float | None  # weighted by the GPU-hours that were sampled
    simulated: bool


def record_row(r: AcctRecord) -> dict[str, Any]:
    """AcctOut's fields exactly, without a model a row (10,000 rows a page)."""
    return {
        "id": r.id, "name": r.name, "user": r.user, "uid": r.uid, "queue": r.queue, "state": r.state,
        "exit_code": r.exit_code, "submitted_at": r.submitted_at, "started_at": r.started_at,
        "ended_at": r.ended_at, "elapsed_s": r.elapsed_s, "gpus": r.gpu_milli / 1000, "gpu_ids": list(r.gpu_ids),
        "cpus": r.cpu_milli / 1000, "gpu_hours": round(r.gpu_hours, 6), "cpu_hours": round(r.cpu_hours, 6),
        "gpu_util_pct": r.gpu_util_pct, "gpu_mem_peak_mib": r.gpu_mem_peak_mib, "gpu_samples": r.gpu_samples,
        "simulated": r.simulated,
    }  # fmt: skip


#: `layout=columns`: AcctOut's fields, each a list of the page's values in order (the OpenAPI spec says so, and the
#: API's fuzz test holds every answer to it).
AcctColumnsOut = create_model(
    "AcctColumnsOut",
    __doc__="A page of ended jobs as columns: each of AcctOut's fields, a list of the records' values in order.",
    **{name: (list[f.annotation], ...) for name, f in AcctOut.model_fields.items()},  # type: ignore[call-overload,name-defined]
)


def record_columns(c: AcctColumns) -> dict[str, list[Any]]:
    """AcctOut's fields, each a column of the page: the values of `record_row`, computed the same way."""
    return {
        "id": c.id, "name": c.name, "user": c.user, "uid": c.uid, "queue": c.queue, "state": c.state,
        "exit_code": c.exit_code, "submitted_at": c.submitted_at, "started_at": c.started_at, "ended_at": c.ended_at,
        "elapsed_s": c.elapsed_s, "gpus": [g / 1000 for g in c.gpu_milli], "gpu_ids": c.gpu_ids,
        "cpus": [m / 1000 for m in c.cpu_milli], "gpu_hours": [round(h, 6) for h in c.gpu_hours],
        "cpu_hours": [round(h, 6) for h in c.cpu_hours], "gpu_util_pct": c.gpu_util_pct,
        "gpu_mem_peak_mib": c.gpu_mem_peak_mib, "gpu_samples": c.gpu_samples, "simulated": c.simulated,
    }  # fmt: skip


def summary_row(s: SummaryRow) -> dict[str, Any]:
    return {
        "user": s.user, "queue": s.queue, "jobs": s.jobs, "elapsed_s": s.elapsed_s,
        "gpu_hours": round(s.gpu_hours, 6), "cpu_hours": round(s.cpu_hours, 6),
        "gpu_util_pct": None if s.gpu_util_pct is None else round(s.gpu_util_pct, 2), "simulated": s.simulated,
    }  # fmt: skip


def ended_states(values: list[str] | None) -> frozenset[JobState] | None:
    """`state` filters of an accounting query: the states of ended jobs only; InvalidRequest names a bad one."""
    if values is None:
        return None
    names = [part.strip().lower() for value in values for part in value.split(",") if part.strip()]
    states = set()
    for name in names:
        try:
            state = JobState(STATE_ALIASES.get(name, name))
        except ValueError:
            state = None
        if state is None or state not in FINAL_STATES:
            raise InvalidRequest(
                "state",
                f"must be one of {ENDED} (the states of jobs that ended; completed is succeeded), got {name!r}",
            )
        states.add(state)
    return frozenset(states)


def acct_router(daemon: Daemon) -> APIRouter:
    router = APIRouter()

    def query(
        who: Peer,
        since: float | None,
        until: float | None,
        user: str | None,
        state: list[str] | None,
        queue: str | None,
        after: str | None = None,
        limit: int | None = None,
    ) -> AcctQuery:
        """The query the caller may make: a user's own jobs; root's and the admins' anyone's (or `user`'s)."""
        check_window(since, until)
        admin = who.root or daemon.queues.is_admin(who.user, who.uid, who.gid)
        uid: int | None = None
        if not admin:
            if user is not None and user != who.user:
                raise HTTPException(
                    403, {"field": "user", "message": "only root or an admin can see other users' jobs"}
                )
            user, uid = None, who.uid
        return AcctQuery(
            since=since, until=until, uid=uid, user=user, states=ended_states(state), queue=queue,
            after=None if after is None else parse_cursor(after), limit=limit,
        )  # fmt: skip

    @router.get("/v1/acct", response_model=list[AcctOut] | AcctColumnsOut)
    def acct(
        who: Caller,
        since: float | None = None,
        until: float | None = None,
        user: str | None = None,
        state: Annotated[list[str] | None, Query()] = None,
        queue: str | None = None,
        after: str | None = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
        layout: Literal["rows", "columns"] = "rows",
    ) -> Response:
        """The jobs that ended (the caller's; root's and the admins': everyone's), in the order they ended."""
        asked = query(who, since, until, user, state, queue, after, limit)
        if layout == "columns":
            columns = daemon.store.acct_columns(asked)
            headers = {"X-Corral-Next-After": columns.cursor} if len(columns) == limit else {}
            body = orjson.dumps(record_columns(columns))
        else:
            records = daemon.store.acct(asked)
            headers = {"X-Corral-Next-After": records[-1].cursor} if len(records) == limit else {}
            body = orjson.dumps([record_row(r) for r in records])
        return Response(body, media_type="application/json", headers=headers)

    @router.get("/v1/acct/summary", response_model=list[SummaryOut])
    def summary(
        who: Caller,
        since: float | None = None,
        until: float | None = None,
        user: str | None = None,
        state: Annotated[list[str] | None, Query()] = None,
        queue: str | None = None,
    ) -> Response:
        """The same jobs summed per user and queue, by user then queue."""
        rows = daemon.store.acct_summary(query(who, since, until, user, state, queue))
        return Response(orjson.dumps([summary_row(s) for s in rows]), media_type="application/json")

    return router
