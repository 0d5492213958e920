"""A job store in memory, for tests and `corral serve --no-state`: the same contract as SQLite, nothing on disk."""

from __future__ import annotations

import builtins
import threading
from collections.abc import Collection, Mapping
from typing import Any

from corral.jobs.model import Job, JobSpec, JobState, spec_from_json, spec_to_json
from corral.store.base import JobNotFound, StaleJob, StoreError, check_fields, check_transition


class MemoryStore:
    """Jobs in a dict guarded by one lock. Ids are never reused (a counter, not the dict's size)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}  # insertion order is id order
        self._last_id = 0
        self._closed = False

    def add(self, spec: JobSpec, now: float) -> Job:
        # A copy through JSON, as SQLite stores it: the caller's dicts (env, labels) cannot change the stored job, and
        # a spec that SQLite could not store fails here too.
        stored = spec_from_json(spec_to_json(spec))
        with self._lock:
            self._check_open()
            self._last_id += 1
            job = Job(str(self._last_id), stored, JobState.QUEUED, submitted_at=float(now), version=1)
            self._jobs[job.id] = job
            return job

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            self._check_open()
            return self._jobs.get(job_id)

    def list(self, states: Collection[JobState] | None = None, user: str | None = None) -> builtins.list[Job]:
        wanted = None if states is None else frozenset(states)
        with self._lock:
            self._check_open()
            return [
                job
                for job in self._jobs.values()
                if (wanted is None or job.state in wanted) and (user is None or job.spec.user == user)
            ]

    def transition(
        self, job_id: str, to: JobState, *, expect: Collection[JobState] | None = None, **fields: Any
    ) -> Job:
        to = JobState(to)
        changes = check_fields(fields)
        with self._lock:
            job = self._get(job_id)
            check_transition(job, to, expect)
            new = job.evolve(state=to, version=job.version + 1, **changes)
            self._jobs[job_id] = new
            return new

    def update(self, job_id: str, *, expect_version: int | None = None, **fields: Any) -> Job:
        changes = check_fields(fields)
        with self._lock:
            job = self._get(job_id)
            if expect_version is not None and job.version != expect_version:
                raise StaleJob(job_id, expect_version, job.version)
            new = job.evolve(version=job.version + 1, **changes)
            self._jobs[job_id] = new
            return new

    def update_many(self, changes: Mapping[str, Mapping[str, Any]]) -> builtins.list[Job]:
        checked = {job_id: check_fields(fields) for job_id, fields in changes.items()}
        with self._lock:
            jobs = [self._get(job_id) for job_id in checked]  # all or nothing: every id is checked first
            out = [job.evolve(version=job.version + 1, **checked[job.id]) for job in jobs]
            for new in out:
                self._jobs[new.id] = new
            return out

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _get(self, job_id: str) -> Job:
        self._check_open()
        job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the job store is closed")
