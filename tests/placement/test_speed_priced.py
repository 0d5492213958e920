"""fgd-priced's speed-ups (issue 16, part 3) change no number: each memo or rewrite equals a fresh computation, and
each memo's key holds what its value depends on (a key that left it out would give a different answer here)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.model.arrays import FloatArray, IntArray
from corral.model.resources import MILLI_PER_GPU, Allocation, GpuBehavior, GpuGrant
from corral.placement import PlacementConfig, place
from corral.placement.context import Context
from corral.placement.filters import evaluate
from corral.placement.pricing import _knapsack, solve_prices
from corral.placement.registry import get_policy
from corral.placement.workload import TargetType, TargetWorkload
from tests.builders import cluster, gpus, node

UNRESTRICTED = GpuBehavior.UNRESTRICTED


def numpy_knapsack(sizes: IntArray, values: FloatArray) -> tuple[FloatArray, IntArray]:
    """The numpy knapsack `pricing._knapsack` replaced (verbatim): the reference it must equal bit for bit."""
    room = np.zeros(MILLI_PER_GPU + 1, dtype=np.float64)
    last = np.full(MILLI_PER_GPU + 1, -1, dtype=np.int64)
    items = np.arange(len(sizes))
    for u in range(1, MILLI_PER_GPU + 1):
        room[u], last[u] = room[u - 1], -2
        fits = items[sizes <= u]
        if len(fits):
            candidates = room[u - sizes[fits]] + values[fits]
            best = int(np.argmax(candidates))
            if candidates[best] > room[u]:
                room[u], last[u] = candidates[best], fits[best]
    return room, last


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 999), min_size=1, max_size=12, unique=True),
    noise=st.lists(st.floats(-300, 300), min_size=12, max_size=12),
    rounded=st.booleans(),
)
def test_the_python_knapsack_equals_the_numpy_one_to_the_last_bit(
    sizes: list[int], noise: list[float], rounded: bool
) -> None:
    s = np.array(sorted(sizes, reverse=True), dtype=np.int64)
    v = s + np.array(noise[: len(s)])
    if rounded:  # equal candidates: the first of them must win, as np.argmax picks it
        v = np.round(v / 50) * 50
    room, last = _knapsack(s, v)
    want_room, want_last = numpy_knapsack(s, v)
    assert room.tobytes() == want_room.tobytes()
    assert last.tolist() == want_last.tolist()


def test_share_prices_of_the_openb_sizes_are_unchanged() -> None:
    """The LP's effective sizes for the openb `default` list's share sizes, as the numpy knapsack gave them."""
    sizes, probabilities = [810, 650, 470, 320, 160], [0.1, 0.2, 0.3, 0.3, 0.1]
    prices = solve_prices(sizes, probabilities)
    room, _ = numpy_knapsack(np.array(prices.sizes, dtype=np.int64), np.array(prices.value))
    assert prices.room.tobytes() == room.tobytes()
    assert prices.room[MILLI_PER_GPU] <= MILLI_PER_GPU + 1e-6  # no configuration is worth more than a GPU


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_scores_per_state_equal_fresh_ones_as_weights_move(data: st.DataObject) -> None:
    """fgd-priced scores each node state once per set of scarcity weights (`fgd_scarcity.state_scores`). Shares
    placed one after another move the weights; at every step the kept scores equal those of a twin snapshot whose
    memo is emptied first, node by node (not only the chosen node)."""

    workload = TargetWorkload(
        (
            TargetType(2000, 300, 1, None, 0.4),
            TargetType(8000, 650, 1, None, 0.3),
            TargetType(8000, 1000, 2, None, 0.3),
        ),
        (TargetType(60_000, 1000, 4, None, 0.01),),
    )
    sizes = [data.draw(st.sampled_from([2, 4]), label=f"gpus{i}") for i in range(6)]
    snap = cluster(*(node(f"n{i}").cpu(32).gpus(g) for i, g in enumerate(sizes)))
    twin = cluster(*(node(f"n{i}").cpu(32).gpus(g) for i, g in enumerate(sizes)))
    config = PlacementConfig(policy="fgd-priced", gpu_behavior=UNRESTRICTED, workload=workload)
    policy = get_policy("fgd-priced")
    for step in range(data.draw(st.integers(1, 14), label="steps")):
        milli = data.draw(st.sampled_from([300, 650, 1000]), label="milli")
        request = gpus(1, milli, cpu=data.draw(st.sampled_from([2000, 8000]), label="cpu"), id=f"r{step}")
        twin.memo.clear()
        scored = []
        for s in (snap, twin):
            fit = evaluate(s, request, UNRESTRICTED, config.reserve)
            nodes = np.flatnonzero(fit.feasible).astype(np.int64)
            ctx = Context(s, request, fit, workload, np.random.default_rng(0))
            scored.append(policy.score(ctx, nodes).tolist())
        assert scored[0] == scored[1]
        decision = place(snap, request, config, rng=step)
        if decision.allocation is None:
            break
        snap.allocate(decision.allocation)
        twin.allocate(decision.allocation)


def test_a_node_back_in_a_state_seen_before_takes_its_score_under_the_current_weights() -> None:
    """A state id outlives the node's version: when the weights have moved since the state was scored, the score
    must be the one under the new weights (a stale per-state score would be the old one)."""
    workload = TargetWorkload((TargetType(1000, 500, 1, None, 0.6), TargetType(1000, 1000, 1, None, 0.4)))
    snap = cluster(node("a").cpu(8).gpus(2), node("b").cpu(8).gpus(2))
    config = PlacementConfig(policy="fgd-priced", gpu_behavior=UNRESTRICTED, workload=workload)
    request = gpus(1, 500, id="p")
    placed = []
    for i in range(4):
        d = place(snap, gpus(1, 500, id=f"q{i}"), config, rng=i)
        if d.allocation is None:
            break
        snap.allocate(d.allocation)
        placed.append(d.allocation)
        fresh = cluster(node("a").cpu(8).gpus(2), node("b").cpu(8).gpus(2))
        for a in placed:
            fresh.allocate(a)
        got = place(snap, request, config, rng=0, explain_placed=True)
        want = place(fresh, request, config, rng=0, explain_placed=True)
        assert got.allocation == want.allocation
        assert got.explanation == want.explanation
    # Release back to the empty state: every node is in the state first scored, under whatever weights hold now.
    for a in placed:
        snap.release(a.request_id)
    fresh = cluster(node("a").cpu(8).gpus(2), node("b").cpu(8).gpus(2))
    assert place(snap, request, config, rng=0, explain_placed=True).explanation == (
        place(fresh, request, config, rng=0, explain_placed=True).explanation
    )


def test_state_keys_of_one_node_are_the_bytes_of_the_batch_form() -> None:
    """`common.node_state_keys` builds one node's key without an array: the bytes must equal the batch form's, or
    a state would get two ids (scored twice) or two states one (a wrong score)."""
    from corral.placement.scores.common import node_state_keys

    snap = cluster(node("a").cpu(16).gpus(4), node("b").cpu(16).gpus(2, model="T4"), node("c").cpu(8))
    snap.allocate(Allocation("x", "a", 0, 3000, 0, (GpuGrant(1, 250, 0),), tag=-1))
    request = gpus(1, 500, id="r")
    fit = evaluate(snap, request, UNRESTRICTED, PlacementConfig().reserve)
    ctx = Context(snap, request, fit, TargetWorkload((TargetType(1000, 500, 1, None, 1.0),)), np.random.default_rng(0))
    everything = np.arange(3, dtype=np.int64)
    batch = node_state_keys(ctx, everything)
    assert [node_state_keys(ctx, everything[i : i + 1])[0] for i in range(3)] == batch
    assert len(set(batch)) == 3
