"""The daemon core over a fake executor: life cycle, retries, cancel, explain, restart recovery."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from corral.daemon.core import Daemon, backoff_s
from corral.executor.fake import FakeExecutor
from corral.gpu.mps import MpsControl
from corral.jobs.model import Job, JobSpec, JobState
from corral.model.errors import InvalidRequest
from corral.model.resources import GpuBehavior, Request
from corral.placement import PlacementConfig
from corral.store import MemoryStore, SqliteStore
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
    find_process: Callable[[str], tuple[int, int] | None] = lambda _: None,
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
    ex = FakeExecutor()
    d = daemon(tmp_path, ex=ex)
    d.submit(spec())
    # the daemon died after storing STARTING and launching, before storing the PID
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
