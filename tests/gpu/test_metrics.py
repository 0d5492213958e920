"""Live GPU use: NVML sampling against a fake NVML, and attributing each process's memory to a job or to nobody."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from corral.gpu.discovery import GpuDiscoveryError
from corral.gpu.metrics import (
    MPS_SERVER_COMM,
    GpuProcess,
    GpuSample,
    NvmlSampler,
    ProcessInfo,
    attribute,
    read_process,
)
from tests.gpu.test_discovery import FakeNvml, NotSupported, NVMLError

NOT_AVAILABLE = (1 << 64) - 1  # NVML's "value not available" for a process's memory


class ProcNvml(FakeNvml):
    """FakeNvml plus per-GPU process lists (bytes used, or NOT_AVAILABLE); GPU 2 cannot list processes."""

    def __init__(self, compute: dict[int, list[tuple[int, int]]], graphics: dict[int, list[tuple[int, int]]]) -> None:
        super().__init__(3)
        self.compute, self.graphics = compute, graphics
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        if h == 2:
            raise NotSupported("Not Supported")
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.compute.get(h, [])]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[Any]:
        if h == 2:
            raise NotSupported("Not Supported")
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.graphics.get(h, [])]


def test_sampler_reads_memory_utilisation_and_processes() -> None:
    fake = ProcNvml(compute={0: [(10, 300 << 20), (11, NOT_AVAILABLE)]}, graphics={0: [(10, 200 << 20), (12, 5 << 20)]})
    sampler = NvmlSampler(fake)  # type: ignore[arg-type]
    got = sampler.sample()
    assert set(got) == {"GPU-0000-0", "GPU-0000-1", "GPU-0000-2"}
    g0 = got["GPU-0000-0"]
    assert (g0.used_mib, g0.utilization_pct) == (500, 0)
    # pid 10 is in both lists: counted once, with its larger figure; pid 11's memory is unknown, not zero
    assert g0.processes == (GpuProcess(10, 300), GpuProcess(11, None), GpuProcess(12, 5))
    assert got["GPU-0000-1"].used_mib is None  # memory info NotSupported on GPU 1
    assert got["GPU-0000-1"].processes == ()
    assert got["GPU-0000-2"].processes is None  # the driver cannot list them: unknown
    sampler.sample()
    assert fake.inits == 1  # NVML stays initialised between samples
    sampler.close()
    assert fake.shut


def test_sampler_without_driver_is_a_clear_error() -> None:
    with pytest.raises(GpuDiscoveryError, match="no NVIDIA driver"):
        NvmlSampler(FakeNvml(1, init_error=True)).sample()  # type: ignore[arg-type]


def test_sampler_turns_a_lost_driver_into_a_clear_error() -> None:
    class Lost(ProcNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise NVMLError("GPU is lost")

    with pytest.raises(GpuDiscoveryError, match="GPU is lost"):
        NvmlSampler(Lost({}, {})).sample()  # type: ignore[arg-type]


def test_attribute_splits_memory_between_jobs_and_foreign_processes() -> None:
    procs = {
        100: ProcessInfo(pgrp=100, job_id="7", comm="python"),  # job 7's leader
        101: ProcessInfo(pgrp=100, job_id=None, comm="python"),  # its child, environment unreadable: by group
        200: ProcessInfo(pgrp=200, job_id="3", comm="python"),  # a leftover of job 3, which holds nothing now
        300: ProcessInfo(pgrp=300, job_id=None, comm=MPS_SERVER_COMM),  # corral's MPS server on GPU A
        400: ProcessInfo(pgrp=400, job_id=None, comm=MPS_SERVER_COMM),  # somebody's MPS server on GPU B
    }
    samples = {
        "A": GpuSample("A", processes=(GpuProcess(100, 1000), GpuProcess(101, 24), GpuProcess(300, 30))),
        "B": GpuSample("B", processes=(GpuProcess(200, 500), GpuProcess(400, 30), GpuProcess(999, 64))),
        "C": GpuSample("C", processes=None),
        "D": GpuSample("D", utilization_pct=40, processes=(GpuProcess(100, None),)),
    }
    use = attribute(samples, {100: "7"}, {"7"}, {"A"}, procs.get)
    assert use["A"].jobs == {"7": 1024} and use["A"].foreign_mib == 0
    # 999 is not visible in /proc (another PID namespace): its memory is really in use, so foreign
    assert use["B"].jobs == {} and use["B"].foreign_mib == 594 and use["B"].foreign_pids == [200, 400, 999]
    assert use["C"].unknown and use["C"].foreign_mib == 0
    assert use["D"].unknown and use["D"].jobs == {} and use["D"].utilization_pct == 40


def test_read_process_reads_this_process() -> None:
    os.environ["CORRAL_JOB_ID"] = "42"
    try:
        # /proc/self/environ is fixed at exec: a child started now carries the variable
        import subprocess
        import sys

        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=dict(os.environ))
    finally:
        del os.environ["CORRAL_JOB_ID"]
    try:
        # The kernel closes the exec-status pipe (Popen returns) a moment before it sets the new environment up.
        deadline = time.monotonic() + 10
        info = read_process(child.pid)
        while info is not None and info.job_id is None and time.monotonic() < deadline:
            time.sleep(0.01)
            info = read_process(child.pid)
        assert info is not None
        assert info.job_id == "42" and info.pgrp == os.getpgrp() and info.comm.startswith("python")
    finally:
        child.kill()
        child.wait()
    assert read_process(child.pid) is None
    assert read_process(1, Path("/nonexistent")) is None
