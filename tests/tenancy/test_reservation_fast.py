"""The head's reservation on a cluster: book_fast (bisection, columns kept between rounds) books exactly what book
does, and a reservation waits only for jobs on its own node."""

from __future__ import annotations

import numpy as np
import pytest

from corral.model.resources import Allocation, GpuGrant
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.tenancy.reservation import FastBooker, book, book_fast, intersect
from tests.builders import cluster, gpus, node

CONFIG = PlacementConfig(policy="binpack")


def busy(seed: int, nodes: int = 12) -> tuple[ClusterSnapshot, dict[str, float]]:
    """`nodes` 4-GPU nodes filled with 1-, 2- and 4-GPU jobs, halves of GPUs and CPU-only jobs, each with an
    expected end."""
    rng = np.random.default_rng(seed)
    s = cluster(*(node(f"n{i}").gpus(4).cpu(32).mem(128) for i in range(nodes)))
    ends: dict[str, float] = {}
    for k in range(nodes * 6):
        size = int(rng.choice([0, 1, 1, 2, 4, -1]))  # -1: half a GPU (a share, no owner)
        ask = gpus(1, milli=500, cpu=2000, id=f"j{k}") if size < 0 else gpus(max(size, 1), cpu=2000, id=f"j{k}")
        d = place(s, ask, CONFIG, rng)
        if d.allocation is None:
            continue
        a = d.allocation
        if not size:  # a CPU-only job where a GPU job would have gone
            a = Allocation(a.request_id, a.node, a.node_index, a.cpu_milli, a.memory_mib, (), 0)
        s.allocate(a)
        ends[a.request_id] = float(rng.integers(1, 40)) * 60.0
    return s, ends


@pytest.mark.parametrize("seed", range(10))
def test_book_fast_books_what_book_does(seed: int) -> None:
    s, ends = busy(seed)
    booker = FastBooker()
    for size in (1, 2, 4):
        want = book(s, gpus(size, id="head"), ends, CONFIG)
        for got in (book_fast(s, gpus(size, id="head"), ends, CONFIG), booker(s, gpus(size, id="head"), ends, CONFIG)):
            assert (want is None) == (got is None)
            if want is not None and got is not None:
                assert got.reservation == want.reservation
                assert got.shadow.allocations == want.shadow.allocations
    # the columns kept between rounds follow the books: a job ends, another starts, ends move
    gone = next(iter(ends))
    s.release(gone)
    del ends[gone]
    d = place(s, gpus(1, id="new"), CONFIG, np.random.default_rng(0))
    if d.allocation is not None:
        s.allocate(d.allocation)
        ends["new"] = 600.0
    ends = {k: e + 30.0 for k, e in ends.items()}
    ends["ghost"] = 450.0  # an end of nothing the books hold (a pod gone meanwhile): left out by both
    for size in (1, 2, 4):
        want = book(s, gpus(size, id="head"), ends, CONFIG)
        got = booker(s, gpus(size, id="head"), ends, CONFIG)
        assert (want is None) == (got is None)
        if want is not None and got is not None:
            assert got.reservation == want.reservation


def test_a_reservation_waits_only_for_jobs_on_its_node() -> None:
    """GPU 0 of both nodes ends at 10 min; the reservation is on one node, so only that node's job is named."""
    s = cluster(node("a").gpus(1), node("b").gpus(1))
    for name, i in (("a", 0), ("b", 1)):
        s.allocate(Allocation(f"on-{name}", name, i, 1000, 1024, (GpuGrant(0, 1000, 81920),), 1))
    b = book(s, gpus(1, id="head"), {"on-a": 600.0, "on-b": 600.0}, CONFIG)
    assert b is not None
    assert b.reservation.waits_for == (f"on-{b.reservation.allocation.node}",)


@pytest.mark.parametrize("seed", range(8))
def test_the_view_beside_a_reservation_follows_each_start_row_by_row(seed: int) -> None:
    """After each start (one that outlives the reservation, granted in both books, or one that ends before it, in
    `now` only) the view a backfilled job is placed on is exactly `intersect(now, shadow)` made afresh, in every
    column the engine reads, though only the started job's node was made again; shares of an owner included."""
    s, ends = busy(seed)
    for j in list(ends)[::3]:  # room for starts
        s.release(j)
        del ends[j]
    for i in range(0, len(s), 3):  # some shares of an owner where half GPUs are free
        d = place(s, gpus(1, milli=250, id=f"own{i}", share_owner="team"), CONFIG, np.random.default_rng(i))
        if d.allocation is not None:
            s.allocate(d.allocation)
            ends[d.allocation.request_id] = 600.0
    booking = book(s, gpus(4, id="head"), ends, CONFIG)
    assert booking is not None
    rng = np.random.default_rng(seed)
    started = 0
    for k in range(40):
        outlives = bool(rng.random() < 0.5)
        owner = "team" if rng.random() < 0.3 else ""
        ask = gpus(1, milli=250 if owner else 1000, cpu=1000, id=f"new{k}", share_owner=owner)
        d = place(booking.view() if outlives else booking.now, ask, CONFIG, rng)
        if d.allocation is None:
            continue
        booking.now.allocate(d.allocation)
        booking.took(d.allocation, outlives)
        started += 1
        view, fresh = booking.view(), intersect(booking.now, booking.shadow)
        for column in ("cpu_free", "mem_free", "gpu_milli_free", "gpu_mem_free", "gpu_free_total", "gpu_full_free",
                       "tag_counts", "gpu_owner", "gpu_owner_shares"):  # fmt: skip
            assert np.array_equal(getattr(view, column), getattr(fresh, column)), (k, column)
    assert started >= 10


@pytest.mark.parametrize("seed", range(8))
def test_book_fast_finds_nothing_where_book_finds_nothing(seed: int) -> None:
    """Where only some jobs are expected to end (the rest hold their GPUs for good, as pods of other schedulers do),
    a request may never fit: book_fast books nothing exactly where book books nothing, for whole GPUs (known
    without a placement) and for shares and CPU (the search runs to the last end), and the same where it fits."""
    s, ends = busy(seed)
    rng = np.random.default_rng(seed)
    nothing = 0
    held = s.allocations
    for name, some in (
        ("CPU-only jobs", {j: e for j, e in ends.items() if not held[j].gpus}),
        ("even nodes", {j: e for j, e in ends.items() if held[j].node_index % 2 == 0}),
        ("half", {j: e for j, e in ends.items() if rng.random() < 0.5}),
    ):
        keep = name
        for ask in (gpus(4, id="head"), gpus(2, id="head"), gpus(1, milli=500, cpu=30000, id="head"),
                    gpus(1, cpu=31000, id="head")):  # fmt: skip
            want = book(s, ask, some, CONFIG)
            got = book_fast(s, ask, some, CONFIG)
            assert (want is None) == (got is None), (keep, ask)
            if want is not None and got is not None:
                assert got.reservation == want.reservation
            nothing += want is None
    assert nothing >= 2


@pytest.mark.parametrize("seed", range(6))
def test_the_booker_gives_its_last_reservation_again_only_on_the_same_books(seed: int) -> None:
    """A full cluster's rounds ask the same head on the same books: FastBooker answers again from what it kept (the
    same reservation as `book`, its shadow untouched by the last round's starts), and books anew once the books,
    the ends or the request changed."""
    s, ends = busy(seed)
    for k in list(ends)[::3]:  # (room beside the reservation: a start there changes its shadow)
        s.release(k)
        del ends[k]
    booker = FastBooker()
    head = gpus(4, id="head")
    booked: list[int] = []
    real = book_fast

    def counted(*a: object, **k: object) -> object:
        booked.append(1)
        return real(*a, **k)  # type: ignore[arg-type]

    import corral.tenancy.reservation as reservation_mod

    want = book(s, head, ends, CONFIG)
    try:
        reservation_mod.book_fast = counted  # type: ignore[assignment]
        first = booker(s.copy(), head, ends, CONFIG)
        if want is None:
            assert first is None
            return
        assert first is not None and first.reservation == want.reservation
        beside = place(first.view(), gpus(1, id="backfilled"), CONFIG, np.random.default_rng(0)).allocation
        assert beside is not None  # a start that outlives the reservation changes this round's shadow ...
        if beside is not None:
            first.now.allocate(beside)
            first.took(beside, True)
        again = booker(s.copy(), head, ends, CONFIG)  # ... not the one kept: the next round sees the same books
        assert len(booked) == 1 and again is not None and again.reservation == want.reservation
        assert again.shadow.allocations == want.shadow.allocations
        if beside is not None:
            again.now.allocate(beside)
            again.took(beside, True)  # (copied before it changes: the kept shadow stays)
            assert booker(s.copy(), head, ends, CONFIG).shadow.allocations == want.shadow.allocations  # type: ignore[union-attr]
        # anything else: booked anew
        assert booker(s.copy(), gpus(4, id="head"), ends, CONFIG) is not None and len(booked) == 2  # another request
        other_ends = dict(ends)
        booker(s.copy(), head, other_ends, CONFIG)
        assert len(booked) == 3  # other ends (an equal mapping, but not the one kept)
        changed = s.copy()
        changed.release(next(iter(ends)))
        got = booker(changed, head, other_ends, CONFIG)
        assert len(booked) == 4  # other books
        fresh = book(changed, head, other_ends, CONFIG)
        assert (got is None) == (fresh is None) and (got is None or got.reservation == fresh.reservation)  # type: ignore[union-attr]
    finally:
        reservation_mod.book_fast = real
