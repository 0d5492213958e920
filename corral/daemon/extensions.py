"""What `corral serve` runs beside one-off jobs: each face adds its controller(s) and HTTP routes here.

    install_extensions(daemon, lock, wake) -> routers
        for each face (job definitions and schedules, services, ...):
            daemon.controllers.append(its Controller)      # called every round, and when its jobs end for good
            routers.append(its APIRouter)                   # mounted on the daemon's API beside /v1/jobs

A face keeps its state in the store's documents (`Store.put_doc`), marks the jobs it submits with
`JobSpec.origin`, and takes the caller's identity from `corral.api.app.Caller` like every other route.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from fastapi import APIRouter

from corral.api.marathon import install as install_services
from corral.daemon.core import Daemon


def install_extensions(daemon: Daemon, lock: threading.Lock, wake: Callable[[], None]) -> list[APIRouter]:
    """Give `daemon` its controllers; return the routes to mount. Faces register themselves below, one line each."""
    routers: list[APIRouter] = []
    routers.append(install_services(daemon, lock, wake))  # Marathon apps: corral.services, /marathon/v2/apps
    from corral.api.definitions import install_jobs  # here: corral.api imports the daemon

    routers += install_jobs(daemon, lock, wake)
    from corral.api.queues import queues_router

    routers.append(queues_router(daemon, lock, wake))  # queues and fair share: /v1/queues, /v1/shares
    return routers
