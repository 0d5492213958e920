"""The scheduling pass: queue order, backfill, back-off, the head's reservation, explanations of why a job waits."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from corral.daemon.scheduler import ShapeCache, schedule, work_of
from corral.jobs.model import Job, JobSpec, JobState
from corral.model.resources import GpuBehavior, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.tenancy.order import queue_order
from tests.builders import cluster, node

CONFIG = PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)


def job(jid: int, gpus: int = 1, milli: int = 1000, priority: int = 0, t: float = 0.0, **kw: object) -> Job:
    req = Request(cpu_milli=1000, memory_mib=1024, gpu_count=gpus, gpu_milli=milli if gpus else 0, priority=priority)
    spec = JobSpec(("true",), req, "alice", 1000, 1000)
    return Job(str(jid), spec, JobState.QUEUED, submitted_at=t, **kw)  # type: ignore[arg-type]


def box(gpus: int = 4) -> ClusterSnapshot:
    return cluster(node("box").gpus(gpus).cpu(32).mem(128))


def test_queue_order_priority_then_fifo_then_id() -> None:
    jobs = [job(3, t=5), job(10, t=1), job(2, t=1), job(7, priority=5, t=9)]
    assert [w.id for w in queue_order(work_of(j) for j in jobs)] == ["7", "2", "10", "3"]


def test_starts_in_order_and_backfills() -> None:
    s = box(4)
    plan = schedule(s, [job(1, gpus=2, t=0), job(2, gpus=4, t=1), job(3, gpus=1, t=2), job(4, gpus=1, t=3)], CONFIG, 10)
    assert [st.job_id for st in plan.starts] == ["1", "3", "4"]
    assert [st.allocation.gpu_indices for st in plan.starts] == [(0, 1), (2,), (3,)]
    assert plan.waiting == {"2": "0/1 nodes fit: 1 insufficient GPU (need 4 whole GPUs)"}
    assert s.gpu_full_free[0] == 0  # the grants are in the snapshot


def test_same_shape_is_not_retried_within_a_pass() -> None:
    s = box(1)
    jobs = [job(i, gpus=1, t=i) for i in range(1, 2001)]
    plan = schedule(s, jobs, CONFIG, 10)
    assert [st.job_id for st in plan.starts] == ["1"]
    assert len(plan.waiting) == 1999
    assert set(plan.waiting.values()) == {"0/1 nodes fit: 1 insufficient GPU (need 1 whole GPU)"}


def test_back_off_and_unresolvable() -> None:
    s = box(2)
    plan = schedule(s, [job(1, not_before=100.0), job(2, gpus=8), job(3)], CONFIG, now=40)
    assert plan.waiting["1"] == "retrying after back-off in 60 s"
    assert plan.waiting["2"] == "0/1 nodes fit: 1 fewer than 8 eligible GPUs"
    assert plan.unresolvable == {"2"}
    assert [st.job_id for st in plan.starts] == ["3"]


def test_a_head_with_a_reservation_stops_gpu_backfill_that_would_delay_it_but_not_short_work() -> None:
    s = box(4)
    assert schedule(s, [job(90, gpus=2)], CONFIG, 0).starts  # two of four GPUs now held, until 100
    jobs = [job(1, gpus=4, t=0), job(2, gpus=1, t=1), job(3, gpus=0, t=2)]
    plan = schedule(s.copy(), jobs, CONFIG, now=10, ends={"90": 100.0}, default_time_limit_s=3600)
    assert plan.reservation is not None and plan.reservation.start == 100.0
    assert [st.job_id for st in plan.starts] == ["3"]  # CPU work beside the reservation
    assert plan.waiting["2"].startswith("would delay the reservation of job 1 (GPUs 0, 1, 2, 3): ")
    short = schedule(s.copy(), jobs, CONFIG, now=10, ends={"90": 100.0}, default_time_limit_s=60)
    assert [st.job_id for st in short.starts] == ["2", "3"]  # they end by 70: no delay


def test_a_request_the_machine_cannot_understand_waits_forever_with_the_reason() -> None:
    s = box(2)
    odd = Request(cpu_milli=1000, gpu_count=1, gpu_milli=1000, gpu_models=frozenset({"T4"}))
    bad = Job("1", JobSpec(("true",), odd, "alice", 1000, 1000), JobState.QUEUED, submitted_at=0)
    plan = schedule(s, [bad, job(2, t=1)], CONFIG, 10)
    assert plan.waiting == {"1": "gpu_models: unknown GPU model T4; this cluster has: A100"}
    assert plan.unresolvable == {"1"} and [st.job_id for st in plan.starts] == ["2"]


def test_priority_jumps_the_queue() -> None:
    s = box(1)
    plan = schedule(s, [job(1, t=0), job(2, t=5, priority=10)], CONFIG, 10)
    assert [st.job_id for st in plan.starts] == ["2"]


# ------------------------------------------------------------------------------------------------ a long queue
def counting_place(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every call the scheduler makes to the engine, by request id."""
    calls: list[str] = []
    real = place

    def counted(snapshot: ClusterSnapshot, request: Request, *args: Any, **kwargs: Any) -> Any:
        calls.append(request.id)
        return real(snapshot, request, *args, **kwargs)

    monkeypatch.setattr("corral.tenancy.round.place", counted)
    return calls


def test_one_placement_per_shape_however_long_the_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counting_place(monkeypatch)
    shapes = [dict(gpus=1), dict(gpus=2), dict(gpus=1, milli=500), dict(gpus=3), dict(gpus=1, priority=3)]
    for length in (50, 2000):
        s = box(4)
        assert len(schedule(s, [job(90 + i, gpus=1) for i in range(4)], CONFIG, 0).starts) == 4  # the box is full
        jobs = [job(1000 + i, t=i, **shapes[i % len(shapes)]) for i in range(length)]
        calls.clear()
        plan = schedule(s, jobs, CONFIG, 10)
        # Nothing fits: one call per distinct shape (priority is not part of a shape), whatever the length.
        assert len(calls) == plan.placements == 4, calls
        assert calls[0] == "1004"  # the queue's head (priority 3) is tried first
        assert not plan.starts and len(plan.waiting) == length
        # Every job of a shape has the words of its shape's one attempt.
        by_shape: dict[object, set[str]] = {}
        for j in jobs:
            by_shape.setdefault(j.spec.request.placement_key(), set()).add(plan.waiting[j.id])
        assert all(len(texts) == 1 for texts in by_shape.values()) and len(by_shape) == 4


def test_a_jobs_key_and_shape_are_computed_once_across_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []
    real = Request.placement_key

    def counted(self: Request) -> tuple[object, ...]:
        made.append(1)
        return real(self)

    monkeypatch.setattr(Request, "placement_key", counted)
    cache = ShapeCache()
    s = box(1)
    jobs = [job(i, t=i) for i in range(1, 301)]
    first = schedule(s.copy(), jobs, CONFIG, 10, cache=cache)
    assert len(made) == 300 and [st.job_id for st in first.starts] == ["1"]
    made.clear()
    changed = job(7, t=7, priority=9)  # the store hands out a new object when a job changes
    again = schedule(s.copy(), [*jobs[:6], changed, *jobs[7:], job(301, t=301)], CONFIG, 10, cache=cache)
    assert len(made) == 2  # the changed job and the new one; the other 299 come from the cache
    assert [st.job_id for st in again.starts] == ["7"]  # and the changed priority is seen
    assert again.waiting["1"] == first.waiting["2"] == "0/1 nodes fit: 1 insufficient GPU (need 1 whole GPU)"


def test_the_mps_owner_is_part_of_a_shares_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counting_place(monkeypatch)
    s = box(1)
    assert schedule(s, [job(90, gpus=1)], CONFIG, 0).starts
    calls.clear()
    jobs = [job(i, milli=300, t=i) for i in range(1, 41)]
    jobs = [j if int(j.id) % 2 else Job(j.id, replace(j.spec, user="bob"), j.state, j.submitted_at) for j in jobs]
    plan = schedule(s, jobs, CONFIG, 10, owner=lambda j: j.spec.user)
    assert len(calls) == 2 and not plan.starts  # alice's shares and bob's shares: two shapes
    assert plan.placements == 2
