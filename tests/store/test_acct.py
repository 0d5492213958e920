"""Accounting records (corral.store.acct), one contract over MemoryStore and SqliteStore: a record per ended job
written with its end, filters and paging in end order, per-user-and-queue sums, pruning in batches, and a file from
before accounting gaining the records of its ended jobs."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.jobs.model import JobSpec, JobState
from corral.jobs.usage import Usage
from corral.model.errors import InvalidRequest
from corral.model.resources import GpuGrant, Request
from corral.store import MemoryStore, SqliteStore, Store, StoreError
from corral.store.acct import AcctColumns, AcctQuery, check_window, cursor_text, parse_cursor, record_of, summarize

Q, S, R = JobState.QUEUED, JobState.STARTING, JobState.RUNNING
OK, FAILED, CANCELLED = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "jobs.db")
    yield s
    s.close()


def spec(user: str = "alice", uid: int = 1000, queue: str = "default", gpus: int = 1, cpus: int = 2000) -> JobSpec:
    request = Request(cpu_milli=cpus, memory_mib=512, gpu_count=gpus, gpu_milli=1000 if gpus else 0)
    return JobSpec(("true",), request, user, uid, uid, name=f"{user}-job", queue=queue)


def run(
    store: Store,
    s: JobSpec,
    start: float,
    end: float,
    state: JobState = OK,
    usage: Usage | None = None,
    grants: tuple[GpuGrant, ...] = (GpuGrant(0, 1000, 0),),
) -> str:
    job = store.add(s, now=start - 10)
    store.transition(job.id, S, gpus=grants if s.request.gpu_count else ())
    store.transition(job.id, R, started_at=start, pid=1)
    code = 0 if state is OK else 3
    store.transition(job.id, state, finished_at=end, exit_code=code, usage=usage)
    return job.id


def test_an_ended_job_has_a_record_with_its_hours_and_use(store: Store) -> None:
    use = Usage(samples=7200, gpu_util_pct=62.5, gpu_mem_peak_mib=30000, simulated=True)
    grants = (GpuGrant(0, 1000, 0), GpuGrant(2, 1000, 0))
    job_id = run(store, spec(gpus=2, cpus=4000), 1000.0, 8200.0, usage=use, grants=grants)
    waiting = store.add(spec(), now=50.0)  # never started, still waiting: no record
    (r,) = store.acct(AcctQuery())
    assert (r.id, r.user, r.uid, r.queue, r.name, r.state, r.exit_code) == (
        job_id, "alice", 1000, "default", "alice-job", "succeeded", 0,
    )  # fmt: skip
    assert (r.started_at, r.ended_at, r.elapsed_s, r.gpu_ids, r.gpu_milli, r.cpu_milli) == (
        1000.0, 8200.0, 7200.0, (0, 2), 2000, 4000,
    )  # fmt: skip
    assert r.gpu_hours == pytest.approx(4.0) and r.cpu_hours == pytest.approx(8.0)
    assert (r.gpu_util_pct, r.gpu_mem_peak_mib, r.gpu_samples, r.simulated) == (62.5, 30000, 7200, True)
    stored = store.get(job_id)
    assert stored is not None and stored.usage == use and record_of(stored) == r
    # cancelled before it started: its submission time stands in for its end, elapsed 0, what it asked for
    store.transition(waiting.id, CANCELLED, reason="cancelled")
    first = store.acct(AcctQuery())[0]
    assert (first.id, first.state, first.ended_at, first.elapsed_s, first.gpu_milli, first.gpu_ids) == (
        waiting.id, "cancelled", 50.0, 0.0, 1000, (),
    )  # fmt: skip
    assert first.gpu_util_pct is None and first.gpu_samples == 0 and not first.simulated


def test_a_retried_job_leaves_the_accounts_until_it_ends_again(store: Store) -> None:
    job_id = run(store, spec(), 100.0, 200.0, FAILED)
    assert [r.state for r in store.acct(AcctQuery())] == ["failed"]
    store.transition(job_id, Q, expect=[FAILED], gpus=(), not_before=300.0)
    assert store.acct(AcctQuery()) == []
    store.transition(job_id, S, gpus=(GpuGrant(1, 1000, 0),))
    store.transition(job_id, R, started_at=400.0)
    store.transition(job_id, OK, finished_at=460.0, exit_code=0)
    (r,) = store.acct(AcctQuery())
    assert (r.state, r.elapsed_s, r.ended_at, r.gpu_ids) == ("succeeded", 60.0, 460.0, (1,))  # its last attempt


def test_bulk_cancel_writes_records_too(store: Store) -> None:
    ids = [store.add(spec(), now=10.0 + i).id for i in range(3)]
    store.transition_many(ids, CANCELLED, expect=[Q], reason="cancelled")
    assert [r.id for r in store.acct(AcctQuery())] == ids


def test_filters_and_cursor_pages_in_end_order(store: Store) -> None:
    made = []
    for i in range(12):
        who = ("alice", 1000) if i % 3 else ("bob", 1001)
        state = FAILED if i % 4 == 0 else OK
        end = 1000.0 + (12 - i) * 10  # the later a job was made, the earlier it ended
        made.append(run(store, spec(*who, queue="train" if i % 2 else "default"), end - 5, end, state))
    everything = store.acct(AcctQuery())
    assert [r.ended_at for r in everything] == sorted(r.ended_at for r in everything)
    assert [r.id for r in everything] == list(reversed(made))
    window = AcctQuery(since=1030.0, until=1090.0)
    assert [r.ended_at for r in store.acct(window)] == [1030.0, 1040.0, 1050.0, 1060.0, 1070.0, 1080.0]
    assert {r.user for r in store.acct(AcctQuery(uid=1001))} == {"bob"}
    assert {r.user for r in store.acct(AcctQuery(user="alice"))} == {"alice"}
    assert {r.state for r in store.acct(AcctQuery(states={FAILED}))} == {"failed"}
    assert {r.queue for r in store.acct(AcctQuery(queue="train"))} == {"train"}
    assert store.acct(AcctQuery(states=())) == []
    pages, after = [], None
    while True:
        page = store.acct(AcctQuery(user="alice", after=after, limit=3))
        pages.append([r.id for r in page])
        if len(page) < 3:
            break
        after = (page[-1].ended_at, int(page[-1].id))
    assert [i for p in pages for i in p] == [r.id for r in store.acct(AcctQuery(user="alice"))]
    assert [len(p) for p in pages] == [3, 3, 2]


def test_summary_per_user_and_queue_weights_utilisation_by_gpu_hours(store: Store) -> None:
    run(store, spec(gpus=1), 0.0, 3600.0, usage=Usage(10, 90.0, 1000))
    run(store, spec(gpus=1), 0.0, 3 * 3600.0, usage=Usage(10, 50.0, 2000))
    run(store, spec(gpus=0, cpus=1000), 0.0, 3600.0)  # no GPU: counts as a job and in CPU-hours only
    run(store, spec("bob", 1001, queue="train", gpus=1), 0.0, 1800.0, usage=Usage(10, 40.0, 10, simulated=True))
    rows = store.acct_summary(AcctQuery())
    assert [(r.user, r.queue, r.jobs) for r in rows] == [("alice", "default", 3), ("bob", "train", 1)]
    alice, bob = rows
    assert alice.gpu_hours == pytest.approx(4.0) and alice.cpu_hours == pytest.approx(2 + 6 + 1)
    assert alice.gpu_util_pct == pytest.approx((90 * 1 + 50 * 3) / 4) and not alice.simulated
    assert bob.gpu_hours == pytest.approx(0.5) and bob.gpu_util_pct == pytest.approx(40.0) and bob.simulated
    reference = summarize(store.acct(AcctQuery()))  # what the SQL store sums, summed in Python
    assert [(r.user, r.queue, r.jobs, r.simulated) for r in rows] == [
        (r.user, r.queue, r.jobs, r.simulated) for r in reference
    ]
    for got, want in zip(rows, reference, strict=True):
        assert (got.gpu_hours, got.cpu_hours, got.gpu_util_pct) == pytest.approx(
            (want.gpu_hours, want.cpu_hours, want.gpu_util_pct)
        )
    assert store.acct_summary(AcctQuery(uid=1001))[0].user == "bob"
    assert store.acct_summary(AcctQuery(since=10**6)) == []


def test_prune_deletes_the_oldest_ended_jobs_a_batch_at_a_time(store: Store) -> None:
    ids = [run(store, spec(), 100.0 * i, 100.0 * i + 50) for i in range(1, 8)]
    waiting = store.add(spec(), now=0.0)  # never ended: never pruned, however old
    assert store.prune_ended(before=420.0, limit=2) == 2  # ended at 150, 250
    assert [r.id for r in store.acct(AcctQuery())][:1] == [ids[2]]
    assert store.get(ids[0]) is None and store.get(ids[1]) is None
    assert store.prune_ended(before=420.0, limit=2) == 1  # 350: fewer than a batch, so that was all
    assert store.prune_ended(before=420.0, limit=2) == 0
    assert [r.id for r in store.acct(AcctQuery())] == ids[3:]
    assert store.get(waiting.id) is not None and store.prune_ended(before=10**9, limit=0) == 0


def test_an_older_file_gains_the_records_of_its_ended_jobs(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(path)
    done = run(store, spec(gpus=2), 100.0, 460.0, grants=(GpuGrant(0, 1000, 0), GpuGrant(1, 1000, 0)))
    cancelled = store.add(spec(), now=5.0)
    store.transition(cancelled.id, CANCELLED)
    running = store.add(spec(), now=7.0)
    expected = store.acct(AcctQuery())
    store.close()
    with sqlite3.connect(path) as conn:  # as an older corral left it: no acct table, no usage column
        conn.execute("DROP TABLE acct")
        conn.execute("ALTER TABLE jobs DROP COLUMN usage")
    reopened = SqliteStore(path)
    assert reopened.acct(AcctQuery()) == expected
    assert [r.id for r in expected] == [cancelled.id, done] and running.id not in {r.id for r in expected}
    reopened.close()


def test_cursor_and_window_errors_name_the_field() -> None:
    assert parse_cursor(cursor_text(1234.5, 17)) == (1234.5, 17)
    for bad in ("", "17", "x:1", "1.5:y", "inf:3", "1:-2", "9" * 80 + ":1"):
        with pytest.raises(InvalidRequest) as info:
            parse_cursor(bad)
        assert info.value.field == "after" and "not a page cursor" in info.value.message
    with pytest.raises(InvalidRequest) as info:
        check_window(2000.0, 1000.0)
    assert (info.value.field, info.value.message) == ("since", "must be before until (2000 is not before 1000)")
    with pytest.raises(InvalidRequest) as info:
        check_window(None, 1e300)
    assert info.value.field == "until" and info.value.message.startswith("must be a time between 1970 and 9999")
    check_window(None, None)


def test_sqlite_summary_of_any_window_agrees_with_the_records(tmp_path: Path) -> None:
    """SQLite sums whole hours from its hourly table and the part-hours at the ends from the records: for windows
    that start and end anywhere (on an hour, within one, open), after retries and pruning, the sums are the
    records' own."""
    import random

    rng = random.Random(7)
    store = SqliteStore(tmp_path / "jobs.db")
    hour = 3600.0
    ids = []
    for _ in range(120):
        end = rng.choice([rng.uniform(0, 10 * hour), rng.randrange(11) * hour])  # some exactly on an hour
        who = rng.choice([("alice", 1000), ("bob", 1001)])
        use = Usage(3, rng.uniform(0, 100), 10) if rng.random() < 0.7 else None
        state = rng.choice([OK, FAILED])
        ids.append(run(store, spec(*who, queue=rng.choice(["a", "b"])), end - rng.uniform(0, hour), end, state, use))
    for job_id in ids[:10]:  # retried: out of the sums until they end again
        job = store.get(job_id)
        assert job is not None
        if job.state is FAILED:
            store.transition(job_id, Q, gpus=())
    store.prune_ended(before=hour, limit=5)
    bounds = [None, 0.0, hour, 2.5 * hour, 3 * hour, 7 * hour + 1, 10 * hour, 11 * hour]
    for _ in range(60):
        since, until = rng.choice(bounds), rng.choice(bounds)
        if rng.random() < 0.5:
            since = rng.uniform(0, 11 * hour)
        if since is not None and until is not None and since >= until:
            continue
        for query in (AcctQuery(since, until), AcctQuery(since, until, uid=1001), AcctQuery(since, until, states={OK})):
            got, want = store.acct_summary(query), summarize(store.acct(query))
            assert [(r.user, r.queue, r.jobs) for r in got] == [(r.user, r.queue, r.jobs) for r in want], query
            for g, w in zip(got, want, strict=True):
                assert (g.elapsed_s, g.gpu_hours, g.cpu_hours) == pytest.approx((w.elapsed_s, w.gpu_hours, w.cpu_hours))
                assert (g.gpu_util_pct is None) == (w.gpu_util_pct is None)
                assert g.gpu_util_pct == pytest.approx(w.gpu_util_pct)
    store.close()


def test_sqlite_accounting_reads_do_not_wait_for_the_daemons_writes(tmp_path: Path) -> None:
    """A month's summary or a page of 10,000 records takes a while: they read through a connection of their own,
    so the daemon's writes (which hold the store's lock) neither wait for them nor hold them up."""
    import threading

    store = SqliteStore(tmp_path / "jobs.db")
    run(store, spec(), 10.0, 20.0)
    answers: list[int] = []
    with store._lock:  # the daemon is in the middle of a write
        reader = threading.Thread(
            target=lambda: answers.extend([len(store.acct(AcctQuery())), len(store.acct_summary(AcctQuery()))])
        )
        reader.start()
        reader.join(timeout=10)
        assert answers == [1, 1]
    store.close()
    with pytest.raises(StoreError):
        store.acct(AcctQuery())


def test_columns_are_the_records_of_the_same_page(store: Store) -> None:
    use = Usage(samples=10, gpu_util_pct=41.5, gpu_mem_peak_mib=2048, simulated=True)
    made = [
        run(
            store, spec(gpus=2, cpus=4000), 100.0, 400.0, usage=use, grants=(GpuGrant(1, 1000, 0), GpuGrant(3, 500, 0))
        ),
        run(store, spec("bob", 1001, gpus=0), 200.0, 300.0, FAILED),
        run(store, spec(), 150.0, 500.0),
    ]
    cancelled = store.add(spec(), now=50.0)
    store.transition(cancelled.id, CANCELLED, reason="cancelled")
    for query in (AcctQuery(), AcctQuery(uid=1000), AcctQuery(limit=2), AcctQuery(after=(300.0, int(made[1])))):
        columns = store.acct_columns(query)
        records = store.acct(query)
        assert columns == AcctColumns.of(records) and columns.records() == records
        assert len(columns) == len(records) and columns.cursor == records[-1].cursor
        assert columns.gpu_hours == [r.gpu_hours for r in records]
        assert columns.cpu_hours == [r.cpu_hours for r in records]
    assert store.acct_columns(AcctQuery()).gpu_ids == [(), (), (1, 3), (0,)]
    assert len(store.acct_columns(AcctQuery(states=()))) == 0 and len(store.acct_columns(AcctQuery(since=1e6))) == 0
