"""A daemon with a fake executor, an injected clock and a services controller whose health checks the test answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.daemon.core import Daemon
from corral.executor.fake import FakeExecutor
from corral.jobs.model import Job, JobState
from corral.model.resources import GpuBehavior, GpuDevice, Node
from corral.placement import PlacementConfig
from corral.services.controller import LIVE, App, Owner, ServicesController
from corral.services.health import Probe, Result
from corral.services.ports import PortAllocator
from corral.store import MemoryStore
from corral.store.base import Store

ALICE = Owner(1000, 1000, "alice")
CONFIG = PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class ScriptedChecker:
    """Health checks answered by the test: `answer(ok)` for every probe asked for so far."""

    def __init__(self) -> None:
        self.asked: list[Probe] = []
        self._results: list[Result] = []

    def submit(self, probe: Probe) -> None:
        self.asked.append(probe)

    def results(self) -> list[Result]:
        out, self._results = self._results, []
        return out

    def answer(self, ok: bool | dict[str, bool], message: str = "") -> int:
        """Answer the pending probes (`ok` per job id, or the same for all); returns how many were answered."""
        pending, self.asked = self.asked, []
        for p in pending:
            good = ok if isinstance(ok, bool) else ok.get(p.job_id, True)
            self._results.append(Result(p, good, message or ("ok" if good else "connection refused")))
        return len(pending)


def machine(*models: str, memory_gib: tuple[int, ...] = (), **labels: str) -> Node:
    """A 16-core box with one GPU per model named (two A100s by default) and the given labels."""
    models = models or ("A100", "A100")
    gpus = tuple(
        GpuDevice(i, m, (memory_gib[i] if memory_gib else 80) * 1024, f"GPU-box-{i}") for i, m in enumerate(models)
    )
    return Node("box", 16_000, 64 * 1024, gpus, labels)


class World:
    def __init__(
        self, tmp_path: Path, store: Store | None = None, box: Node | None = None, clock: Clock | None = None
    ) -> None:
        self.tmp_path = tmp_path
        self.clock = clock or Clock()
        self.store = store or MemoryStore()
        self.executor = FakeExecutor()
        self.checker = ScriptedChecker()
        self.ports = PortAllocator(40000, 40099, free=lambda _: True)
        self.box = box or machine()
        self.controller = ServicesController(self.ports, self.checker, new_id=self._ids())
        self.daemon = self._daemon()

    def _ids(self) -> Any:
        n = iter(range(1, 1_000_000))
        return lambda: f"deployment-{next(n)}"

    def _daemon(self) -> Daemon:
        d = Daemon(self.store, self.executor, self.box, CONFIG, self.tmp_path, clock=self.clock,
                   find_process=lambda _: None)  # fmt: skip
        d.controllers.append(self.controller)
        return d

    def restart(self) -> None:
        """A daemon restart as `corral serve` does it: new executor (same fake machine), new controller installed, same
        store, then recovery (so instances found lost reach the controller)."""
        self.executor = self.executor.restarted()
        self.checker = ScriptedChecker()
        self.controller = ServicesController(self.ports, self.checker, new_id=self._ids())
        d = Daemon(self.store, self.executor, self.box, CONFIG, self.tmp_path, clock=self.clock,
                   find_process=lambda _: None)  # fmt: skip
        d.controllers.append(self.controller)
        d.recover()
        self.daemon = d

    def create(self, **app: Any) -> App:
        body = {"id": "/web", "cmd": "serve --port $PORT0", "cpus": 1, "mem": 256, **app}
        return self.controller.create(self.daemon, body, ALICE)

    def tick(self, seconds: float = 0.0) -> list[str]:
        self.clock.t += seconds
        return self.daemon.tick()

    def live(self, app: str = "/web") -> list[Job]:
        return [j for j in self.store.list(LIVE) if j.spec.origin.startswith(f"marathon:{app}:")]

    def running(self, app: str = "/web") -> list[Job]:
        return [j for j in self.live(app) if j.state is JobState.RUNNING and j.reason == ""]

    def fail(self, job: Job, code: int = 1) -> None:
        self.executor.finish(job.id, code)
