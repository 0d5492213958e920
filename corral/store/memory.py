"""A job store in memory, for tests and `corral serve --no-state`: the same contract as SQLite, nothing on disk."""

from __future__ import annotations

import builtins
import json
import threading
from collections.abc import Collection, Mapping
from typing import Any

from corral.jobs.model import FINAL_STATES, Job, JobSpec, JobState, check_admissible, spec_from_json, spec_to_json
from corral.store.acct import AcctColumns, AcctQuery, AcctRecord, SummaryRow, record_of, summarize
from corral.store.base import (
    IDEMPOTENCY_TTL_S,
    JobNotFound,
    JobQuery,
    KeyInUse,
    StaleJob,
    StoreError,
    array_jobs,
    check_doc,
    check_doc_version,
    check_fields,
    check_transition,
    may_transition,
)


class MemoryStore:
    """Jobs in a dict guarded by one lock. Ids are never reused (a counter, not the dict's size)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}  # insertion order is id order
        self._last_id = 0
        self._closed = False
        self._docs: dict[tuple[str, str], tuple[str, int]] = {}  # (kind, key) -> (JSON text, version)
        self._keys: dict[tuple[int, str], tuple[str, float]] = {}  # (uid, idempotency key) -> (job id, when)

    def add(self, spec: JobSpec, now: float, *, idempotency_key: str | None = None) -> Job:
        check_admissible(spec)
        # A copy through JSON, as SQLite stores it: the caller's dicts (env, labels) cannot change the stored job, and
        # a spec that SQLite could not store fails here too.
        stored = spec_from_json(spec_to_json(spec))
        with self._lock:
            self._check_open()
            if idempotency_key is not None:
                earlier = self._keyed(spec.uid, idempotency_key, now)
                if earlier is not None:
                    raise KeyInUse(idempotency_key, earlier)
            self._last_id += 1
            job = Job(str(self._last_id), stored, JobState.QUEUED, submitted_at=float(now), version=1)
            self._jobs[job.id] = job
            if idempotency_key is not None:
                self._keys[(spec.uid, idempotency_key)] = (job.id, float(now))
            return job

    def add_array(self, spec: JobSpec, now: float, *, idempotency_key: str | None = None) -> builtins.list[Job]:
        check_admissible(spec)
        stored = spec_from_json(spec_to_json(spec))
        with self._lock:
            self._check_open()
            if idempotency_key is not None:
                earlier = self._keyed(spec.uid, idempotency_key, now)
                if earlier is not None:
                    raise KeyInUse(idempotency_key, earlier)
            first = self._last_id + 1
            jobs = array_jobs(stored, first, now)
            self._last_id += len(jobs)
            self._jobs.update((job.id, job) for job in jobs)
            if idempotency_key is not None:
                self._keys[(spec.uid, idempotency_key)] = (jobs[0].id, float(now))
            return jobs

    def by_idempotency_key(self, uid: int, key: str, now: float) -> Job | None:
        with self._lock:
            self._check_open()
            return self._keyed(uid, key, now)

    def _keyed(self, uid: int, key: str, now: float) -> Job | None:
        found = self._keys.get((uid, key))
        if found is None or now - found[1] >= IDEMPOTENCY_TTL_S:
            return None
        return self._jobs.get(found[0])

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

    def query(self, query: JobQuery) -> builtins.list[Job]:
        with self._lock:
            self._check_open()
            jobs = builtins.list(self._jobs.values())
        if query.newest_first:
            jobs.reverse()
        found = (job for job in jobs if query.matches(job))
        if query.limit is None:
            return builtins.list(found)
        return [job for _, job in zip(range(query.limit), found, strict=False)]

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

    def transition_many(
        self, job_ids: Collection[str], to: JobState, *, expect: Collection[JobState] | None = None, **fields: Any
    ) -> builtins.list[Job]:
        to = JobState(to)
        changes = check_fields(fields)
        out = []
        with self._lock:
            self._check_open()
            for job_id in sorted(set(job_ids), key=_id_order):
                job = self._jobs.get(job_id)
                if job is None or not may_transition(job, to, expect):
                    continue
                new = job.evolve(state=to, version=job.version + 1, **changes)
                self._jobs[job_id] = new
                out.append(new)
        return out

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

    def acct(self, query: AcctQuery) -> builtins.list[AcctRecord]:
        found = sorted(self._records(query), key=lambda r: (r.ended_at, int(r.id)))
        return found if query.limit is None else found[: query.limit]

    def acct_columns(self, query: AcctQuery) -> AcctColumns:
        return AcctColumns.of(self.acct(query))

    def acct_summary(self, query: AcctQuery) -> builtins.list[SummaryRow]:
        return summarize(self._records(query))

    def _records(self, query: AcctQuery) -> builtins.list[AcctRecord]:
        with self._lock:
            self._check_open()
            ended = [job for job in self._jobs.values() if job.state in FINAL_STATES]
        return [r for r in map(record_of, ended) if query.matches(r)]

    def prune_ended(self, before: float, limit: int) -> int:
        with self._lock:
            self._check_open()
            old = sorted(
                (r.ended_at, int(r.id))
                for job in self._jobs.values()
                if job.state in FINAL_STATES and (r := record_of(job)).ended_at < before
            )[:limit]
            for _, job_id in old:
                del self._jobs[str(job_id)]
            gone = {str(job_id) for _, job_id in old}
            self._keys = {k: v for k, v in self._keys.items() if v[0] not in gone}
        return len(old)

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def put_doc(self, kind: str, key: str, body: Mapping[str, Any], *, expect_version: int | None = None) -> int:
        text = check_doc(kind, key, body)
        with self._lock:
            self._check_open()
            current = self._docs.get((kind, key))
            version = 0 if current is None else current[1]
            check_doc_version(kind, key, expect_version, version)
            self._docs[(kind, key)] = (text, version + 1)
            return version + 1

    def get_doc(self, kind: str, key: str) -> tuple[dict[str, Any], int] | None:
        with self._lock:
            self._check_open()
            current = self._docs.get((kind, key))
        return None if current is None else (json.loads(current[0]), current[1])

    def list_docs(self, kind: str) -> builtins.list[tuple[str, dict[str, Any], int]]:
        with self._lock:
            self._check_open()
            found = sorted((k, v) for (d, k), v in self._docs.items() if d == kind)
        return [(key, json.loads(text), version) for key, (text, version) in found]

    def delete_doc(self, kind: str, key: str, *, expect_version: int | None = None) -> bool:
        with self._lock:
            self._check_open()
            current = self._docs.get((kind, key))
            version = 0 if current is None else current[1]
            check_doc_version(kind, key, expect_version, version)
            return self._docs.pop((kind, key), None) is not None

    def _get(self, job_id: str) -> Job:
        self._check_open()
        job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the job store is closed")


def _id_order(job_id: str) -> tuple[int, str]:
    return (int(job_id), job_id) if job_id.isascii() and job_id.isdigit() else (0, job_id)
