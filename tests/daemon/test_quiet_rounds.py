"""The server's loop leaves out a scheduling pass whose inputs are the last pass's, which changed nothing
(`Daemon.quiet_rounds`, corral.daemon.core.QUIET_ROUND_S): with 5,000 jobs waiting behind a full
machine, a pass five times a second took the GIL from every listing and submission (issue 26, item 7). Anything that
can change a pass's outcome runs it again: a submission, a cancel, an exit, an update, time passing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import corral.daemon.core as core
from corral.daemon.core import QUIET_ROUND_S, Daemon
from corral.executor.fake import FakeExecutor
from corral.jobs.model import JobSpec, JobState
from corral.model.resources import GpuDevice, Node, Request
from corral.placement import PlacementConfig
from corral.store import SqliteStore
from corral.tenancy import plan_round

FOUR = Request(cpu_milli=1000, memory_mib=1024, gpu_count=4, gpu_milli=1000)
ONE = Request(cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=1000)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Daemon, FakeExecutor, Clock, list[int]]:
    """A daemon with 4 GPUs held by one job and 50 jobs waiting; and the count of scheduling passes made."""
    clock = Clock()
    executor = FakeExecutor()
    node = Node("box", 32_000, 256_000, tuple(GpuDevice(i, "H100", 81920, f"GPU-{i}") for i in range(4)))
    daemon = Daemon(SqliteStore(tmp_path / "jobs.db"), executor, node, PlacementConfig(), tmp_path, clock=clock)
    passes = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        passes[0] += 1
        return plan_round(*args, **kwargs)

    monkeypatch.setattr(core, "plan_round", counted)
    daemon.quiet_rounds = True  # as the server's loop sets it
    daemon.submit(JobSpec(("sleep", "600"), FOUR, "u", 1000, 1000))
    assert daemon.tick() == ["1"]
    for i in range(50):
        daemon.submit(JobSpec(("true",), FOUR, "u", 1000, 1000, name=f"w{i}"))
    daemon.tick()  # the waiting jobs' reasons are stored: they change
    daemon.tick()
    passes[0] = 0
    return daemon, executor, clock, passes


def test_a_pass_with_the_last_ones_inputs_is_left_out(box: tuple[Daemon, FakeExecutor, Clock, list[int]]) -> None:
    daemon, _, clock, passes = box
    for _ in range(10):
        clock.now += QUIET_ROUND_S / 20
        assert daemon.tick() == []
    assert passes[0] == 0
    before = daemon.ticked_at
    daemon.tick()
    assert daemon.ticked_at > before  # /readyz still sees the loop turn
    clock.now += QUIET_ROUND_S  # what only time changes is seen within QUIET_ROUND_S
    daemon.tick()
    assert passes[0] == 1
    daemon.quiet_rounds = False  # the default (tests, the simulator): every tick passes
    daemon.tick()
    assert passes[0] == 2


def test_a_submission_a_cancel_and_an_update_each_make_a_pass(
    box: tuple[Daemon, FakeExecutor, Clock, list[int]],
) -> None:
    daemon, _, _, passes = box
    small = daemon.submit(JobSpec(("true",), ONE, "u", 1000, 1000))
    daemon.tick()
    assert passes[0] == 1
    daemon.cancel(small.id)
    daemon.tick()
    assert passes[0] == 2
    waiting = daemon.store.list([JobState.QUEUED])[0]
    daemon.store.update(waiting.id, reason="changed by hand")
    daemon.tick()
    assert passes[0] == 3


def test_an_exit_frees_the_gpus_and_the_next_job_starts(box: tuple[Daemon, FakeExecutor, Clock, list[int]]) -> None:
    daemon, executor, _, passes = box
    daemon.tick()
    assert passes[0] == 0
    executor.finish("1", 0)
    started = daemon.tick()
    assert passes[0] == 1 and started == ["2"]
    assert daemon.store.get("1") is not None and daemon.store.get("1").state is JobState.SUCCEEDED  # type: ignore[union-attr]
