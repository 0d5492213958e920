"""The fair-share arithmetic: decay by half-life, dominant shares, sshare's factor, and the interleaving order."""

from __future__ import annotations

import math
from collections.abc import Hashable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.model.errors import InvalidRequest
from corral.model.resources import Allocation, GpuGrant
from corral.tenancy.fairshare import (
    FairRuns,
    Offer,
    UsageLedger,
    amount,
    decayed_capacity,
    dominant_share,
    expected_usage,
    fair_order,
    held,
    running_usage,
    share_rows,
)

H = 3600.0


def numeric(a: np.ndarray, now: float, start: float, end: float, steps: int = 200_000) -> np.ndarray:
    """The decayed usage integral by the midpoint rule, to check the closed forms against."""
    ts = start + (np.arange(steps) + 0.5) * (end - start) / steps
    return a * float(np.sum(2.0 ** (-(now - ts) / H)) * (end - start) / steps)


def test_usage_of_a_finished_interval_is_the_decayed_integral() -> None:
    ledger = UsageLedger(H, origin=1_000_000.0)
    a = amount(gpu_milli=2000, cpu_milli=4000)
    ledger.record("ann", a, 1_000_000.0, 1_007_200.0)  # two GPUs for two hours
    now = 1_010_800.0
    got = ledger.usage("ann", now)
    assert np.allclose(got, numeric(a, now, 1_000_000.0, 1_007_200.0), rtol=1e-6)
    # An hour later it has halved: that is what a half-life means.
    assert np.allclose(ledger.usage("ann", now + H), got / 2, rtol=1e-12)


def test_running_usage_grows_towards_the_capacity_bound_and_adds_to_recorded() -> None:
    a = amount(gpu_milli=1000)
    assert np.allclose(running_usage(a, 0.0, H, H), numeric(a, H, 0.0, H), rtol=1e-6)
    forever = running_usage(a, 0.0, 1e9, H)
    assert np.allclose(forever, decayed_capacity(a, H))
    ledger = UsageLedger(H)
    ledger.record("bo", a, 0.0, 100.0)
    both = ledger.usage("bo", 200.0, running=[(a, 150.0)])
    assert np.allclose(both, ledger.usage("bo", 200.0) + running_usage(a, 150.0, 200.0, H))
    assert np.allclose(expected_usage(a, 50.0, H), running_usage(a, 0.0, 50.0, H))


def test_the_origin_moves_without_changing_any_usage() -> None:
    ledger = UsageLedger(10.0, origin=0.0)
    a = amount(cpu_milli=1000)
    ledger.record("x", a, 0.0, 5.0)
    before = ledger.usage("x", 700.0)
    ledger.record("y", a, 690.0, 700.0)  # 70 half-lives past the origin: it moves
    assert ledger.origin == 700.0
    assert np.allclose(ledger.usage("x", 700.0), before, rtol=1e-9)
    assert np.all(np.isfinite(ledger.usage("y", 1e6)))


@given(
    st.lists(
        st.tuples(st.floats(0, 1e6), st.floats(1, 1e5), st.floats(0, 8000)),
        min_size=1,
        max_size=20,
    ),
    st.floats(1.0, 1e6),
)
def test_recording_in_any_order_sums_the_closed_forms(intervals: list[tuple[float, float, float]], h: float) -> None:
    ledger = UsageLedger(h, origin=0.0)
    now = 2e6
    want = amount()
    for start, length, gpus in intervals:
        a = amount(gpu_milli=gpus)
        ledger.record("u", a, start, start + length)
        want = want + a * (h / math.log(2)) * (2.0 ** (-(now - start - length) / h) - 2.0 ** (-(now - start) / h))
    assert np.allclose(ledger.usage("u", now), want, rtol=1e-6, atol=1e-9)


def test_bad_half_lives_and_times_are_refused_by_name() -> None:
    for bad in (0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(InvalidRequest, match="half_life"):
            UsageLedger(bad)
    with pytest.raises(InvalidRequest, match="usage"):
        UsageLedger(H).record("u", amount(cpu_milli=1), float("nan"), 1.0)


def test_dominant_share_is_the_largest_fraction_and_skips_absent_resources() -> None:
    cap = amount(gpu_milli=8000, gpu_memory_mib=640_000, cpu_milli=64_000, memory_mib=0)
    assert dominant_share(amount(gpu_milli=2000, cpu_milli=32_000, memory_mib=99), cap) == 0.5
    assert dominant_share(amount(cpu_milli=1), amount()) == 0.0


def test_held_sums_an_allocations_grants() -> None:
    alloc = Allocation("1", "n", 0, 2000, 4096, (GpuGrant(0, 1000, 81920), GpuGrant(3, 300, 10240)))
    assert list(held(alloc)) == [1300, 92160, 2000, 4096]


def test_share_rows_give_slurms_factor() -> None:
    cap = amount(gpu_milli=4000)
    dcap = decayed_capacity(cap, H)
    usages = {"ann": dcap * 0.5, "bo": dcap * 0.25}  # ann used half the machine's decayed capacity
    rows = {r.account: r for r in share_rows(usages, {"ann": 1.0, "bo": 1.0, "cy": 2.0}, cap, H)}
    assert rows["ann"].share == pytest.approx(0.5) and rows["bo"].share == pytest.approx(0.25)
    assert rows["cy"].norm_shares == pytest.approx(0.5) and rows["cy"].factor == 1.0  # no usage
    assert rows["ann"].effective_usage == pytest.approx(2 / 3)
    assert rows["ann"].factor == pytest.approx(2 ** (-(2 / 3) / 0.25))
    assert rows["ann"].factor < rows["bo"].factor < rows["cy"].factor


def offer(item: str, account: str, submitted: float, priority: int = 0, projected: float = 0.1) -> Offer[str]:
    return Offer(item, account, priority, submitted, (int(item[1:]), item), projected)


def test_fair_order_priority_first_then_lower_share_then_age() -> None:
    offers = [
        offer("j1", "heavy", 1.0),
        offer("j2", "light", 2.0),
        offer("j3", "heavy", 3.0, priority=5),
        offer("j4", "light", 0.5, projected=0.0),
    ]
    got = fair_order(offers, {"heavy": 0.6, "light": 0.1}, lambda a: 1.0)
    assert got == ["j3", "j4", "j2", "j1"]


def test_a_burst_interleaves_with_another_users_jobs() -> None:
    burst = [offer(f"j{i}", "ann", float(i)) for i in range(1, 7)]
    late = [offer(f"j{i}", "bo", 100.0 + i) for i in range(7, 10)]
    got = fair_order(burst + late, {}, lambda a: 1.0)
    assert got[:6] == ["j1", "j7", "j2", "j8", "j3", "j9"]  # equal shares: turns, oldest first at each tie
    # FIFO would have offered all six of ann's first.


def test_weights_scale_the_turns() -> None:
    offers = [offer(f"j{i}", "ann", float(i)) for i in range(1, 9)] + [
        offer(f"j{i}", "bo", float(i)) for i in range(11, 19)
    ]
    got = fair_order(offers, {}, lambda a: 3.0 if a == "ann" else 1.0)
    first8 = got[:8]
    assert sum(1 for j in first8 if int(j[1:]) < 10) == 6  # ann is due three times bo's share: 3 of every 4 turns


# ---------------------------------------------------------------------------------------------- FairRuns
_offer_fields = st.tuples(
    st.sampled_from(["a", "b", "c", "d"]),  # account
    st.sampled_from([0, 0, 0, 5, -3]),  # priority
    st.sampled_from([0.0, 1.0, 1.0, 2.0, 3.5]),  # submitted: many equal (a burst's creation times, to the second)
    st.sampled_from([0.0, 0.0, 1e-3, 0.25, 1e-17, 0.1 + 0.2]),  # projected: zeros and absorbing values give ties
)


@given(
    st.lists(_offer_fields, min_size=0, max_size=40),
    st.lists(st.integers(0, 39), max_size=12),  # offers that leave between rounds
    st.lists(_offer_fields, max_size=8),  # offers that arrive between rounds
    st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from([0.0, 0.0, 0.3, 1e-3, 1.0])),
    st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from([1.0, 2.0, 0.5, 3.0])),
)
def test_fair_runs_give_fair_orders_result_round_after_round(
    first: list[tuple[str, int, float, float]],
    leave: list[int],
    arrive: list[tuple[str, int, float, float]],
    shares: dict[Hashable, float],
    weights: dict[str, float],
) -> None:
    """The kept runs, reused, thinned and grown, order exactly as fair_order's heap does, ties included."""

    def offers(fields: list[tuple[str, int, float, float]], start: int) -> list[Offer[str]]:
        out = []
        for k, (account, priority, submitted, projected) in enumerate(fields, start):
            job = f"j{k}" if k % 3 else str(k)  # numeric and other ids
            out.append(Offer(job, account, priority, submitted, (int(job) if job.isdigit() else 0, job), projected))
        return out

    runs: FairRuns[str] = FairRuns()
    weight = lambda a: weights.get(str(a), 1.0)  # noqa: E731
    now = offers(first, 0)
    assert runs.order(now, shares, weight) == fair_order(now, shares, weight)
    assert runs.order(now, shares, weight) == fair_order(now, shares, weight)  # (every run reused)
    gone = {i for i in leave if i < len(now)}
    now = [o for i, o in enumerate(now) if i not in gone] + offers(arrive, 100)
    assert runs.order(now, shares, weight) == fair_order(now, shares, weight)


def test_fair_runs_fall_back_where_floats_cannot_hold_the_key() -> None:
    """Priorities past 2^53 (a float would round them) and a NaN share: the heap's order, not numpy's."""
    big = [Offer("x", "a", 2**60 + 1, 0.0, (0, "x"), 0.1), Offer("y", "b", 2**60, 0.0, (0, "y"), 0.1)]
    runs: FairRuns[str] = FairRuns()
    assert runs.order(big, {}, lambda _: 1.0) == ["x", "y"] == fair_order(big, {}, lambda _: 1.0)
    nan = [Offer("x", "a", 0, 0.0, (0, "x"), 0.1), Offer("y", "b", 0, 0.0, (0, "y"), 0.1)]
    shares: dict[Hashable, float] = {"a": math.nan}
    assert runs.order(nan, shares, lambda _: 1.0) == fair_order(nan, shares, lambda _: 1.0)
