"""Queues and fair share on corral's API (docs/queues.md).

    GET  /v1/queues                each queue: weight, max priority, guarantee, limit, borrow limit, in use,
                                   borrowing (what it holds above its guarantee) and borrowing_jobs (their ids),
                                   below_guarantee, pending, running
    GET  /v1/queues/{name}         one of them
    GET  /v1/shares                sshare: per queue and per user in it, weight, normalised shares, decayed usage per
                                   resource, dominant share, effective usage, fair-share factor
    POST /v1/queues/reload         read the queues file again (root or an admin): the new one, or 422 with why and
                                   the old configuration kept

Anyone may read these: they carry numbers, never a job's command, environment or output. As everywhere else in
corral (explain's holders, the GPU view), a user sees other users' names only as root or an admin: in /v1/shares
their rows keep their figures (a user's standing needs them, as with Slurm's sshare) under the name "another user"
(like Slurm's PrivateData=users). Counts and holdings are the last scheduling round's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, HTTPException

from corral.api.app import Caller
from corral.daemon.core import Daemon
from corral.jobs.model import JobState
from corral.model.errors import InvalidRequest
from corral.tenancy.config import QueueConfigError

#: What a user who is not root or an admin sees in place of another user's name.
OTHER_USER = "another user"


def queues_router(daemon: Daemon, lock: threading.Lock, wake: Callable[[], None]) -> APIRouter:
    router = APIRouter()

    def rows() -> list[dict[str, Any]]:
        with lock:
            return daemon.queues.queues_view()

    @router.get("/v1/queues")
    def list_queues(who: Caller) -> dict[str, Any]:
        q = daemon.queues
        return {
            "default_queue": q.config.default_queue,
            "source": q.config.source or None,
            "fair_share": q.active,
            "half_life_s": q.config.half_life_s,
            "queues": rows(),
        }

    @router.get("/v1/queues/{name}")
    def show_queue(name: str, who: Caller) -> dict[str, Any]:
        for row in rows():
            if row["name"] == name:
                return row
        raise HTTPException(404, {"field": "queue", "message": f"no queue {name!r}"})

    @router.get("/v1/shares")
    def shares(who: Caller) -> dict[str, Any]:
        holding = daemon.store.list([JobState.STARTING, JobState.RUNNING])
        with lock:
            view = daemon.queues.shares_view(holding, daemon.clock())
            admin = daemon.queues.is_admin(who.user, who.uid, who.gid)
        if not admin:
            for row in view["accounts"]:
                if row["user"] is not None and row["user"] != who.user:
                    row["user"] = OTHER_USER
        return view

    @router.post("/v1/queues/reload")
    def reload(who: Caller) -> dict[str, Any]:
        if not daemon.queues.is_admin(who.user, who.uid, who.gid):
            raise HTTPException(403, {"field": "queues", "message": "only root or an admin may reload the queues"})
        try:
            config = daemon.queues.read()  # outside the lock: reading and checking a file takes no daemon state
        except QueueConfigError as exc:
            raise InvalidRequest("queues", f"{exc}; the old configuration stays") from None
        with lock:
            daemon.queues.apply(config, daemon.store, daemon.clock())
        wake()
        return {"reloaded": True, "source": config.source, "queues": sorted(config.queues)}

    return router
