"""The reserve's fast path (issue 16: fgd-priced at fgd's speed) keeps exactly the nodes the plain rule keeps.

`kept_hosts` keeps host counts per type up to date node by node, counts room once per GPU group, and touches the
nodes only for the types at or under their reserve. `plain_kept` below is the rule of `placement.reserve` written
out with whole-cluster arrays recomputed on every call; the two must agree on every state, as allocations come and go.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.model.arrays import BoolArray, IntArray
from corral.model.resources import MILLI_PER_GPU, Allocation, GpuGrant, Node, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement.reserve import kept_hosts
from corral.placement.scarce_hosts import scarce_hosts
from corral.placement.scarcity import horizon
from corral.placement.workload import TargetType, TargetWorkload
from tests.builders import cpu_only, gpus, node

TYPICAL = (
    TargetType(8_000, MILLI_PER_GPU, 1, None, 0.4),
    TargetType(4_000, 500, 1, None, 0.3),
    TargetType(2_000, 0, 0, None, 0.3),
)
#: Multi-GPU types in three GPU groups (any model whole, G2 whole, any model half): probabilities large enough
#: that on a small cluster the reserve is near the host counts.
GANG = (
    TargetType(60_000, MILLI_PER_GPU, 8, None, 0.04),
    TargetType(30_000, MILLI_PER_GPU, 4, None, 0.05),
    TargetType(16_000, MILLI_PER_GPU, 2, None, 0.08),
    TargetType(30_000, MILLI_PER_GPU, 4, frozenset({"G2"}), 0.03),
    TargetType(8_000, 500, 2, None, 0.06),
)


def plain_kept(
    s: ClusterSnapshot, w: TargetWorkload, r: Request, nodes: IntArray, cpu: bool, margin: float
) -> BoolArray:
    """The rule of `placement.reserve`, everything recomputed from the snapshot's columns."""
    types = [t for t in (*w.types, *w.tail) if t.gpu_count >= 2 and t.probability > 0]
    gang = [
        i
        for i, t in enumerate(types)
        if not (r.cpu_milli >= t.cpu_milli and r.gpu_count >= t.gpu_count and r.gpu_milli >= t.gpu_milli)
    ]
    scarce = scarce_hosts(s, w, tuple(types))
    h = horizon(s, w, cpu)
    keep = np.zeros(len(nodes), dtype=np.bool_)
    for i in gang:
        t = types[i]
        p = 0.0
        for o in gang:
            a = types[o]
            models_ok = t.models is None or (a.models is not None and a.models <= t.models)
            if a.cpu_milli >= t.cpu_milli and a.gpu_count >= t.gpu_count and a.gpu_milli >= t.gpu_milli and models_ok:
                p += a.probability
        room = ((s.gpu_milli_free >= t.gpu_milli) & s.gpu_static_mask(t.models, 0)).sum(axis=1)
        hosts = (s.cpu_free >= t.cpu_milli) & (room >= t.gpu_count)
        floor = int(scarce.floors[i])
        if floor:
            keep |= scarce.nodes[i, nodes] & ~hosts[nodes]
        reserve = max(math.ceil(margin * h * p - 1e-9), floor)
        count = int(hosts.sum())
        if reserve <= 0 or count == 0 or count > reserve:
            continue
        broken = (s.cpu_free[nodes] - r.cpu_milli < t.cpu_milli) | (room[nodes] - r.gpu_count < t.gpu_count)
        keep |= hosts[nodes] & broken
    return keep


def build(spec: list[tuple[int, int, str]]) -> ClusterSnapshot:
    out: list[Node] = [
        node(f"n{k}").gpus(g, model=m).cpu(c).mem(512).build() if g else node(f"n{k}").cpu(c).mem(512).build()
        for k, (g, c, m) in enumerate(spec)
    ]
    return ClusterSnapshot(out)


def take(s: ClusterSnapshot, rid: str, i: int, cpu: int, grants: list[tuple[int, int]]) -> bool:
    """Allocate `cpu` milli and (GPU, milli) grants on node i if they fit; False (and no change) if not."""
    gg = []
    for j, milli in grants:
        if j >= s.gpu_count[i] or s.gpu_milli_free[i, j] < milli:
            return False
        mem = int(s.gpu_mem_cap[i, j]) if milli == MILLI_PER_GPU else 1
        if milli == MILLI_PER_GPU and (s.gpu_milli_free[i, j] != MILLI_PER_GPU or s.gpu_mem_free[i, j] != mem):
            return False
        if milli < MILLI_PER_GPU and s.gpu_mem_free[i, j] < 1:
            return False
        gg.append(GpuGrant(j, milli, mem))
    if cpu > s.cpu_free[i] or len({j for j, _ in grants}) < len(grants):
        return False
    s.allocate(Allocation(rid, s.names[i], i, cpu, 1, tuple(gg)))
    return True


NODE = st.tuples(
    st.sampled_from([0, 2, 4, 8, 8]), st.sampled_from([16, 32, 64, 96, 128]), st.sampled_from(["G1", "G2"])
)
REQUEST = st.one_of(
    st.builds(lambda c: cpu_only(c), st.sampled_from([1_000, 8_000, 40_000])),
    st.builds(
        lambda n, m, c: gpus(n, milli=m, cpu=c),
        st.sampled_from([1, 2, 4, 8]),
        st.sampled_from([250, 500, MILLI_PER_GPU]),
        st.sampled_from([2_000, 16_000, 64_000]),
    ),
)
STEP = st.tuples(
    st.booleans(),  # release one held allocation (else allocate)
    st.integers(0, 10_000),  # which node / which allocation
    st.sampled_from([0, 4_000, 16_000, 60_000]),  # CPU milli
    st.lists(st.tuples(st.integers(0, 7), st.sampled_from([250, 500, MILLI_PER_GPU])), max_size=3),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=st.lists(NODE, min_size=1, max_size=24),
    tail=st.lists(st.sampled_from(GANG), min_size=1, max_size=5, unique=True),
    rounds=st.lists(st.tuples(st.lists(STEP, max_size=18), REQUEST, st.booleans(), st.booleans()), max_size=12),
    subset=st.integers(0, 2**24),
)
def test_kept_hosts_equal_the_plain_rule_as_allocations_come_and_go(
    spec: list[tuple[int, int, str]],
    tail: list[TargetType],
    rounds: list[tuple[list[tuple[bool, int, int, list[tuple[int, int]]]], Request, bool, bool]],
    subset: int,
) -> None:
    s = build(spec)
    w = TargetWorkload(TYPICAL, tuple(tail))
    held: list[str] = []
    for k, (steps, request, cpu, gpu_margin) in enumerate(rounds):
        # Between calls: up to 18 changes (the table is refreshed for every node whose version moved).
        for m, (release, which, c, grants) in enumerate(steps):
            if release and held:
                s.release(held.pop(which % len(held)))
            elif take(s, f"a{k}-{m}", which % len(s), c, grants):
                held.append(f"a{k}-{m}")
        everything = np.arange(len(s), dtype=np.int64)
        some = everything[[(subset >> (b % 24)) & 1 == 1 for b in range(len(s))]]
        margin = 1.5 if gpu_margin else 1.0
        for nodes in (everything, some):
            fast = kept_hosts(s, w, request, nodes, cpu, margin)
            assert fast.tolist() == plain_kept(s, w, request, nodes, cpu, margin).tolist()


def test_a_type_at_its_reserve_keeps_its_hosts_and_one_above_keeps_nothing() -> None:
    """Ten 8-GPU hosts; H x p crosses from 10 to 11 as the free GPU milli grows: at 10 hosts for a reserve of 10 the
    hosts a 1-GPU pod would break are kept (all ten), at a reserve of 9 none is. Checked against the plain rule."""
    s = build([(8, 64, "G1")] * 10)
    small = gpus(1, cpu=4_000)
    nodes = np.arange(len(s), dtype=np.int64)
    # H = 80 GPUs x 1000 milli / (0.5 x 1000 per pod) = 160 pods; 160 x p x 1.0 = 10 for p = 1/16.
    typical = (TargetType(4_000, MILLI_PER_GPU, 1, None, 0.5), TargetType(4_000, 0, 0, None, 0.5))
    at_reserve = TargetWorkload(typical, (TargetType(60_000, MILLI_PER_GPU, 8, None, 1 / 16),))
    assert horizon(s, at_reserve) == 160
    kept = kept_hosts(s, at_reserve, small, nodes, False, 1.0)
    assert kept.tolist() == [True] * 10 == plain_kept(s, at_reserve, small, nodes, False, 1.0).tolist()
    # A reserve of 9 (p = 9/160) against 10 hosts: nothing kept.
    above = TargetWorkload(typical, (TargetType(60_000, MILLI_PER_GPU, 8, None, 9 / 160),))
    assert not kept_hosts(s, above, small, nodes, False, 1.0).any()
    assert not plain_kept(s, above, small, nodes, False, 1.0).any()
    # One host broken (a GPU taken) brings the count to 9, at the reserve: the 9 left are kept, not the broken one.
    assert take(s, "x", 3, 1_000, [(0, MILLI_PER_GPU)])
    kept = kept_hosts(s, above, small, nodes, False, 1.0)
    assert kept.tolist() == [True] * 3 + [False] + [True] * 6
    assert kept.tolist() == plain_kept(s, above, small, nodes, False, 1.0).tolist()
    # Released again: back to 10 hosts and nothing kept (the counts follow releases as well as allocations).
    s.release("x")
    assert not kept_hosts(s, above, small, nodes, False, 1.0).any()
