"""The daemon and live GPU use: memory held by processes corral did not start is never granted, and the memory
watchdog warns about or kills a job over its grant where MPS does not enforce it."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.daemon.core import Daemon
from corral.executor.fake import FakeExecutor
from corral.gpu.discovery import GpuDiscoveryError
from corral.gpu.metrics import GpuProcess, GpuSample, ProcessInfo
from corral.jobs.model import Job, JobSpec, JobState
from corral.model.errors import InvalidRequest
from corral.model.resources import Request
from corral.store import MemoryStore
from corral.store.acct import AcctQuery
from tests.api.test_api import ALICE, AsPeer
from tests.builders import node
from tests.daemon.test_core import CONFIG, Clock


class FakeSampler:
    """Per GPU UUID, the processes on it (pid, MiB); `fail` makes the next samples raise."""

    def __init__(self) -> None:
        self.procs: dict[str, list[tuple[int, int | None]]] = {}
        self.fail = False
        self.calls = 0

    def sample(self) -> Mapping[str, GpuSample]:
        self.calls += 1
        if self.fail:
            raise GpuDiscoveryError("NVML sample failed: GPU is lost")
        return {
            f"GPU-box-{i}": GpuSample(
                f"GPU-box-{i}",
                utilization_pct=10 * i,
                processes=tuple(GpuProcess(p, m) for p, m in self.procs.get(f"GPU-box-{i}", [])),
            )
            for i in range(2)
        }


class World:
    def __init__(self, tmp_path: Path, watchdog: str = "kill") -> None:
        self.clock = Clock()
        self.sampler = FakeSampler()
        self.ex = FakeExecutor()
        self.procs: dict[int, ProcessInfo] = {}
        box = node("box").gpus(2, memory_gib=80).cpu(16).mem(64).build()
        self.d = Daemon(
            MemoryStore(), self.ex, box, CONFIG, tmp_path, clock=self.clock, sampler=self.sampler,
            watchdog=watchdog, describe=self.procs.get,
        )  # fmt: skip

    def submit(self, gpus: int = 1, milli: int = 1000, memory_mib: int = 0) -> Job:
        req = Request(cpu_milli=1000, memory_mib=1024, gpu_count=gpus, gpu_milli=milli, gpu_memory_mib=memory_mib)
        return self.d.submit(JobSpec(("train.py",), req, "alice", 1000, 1000))

    def job(self, job_id: str) -> Job:
        job = self.d.store.get(job_id)
        assert job is not None
        return job

    def later(self, seconds: float = 2.0) -> list[str]:
        self.clock.t += seconds
        return self.d.tick()


def test_foreign_memory_is_not_granted_and_explain_says_who_holds_it(tmp_path: Path) -> None:
    w = World(tmp_path)
    # somebody's notebook holds 60 GiB of GPU 0 and a little of GPU 1, outside corral
    w.sampler.procs = {"GPU-box-0": [(555, 60 * 1024)], "GPU-box-1": [(556, 100)]}
    w.submit(gpus=1)  # a whole GPU: neither is free of foreign use
    w.submit(gpus=1, milli=300, memory_mib=30 * 1024)  # 30 GiB: not beside the notebook (20 GiB left), on GPU 1
    assert w.later() == ["2"]
    assert w.job("2").gpus[0].index == 1
    waiting = w.job("1")
    assert waiting.state is JobState.QUEUED
    assert waiting.reason.endswith(
        "; GPU memory held by processes corral did not start: GPU 0: 61440 MiB (pid 555); GPU 1: 100 MiB (pid 556)"
    )
    # the notebook exits: GPU 0 is whole again and the whole-GPU job starts there
    w.sampler.procs = {"GPU-box-1": [(556, 100)]}
    assert w.later() == ["1"]
    assert w.job("1").gpus[0].index == 0


def test_foreign_use_blocks_whole_gpus_until_it_is_gone(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.sampler.procs = {"GPU-box-0": [(555, 10)], "GPU-box-1": [(556, 10)]}
    w.submit(gpus=1)
    assert w.later() == []
    w.sampler.procs = {"GPU-box-0": [(555, 10)]}
    assert w.later() == ["1"]
    assert w.job("1").gpus[0].index == 1


def test_a_jobs_own_processes_are_not_foreign(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.submit(gpus=1, milli=500, memory_mib=8 * 1024)
    assert w.later() == ["1"]
    job = w.job("1")
    assert job.pid is not None
    # its process (found by CORRAL_JOB_ID) and a child in its process group use 7 GiB: within the grant
    w.procs[job.pid] = ProcessInfo(job.pid, "1", "python")
    w.procs[job.pid + 1] = ProcessInfo(job.pid, None, "python")
    uuid = job.gpu_uuids[0]
    w.sampler.procs = {uuid: [(job.pid, 6 * 1024), (job.pid + 1, 1024)]}
    w.submit(gpus=1, milli=500, memory_mib=70 * 1024)  # fits beside it only if its memory is not counted twice
    assert w.later() == ["2"]
    assert w.job("2").gpus[0].index == job.gpus[0].index
    assert w.job("1").state is JobState.RUNNING and w.ex.cancelled == []


def over_its_grant(tmp_path: Path, watchdog: str) -> World:
    """Job 1 (a half GPU with 4 GiB) running, and a sample that shows its process using 5000 MiB."""
    w = World(tmp_path, watchdog=watchdog)
    w.submit(gpus=1, milli=500, memory_mib=4096)
    w.later()
    job = w.job("1")
    assert job.pid is not None
    w.procs[job.pid] = ProcessInfo(job.pid, "1", "python")
    w.sampler.procs = {job.gpu_uuids[0]: [(job.pid, 5000)]}
    return w


def test_watchdog_kills_a_job_over_its_memory_grant(tmp_path: Path) -> None:
    w = over_its_grant(tmp_path, "kill")
    w.later()
    assert w.ex.cancelled == [("1", 2.0)]
    w.later()  # the fake ends it on cancel; the next round records how
    done = w.job("1")
    assert done.state is JobState.FAILED
    assert done.reason == "killed by corral: over its GPU memory grant (GPU 0: 5000 MiB used, 4096 MiB granted)"


def test_watchdog_warns_once_when_told_to_warn(tmp_path: Path) -> None:
    w = over_its_grant(tmp_path, "warn")
    w.later()
    warned = w.job("1")
    assert warned.state is JobState.RUNNING and w.ex.cancelled == []
    assert warned.reason == "warning: over its GPU memory grant (GPU 0: 5000 MiB used, 4096 MiB granted)"
    w.later()
    assert w.job("1").version == warned.version  # not rewritten every round


def test_whole_gpu_jobs_are_never_over_their_grant(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.submit(gpus=1)
    w.later()
    job = w.job("1")
    assert job.pid is not None
    w.procs[job.pid] = ProcessInfo(job.pid, "1", "python")
    w.sampler.procs = {job.gpu_uuids[0]: [(job.pid, 80 * 1024)]}
    w.later()
    assert w.ex.cancelled == [] and w.job("1").state is JobState.RUNNING


def test_sampling_is_paced_and_a_lost_driver_is_survived(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.d.tick()
    w.d.tick()
    assert w.sampler.calls == 1  # at most one sample a second, however often the loop runs
    w.sampler.fail = True
    w.sampler.procs = {"GPU-box-0": [(555, 10)], "GPU-box-1": [(556, 10)]}
    w.submit(gpus=1)
    assert w.later() == ["1"]  # no sample: nothing is known to be foreign, so nothing is held back
    assert w.d.gpu_use == {}


def test_bad_watchdog_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="gpu_memory_watchdog: must be one of off, warn, kill, got 'loud'"):
        World(tmp_path, watchdog="loud")


def test_corral_gpus_shows_the_daemons_own_sample(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.sampler.procs = {"GPU-box-1": [(555, 300)]}
    w.later()
    calls = w.sampler.calls
    client = TestClient(AsPeer(create_app(w.d, threading.Lock(), lambda: None), ALICE, "unix"))
    rows = client.get("/v1/gpus").json()
    assert [(r["utilization_pct"], r["foreign_memory_mib"]) for r in rows] == [(0, 0), (10, 300)]
    assert w.sampler.calls == calls  # answered from the round's sample: no NVML call per request


def test_a_jobs_end_stores_its_measured_gpu_use_for_acct(tmp_path: Path) -> None:
    """Accounting (docs/acct.md): the NVML samples taken while a job runs become its mean utilisation and peak
    memory, stored with its end; a sample that failed counts for nothing."""
    w = World(tmp_path)
    w.submit(gpus=1)
    assert w.later() == ["1"]
    job = w.job("1")
    assert job.pid is not None
    w.procs[job.pid] = ProcessInfo(job.pid, "1", "python")
    uuid = job.gpu_uuids[0]
    for mib in (1000, 5000, 3000):
        w.sampler.procs = {uuid: [(job.pid, mib)]}
        w.later()
    w.sampler.fail = True
    w.later()  # no sample: nothing counted, the last one not again
    w.ex.finish("1", 0)
    w.later()
    done = w.job("1")
    assert done.state is JobState.SUCCEEDED and done.usage is not None
    utilisation = 10.0 * job.gpus[0].index  # the fake's figure for that GPU
    assert (done.usage.samples, done.usage.gpu_util_pct, done.usage.gpu_mem_peak_mib, done.usage.simulated) == (
        3, utilisation, 5000, False,
    )  # fmt: skip
    (record,) = w.d.store.acct(AcctQuery())
    assert (record.gpu_util_pct, record.gpu_mem_peak_mib, record.simulated) == (utilisation, 5000, False)
