"""A restart with a long history (issue 26, item 7): `Daemon.recover_live` costs the jobs holding resources only;
what grows with the history (retries decided and not stored, fair share's usage) is caught up a page at a time
(`Daemon.catch_up`), each page one hold of the daemon's lock in `corral serve`, and no round runs before the last."""

from __future__ import annotations

import builtins
from collections.abc import Collection
from pathlib import Path

import pytest

from corral.daemon.core import Daemon
from corral.daemon.queues import Queues
from corral.executor.fake import FakeExecutor
from corral.gpu.simulated import parse_simulated_inventory
from corral.jobs.model import Job, JobSpec, JobState
from corral.model.resources import GpuBehavior, GpuGrant, Request
from corral.placement import PlacementConfig
from corral.store import MemoryStore, SqliteStore
from corral.store.base import JobQuery, Store
from tests.api.test_api import ALICE
from tests.jobs.harness import World, metronome_job

CONFIG = PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)
NOW = 1_000_000.0
QUEUES = "[queues.default]\n[queues.other]\n"


def spec(user: str, retries: int = 0, queue: str = "default", gpus: int = 1) -> JobSpec:
    request = Request(cpu_milli=1000, memory_mib=1024, gpu_count=gpus, gpu_milli=1000 if gpus else 0)
    return JobSpec(("x",), request, user, 1000, 1000, retries=retries, queue=queue)


def history(store: Store, ended: int, failed_with_retries: int) -> list[str]:
    """`ended` jobs that ran and ended (users and queues mixed), and `failed_with_retries` that failed with retries
    left whose return to the queue was never stored (the daemon stopped in between). Their ids."""
    retried = []
    for i in range(ended + failed_with_retries):
        again = i >= ended
        job = store.add(spec(f"u{i % 3}", retries=2 if again else 0, queue=("default", "other")[i % 2]), NOW - 9000)
        start = NOW - 8000 + i
        store.transition(job.id, JobState.STARTING, attempts=1, gpus=(GpuGrant(i % 4, 1000, 0),))
        store.transition(job.id, JobState.RUNNING, started_at=start)
        final = JobState.FAILED if again or i % 7 == 0 else JobState.SUCCEEDED
        store.transition(job.id, final, finished_at=start + 60 + i % 50, exit_code=1 if final is JobState.FAILED else 0)
        if again:
            retried.append(job.id)
    return retried


def daemon_over(store: Store, tmp_path: Path) -> tuple[Daemon, Queues]:
    path = tmp_path / "queues.toml"
    path.write_text(QUEUES)
    node = parse_simulated_inventory("4xA100-80GB")[0]
    queues = Queues.open(path, node)
    daemon = Daemon(store, FakeExecutor(), node, CONFIG, tmp_path, clock=lambda: NOW, queues=queues)
    return daemon, queues


def usage(queues: Queues) -> dict[object, list[float]]:
    return {a: [round(float(x), 3) for x in queues.ledger.usage(a, NOW)] for a in queues.ledger.accounts()}


@pytest.mark.parametrize("make_store", [MemoryStore, "sqlite"])
def test_catch_up_goes_a_page_at_a_time_and_ends_where_a_full_recovery_does(tmp_path: Path, make_store: object) -> None:
    store: Store = SqliteStore(tmp_path / "jobs.db") if make_store == "sqlite" else MemoryStore()
    retried = history(store, ended=1030, failed_with_retries=25)
    daemon, queues = daemon_over(store, tmp_path)
    daemon.recover_live()
    steps = daemon.catch_up(page=100)
    pages = 0
    for _ in steps:
        pages += 1
        # a partial ledger is never in place: the round's fair share sees the whole history or nothing of it
        assert queues.ledger.accounts() == []
    # 173 failed jobs to look at for retries (2 pages), then 1,030 ended ones to charge (11 pages; the 25 retried
    # are queued again by then): a yield between two pages
    assert pages == 1 + 10
    for job_id in retried:
        job = store.get(job_id)
        assert job is not None and job.state is JobState.QUEUED
        assert job.reason.endswith("; retry 1 of 2") and job.not_before > NOW
    # the same ledger as the whole history read at once (a restart before this change)
    _, whole_queues = daemon_over(store, tmp_path)
    assert whole_queues.rebuild(store, NOW) == 1030
    got, expected = usage(queues), usage(whole_queues)
    assert got.keys() == expected.keys()
    for account, values in expected.items():
        assert got[account] == pytest.approx(values, rel=1e-9), account
    assert {("user", "default", "u0"), ("queue", "other")} <= set(usage(queues))


def test_a_reload_during_the_catch_up_keeps_its_own_ledger(tmp_path: Path) -> None:
    store = MemoryStore()
    history(store, ended=300, failed_with_retries=0)
    _, queues = daemon_over(store, tmp_path)
    steps = queues.rebuilding(store, NOW, page=100)
    next(steps)
    (tmp_path / "queues.toml").write_text('half_life = "1d"\n' + QUEUES)
    queues.reload(store, NOW)  # a new half-life: the reload rebuilds the ledger itself, at once
    reloaded = usage(queues)
    assert reloaded and queues.ledger.half_life_s == 86400
    for _ in steps:
        pass
    assert usage(queues) == reloaded  # the catch-up's ledger, made for the old configuration, is dropped


def test_nothing_to_catch_up_on_a_fresh_store(tmp_path: Path) -> None:
    daemon, _ = daemon_over(MemoryStore(), tmp_path)
    daemon.recover_live()
    assert list(daemon.catch_up(page=10)) == []


class Counting(MemoryStore):
    """A store that counts the jobs it hands out: what a round reads."""

    def __init__(self) -> None:
        super().__init__()
        self.read = 0

    def list(self, states: Collection[JobState] | None = None, user: str | None = None) -> builtins.list[Job]:
        jobs = super().list(states, user)
        self.read += len(jobs)
        return jobs

    def query(self, query: JobQuery) -> builtins.list[Job]:
        jobs = super().query(query)
        self.read += len(jobs)
        return jobs


def test_the_first_round_after_a_restart_does_not_read_the_history(tmp_path: Path) -> None:
    """The job definitions' controller looks for tasks of runs in flight at its first round: without such a run it
    reads no job (it read every job of the store, 100,000 ended ones in 13 s under the lock); with one, only those
    submitted since that run was made, and it still follows that run's task."""
    store = Counting()
    history(store, ended=2000, failed_with_retries=0)
    world = World(tmp_path, store=store)
    store.read = 0
    world.tick()
    assert store.read <= 10  # the round's own reads of what waits and runs: none of the 2,000 ended jobs
    c = world.client(ALICE)
    assert c.post("/metronome/v1/jobs", json=metronome_job("nightly")).status_code == 201
    run = c.post("/metronome/v1/jobs/nightly/runs").json()
    world.tick()
    (task,) = world.jobs("metronome:")
    again = world.restarted()  # a restart with that run in flight
    store.read = 0
    again.tick()
    assert store.read < 100
    run = again.client(ALICE).get(f"/metronome/v1/jobs/nightly/runs/{run['id']}").json()
    assert run["status"] == "ACTIVE" and [t["id"] for t in run["tasks"]] == [task.id]
    again.finish(task.id, 0)
    assert again.client(ALICE).get(f"/metronome/v1/jobs/nightly/runs/{run['id']}").json()["status"] == "SUCCESS"
