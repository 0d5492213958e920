"""A cluster's tens of thousands of running jobs are summed as numpy columns; one machine's few job by job. The two
must give the same holdings, the same borrowers and the same order of accounts (issue 25: the k8s round's scale)."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
import pytest

from corral.model.resources import GpuGrant, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.tenancy import preemption, quota
from corral.tenancy.config import Vector, parse_queues
from corral.tenancy.fairshare import amount
from corral.tenancy.model import Running, Work
from corral.tenancy.preemption import Pool, candidates, choose, protected
from corral.tenancy.queues import Tenancy
from tests.builders import cluster, node

QUEUES = parse_queues(
    "[queues.a]\nguarantee = { gpus = 6 }\n[queues.b]\nguarantee = { gpus = 3, cpus = 40 }\n[queues.c]\n",
    "q.toml",
)


def jobs(seed: int, n: int) -> list[Running]:
    """Running jobs over queues a, b, c and one not in the file, users u0-u3 (two gids for u0), starts with ties."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(0, 3))
        gpus = tuple(GpuGrant(j, 1000 if k else 500, 0 if k else 4096) for j in range(k))
        r = Request(cpu_milli=int(rng.integers(1, 16)) * 1000, memory_mib=1024 * int(rng.integers(1, 8)),
                    gpu_count=k, gpu_milli=1000 if k else 0)  # fmt: skip
        user = f"u{int(rng.integers(0, 4))}"
        queue = ("a", "b", "c", "elsewhere")[int(rng.integers(0, 4))]
        jid = str(i) if rng.random() < 0.5 else f"job-{i}"
        start = float(rng.integers(0, n // 3 + 1))
        out.append(Running(jid, r, start, gpus, queue, user, gid=int(rng.integers(0, 2)) if user == "u0" else 7))
    return out


def groups(user: str, gid: int) -> tuple[str, ...]:
    return ("lab", f"g{gid}") if user in ("u0", "u1") else ()


def held(job: Running) -> Vector:
    return quota.held(job, lambda i: 81920)


@pytest.mark.parametrize("seed", range(8))
def test_measure_by_columns_is_measure_job_by_job(seed: int) -> None:
    running = jobs(seed, 600)
    by_start = sorted(running, key=quota.start_key)
    one = quota._measure_jobs(QUEUES, by_start, held, groups)
    many = quota.measure_columns(QUEUES, quota.JobColumns.of(running, held), groups)
    assert one.borrowing_ids and one.borrowing_ids != {j.id for j in running}  # some borrow, not all
    for name in ("queue", "queue_user", "queue_group", "user", "group", "running", "borrowed"):
        a, b = getattr(one, name), getattr(many, name)
        assert a == b, name
    for name in ("queue", "queue_user", "user", "running"):  # what lists them shows them in the same order
        assert list(getattr(one, name)) == list(getattr(many, name)), name
    assert one.borrowing_ids == many.borrowing_ids
    assert one.queue_of_borrower == many.queue_of_borrower
    # and `measure` takes the columns from COLUMNS_FROM jobs on
    assert len(running) >= quota.COLUMNS_FROM
    assert quota.measure(QUEUES, running, held, groups).borrowing_ids == one.borrowing_ids


def test_usages_are_the_ledgers_sums_to_the_last_bit() -> None:
    """Tenancy.usages groups a round's running jobs per account as columns (kept while the same jobs run); each
    account's decayed usage is exactly UsageLedger.usage's job-by-job sum, with or without history, and with none
    running (serve's first round)."""
    t = Tenancy(QUEUES, amount(8000, 8 * 81920, 64000, 512 * 1024), 81920, lambda i: 81920)
    assert t.usages([], 100.0) == {}
    running = [*jobs(3, 300), Running("waiting", Request(gpu_count=1, gpu_milli=1000), None, (), "a", "u1")]
    t.record(running[0], 50.0)  # some history: a finished run of the first job's accounts
    now = 2_000.0
    for _ in range(2):  # made, then kept
        got = t.usages(running, now)
        for acc in {("queue", j.queue) for j in running if j.started_at is not None} | {
            ("user", j.queue, j.user) for j in running if j.started_at is not None
        }:
            mine = [
                (t.held_vector(j), j.started_at)
                for j in running
                if j.started_at is not None and (("queue", j.queue) == acc or ("user", j.queue, j.user) == acc)
            ]
            want = t.ledger.usage(acc, now, [(a, s) for a, s in mine if s is not None])
            assert np.array_equal(got[acc], want), acc
        now += 60.0


def test_the_kept_columns_follow_jobs_that_come_and_go() -> None:
    """A face's Tenancy keeps its running jobs' rows between rounds; as jobs end and start (and the store is
    compacted), its holdings, borrowers and usages stay those of a fresh, job-by-job count."""
    t = Tenancy(QUEUES, amount(8000, 8 * 81920, 64000, 512 * 1024), 81920, lambda i: 81920)
    pool = jobs(11, 3000)
    running = pool[:900]
    rng = np.random.default_rng(5)
    stored = []
    taken = 900
    for step in range(10):
        got = t._measure(running)
        ranked = [t._store.keys[r] for r in t._store.ranked]  # the store's rows by start key, new ones merged in
        assert all(a < b for a, b in itertools.pairwise(ranked)) and len(ranked) == len(t._store.jobs)
        want = quota._measure_jobs(QUEUES, sorted(running, key=quota.start_key), held, groups)
        assert (got.queue, got.queue_user, got.borrowing_ids) == (want.queue, want.queue_user, want.borrowing_ids)
        usages = t.usages(running, 5000.0 + step)
        for acc in [("queue", q) for q in {j.queue for j in running}]:
            mine = [(t.held_vector(j), s) for j in running if j.queue == acc[1] and (s := j.started_at) is not None]
            assert np.array_equal(usages[acc], t.ledger.usage(acc, 5000.0 + step, mine)), (step, acc)
        # some end, some start (new objects), the rest keep running in a new list; every other round only a few
        # start among many (each put in its place in the ranked store, not the whole store sorted again)
        stored.append(len(t._store.jobs))
        few = step % 2 == 1
        keep = [j for j in running if rng.random() > (0.01 if few else 0.6)]
        k = 3 if few else 350
        fresh = pool[taken : taken + k]
        taken += k
        running = keep + fresh
    assert any(b < a for a, b in itertools.pairwise(stored))  # the store was compacted on the way


@pytest.mark.parametrize("seed", range(6))
def test_the_candidates_from_the_columns_are_the_rules_job_by_job(seed: int) -> None:
    """With a cluster's running jobs measured as columns, `preemption.candidates` takes them from the columns
    (Rules.victims): the same victims, in the same order, with the same reasons, run time lost (to the bit) and
    minimum runtimes, as asking the rules job by job; preemptors of each priority, from each queue."""
    rng = np.random.default_rng(seed)
    queues = parse_queues(
        'min_runtime = "5m"\n[queues.a]\nguarantee = { gpus = 6 }\nmin_runtime = "10m"\n'
        "[queues.b]\nguarantee = { gpus = 3, cpus = 40 }\n[queues.c]\n",
        "q.toml",
    )
    t = Tenancy(queues, amount(8000, 8 * 81920, 64000, 512 * 1024), 81920, lambda i: 81920)
    s = cluster(*(node(f"n{i}").gpus(8).cpu(256).mem(2048) for i in range(200)))
    running: list[Running] = []
    for j in jobs(seed, 700):
        prio = int(rng.choice([0, 0, 5, 9]))
        r = dataclasses.replace(
            j,
            request=dataclasses.replace(j.request, priority=prio),
            preemptible=bool(rng.random() > 0.2),
            stopping=bool(rng.random() < 0.1),
        )
        d = place(s, dataclasses.replace(r.request, id=r.id), PlacementConfig(policy="binpack"), rng)
        if d.allocation is None:
            continue
        s.allocate(d.allocation)
        running.append(dataclasses.replace(r, gpus=d.allocation.gpus) if r.gpus else r)
    assert len(running) >= quota.COLUMNS_FROM
    t.plan_queues({}, running, (0, 0, 0, 0, 0), 10_000.0, 3600.0)  # the round measures them as columns
    rules = t.preemption_rules()
    assert rules.victims is not None
    head = Work("head", Request(gpu_count=1, gpu_milli=1000, priority=10), "c", "u9")
    assert rules.victims(head, running, 10_000.0, s) is not None  # the columns describe these jobs
    one_by_one = dataclasses.replace(rules, victims=None)
    for queue in ("a", "b", "c"):
        for prio in (0, 5, 10):
            head = Work("head", Request(gpu_count=1, gpu_milli=1000, priority=prio), queue, "u9")
            fast = candidates(s, head, running, 10_000.0, rules)
            slow = candidates(s, head, running, 10_000.0, one_by_one)
            assert isinstance(fast, Pool)
            assert list(fast) == slow, (queue, prio)
            assert fast[-1:] == slow[-1:] and (not slow or fast[0] == slow[0])
    assert any(candidates(s, Work("h", Request(gpu_count=1, gpu_milli=1000, priority=10), "c", "u9"), running,
                          10_000.0, rules))  # fmt: skip


def _busy_cluster(seed: int, started: tuple[float, float]) -> tuple[Tenancy, ClusterSnapshot, list[Running]]:
    """130 nodes of 8 GPUs, full: jobs of 1, 2 and 4 GPUs of queues a (a borrower), b and c, started in `started`,
    some of a higher priority, some not preemptible; measured as columns by a round."""
    rng = np.random.default_rng(seed)
    queues = parse_queues(
        'min_runtime = "5m"\n[queues.a]\nguarantee = { gpus = 40 }\n[queues.b]\nguarantee = { gpus = 300 }\n'
        "[queues.c]\nguarantee = { gpus = 140 }\n",
        "q.toml",
    )
    s = cluster(*(node(f"n{i}").gpus(8).cpu(int(rng.choice([64, 256]))).mem(2048) for i in range(130)))
    t = Tenancy(queues, amount(1040 * 1000, 1040 * 81920, 130 * 256 * 1000, 130 * 2048 * 1024), 81920, lambda i: 81920)
    running: list[Running] = []
    k = 0
    while s.gpu_full_free.sum():
        size = int(rng.choice([1, 1, 1, 1, 1, 2, 4]))
        if size > int(s.gpu_full_free.max()):
            size = 1
        queue = ("a", "a", "a", "c")[int(rng.integers(0, 4))]
        r = Request(cpu_milli=1000 * int(rng.integers(1, 24)), memory_mib=1024, gpu_count=size, gpu_milli=1000,
                    priority=int(rng.choice([0, 0, 0, 9])), id=str(k) if k % 3 else f"pod-{k}")  # fmt: skip
        d = place(s, r, PlacementConfig(policy="binpack"), rng)
        if d.allocation is None:  # (the CPU of a 64-core node ran out first)
            r = dataclasses.replace(r, cpu_milli=0, gpu_count=1)
            d = place(s, r, PlacementConfig(policy="binpack"), rng)
        assert d.allocation is not None
        s.allocate(d.allocation)
        start = float(rng.uniform(*started))
        running.append(Running(r.id, r, start, d.allocation.gpus, queue, f"u{k % 5}", preemptible=k % 11 != 0))
        k += 1
    assert len(running) >= quota.COLUMNS_FROM
    t.plan_queues({}, running, (0, 0, 0, 0, 0), 10_000.0, 3600.0)
    return t, s, running


@pytest.mark.parametrize("seed", range(6))
def test_the_search_from_the_columns_is_the_search_over_the_list(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """`choose` and `protected` handed the candidates as columns (a Pool: the nodes ranked and bounded with numpy,
    Victims made only for the nodes searched) decide exactly as handed the same candidates as a list: the same
    victims, the same grant, the same number of placements, the same words; and the same protected time and pods,
    from the same nodes in the same order, each with the same fewest candidates that could make room."""
    searched: list[list[tuple[float, int, int]]] = []
    search = preemption._protected_search

    def recorded(*args: Any) -> Any:
        searched.append(list(args[3]))
        return search(*args)

    monkeypatch.setattr(preemption, "_protected_search", recorded)
    for started, size in (((2_000.0, 9_600.0), 8), ((2_000.0, 9_600.0), 4), ((9_000.0, 9_900.0), 8),
                          ((9_750.0, 9_990.0), 8), ((9_750.0, 9_990.0), 2)):  # fmt: skip
        t, s, running = _busy_cluster(seed, started)
        rules = t.preemption_rules()
        for prio in (0, 5):
            head = Work("head", Request(cpu_milli=8000, memory_mib=1024, gpu_count=size, gpu_milli=1000,
                                        priority=prio), "b", "u9")  # fmt: skip
            pool = candidates(s, head, running, 10_000.0, rules)
            assert isinstance(pool, Pool) and len(pool) > 100
            listed = list(pool)
            fast = choose(s, head, running, PlacementConfig(policy="binpack"), 10_000.0, rules, found=pool)
            slow = choose(s, head, running, PlacementConfig(policy="binpack"), 10_000.0, rules, found=listed)
            assert fast == slow, (started, size, prio)
            searched.clear()
            later = protected(s, head, running, PlacementConfig(policy="binpack"), 10_000.0, rules, pool)
            assert later == protected(s, head, running, PlacementConfig(policy="binpack"), 10_000.0, rules, listed)
            assert len(searched) in (0, 2) and searched[:1] == searched[1:]  # (none: no candidate is protected)
            if started[0] > 9_700.0:  # every victim protected: no choice, but a time it helps
                assert fast is None and later is not None and len(searched[0]) > 10
            elif size == 4 or prio == 0:
                assert fast is not None


def test_a_tuple_handed_in_again_is_known_without_a_walk_and_decides_the_same() -> None:
    """A face that hands in the very same tuple of running jobs (a full cluster's rounds) gets its ids made once; a
    list (which may have changed in place) is read again every time; both give a fresh count's holdings."""
    t = Tenancy(QUEUES, amount(8000, 8 * 81920, 64000, 512 * 1024), 81920, lambda i: 81920)
    running = tuple(jobs(12, 700))
    ids = t._ids(running)
    assert t._ids(running) is ids and ids == [id(j) for j in running]
    as_list = list(running)
    assert t._ids(as_list) is not t._ids(as_list)
    for holding in (running, as_list, running):
        got = t._measure(holding)
        want = quota._measure_jobs(QUEUES, sorted(running, key=quota.start_key), held, groups)
        assert (got.queue, got.queue_user, got.borrowing_ids) == (want.queue, want.queue_user, want.borrowing_ids)
    as_list.pop()  # changed in place: not the kept jobs any more
    assert t._measure(as_list).running != t._measure(running).running
