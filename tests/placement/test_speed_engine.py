"""The engine's per-decision shortcuts (issue 16, fgd speed part 3) change no decision and no explanation it gives."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from corral.model.resources import GpuBehavior
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.placement.engine import _counts_any, _counts_primary, _patterns
from corral.placement.filters import count_per_row, evaluate
from corral.placement.select import first_k_ascending
from corral.placement.workload import GpuReserve
from corral.sim.replay import replay
from tests.builders import cluster, cpu_only, gpus, node
from tests.placement.test_properties import clusters, draw_request


@settings(max_examples=200, deadline=None)
@given(
    mask=st.integers(0, 40).flatmap(
        lambda n: st.integers(1, 19).flatmap(lambda g: arrays(np.bool_, (n, g)))  # 19: words of 8, 16 and a tail
    ),
    order=st.sampled_from(["C", "F", "strided"]),
)
def test_count_per_row_equals_count_nonzero(mask: np.ndarray, order: str) -> None:
    if order == "F":
        mask = np.asfortranarray(mask)
    elif order == "strided":
        mask = mask[:, ::2]
    assert count_per_row(mask).tolist() == np.count_nonzero(mask, axis=1).tolist()


def test_count_per_row_on_a_full_eight_gpu_cluster() -> None:
    """Eight True bytes sum to 8 in the top byte: no carry from one row's word into the count."""
    mask = np.ones((3, 8), dtype=np.bool_)
    mask[1] = False
    mask[2, 7] = False
    assert count_per_row(mask).tolist() == [8, 0, 7]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_brief_refusal_decides_alike_and_keeps_the_node_reasons(data: st.DataObject) -> None:
    snap = data.draw(clusters(), label="cluster")
    config = PlacementConfig(
        policy=data.draw(st.sampled_from(["fgd", "binpack", "bestfit"]), label="policy"),
        gpu_behavior=data.draw(st.sampled_from(list(GpuBehavior)), label="behaviour"),
    )
    for step in range(data.draw(st.integers(1, 12), label="steps")):
        request = draw_request(data, snap, f"r{step}")
        full = place(snap, request, config, step)
        brief = place(snap, request, config, step, explain_placed=False, explain_refused=False)
        assert brief.allocation == full.allocation
        assert brief.node_reasons.tolist() == full.node_reasons.tolist()
        # The counts of the full explanation come from one set of patterns, as they did from the bits directly.
        patterns = _patterns(full.node_reasons)
        assert full.explanation.rejected == _counts_primary(full.node_reasons, patterns)
        assert full.explanation.failing == _counts_any(full.node_reasons, patterns)
        if full.allocation is not None:
            snap.allocate(full.allocation)


def test_a_brief_refusal_is_empty_and_a_tracked_replay_still_explains_refusals() -> None:
    snap = cluster(node("a").cpu(4).gpus(1), node("b").cpu(4))
    request = gpus(2, id="big")
    full = place(snap, request, PlacementConfig(policy="fgd"), 0)
    brief = place(snap, request, PlacementConfig(policy="fgd"), 0, explain_refused=False)
    assert full.allocation is None and brief.allocation is None
    assert full.explanation.rejected and full.explanation.failing
    assert (brief.explanation.rejected, brief.explanation.failing, brief.explanation.shortfalls) == ((), (), ())
    assert brief.explanation.nodes_feasible == 0 and brief.explanation.chosen is None
    # The simulator's per-pod outcomes (`track`) still carry the full sentence of a refusal.
    nodes = [node("a").cpu(4).gpus(1).build(), node("b").cpu(4).build()]
    events, _ = replay(
        nodes, [gpus(1, id="p1"), gpus(2, id="p2"), cpu_only(16000, id="p3")], PlacementConfig(), track=True
    )
    assert events.outcomes == (
        "a GPU 0",
        "0/2 nodes fit: 1 no GPUs, 1 fewer than 2 eligible GPUs",
        "0/2 nodes fit: 2 CPU capacity below 16000m",
    )
    untracked, _ = replay(nodes, [gpus(1, id="p1"), gpus(2, id="p2"), cpu_only(16000, id="p3")], PlacementConfig())
    assert untracked.placed.tolist() == events.placed.tolist() == [True, False, False]


@settings(max_examples=150, deadline=None)
@given(
    rows=st.integers(5, 12).flatmap(
        lambda n: st.integers(1, 9).flatmap(
            lambda g: st.tuples(
                arrays(np.int64, (n, g), elements=st.sampled_from([-1, 0, 250, 500, 1000]) | st.integers(-1, 1000)),
                arrays(np.bool_, (n, g)),
            )
        )
    ),
    k=st.integers(0, 9),
)
def test_first_k_ascending_row_by_row_equals_the_vectorised_choice(rows: tuple[np.ndarray, np.ndarray], k: int) -> None:
    """A row or two are chosen in Python (a decision's case), many with numpy: the same GPUs, ties to the lower
    index."""
    free, fit = rows
    want = first_k_ascending(free, fit, k)  # more rows than the Python path takes
    for i in range(len(free)):
        assert first_k_ascending(free[i : i + 1], fit[i : i + 1], k).tolist() == want[i : i + 1].tolist()
    assert first_k_ascending(free[:2], fit[:2], k).tolist() == want[:2].tolist()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_evaluate_kept_per_shape_equals_a_fresh_evaluation(data: st.DataObject) -> None:
    """A GPU request's fit is kept per request shape and refreshed only where a node's version moved: after any
    stream of placements and releases (shares with owners included), it equals the fit computed afresh."""
    snap = data.draw(clusters(), label="cluster")
    fresh = ClusterSnapshot(snap.nodes, snap.rank.tolist())
    config = PlacementConfig(policy="random", gpu_behavior=GpuBehavior.UNRESTRICTED)
    probes = [draw_request(data, snap, f"probe{i}") for i in range(3)]
    live: list[str] = []
    for step in range(data.draw(st.integers(1, 15), label="steps")):
        if live and data.draw(st.integers(0, 2), label="op") == 0:
            rid = live.pop(data.draw(st.integers(0, len(live) - 1), label="victim"))
            snap.release(rid)
            fresh.release(rid)
        else:
            request = draw_request(data, snap, f"r{step}")
            if data.draw(st.booleans(), label="owned") and request.wants_gpu and not request.whole_gpus:
                request = dataclasses.replace(request, share_owner=data.draw(st.sampled_from(["u1", "u2"])))
            decision = place(snap, request, config, step)
            if decision.allocation is not None:
                snap.allocate(decision.allocation)
                fresh.allocate(decision.allocation)
                live.append(request.id)
            probes.append(request)
        for probe in probes[-4:]:
            got = evaluate(snap, probe, GpuBehavior.UNRESTRICTED, GpuReserve())
            fresh.memo.clear()
            want = evaluate(fresh, probe, GpuBehavior.UNRESTRICTED, GpuReserve())
            assert got.reasons.tolist() == want.reasons.tolist()
            assert got.gpu_fit.tolist() == want.gpu_fit.tolist()
            assert got.feasible.tolist() == want.feasible.tolist()
            got.reasons[:] = -1  # a decision's arrays are its own: changing them changes no later evaluation
            got.gpu_fit[:] = True


def test_reason_labels_are_composed_once_per_shape_and_each_caller_gets_its_own_dict() -> None:
    from corral.model.resources import Constraint, ConstraintOp
    from corral.placement.explain import reason_labels
    from corral.placement.reasons import Reason

    a = gpus(2, 300, cpu=4000, gpu_memory_mib=2048, id="a", gpu_models=frozenset({"T4", "A100"}))
    labels = reason_labels(a)
    assert labels[Reason.INSUFFICIENT_GPU] == "insufficient GPU (need 2 GPUs at 30 % and with 2048 MiB)"
    assert labels[Reason.GPU_MODEL] == "GPU model not in [A100, T4]"
    labels[Reason.GPU_MODEL] = "changed by the caller"
    assert reason_labels(dataclasses.replace(a, id="b"))[Reason.GPU_MODEL] == "GPU model not in [A100, T4]"
    # Any field the words use gives other words.
    assert reason_labels(dataclasses.replace(a, cpu_milli=8000))[Reason.INSUFFICIENT_CPU] == (
        "insufficient CPU (need 8000m)"
    )
    assert reason_labels(dataclasses.replace(a, min_gpu_memory_mib=40960))[Reason.GPU_MEMORY] == (
        "no GPU with 40960 MiB of model [A100, T4]"
    )
    zone = Constraint("zone", ConstraintOp.IS, "z1")
    assert reason_labels(dataclasses.replace(a, constraints=(zone,)))[Reason.CONSTRAINT] == (
        f"constraint not met ({zone})"
    )
