"""One contract for every `Store`, run over MemoryStore and SqliteStore.

Then what only SQLite promises: reopen, kill -9, WAL, readable errors for bad files.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.jobs.model import FINAL_STATES, TRANSITIONS, InvalidTransition, Job, JobSpec, JobState
from corral.model.errors import InvalidRequest
from corral.model.resources import Constraint, GpuBehavior, GpuGrant, Request
from corral.store import (
    IDEMPOTENCY_TTL_S,
    JobNotFound,
    JobQuery,
    KeyInUse,
    MemoryStore,
    SqliteStore,
    StaleDocument,
    StaleJob,
    Store,
    StoreError,
    open_store,
)
from corral.store.sqlite import SCHEMA_VERSION

Q, S, R = JobState.QUEUED, JobState.STARTING, JobState.RUNNING

#: How to bring a fresh (QUEUED) job into each state.
PATH_TO: dict[JobState, tuple[JobState, ...]] = {
    JobState.QUEUED: (),
    JobState.STARTING: (S,),
    JobState.RUNNING: (S, R),
    JobState.SUCCEEDED: (S, R, JobState.SUCCEEDED),
    JobState.FAILED: (S, JobState.FAILED),
    JobState.CANCELLED: (JobState.CANCELLED,),
    JobState.LOST: (S, R, JobState.LOST),
}


def simple_spec(user: str = "alice", name: str = "") -> JobSpec:
    return JobSpec(("true",), Request(cpu_milli=1000, memory_mib=512), user, 1000, 1000, name=name)


def full_spec() -> JobSpec:
    request = Request(
        cpu_milli=2500,
        memory_mib=8192,
        gpu_count=2,
        gpu_milli=300,
        gpu_memory_mib=10240,
        gpu_models=frozenset({"A100", "H100"}),
        min_gpu_memory_mib=40000,
        constraints=(Constraint.parse("zone", "EQ", "west"), Constraint.parse("hostname", "LIKE", "gpu-[0-9]+")),
        priority=7,
        gpu_behavior=GpuBehavior.RESTRICTED,
        labels={"team": "vision", "GPU_SCHEDULING_BEHAVIOR": "restricted"},
        policy="fgd",
        id="req-1",
    )
    return JobSpec(
        command=("python", "-c", "print('héllo wörld')", "--flag=a b"),
        request=request,
        user="bob",
        uid=1001,
        gid=100,
        name="train résnet",
        retries=3,
        time_limit_s=3600.5,
        env={"CUDA_CACHE": "/tmp/c", "EMPTY": "", "QUOTE": "a'b\"c"},
        cwd="/home/bob/project",
    )


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "jobs.db")
    yield s
    s.close()


def drive(store: Store, job_id: str, target: JobState) -> Job:
    job = store.get(job_id)
    assert job is not None
    for state in PATH_TO[target]:
        job = store.transition(job_id, state)
    return job


# ------------------------------------------------------------------------------------------------------ contract
def test_add_assigns_monotonic_ids_queued_version_1(store: Store) -> None:
    jobs = [store.add(simple_spec(), now=100.0 + i) for i in range(12)]
    assert [j.id for j in jobs] == [str(i) for i in range(1, 13)]
    first = jobs[0]
    assert (first.state, first.version, first.submitted_at, first.attempts) == (Q, 1, 100.0, 0)
    assert (first.pid, first.gpus, first.gpu_uuids, first.reason, first.not_before) == (None, (), (), "", 0.0)
    assert store.get("12") == jobs[11]


def test_full_spec_round_trips(store: Store) -> None:
    spec = full_spec()
    job = store.add(spec, now=1.5)
    stored = store.get(job.id)
    assert stored is not None
    assert stored.spec == spec == job.spec
    assert stored.spec.request.gpu_models == frozenset({"A100", "H100"})
    assert stored.spec.request.constraints[0] == Constraint.parse("zone", "IS", "west")
    assert dict(stored.spec.env) == {"CUDA_CACHE": "/tmp/c", "EMPTY": "", "QUOTE": "a'b\"c"}


def test_stored_spec_does_not_follow_the_callers_dicts(store: Store) -> None:
    env = {"A": "1"}
    job = store.add(JobSpec(("true",), Request(cpu_milli=1), "alice", 1, 1, env=env), now=0)
    env["A"] = "changed"
    stored = store.get(job.id)
    assert stored is not None and dict(stored.spec.env) == {"A": "1"}


def test_every_job_field_round_trips(store: Store) -> None:
    job = store.add(full_spec(), now=10.0)
    grants = (GpuGrant(0, 300, 10240), GpuGrant(3, 300, 10240))
    starting = store.transition(
        job.id,
        S,
        expect={Q},
        gpus=grants,
        gpu_uuids=["GPU-aaaa", "GPU-bbbb"],
        attempts=1,
        started_at=11.25,
        reason="starting on GPUs 0, 3",
    )
    assert starting.gpu_uuids == ("GPU-aaaa", "GPU-bbbb")  # normalised to a tuple
    updated = store.update(job.id, expect_version=starting.version, pid=4242, pid_start_time=987654321)
    running = store.transition(job.id, R, reason="")
    failed = store.transition(
        job.id, JobState.FAILED, exit_code=-9, finished_at=20, not_before=50.5, reason="killed by signal 9"
    )
    assert [j.version for j in (job, starting, updated, running, failed)] == [1, 2, 3, 4, 5]
    assert store.get(job.id) == failed
    assert failed == Job(
        id=job.id,
        spec=full_spec(),
        state=JobState.FAILED,
        submitted_at=10.0,
        attempts=1,
        not_before=50.5,
        started_at=11.25,
        finished_at=20.0,
        exit_code=-9,
        pid=4242,
        pid_start_time=987654321,
        gpus=grants,
        gpu_uuids=("GPU-aaaa", "GPU-bbbb"),
        reason="killed by signal 9",
        version=5,
    )
    # A retry clears what belonged to the last attempt; None is a value a write can set.
    retried = store.transition(job.id, Q, pid=None, pid_start_time=None, exit_code=None, gpus=(), gpu_uuids=())
    assert store.get(job.id) == retried
    assert (retried.pid, retried.exit_code, retried.gpus, retried.attempts, retried.state) == (None, None, (), 1, Q)


def test_list_filters_by_state_and_user_in_numeric_id_order(store: Store) -> None:
    for i in range(12):
        store.add(simple_spec(user="bob" if i % 3 == 0 else "alice"), now=float(i))
    drive(store, "2", R)
    drive(store, "10", R)
    drive(store, "4", JobState.CANCELLED)

    def ids(jobs: list[Job]) -> list[str]:
        return [j.id for j in jobs]

    assert ids(store.list()) == [str(i) for i in range(1, 13)]  # "10" after "9", not after "1"
    assert ids(store.list(states={R})) == ["2", "10"]
    assert ids(store.list(states=[R, JobState.CANCELLED])) == ["2", "4", "10"]
    assert ids(store.list(user="bob")) == ["1", "4", "7", "10"]
    assert ids(store.list(states={R}, user="bob")) == ["10"]
    assert ids(store.list(states=FINAL_STATES, user="alice")) == []
    assert store.list(states=()) == []
    assert store.list(user="nobody") == []


def owned(user: str, uid: int, name: str = "") -> JobSpec:
    return JobSpec(("true",), Request(cpu_milli=1000, memory_mib=512), user, uid, uid, name=name)


def fill_for_queries(store: Store) -> None:
    """30 jobs: alice (uid 1000) and bob (1001) in turn, names a/b/c in turn, submitted at 100, 101, ...; a few
    moved on (3, 4, 20 running; 5, 6, 29 cancelled; 7 succeeded)."""
    for i in range(30):
        user, uid = ("alice", 1000) if i % 2 == 0 else ("bob", 1001)
        store.add(owned(user, uid, name="abc"[i % 3]), now=100.0 + i)
    for job_id in ("3", "4", "20"):
        drive(store, job_id, R)
    for job_id in ("5", "6", "29"):
        drive(store, job_id, JobState.CANCELLED)
    drive(store, "7", JobState.SUCCEEDED)


def test_query_filters_each_way_and_together(store: Store) -> None:
    fill_for_queries(store)

    def ids(**kw: Any) -> list[int]:
        return [int(j.id) for j in store.query(JobQuery(**kw))]

    assert ids() == list(range(1, 31))
    assert ids(states={R}) == [3, 4, 20]
    assert ids(states={R, JobState.SUCCEEDED}, uid=1000) == [3, 7]
    assert ids(user="bob", name="a") == [4, 10, 16, 22, 28]
    assert ids(uid=1001, name="a") == [4, 10, 16, 22, 28]
    assert ids(since=125.0) == [26, 27, 28, 29, 30]
    assert ids(states={Q}, user="alice", name="b", since=110.0) == [11, 17, 23]  # 29 is cancelled
    assert ids(uid=4242) == [] and ids(user="nobody") == [] and ids(name="zzz") == [] and ids(states=set()) == []
    assert ids(uid=1000, newest_first=True, limit=3) == [29, 27, 25]
    # Every job returned is the job `get` returns (the memory copy and decoded rows agree), whatever its state.
    for job in store.query(JobQuery()):
        assert store.get(job.id) == job


def test_query_hides_jobs_that_ended_before_ended_after(store: Store) -> None:
    fill_for_queries(store)  # ended: 5, 6, 29 cancelled while queued (no finished_at), 7 succeeded
    store.update("7", finished_at=200.0)

    def ids(**kw: Any) -> list[int]:
        return [int(j.id) for j in store.query(JobQuery(**kw))]

    # what has not ended always shows; an ended job by when it ended (its submission when it never ran)
    assert ids(ended_after=150.0) == [i for i in range(1, 31) if i not in (5, 6, 29)]
    assert ids(ended_after=128.0) == [i for i in range(1, 31) if i not in (5, 6)]
    assert ids(ended_after=250.0, states={JobState.SUCCEEDED, JobState.CANCELLED}) == []


def test_query_pages_by_cursor_in_both_orders(store: Store) -> None:
    fill_for_queries(store)
    for newest_first in (False, True):
        alice = [j.id for j in store.list(user="alice")]
        pages: list[list[str]] = []
        after = None
        while True:
            page = store.query(JobQuery(uid=1000, limit=4, after=after, newest_first=newest_first))
            if not page:
                break
            pages.append([j.id for j in page])
            after = page[-1].id
            if len(pages) <= 3:  # added meanwhile: paging never repeats nor skips a job
                store.add(owned("alice", 1000), now=999.0)
        seen = [job_id for page in pages for job_id in page]
        assert len(seen) == len(set(seen))
        if newest_first:
            assert seen == alice[::-1] and all(len(p) == 4 for p in pages[:-1])
        else:  # oldest first also reaches the jobs added while it paged
            assert seen[: len(alice)] == alice and seen == sorted(seen, key=int) and len(seen) == len(alice) + 3
    assert store.query(JobQuery(after="not-an-id")) == [] and store.query(JobQuery(limit=0)) == []
    assert [j.id for j in store.query(JobQuery(after="28"))][:2] == ["29", "30"]
    with pytest.raises(ValueError, match="limit"):
        JobQuery(limit=-1)


def test_query_agrees_with_its_reference_on_random_filters(store: Store) -> None:
    fill_for_queries(store)
    everything = store.list()
    rng = random.Random(7)
    for _ in range(200):
        query = JobQuery(
            states=rng.choice([None, frozenset({Q}), frozenset({R, JobState.CANCELLED}), frozenset()]),
            user=rng.choice([None, "alice", "bob", "carol"]),
            uid=rng.choice([None, 1000, 1001]),
            name=rng.choice([None, "a", "b", "c", "d"]),
            since=rng.choice([None, 90.0, 110.0, 128.5]),
            ended_after=rng.choice([None, 105.0, 128.5, 300.0]),
            after=rng.choice([None, "1", "12", "30", "31"]),
            limit=rng.choice([None, 0, 1, 5, 100]),
            newest_first=rng.random() < 0.5,
        )
        expected = [j for j in (everything[::-1] if query.newest_first else everything) if query.matches(j)]
        assert store.query(query) == expected[: query.limit], query


def test_transition_many_moves_the_jobs_that_may_move_in_one_write(store: Store) -> None:
    ids = [store.add(simple_spec(), now=float(i)).id for i in range(6)]
    drive(store, ids[1], R)
    drive(store, ids[2], JobState.SUCCEEDED)
    moved = store.transition_many(
        [ids[4], ids[0], ids[1], ids[2], "99", "x", ids[0]], JobState.CANCELLED, expect=[Q], reason="cancelled"
    )
    # Only the queued ones, by id, each once; the running, the ended and the unknown ones are left as they are.
    assert [(j.id, j.state, j.reason, j.version) for j in moved] == [
        (ids[0], JobState.CANCELLED, "cancelled", 2),
        (ids[4], JobState.CANCELLED, "cancelled", 2),
    ]
    assert [(j.id, j.state) for j in store.list()] == [
        (ids[0], JobState.CANCELLED), (ids[1], R), (ids[2], JobState.SUCCEEDED),
        (ids[3], Q), (ids[4], JobState.CANCELLED), (ids[5], Q),
    ]  # fmt: skip
    assert [j.id for j in store.list([Q])] == [ids[3], ids[5]]
    # Without `expect`, TRANSITIONS decides: RUNNING -> CANCELLED is allowed, SUCCEEDED -> anything is not.
    assert [j.id for j in store.transition_many([ids[1], ids[2]], JobState.CANCELLED, finished_at=5)] == [ids[1]]
    assert store.transition_many([], JobState.CANCELLED) == []
    with pytest.raises(ValueError, match="unknown job field"):
        store.transition_many([ids[3]], JobState.CANCELLED, colour="red")
    still = store.get(ids[3])
    assert still is not None and (still.state, still.version) == (Q, 1)


def test_sqlite_queries_use_indexes_not_a_scan_of_every_job(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    fill_for_queries(store)
    store.close()
    raw = sqlite3.connect(tmp_path / "jobs.db")
    seen: list[str] = []

    def plan(sql: str, *params: object) -> str:
        text = " | ".join(str(row[-1]) for row in raw.execute(f"EXPLAIN QUERY PLAN {sql}", params))
        seen.append(text)
        return text

    try:
        # The conditions `query` writes: SQLite answers each from its index (never "SCAN jobs", reading every row).
        for condition, value in (
            ("user = ?", "bob"),
            ("(CASE WHEN json_valid(spec) THEN json_extract(spec, '$.uid') END) = ?", 1000),
            ("(CASE WHEN json_valid(spec) THEN json_extract(spec, '$.name') END) = ?", "a"),
            ("state IN (?)", "queued"),
        ):
            text = plan(f"SELECT id FROM jobs WHERE {condition} ORDER BY id DESC LIMIT 5", value)
            assert "USING INDEX" in text or "USING COVERING INDEX" in text, text
    finally:
        raw.close()
    reopened = SqliteStore(tmp_path / "jobs.db")
    try:
        statements: list[str] = []
        reopened._conn.set_trace_callback(statements.append)  # what query() sends: the very conditions planned above
        reopened.query(JobQuery(uid=1000, name="a", user="alice", states={Q}))
        sent = [s for s in statements if s.startswith("SELECT") and "FROM jobs" in s]
        assert sent and all(
            cond in sent[-1]
            for cond in ("user = ", "json_extract(spec, '$.uid') END) = ", "json_extract(spec, '$.name') END) = ")
        ), sent
    finally:
        reopened.close()


@pytest.mark.parametrize("current", list(JobState))
def test_allowed_transitions_work_and_others_raise(store: Store, current: JobState) -> None:
    for wanted in JobState:
        job = drive(store, store.add(simple_spec(), now=0).id, current)
        assert job.state is current
        if wanted in TRANSITIONS[current]:
            new = store.transition(job.id, wanted)
            assert (new.state, new.version) == (wanted, job.version + 1)
            assert store.get(job.id) == new
        else:
            with pytest.raises(InvalidTransition) as info:
                store.transition(job.id, wanted)
            assert info.value.current is current
            assert str(info.value) == f"state: job {job.id} is {current.value}; it cannot become {wanted.value}"
            assert store.get(job.id) == job  # nothing changed, not even the version


def test_invalid_transition_message(store: Store) -> None:
    for _ in range(3):
        store.add(simple_spec(), now=0)
    drive(store, "3", R)
    # (running -> queued is allowed since preemption: a preempted job goes back to the queue)
    with pytest.raises(InvalidTransition, match=r"^state: job 3 is running; it cannot become starting$") as info:
        store.transition("3", JobState.STARTING, reason="never written")
    assert isinstance(info.value, InvalidRequest)
    assert info.value.message == "job 3 is running; it cannot become starting"
    job = store.get("3")
    assert job is not None and job.reason == ""


def test_expect_is_a_compare_and_set_on_the_state(store: Store) -> None:
    job = store.add(simple_spec(), now=0)
    store.transition(job.id, S, expect={Q})
    # RUNNING -> FAILED is allowed in general, but the caller expected the job to be RUNNING and it is STARTING.
    with pytest.raises(InvalidTransition, match="job 1 is starting; it cannot become failed"):
        store.transition(job.id, JobState.FAILED, expect=[R])
    assert store.transition(job.id, JobState.FAILED, expect=[S, R]).state is JobState.FAILED
    with pytest.raises(InvalidTransition):
        store.transition(job.id, Q, expect=())


def race_to_start(store: Store, job_id: str, threads: int = 8) -> tuple[list[int], list[BaseException]]:
    """`threads` workers try QUEUED -> STARTING on one job at the same moment; returns the winners and the errors."""
    barrier = threading.Barrier(threads)
    wins: list[int] = []
    losses: list[BaseException] = []

    def start(worker: int) -> None:
        barrier.wait()
        try:
            store.transition(job_id, S, expect={Q}, attempts=1, reason=f"worker {worker}")
            wins.append(worker)
        except BaseException as exc:  # collected, asserted on by the caller
            losses.append(exc)

    workers = [threading.Thread(target=start, args=(w,)) for w in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return wins, losses


def test_exactly_one_of_8_threads_wins_the_start_race(store: Store) -> None:
    for _ in range(5):
        job = store.add(simple_spec(), now=0)
        wins, losses = race_to_start(store, job.id)
        assert len(wins) == 1, f"expected exactly one winner, got workers {wins}"
        assert len(losses) == 7 and all(isinstance(e, InvalidTransition) for e in losses), losses
        final = store.get(job.id)
        assert final is not None
        assert (final.state, final.version, final.attempts, final.reason) == (S, 2, 1, f"worker {wins[0]}")


def test_expect_version_serialises_read_modify_write_from_8_threads(store: Store) -> None:
    job = store.add(simple_spec(), now=0)
    per_thread = 10

    def bump() -> None:
        done = 0
        while done < per_thread:
            current = store.get(job.id)
            assert current is not None
            try:
                store.update(job.id, expect_version=current.version, attempts=current.attempts + 1)
                done += 1
            except StaleJob:
                continue

    threads = [threading.Thread(target=bump) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = store.get(job.id)
    assert final is not None
    assert (final.attempts, final.version) == (8 * per_thread, 1 + 8 * per_thread)  # no update was lost


def test_update_bumps_version_and_checks_expect_version(store: Store) -> None:
    job = store.add(simple_spec(), now=0)
    v2 = store.update(job.id, reason="waiting: 0/1 nodes fit")
    assert (v2.version, v2.state, v2.reason) == (2, Q, "waiting: 0/1 nodes fit")
    v3 = store.update(job.id, expect_version=2, not_before=30)
    assert (v3.version, v3.not_before) == (3, 30.0)
    assert store.update(job.id).version == 4  # a write with no fields still counts as a write
    with pytest.raises(StaleJob) as info:
        store.update(job.id, expect_version=2, reason="lost the race")
    assert isinstance(info.value, InvalidRequest)
    assert (info.value.field, info.value.expected, info.value.actual) == ("version", 2, 4)
    assert str(info.value) == "version: job 1 changed since it was read (version 4, expected 2); read it again"
    stored = store.get(job.id)
    assert stored is not None and (stored.version, stored.reason) == (4, "waiting: 0/1 nodes fit")


def test_update_many_is_all_or_nothing(store: Store) -> None:
    ids = [store.add(simple_spec(), now=0).id for _ in range(3)]
    done = store.update_many({ids[2]: {"reason": "c"}, ids[0]: {"reason": "a", "not_before": 5}})
    assert [(j.id, j.reason, j.version) for j in done] == [(ids[2], "c", 2), (ids[0], "a", 2)]
    first = store.get(ids[0])
    assert first is not None and (first.reason, first.not_before) == ("a", 5.0)
    with pytest.raises(JobNotFound):
        store.update_many({ids[1]: {"reason": "b"}, "99": {"reason": "x"}})
    with pytest.raises(ValueError, match="unknown job field"):
        store.update_many({ids[1]: {"reason": "b"}, ids[2]: {"colour": "x"}})
    untouched = store.get(ids[1])
    assert untouched is not None and (untouched.reason, untouched.version) == ("", 1)
    assert [j.reason for j in store.list([Q])] == ["a", "", "c"]
    assert store.update_many({}) == []


def test_documents_put_get_list_delete_with_versions(store: Store) -> None:
    assert store.get_doc("metronome.job", "a") is None and store.list_docs("metronome.job") == []
    assert store.put_doc("metronome.job", "b", {"id": "b", "run": {"cpus": 1}}, expect_version=0) == 1
    assert store.put_doc("metronome.job", "a", {"id": "a"}) == 1
    assert store.put_doc("marathon.app", "a", {"id": "/a"}) == 1  # kinds are separate
    assert store.put_doc("metronome.job", "a", {"id": "a", "x": [1, "é"]}, expect_version=1) == 2
    assert store.get_doc("metronome.job", "a") == ({"id": "a", "x": [1, "é"]}, 2)
    assert [(k, v) for k, _, v in store.list_docs("metronome.job")] == [("a", 2), ("b", 1)]
    with pytest.raises(StaleDocument) as info:
        store.put_doc("metronome.job", "a", {"id": "a"}, expect_version=1)
    assert str(info.value) == (
        "version: metronome.job 'a' changed since it was read (version 2, expected 1); read it again"
    )
    with pytest.raises(StaleDocument):
        store.put_doc("metronome.job", "b", {}, expect_version=0)  # exists already
    with pytest.raises(StaleDocument):
        store.delete_doc("metronome.job", "a", expect_version=1)
    assert store.delete_doc("metronome.job", "a", expect_version=2) is True
    assert store.delete_doc("metronome.job", "a") is False
    assert store.get_doc("metronome.job", "a") is None
    body = {"nested": {"list": [1, 2]}}
    store.put_doc("k", "doc", body)
    body["nested"]["list"].append(3)  # the stored copy does not follow the caller's dict
    assert store.get_doc("k", "doc") == ({"nested": {"list": [1, 2]}}, 1)


@pytest.mark.parametrize(
    ("kind", "key", "body", "error"),
    [
        ("", "k", {}, ValueError),
        ("k", "", {}, ValueError),
        ("k", "k", [], TypeError),
        ("k", "k", {"x": float("nan")}, ValueError),
        ("k", "k", {"x": object()}, TypeError),
    ],
)
def test_documents_that_cannot_be_stored(store: Store, kind: str, key: str, body: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        store.put_doc(kind, key, body)
    assert store.list_docs(kind or "k") == []


def test_unknown_job(store: Store) -> None:
    store.add(simple_spec(), now=0)
    for job_id in ("2", "99", "01", "0", "-1", "abc", "", "1 ", "١", "9" * 40):
        assert store.get(job_id) is None, job_id
        with pytest.raises(JobNotFound) as info:
            store.transition(job_id, S)
        assert info.value.job_id == job_id
        with pytest.raises(JobNotFound):
            store.update(job_id, reason="x")
    assert isinstance(info.value, InvalidRequest)
    assert str(JobNotFound("99")) == "job: no job 99"


def test_a_write_may_set_the_whole_spec(store: Store) -> None:
    """A waiting job's hold and update (corral.daemon.core.Daemon.hold/update) store its changed spec."""
    job = store.add(simple_spec(), now=0)
    renamed = dataclasses.replace(job.spec, name="renamed")
    assert store.update(job.id, spec=renamed).spec == renamed
    got = store.get(job.id)
    assert got is not None and got.spec == renamed and got.version == job.version + 1


def test_fields_a_write_cannot_set(store: Store) -> None:
    job = store.add(simple_spec(), now=0)
    with pytest.raises(ValueError, match="unknown job field 'colour'"):
        store.update(job.id, colour="red")
    with pytest.raises(ValueError, match="unknown job field 'exitcode'"):
        store.transition(job.id, S, exitcode=0)
    with pytest.raises(ValueError, match="only through transition"):
        store.update(job.id, state=R)
    for fixed in ("id", "version", "submitted_at"):
        with pytest.raises(ValueError, match=f"{fixed}' is set by the store"):
            fields: dict[str, Any] = {fixed: "7"}
            store.update(job.id, **fields)
    with pytest.raises(TypeError, match="'spec' cannot be '7'"):
        store.update(job.id, spec="7")
    with pytest.raises(TypeError, match="'pid' cannot be 'x'"):
        store.update(job.id, pid="x")
    with pytest.raises(TypeError, match="'attempts' cannot be None"):
        store.update(job.id, attempts=None)
    with pytest.raises(TypeError, match="GpuGrant"):
        store.update(job.id, gpus=[(0, 1000, 0)])
    with pytest.raises(ValueError, match="not a valid JobState"):
        store.transition(job.id, "sleeping")  # type: ignore[arg-type]
    assert store.get(job.id) == job  # nothing was written


def test_closed_store_raises_store_error(store: Store) -> None:
    job = store.add(simple_spec(), now=0)
    store.close()
    store.close()  # twice is harmless
    calls: list[Callable[[], object]] = [
        lambda: store.add(simple_spec(), now=0),
        lambda: store.get(job.id),
        lambda: store.list(),
        lambda: store.transition(job.id, S),
        lambda: store.update(job.id, reason="x"),
    ]
    for call in calls:
        with pytest.raises(StoreError, match="closed"):
            call()


def test_open_store() -> None:
    assert isinstance(open_store(None), MemoryStore)
    assert isinstance(open_store(None), Store)


# ------------------------------------------------------------------------------------------------- SQLite only
def test_sqlite_reopen_keeps_everything_and_ids_continue(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = open_store(path)
    assert isinstance(store, SqliteStore)
    a = store.add(full_spec(), now=1.0)
    b = store.add(simple_spec(user="carol"), now=2.0)
    b = store.transition(b.id, S, gpus=(GpuGrant(1, 1000, 81920),), gpu_uuids=("GPU-1",), attempts=1, started_at=3)
    b = store.update(b.id, pid=77, pid_start_time=123)
    before = store.list()
    store.close()

    store = SqliteStore(path)
    try:
        assert store.list() == before == [a, b]
        assert store.add(simple_spec(), now=4.0).id == "3"
        assert store.transition(b.id, R).version == b.version + 1
    finally:
        store.close()


def test_sqlite_sees_what_another_connection_committed(tmp_path: Path) -> None:
    # Unfinished jobs are also kept in memory; a write through another connection (another process on the file)
    # must still be seen by the next read, and a compare-and-set must still compare with what is stored.
    first = SqliteStore(tmp_path / "jobs.db")
    other = SqliteStore(tmp_path / "jobs.db")
    try:
        job = first.add(simple_spec(), now=0)
        assert [j.id for j in first.list([Q])] == [job.id]
        other.transition(job.id, S, reason="started elsewhere")
        other.add(simple_spec("bob"), now=1)
        assert [(j.id, j.state) for j in first.list([Q, S])] == [(job.id, S), ("2", Q)]
        seen = first.get(job.id)
        assert seen is not None and seen.reason == "started elsewhere" and seen.version == 2
        with pytest.raises(InvalidTransition):
            first.transition(job.id, S, expect=[Q])
        other.transition(job.id, R)
        other.transition(job.id, JobState.SUCCEEDED)
        assert first.list([Q, S, R]) == [first.get("2")]
        finished = first.get(job.id)
        assert finished is not None and finished.state is JobState.SUCCEEDED
    finally:
        first.close()
        other.close()


def test_sqlite_memory_copy_follows_a_rolled_back_write(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    try:
        job = store.add(simple_spec(), now=0)
        with pytest.raises(JobNotFound):
            store.update_many({job.id: {"reason": "never stored"}, "42": {"reason": "x"}})
        stored = store.get(job.id)
        assert stored is not None and stored.reason == "" and stored.version == 1
        assert store.list([Q]) == [stored]
    finally:
        store.close()


def test_sqlite_schema_1_file_is_upgraded_and_keeps_its_jobs(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(path)
    job = store.add(full_spec(), now=3)
    store.close()
    old = sqlite3.connect(path)  # what the previous corral wrote: schema 1, no documents table
    old.execute("DROP TABLE docs")
    old.execute("DROP TABLE idempotency")
    old.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    old.commit()
    old.close()
    store = SqliteStore(path)
    try:
        assert store.get(job.id) == job
        assert store.put_doc("k", "a", {"x": 1}) == 1 and store.get_doc("k", "a") == ({"x": 1}, 1)
        version = store._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
        assert version == str(SCHEMA_VERSION)
    finally:
        store.close()


def test_idempotency_key_returns_the_first_job_and_stores_nothing_new(store: Store) -> None:
    first = store.add(simple_spec(name="a"), now=10, idempotency_key="k-1")
    with pytest.raises(KeyInUse) as caught:
        store.add(simple_spec(name="b"), now=11, idempotency_key="k-1")
    assert caught.value.job == first and caught.value.field == "idempotency_key"
    assert [j.id for j in store.list()] == [first.id]
    assert store.by_idempotency_key(1000, "k-1", now=12) == first
    # keys are per user, and a key of another user (or no key) is a new job
    bob = JobSpec(("true",), Request(cpu_milli=1000, memory_mib=512), "bob", 1001, 1001)
    other = store.add(bob, now=13, idempotency_key="k-1")
    assert other.id != first.id and store.by_idempotency_key(1001, "k-1", now=14) == other
    assert store.add(simple_spec(), now=15).id not in (first.id, other.id)
    assert store.by_idempotency_key(1000, "unknown", now=15) is None


def test_idempotency_key_expires(store: Store) -> None:
    first = store.add(simple_spec(), now=0, idempotency_key="k")
    assert store.by_idempotency_key(1000, "k", now=IDEMPOTENCY_TTL_S - 1) == first
    assert store.by_idempotency_key(1000, "k", now=IDEMPOTENCY_TTL_S) is None
    again = store.add(simple_spec(), now=IDEMPOTENCY_TTL_S, idempotency_key="k")
    assert again.id != first.id and store.by_idempotency_key(1000, "k", now=IDEMPOTENCY_TTL_S + 1) == again


def test_only_one_of_8_threads_with_one_key_stores_a_job(store: Store) -> None:
    made: list[str] = []
    replayed: list[str] = []

    def submit() -> None:
        try:
            made.append(store.add(simple_spec(), now=1, idempotency_key="same").id)
        except KeyInUse as exc:
            replayed.append(exc.job.id)

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and replayed == made * 7 and len(store.list()) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"command": ("bad\x00arg",)},
        {"command": ("x\ud800",)},
        {"name": "bell\x07"},
        {"env": {"A=B": "1"}},
        {"env": {"": "1"}},
        {"env": {"K": "v\x00"}},
        {"cwd": "relative/../../etc"},
        {"cwd": "/tmp\x00"},
        {"command": ("x" * (200 * 1024), "y" * (100 * 1024))},
    ],
    ids=repr,
)
def test_a_spec_that_would_fail_at_launch_is_never_stored(store: Store, change: dict[str, Any]) -> None:
    spec = dataclasses.replace(simple_spec(), **change)
    with pytest.raises(InvalidRequest):
        store.add(spec, now=1)
    assert store.list() == []


def test_sqlite_schema_2_file_gains_the_idempotency_table(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(path)
    job = store.add(simple_spec(), now=3)
    store.close()
    old = sqlite3.connect(path)
    old.execute("DROP TABLE idempotency")
    old.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    old.commit()
    old.close()
    store = SqliteStore(path)
    try:
        assert store.get(job.id) == job
        keyed = store.add(simple_spec(), now=4, idempotency_key="k")
        assert store.by_idempotency_key(1000, "k", now=5) == keyed
    finally:
        store.close()


def test_sqlite_is_wal_with_synchronous_full(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(path)
    try:
        store.add(simple_spec(), now=0)
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert store._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 10_000
        other = sqlite3.connect(path)
        try:
            assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            version = other.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
            assert version == str(SCHEMA_VERSION)
        finally:
            other.close()
    finally:
        store.close()


_CHILD = """
import sys
from pathlib import Path
from corral.jobs.model import JobSpec
from corral.model.resources import Request
from corral.store import SqliteStore

store = SqliteStore(Path(sys.argv[1]))
for i in range(1_000_000):
    spec = JobSpec(("echo", str(i)), Request(cpu_milli=1000, gpu_count=1, gpu_milli=250), "u", 1, 1,
                   name=f"job-{i}", env={"I": str(i)})
    job = store.add(spec, now=float(i))
    print(job.id, i, flush=True)
"""


def test_sqlite_acknowledged_adds_survive_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    acknowledged: dict[str, int] = {}
    # Kill after a few acks, then mid-stream at different moments; each round reopens what the last one left.
    for acks, delay in ((1, 0.0), (20, 0.0), (5, 0.001), (30, 0.003), (10, 0.007), (60, 0.011)):
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        lines: list[str] = []
        try:
            while len(lines) < acks:
                line = child.stdout.readline()
                assert line, f"child exited early: {child.wait()} {child.stderr.read() if child.stderr else ''}"
                lines.append(line)
            time.sleep(delay)
            os.kill(child.pid, signal.SIGKILL)
        finally:
            if child.poll() is None:
                child.kill()
            rest, _ = child.communicate(timeout=10)
        assert child.returncode == -signal.SIGKILL
        lines += rest.splitlines(keepends=True)
        for line in lines:
            if line.endswith("\n"):  # a line cut by the kill was never acknowledged
                job_id, index = line.split()
                assert job_id not in acknowledged, f"id {job_id} was given out twice"
                acknowledged[job_id] = int(index)

        store = SqliteStore(path)
        try:
            stored = {job.id: job for job in store.list()}
        finally:
            store.close()
        missing = sorted(set(acknowledged) - set(stored), key=int)
        assert not missing, f"acknowledged jobs lost after kill -9: {missing}"
        for job_id, i in acknowledged.items():
            job = stored[job_id]
            assert (job.spec.name, dict(job.spec.env), job.spec.command) == (
                f"job-{i}",
                {"I": str(i)},
                ("echo", str(i)),
            )
            assert (job.state, job.version, job.submitted_at) == (Q, 1, float(i))
    assert len(acknowledged) >= 126
    check = sqlite3.connect(path)
    try:
        assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        check.close()


def test_sqlite_unwritable_path_is_a_store_error(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "plain-file"
    not_a_folder.write_text("x")
    for path in (not_a_folder / "jobs.db", tmp_path / "missing" / "jobs.db"):
        with pytest.raises(StoreError) as info:
            SqliteStore(path)
        assert str(path) in str(info.value)
        assert "unable to open database file (does the folder exist, and may corral write to it?)" in str(info.value)


def test_sqlite_garbage_file_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    path.write_bytes(b"this is not a database, it is a shopping list\n" * 200)
    with pytest.raises(StoreError) as info:
        SqliteStore(path)
    assert not isinstance(info.value, sqlite3.Error)
    assert str(info.value) == (
        f"job store {path}: cannot open it: file is not a database"
        " (the file is not a corral job store, or it is damaged)"
    )


def test_sqlite_damaged_pages_are_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(path)
    for i in range(40):
        store.add(full_spec(), now=float(i))
    store.close()
    data = bytearray(path.read_bytes())
    assert len(data) > 3 * 4096
    data[4096:] = b"\xa5" * (len(data) - 4096)  # everything after the header page
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"malformed .*damaged") as info:
        damaged = SqliteStore(path)  # SQLite finds the damage on open here; a subtler one would surface on a read
        try:
            damaged.list()
        finally:
            damaged.close()
    assert str(path) in str(info.value)


def test_sqlite_foreign_database_and_newer_schema_are_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "other.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match=r"not a corral job store \(it has tables users\)"):
        SqliteStore(foreign)

    path = tmp_path / "jobs.db"
    SqliteStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="schema version 99 was written by a newer corral; upgrade corral"):
        SqliteStore(path)


def test_sqlite_unreadable_row_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(path)
    try:
        store.add(simple_spec(), now=0)
        raw = sqlite3.connect(path)
        raw.execute("UPDATE jobs SET spec = '{not json' WHERE id = 1")
        raw.commit()
        raw.close()
        with pytest.raises(StoreError, match=r"job 1 cannot be read"):
            store.get("1")
        with pytest.raises(StoreError, match=r"job 1 cannot be read"):
            store.transition("1", S)
    finally:
        store.close()


def test_sqlite_locked_by_another_process_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(path, busy_timeout_s=0.05)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreError, match=r"database is locked .*second corral serve"):
            store.add(simple_spec(), now=0)
        holder.execute("ROLLBACK")
        assert store.add(simple_spec(), now=0).id == "1"  # the failed add used no id, and the store still works
    finally:
        holder.close()
        store.close()
