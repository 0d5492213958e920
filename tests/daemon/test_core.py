"""The daemon core over a fake executor: life cycle, retries, cancel, explain, restart recovery."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.daemon.core import Daemon, backoff_s
from corral.executor.fake import FakeExecutor
from corral.gpu.mps import MpsControl
from corral.jobs.model import Job, JobSpec, JobState
from corral.model.errors import InvalidRequest
from corral.model.resources import GpuBehavior, Request
from corral.placement import PlacementConfig
from corral.store import MemoryStore, SqliteStore, StoreError
from corral.store.base import Store
from tests.builders import node

CONFIG = PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def spec(gpus: int = 1, milli: int = 1000, uid: int = 1000, retries: int = 0, **kw: object) -> JobSpec:
    req = Request(cpu_milli=1000, memory_mib=1024, gpu_count=gpus, gpu_milli=milli if gpus else 0)
    user = {1000: "alice", 2000: "bob"}.get(uid, f"user{uid}")
    return JobSpec(("train.py",), req, user, uid, uid, retries=retries, **kw)  # type: ignore[arg-type]


def daemon(
    tmp_path: Path,
    store: Store | None = None,
    ex: FakeExecutor | None = None,
    clock: Clock | None = None,
    find_process: Callable[[str], tuple[int, int] | None] | None = None,
) -> Daemon:
    box = node("box").gpus(2, memory_gib=80).cpu(16).mem(64).build()
    return Daemon(
        store or MemoryStore(),
        ex or FakeExecutor(),
        box,
        CONFIG,
        tmp_path,
        clock=clock or Clock(),
        find_process=find_process,
    )


def test_life_cycle_and_environment(tmp_path: Path) -> None:
    d = daemon(tmp_path)
    ex = d.executor
    assert isinstance(ex, FakeExecutor)
    j = d.submit(spec())
    assert j.id == "1" and j.state is JobState.QUEUED
    assert d.tick() == ["1"]
    job = d.store.get("1")
    assert job is not None and job.state is JobState.RUNNING and job.attempts == 1
    launched = ex.spec("1")
    assert launched.gpu_uuids == ("GPU-box-0",) and launched.log_path == tmp_path / "logs" / "1.log"
    assert job.gpu_uuids == ("GPU-box-0",) and job.pid is not None
    ex.finish("1", 0)
    d.tick()
    done = d.store.get("1")
    assert done is not None and done.state is JobState.SUCCEEDED and done.reason == "exit code 0"


def test_waiting_job_says_why_and_starts_when_room_frees(tmp_path: Path) -> None:
    d = daemon(tmp_path)
    ex = d.executor
    assert isinstance(ex, FakeExecutor)
    d.submit(spec(gpus=2))
    d.submit(spec(gpus=1))
    assert d.tick() == ["1"]
    waiting = d.store.get("2")
    assert waiting is not None and waiting.reason == "0/1 nodes fit: 1 insufficient GPU (need 1 whole GPU)"
    ex.finish("1", 0)
    assert d.tick() == ["2"]


def test_shares_pack_onto_one_gpu_and_get_the_share(tmp_path: Path) -> None:
    d = daemon(tmp_path)
    ex = d.executor
    assert isinstance(ex, FakeExecutor)
    d.submit(spec(milli=500))
    d.submit(spec(milli=500))
    assert d.tick() == ["1", "2"]
    assert ex.spec("1").gpu_uuids == ex.spec("2").gpu_uuids == ("GPU-box-0",)
    assert ex.spec("1").gpu_milli == 500


def test_failure_retries_after_back_off(tmp_path: Path) -> None:
    clock = Clock()
    d = daemon(tmp_path, clock=clock)
    ex = d.executor
    assert isinstance(ex, FakeExecutor)
    d.submit(spec(retries=2))
    d.tick()
    ex.finish("1", 3)
    d.tick()
    job = d.store.get("1")
    assert job is not None and job.state is JobState.QUEUED
    assert job.reason == "exit code 3; retry 1 of 2 in 1 s" and job.not_before == clock.t + backoff_s(1)
    assert d.tick() == []  # not yet due
    clock.t += 1
    assert d.tick() == ["1"]
    ex.finish("1", 3)
    clock.t += 10
    d.tick()
    clock.t += 10
    assert d.tick() == ["1"]
    ex.finish("1", 1)
    d.tick()
    final = d.store.get("1")
    assert final is not None and final.state is JobState.FAILED and final.attempts == 3


def test_cancel_keeps_the_grant_until_the_process_is_gone(tmp_path: Path) -> None:
    ex = FakeExecutor(cancel_ends=False)
    d = daemon(tmp_path, ex=ex)
    d.submit(spec(gpus=2))
    d.submit(spec(gpus=1))
    d.tick()
    assert d.cancel("1").reason == "cancel requested"
    assert ex.cancelled and ex.cancelled[0][0] == "1"
    assert d.tick() == []  # job 1 still dying: its GPUs are not handed out
    ex.finish("1", None, signal=15)
    assert d.tick() == ["2"]
    job = d.store.get("1")
    assert job is not None and job.state is JobState.CANCELLED


def test_cancel_rules(tmp_path: Path) -> None:
    d = daemon(tmp_path)
    d.submit(spec(gpus=2))
    d.submit(spec(gpus=2, uid=2000))
    with pytest.raises(InvalidRequest, match="job 2 is not yours"):
        d.cancel("2", uid=1000)
    assert d.cancel("2", uid=2000).state is JobState.CANCELLED  # queued: cancelled at once
    with pytest.raises(InvalidRequest, match="no job 9"):
        d.cancel("9")
    with pytest.raises(InvalidRequest, match=r"job 2 already ended \(cancelled\)"):
        d.cancel("2")


def test_bad_submissions_are_refused_before_they_are_stored(tmp_path: Path) -> None:
    d = daemon(tmp_path)
    odd = Request(gpu_count=1, gpu_milli=1000, gpu_models=frozenset({"T4"}))
    with pytest.raises(InvalidRequest, match="unknown GPU model T4; this cluster has: A100"):
        d.submit(JobSpec(("x",), odd, "alice", 1000, 1000))
    with pytest.raises(InvalidRequest, match=r"request: can never run on this machine: 0/1 nodes fit: 1 fewer than 3"):
        d.submit(spec(gpus=3))
    assert d.store.list() == []


def test_restart_adopts_running_jobs_and_retries_lost_ones(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    ex = FakeExecutor()
    d = daemon(tmp_path, store=store, ex=ex)
    d.submit(spec())
    d.submit(spec(retries=1))
    d.tick()
    lost_pid = d.store.get("2").pid  # type: ignore[union-attr]
    assert lost_pid is not None
    # the daemon is killed; job 2's process dies while it is away
    ex2 = ex.restarted()
    ex2.kill_process(lost_pid)
    store.close()
    store2 = SqliteStore(tmp_path / "jobs.db")
    d2 = daemon(tmp_path, store=store2, ex=ex2)
    d2.recover()
    assert d2.store.get("1").state is JobState.RUNNING  # type: ignore[union-attr]
    assert ex2.adopted and ex2.adopted[0][0] == "1"
    again = d2.store.get("2")
    assert again is not None and again.state is JobState.QUEUED
    assert again.reason.startswith("lost: its supervisor was gone when the daemon restarted; retry 1 of 1")
    ex2.finish("1", 0)
    d2.tick()
    assert d2.store.get("1").state is JobState.SUCCEEDED  # type: ignore[union-attr]


def test_restart_finds_a_job_started_but_not_recorded(tmp_path: Path) -> None:
    store = FlakyStore(MemoryStore())
    ex = FakeExecutor()
    d = daemon(tmp_path, store=store, ex=ex)
    d.submit(spec())
    store.fail_when = lambda name, args: name == "transition" and args[1] is JobState.RUNNING
    with contextlib.suppress(StoreError):
        d.tick()  # launched under its supervisor; the daemon dies before storing the pid
    assert store.get("1").state is JobState.STARTING and store.get("1").pid is None
    store.fail_when = None
    d2 = daemon(tmp_path, store=store, ex=ex.restarted())
    d2.recover()
    job = d2.store.get("1")
    assert (
        job is not None
        and job.state is JobState.RUNNING
        and (job.pid, job.attempts) == (ex.records[("1", 1)].handle.pid, 1)
    )


def test_a_job_started_before_supervisors_is_still_adopted_by_pid(tmp_path: Path) -> None:
    ex = FakeExecutor()
    d = daemon(tmp_path, ex=ex)
    d.submit(spec())
    # an older daemon stored STARTING and launched a bare process (no supervisor record), then stopped
    d.store.transition("1", JobState.STARTING, gpus=(), gpu_uuids=())
    pid, start = ex.spawn_process()
    d2 = daemon(
        tmp_path, store=d.store, ex=ex.restarted(), find_process=lambda jid: (pid, start) if jid == "1" else None
    )
    d2.recover()
    job = d2.store.get("1")
    assert job is not None and job.state is JobState.RUNNING and job.pid == pid


def test_mps_shares_keep_one_user_per_gpu_and_get_the_pipe(tmp_path: Path) -> None:
    binary = tmp_path / "bin" / "nvidia-cuda-mps-control"
    binary.parent.mkdir()
    binary.write_text(f'#!/bin/sh\necho "$* $CUDA_VISIBLE_DEVICES" >> {tmp_path}/mps-calls\n')
    binary.chmod(0o755)
    ex = FakeExecutor()
    box = node("box").gpus(2, memory_gib=80).cpu(16).mem(64).build()
    mps = MpsControl(tmp_path / "mps", binary=str(binary))
    d = Daemon(MemoryStore(), ex, box, CONFIG, tmp_path, clock=Clock(), find_process=lambda _: None, mps=mps)
    d.submit(spec(milli=300, uid=1000))  # alice
    d.submit(spec(milli=300, uid=2000))  # bob: may not join alice's MPS GPU
    d.submit(spec(milli=300, uid=1000))  # alice again: joins her GPU
    assert d.tick() == ["1", "2", "3"]
    assert [ex.spec(j).gpu_uuids for j in "123"] == [("GPU-box-0",), ("GPU-box-1",), ("GPU-box-0",)]
    assert ex.spec("1").mps_pipe_dir == str(tmp_path / "mps" / "GPU-box-0" / "pipe")
    assert ex.spec("2").mps_pipe_dir == str(tmp_path / "mps" / "GPU-box-1" / "pipe")
    d.submit(spec(milli=300, uid=3000))  # carol: no GPU free of other users' shares
    d.tick()
    waiting = d.store.get("4")
    assert waiting is not None and waiting.reason == "0/1 nodes fit: 1 insufficient GPU (need 1 GPU at 30 %)"
    ex.finish("2", 0)
    d.tick()  # bob's shares are gone: carol may use that GPU (its MPS daemon serves her next)
    job4 = d.store.get("4")
    assert job4 is not None and job4.state is JobState.RUNNING and job4.gpu_uuids == ("GPU-box-1",)
    calls = (tmp_path / "mps-calls").read_text().splitlines()
    assert calls == ["-d GPU-box-0", "-d GPU-box-1"]  # one control daemon per GPU, started once
    for j in ("1", "3", "4"):
        ex.finish(j, 0)
    d.tick()  # no shares left: both control daemons are stopped
    calls = (tmp_path / "mps-calls").read_text().splitlines()
    assert calls[2:] == [" GPU-box-0", " GPU-box-1"] and not mps.running


class Recorder:
    """A controller that submits one job of its own on its first round and records how its jobs end."""

    def __init__(self, retries: int = 0) -> None:
        self.retries = retries
        self.ticks: list[float] = []
        self.ended: list[tuple[str, JobState]] = []

    def tick(self, d: Daemon, now: float) -> None:
        if not self.ticks:
            d.submit(spec(retries=self.retries, origin="test:recorder"))
        self.ticks.append(now)

    def job_ended(self, d: Daemon, job: Job) -> None:
        self.ended.append((job.id, job.state))


def test_controllers_submit_jobs_and_hear_when_they_end_for_good(tmp_path: Path) -> None:
    clock = Clock()
    d = daemon(tmp_path, clock=clock)
    rec = Recorder(retries=1)
    d.controllers.append(rec)
    assert d.tick() == ["1"]  # the controller's job is scheduled in the same round
    ex = d.executor
    assert isinstance(ex, FakeExecutor)
    ex.finish("1", 3)
    d.tick()
    assert rec.ended == []  # a retry follows: not the end yet
    clock.t += 10
    assert d.tick() == ["1"]
    ex.finish("1", 3)
    d.tick()
    assert rec.ended == [("1", JobState.FAILED)]
    d.submit(spec())  # a one-off job (no origin): controllers do not hear of it
    d.submit(spec(gpus=2))
    d.tick()
    d.cancel("3")
    assert rec.ended == [("1", JobState.FAILED)] and len(rec.ticks) == 5


def test_a_failing_controller_does_not_stop_scheduling(tmp_path: Path) -> None:
    class Broken:
        def tick(self, d: Daemon, now: float) -> None:
            raise RuntimeError("bug")

        def job_ended(self, d: Daemon, job: Job) -> None:
            raise RuntimeError("bug")

    d = daemon(tmp_path)
    d.controllers.append(Broken())
    d.submit(spec(origin="x:y"))
    assert d.tick() == ["1"]
    d.cancel("1")
    ex = d.executor
    assert isinstance(ex, FakeExecutor)
    d.tick()
    done = d.store.get("1")
    assert done is not None and done.state is JobState.CANCELLED


# ------------------------------------------------------------------------------------------------ a failing store
WRITES = ("add", "transition", "update", "update_many", "put_doc", "delete_doc")


class FlakyStore:
    """A store whose writes fail on demand (a full disk, an immutable file): reads keep working."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.fail_when: Callable[[str, tuple[Any, ...]], bool] | None = None
        self.refused = 0

    def fail(self, on: bool = True) -> None:
        self.fail_when = (lambda name, args: True) if on else None

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.inner, name)
        if name not in WRITES:
            return real

        def write(*args: Any, **kwargs: Any) -> Any:
            if self.fail_when is not None and self.fail_when(name, args):
                self.refused += 1
                raise StoreError("job store jobs.db: database or disk is full")
            return real(*args, **kwargs)

        return write


def flaky_daemon(tmp_path: Path, clock: Clock | None = None) -> tuple[Daemon, FlakyStore, FakeExecutor]:
    store = FlakyStore(MemoryStore())
    ex = FakeExecutor()
    return daemon(tmp_path, store=store, ex=ex, clock=clock or Clock()), store, ex


def tick_through(d: Daemon) -> None:
    with contextlib.suppress(StoreError):  # the serve loop logs a failed round and goes on
        d.tick()


def test_an_exit_is_kept_while_the_store_fails_and_stored_when_it_works(tmp_path: Path) -> None:
    d, store, ex = flaky_daemon(tmp_path)
    d.submit(spec(gpus=2))
    d.submit(spec(gpus=2))
    assert d.tick() == ["1"]
    d.clock.t = 1001.0  # type: ignore[attr-defined]
    store.fail()
    ex.finish("1", 0, ended_at=1000.5)
    tick_through(d)
    tick_through(d)
    assert store.refused >= 2  # it tried each round
    assert d.store.get("1").state is JobState.RUNNING  # type: ignore[union-attr]
    store.fail(False)
    assert d.tick() == ["2"]  # converged without a restart: job 1 stored, its GPUs handed to job 2
    done = d.store.get("1")
    assert done is not None and done.state is JobState.SUCCEEDED and done.exit_code == 0
    assert done.finished_at == 1000.5  # when it ended, not when the store came back
    assert ex.forgotten == [("1", 1)]  # its supervisor's record was dropped only once stored


def test_a_retry_decided_while_the_store_fails_is_stored_later(tmp_path: Path) -> None:
    clock = Clock()
    d, store, ex = flaky_daemon(tmp_path, clock)
    d.submit(spec(retries=1))
    d.tick()
    # the failure is stored, its return to the queue is not
    store.fail_when = lambda name, args: name == "transition" and args[1] is JobState.QUEUED
    ex.finish("1", 3)
    tick_through(d)
    assert d.store.get("1").state is JobState.FAILED  # type: ignore[union-attr]
    store.fail_when = None
    clock.t += 5
    d.tick()
    d.tick()
    job = d.store.get("1")
    assert job is not None and job.state is JobState.RUNNING and job.attempts == 2
    assert [s.attempt for s in ex.launched] == [1, 2]


def test_a_retry_lost_with_the_daemon_is_stored_by_the_restart(tmp_path: Path) -> None:
    store = FlakyStore(MemoryStore())
    ex = FakeExecutor()
    d = daemon(tmp_path, store=store, ex=ex)
    d.submit(spec(retries=1))
    d.tick()
    store.fail_when = lambda name, args: name == "transition" and args[1] is JobState.QUEUED
    ex.finish("1", 3)
    tick_through(d)  # FAILED stored, then the daemon dies
    store.fail_when = None
    d2 = daemon(tmp_path, store=store, ex=ex.restarted())
    d2.recover()
    job = d2.store.get("1")
    assert job is not None and job.state is JobState.QUEUED and job.attempts == 1
    assert job.reason.startswith("exit code 3; retry 1 of 1")


def test_bulk_cancel_leaves_an_exit_not_yet_stored_as_it_ended(tmp_path: Path) -> None:
    # As `cancel`: a job whose exit 0 is in hand (the store failed that round) has ended; a bulk cancel that comes
    # before the store works again must not turn its success into "cancelled".
    d, store, ex = flaky_daemon(tmp_path)
    d.submit(spec())
    d.tick()
    store.fail()
    ex.finish("1", 0)
    tick_through(d)
    store.fail(False)
    outcome = d.cancel_many(["1"])
    assert (outcome.cancelling, outcome.ended) == ([], ["1"])
    assert ex.cancelled == []
    d.tick()
    job = d.store.get("1")
    assert job is not None and job.state is JobState.SUCCEEDED and job.exit_code == 0


def test_cancel_while_the_store_fails_is_sent_says_so_and_ends_cancelled(tmp_path: Path) -> None:
    d, store, ex = flaky_daemon(tmp_path)
    d.submit(spec())
    d.tick()
    store.fail()
    with pytest.raises(StoreError) as info:
        d.cancel("1")
    assert str(info.value).startswith("job 1: the cancel was sent to the job, but it could not be recorded")
    assert ex.cancelled == [("1", 10.0)]  # the signal went out
    tick_through(d)
    assert d.store.get("1").state is JobState.RUNNING  # type: ignore[union-attr]
    store.fail(False)
    d.tick()
    job = d.store.get("1")
    assert job is not None and job.state is JobState.CANCELLED and job.reason == "cancelled"


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs of its own, to fill up (root only)."""
    if os.getuid() != 0:
        pytest.skip("mounting a small file system needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr!r}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> Path:
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
    return filler


def test_a_real_sqlite_store_on_a_full_disk_keeps_the_exit_and_converges_after(tiny_disk: Path) -> None:
    store = SqliteStore(tiny_disk / "jobs.db")
    ex = FakeExecutor()
    d = daemon(tiny_disk, store=store, ex=ex)
    d.submit(spec(gpus=2))
    d.submit(spec(gpus=2))
    d.tick()
    filler = fill(tiny_disk)
    ex.finish("1", 0)
    assert d.tick() == []  # the round goes on; job 1's exit waits in memory, its GPUs stay held
    assert d.tick() == []
    assert d.store.get("1").state is JobState.RUNNING  # type: ignore[union-attr]
    filler.unlink()
    assert d.tick() == ["2"]
    done = d.store.get("1")
    assert done is not None and done.state is JobState.SUCCEEDED and done.exit_code == 0


# ------------------------------------------------------------------------------------------------ restarts
def restart(d: Daemon, ex: FakeExecutor) -> tuple[Daemon, FakeExecutor]:
    ex2 = ex.restarted()
    d2 = daemon(d.state_dir, store=d.store, ex=ex2, clock=d.clock)  # type: ignore[arg-type]
    d2.recover()
    return d2, ex2


def test_an_exit_recorded_while_the_daemon_was_away_is_the_real_outcome(tmp_path: Path) -> None:
    clock = Clock()
    ex = FakeExecutor(cancel_ends=False)
    d = daemon(tmp_path, ex=ex, clock=clock)
    for retries, _ in ((2, "ok"), (2, "fails"), (0, "killed"), (2, "cancelled")):
        d.submit(spec(gpus=0, retries=retries))
    d.tick()
    d.cancel("4")  # the cancel is stored; the exit comes while the daemon is away
    ex2 = ex.restarted()  # the daemon is down; its jobs end meanwhile, under their supervisors
    ex2.finish("1", 0, ended_at=1001.0)
    ex2.finish("2", 3, ended_at=1002.0)
    ex2.finish("3", None, signal=9, ended_at=1003.0)
    ex2.finish("4", None, signal=15, cancelled=True)
    clock.t = 2000.0
    d2 = daemon(tmp_path, store=d.store, ex=ex2, clock=clock)
    d2.recover()
    got = {j.id: (j.state, j.exit_code, j.finished_at, j.attempts, j.reason) for j in d2.store.list()}
    assert got == {
        "1": (JobState.SUCCEEDED, 0, 1001.0, 1, "exit code 0"),
        "2": (JobState.QUEUED, 3, 1002.0, 1, "exit code 3; retry 1 of 2 in 1 s"),
        "3": (JobState.FAILED, None, 1003.0, 1, "killed by signal 9"),
        "4": (JobState.CANCELLED, None, 2000.0, 1, "cancelled"),
    }
    assert d2.tick() == ["2"]  # only the job that really failed runs again, as its second attempt
    assert [(s.job_id, s.attempt) for s in ex2.launched] == [("2", 2)]
    assert sorted(ex2.forgotten) == [("1", 1), ("2", 1), ("3", 1), ("4", 1)]


def test_an_adopted_job_that_exits_0_succeeds_and_is_not_retried(tmp_path: Path) -> None:
    ex = FakeExecutor()
    d = daemon(tmp_path, ex=ex)
    d.submit(spec(retries=3))
    d.tick()
    d2, ex2 = restart(d, ex)
    assert d2.store.get("1").state is JobState.RUNNING and ex2.adopted  # type: ignore[union-attr]
    ex2.finish("1", 0)
    d2.tick()
    job = d2.store.get("1")
    assert job is not None and job.state is JobState.SUCCEEDED and job.exit_code == 0 and job.attempts == 1
    assert ex2.launched == []


def test_a_cancel_recorded_only_by_the_supervisor_ends_cancelled(tmp_path: Path) -> None:
    store = FlakyStore(MemoryStore())
    ex = FakeExecutor(cancel_ends=False)
    d = daemon(tmp_path, store=store, ex=ex)
    d.submit(spec(retries=2))
    d.tick()
    store.fail()
    with pytest.raises(StoreError):
        d.cancel("1")  # sent, not recorded; then the daemon dies
    store.fail(False)
    ex2 = ex.restarted()
    ex2.finish("1", None, signal=15, cancelled=True)
    d2 = daemon(tmp_path, store=store, ex=ex2)
    d2.recover()
    assert d2.store.get("1").state is JobState.CANCELLED  # type: ignore[union-attr]


def test_a_job_whose_supervisor_never_started_is_queued_again_without_using_an_attempt(tmp_path: Path) -> None:
    ex = FakeExecutor()
    d = daemon(tmp_path, ex=ex)
    d.submit(spec(retries=0))
    # the daemon stored STARTING (attempt 1) and died before it started the supervisor
    d.store.transition("1", JobState.STARTING, attempts=1, started_at=1000.0)
    d2, ex2 = restart(d, ex)
    job = d2.store.get("1")
    assert job is not None and job.state is JobState.QUEUED and job.attempts == 0
    assert job.reason == "the daemon restarted before the job started; queued again"
    assert d2.tick() == ["1"]
    assert ex2.launched[0].attempt == 1


def test_only_a_job_whose_supervisor_is_gone_without_a_record_is_lost(tmp_path: Path) -> None:
    ex = FakeExecutor()
    d = daemon(tmp_path, ex=ex)
    d.submit(spec(gpus=0))
    d.submit(spec(gpus=0))
    d.tick()
    ex2 = ex.restarted()
    ex2.kill_process(d.store.get("2").pid)  # type: ignore[arg-type, union-attr]
    d2 = daemon(tmp_path, store=d.store, ex=ex2)
    d2.recover()
    assert d2.store.get("1").state is JobState.RUNNING  # type: ignore[union-attr]
    lost = d2.store.get("2")
    assert lost is not None and lost.state is JobState.LOST
    assert lost.reason == "lost: its supervisor was gone when the daemon restarted"


def test_the_api_answers_a_cancel_during_a_store_failure_with_503_saying_what_happened(tmp_path: Path) -> None:
    import threading

    from fastapi.testclient import TestClient

    from corral.api.app import create_app
    from tests.api.test_api import AsPeer

    d, store, ex = flaky_daemon(tmp_path)
    d.submit(spec(uid=1000, gpus=0))
    d.submit(spec(uid=1000, gpus=0))
    d.tick()
    api = TestClient(AsPeer(create_app(d, threading.Lock(), lambda: None), (1000, 1000, "alice"), "unix"))
    store.fail()
    ex.finish("2", 0)
    tick_through(d)  # job 2's exit waits in memory
    r = api.post("/v1/jobs/1/cancel")
    assert r.status_code == 503
    assert r.json() == {
        "detail": {
            "field": "store",
            "message": "the job store failed: job 1: the cancel was sent to the job, but it could not be recorded "
            "(job store jobs.db: database or disk is full); the job ends as cancelled once the store works again",
        }
    }
    assert ex.cancelled == [("1", 10.0)]
    r = api.post("/v1/jobs/2/cancel")  # it has ended already: nothing is sent, and the answer says why
    assert r.status_code == 503 and "job 2 has already ended" in r.json()["detail"]["message"]
    assert ex.cancelled == [("1", 10.0)]
    store.fail(False)
    d.tick()
    assert api.get("/v1/jobs/1").json()["state"] == "cancelled"
    assert api.get("/v1/jobs/2").json()["state"] == "succeeded"  # it ended on its own before the cancel
