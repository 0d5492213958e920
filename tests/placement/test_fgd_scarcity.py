"""fgd-scarcity: the fill measure, scarcity weights and model levels on hand-worked clusters, its tie-breaking
against fgd, and its safety on random streams."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.model.resources import MILLI_PER_GPU, Allocation, GpuBehavior
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place, registry
from corral.placement.fill import node_unfilled, share_unfilled_after, type_fill
from corral.placement.scarcity import cluster_slots, model_levels, scarcity_weights
from corral.placement.scores.fgd_scarcity import FgdScarcity
from corral.placement.workload import TargetType, TargetWorkload
from tests.builders import cluster, commit, cpu_only, gpus, node
from tests.placement.test_properties import (
    assert_invariants,
    clusters,
    draw_request,
    normalised,
    partly_used,
    target_types,
)

UNRESTRICTED = GpuBehavior.UNRESTRICTED
ONE_GPU_11_CORES = TargetWorkload((TargetType(11_300, MILLI_PER_GPU, 1, None, 1.0),))


def unfilled(s: ClusterSnapshot, workload: TargetWorkload) -> list[float]:
    return [float(x) for x in node_unfilled(s, workload, np.arange(len(s), dtype=np.int64))]


def reference_unfilled(cpu_free: int, gpus_free: Sequence[tuple[str, int]], workload: TargetWorkload) -> float:
    """W(n) written out per type and per GPU (the definition in `corral.placement.fill`)."""
    idle = sum(free for _, free in gpus_free)
    total = 0.0
    for t in workload.types:
        if t.gpu_count == 0:
            total += t.probability * idle
            continue
        allowed = [free for model, free in gpus_free if t.models is None or model in t.models]
        if t.gpu_count == 1 and t.gpu_milli < MILLI_PER_GPU:
            gpu_slots = sum(free // max(t.gpu_milli, 1) for free in allowed)
        else:
            gpu_slots = sum(1 for free in allowed if free >= MILLI_PER_GPU) // t.gpu_count
        cpu_slots = cpu_free // t.cpu_milli if t.cpu_milli > 0 else gpu_slots
        usable = min(min(gpu_slots, max(cpu_slots, 0)) * t.gpu_count * t.gpu_milli, idle)
        total += t.probability * (idle - usable)
    return total


def pairs(s: ClusterSnapshot, i: int) -> list[tuple[str, int]]:
    return [(g.model, g.milli_free) for g in s.node_state(i).gpus]


# ------------------------------------------------------------------------------------------------ the measure
def test_cpu_caps_how_many_gpus_a_node_can_fill() -> None:
    # 8 idle GPUs but 12 cores: one 1-GPU, 11.3-core pod fits, so 7 GPUs stay idle. FGD's one-pod test calls this
    # node unfragmented (F = 0); the fill measure says 7000 milli can never be filled by this workload.
    s = cluster(node("a").gpus(8).cpu(12), node("b").gpus(8).cpu(96))
    assert unfilled(s, ONE_GPU_11_CORES) == [7000.0, 0.0]


def test_shares_count_every_slot_on_every_gpu() -> None:
    s = cluster(node("a").gpus(2).cpu(64))
    commit(s, place(s, gpus(1, 470, cpu=0, id="x"), PlacementConfig(policy="binpack", gpu_behavior=UNRESTRICTED)))
    # Free 530 + 1000: a 470-milli type fits 1 + 2 times, using 1410 of 1530; 120 stay idle.
    share = TargetWorkload((TargetType(1000, 470, 1, None, 1.0),))
    assert unfilled(s, share) == [120.0]
    # CPU for only one more such pod: 470 used, 1060 idle.
    tight = TargetWorkload((TargetType(40_000, 470, 1, None, 1.0),))
    assert unfilled(s, tight) == [1060.0]


def test_types_mix_by_probability_and_cpu_only_types_see_every_idle_gpu() -> None:
    s = cluster(node("a").gpus(3).cpu(64))
    mix = TargetWorkload((TargetType(2000, 0, 0, None, 0.5), TargetType(2000, MILLI_PER_GPU, 2, None, 0.5)))
    # CPU-only type: 3000 idle; 2-GPU type: one pair fits, 1000 idle. W = 0.5 x 3000 + 0.5 x 1000.
    assert unfilled(s, mix) == [2000.0]


def test_a_type_without_an_allowed_model_fills_nothing() -> None:
    s = cluster(node("a").gpus(2, model="G2"), node("b").gpus(2, model="T4"))
    t4_only = TargetWorkload((TargetType(1000, 500, 1, frozenset({"T4"}), 1.0),))
    assert unfilled(s, t4_only) == [2000.0, 0.0]


def test_share_after_scores_each_gpu_as_the_share_would_leave_it() -> None:
    s = cluster(node("a").gpus(2).cpu(64))
    commit(s, place(s, gpus(1, 470, cpu=0, id="x"), PlacementConfig(policy="binpack", gpu_behavior=UNRESTRICTED)))
    share = TargetWorkload((TargetType(1000, 470, 1, None, 1.0),))
    after = share_unfilled_after(s, share, np.array([0], dtype=np.int64), 1000, 470)
    # On GPU 0 (530 free -> 60): 60 + 1000 idle, 2 slots -> 120 idle. On GPU 1 (1000 -> 530): 530 + 530, 2 slots.
    assert [float(x) for x in after[0]] == [120.0, 120.0]
    after = share_unfilled_after(s, share, np.array([0], dtype=np.int64), 1000, 500)
    # 500 on GPU 0 (30 left): 1030 idle, 2 slots -> 90. On GPU 1 (500 left): 1030 idle, 2 slots (530 + 500) -> 90.
    assert [float(x) for x in after[0]] == [90.0, 90.0]


# ------------------------------------------------------------------------------------------------ the policy
def test_a_cpu_only_pod_goes_where_it_strands_no_gpu() -> None:
    # Both nodes keep every target type's one-pod fit (fgd: 50 and 50, so the rank decides: "gpu-rich" first).
    # On "gpu-rich" the pod leaves CPU for one 11.3-core pod instead of two (1000 milli more left idle); on "no-gpus"
    # nothing changes. fgd-scarcity scores 50 + 0.999 sigmoid(gain / 1000) for each.
    s = cluster(node("gpu-rich").gpus(2).cpu(24), node("no-gpus").cpu(24), ranks=[0, 1])
    cfg = {"gpu_behavior": UNRESTRICTED, "workload": ONE_GPU_11_CORES}
    fgd = place(s, cpu_only(cpu=2000), PlacementConfig(policy="fgd", **cfg))  # type: ignore[arg-type]
    fill = place(s, cpu_only(cpu=2000), PlacementConfig(policy="fgd-scarcity", **cfg))  # type: ignore[arg-type]
    assert fgd.explanation.chosen == "gpu-rich"
    assert fill.explanation.chosen == "no-gpus"
    top = dict(fill.explanation.top)
    assert top["no-gpus"] == 50 + 0.999 * 0.5
    assert top["gpu-rich"] == 50 + 0.999 / (1 + math.exp(1.0))


def test_fill_never_overrides_a_better_fgd_score() -> None:
    # A share of 300 on a node whose GPU 0 already holds 500: fgd prefers the tight GPU (57 vs 33, see
    # test_fgd_keeps_whole_gpus_whole); the fill fraction stays below one point, so fgd-scarcity agrees.
    s = cluster(node("a").gpus(2).cpu(8))
    commit(s, place(s, gpus(1, 500, cpu=0, id="half"), PlacementConfig(policy="binpack", gpu_behavior=UNRESTRICTED)))
    workload = TargetWorkload((TargetType(0, 1000, 1, None, 1.0),))
    d = place(
        s, gpus(1, 300, cpu=0), PlacementConfig(policy="fgd-scarcity", gpu_behavior=UNRESTRICTED, workload=workload)
    )
    assert d.allocation is not None and d.allocation.gpu_indices == (0,)
    assert math.floor(d.explanation.top[0][1]) == 57


def test_a_cpu_heavy_gpu_pod_avoids_the_node_it_would_strand() -> None:
    # A 1-GPU, 20-core pod under a 1-GPU 11.3-core workload. fgd: after it, one more 11.3-core pod still fits on
    # either node, so both score 50 and the rank picks "lean". Fill: on "lean" (4 GPUs, 46 cores) 26 cores are left
    # for 3 idle GPUs (2 slots: 1000 milli stranded, gain -1000); on "fat" (80 cores) 60 cores serve all 3 (gain 0).
    s = cluster(node("lean").gpus(4).cpu(46), node("fat").gpus(4).cpu(80), ranks=[0, 1])
    pod = gpus(1, cpu=20_000)
    cfg = {"gpu_behavior": UNRESTRICTED, "workload": ONE_GPU_11_CORES}
    assert place(s, pod, PlacementConfig(policy="fgd", **cfg)).explanation.chosen == "lean"  # type: ignore[arg-type]
    d = place(s, pod, PlacementConfig(policy="fgd-scarcity", **cfg))  # type: ignore[arg-type]
    assert d.explanation.chosen == "fat"
    assert dict(d.explanation.top) == {"fat": 50 + 0.999 * 0.5, "lean": 50 + 0.999 / (1 + math.exp(1.0))}


# ------------------------------------------------------------------------------------------------ scarcity
ANY_GPU = TargetType(4000, MILLI_PER_GPU, 1, None, 0.75)
T4_GPU = TargetType(4000, MILLI_PER_GPU, 1, frozenset({"T4"}), 0.25)


def test_scarcity_weights_compare_each_types_room_with_its_share_of_the_pods_still_to_come() -> None:
    # Slots: any-GPU 8 (G2) + 2 (T4) = 10, T4-only 2. 10 free GPUs at 1000 milli per target pod: 10 more pods,
    # 7.5 any-GPU (7.5 / 10 -> 0.75) and 2.5 T4-only (2.5 / 2 -> 1, capped).
    s = cluster(node("g2").gpus(8, model="G2").cpu(96), node("t4").gpus(2, model="T4").cpu(104))
    workload = TargetWorkload((ANY_GPU, T4_GPU))
    assert cluster_slots(s, workload).tolist() == [10, 2]
    assert scarcity_weights(s, workload).tolist() == [0.75, 1.0]
    # Six G2 GPUs taken: 4 free GPUs, 4 pods to come: 3 any-GPU over 4 slots (0.75), 1 T4-only over 2 (0.5).
    commit(s, place(s, gpus(6, cpu=0, id="six"), PlacementConfig(policy="binpack", gpu_behavior=UNRESTRICTED)))
    assert cluster_slots(s, workload).tolist() == [4, 2]
    assert scarcity_weights(s, workload).tolist() == [0.75, 0.5]


def test_weights_move_in_eighths() -> None:
    # One node, 8 GPUs, 64 cores; any-GPU p 0.3 and 500-milli shares p 0.7: 650 milli per pod, 8000 / 650 = 12.3
    # pods to come. Any-GPU: 3.69 / 8 slots = 0.46 -> 0.5; shares: 8.62 / 16 slots = 0.54 -> 0.5.
    s = cluster(node("a").gpus(8).cpu(64))
    workload = TargetWorkload((TargetType(1000, MILLI_PER_GPU, 1, None, 0.3), TargetType(1000, 500, 1, None, 0.7)))
    assert scarcity_weights(s, workload).tolist() == [0.5, 0.5]


def test_model_levels_rank_nodes_by_the_constrained_demand_on_their_models() -> None:
    s = cluster(
        node("g2").gpus(8, model="G2"),
        node("t4").gpus(2, model="T4"),
        node("cpu").cpu(32),
        node("t4b").gpus(4, model="T4"),
    )
    level, levels = model_levels(s, TargetWorkload((ANY_GPU, T4_GPU)))
    # Only the T4-only type is constrained: its demand leans on both T4 nodes alike, on nothing else.
    assert level.tolist() == [0, 1, 0, 1]
    assert levels == 2


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


class _NoGuard(FgdScarcity):
    name = "fgd-scarcity-test-no-model-level"
    model_guard = False


def test_a_pod_that_can_run_anywhere_stays_off_the_model_a_constrained_type_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # fgd ties at 50 (on "g2" the T4-only type's no-access fragment drops by 20 milli, not a whole point; on the
    # CPU-poor "t4" nothing changes) and the rank picks "t4". Its 5 cores strand one of its GPUs for the 4-core
    # types, so the fill gain alone also prefers "t4" (it uses that GPU: gain 985 vs 5). The model level comes first:
    # "t4" is the only home of the T4-only type, so the pod goes to "g2".
    # Registered for this test only (monkeypatch restores the registry), so the product's list stays as it is.
    monkeypatch.setitem(registry._REGISTRY, _NoGuard.name, _NoGuard)
    s = cluster(node("t4").gpus(2, model="T4").cpu(5), node("g2").gpus(8, model="G2").cpu(96), ranks=[0, 1])
    workload = TargetWorkload(
        (TargetType(4000, MILLI_PER_GPU, 1, None, 0.98), TargetType(4000, MILLI_PER_GPU, 1, frozenset({"T4"}), 0.02))
    )
    pod = gpus(1, cpu=1000)

    def decide(policy: str) -> dict[str, float]:
        d = place(s, pod, PlacementConfig(policy=policy, gpu_behavior=UNRESTRICTED, workload=workload))
        assert d.explanation.top[0][0] == d.explanation.chosen
        return dict(d.explanation.top)

    assert list(decide("fgd")) == ["t4", "g2"]
    assert list(decide(_NoGuard.name)) == ["t4", "g2"]
    top = decide("fgd-scarcity")
    assert list(top) == ["g2", "t4"]
    # Weights: any-GPU 9.8 pods to come over 9 slots (1), T4-only 0.2 over 1 slot (0.25).
    assert top["g2"] == pytest.approx(50 + 0.999 * (1 + _sigmoid(0.02 * 0.25)) / 2)
    assert top["t4"] == pytest.approx(50 + 0.999 * _sigmoid(0.98 + 0.02 * 0.25) / 2)


# ------------------------------------------------------------------------------------------------ properties
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fill_measure_matches_the_definition(data: st.DataObject) -> None:
    snap, workload = partly_used(data, 10)
    got = unfilled(snap, workload)
    want = [reference_unfilled(snap.node_state(i).cpu_free, pairs(snap, i), workload) for i in range(len(snap))]
    assert np.allclose(got, want, rtol=0, atol=1e-6), (got, want)


@pytest.mark.parametrize("policy", ["fgd-scarcity", "fgd-priced"])
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fgd_descendants_never_over_commit(policy: str, data: st.DataObject) -> None:
    """Random streams placed, granted and released keep every invariant and place exactly what fgd places;
    fgd-scarcity's scores sort like fgd's (its integer part is fgd's score)."""
    snap = data.draw(clusters(), label="cluster")
    types = data.draw(st.lists(target_types(snap.models), min_size=1, max_size=5), label="workload")
    config = PlacementConfig(policy=policy, gpu_behavior=UNRESTRICTED, workload=normalised(types))
    fgd_config = PlacementConfig(policy="fgd", gpu_behavior=UNRESTRICTED, workload=config.workload)
    live: dict[str, Allocation] = {}
    for step in range(data.draw(st.integers(1, 25), label="steps")):
        if live and data.draw(st.integers(0, 3), label="op") == 0:
            rid = data.draw(st.sampled_from(sorted(live)), label="release")
            assert snap.release(rid) == live.pop(rid)
        else:
            request = draw_request(data, snap, f"r{step}")
            decision = place(snap, request, config, rng=step)
            fgd = place(snap, request, fgd_config, rng=step)
            assert decision.placed == fgd.placed
            if decision.allocation is not None:
                if policy == "fgd-scarcity":
                    assert math.floor(decision.explanation.top[0][1]) == fgd.explanation.top[0][1]
                snap.allocate(decision.allocation)
                live[request.id] = decision.allocation
        assert_invariants(snap, live)
    # The cluster-wide slot counts, kept per node and refreshed where nodes changed, equal a fresh count.
    everything = np.arange(len(snap), dtype=np.int64)
    assert config.workload is not None
    fresh, _ = type_fill(snap, config.workload, everything, snap.cpu_free, snap.gpu_milli_free)
    cap = (1 << 40) // len(snap)
    assert cluster_slots(snap, config.workload).tolist() == np.minimum(fresh, cap).sum(axis=1).tolist()
