"""F of one node in plain Python (issue 16, fgd speed part 3) equals the vectorised F bit for bit.

`workload.node_fragmentation` and `share_fragmentation_after` compute F node by node in Python for a handful of
nodes, memoised by node state, and with numpy for many. FGD's 49-or-50 ties hang on F's rounding residues, so the
two must agree exactly (`tolist() ==`, not approximately) on every state, hypothetical ones included; a memo hit
must equal a fresh computation; and nodes that differ in one input must not share an entry."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.model.resources import Allocation, GpuBehavior, GpuGrant
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.placement.workload import (
    DEFAULT_WORKLOAD,
    TargetType,
    TargetWorkload,
    _node_fragmentation,
    _scalar,
    _share_fragmentation_after,
    node_fragmentation,
    share_fragmentation_after,
)
from tests.builders import cluster, gpus, node
from tests.placement.test_properties import clusters, draw_request, normalised, target_types


def used(data: st.DataObject) -> tuple[ClusterSnapshot, TargetWorkload]:
    snap = data.draw(clusters(), label="cluster")
    types = data.draw(st.lists(target_types(snap.models), min_size=1, max_size=8), label="types")
    workload = data.draw(st.sampled_from([DEFAULT_WORKLOAD, normalised(types)]), label="workload")
    config = PlacementConfig(policy="random", gpu_behavior=GpuBehavior.UNRESTRICTED)
    for step in range(data.draw(st.integers(0, 15), label="placements")):
        decision = place(snap, draw_request(data, snap, f"r{step}"), config, step)
        if decision.allocation is not None:
            snap.allocate(decision.allocation)
    return snap, workload


def one_by_one(snap: ClusterSnapshot, workload: TargetWorkload, cpu: np.ndarray, milli: np.ndarray) -> list[float]:
    """node_fragmentation one node at a time (the scalar path), on the given states."""
    return [
        node_fragmentation(snap, workload, np.array([i]), cpu[i : i + 1], milli[i : i + 1])[0] for i in range(len(snap))
    ]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_scalar_f_equals_the_vectorised_f_on_current_and_hypothetical_states(data: st.DataObject) -> None:
    snap, workload = used(data)
    everything = np.arange(len(snap), dtype=np.int64)
    want = _node_fragmentation(snap, workload, everything, snap.cpu_free, snap.gpu_milli_free).tolist()
    assert one_by_one(snap, workload, snap.cpu_free, snap.gpu_milli_free) == want
    # Again: now every state is a memo hit, and a hit gives the fresh value.
    assert one_by_one(snap, workload, snap.cpu_free, snap.gpu_milli_free) == want
    snap.memo.clear()
    assert one_by_one(snap, workload, snap.cpu_free, snap.gpu_milli_free) == want
    # Hypothetical states (what fgd scores a request by): any free CPU, any free milli on present GPUs.
    cpu = np.array(data.draw(st.lists(st.integers(-2000, 70000), min_size=len(snap), max_size=len(snap))))
    milli = np.where(
        snap.gpu_present,
        np.array(
            data.draw(
                st.lists(
                    st.sampled_from([0, 1000, 500, 250]) | st.integers(0, 1000),
                    min_size=snap.gpu_milli_free.size,
                    max_size=snap.gpu_milli_free.size,
                )
            )
        ).reshape(snap.gpu_milli_free.shape),
        -1,
    )
    want = _node_fragmentation(snap, workload, everything, cpu, milli).tolist()
    assert one_by_one(snap, workload, cpu, milli) == want


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_scalar_share_f_equals_the_vectorised_one_on_every_gpu_column(data: st.DataObject) -> None:
    """Every column, absent GPUs and GPUs the share does not fit included (the callers mask them, but the vectorised
    arithmetic is the definition)."""
    snap, workload = used(data)
    cpu = data.draw(st.integers(0, 20000), label="cpu")
    milli = data.draw(st.integers(1, 999), label="milli")
    everything = np.arange(len(snap), dtype=np.int64)
    want = _share_fragmentation_after(snap, workload, everything, cpu, milli).tolist()
    got = [share_fragmentation_after(snap, workload, np.array([i]), cpu, milli)[0].tolist() for i in everything]
    assert got == want


def test_twin_nodes_share_one_memo_entry_and_a_node_differing_in_one_input_does_not() -> None:
    """a and b are twins (GPUs in another order: F counts and sums over GPUs, so their order cannot matter); c
    differs from a in one GPU's model only, d in free CPU only, e in one GPU's free milli only. For a workload that
    asks for model A100 and 8 cores, each of those differences changes F."""
    snap = cluster(
        node("a").cpu(16).gpus(2, model="A100"),
        node("b").cpu(16).gpus(2, model="A100"),
        node("c").cpu(16).gpus(2, model="A100"),
        node("d").cpu(16).gpus(2, model="A100"),
        node("e").cpu(16).gpus(2, model="A100"),
        node("v").cpu(16).gpus(2, model="V100"),
    )
    snap.gpu_model[2, 1] = snap.model_id["V100"]  # c: one V100 beside its A100 (same free milli as a's)
    workload = TargetWorkload(
        (
            TargetType(8000, 600, 1, frozenset({"A100"}), 0.5),
            TargetType(8000, 1000, 1, None, 0.3),
            TargetType(2000, 0, 0, None, 0.2),
        )
    )
    grants = {"a": (0, 500), "b": (1, 500), "c": (0, 500), "d": (0, 500), "e": (0, 300)}
    for name, (gpu, milli) in grants.items():
        i = snap.index[name]
        snap.allocate(Allocation(f"x{name}", name, i, 9000 if name == "d" else 4000, 0, (GpuGrant(gpu, milli, 0),)))
    everything = np.arange(len(snap), dtype=np.int64)
    want = _node_fragmentation(snap, workload, everything, snap.cpu_free, snap.gpu_milli_free).tolist()
    scalar = _scalar(snap, workload)
    got = []
    for i in range(len(snap)):
        got.append(node_fragmentation(snap, workload, np.array([i]))[0])
        if i == 1:  # a and b: one state, one entry
            assert len(scalar.memo) == 1
    assert got == want
    assert want[0] == want[1]
    assert len({want[0], want[2], want[3], want[4]}) == 4  # c, d, e each differ from a
    assert len(scalar.memo) == 5  # a=b, c, d, e, v


def test_fgd_decides_alike_with_and_without_the_memo_on_twin_nodes() -> None:
    """Three twin nodes and a stream of shares: fgd's decisions with warm memos equal those of a twin cluster whose
    memo is emptied before every decision (the scalar F, its memo and fgd's per-state score cache together)."""
    workload = TargetWorkload(
        (TargetType(4000, 500, 1, None, 0.5), TargetType(4000, 1000, 1, None, 0.3), TargetType(8000, 0, 0, None, 0.2))
    )
    config = PlacementConfig(policy="fgd", gpu_behavior=GpuBehavior.UNRESTRICTED, workload=workload)

    def fresh_cluster() -> ClusterSnapshot:
        return cluster(*(node(f"n{i}").cpu(32).gpus(4) for i in range(3)), ranks=[2, 0, 1])

    warm, cold = fresh_cluster(), fresh_cluster()
    for step, milli in enumerate([500, 250, 500, 1000, 250, 750, 500, 500, 250, 1000, 500, 250]):
        request = gpus(1, milli, cpu=2000, id=f"r{step}")
        got = place(warm, request, config, rng=step, explain_placed=False)
        cold.memo.clear()
        want = place(cold, request, config, rng=step, explain_placed=False)
        assert got.allocation == want.allocation, step
        assert got.allocation is not None and want.allocation is not None
        warm.allocate(got.allocation)
        cold.allocate(want.allocation)
