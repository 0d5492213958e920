"""The job store of `corral serve`: one SQLite file, written so that a kill -9 (or a power cut) loses nothing acked.

    jobs(id INTEGER PRIMARY KEY AUTOINCREMENT, spec TEXT (spec_to_json), user, state, submitted_at, attempts,
         not_before, started_at, finished_at, exit_code, pid, pid_start_time, gpus TEXT ([[index, milli, MiB]]),
         gpu_uuids TEXT ([uuid]), reason, version)
    meta(key TEXT PRIMARY KEY, value TEXT)   -- schema_version
    docs(kind, key, body TEXT (JSON), version)  -- named documents beside the jobs (schema 2; a schema-1 file gains
                                                  the table when opened)
    idempotency(uid, key, job_id, created_at)   -- Idempotency-Key -> job, written in the job's own transaction
                                                  (schema 3; older files gain the table when opened)
    acct(ended_at, job_id, uid, user, queue, name, state, exit_code, submitted_at, started_at, elapsed, gpu_milli,
         gpu_ids, cpu_milli, gpu_util, gpu_mem_peak, gpu_samples, simulated)
                                                -- one row per job that ended (corral.store.acct), written with the
                                                  job's end; clustered by (ended_at, job_id), so a window of time is
                                                  one range of the table (added within schema 3: a file that lacks
                                                  it gains it, filled from its ended jobs, when opened)
    arrays(id, spec TEXT)                       -- a job array's spec, once (its first task's, spec_to_json); each
                                                  task's row holds a stub, {"array": [ID, TASK], "name", "uid"}
                                                  (corral.jobs.array; files gain the table when opened)

Why these settings:
- WAL journal + `synchronous=FULL`: a commit is fsynced to the WAL before `add`/`transition`/`update` return, so an
  acknowledged write survives the process being killed at any point, and the OS crashing too. Readers never block
  the writer.
- `BEGIN IMMEDIATE` for every write: the write lock is taken before the row is read, so the compare-and-set of
  `transition`/`update` cannot interleave with another writer (another thread, or another process on the file).
- `AUTOINCREMENT`: ids are never reused, also across reopen.
- One connection shared by the daemon's threads (`check_same_thread=False`), serialised by a lock: SQLite
  connections are not safe for concurrent use, and the daemon writes far below what one connection can do.
- Every `sqlite3.Error` becomes a `StoreError` naming the file (the API turns it into a 503, never a traceback).
- Jobs that are not finished (queued, starting, running) are also kept decoded in memory, because the scheduler reads
  all of them every round (10,000 queued jobs: 170 ms to read and decode from SQLite, ~2 ms from memory). Writes
  through this store update that copy; a commit by any other connection changes SQLite's `PRAGMA data_version`, and
  the next read then reloads it, so the copy is never stale.
- Indexes on state, user, submission time and, as expressions over the spec, uid and name: `query` (the API's
  filtered, paged lists) reads only the rows of one page, whatever the table holds (20,000 queued jobs: a page of 100
  in about 3 ms through the API). They are created when a file is opened, so older files gain them too.
- Accounting reads `acct` alone, never a job's JSON: its rows are narrow and kept in end-time order (WITHOUT
  ROWID), with indexes by uid, user and state, each then by end time. A month of history (1,000,000 ended jobs)
  answers a user's or a state's window in milliseconds and sums a whole month per user and queue in well under a
  second (benchmarks/acct_history.py, BENCHMARKS.md).
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import math
import sqlite3
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from corral.jobs.array import task_spec
from corral.jobs.model import (
    FINAL_STATES,
    Change,
    Job,
    JobSpec,
    JobState,
    Preempted,
    check_admissible,
    loads,
    spec_from_json,
    spec_to_json,
)
from corral.jobs.usage import Usage
from corral.model.resources import GpuGrant
from corral.store.acct import AcctColumns, AcctQuery, AcctRecord, SummaryRow, record_of
from corral.store.base import (
    IDEMPOTENCY_TTL_S,
    JobNotFound,
    JobQuery,
    KeyInUse,
    StaleJob,
    StoreError,
    array_jobs,
    canonical_id,
    check_doc,
    check_doc_version,
    check_fields,
    check_transition,
    may_transition,
)

SCHEMA_VERSION = 3
#: How a task's stub spec starts (keys sorted: "array" first; a full spec with an array has `{"array": {`).
_STUB = '{"array": ['
#: States whose jobs are kept in memory as well (everything the scheduler reads each round).
ACTIVE = frozenset({JobState.QUEUED, JobState.STARTING, JobState.RUNNING})
#: How long a write waits for another process that holds the file's write lock before it fails.
BUSY_TIMEOUT_S = 10.0

#: The submitter's uid and the job's name, read from the spec: `query` filters on them through indexes on these very
#: expressions (SQLite uses an expression index only for the same expression). `json_valid` first, so that a row whose
#: spec is damaged is still written and read (as a StoreError naming the job) instead of failing every write.
_UID = "(CASE WHEN json_valid(spec) THEN json_extract(spec, '$.uid') END)"
_NAME = "(CASE WHEN json_valid(spec) THEN json_extract(spec, '$.name') END)"

#: The hour a record ended in (hours since the epoch), the key of `acct_hours`: the summary reads whole hours there.
_HOUR = "CAST({row}.ended_at / 3600 AS INTEGER)"

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    spec           TEXT    NOT NULL,
    user           TEXT    NOT NULL,
    state          TEXT    NOT NULL,
    submitted_at   REAL    NOT NULL,
    attempts       INTEGER NOT NULL DEFAULT 0,
    not_before     REAL    NOT NULL DEFAULT 0,
    started_at     REAL,
    finished_at    REAL,
    exit_code      INTEGER,
    pid            INTEGER,
    pid_start_time INTEGER,
    gpus           TEXT    NOT NULL DEFAULT '[]',
    gpu_uuids      TEXT    NOT NULL DEFAULT '[]',
    reason         TEXT    NOT NULL DEFAULT '',
    version        INTEGER NOT NULL,
    preempted      TEXT
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state);
CREATE INDEX IF NOT EXISTS jobs_user ON jobs (user);
CREATE INDEX IF NOT EXISTS jobs_uid ON jobs ({_UID});
CREATE INDEX IF NOT EXISTS jobs_name ON jobs ({_NAME});
CREATE INDEX IF NOT EXISTS jobs_submitted ON jobs (submitted_at);
CREATE TABLE IF NOT EXISTS docs (
    kind    TEXT    NOT NULL,
    key     TEXT    NOT NULL,
    body    TEXT    NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (kind, key)
);
CREATE TABLE IF NOT EXISTS idempotency (
    uid        INTEGER NOT NULL,
    key        TEXT    NOT NULL,
    job_id     INTEGER NOT NULL,
    created_at REAL    NOT NULL,
    PRIMARY KEY (uid, key)
);
CREATE INDEX IF NOT EXISTS idempotency_created ON idempotency (created_at);
CREATE TABLE IF NOT EXISTS acct (
    ended_at     REAL    NOT NULL,
    job_id       INTEGER NOT NULL,
    uid          INTEGER NOT NULL,
    user         TEXT    NOT NULL,
    queue        TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    state        TEXT    NOT NULL,
    exit_code    INTEGER,
    submitted_at REAL    NOT NULL,
    started_at   REAL,
    elapsed      REAL    NOT NULL,
    gpu_milli    INTEGER NOT NULL,
    gpu_ids      TEXT    NOT NULL,
    cpu_milli    INTEGER NOT NULL,
    gpu_util     REAL,
    gpu_mem_peak INTEGER,
    gpu_samples  INTEGER NOT NULL,
    simulated    INTEGER NOT NULL,
    PRIMARY KEY (ended_at, job_id)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS acct_job ON acct (job_id);
CREATE INDEX IF NOT EXISTS acct_uid ON acct (uid, ended_at);
CREATE INDEX IF NOT EXISTS acct_user ON acct (user, ended_at);
CREATE INDEX IF NOT EXISTS acct_state ON acct (state, ended_at);
CREATE TABLE IF NOT EXISTS acct_hours (
    hour        INTEGER NOT NULL,
    user        TEXT    NOT NULL,
    queue       TEXT    NOT NULL,
    state       TEXT    NOT NULL,
    uid         INTEGER NOT NULL,
    jobs        INTEGER NOT NULL,
    elapsed     REAL    NOT NULL,
    gpu_ms      REAL    NOT NULL,
    cpu_ms      REAL    NOT NULL,
    util_ms     REAL    NOT NULL,
    util_weight REAL    NOT NULL,
    simulated   INTEGER NOT NULL,
    PRIMARY KEY (hour, user, queue, state, uid)
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS acct_added AFTER INSERT ON acct BEGIN
    INSERT INTO acct_hours (hour, user, queue, state, uid, jobs, elapsed, gpu_ms, cpu_ms, util_ms, util_weight,
                            simulated)
    VALUES ({_HOUR.format(row="NEW")}, NEW.user, NEW.queue, NEW.state, NEW.uid, 1, NEW.elapsed,
            NEW.elapsed * NEW.gpu_milli, NEW.elapsed * NEW.cpu_milli,
            COALESCE(NEW.elapsed * NEW.gpu_milli * NEW.gpu_util, 0.0),
            CASE WHEN NEW.gpu_util IS NULL THEN 0.0 ELSE NEW.elapsed * NEW.gpu_milli END, NEW.simulated)
    ON CONFLICT (hour, user, queue, state, uid) DO UPDATE SET
        jobs = jobs + 1, elapsed = elapsed + excluded.elapsed, gpu_ms = gpu_ms + excluded.gpu_ms,
        cpu_ms = cpu_ms + excluded.cpu_ms, util_ms = util_ms + excluded.util_ms,
        util_weight = util_weight + excluded.util_weight, simulated = simulated + excluded.simulated;
END;
CREATE TRIGGER IF NOT EXISTS acct_removed AFTER DELETE ON acct BEGIN
    UPDATE acct_hours SET
        jobs = jobs - 1, elapsed = elapsed - OLD.elapsed, gpu_ms = gpu_ms - OLD.elapsed * OLD.gpu_milli,
        cpu_ms = cpu_ms - OLD.elapsed * OLD.cpu_milli,
        util_ms = util_ms - COALESCE(OLD.elapsed * OLD.gpu_milli * OLD.gpu_util, 0.0),
        util_weight = util_weight - CASE WHEN OLD.gpu_util IS NULL THEN 0.0 ELSE OLD.elapsed * OLD.gpu_milli END,
        simulated = simulated - OLD.simulated
    WHERE hour = {_HOUR.format(row="OLD")} AND user = OLD.user AND queue = OLD.queue AND state = OLD.state
      AND uid = OLD.uid;
    DELETE FROM acct_hours
    WHERE hour = {_HOUR.format(row="OLD")} AND user = OLD.user AND queue = OLD.queue AND state = OLD.state
      AND uid = OLD.uid AND jobs <= 0;
END;
CREATE TABLE IF NOT EXISTS arrays (
    id   INTEGER PRIMARY KEY,
    spec TEXT    NOT NULL
);
"""

_ACCT_COLUMNS = (
    "ended_at",
    "job_id",
    "uid",
    "user",
    "queue",
    "name",
    "state",
    "exit_code",
    "submitted_at",
    "started_at",
    "elapsed",
    "gpu_milli",
    "gpu_ids",
    "cpu_milli",
    "gpu_util",
    "gpu_mem_peak",
    "gpu_samples",
    "simulated",
)
_ACCT_PUT = f"INSERT INTO acct ({', '.join(_ACCT_COLUMNS)}) VALUES ({', '.join('?' * len(_ACCT_COLUMNS))})"
_FINAL_VALUES = sorted(s.value for s in FINAL_STATES)
_FINAL_SQL = ", ".join(f"'{v}'" for v in _FINAL_VALUES)  # the states' own words, never a caller's
#: `acct_hours` from the records (a file whose records were written before the hours' sums existed).
_HOURS_REBUILD = f"""
INSERT INTO acct_hours (hour, user, queue, state, uid, jobs, elapsed, gpu_ms, cpu_ms, util_ms, util_weight, simulated)
SELECT {_HOUR.format(row="acct")}, user, queue, state, uid, COUNT(*), SUM(elapsed), SUM(elapsed * gpu_milli),
       SUM(elapsed * cpu_milli), COALESCE(SUM(elapsed * gpu_milli * gpu_util), 0.0),
       COALESCE(SUM(CASE WHEN gpu_util IS NULL THEN NULL ELSE elapsed * gpu_milli END), 0.0), SUM(simulated)
FROM acct GROUP BY 1, 2, 3, 4, 5
"""
#: A file written before accounting existed: a record for each job that ended (the JSON read in SQL, so a store of
#: a million jobs gains its records in seconds, once). Its GPU use was never measured: no figures.
_ACCT_BACKFILL = f"""
INSERT INTO acct ({", ".join(_ACCT_COLUMNS)})
SELECT COALESCE(finished_at, submitted_at), id, json_extract(spec, '$.uid'), user,
       COALESCE(json_extract(spec, '$.queue'), ''), COALESCE(json_extract(spec, '$.name'), ''), state, exit_code,
       submitted_at, started_at,
       CASE WHEN started_at IS NULL THEN 0.0 ELSE MAX(0.0, COALESCE(finished_at, submitted_at) - started_at) END,
       CASE WHEN gpus = '[]'
            THEN json_extract(spec, '$.request.gpu_count') * json_extract(spec, '$.request.gpu_milli')
                 * COALESCE(json_extract(spec, '$.instances'), 1)
            ELSE (SELECT COALESCE(SUM(json_extract(value, '$[1]')), 0) FROM json_each(jobs.gpus)) END,
       (SELECT json_group_array(json_extract(value, '$[0]')) FROM json_each(jobs.gpus)),
       json_extract(spec, '$.request.cpu_milli') * COALESCE(json_extract(spec, '$.instances'), 1),
       NULL, NULL, 0, 0
FROM jobs WHERE state IN ({_FINAL_SQL}) AND json_valid(spec) AND json_valid(gpus)
"""

_COLUMNS = (
    "id",
    "spec",
    "state",
    "submitted_at",
    "attempts",
    "not_before",
    "started_at",
    "finished_at",
    "exit_code",
    "pid",
    "pid_start_time",
    "gpus",
    "gpu_uuids",
    "reason",
    "version",
    "preempted",
    "usage",
)
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM jobs"
#: Ids per `WHERE id IN (...)` read of a listing's jobs not in the memory copy (SQLite's limit on parameters: 32,766).
_IDS_PER_READ = 500


class SqliteStore:
    """Jobs in an SQLite file. Opening creates the file (not its folder) and checks that it is a corral job store."""

    def __init__(self, path: Path, *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.path = Path(path)
        self._busy_timeout_ms = max(0, round(busy_timeout_s * 1000))
        # Re-entrant: decoding an array's task may read its array's spec while a read or write holds the lock.
        self._lock = threading.RLock()
        self._closed = False
        self._templates: dict[int, JobSpec] = {}  # arrays' specs by array id, decoded (immutable once stored)
        self._active: dict[int, Job] = {}  # unfinished jobs by row id, decoded
        self._data_version: int | None = None  # SQLite's data_version when `_active` was loaded
        #: Accounting reads (a page of 10,000 records, a month's summary: up to a few hundred milliseconds) go
        #: through a connection of their own: under WAL they never wait for the daemon's writes, nor hold them up.
        self._acct_lock = threading.Lock()
        self._acct_conn: sqlite3.Connection | None = None
        try:
            self._conn = sqlite3.connect(
                self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise self._error("cannot open it", exc) from exc
        try:
            self._open()
        except BaseException:
            self._conn.close()
            raise

    # ----------------------------------------------------------------------------------------------------- API
    def add(self, spec: JobSpec, now: float, *, idempotency_key: str | None = None) -> Job:
        check_admissible(spec)
        spec_text = spec_to_json(spec)
        earlier: Job | None = None
        with self._write("adding a job"):
            if idempotency_key is not None:
                earlier = self._keyed(spec.uid, idempotency_key, now)
            if earlier is None:
                cursor = self._conn.execute(
                    "INSERT INTO jobs (spec, user, state, submitted_at, version) VALUES (?, ?, ?, ?, 1)",
                    (spec_text, spec.user, JobState.QUEUED.value, float(now)),
                )
                row_id = cursor.lastrowid
                assert row_id is not None
                job = Job(str(row_id), spec_from_json(spec_text), JobState.QUEUED, submitted_at=float(now), version=1)
                if idempotency_key is not None:
                    # The key goes in with the job (one transaction): a crash keeps both or neither. Expired keys
                    # are dropped on the way, so the table holds about a day of keyed submissions.
                    self._conn.execute("DELETE FROM idempotency WHERE created_at <= ?", (now - IDEMPOTENCY_TTL_S,))
                    self._conn.execute(
                        "INSERT OR REPLACE INTO idempotency (uid, key, job_id, created_at) VALUES (?, ?, ?, ?)",
                        (spec.uid, idempotency_key, row_id, float(now)),
                    )
                self._active[row_id] = job
        # Raised after the (empty) transaction committed: a rollback would make the next read reload every job.
        if earlier is not None:
            assert idempotency_key is not None
            raise KeyInUse(idempotency_key, earlier)
        return job

    def add_array(self, spec: JobSpec, now: float, *, idempotency_key: str | None = None) -> builtins.list[Job]:
        check_admissible(spec)
        if spec.array is None:
            raise ValueError("add_array needs a spec with an array")
        earlier: Job | None = None
        jobs: builtins.list[Job] = []
        with self._write("adding a job array"):
            if idempotency_key is not None:
                earlier = self._keyed(spec.uid, idempotency_key, now)
            if earlier is None:
                # Ids given explicitly, consecutive from the next AUTOINCREMENT would give (the write lock is held):
                # a task's id is the array's id plus its index, with no look-up.
                first = 1 + int(
                    self._conn.execute(
                        "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'jobs'), 0), "
                        "COALESCE((SELECT MAX(id) FROM jobs), 0))"
                    ).fetchone()[0]
                )
                text = spec_to_json(dataclasses.replace(spec, array=dataclasses.replace(spec.array, job_id=str(first))))
                template = spec_from_json(text)
                self._conn.execute("INSERT INTO arrays (id, spec) VALUES (?, ?)", (first, text))
                jobs = array_jobs(template, first, now)
                # The name and uid stay in each row: `query` filters on them through its indexes on the spec.
                name, uid, user, state = json.dumps(spec.name), spec.uid, spec.user, JobState.QUEUED.value
                self._conn.executemany(
                    "INSERT INTO jobs (id, spec, user, state, submitted_at, version) VALUES (?, ?, ?, ?, ?, 1)",
                    [
                        (first + i, f'{_STUB}{first}, {task}], "name": {name}, "uid": {uid}}}', user, state, now)
                        for i, task in enumerate(spec.array.spec.tasks)
                    ],
                )
                if idempotency_key is not None:
                    self._conn.execute("DELETE FROM idempotency WHERE created_at <= ?", (now - IDEMPOTENCY_TTL_S,))
                    self._conn.execute(
                        "INSERT OR REPLACE INTO idempotency (uid, key, job_id, created_at) VALUES (?, ?, ?, ?)",
                        (spec.uid, idempotency_key, first, float(now)),
                    )
                self._templates[first] = template
                self._active.update((int(job.id), job) for job in jobs)
        if earlier is not None:
            assert idempotency_key is not None
            raise KeyInUse(idempotency_key, earlier)
        return jobs

    def by_idempotency_key(self, uid: int, key: str, now: float) -> Job | None:
        with self._read("looking up an idempotency key"):
            return self._keyed(uid, key, now)

    def _keyed(self, uid: int, key: str, now: float) -> Job | None:
        """Inside `_read` or `_write`: the job stored under (uid, key) within the TTL."""
        row = self._conn.execute(
            "SELECT job_id, created_at FROM idempotency WHERE uid = ? AND key = ?", (uid, key)
        ).fetchone()
        if row is None or now - float(row[1]) >= IDEMPOTENCY_TTL_S:
            return None
        return self._get_for_write(str(row[0]))

    def get(self, job_id: str) -> Job | None:
        row_id = canonical_id(job_id)
        if row_id is None:
            return None
        with self._read(f"reading job {job_id}"):
            self._sync()
            cached = self._active.get(row_id)
            if cached is not None:
                return cached
            row = self._conn.execute(f"{_SELECT} WHERE id = ?", (row_id,)).fetchone()
        return None if row is None else self._decode(row)

    def list(self, states: Collection[JobState] | None = None, user: str | None = None) -> builtins.list[Job]:
        wanted = None if states is None else frozenset(JobState(s) for s in states)
        if wanted is not None and wanted <= ACTIVE:
            with self._read("listing jobs"):
                self._sync()
                # Sorting the int row ids (not jobs by a key function) keeps this cheap for a long queue.
                active = self._active
                return [
                    job
                    for row_id in sorted(active)
                    if (job := active[row_id]).state in wanted and (user is None or job.spec.user == user)
                ]
        where: builtins.list[str] = []
        params: builtins.list[Any] = []
        if states is not None:
            values = sorted({JobState(s).value for s in states})
            if not values:
                return []
            where.append(f"state IN ({', '.join('?' * len(values))})")
            params.extend(values)
        if user is not None:
            where.append("user = ?")
            params.append(user)
        sql = _SELECT + (f" WHERE {' AND '.join(where)}" if where else "") + " ORDER BY id"
        with self._read("listing jobs"):
            rows = self._conn.execute(sql, params).fetchall()
        return [self._decode(row) for row in rows]

    def query(self, query: JobQuery) -> builtins.list[Job]:
        # Each filter is a condition SQLite answers from an index (state, user, uid, name, submitted_at; ids are the
        # rowid), and only the page's rows are read: jobs still active come from the memory copy, others are decoded.
        where: builtins.list[str] = []
        params: builtins.list[Any] = []
        if query.states is not None:
            if not query.states:
                return []
            values = sorted(s.value for s in query.states)
            where.append(f"state IN ({', '.join('?' * len(values))})")
            params.extend(values)
        for column, value in (("user", query.user), (_UID, query.uid), (_NAME, query.name)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if query.since is not None:
            where.append("submitted_at >= ?")
            params.append(float(query.since))
        if query.ended_after is not None:
            final = sorted(s.value for s in FINAL_STATES)
            where.append(f"(state NOT IN ({', '.join('?' * len(final))}) OR COALESCE(finished_at, submitted_at) >= ?)")
            params.extend([*final, float(query.ended_after)])
        if query.after is not None:
            cursor = canonical_id(query.after)
            if cursor is None:
                return []
            where.append("id < ?" if query.newest_first else "id > ?")
            params.append(cursor)
        sql = "SELECT id FROM jobs" + (f" WHERE {' AND '.join(where)}" if where else "")
        sql += " ORDER BY id DESC" if query.newest_first else " ORDER BY id"
        if query.limit is not None:
            sql += " LIMIT ?"
            params.append(query.limit)
        with self._read("listing jobs"):
            self._sync()
            # The page's ids first: its active jobs are in the memory copy, and only the others' rows (the spec, with
            # its environment: kilobytes a job) are read and decoded. 5,000 waiting jobs: 3 ms, not 13.
            ids = [row[0] for row in self._conn.execute(sql, params)]
            active = self._active
            missing = [i for i in ids if i not in active]
            decoded: dict[int, Job] = {}
            for at in range(0, len(missing), _IDS_PER_READ):
                chunk = missing[at : at + _IDS_PER_READ]
                for row in self._conn.execute(f"{_SELECT} WHERE id IN ({', '.join('?' * len(chunk))})", chunk):
                    decoded[row[0]] = self._decode(row)
            return [job for i in ids if (job := active.get(i) or decoded.get(i)) is not None]

    def transition(
        self, job_id: str, to: JobState, *, expect: Collection[JobState] | None = None, **fields: Any
    ) -> Job:
        to = JobState(to)
        changes = check_fields(fields)
        with self._write(f"changing job {job_id}"):
            job = self._get_for_write(job_id)
            check_transition(job, to, expect)
            new = job.evolve(state=to, version=job.version + 1, **changes)
            self._store(new, {"state": to.value, **changes}, was=job.state)
        return new

    def transition_many(
        self, job_ids: Collection[str], to: JobState, *, expect: Collection[JobState] | None = None, **fields: Any
    ) -> builtins.list[Job]:
        to = JobState(to)
        changes = check_fields(fields)
        rows = sorted({row_id for job_id in job_ids if (row_id := canonical_id(job_id)) is not None})
        out: builtins.list[Job] = []
        if not rows:
            return out
        columns = {"state": to.value, **{name: _encode(name, value) for name, value in changes.items()}}
        assignments = ", ".join(f"{name} = ?" for name in columns)  # names come from check_fields, never the caller
        with self._write(f"changing {len(rows)} jobs"):
            self._sync()
            missing = [row_id for row_id in rows if row_id not in self._active]
            found = {row_id: self._active[row_id] for row_id in rows if row_id in self._active}
            for chunk in range(0, len(missing), 500):  # SQLite's limit on parameters is far above 500
                part = missing[chunk : chunk + 500]
                sql = f"{_SELECT} WHERE id IN ({', '.join('?' * len(part))})"
                found.update((int(row[0]), self._decode(row)) for row in self._conn.execute(sql, part))
            moved = [
                job for row_id in rows if (job := found.get(row_id)) is not None and may_transition(job, to, expect)
            ]
            out = [job.evolve(state=to, version=job.version + 1, **changes) for job in moved]
            self._conn.executemany(
                f"UPDATE jobs SET {assignments}, version = ? WHERE id = ?",
                [(*columns.values(), new.version, int(new.id)) for new in out],
            )
            self._account([j for j in moved if j.state in FINAL_STATES], out)
            for new in out:  # the memory copy changes with the rows; `_write` drops it if the commit fails
                if new.state in ACTIVE:
                    self._active[int(new.id)] = new
                else:
                    self._active.pop(int(new.id), None)
        return out

    def update(self, job_id: str, *, expect_version: int | None = None, **fields: Any) -> Job:
        changes = check_fields(fields)
        with self._write(f"changing job {job_id}"):
            job = self._get_for_write(job_id)
            if expect_version is not None and job.version != expect_version:
                raise StaleJob(job_id, expect_version, job.version)
            new = job.evolve(version=job.version + 1, **changes)
            self._store(new, changes, was=job.state)
        return new

    def update_many(self, changes: Mapping[str, Mapping[str, Any]]) -> builtins.list[Job]:
        checked = {job_id: check_fields(fields) for job_id, fields in changes.items()}
        out = []
        with self._write(f"changing {len(checked)} jobs"):
            self._sync()  # once, not once a job (an array's 10,000 tasks held in one write)
            active = self._active
            for job_id, fields in checked.items():
                row_id = canonical_id(job_id)
                job = active.get(row_id) if row_id is not None else None
                job = job if job is not None else self._get_for_write(job_id)
                new = job.evolve(version=job.version + 1, **fields)
                self._store(new, fields, was=job.state)
                out.append(new)
        return out

    def _acct_rows(self, query: AcctQuery) -> builtins.list[Any]:
        """The acct table's rows the query selects, in end order (_ACCT_COLUMNS each)."""
        where, params = _acct_where(query)
        if where is None:
            return []
        sql = f"SELECT {', '.join(_ACCT_COLUMNS)} FROM acct{where} ORDER BY ended_at, job_id"
        if query.limit is not None:
            sql += " LIMIT ?"
            params.append(query.limit)
        with self._reading("reading the accounts") as conn:
            return conn.execute(sql, params).fetchall()

    def acct(self, query: AcctQuery) -> builtins.list[AcctRecord]:
        return [_acct_record(row) for row in self._acct_rows(query)]

    def acct_columns(self, query: AcctQuery) -> AcctColumns:
        rows = self._acct_rows(query)
        if not rows:
            return AcctColumns.of([])
        ended, job_id, uid, user, queue, name, state, code, submitted, started, elapsed, gpu_milli, ids, *rest = (
            builtins.list(column) for column in zip(*rows, strict=True)
        )
        cpu_milli, util, mem, samples, simulated = rest
        # a few distinct GPU sets (4 GPUs: at most 16), each parsed once
        parsed = {text: () if text == "[]" else tuple(int(i) for i in json.loads(text)) for text in set(ids)}
        return AcctColumns(
            builtins.list(map(str, job_id)), name, user, uid, queue, state, code, submitted, started, ended, elapsed,
            gpu_milli, [parsed[text] for text in ids], cpu_milli, util, mem, samples, [bool(s) for s in simulated],
        )  # fmt: skip

    def acct_summary(self, query: AcctQuery) -> builtins.list[SummaryRow]:
        # The whole hours of the window come from acct_hours (a row per hour, user, queue, state and uid: a month of
        # a million jobs is about 100,000 rows), the part-hours at its ends from acct itself. Which hour a record
        # is in is the one expression both use, so none is counted twice or missed.
        query = dataclasses.replace(query, after=None, limit=None)
        first = None if query.since is None else math.ceil(query.since / 3600)  # the first whole hour
        last = None if query.until is None else math.floor(query.until / 3600)  # the end of the last whole one
        parts: builtins.list[str] = []
        params: builtins.list[Any] = []
        records = (
            "SELECT user, queue, 1 AS jobs, elapsed, elapsed * gpu_milli AS gpu_ms, elapsed * cpu_milli AS cpu_ms,"
            " COALESCE(elapsed * gpu_milli * gpu_util, 0.0) AS util_ms,"
            " CASE WHEN gpu_util IS NULL THEN 0.0 ELSE elapsed * gpu_milli END AS util_weight, simulated FROM acct"
        )
        if first is not None and last is not None and first >= last:  # no whole hour: the records alone
            where, values = _acct_where(query)
            if where is None:
                return []
            parts.append(records + where)
            params += values
        else:
            hours, values = _acct_where(dataclasses.replace(query, since=None, until=None), hours=(first, last))
            if hours is None:
                return []
            parts.append(
                "SELECT user, queue, jobs, elapsed, gpu_ms, cpu_ms, util_ms, util_weight, simulated FROM acct_hours"
                + hours
            )
            params += values
            hour = _HOUR.format(row="acct")
            if first is not None:  # since .. the first whole hour
                edge = dataclasses.replace(query, until=first * 3600.0 + 3600)
                where, values = _acct_where(edge)
                parts.append(f"{records}{where} AND {hour} < ?")
                params += [*values, first]
            if last is not None:  # the end of the last whole hour .. until
                edge = dataclasses.replace(query, since=last * 3600.0 - 3600)
                where, values = _acct_where(edge)
                parts.append(f"{records}{where} AND {hour} >= ?")
                params += [*values, last]
        sql = (
            "SELECT user, queue, SUM(jobs), SUM(elapsed), SUM(gpu_ms), SUM(cpu_ms), SUM(util_ms), SUM(util_weight),"
            f" SUM(simulated) FROM ({' UNION ALL '.join(parts)}) GROUP BY user, queue ORDER BY user, queue"
        )
        with self._reading("summing the accounts") as conn:
            rows = conn.execute(sql, params).fetchall()
        return [
            SummaryRow(
                user=str(user),
                queue=str(queue),
                jobs=int(count),
                elapsed_s=float(elapsed),
                gpu_hours=float(gpu_ms) / 1000 / 3600,
                cpu_hours=float(cpu_ms) / 1000 / 3600,
                gpu_util_pct=float(util) / float(weight) if weight and weight > 0 else None,
                simulated=bool(simulated),
            )
            for user, queue, count, elapsed, gpu_ms, cpu_ms, util, weight, simulated in rows
        ]

    def prune_ended(self, before: float, limit: int) -> int:
        if limit <= 0:
            return 0
        with self._write("pruning ended jobs"):
            ids = [
                int(row[0])
                for row in self._conn.execute(
                    "SELECT job_id FROM acct WHERE ended_at < ? ORDER BY ended_at, job_id LIMIT ?",
                    (float(before), limit),
                )
            ]
            if ids:
                marks = ", ".join("?" * len(ids))
                self._conn.execute(f"DELETE FROM jobs WHERE id IN ({marks}) AND state IN ({_FINAL_SQL})", ids)
                self._conn.execute(f"DELETE FROM acct WHERE job_id IN ({marks})", ids)
                self._conn.execute(f"DELETE FROM idempotency WHERE job_id IN ({marks})", ids)
        return len(ids)

    def _account(self, had: Sequence[Job], jobs: Sequence[Job]) -> None:
        """Inside `_write`: the accounting records of `jobs` just written; `had`: those of them that had one (they
        were in a final state): it is deleted first (the trigger takes it out of the hours' sums), and written anew
        if the job is still in a final state (a retry leaves the accounts)."""
        if had:
            self._conn.executemany("DELETE FROM acct WHERE job_id = ?", [(int(job.id),) for job in had])
        ended = [job for job in jobs if job.state in FINAL_STATES]
        if ended:
            self._conn.executemany(_ACCT_PUT, [_acct_row(record_of(job)) for job in ended])

    def put_doc(self, kind: str, key: str, body: Mapping[str, Any], *, expect_version: int | None = None) -> int:
        text = check_doc(kind, key, body)
        with self._write(f"storing {kind} {key!r}"):
            row = self._conn.execute("SELECT version FROM docs WHERE kind = ? AND key = ?", (kind, key)).fetchone()
            version = 0 if row is None else int(row[0])
            check_doc_version(kind, key, expect_version, version)
            self._conn.execute(
                "INSERT INTO docs (kind, key, body, version) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (kind, key) DO UPDATE SET body = excluded.body, version = excluded.version",
                (kind, key, text, version + 1),
            )
        return version + 1

    def get_doc(self, kind: str, key: str) -> tuple[dict[str, Any], int] | None:
        with self._read(f"reading {kind} {key!r}"):
            row = self._conn.execute(
                "SELECT body, version FROM docs WHERE kind = ? AND key = ?", (kind, key)
            ).fetchone()
        return None if row is None else (self._doc_body(kind, key, row[0]), int(row[1]))

    def list_docs(self, kind: str) -> builtins.list[tuple[str, dict[str, Any], int]]:
        with self._read(f"listing {kind}"):
            rows = self._conn.execute(
                "SELECT key, body, version FROM docs WHERE kind = ? ORDER BY key", (kind,)
            ).fetchall()
        return [(str(k), self._doc_body(kind, k, b), int(v)) for k, b, v in rows]

    def delete_doc(self, kind: str, key: str, *, expect_version: int | None = None) -> bool:
        with self._write(f"deleting {kind} {key!r}"):
            row = self._conn.execute("SELECT version FROM docs WHERE kind = ? AND key = ?", (kind, key)).fetchone()
            version = 0 if row is None else int(row[0])
            check_doc_version(kind, key, expect_version, version)
            self._conn.execute("DELETE FROM docs WHERE kind = ? AND key = ?", (kind, key))
        return row is not None

    def _doc_body(self, kind: str, key: str, text: str) -> dict[str, Any]:
        try:
            body = json.loads(text)
        except ValueError as exc:
            raise StoreError(f"job store {self.path}: {kind} {key!r} cannot be read ({exc})") from exc
        if not isinstance(body, dict):
            raise StoreError(f"job store {self.path}: {kind} {key!r} is not a JSON object")
        return body

    def scrub_submitted_env(self, clean: Callable[[Mapping[str, str]], dict[str, str]], rule: str) -> int:
        """Rewrite the environment of every submitted job (origin "") to `clean(env)`; returns how many changed.

        For stores written by an older corral, which kept the submitter's whole environment (CORRAL_TOKEN too). When
        something changed, the file is rebuilt (VACUUM) with secure_delete on and the WAL checkpointed and truncated,
        so the old pages, in the database and in the WAL, no longer hold the removed values. `rule` names the rule
        `clean` applies: once a store is scrubbed under it (kept in `meta`), later starts skip the scan, since jobs
        admitted since were cleaned at admission."""
        changed = 0
        with self._write("scrubbing job environments"):
            done = self._conn.execute("SELECT value FROM meta WHERE key = 'env_rule'").fetchone()
            if done is not None and done[0] == rule:
                return 0
            self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('env_rule', ?)", (rule,))
            rows = self._conn.execute("SELECT id, spec FROM jobs").fetchall()
            for row_id, text in rows:
                try:
                    spec = json.loads(text)
                    env = spec.get("env")
                    if spec.get("origin", "") != "" or not isinstance(env, dict):
                        continue
                except (ValueError, AttributeError):
                    continue  # a row that cannot be read is reported when it is read, not here
                kept = clean(env)
                if kept == env:
                    continue
                spec["env"] = kept
                self._conn.execute("UPDATE jobs SET spec = ? WHERE id = ?", (json.dumps(spec, sort_keys=True), row_id))
                changed += 1
            self._data_version = None  # reload the memory copy with the cleaned specs
        if changed:
            with self._read("erasing scrubbed values"):
                self._conn.execute("PRAGMA secure_delete = ON")
                self._conn.execute("VACUUM")
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return changed

    def close(self) -> None:
        with self._lock, self._acct_lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._acct_conn is not None:
                    self._acct_conn.close()
                self._conn.close()
            except sqlite3.Error as exc:
                raise self._error("closing it failed", exc) from exc

    @contextmanager
    def _reading(self, what: str) -> Iterator[sqlite3.Connection]:
        """The accounting reads' own connection (opened on first use), for one read."""
        with self._acct_lock:
            self._check_open()
            try:
                if self._acct_conn is None:
                    conn = sqlite3.connect(
                        self.path, timeout=self._busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False
                    )
                    conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
                    conn.execute("PRAGMA query_only = ON")
                    self._acct_conn = conn
                yield self._acct_conn
            except sqlite3.Error as exc:
                raise self._error(f"{what} failed", exc) from exc

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    # ------------------------------------------------------------------------------------------------ internals
    def _open(self) -> None:
        conn = self._conn
        try:
            # The first read of the file: a file that is not SQLite fails here ("file is not a database").
            conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(
                    f"job store {self.path}: SQLite cannot use write-ahead logging there (journal mode {mode!r});"
                    " put the state file on a local file system"
                )
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._check_or_create_schema()
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise self._error("cannot open it", exc) from exc

    def _check_or_create_schema(self) -> None:
        conn = self._conn
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "meta" not in tables and tables - {"sqlite_sequence"}:
            raise StoreError(
                f"job store {self.path}: the file is an SQLite database but not a corral job store"
                f" (it has tables {', '.join(sorted(tables))}); choose another file"
            )
        # executescript() would COMMIT first; run the statements one by one inside our transaction instead.
        for statement in _statements(_SCHEMA):
            conn.execute(statement)
        # A column added within schema 3 (preemption records, NULL for every older job): added where missing, and
        # ignored by an older corral (it names the columns it reads), so the file stays readable by both.
        columns = {r[1] for r in conn.execute("PRAGMA table_info(jobs)")}
        if "preempted" not in columns:
            conn.execute("ALTER TABLE jobs ADD COLUMN preempted TEXT")
        if "usage" not in columns:  # likewise for the GPU use of a job's end (corral acct)
            conn.execute("ALTER TABLE jobs ADD COLUMN usage TEXT")
        if "jobs" in tables and "acct" not in tables:  # a file from before accounting: its ended jobs' records
            conn.execute(_ACCT_BACKFILL)  # (the trigger sums them by the hour as they go in)
        elif "acct" in tables and "acct_hours" not in tables:  # records from before the hours' sums: sum them now
            conn.execute(_HOURS_REBUILD)
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            return
        try:
            version = int(row[0])
        except ValueError:
            version = -1
        if version in (1, 2):  # schema 1 lacked `docs`, 2 `idempotency`: the statements above have just created them
            conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
            return
        if version != SCHEMA_VERSION:
            newer = version > SCHEMA_VERSION
            raise StoreError(
                f"job store {self.path}: schema version {row[0]} "
                + ("was written by a newer corral; upgrade corral" if newer else f"is not {SCHEMA_VERSION}")
            )

    @contextmanager
    def _read(self, what: str) -> Iterator[None]:
        with self._lock:
            self._check_open()
            try:
                yield
            except sqlite3.Error as exc:
                raise self._error(f"{what} failed", exc) from exc

    @contextmanager
    def _write(self, what: str) -> Iterator[None]:
        """One write transaction: BEGIN IMMEDIATE takes the write lock before anything is read (compare-and-set)."""
        with self._lock:
            self._check_open()
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield
                    conn.execute("COMMIT")
                except BaseException:
                    self._data_version = None  # the memory copy may hold what was rolled back: reload it
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise self._error(f"{what} failed", exc) from exc

    def _get_for_write(self, job_id: str) -> Job:
        """The job as stored, inside a write transaction (so the memory copy is checked against SQLite first)."""
        row_id = canonical_id(job_id)
        if row_id is None:
            raise JobNotFound(job_id)
        self._sync()
        cached = self._active.get(row_id)
        if cached is not None:
            return cached
        row = self._conn.execute(f"{_SELECT} WHERE id = ?", (row_id,)).fetchone()
        if row is None:
            raise JobNotFound(job_id)
        return self._decode(row)

    def _store(self, job: Job, columns: dict[str, Any], *, was: JobState) -> None:
        values = {
            name: self._spec_text(value) if name == "spec" else _encode(name, value) for name, value in columns.items()
        }
        values["version"] = job.version
        assignments = ", ".join(f"{name} = ?" for name in values)  # names come from check_fields, never the caller
        self._conn.execute(f"UPDATE jobs SET {assignments} WHERE id = ?", (*values.values(), int(job.id)))
        self._account([job] if was in FINAL_STATES else [], [job])
        # The memory copy changes with the row; if the transaction rolls back, `_write` drops the copy.
        if job.state in ACTIVE:
            self._active[int(job.id)] = job
        else:
            self._active.pop(int(job.id), None)

    def _sync(self) -> None:
        """Reload the unfinished jobs if another connection committed since they were loaded (or never loaded)."""
        version = int(self._conn.execute("PRAGMA data_version").fetchone()[0])
        if version == self._data_version:
            return
        values = sorted(s.value for s in ACTIVE)
        rows = self._conn.execute(
            f"{_SELECT} WHERE state IN ({', '.join('?' * len(values))}) ORDER BY id", values
        ).fetchall()
        self._active = {int(row[0]): self._decode(row) for row in rows}
        self._data_version = version

    def _decode(self, row: Sequence[Any]) -> Job:
        d = dict(zip(_COLUMNS, row, strict=True))
        try:
            return Job(
                id=str(d["id"]),
                spec=self._spec(d["spec"]),
                state=JobState(d["state"]),
                submitted_at=float(d["submitted_at"]),
                attempts=int(d["attempts"]),
                not_before=float(d["not_before"]),
                started_at=_optional_float(d["started_at"]),
                finished_at=_optional_float(d["finished_at"]),
                exit_code=d["exit_code"],
                pid=d["pid"],
                pid_start_time=d["pid_start_time"],
                gpus=tuple(GpuGrant(int(i), int(m), int(mib)) for i, m, mib in loads(d["gpus"])),
                gpu_uuids=tuple(str(u) for u in loads(d["gpu_uuids"])),
                reason=str(d["reason"]),
                version=int(d["version"]),
                preempted=None if d["preempted"] is None else Preempted.from_json(d["preempted"]),
                usage=None if d["usage"] is None else Usage.from_json(d["usage"]),
            )
        except (ValueError, TypeError, KeyError) as exc:  # InvalidRequest is a ValueError
            raise StoreError(f"job store {self.path}: job {d['id']} cannot be read ({exc})") from exc

    def _spec_text(self, spec: JobSpec) -> str:
        """A spec as stored: an array's task that differs from its array's spec only in its hold and history (an
        array held as a whole) stays a stub, with those two; anything else is written whole."""
        a = spec.array
        template = self._templates.get(int(a.job_id)) if a is not None and a.job_id else None
        if a is None or template is None or template.array is None or a.spec is not template.array.spec:
            return spec_to_json(spec)
        mine, theirs = spec.__dict__, template.__dict__
        if any(
            mine[name] is not value and mine[name] != value
            for name, value in theirs.items()
            if name not in ("array", "held_by", "history")
        ):
            return spec_to_json(spec)
        extra = {
            **({"held_by": spec.held_by} if spec.held_by else {}),
            **({"history": [c.to_dict() for c in spec.history]} if spec.history else {}),
        }
        more = (", " + json.dumps(extra, sort_keys=True)[1:-1]) if extra else ""
        return f'{_STUB}{a.job_id}, {a.task}]{more}, "name": {json.dumps(spec.name)}, "uid": {spec.uid}}}'

    def _spec(self, text: str) -> JobSpec:
        """A row's spec: its JSON, or an array task's stub read with its array's spec."""
        if not text.startswith(_STUB):
            return spec_from_json(text)
        d = json.loads(text)
        array_id, task = int(d["array"][0]), int(d["array"][1])
        template = self._templates.get(array_id)
        if template is None:
            try:
                with self._lock:
                    row = self._conn.execute("SELECT spec FROM arrays WHERE id = ?", (array_id,)).fetchone()
            except sqlite3.Error as exc:
                raise self._error(f"reading array {array_id}", exc) from exc
            if row is None:
                raise KeyError(f"its array {array_id} has no spec")
            template = self._templates[array_id] = spec_from_json(row[0])
        assert template.array is not None
        spec = task_spec(template, template.array.job_id, task)
        if "held_by" in d:  # an array held as a whole: each task's hold and history in its stub
            object.__setattr__(spec, "held_by", str(d["held_by"]))
        if "history" in d:
            object.__setattr__(spec, "history", tuple(Change.from_dict(c) for c in d["history"]))
        return spec

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"job store {self.path} is closed")

    def _error(self, what: str, exc: sqlite3.Error) -> StoreError:
        return StoreError(f"job store {self.path}: {what}: {_describe(exc)}")


def _encode(name: str, value: Any) -> Any:
    if name == "gpus":
        return json.dumps([[g.index, g.milli, g.memory_mib] for g in value])
    if name == "gpu_uuids":
        return json.dumps(list(value))
    if name in ("preempted", "usage"):
        return None if value is None else value.to_json()
    if name == "spec":
        return spec_to_json(value)
    return value


def _statements(script: str) -> builtins.list[str]:
    """The statements of an SQL script, each whole (a trigger's body holds semicolons of its own)."""
    out, part = [], ""
    for piece in script.split(";"):
        part += piece + ";"
        if sqlite3.complete_statement(part):
            if part.strip(" \n;"):
                out.append(part)
            part = ""
    return out


def _acct_row(r: AcctRecord) -> tuple[Any, ...]:
    return (
        r.ended_at, int(r.id), r.uid, r.user, r.queue, r.name, r.state, r.exit_code, r.submitted_at, r.started_at,
        r.elapsed_s, r.gpu_milli, json.dumps(list(r.gpu_ids)), r.cpu_milli, r.gpu_util_pct, r.gpu_mem_peak_mib,
        r.gpu_samples, int(r.simulated),
    )  # fmt: skip


def _acct_record(row: Sequence[Any]) -> AcctRecord:
    # Positional, and JSON parsed only for a job that held GPUs: a page is up to 10,000 of these.
    ended, job_id, uid, user, queue, name, state, code, submitted, started, elapsed, gpu_milli, ids, *rest = row
    cpu_milli, util, mem, samples, simulated = rest
    gpu_ids = () if ids == "[]" else tuple(int(i) for i in json.loads(ids))
    return AcctRecord(
        str(job_id), name, user, uid, queue, state, code, submitted, started, ended, elapsed, gpu_milli, gpu_ids,
        cpu_milli, util, mem, samples, bool(simulated),
    )  # fmt: skip


def _acct_where(
    query: AcctQuery, hours: tuple[int | None, int | None] | None = None
) -> tuple[str | None, builtins.list[Any]]:
    """The WHERE clause of an accounting query and its parameters; (None, []) when nothing can match. Each filter
    is a range of one of acct's indexes (the table itself for a window of time alone). `hours`: for acct_hours,
    whole hours from the first to before the last (None: unbounded) instead of the query's times."""
    where: builtins.list[str] = []
    params: builtins.list[Any] = []
    if query.states is not None:
        values = sorted(s.value for s in query.states)
        if not values:
            return None, []
        where.append(f"state IN ({', '.join('?' * len(values))})")
        params.extend(values)
    for column, value in (("uid", query.uid), ("user", query.user), ("queue", query.queue)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if query.since is not None:
        where.append("ended_at >= ?")
        params.append(float(query.since))
    if query.until is not None:
        where.append("ended_at < ?")
        params.append(float(query.until))
    if hours is not None:
        for bound, op in zip(hours, (">=", "<"), strict=True):
            if bound is not None:
                where.append(f"hour {op} ?")
                params.append(bound)
    if query.after is not None:
        where.append("(ended_at, job_id) > (?, ?)")
        params.extend([float(query.after[0]), int(query.after[1])])
    return (f" WHERE {' AND '.join(where)}" if where else ""), params


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _describe(exc: sqlite3.Error) -> str:
    """SQLite's own words, plus a hint for the failures a user can fix."""
    text = str(exc) or type(exc).__name__
    lowered = text.lower()
    if "unable to open database file" in lowered:
        return f"{text} (does the folder exist, and may corral write to it?)"
    if "file is not a database" in lowered:
        return f"{text} (the file is not a corral job store, or it is damaged)"
    if "malformed" in lowered:
        return f"{text} (the file is damaged; restore it from a backup or move it away)"
    if "readonly" in lowered or "read-only" in lowered:
        return f"{text} (corral needs write access to the file and its folder)"
    if "database or disk is full" in lowered:
        return f"{text} (free some disk space)"
    if "database is locked" in lowered:
        return f"{text} (another process holds the file; is a second corral serve running?)"
    return text
