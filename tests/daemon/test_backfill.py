"""Backfill with a reservation for the head of the queue: the pass (pure) and the daemon over a fake clock.

The daemon test is the issue's "no starvation" check: a 4-GPU job arrives while 1-GPU jobs with time limits run and
more keep arriving; it starts no later than the reservation the first round predicted for it.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from corral.api.app import create_app
from corral.cli.main import app as cli
from corral.daemon.core import Daemon
from corral.daemon.scheduler import clock_text, schedule
from corral.executor.fake import FakeExecutor
from corral.gpu.simulated import parse_simulated_inventory
from corral.jobs.model import Job, JobSpec, JobState
from corral.model.resources import GpuBehavior, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig
from corral.store import MemoryStore
from corral.tenancy.reservation import DEFAULT_TIME_LIMIT_S, expected_end, intersect
from tests.api.test_api import ALICE, BOB, ROOT, AsPeer
from tests.builders import cluster, node

CONFIG = PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)


def job(jid: int, gpus: int = 1, t: float = 0.0, limit: float | None = None, cpu: int = 1000) -> Job:
    req = Request(cpu_milli=cpu, memory_mib=1024, gpu_count=gpus, gpu_milli=1000 if gpus else 0)
    spec = JobSpec(("true",), req, "alice", 1000, 1000, time_limit_s=limit)
    return Job(str(jid), spec, JobState.QUEUED, submitted_at=t)


def running(s: ClusterSnapshot, *jobs: Job) -> None:
    """Start `jobs` on `s` (each must fit)."""
    plan = schedule(s, list(jobs), CONFIG, 0)
    assert [st.job_id for st in plan.starts] == [j.id for j in jobs]


def box(gpus: int = 4) -> ClusterSnapshot:
    return cluster(node("box").gpus(gpus).cpu(32).mem(128))


def test_the_head_is_reserved_the_gpus_that_end_first() -> None:
    s = box(4)
    running(s, job(1, gpus=2), job(2), job(3))  # GPUs 0-1, 2, 3
    ends = {"1": 100.0, "2": 500.0, "3": 300.0}
    plan = schedule(s, [job(10, gpus=3, t=1)], CONFIG, now=10, ends=ends)
    r = plan.reservation
    assert r is not None and r.job_id == "10"
    assert r.start == 300.0  # jobs 1 and 3 have ended by then: GPUs 0, 1, 3; job 2 holds GPU 2 until 500
    assert set(r.allocation.gpu_indices) == {0, 1, 3}
    assert set(r.waits_for) == {"1", "3"}
    assert plan.waiting["10"] == "0/1 nodes fit: 1 insufficient GPU (need 3 whole GPUs)"
    assert plan.order == ["10"]


def test_a_short_job_backfills_and_a_long_one_waits() -> None:
    s = box(4)
    running(s, job(1), job(2), job(3))  # GPU 3 free
    ends = {"1": 100.0, "2": 100.0, "3": 100.0}
    queue = [
        job(10, gpus=4, t=1),
        job(11, t=2, limit=500),  # would hold GPU 3 past 100
        job(12, t=3),  # no time limit: the default (3600 s) runs past 100
        job(13, t=4, limit=50),  # ends at 60, before the reservation: uses the idle GPU
        job(14, t=5, limit=30),  # nothing left now
    ]
    plan = schedule(s, queue, CONFIG, now=10, ends=ends)
    assert plan.reservation is not None and plan.reservation.start == 100.0
    assert [st.job_id for st in plan.starts] == ["13"]
    delay = plan.waiting["11"]
    assert delay == (
        "would delay the reservation of job 10 (GPUs 0, 1, 2, 3): a job behind it starts first only if it ends before "
        "the reservation starts (by its time limit, or the default) or fits beside it"
    )
    assert plan.waiting["12"] == delay
    assert plan.waiting["14"] == "0/1 nodes fit: 1 insufficient GPU (need 1 whole GPU)"
    # with a default time limit short enough, the job without one backfills too
    again = box(4)
    running(again, job(1), job(2), job(3))
    plan = schedule(again, queue, CONFIG, now=10, ends=ends, default_time_limit_s=60)
    assert [st.job_id for st in plan.starts] == ["12"]


def test_a_long_job_that_fits_beside_the_reservation_starts() -> None:
    s = box(4)
    running(s, job(1), job(2), job(3))  # GPU 3 free
    ends = {"1": 100.0, "2": 100.0, "3": 5000.0}
    queue = [job(10, gpus=2, t=1), job(11, t=2, limit=1000), job(12, gpus=0, t=3, limit=9000)]
    plan = schedule(s, queue, CONFIG, now=10, ends=ends)
    r = plan.reservation
    assert r is not None and r.start == 100.0 and set(r.allocation.gpu_indices) == {0, 1}
    assert [st.job_id for st in plan.starts] == ["11", "12"]  # GPU 3 and CPU the reservation does not need
    assert plan.starts[0].allocation.gpu_indices == (3,)
    # Jobs 11 and 12 outlive the reservation's start: each placed once, beside the reservation (what is free beside
    # it is free now); the only shape that could not be placed is the head's (what /metrics counts as unschedulable)
    assert plan.placements == 3 and plan.unplaced == 1


def test_a_long_job_with_no_room_even_now_is_told_so_not_that_it_would_delay() -> None:
    """A job that outlives the reservation and does not fit beside it is placed on what is free now too: where it
    does not fit there either, its words are the engine's (no room), not the reservation's."""
    s = box(4)
    running(s, job(1), job(2), job(3))  # GPU 3 free
    queue = [job(10, gpus=2, t=1), job(11, gpus=2, t=2, limit=1000, cpu=2000), job(12, t=3, limit=1000)]
    plan = schedule(s, queue, CONFIG, now=10, ends={"1": 100.0, "2": 100.0, "3": 5000.0})
    assert plan.reservation is not None and plan.reservation.job_id == "10"
    assert "would delay" not in plan.waiting["11"] and "GPU" in plan.waiting["11"], plan.waiting["11"]
    assert [st.job_id for st in plan.starts] == ["12"]
    assert plan.placements == 3  # the head; job 11 on what is free now only (no room by the necessary test); job 12


def test_cpu_the_reservation_needs_is_not_backfilled_past_its_start() -> None:
    s = cluster(node("box").gpus(2).cpu(8).mem(128))
    running(s, job(1, cpu=2000))  # GPU 0 and 2 cores, ends at 100
    head = job(10, gpus=2, t=1, cpu=6000)  # needs both GPUs and 6 of the 8 cores at 100
    long_cpu = job(11, gpus=0, t=2, cpu=4000, limit=1000)  # 4 of the 6 free cores: would leave the head 4
    small_cpu = job(12, gpus=0, t=3, cpu=2000, limit=1000)  # 2 cores beside the head's 6
    plan = schedule(s, [head, long_cpu, small_cpu], CONFIG, now=10, ends={"1": 100.0})
    assert plan.reservation is not None and plan.reservation.start == 100.0
    assert [st.job_id for st in plan.starts] == ["12"]
    assert plan.waiting["11"].startswith("would delay the reservation of job 10")
    assert plan.unplaced == 2  # the head's shape, and job 11's beside the reservation


def test_no_reservation_when_the_head_never_fits_on_what_running_jobs_free() -> None:
    s = box(2)
    running(s, job(1))
    # job 1's end is unknown (not in `ends`: e.g. memory held by processes corral did not start): never leaves
    plan = schedule(s, [job(10, gpus=2, t=1), job(11, t=2, limit=5000)], CONFIG, now=10, ends={})
    assert plan.reservation is None
    assert [st.job_id for st in plan.starts] == ["11"]  # nothing to protect: plain backfill


def test_the_view_offers_only_what_is_free_now_and_left_by_the_reservation() -> None:
    now = box(4)
    running(now, job(1), job(2))  # GPUs 0, 1 held now
    later = box(4)
    running(later, job(5, gpus=0, cpu=8000), job(6), job(7), job(8))
    later_held = {g for st in ("6", "7", "8") for g in later.allocations[st].gpu_indices}
    assert later_held == {0, 1, 2}
    both = intersect(now, later)
    assert list(both.gpu_milli_free[0]) == [0, 0, 0, 1000]  # free now (2, 3) and later (3)
    assert both.gpu_full_free[0] == 1 and both.gpu_free_total[0] == 1000
    assert both.cpu_free[0] == later.cpu_free[0] < now.cpu_free[0]
    later.release("8")
    both = intersect(now, later)
    assert list(both.gpu_milli_free[0]) == [0, 0, 1000, 1000] and both.gpu_full_free[0] == 2
    got = schedule(both, [job(20, gpus=2)], CONFIG, 0)  # the engine places on the view
    assert got.starts and set(got.starts[0].allocation.gpu_indices) == {2, 3}


# ------------------------------------------------------------------------------------------------ the daemon
class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def one_gpu(limit: float) -> JobSpec:
    return JobSpec(("x",), Request(cpu_milli=1000, gpu_count=1, gpu_milli=1000), "bob", 1001, 1001, time_limit_s=limit)


def test_no_starvation_a_4_gpu_job_starts_when_its_reservation_said(tmp_path: Path) -> None:
    clock = Clock()
    executor = FakeExecutor()
    store = MemoryStore()
    box4 = parse_simulated_inventory("4xA100-80GB")[0]
    daemon = Daemon(store, executor, box4, CONFIG, tmp_path, clock=clock)
    t0 = clock.t
    for _ in range(4):  # four 1-GPU jobs, staggered: one ends every 25 s
        daemon.submit(one_gpu(100))
        assert len(daemon.tick()) == 1
        clock.t += 25
    big = daemon.submit(JobSpec(("big",), Request(cpu_milli=1000, gpu_count=4, gpu_milli=1000), "alice", 1000, 1000))
    arrival = clock.t
    predicted: float | None = None
    started_at: float | None = None
    short_backfilled = False
    step = 5.0
    for i in range(200):  # a steady stream: a 1-GPU job (time limit 100 s) every 10 s, one of 20 s every 50 s
        if i % 2 == 0:
            daemon.submit(one_gpu(100))
        if i % 10 == 5:
            short = daemon.submit(one_gpu(20))
        for j in store.list([JobState.RUNNING]):  # each job runs to its time limit
            limit = j.spec.time_limit_s
            if limit is not None and j.started_at is not None and clock.t >= j.started_at + limit:
                executor.expire(j.id)
        started = daemon.tick()
        if big.id in started:
            started_at = clock.t
            break
        if predicted is None:
            assert daemon.reservation is not None and daemon.reservation.job_id == big.id
            predicted = daemon.reservation.start
        if i % 10 == 5 and short.id in started:
            short_backfilled = True
        clock.t += step
    assert predicted is not None and started_at is not None, "the 4-GPU job never started"
    assert predicted <= t0 + 4 * 25 + 100  # the last of the four first jobs ends by its time limit
    # it starts within one round (`step`) of the moment its reservation predicted
    assert started_at <= predicted + step, (started_at - arrival, predicted - arrival)
    assert short_backfilled  # meanwhile a GPU freed early went to a job short enough not to delay it
    long_jobs = [j for j in store.list() if j.spec.time_limit_s == 100 and j.submitted_at >= arrival]
    assert long_jobs and all(j.started_at is None or j.started_at >= started_at for j in long_jobs)


def test_the_default_time_limit_must_be_positive(tmp_path: Path) -> None:
    box4 = parse_simulated_inventory("4xA100-80GB")[0]
    with pytest.raises(Exception, match="default_time_limit"):
        Daemon(MemoryStore(), FakeExecutor(), box4, CONFIG, tmp_path, default_time_limit_s=0)


# ------------------------------------------------------------------------------------------------ explain
def test_explain_tells_position_holders_reservation_and_estimated_start(tmp_path: Path) -> None:
    clock = Clock()
    box2 = parse_simulated_inventory("2xA100-80GB")[0]
    daemon = Daemon(MemoryStore(), FakeExecutor(), box2, CONFIG, tmp_path, clock=clock, default_time_limit_s=7200)
    app = create_app(daemon, threading.Lock(), lambda: None, clock=clock)
    alice, bob = (TestClient(AsPeer(app, p, "unix")) for p in (ALICE, BOB))
    root = TestClient(AsPeer(app, ROOT, "unix"))

    def submit(c: TestClient, gpus: int, limit: str | None = None) -> str:
        body: dict[str, Any] = {"command": ["x"], "gpus": gpus}
        if limit is not None:
            body["time_limit"] = limit
        r = c.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    held_a = submit(alice, 1, "10m")  # GPU 0, ends at t + 600 by its time limit
    held_b = submit(bob, 1)  # GPU 1, no time limit: ends at t + 7200 by the default
    daemon.tick()
    clock.t += 100
    head = submit(alice, 2)
    behind = submit(alice, 1, "2h")
    daemon.tick()
    t = clock.t - 100
    DEFAULT = "default time limit"
    data = alice.get(f"/v1/jobs/{head}/explain").json()
    assert (data["position"], data["queued"]) == (1, 2)
    assert data["holders"] == [
        {"job": held_a, "owner": "alice", "gpus": [0], "expected_end": t + 600, "expected_end_from": "time limit"},
        {"job": held_b, "owner": None, "gpus": [1], "expected_end": t + 7200, "expected_end_from": DEFAULT},
    ]  # bob's name is not shown to alice
    assert data["reservation"] == {"job": head, "gpus": [0, 1], "start": t + 7200}
    assert data["estimated_start"] == t + 7200 and data["default_time_limit_s"] == 7200
    when = clock_text(t + 7200)
    assert data["reason"] == "0/1 nodes fit: 1 insufficient GPU (need 2 whole GPUs)"  # the job's own why, as in ps
    assert data["story"] == (
        "Position 1 of 2 in the queue. Held by job 1 (alice, "
        f"GPU 0, expected to end by {clock_text(t + 600)}), job 2 (another user, GPU 1, expected to end by {when}, "
        f"the default time limit of 7200 s). Reserved for it: GPUs 0, 1 from {when} (estimated start, if running "
        "jobs end by their time limits); jobs behind it start first only if they do not delay it."
    )
    assert root.get(f"/v1/jobs/{head}/explain").json()["holders"][1]["owner"] == "bob"
    other = alice.get(f"/v1/jobs/{behind}/explain").json()
    assert other["position"] == 2 and other["estimated_start"] is None
    assert other["reservation"] == {"job": head, "gpus": [0, 1], "start": t + 7200}
    assert other["reason"] == "0/1 nodes fit: 1 insufficient GPU (need 1 whole GPU)"
    assert other["story"].startswith("Position 2 of 2 in")
    assert f"The head of the queue, job {head}, holds a reservation (GPUs 0, 1 from {when})" in other["story"]
    # a job that is not waiting says how it stands, without queue fields
    ended = alice.get(f"/v1/jobs/{held_a}/explain").json()
    assert ended["state"] == "running" and ended["position"] is None and ended["holders"] == []
    assert ended["story"].startswith("It holds GPU ")  # its GPUs, start, time left and who may preempt it
    assert "but not yet. Protected from preemption until " in ended["story"]  # its minimum runtime


# ------------------------------------------------------------------------------------------------ the serve flag
def test_serve_takes_the_default_time_limit_and_refuses_a_bad_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr("corral.daemon.server.serve", lambda *a, **kw: seen.update(kw))
    runner = CliRunner()
    where = ["--state-dir", str(tmp_path / "state"), "--socket", str(tmp_path / "s.sock")]
    assert runner.invoke(cli, ["serve", *where, "--default-time-limit", "90m"]).exit_code == 0
    assert seen["default_time_limit_s"] == 5400.0
    assert runner.invoke(cli, ["serve", *where]).exit_code == 0
    assert seen["default_time_limit_s"] == DEFAULT_TIME_LIMIT_S == 3600.0
    for bad, why in (("0", "must be more than 0 seconds, got '0'"), ("soon", "not a duration: 'soon'")):
        result = runner.invoke(cli, ["serve", *where, "--default-time-limit", bad])
        assert result.exit_code != 0 and f"--default-time-limit: {why}" in result.output, result.output


# ------------------------------------------------------------------------------------------------ property
@settings(max_examples=150, deadline=None)
@given(
    held=st.lists(st.tuples(st.sampled_from([1, 2]), st.sampled_from([1000, 500]), st.sampled_from([50, 100, 300])),
                  max_size=4),
    queued=st.lists(st.tuples(st.integers(0, 4), st.sampled_from([1000, 400]), st.sampled_from([10, 60, 400, None])),
                    min_size=1, max_size=12),
)  # fmt: skip
def test_backfill_never_delays_the_reservation(
    held: list[tuple[int, int, int]], queued: list[tuple[int, int, float | None]]
) -> None:
    def make(jid: int, gpus: int, milli: int, limit: float | None, t: float) -> Job:
        req = Request(cpu_milli=4000, memory_mib=1024, gpu_count=gpus, gpu_milli=milli if gpus else 0)
        return Job(str(jid), JobSpec(("x",), req, "a", 1, 1, time_limit_s=limit), JobState.QUEUED, submitted_at=t)

    s = box(4)
    ends: dict[str, float] = {}
    for k, (gpus, milli, end) in enumerate(held):
        plan = schedule(s, [make(100 + k, gpus, milli, None, 0)], CONFIG, 0)
        if plan.starts:
            ends[str(100 + k)] = float(end)
    jobs = [make(k + 1, g, m if g == 1 else 1000, lim, k) for k, (g, m, lim) in enumerate(queued)]
    plan = schedule(s, jobs, CONFIG, now=0, ends=ends, default_time_limit_s=200)
    r = plan.reservation
    if r is None:
        return
    limits = {j.id: j.spec.time_limit_s for j in jobs}
    started: dict[str, float] = {go.job_id: limits[go.job_id] or 200.0 for go in plan.starts}
    future = s.copy()
    for job_id, leaves in [*ends.items(), *started.items()]:
        if leaves <= r.start:
            future.release(job_id)
    future.allocate(r.allocation)  # AllocationError here: a backfilled job took what the reservation needs


def test_a_job_without_a_time_limit_past_the_default_is_expected_to_run_another_default() -> None:
    assert expected_end(0.0, None, 3600, now=100) == 3600  # the default from its start
    assert expected_end(0.0, None, 3600, now=5000) == 7200  # past it: the next multiple, not "any moment"
    assert expected_end(0.0, 600.0, 3600, now=5000) == 5000  # past its time limit: being stopped now
    assert expected_end(0.0, 600.0, 3600, now=100) == 600
    # a service-like job has run 5000 s of a default of 3600: the head's reservation is at 7200, so a job of 10 min
    # uses the free GPU meanwhile instead of leaving it idle
    s = box(2)
    running(s, job(1))
    now = 5000.0
    plan = schedule(s, [job(10, gpus=2, t=1), job(11, t=2, limit=600)], CONFIG, now=now,
                    ends={"1": expected_end(0.0, None, 3600, now)}, default_time_limit_s=3600)  # fmt: skip
    assert plan.reservation is not None and plan.reservation.start == 7200
    assert [go.job_id for go in plan.starts] == ["11"]
