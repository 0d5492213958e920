"""A daemon with the jobs controller over a fake executor and an injected clock, and its API as a given user."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.api.definitions import install_jobs
from corral.daemon.core import Daemon
from corral.executor.fake import FakeExecutor
from corral.gpu.simulated import parse_simulated_inventory
from corral.jobs.controller import JobsController
from corral.jobs.model import Job, JobState
from corral.model.resources import GpuBehavior
from corral.placement import PlacementConfig
from corral.store import MemoryStore
from corral.store.base import Store
from tests.api.test_api import ALICE, AsPeer

Peer = tuple[int, int, str]


class Clock:
    """The daemon's clock (epoch seconds), moved only by the test."""

    def __init__(self, start: datetime) -> None:
        self.t = start.timestamp()

    def __call__(self) -> float:
        return self.t

    def set(self, when: datetime) -> None:
        assert when.timestamp() >= self.t, "a clock does not go backwards"
        self.t = when.timestamp()

    def advance(self, seconds: float) -> None:
        self.t += seconds

    @property
    def now(self) -> datetime:
        return datetime.fromtimestamp(self.t, UTC)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class World:
    def __init__(
        self,
        tmp_path: Path,
        start: str = "2024-01-01T00:00:00Z",
        store: Store | None = None,
        executor: FakeExecutor | None = None,
        clock: Clock | None = None,
        runtime: str | None = None,
        behavior: GpuBehavior = GpuBehavior.UNRESTRICTED,
        gpus: str = "2xA100-80GB",
    ) -> None:
        self.tmp_path = tmp_path
        self.store = store or MemoryStore()
        self.executor = executor or FakeExecutor()
        self.clock = clock or Clock(at(start))
        self.runtime = runtime
        self.behavior = behavior
        self.gpus = gpus
        node = parse_simulated_inventory(gpus)[0]
        self.daemon = Daemon(
            self.store,
            self.executor,
            node,
            PlacementConfig(gpu_behavior=behavior),
            tmp_path,
            clock=self.clock,
            container_runtime=runtime,
        )
        self.lock = threading.Lock()
        self.wakes = 0
        routers = install_jobs(self.daemon, self.lock, self.wake)
        ctl = self.daemon.controllers[0]
        assert isinstance(ctl, JobsController)
        self.ctl = ctl
        self.app = create_app(self.daemon, self.lock, self.wake, clock=self.clock, routers=routers)
        with self.lock:
            self.daemon.recover()

    def wake(self) -> None:
        self.wakes += 1

    def client(self, peer: Peer | None = ALICE) -> TestClient:
        return TestClient(AsPeer(self.app, peer, "unix"), raise_server_exceptions=True)

    def tick(self) -> list[str]:
        with self.lock:
            return self.daemon.tick()

    def restarted(self) -> World:
        """The daemon stopped and started again: same store, same machine (live processes), same clock."""
        return World(
            self.tmp_path,
            store=self.store,
            executor=self.executor.restarted(),
            clock=self.clock,
            runtime=self.runtime,
            behavior=self.behavior,
            gpus=self.gpus,
        )

    def jobs(self, origin_prefix: str = "") -> list[Job]:
        return [j for j in self.store.list() if j.spec.origin.startswith(origin_prefix) and j.spec.origin]

    def running(self) -> list[Job]:
        return [j for j in self.jobs() if j.state is JobState.RUNNING]

    def finish(self, job_id: str, exit_code: int | None = 0) -> None:
        """The task's process exits; the next round sees it."""
        self.executor.finish(job_id, exit_code)
        self.tick()


def metronome_job(job_id: str = "nightly", **run: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"cpus": 1, "mem": 128, "disk": 0, "cmd": "echo hi"}
    body.update(run)
    return {"id": job_id, "run": {k: v for k, v in body.items() if v is not None}}
