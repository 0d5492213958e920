"""The Executor contract, run over every implementation: the fake drives exits with `finish`, the local executor
runs real short commands."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest

from corral.executor import Executor, Exit, FakeExecutor, LocalExecutor, pid_start_time, read_proc_stat
from tests.executor.specs import make_spec

EXIT_3 = ("sh", "-c", "exit 3")
LONG = ("sleep", "30")


class Harness(Protocol):
    executor: Executor

    def started(self, job_id: str, command: tuple[str, ...]) -> None:
        """Called after launch: lets the fake end a command that would end by itself."""

    def wait_exits(self, count: int) -> list[Exit]:
        """Poll until `count` exits came (or a few seconds passed); then poll once more to catch duplicates."""

    def external(self) -> tuple[int, int]:
        """A live process this executor did not launch: (pid, start time)."""

    def end_external(self, pid: int) -> None: ...

    def cleanup(self) -> None: ...


class FakeHarness:
    def __init__(self) -> None:
        self.fake = FakeExecutor()
        self.executor: Executor = self.fake

    def started(self, job_id: str, command: tuple[str, ...]) -> None:
        if command == EXIT_3:
            self.fake.finish(job_id, 3)

    def wait_exits(self, count: int) -> list[Exit]:
        return self.fake.poll() + self.fake.poll()

    def external(self) -> tuple[int, int]:
        return self.fake.spawn_process()

    def end_external(self, pid: int) -> None:
        self.fake.kill_process(pid)

    def cleanup(self) -> None:
        pass


class LocalHarness:
    def __init__(self) -> None:
        self.local = LocalExecutor(grace_s=0.5)
        self.executor: Executor = self.local
        self.outside: list[subprocess.Popen[bytes]] = []

    def started(self, job_id: str, command: tuple[str, ...]) -> None:
        pass

    def wait_exits(self, count: int) -> list[Exit]:
        exits: list[Exit] = []
        deadline = time.monotonic() + 5
        while len(exits) < count and time.monotonic() < deadline:
            exits += self.local.poll()
            time.sleep(0.01)
        return exits + self.local.poll()

    def external(self) -> tuple[int, int]:
        p = subprocess.Popen(["sleep", "30"], start_new_session=True)
        self.outside.append(p)
        start = pid_start_time(p.pid)
        assert start is not None
        return p.pid, start

    def end_external(self, pid: int) -> None:
        for p in self.outside:
            if p.pid == pid:
                p.kill()  # left a zombie until cleanup: the executor must see a zombie as ended
                deadline = time.monotonic() + 5
                while (st := read_proc_stat(pid)) is not None and st.state != "Z" and time.monotonic() < deadline:
                    time.sleep(0.005)

    def cleanup(self) -> None:
        for job_id in self.local.running():
            self.local.cancel(job_id, grace_s=0)
        deadline = time.monotonic() + 5
        while self.local.running() and time.monotonic() < deadline:
            self.local.poll()
            time.sleep(0.01)
        for p in self.outside:
            p.kill()
            p.wait()
        self.local.close()


@pytest.fixture(params=["fake", "local"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    h: Harness = FakeHarness() if request.param == "fake" else LocalHarness()
    yield h
    h.cleanup()


def launch(h: Harness, job_id: str, command: tuple[str, ...], tmp: Path) -> None:
    handle = h.executor.launch(make_spec(tmp, job_id, *command))
    assert handle.job_id == job_id
    assert handle.pid > 0 and handle.start_time > 0
    h.started(job_id, command)


def test_is_an_executor(harness: Harness) -> None:
    assert isinstance(harness.executor, Executor)


def test_exit_is_reported_exactly_once(harness: Harness, tmp_path: Path) -> None:
    launch(harness, "a", EXIT_3, tmp_path)
    assert harness.wait_exits(1) == [Exit("a", 3, None, False)]
    assert harness.executor.poll() == []
    assert harness.executor.running() == set()


def test_running_bookkeeping_and_two_jobs(harness: Harness, tmp_path: Path) -> None:
    launch(harness, "long", LONG, tmp_path)
    launch(harness, "short", EXIT_3, tmp_path)
    exits = harness.wait_exits(1)
    assert exits == [Exit("short", 3, None, False)]
    assert harness.executor.running() == {"long"}
    assert harness.executor.poll() == []  # non-blocking: the long job still runs


def test_duplicate_launch_is_refused(harness: Harness, tmp_path: Path) -> None:
    launch(harness, "a", LONG, tmp_path)
    with pytest.raises(ValueError, match="job a is already running"):
        harness.executor.launch(make_spec(tmp_path, "a", *LONG))


def test_cancel_ends_a_job(harness: Harness, tmp_path: Path) -> None:
    launch(harness, "a", LONG, tmp_path)
    harness.executor.cancel("a", grace_s=1.0)
    [ended] = harness.wait_exits(1)
    assert ended.job_id == "a" and not ended.succeeded and not ended.timed_out
    assert harness.executor.running() == set()


def test_cancel_of_unknown_or_finished_job_is_a_no_op(harness: Harness, tmp_path: Path) -> None:
    harness.executor.cancel("nope")
    launch(harness, "a", EXIT_3, tmp_path)
    assert len(harness.wait_exits(1)) == 1
    harness.executor.cancel("a", grace_s=0)
    assert harness.executor.poll() == []
    assert harness.executor.running() == set()


def test_same_id_can_run_again_after_its_exit(harness: Harness, tmp_path: Path) -> None:
    launch(harness, "a", EXIT_3, tmp_path)
    assert len(harness.wait_exits(1)) == 1
    launch(harness, "a", EXIT_3, tmp_path)
    assert harness.wait_exits(1) == [Exit("a", 3, None, False)]


def test_adopt_watches_the_exact_process(harness: Harness) -> None:
    pid, start = harness.external()
    assert not harness.executor.adopt("wrong", pid, start + 1)  # the PID was reused by another process
    assert harness.executor.running() == set()
    assert harness.executor.adopt("old", pid, start)
    assert harness.executor.adopt("old", pid, start)  # idempotent
    assert harness.executor.running() == {"old"}
    assert harness.executor.poll() == []
    harness.end_external(pid)
    assert harness.wait_exits(1) == [Exit("old", None, None, False)]  # not our child: exit code unknown
    assert harness.executor.running() == set()


def test_adopt_of_a_gone_process_is_false(harness: Harness) -> None:
    pid, start = harness.external()
    harness.end_external(pid)
    assert not harness.executor.adopt("gone", pid, start)
    assert harness.executor.running() == set()


def test_adopted_job_can_be_cancelled(harness: Harness) -> None:
    pid, start = harness.external()
    assert harness.executor.adopt("old", pid, start)
    harness.executor.cancel("old", grace_s=1.0)
    assert [e.job_id for e in harness.wait_exits(1)] == ["old"]
