"""A round of the daemon with a long queue that cannot fit: one placement per shape, reason writes only for changes."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from corral.daemon.core import Daemon
from corral.executor.fake import FakeExecutor
from corral.jobs.model import JobSpec, JobState
from corral.model.resources import GpuBehavior, Request
from corral.placement import PlacementConfig, place
from corral.store import SqliteStore
from tests.builders import node

SHAPES = [
    Request(cpu_milli=1000, gpu_count=1, gpu_milli=1000),
    Request(cpu_milli=1000, gpu_count=1, gpu_milli=500, gpu_memory_mib=8192),
    Request(cpu_milli=4000, gpu_count=1, gpu_milli=250, gpu_memory_mib=4096),
]


def test_a_round_places_once_per_shape_and_rewrites_only_changed_reasons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    box = node("box").gpus(1, memory_gib=80).cpu(16).mem(64).build()
    daemon = Daemon(store, FakeExecutor(), box, PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED), tmp_path)
    # not preemptible: the queued jobs of higher priority would otherwise preempt it (docs/preemption.md)
    daemon.submit(JobSpec(("hog",), SHAPES[0], "alice", 1000, 1000, preemptible=False))
    assert daemon.tick() == ["1"]  # the only GPU is held from now on
    now = time.time()  # the daemon's clock: the head has not waited long enough to stop backfill
    for i in range(3000):
        request = replace(SHAPES[i % 3], priority=i % 5)  # priority orders the queue but is not part of a shape
        store.add(JobSpec(("x",), request, f"u{i % 7}", 2000 + i % 7, 2000), now + i / 1000)
    calls: list[str] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[1].id)
        return place(*args, **kwargs)

    monkeypatch.setattr("corral.tenancy.round.place", counted)
    writes: list[int] = []
    real_update_many = store.update_many

    def counted_writes(changes: dict[str, dict[str, Any]]) -> Any:
        writes.append(len(changes))
        return real_update_many(changes)

    monkeypatch.setattr(store, "update_many", counted_writes)
    assert daemon.tick() == []
    assert len(calls) == 3 and writes == [3000]  # one attempt per shape; every new job's reason in one write
    reasons = {j.reason for j in store.list([JobState.QUEUED])}
    assert len(reasons) == 3 and all("insufficient GPU" in r for r in reasons)
    calls.clear()
    writes.clear()
    store.add(JobSpec(("x",), SHAPES[1], "u1", 2001, 2000), now + 10)
    assert daemon.tick() == []
    assert len(calls) == 3 and writes == [1]  # the same three attempts; only the new job's reason is written
    calls.clear()
    writes.clear()
    assert daemon.tick() == [] and len(calls) == 3 and writes == []  # nothing changed: nothing written
    store.close()
