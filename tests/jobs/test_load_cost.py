"""A daemon's start does not read its whole history for job definitions it does not have: with no run of a
definition left to complete, the jobs controller's first round reads no stored job (a month of ended jobs took
it 60-100 s, under the daemon's lock: BENCHMARKS.md, `corral acct` over a month of history)."""

from __future__ import annotations

import builtins
from collections.abc import Collection
from pathlib import Path

from corral.jobs.model import Job, JobSpec, JobState
from corral.model.resources import Request
from corral.store import JobQuery, MemoryStore
from tests.jobs.harness import World, metronome_job


class CountingStore(MemoryStore):
    """A MemoryStore that counts reads of the whole history (a listing of every job, no state given) and of the jobs
    since a time (queries with `since`)."""

    def __init__(self) -> None:
        super().__init__()
        self.everything = 0
        self.recent = 0

    def list(self, states: Collection[JobState] | None = None, user: str | None = None) -> list[Job]:
        if states is None:
            self.everything += 1
        return super().list(states, user)

    def query(self, query: JobQuery) -> builtins.list[Job]:
        if query.since is not None:
            self.recent += 1
        return super().query(query)


def test_a_start_without_runs_to_complete_reads_no_stored_job(tmp_path: Path) -> None:
    store = CountingStore()
    for i in range(5):
        job = store.add(JobSpec(("true",), Request(cpu_milli=100), "alice", 1000, 1000), now=float(i))
        store.transition(job.id, JobState.CANCELLED)
    world = World(tmp_path, store=store)
    world.tick()
    world.tick()
    assert store.everything == 0


def test_a_run_left_to_complete_still_finds_its_tasks(tmp_path: Path) -> None:
    """The other side: with a run of a definition not finished, the first round still looks for its tasks (the
    metronome tests hold what it does with them)."""
    store = CountingStore()
    world = World(tmp_path, store=store)
    assert world.client().post("/metronome/v1/jobs", json=metronome_job()).status_code == 201
    assert world.client().post("/metronome/v1/jobs/nightly/runs").status_code == 201
    again = world.restarted()
    again.tick()
    assert store.recent >= 1  # the jobs since the run was made, not the whole history
    assert store.everything == 0
