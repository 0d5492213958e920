"""The reference's compatibility checklist, GPU items 15-21 (../shared/reference/mesos-frameworks.md §7), against the
daemon: the global behaviour for work without GPUs on this GPU machine, and what `explain` says.

Item 19 (a resident task relaunching onto its reserved volume) has no counterpart on one machine: corral has no
reserved volumes. Item 15 differs on purpose: corral always offers its GPUs (there is no capability to forget to
opt into), so an unset behaviour means corral's default, `preferential`, and no job is stranded (docs/jobs.md).
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from corral.daemon.core import Daemon
from corral.executor.fake import FakeExecutor
from corral.jobs.model import JobSpec, JobState
from corral.model.resources import GpuBehavior, Request
from corral.placement import PlacementConfig
from corral.store import MemoryStore
from tests.builders import node
from tests.daemon.test_core import Clock


def machine(tmp_path: Path, behavior: GpuBehavior | None) -> Daemon:
    box = node("box").gpus(2, memory_gib=80).cpu(16).mem(64).build()
    config = PlacementConfig() if behavior is None else PlacementConfig(gpu_behavior=behavior)
    return Daemon(MemoryStore(), FakeExecutor(), box, config, tmp_path, clock=Clock())


def submit(d: Daemon, gpus: int = 0, cpus: int = 2, labels: dict[str, str] | None = None) -> str:
    req = Request(cpu_milli=cpus * 1000, memory_mib=1024, gpu_count=gpus, gpu_milli=1000 if gpus else 0,
                  labels=labels or {})  # fmt: skip
    return d.submit(JobSpec(("x",), req, "alice", 1000, 1000)).id


def state(d: Daemon, job_id: str) -> tuple[JobState, str]:
    job = d.store.get(job_id)
    assert job is not None
    return job.state, job.reason


def test_item15_unset_behaviour_strands_nothing(tmp_path: Path) -> None:
    d = machine(tmp_path, None)
    gpu, cpu = submit(d, gpus=1), submit(d, gpus=0)
    assert set(d.tick()) == {gpu, cpu}  # preferential: the small CPU job fits beside the free GPU's reserve


def test_item16_restricted_declines_a_free_gpu_machine_only_when_everything_else_fits(tmp_path: Path) -> None:
    d = machine(tmp_path, GpuBehavior.RESTRICTED)
    holder = submit(d, gpus=1, cpus=10)  # one GPU and 10 of the 16 CPUs held; the other GPU stays free
    assert d.tick() == [holder]
    small, huge = submit(d, cpus=2), submit(d, cpus=8)
    assert d.tick() == []
    assert state(d, small) == (JobState.QUEUED, "0/1 nodes fit: 1 DeclinedScarceResources")
    st, why = state(d, huge)
    assert st is JobState.QUEUED and "DeclinedScarceResources" not in why and "insufficient CPU" in why


def test_item17_and_18_restricted_gpu_jobs_take_free_gpus_and_a_full_machine_counts_as_non_gpu(tmp_path: Path) -> None:
    d = machine(tmp_path, GpuBehavior.RESTRICTED)
    cpu_job = submit(d)
    first, second = submit(d, gpus=1), submit(d, gpus=1)
    assert d.tick() == [first, second]  # item 18: GPU jobs use the machine's free GPUs
    third = submit(d, gpus=1)
    assert d.tick() == [cpu_job]  # item 17: every GPU held, so the machine counts as non-GPU: the CPU job runs
    assert state(d, third) == (JobState.QUEUED, "0/1 nodes fit: 1 insufficient GPU (need 1 whole GPU)")


def test_item20_unrestricted_places_freely_and_undefined_warns_on_each_gpu_machine_placement(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    free = machine(tmp_path / "u", GpuBehavior.UNRESTRICTED)
    job = submit(free)
    assert free.tick() == [job] and state(free, job) == (JobState.RUNNING, "")
    loose = machine(tmp_path / "d", GpuBehavior.UNDEFINED)
    job = submit(loose)
    with caplog.at_level(logging.WARNING, logger="corral.daemon"):
        assert loose.tick() == [job]
    note = "GPU scheduling behaviour is undefined: work without GPUs was placed on a node with free GPUs"
    assert any(note in r.getMessage() and r.getMessage().startswith(f"job {job}: ") for r in caplog.records)
    assert state(loose, job)[1].startswith(note)  # `explain` says it too


def test_item21_the_label_overrides_the_global_behaviour_per_job(tmp_path: Path) -> None:
    d = machine(tmp_path, GpuBehavior.RESTRICTED)
    label = "GPU_SCHEDULING_BEHAVIOR"
    free, kept, ignored = submit(d, labels={label: "unrestricted"}), submit(d), submit(d, labels={label: "sometimes"})
    assert d.tick() == [free]  # the invalid label is ignored: the global (restricted) applies
    assert "DeclinedScarceResources" in state(d, kept)[1] and "DeclinedScarceResources" in state(d, ignored)[1]


def test_item21_an_invalid_global_behaviour_stops_the_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "corral.cli.main", "serve", "--simulate-gpus", "1xA100-80GB", "--state-dir",
         str(tmp_path), "--gpu-behavior", "sometimes"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: Setting sometimes is invalid. Valid settings are undefined, unrestricted, restricted, preferential"
    )
    assert not (tmp_path / "corral.sock").exists()
