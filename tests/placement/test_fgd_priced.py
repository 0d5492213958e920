"""fgd-priced: the share prices are the packing LP's optimal duals, and shares go where they spoil the least room."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from corral.model.resources import MILLI_PER_GPU, Allocation, GpuBehavior, GpuGrant
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.placement.pricing import SharePrices, share_prices, solve_prices
from corral.placement.reserve import kept_hosts
from corral.placement.workload import TargetType, TargetWorkload
from tests.builders import cluster, cpu_only, gpus, node
from tests.placement.test_properties import normalised

UNRESTRICTED = GpuBehavior.UNRESTRICTED


def shares(*pairs: tuple[int, float], whole: float = 0.0) -> TargetWorkload:
    types = [TargetType(4000, milli, 1, None, p) for milli, p in pairs]
    if whole:
        types.append(TargetType(4000, MILLI_PER_GPU, 1, None, whole))
    return normalised(types)


def value(prices: SharePrices, milli: int) -> float:
    return round(prices.size_value(milli), 6)


def test_a_share_that_only_small_ones_can_join_costs_the_whole_gpu() -> None:
    # 810s leave 190 milli that only the rare 160s fill: each 810 costs a GPU, the 160s ride free.
    p = solve_prices([810, 160], [10.0, 1.0])
    assert value(p, 810) == 1000.0 and value(p, 160) == 0.0
    assert p.room[MILLI_PER_GPU] == pytest.approx(1000.0)


def test_two_470s_share_a_gpu_and_a_320_must_not_spoil_the_room_beside_a_470() -> None:
    p = solve_prices([470, 320, 650], [2.0, 1.0, 1.0])
    assert value(p, 470) == 500.0
    loss = p.loss(np.array([1000, 530, 350, 300]), 320)
    assert loss[2] == pytest.approx(0.0)  # beside a 650: the configuration the optimum uses
    assert loss[1] > 100  # beside a 470: the room was worth a 470's half, 210 left fit nothing
    assert loss[3] == np.inf  # does not fit
    assert p.loss(np.array([530]), 470)[0] == pytest.approx(0.0)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(2, 19).map(lambda k: k * 50), st.integers(1, 10).map(float)),
        min_size=1,
        max_size=4,
        unique_by=lambda t: t[0],
    )
)
def test_prices_are_optimal_duals_of_the_packing_lp(sizes: list[tuple[int, float]]) -> None:
    """Column generation reaches the LP optimum over every configuration: prices feasible, no duality gap."""
    s = [k for k, _ in sizes]
    p = np.array([w for _, w in sizes])
    p = p / p.sum()
    prices = solve_prices(s, list(p))
    configs = [
        c
        for c in itertools.product(*(range(MILLI_PER_GPU // k + 1) for k in s))
        if any(c) and sum(a * k for a, k in zip(c, s, strict=True)) <= MILLI_PER_GPU
    ]
    a = np.array(configs, dtype=np.float64).T
    lp = linprog(MILLI_PER_GPU - np.array(s) @ a, A_eq=a, b_eq=p, bounds=(0, None), method="highs")
    v = np.array([prices.size_value(k) for k in s])
    assert (v @ a <= MILLI_PER_GPU + 1e-6).all()  # no configuration is worth more than a GPU
    assert float(p @ (v - np.array(s))) == pytest.approx(lp.fun, abs=1e-6)  # the dual objective equals the optimum
    for k in s:  # a share never gains from landing anywhere
        assert (prices.loss(np.arange(k, MILLI_PER_GPU + 1), k) >= -1e-9).all()


def test_a_workload_without_shares_has_no_prices() -> None:
    whole = TargetWorkload((TargetType(4000, MILLI_PER_GPU, 1, None, 1.0),))
    assert share_prices(whole) is None


def run(s: ClusterSnapshot, milli: int, workload: TargetWorkload, policy: str = "fgd-priced") -> tuple[str, int]:
    d = place(s, gpus(1, milli, cpu=1000), PlacementConfig(policy=policy, workload=workload), rng=0)
    assert d.allocation is not None, d.explanation
    return d.allocation.node, d.allocation.gpu_indices[0]


def occupy(s: ClusterSnapshot, where: str, gpu: int, milli: int, rid: str) -> None:
    s.allocate(Allocation(rid, where, s.node_index(where), 1000, 1024, (GpuGrant(gpu, milli, 0),), tag=-1))


def test_a_share_continues_the_configuration_the_packing_lp_uses() -> None:
    workload = shares((470, 2.0), (320, 1.0), (650, 1.0))
    s = cluster(node("a").gpus(2), node("b").gpus(2))
    occupy(s, "a", 0, 470, "x")  # a: GPU 0 has 530 free
    # A 320 opens a fresh GPU (two more 320s or a 650 fill it) rather than spoil the room a 470 would fill;
    # a tightest-first policy (binpack) takes the 530.
    assert run(s, 320, workload, "binpack") == ("a", 0)
    assert run(s, 320, workload) != ("a", 0)
    occupy(s, "b", 0, 650, "y")  # b: GPU 0 has 350 free
    assert run(s, 320, workload) == ("b", 0)  # beside the 650: exactly the configuration the LP uses
    assert run(s, 470, workload) == ("a", 0)  # completes the pair of 470s before opening a GPU
    # The explanation says what the GPU cost: a 470 is worth half a GPU and the 530 beside the other 470 loses nothing.
    notes = place(s, gpus(1, 470), PlacementConfig(policy="fgd-priced", workload=workload), rng=0).explanation.notes
    want = "fgd-priced: the share costs 500 milli of a GPU's worth; GPU 0 had 530 milli free and loses 0 more"
    assert notes == (want,)


def test_pods_without_shares_are_placed_as_fgd_scarcity_places_them() -> None:
    workload = shares((470, 2.0), (320, 1.0), whole=1.0)
    s = cluster(node("a").gpus(4).cpu(16), node("b").gpus(2).cpu(64), node("c").gpus(0).cpu(8))
    for req in (gpus(1, cpu=4000), gpus(2, cpu=8000), cpu_only(6000)):
        got = place(s, req, PlacementConfig(policy="fgd-priced", workload=workload), rng=0)
        want = place(s, req, PlacementConfig(policy="fgd-scarcity", workload=workload), rng=0)
        assert got.allocation == want.allocation


def g3_and_g2() -> ClusterSnapshot:
    # Two nodes that can take an 8-GPU, 120-core pod, two that cannot (96 cores).
    return cluster(node("g3a").gpus(8).cpu(128), node("g3b").gpus(8).cpu(128), node("g2a").gpus(8).cpu(96),
                   node("g2b").gpus(8).cpu(96))  # fmt: skip


BIG = TargetType(120_000, MILLI_PER_GPU, 8, None, 0.05)


def with_big_tail(probability: float) -> TargetWorkload:
    typical = (TargetType(16_000, MILLI_PER_GPU, 1, None, 0.5), TargetType(12_000, MILLI_PER_GPU, 1, None, 0.5))
    return TargetWorkload(typical, (TargetType(120_000, MILLI_PER_GPU, 8, None, probability),))


def test_hosts_of_the_largest_pods_are_kept_while_they_run_out() -> None:
    s = g3_and_g2()
    small = gpus(1, cpu=12_000)
    everything = np.arange(len(s), dtype=np.int64)
    # 32 GPUs free, a pod takes one: 32 pods to come, 5 % of them 8-GPU 120-core ones -> keep ceil(1.6) = 2 hosts.
    assert kept_hosts(s, with_big_tail(0.05), small, everything).tolist() == [True, True, False, False]
    # With 1 % (0.32 pods to come, a reserve of 1) the two hosts are plenty: nothing is kept.
    assert not kept_hosts(s, with_big_tail(0.01), small, everything).any()
    # The big pod itself, and a pod that leaves the host able to take one, are not kept off.
    assert not kept_hosts(s, with_big_tail(0.05), gpus(8, cpu=120_000), everything).any()
    assert not kept_hosts(s, with_big_tail(0.05), cpu_only(4000), everything).any()


def test_a_small_pod_stays_off_the_last_hosts_of_big_pods_but_lands_there_when_nothing_else_fits() -> None:
    workload = with_big_tail(0.05)
    s = g3_and_g2()
    # fgd-scarcity prefers a CPU-rich node for a 16-core GPU pod (on a 96-core one it would strand CPU).
    scarcity = place(s, gpus(1, cpu=16_000), PlacementConfig(policy="fgd-scarcity", workload=workload), rng=0)
    assert scarcity.allocation is not None and scarcity.allocation.node == "g3a"
    d = place(s, gpus(1, cpu=16_000), PlacementConfig(policy="fgd-priced", workload=workload), rng=0)
    assert d.allocation is not None and d.allocation.node.startswith("g2")
    assert "fgd-priced: 2 nodes kept free for multi-GPU pods came last" in d.explanation.notes
    big = place(s, gpus(8, cpu=120_000), PlacementConfig(policy="fgd-priced", workload=workload), rng=0)
    assert big.allocation is not None and big.allocation.node.startswith("g3")
    # Fill the 96-core nodes' CPU: the small pod has nowhere else to go and takes a kept host.
    for name in ("g2a", "g2b"):
        s.allocate(Allocation(f"cpu-{name}", name, s.node_index(name), 90_000, 1024))
    d = place(s, gpus(1, cpu=16_000), PlacementConfig(policy="fgd-priced", workload=workload), rng=0)
    assert d.allocation is not None and d.allocation.node.startswith("g3")
