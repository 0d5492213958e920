"""The job store of `corral serve`: one SQLite file, written so that a kill -9 (or a power cut) loses nothing acked.

    jobs(id INTEGER PRIMARY KEY AUTOINCREMENT, spec TEXT (spec_to_json), user, state, submitted_at, attempts,
         not_before, started_at, finished_at, exit_code, pid, pid_start_time, gpus TEXT ([[index, milli, MiB]]),
         gpu_uuids TEXT ([uuid]), reason, version)
    meta(key TEXT PRIMARY KEY, value TEXT)   -- schema_version
    docs(kind, key, body TEXT (JSON), version)  -- named documents beside the jobs (schema 2; a schema-1 file gains
                                                  the table when opened)
    idempotency(uid, key, job_id, created_at)   -- Idempotency-Key -> job, written in the job's own transaction
                                                  (schema 3; older files gain the table when opened)
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
"""

from __future__ import annotations

import builtins
import dataclasses
import json
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
    spec_from_json,
    spec_to_json,
)
from corral.model.resources import GpuGrant
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
CREATE TABLE IF NOT EXISTS arrays (
    id   INTEGER PRIMARY KEY,
    spec TEXT    NOT NULL
);
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
)
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM jobs"


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
        sql = _SELECT + (f" WHERE {' AND '.join(where)}" if where else "")
        sql += " ORDER BY id DESC" if query.newest_first else " ORDER BY id"
        if query.limit is not None:
            sql += " LIMIT ?"
            params.append(query.limit)
        with self._read("listing jobs"):
            self._sync()
            rows = self._conn.execute(sql, params).fetchall()
            active = self._active
            return [active.get(row[0]) or self._decode(row) for row in rows]

    def transition(
        self, job_id: str, to: JobState, *, expect: Collection[JobState] | None = None, **fields: Any
    ) -> Job:
        to = JobState(to)
        changes = check_fields(fields)
        with self._write(f"changing job {job_id}"):
            job = self._get_for_write(job_id)
            check_transition(job, to, expect)
            new = job.evolve(state=to, version=job.version + 1, **changes)
            self._store(new, {"state": to.value, **changes})
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
            self._store(new, changes)
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
                self._store(new, fields)
                out.append(new)
        return out

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
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._conn.close()
            except sqlite3.Error as exc:
                raise self._error("closing it failed", exc) from exc

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
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        # A column added within schema 3 (preemption records, NULL for every older job): added where missing, and
        # ignored by an older corral (it names the columns it reads), so the file stays readable by both.
        if "preempted" not in {r[1] for r in conn.execute("PRAGMA table_info(jobs)")}:
            conn.execute("ALTER TABLE jobs ADD COLUMN preempted TEXT")
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

    def _store(self, job: Job, columns: dict[str, Any]) -> None:
        values = {
            name: self._spec_text(value) if name == "spec" else _encode(name, value) for name, value in columns.items()
        }
        values["version"] = job.version
        assignments = ", ".join(f"{name} = ?" for name in values)  # names come from check_fields, never the caller
        self._conn.execute(f"UPDATE jobs SET {assignments} WHERE id = ?", (*values.values(), int(job.id)))
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
                gpus=tuple(GpuGrant(int(i), int(m), int(mib)) for i, m, mib in json.loads(d["gpus"])),
                gpu_uuids=tuple(str(u) for u in json.loads(d["gpu_uuids"])),
                reason=str(d["reason"]),
                version=int(d["version"]),
                preempted=None if d["preempted"] is None else Preempted.from_json(d["preempted"]),
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
    if name == "preempted":
        return None if value is None else value.to_json()
    if name == "spec":
        return spec_to_json(value)
    return value


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
