"""The compiled kernels (issue 16: fgd-priced at fgd's speed) give the floats and integers of the definitions.

FGD's 49-or-50 ties hang on F's rounding residues, so F must equal the plain reading of the study
(`reference.fragmentation`) bit for bit (`==`, not approximately), on current states and on the hypothetical ones
fgd scores a request by; the fill must equal the vectorised `type_fill` (kept for many candidate states per node); and
the fused per-decision kernels must equal the pieces they fuse.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.model.resources import Allocation, GpuBehavior, GpuGrant
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.placement.fill import share_unfilled, type_fill
from corral.placement.native import kernels
from corral.placement.reference import fragmentation
from corral.placement.workload import (
    DEFAULT_WORKLOAD,
    TargetType,
    TargetWorkload,
    compile_workload,
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


def plain_f(snap: ClusterSnapshot, workload: TargetWorkload, i: int, cpu: int, milli: list[int]) -> float:
    """The study's F of node i with free CPU `cpu` and per-GPU free milli `milli` (present GPUs only)."""
    pairs = [(snap.models[int(snap.gpu_model[i, j])], milli[j]) for j in range(snap.max_gpus) if snap.gpu_present[i, j]]
    return fragmentation(cpu, pairs, workload)


def hypothetical(data: st.DataObject, snap: ClusterSnapshot) -> tuple[np.ndarray, np.ndarray]:
    """Any free CPU, any free milli (0..1000) on present GPUs, -1 on absent ones."""
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
    return cpu, milli


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_f_equals_the_studys_f_bit_for_bit_on_current_and_hypothetical_states(data: st.DataObject) -> None:
    snap, workload = used(data)
    everything = np.arange(len(snap), dtype=np.int64)
    rows = range(len(snap))
    want = [plain_f(snap, workload, i, int(snap.cpu_free[i]), snap.gpu_milli_free[i].tolist()) for i in rows]
    assert node_fragmentation(snap, workload, everything).tolist() == want
    # One node at a time (a decision's case) gives the same floats as all at once.
    assert [node_fragmentation(snap, workload, np.array([i]))[0] for i in everything] == want
    cpu, milli = hypothetical(data, snap)
    want = [plain_f(snap, workload, i, int(cpu[i]), milli[i].tolist()) for i in range(len(snap))]
    assert node_fragmentation(snap, workload, everything, cpu, milli).tolist() == want


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_share_f_equals_the_studys_f_of_each_state_the_share_leads_to(data: st.DataObject) -> None:
    """Per GPU the share fits: F of the node with the share's CPU and milli taken from that GPU."""
    snap, workload = used(data)
    cpu = data.draw(st.integers(0, 20000), label="cpu")
    milli = data.draw(st.integers(1, 999), label="milli")
    everything = np.arange(len(snap), dtype=np.int64)
    got = share_fragmentation_after(snap, workload, everything, cpu, milli)
    for i in everything:
        free = snap.gpu_milli_free[i].tolist()
        for j in range(snap.max_gpus):
            if snap.gpu_present[i, j] and free[j] >= milli:
                after = [u - milli if k == j else u for k, u in enumerate(free)]
                assert got[i, j] == plain_f(snap, workload, int(i), int(snap.cpu_free[i]) - cpu, after), (i, j)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_fill_equals_the_vectorised_fill(data: st.DataObject) -> None:
    """`type_fill` on one state per node (the kernel) equals its numpy path on the same states given as one candidate
    per node; the share's fill per GPU equals the fill of each state the share leads to."""
    snap, workload = used(data)
    everything = np.arange(len(snap), dtype=np.int64)
    cpu, milli = hypothetical(data, snap)
    slots, unfilled = type_fill(snap, workload, everything, cpu, milli)
    want_slots, want_unfilled = type_fill(snap, workload, everything, cpu[:, None], milli[:, None, :])
    assert slots.tolist() == want_slots[:, :, 0].tolist()
    assert unfilled.tolist() == want_unfilled[:, :, 0].tolist()
    c, m = data.draw(st.integers(0, 20000), label="cpu"), data.draw(st.integers(1, 999), label="milli")
    after = share_unfilled(snap, workload, everything, c, m)
    for j in range(snap.max_gpus):
        state = snap.gpu_milli_free.copy()
        state[:, j] -= m
        _, want = type_fill(snap, workload, everything, snap.cpu_free - c, state)
        assert after[:, :, j].tolist() == want.tolist(), j


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_fused_parts_equal_their_pieces(data: st.DataObject) -> None:
    """fgd-scarcity's per-node parts (F before minus after, and the unfilled milli removed per type) from one kernel
    call equal F and the fill of the before and after states computed apart; for a pod that is not a share, the
    after state takes the fitting GPUs tightest first, lowest index on ties (`fgd.node_after`)."""
    snap, workload = used(data)
    w, k = compile_workload(snap, workload), kernels()
    everything = np.arange(len(snap), dtype=np.int64)
    f_now = node_fragmentation(snap, workload, everything)
    _, unfilled_now = type_fill(snap, workload, everything, snap.cpu_free, snap.gpu_milli_free)
    c, m = data.draw(st.integers(0, 20000), label="cpu"), data.draw(st.integers(1, 999), label="milli")
    delta, drop = k.share_parts(
        everything, snap.cpu_free, snap.gpu_milli_free, snap.gpu_present, w.by_node, w.table, w.prob, c, m
    )
    f_after = share_fragmentation_after(snap, workload, everything, c, m)
    assert delta.tolist() == (f_now[:, None] - f_after).tolist()
    assert drop.tolist() == (unfilled_now[:, :, None] - share_unfilled(snap, workload, everything, c, m)).tolist()
    count = data.draw(st.integers(0, 3), label="count")
    milli = data.draw(st.sampled_from([1000, 500, 300]), label="pod milli")
    fit = snap.gpu_present & (snap.gpu_milli_free >= milli)
    delta, drop = k.pod_parts(
        everything, snap.cpu_free, snap.gpu_milli_free, fit, snap.gpu_present, w.by_node, w.table, w.prob, c, milli,
        count,
    )  # fmt: skip
    state = snap.gpu_milli_free.copy()
    for i in everything:
        fitting = sorted((u, j) for j, u in enumerate(snap.gpu_milli_free[i].tolist()) if fit[i, j])
        for _, j in fitting[:count]:
            state[i, j] -= milli
    _, unfilled_after = type_fill(snap, workload, everything, snap.cpu_free - c, state)
    assert delta.tolist() == (f_now - node_fragmentation(snap, workload, everything, snap.cpu_free - c, state)).tolist()
    assert drop.tolist() == (unfilled_now - unfilled_after).tolist()


def test_f_of_twin_nodes_is_equal_and_one_different_input_changes_it() -> None:
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
    got = node_fragmentation(snap, workload, np.arange(len(snap), dtype=np.int64)).tolist()
    assert got == [plain_f(snap, workload, i, int(snap.cpu_free[i]), snap.gpu_milli_free[i].tolist()) for i in range(6)]
    assert got[0] == got[1]
    assert len({got[0], got[2], got[3], got[4]}) == 4  # c, d, e each differ from a


def test_fgd_decides_alike_with_warm_and_emptied_caches_on_twin_nodes() -> None:
    """Three twin nodes and a stream of shares: fgd's decisions with warm caches equal those of a twin cluster whose
    memo is emptied before every decision (fgd's per-state score cache over the kernels' F)."""
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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    states=st.lists(
        st.tuples(st.integers(-1, 3), st.lists(st.sampled_from([-1, 0, 500, 1000]), min_size=2, max_size=2)),
        min_size=1,
        max_size=200,
    ),
    cap=st.sampled_from([1, 4, 64]),
)
def test_state_ids_are_equal_exactly_for_equal_states_as_the_table_grows(
    states: list[tuple[int, list[int]]], cap: int
) -> None:
    """`kernels.assign_states` against a dict of the same rows: a node in a state seen before gets that state's id,
    a new state the next id, through growth of the table (`_StateScores.room_for` rehashes) from any start."""
    from corral.placement.scores.fgd_scarcity import _StateScores

    n, g = len(states), 2
    cpu = np.array([c for c, _ in states], dtype=np.int64)
    milli = np.array([m for _, m in states], dtype=np.int64)
    model = np.zeros((n, g), dtype=np.int64)
    fit = milli >= 500
    e = _StateScores(
        np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64), np.zeros((cap, 1 + 3 * g), dtype=np.int64),
        np.zeros(2 * cap if cap > 1 else 2, dtype=np.int64), np.zeros(1, dtype=np.int64),
        np.zeros(cap), np.zeros(cap, dtype=np.int64), np.zeros(cap, dtype=np.bool_), None,
    )  # fmt: skip
    version = np.ones(n, dtype=np.int64)
    want: dict[tuple[int, ...], int] = {}
    for lo in range(0, n, 7):  # a few nodes per call, as decisions come
        batch = np.arange(lo, min(n, lo + 7), dtype=np.int64)
        e.room_for(len(batch))
        kernels().assign_states(batch, cpu, milli, model, fit, e.rows, e.slots, e.count, e.sid, e.versions, version)
        for i in batch.tolist():
            row = (int(cpu[i]), *milli[i].tolist(), *model[i].tolist(), *fit[i].astype(int).tolist())
            assert e.sid[i] == want.setdefault(row, len(want)), (i, row)
    assert int(e.count[0]) == len(want)
    assert e.versions.tolist() == version.tolist()
