"""Preemption: the victim choice (pure, with shares), the daemon over a fake executor (records, retries, restart), and
the real thing: `corral serve`'s daemon with real processes and signals (SIGTERM trapped, SIGKILL after the grace)."""

from __future__ import annotations

import os
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import combinations
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner as TyperRunner

from corral.api.app import create_app
from corral.cli.client import submit_cmd
from corral.cli.main import app as corral_cli
from corral.cli.views import explain_text, show_lines
from corral.daemon.core import Daemon
from corral.daemon.preemption import PREEMPTING, Rules, choose
from corral.daemon.queues import Queues
from corral.daemon.scheduler import clock_text, request_of, running_of, schedule
from corral.executor.fake import FakeExecutor
from corral.executor.local import LocalExecutor
from corral.gpu.simulated import parse_simulated_inventory
from corral.jobs.model import Job, JobSpec, JobState
from corral.model.errors import InvalidRequest
from corral.model.resources import GpuBehavior, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig
from corral.store import MemoryStore, SqliteStore
from tests.api.test_api import ALICE, BOB, AsPeer
from tests.builders import cluster, node

CONFIG = PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)
NOW = 10_000.0


def spec(gpus: int = 1, milli: int = 1000, priority: int = 0, preemptible: bool = True, **kw: object) -> JobSpec:
    req = Request(cpu_milli=1000, memory_mib=1024, gpu_count=gpus, gpu_milli=milli if gpus else 0, priority=priority)
    return JobSpec(("x",), req, "alice", 1000, 1000, preemptible=preemptible, **kw)  # type: ignore[arg-type]


def box(gpus: int = 2) -> ClusterSnapshot:
    return cluster(node("box").gpus(gpus).cpu(32).mem(128))


def run_on(s: ClusterSnapshot, jid: str, ran_s: float, **kw: object) -> Job:
    """A job started on `s` (it must fit) `ran_s` seconds before NOW, as the daemon holds it."""
    queued = Job(jid, spec(**kw), JobState.QUEUED, submitted_at=0)  # type: ignore[arg-type]
    plan = schedule(s, [queued], CONFIG, 0)
    assert [st.job_id for st in plan.starts] == [jid], plan.waiting
    grant = plan.starts[0].allocation
    return replace(queued, state=JobState.RUNNING, started_at=NOW - ran_s, gpus=grant.gpus, attempts=1)


def waiting(jid: str = "99", **kw: object) -> Job:
    return Job(jid, spec(**kw), JobState.QUEUED, submitted_at=NOW)  # type: ignore[arg-type]


def victims_of(s: ClusterSnapshot, head: Job, running: list[Job], rules: Rules | None = None) -> list[str] | None:
    choice = choose(s, head, request_of(head), running, CONFIG, NOW, rules)
    return None if choice is None else sorted(v.job.id for v in choice.victims)


# ------------------------------------------------------------------------------------------------ the choice (pure)
def test_a_half_gpu_share_is_freed_exactly_and_the_cheapest_single_victim_is_chosen() -> None:
    s = box(2)
    a = run_on(s, "1", 100, milli=500)  # GPU 0, half: 50 GPU-seconds lost if stopped
    b = run_on(s, "2", 40, milli=500)  # GPU 0, the other half: 20 GPU-seconds
    c = run_on(s, "3", 30)  # GPU 1, whole: 30 GPU-seconds
    head = waiting(milli=500, priority=5)
    choice = choose(s, head, request_of(head), [a, b, c], CONFIG, NOW)
    assert choice is not None and [v.job.id for v in choice.victims] == ["2"]  # one job, the least GPU time lost
    assert choice.victims[0].gpu_seconds == pytest.approx(20.0)
    [grant] = choice.allocation.gpus
    assert (grant.index, grant.milli) == (0, 500)  # exactly the half job 2 held: GPU 0's other half stays job 1's
    assert s.allocations.keys() == {"1", "2", "3"}  # the snapshot itself is not changed


def test_fewest_jobs_first_then_least_run_time() -> None:
    s = box(2)
    a = run_on(s, "1", 10, milli=500)
    b = run_on(s, "2", 10, milli=500)  # jobs 1 and 2 together: 10 GPU-seconds
    c = run_on(s, "3", 200)  # one job: 200 GPU-seconds
    assert victims_of(s, waiting(priority=1), [a, b, c]) == ["3"]  # a whole GPU: one victim beats two cheaper ones
    d = box(2)
    x = run_on(d, "1", 300)
    y = run_on(d, "2", 60)
    assert victims_of(d, waiting(priority=1), [x, y]) == ["2"]  # equal counts: the one that ran for less


def test_never_preempt_when_the_preemptor_still_cannot_fit() -> None:
    s = box(2)
    low = run_on(s, "1", 10, priority=0)
    high = run_on(s, "2", 10, priority=9)  # outranks the preemptor: never its victim
    head = waiting(gpus=2, priority=5)
    assert victims_of(s, head, [low, high]) is None  # stopping job 1 frees one GPU of the two it needs
    assert victims_of(s, waiting(gpus=1, priority=5), [low, high]) == ["1"]


def test_a_job_not_preemptible_is_never_chosen() -> None:
    s = box(2)
    cheap = run_on(s, "1", 5, preemptible=False)
    dear = run_on(s, "2", 5000)
    assert victims_of(s, waiting(priority=3), [cheap, dear]) == ["2"]
    t = box(1)
    only = run_on(t, "1", 5, preemptible=False)
    assert victims_of(t, waiting(priority=3), [only]) is None


def test_equal_priority_never_preempts_and_the_queue_rules_plug_in() -> None:
    s = box(1)
    j = run_on(s, "1", 5, priority=2)
    assert victims_of(s, waiting(priority=2), [j]) is None  # no queues: only a strictly higher priority preempts
    reclaim = Rules(below_guarantee=lambda job: job.id == "99")  # its queue is below its guarantee
    choice = choose(s, waiting(priority=2), request_of(waiting(priority=2)), [j], CONFIG, NOW, reclaim)
    assert choice is not None and choice.victims[0].why == "guarantee"
    assert "its queue was below its guarantee" in choice.words["1"]
    keeps = Rules(borrowing=lambda job: False)  # within its guarantee: not preemptible by anyone
    assert victims_of(s, waiting(priority=9), [j], keeps) is None


def test_many_small_shares_past_the_search_budget_still_give_a_fit() -> None:
    s = box(2)
    running = [run_on(s, str(i), 10 + i, milli=100) for i in range(1, 21)]  # ten 0.1 shares per GPU
    head = waiting(gpus=1, priority=1)
    choice = choose(s, head, request_of(head), running, CONFIG, NOW, budget=20)
    assert choice is not None and len(choice.victims) == 10  # one GPU's ten shares: the fewest that free a GPU
    assert len({g.index for v in choice.victims for g in v.job.gpus}) == 1


# ------------------------------------------------------------------------------------------------ the daemon (fake)
class Clock:
    def __init__(self) -> None:
        self.t = NOW

    def __call__(self) -> float:
        return self.t


def fake_daemon(
    tmp_path: Path,
    store: object = None,
    ex: FakeExecutor | None = None,
    clock: Clock | None = None,
    min_runtime_s: float = 0,
) -> Daemon:
    """A daemon over a fake executor (no minimum runtime unless asked: these tests are about the choice)."""
    box2 = parse_simulated_inventory("2xA100-80GB")[0]
    return Daemon(
        store or MemoryStore(),  # type: ignore[arg-type]
        ex or FakeExecutor(cancel_ends=False),
        box2,
        CONFIG,
        tmp_path,
        clock=clock or Clock(),
        preempt_grace_s=30,
        queues=Queues(box2, min_runtime_s=min_runtime_s),
    )


def test_the_victim_goes_back_to_the_queue_with_its_attempts_and_retries_kept(tmp_path: Path) -> None:
    clock = Clock()
    ex = FakeExecutor(cancel_ends=False)
    d = fake_daemon(tmp_path, ex=ex, clock=clock)
    low = d.submit(spec(gpus=2, retries=1))
    assert d.tick() == [low.id]
    clock.t += 60
    high = d.submit(replace(spec(gpus=1, priority=5), user="bob", uid=1001, gid=1001))
    assert d.tick() == []
    assert ex.cancelled == [(low.id, 30.0)]  # SIGTERM now, SIGKILL after the 30 s grace (the executor's part)
    victim = d.store.get(low.id)
    assert victim is not None and victim.state is JobState.RUNNING and victim.reason.startswith(PREEMPTING)
    said = f"preempted by job {high.id} (user bob, priority 5) at 1970-01-01 02:47:40 UTC: a higher priority than "
    assert victim.preempted is not None and victim.preempted.reason.startswith(said)
    assert victim.preempted.count == 1
    waits = d.store.get(high.id)
    assert waits is not None and waits.reason.endswith(
        f"; preempting job {low.id} for it (SIGTERM, then SIGKILL after 30 s)"
    )
    assert d.tick() == [] and ex.cancelled == [(low.id, 30.0)]  # one preemption at a time; not signalled twice
    clock.t += 30
    ex.finish(low.id, None, signal=9, cancelled=True)  # it ignored SIGTERM: killed after the grace
    assert d.tick() == [high.id]  # the freed GPUs go to the preemptor first
    back = d.store.get(low.id)
    assert back is not None and back.state is JobState.QUEUED and back.attempts == 1 and back.gpus == ()
    assert back.preempted is not None and back.preempted.reason.endswith("; it stopped (killed by signal 9)")
    # Its one retry is still there: started again, then a real failure is retried once, then it fails for good.
    ex.finish(high.id, 0)
    assert d.tick() == [low.id]
    ex.finish(low.id, 3)
    d.tick()
    again = d.store.get(low.id)
    assert again is not None and again.state is JobState.QUEUED and "retry 1 of 1" in again.reason
    clock.t += 5
    assert d.tick() == [low.id]
    ex.finish(low.id, 3)
    d.tick()
    done = d.store.get(low.id)
    assert done is not None and done.state is JobState.FAILED and done.attempts == 3 and done.preempted is not None


def test_a_victim_that_exits_0_on_sigterm_is_queued_again_and_a_cancel_wins(tmp_path: Path) -> None:
    clock = Clock()
    ex = FakeExecutor(cancel_ends=False)
    d = fake_daemon(tmp_path, ex=ex, clock=clock)
    one, two = d.submit(spec()), d.submit(spec())
    d.tick()
    d.submit(spec(gpus=2, priority=1))
    d.tick()
    assert sorted(j for j, _ in ex.cancelled) == [one.id, two.id]
    ex.finish(one.id, 0, cancelled=True)  # it saved its work and left
    d.cancel(two.id)  # and its owner cancels the other meanwhile
    ex.finish(two.id, None, signal=15, cancelled=True)
    d.tick()
    assert d.store.get(one.id).state is JobState.QUEUED  # type: ignore[union-attr]
    assert d.store.get(two.id).state is JobState.CANCELLED  # type: ignore[union-attr]


def test_a_job_not_preemptible_is_left_running(tmp_path: Path) -> None:
    ex = FakeExecutor(cancel_ends=False)
    d = fake_daemon(tmp_path, ex=ex)
    d.submit(spec(gpus=2, preemptible=False))
    d.tick()
    d.submit(spec(priority=9))
    d.tick()
    assert ex.cancelled == []


def test_kill9_during_the_grace_then_restart_neither_loses_nor_reruns_the_job(tmp_path: Path) -> None:
    clock = Clock()
    store = SqliteStore(tmp_path / "jobs.db")
    ex = FakeExecutor(cancel_ends=False)
    d = fake_daemon(tmp_path, store=store, ex=ex, clock=clock)
    low = d.submit(spec(gpus=2))
    d.tick()
    high = d.submit(spec(gpus=2, priority=4))
    d.tick()
    assert [j for j, _ in ex.cancelled] == [low.id]
    store.close()  # kill -9 of the daemon in the grace period: its supervisor still kills the job
    clock.t += 10
    ex2 = ex.restarted()
    d2 = fake_daemon(tmp_path, store=SqliteStore(tmp_path / "jobs.db"), ex=ex2, clock=clock)
    d2.recover()
    alive = d2.store.get(low.id)
    assert alive is not None and alive.state is JobState.RUNNING and alive.preempted is not None
    assert ex2.cancelled == [(low.id, 20.0)]  # the SIGTERM again (it may never have been sent), with the grace left
    assert d2.tick() == []  # still dying: nothing started on its GPUs, nothing preempted twice
    ex2.finish(low.id, None, signal=9, cancelled=True)
    assert d2.tick() == [high.id]
    assert d2.store.get(low.id).state is JobState.QUEUED  # type: ignore[union-attr]
    # the exit recorded while no daemon runs is a preemption too
    ex3 = ex2.restarted()
    ex3.finish(high.id, 0)
    d3 = fake_daemon(tmp_path, store=d2.store, ex=ex3, clock=clock)
    d3.recover()
    assert d3.tick() == [low.id]
    assert [(s.job_id, s.attempt) for s in ex.launched + ex2.launched + ex3.launched] == [
        (low.id, 1),
        (high.id, 1),
        (low.id, 2),
    ]


def test_an_exit_recorded_while_the_daemon_was_away_requeues_the_victim(tmp_path: Path) -> None:
    clock = Clock()
    ex = FakeExecutor(cancel_ends=False)
    store = MemoryStore()
    d = fake_daemon(tmp_path, store=store, ex=ex, clock=clock)
    low = d.submit(spec(gpus=2, retries=0))
    d.tick()
    d.submit(spec(gpus=2, priority=4))
    d.tick()
    ex2 = ex.restarted()
    ex2.finish(low.id, None, signal=9, cancelled=True)  # killed after the grace while no daemon ran
    d2 = fake_daemon(tmp_path, store=store, ex=ex2, clock=clock)
    d2.recover()
    back = d2.store.get(low.id)
    assert back is not None and back.state is JobState.QUEUED and back.attempts == 1  # not FAILED, not CANCELLED


# ------------------------------------------------------------------------------------------------ real processes
def wait_for(what: Callable[[], bool], d: Daemon, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d.tick()
        if what():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out; jobs: {[(j.id, j.state.value, j.reason) for j in d.store.list()]}")


def test_real_processes_sigterm_trapped_sigkill_after_the_grace(tmp_path: Path) -> None:
    box2 = parse_simulated_inventory("2xA100-80GB")[0]
    ex = LocalExecutor(run_dir=tmp_path / "run")
    d = Daemon(MemoryStore(), ex, box2, CONFIG, tmp_path, preempt_grace_s=1.0, queues=Queues(box2, min_runtime_s=0))
    me, gid = os.getuid(), os.getgid()

    def job(script: str, priority: int = 0) -> JobSpec:
        req = Request(cpu_milli=100, memory_mib=64, gpu_count=1, gpu_milli=1000, priority=priority)
        return JobSpec(("sh", "-c", script), req, "me", me, gid, cwd=str(tmp_path))

    traps = tmp_path / "termed"
    started = tmp_path / "started"
    # One saves its work on SIGTERM and exits 0; the other ignores SIGTERM and is killed after the grace.
    polite = d.submit(
        job(f"trap 'echo TERM >> {traps}; exit 0' TERM; echo $$ >> {started}; while :; do sleep 0.05; done")
    )
    stubborn = d.submit(job(f"trap '' TERM; echo x >> {started}.2; while :; do sleep 0.05; done"))
    wait_for(lambda: started.exists() and Path(f"{started}.2").exists(), d)
    held = d.store.get(stubborn.id)
    assert held is not None and held.state is JobState.RUNNING
    time.sleep(0.3)  # both have run a while; the polite one for longer
    envs = tmp_path / "preemptor"
    big = d.submit(job(f"echo $CUDA_VISIBLE_DEVICES > {shlex.quote(str(envs))}; exec sleep 60", priority=5))
    # It preempts one job, the cheaper (the stubborn one ran for less), and starts on the GPU that job held.
    wait_for(lambda: envs.exists() and envs.read_text().strip() != "", d)
    assert envs.read_text().strip() == held.gpu_uuids[0]
    victim = d.store.get(stubborn.id)
    assert victim is not None and victim.state is JobState.QUEUED and victim.attempts == 1
    assert victim.preempted is not None and victim.preempted.reason.startswith(f"preempted by job {big.id} (user me")
    assert victim.preempted.reason.endswith("; it stopped (killed by signal 9)")  # SIGKILL after the 1 s grace
    assert d.store.get(polite.id).state is JobState.RUNNING  # type: ignore[union-attr]
    # A second one preempts the polite job, which traps SIGTERM, saves its work and exits 0: queued again.
    small = d.submit(job("true", priority=5))
    wait_for(lambda: d.store.get(small.id).state is JobState.SUCCEEDED, d)  # type: ignore[union-attr]
    assert traps.read_text() == "TERM\n"
    wait_for(lambda: d.store.get(polite.id).state is JobState.RUNNING, d)  # type: ignore[union-attr]
    again = d.store.get(polite.id)
    assert again is not None and again.attempts == 2 and again.preempted is not None
    assert again.preempted.reason.endswith("; it stopped (exit code 0)")
    assert d.store.get(stubborn.id).state is JobState.QUEUED  # type: ignore[union-attr]
    for j in (polite, big, stubborn):
        d.cancel(j.id)
    wait_for(lambda: not ex.running(), d)
    ex.close()


# ------------------------------------------------------------------------------------------------ API and CLI
def test_explain_and_show_say_why_a_running_job_was_preempted_and_no_preempt_is_kept(tmp_path: Path) -> None:
    clock = Clock()
    box2 = parse_simulated_inventory("2xA100-80GB")[0]
    ex = FakeExecutor()  # a cancel ends the job at once, as a SIGTERM the job obeys
    d = Daemon(MemoryStore(), ex, box2, CONFIG, tmp_path, clock=clock, preempt_grace_s=5,
               queues=Queues(box2, min_runtime_s=0))  # fmt: skip
    app = create_app(d, threading.Lock(), lambda: None, clock=clock)
    alice, bob = (TestClient(AsPeer(app, p, "unix")) for p in (ALICE, BOB))
    low = alice.post("/v1/jobs", json={"command": ["x"], "gpus": 2}).json()["id"]
    d.tick()
    clock.t += 120
    high = bob.post("/v1/jobs", json={"command": ["y"], "gpus": 1, "priority": 50}).json()["id"]
    d.tick()  # job 1 preempted (its SIGTERM ends it at once here)
    assert d.tick() == [high]  # job 1 back in the queue; job 2 on one GPU; job 1 needs both
    ex.finish(high, 0)
    assert d.tick() == [low]
    when = clock_text(NOW + 120)
    said = (
        f"preempted by job {high} (user bob, priority 50) at {when}: a higher priority than this job's 0; "
        "it stopped (killed by signal 15)"
    )
    data = alice.get(f"/v1/jobs/{low}/explain").json()
    assert data["state"] == "running"
    # after what a running job holds and who may preempt it (tests/api/test_read_views.py), its preemption before
    assert data["story"].endswith(f" It was preempted once before; the last time: {said}.")
    assert data["preempted"] == {"count": 1, "at": NOW + 120, "reason": said}
    lines = explain_text(low, data)
    assert lines[0] == f"job {low} is running" and lines[-1] == f"It was preempted once before; the last time: {said}."
    shown = alice.get(f"/v1/jobs/{low}").json()
    assert shown["attempts"] == 2 and shown["preemptible"] is True
    assert ("preempted", f"once; the last: {said}") in show_lines(shown, NOW)
    # Not preemptible: API field and CLI flag; then a higher priority job waits instead.
    firm = alice.post("/v1/jobs", json={"command": ["z"], "gpus": 0, "preemptible": False}).json()
    assert firm["preemptible"] is False and ("preemptible", "no") in show_lines(firm, NOW)
    assert d.store.get(firm["id"]).spec.preemptible is False  # type: ignore[union-attr]


def test_submit_no_preempt_flag_sends_preemptible_false() -> None:
    sent: list[dict[str, object]] = []

    class Answer:
        def json(self) -> dict[str, object]:
            return {"id": "7"}

    def fake_call(*args: object, json: dict[str, object], **kw: object) -> Answer:
        sent.append(json)
        return Answer()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("corral.cli.client.call", fake_call)
        result = CliRunner().invoke(submit_cmd, ["--no-preempt", "--", "train.py"])
        assert result.exit_code == 0, result.output
        CliRunner().invoke(submit_cmd, ["--", "train.py"])
    assert [b["preemptible"] for b in sent] == [False, True]
    assert "--no-preempt" in CliRunner().invoke(submit_cmd, ["--help"]).output


def test_what_a_victim_frees_in_the_grace_is_held_for_the_preemptor(tmp_path: Path) -> None:
    clock = Clock()
    ex = FakeExecutor(cancel_ends=False)
    d = fake_daemon(tmp_path, ex=ex, clock=clock)
    polite, stubborn = d.submit(spec()), d.submit(spec())
    d.tick()
    clock.t += 10
    high = d.submit(spec(gpus=2, priority=5))
    d.tick()
    assert sorted(j for j, _ in ex.cancelled) == [polite.id, stubborn.id]
    ex.finish(polite.id, 0, cancelled=True)  # one leaves at once; the other holds its GPU for the whole grace
    clock.t += 1
    later = d.submit(spec(time_limit_s=600))  # fits on the freed GPU now, but would run past the grace
    assert d.tick() == []
    waits = d.store.get(later.id)
    assert waits is not None and waits.reason.startswith(f"would delay the reservation of job {high.id}")
    clock.t += 29
    ex.finish(stubborn.id, None, signal=9, cancelled=True)
    assert d.tick() == [high.id]


def test_kill9_of_a_real_daemon_in_the_grace_the_supervisor_finishes_and_the_job_is_requeued_once(
    tmp_path: Path,
) -> None:
    box2 = parse_simulated_inventory("2xA100-80GB")[0]
    me, gid = os.getuid(), os.getgid()
    runs = tmp_path / "runs"

    def job(script: str, priority: int = 0) -> JobSpec:
        req = Request(cpu_milli=100, memory_mib=64, gpu_count=2, gpu_milli=1000, priority=priority)
        return JobSpec(("sh", "-c", script), req, "me", me, gid, cwd=str(tmp_path))

    store = SqliteStore(tmp_path / "jobs.db")
    ex = LocalExecutor(run_dir=tmp_path / "run")
    d = Daemon(store, ex, box2, CONFIG, tmp_path, preempt_grace_s=1.5, queues=Queues(box2, min_runtime_s=0))
    low = d.submit(job(f"echo run >> {runs}; trap '' TERM; while :; do sleep 0.05; done"))
    wait_for(lambda: runs.exists(), d)
    high = d.submit(job("sleep 0.2", priority=5))
    d.tick()
    signalled = d.store.get(low.id)
    assert signalled is not None and signalled.reason.startswith(PREEMPTING)
    # kill -9 of the daemon: no cleanup; the job's supervisor lives on and kills the job after the grace
    ex.close()
    store.close()
    store2 = SqliteStore(tmp_path / "jobs.db")
    ex2 = LocalExecutor(run_dir=tmp_path / "run")
    d2 = Daemon(store2, ex2, box2, CONFIG, tmp_path, preempt_grace_s=1.5, queues=Queues(box2, min_runtime_s=0))
    d2.recover()
    wait_for(lambda: d2.store.get(high.id).state is JobState.SUCCEEDED, d2)  # type: ignore[union-attr]
    wait_for(lambda: d2.store.get(low.id).state is JobState.RUNNING, d2)  # type: ignore[union-attr]
    again = d2.store.get(low.id)
    assert again is not None and again.attempts == 2 and again.preempted is not None and again.preempted.count == 1
    assert again.preempted.reason.endswith("; it stopped (killed by signal 9)")
    # RUNNING is stored when the process is launched, not when its first line has run: wait for the line
    wait_for(lambda: runs.read_text().count("run") >= 2, d2)
    assert runs.read_text() == "run\nrun\n"  # ran once before, once after: never twice at a time, never lost
    ex2.cancel(low.id, grace_s=0)  # it ignores SIGTERM: no need to wait out a cancel's grace
    wait_for(lambda: not ex2.running(), d2)
    ex2.close()
    store2.close()


def test_serve_takes_the_preempt_grace_and_refuses_a_bad_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}
    monkeypatch.setattr("corral.daemon.server.serve", lambda *a, **kw: seen.update(kw))
    runner = TyperRunner()
    where = ["--state-dir", str(tmp_path / "state"), "--socket", str(tmp_path / "s.sock")]
    assert runner.invoke(corral_cli, ["serve", *where, "--preempt-grace", "2m"]).exit_code == 0
    assert seen["preempt_grace_s"] == 120.0
    assert runner.invoke(corral_cli, ["serve", *where]).exit_code == 0
    assert seen["preempt_grace_s"] == 30.0
    result = runner.invoke(corral_cli, ["serve", *where, "--preempt-grace", "soon"])
    assert result.exit_code != 0 and "--preempt-grace: not a duration: 'soon'" in result.output, result.output
    with pytest.raises(InvalidRequest, match="preempt_grace: must be >= 0 seconds"):
        Daemon(
            MemoryStore(),
            FakeExecutor(),
            parse_simulated_inventory("1xA100-80GB")[0],
            CONFIG,
            tmp_path,
            preempt_grace_s=-1,
        )


def test_a_gang_preempts_enough_for_all_its_instances() -> None:
    s = box(4)
    running = [run_on(s, str(i), 10 * i) for i in range(1, 5)]  # four 1-GPU jobs, the oldest the costliest
    head = Job("99", spec(priority=5, instances=3, gang=True), JobState.QUEUED, submitted_at=NOW)
    choice = choose(s, head, request_of(head), running, CONFIG, NOW)
    assert choice is not None and sorted(v.job.id for v in choice.victims) == ["1", "2", "3"]  # the 3 cheapest
    assert len(set(choice.allocation.gpu_indices)) == 3


# ------------------------------------------------------------------------------------------------ property
@settings(max_examples=60, deadline=None)
@given(
    held=st.lists(
        st.tuples(st.sampled_from([1000, 500, 250]), st.integers(0, 3), st.booleans(), st.integers(1, 500)),
        min_size=1,
        max_size=6,
    ),
    want=st.tuples(st.sampled_from([1, 2]), st.sampled_from([1000, 500]), st.integers(0, 4)),
)
def test_the_choice_is_safe_and_minimal(held: list[tuple[int, int, bool, int]], want: tuple[int, int, int]) -> None:
    s = box(2)
    running: list[Job] = []
    for i, (milli, priority, preemptible, ran) in enumerate(held, start=1):
        t = s.copy()
        queued = Job(str(i), spec(milli=milli, priority=priority, preemptible=preemptible), JobState.QUEUED, 0)
        if schedule(t, [queued], CONFIG, 0).starts:  # only what fits is running
            running.append(run_on(s, str(i), ran, milli=milli, priority=priority, preemptible=preemptible))
    gpus, milli, priority = want
    head = waiting(gpus=gpus, milli=milli, priority=priority)
    eligible = [j for j in running if j.spec.preemptible and j.spec.request.priority < priority]

    def fits_without(victims: Sequence[Job]) -> bool:
        left = s.copy()
        for v in victims:
            left.release(v.id)
        return schedule(left, [head], CONFIG, 0).starts != []

    choice = choose(s, head, request_of(head), running, CONFIG, NOW)
    if choice is None:
        # nothing preempted only when it fits as things are, or even all the eligible jobs would not do
        assert fits_without([]) or not eligible or not fits_without(eligible)
        return
    chosen = [v.job for v in choice.victims]
    assert all(j in eligible for j in chosen)  # never a job of equal or higher priority, never a non-preemptible one
    left = s.copy()
    for j in chosen:
        left.release(j.id)
    left.allocate(choice.allocation)  # the preemptor's grant fits on exactly what the victims free (no over-commit)
    fewer = any(fits_without(c) for k in range(len(chosen)) for c in combinations(eligible, k))
    assert not fewer  # no smaller set of eligible jobs would do


# ------------------------------------------------------------------------------------------------ minimum runtime
def test_a_submit_and_cancel_loop_preempts_a_victim_at_most_once_per_minimum_runtime(tmp_path: Path) -> None:
    """Issue 23: without a queues file, a user looping "submit a priority-5 job, wait until it runs, cancel it" had
    another user's job preempted 7 times in 60 s. With the default minimum runtime (5 minutes) a victim is preempted
    at most once per 5 minutes of its run, and the preemptor's reason says from when."""
    clock = Clock()
    ex = FakeExecutor()  # a cancel ends the job at once: a victim that obeys SIGTERM
    box2 = parse_simulated_inventory("2xA100-80GB")[0]
    d = Daemon(MemoryStore(), ex, box2, CONFIG, tmp_path, clock=clock, preempt_grace_s=30)  # no queues file
    victim = d.submit(replace(spec(gpus=2), user="bob", uid=1001, gid=1001))
    assert d.tick() == [victim.id]
    preempted_at: list[float] = []
    starts: list[float] = [clock.t]
    mine: str | None = None
    told: set[str] = set()
    for _ in range(12 * 20):  # 20 minutes, every 5 s
        clock.t += 5
        if mine is None:
            mine = d.submit(spec(gpus=1, priority=5)).id
        d.tick()
        job = d.store.get(mine)
        assert job is not None
        if job.state is JobState.QUEUED and "minimum runtime" in job.reason:
            told.add(job.reason.split("; ", 1)[1])
        if job.state is JobState.RUNNING:
            d.cancel(mine)
            d.tick()
            mine = None
        v = d.store.get(victim.id)
        assert v is not None
        if v.preempted is not None and len(preempted_at) < v.preempted.count:
            preempted_at.append(v.preempted.at)
        if v.state is JobState.RUNNING and v.started_at is not None and v.started_at != starts[-1]:
            starts.append(v.started_at)
    assert 2 <= len(preempted_at) <= 4, preempted_at  # before: about one every 10 s
    for start, stop in zip(starts, preempted_at, strict=False):
        assert stop - start >= 300  # each run lasted its minimum runtime
    first = clock_text(NOW + 300)
    assert (
        f"it may preempt job {victim.id} from {first}, when it has run the minimum runtime of 5m "
        "(docs/preemption.md)" in told
    )
    v = d.store.get(victim.id)
    assert v is not None and v.preempted is not None
    assert "(it had run 5m, past its minimum runtime of 5m)" in v.preempted.reason


def test_explain_says_until_when_a_running_job_is_protected(tmp_path: Path) -> None:
    clock = Clock()
    box2 = parse_simulated_inventory("2xA100-80GB")[0]
    d = Daemon(MemoryStore(), FakeExecutor(), box2, CONFIG, tmp_path, clock=clock)
    app = create_app(d, threading.Lock(), lambda: None, clock=clock)
    alice = TestClient(AsPeer(app, ALICE, "unix"))
    job = alice.post("/v1/jobs", json={"command": ["x"], "gpus": 1}).json()["id"]
    d.tick()
    clock.t += 60
    said = alice.get(f"/v1/jobs/{job}/explain").json()
    guard = f"Protected from preemption until {clock_text(NOW + 300)} (minimum runtime 5m)."
    assert said["preemptible_now"] is False
    lines = explain_text(job, said)
    assert lines[-2:] == ["It may be preempted by a waiting job of a priority above its 0, but not yet.", guard]
    clock.t += 240
    past = alice.get(f"/v1/jobs/{job}/explain").json()  # past it: preemptible as any job
    assert "Protected" not in past["story"] and past["preemptible_now"] is True
    firm = alice.post("/v1/jobs", json={"command": ["x"], "gpus": 1, "preemptible": False}).json()["id"]
    d.tick()
    firm_said = alice.get(f"/v1/jobs/{firm}/explain").json()  # never preempted: nothing to protect
    assert "Protected" not in firm_said["story"] and "--no-preempt" in firm_said["story"]


def test_the_minimum_runtime_is_per_queue_with_a_default_for_the_file(tmp_path: Path) -> None:
    text = 'min_runtime = "2m"\n[queues.long]\nmin_runtime = "1h"\n[queues.free]\nmin_runtime = 0\n[queues.plain]\n'
    path = tmp_path / "queues.toml"
    path.write_text(text)
    box2 = parse_simulated_inventory("2xA100-80GB")[0]
    q = Queues.open(path, box2)
    runtimes = {
        name: q.min_runtime_of(running_of(Job("1", spec(queue=name), JobState.RUNNING, submitted_at=0)))
        for name in q.config.queues
    }
    assert runtimes == {"long": 3600, "free": 0, "plain": 120, "default": 120}
    no_file = Queues(box2).min_runtime_of(running_of(Job("1", spec(), JobState.RUNNING, submitted_at=0)))
    assert no_file == 300  # no file: 5 minutes
    rules = q.preemption_rules()
    long_job = Job("1", spec(queue="long"), JobState.RUNNING, submitted_at=0, started_at=NOW)
    assert rules.protected_until(running_of(long_job)) == NOW + 3600
