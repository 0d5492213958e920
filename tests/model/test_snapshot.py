"""ClusterSnapshot keeps its invariants: a refused allocate changes nothing."""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt
import pytest

from corral.model.errors import AllocationError, InvalidRequest
from corral.model.holdings import Holdings, give_back
from corral.model.resources import Allocation, GpuGrant
from corral.model.snapshot import ClusterSnapshot
from tests.builders import cluster, node

COLUMNS = ClusterSnapshot.STATE_COLUMNS


def columns(s: ClusterSnapshot) -> dict[str, npt.NDArray[np.int64]]:
    return {c: getattr(s, c).copy() for c in COLUMNS}


def assert_same(a: dict[str, npt.NDArray[np.int64]], b: dict[str, npt.NDArray[np.int64]]) -> None:
    for c in COLUMNS:
        assert np.array_equal(a[c], b[c]), f"column {c} differs: {a[c]} != {b[c]}"


def snap() -> ClusterSnapshot:
    return cluster(node("a").gpus(2, memory_gib=16).cpu(8).mem(32), node("b").cpu(4).mem(8))


def alloc(
    rid: str,
    node_name: str = "a",
    idx: int = 0,
    cpu: int = 1000,
    mem: int = 1024,
    gpus: tuple[GpuGrant, ...] = (),
    tag: int = 0,
) -> Allocation:
    return Allocation(rid, node_name, idx, cpu, mem, gpus, tag)


def test_layout() -> None:
    s = snap()
    assert s.max_gpus == 2 and s.total_gpus == 2 and s.models == ["A100"]
    assert s.gpu_milli_free.tolist() == [[1000, 1000], [-1, -1]]  # absent GPUs hold -1
    assert s.gpu_free_total.tolist() == [2000, 0]
    assert s.node_index("b") == 1
    with pytest.raises(InvalidRequest, match="unknown node 'zz'"):
        s.node_index("zz")


def test_allocate_and_release_round_trip() -> None:
    s = snap()
    before = columns(s)
    whole = alloc("w", gpus=(GpuGrant(0, 1000, 16384),), tag=1)
    share = alloc("s", gpus=(GpuGrant(1, 300, 2048),), tag=-1)
    s.allocate(whole)
    s.allocate(share)
    assert s.gpu_milli_free[0].tolist() == [0, 700]
    assert s.gpu_mem_free[0].tolist() == [0, 14336]
    assert s.gpu_full_free[0] == 0 and s.gpu_free_total[0] == 700 and s.gpu_allocated_milli == 1300
    assert s.tag_counts[0, 2] == 1 and s.tag_counts[0, 0] == 1
    v = int(s.version[0])
    assert s.release("w") == whole
    assert s.version[0] == v + 1 and s.gpu_full_free[0] == 1
    s.release("s")
    assert_same(before, columns(s))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (alloc("x", cpu=9000), "a: CPU over-commit \\(9000m > 8000m free\\)"),
        (alloc("x", mem=40000), "memory over-commit"),
        (alloc("x", gpus=(GpuGrant(2, 100, 0),)), "a GPU 2: no such GPU"),
        (alloc("x", gpus=(GpuGrant(0, 100, 0), GpuGrant(0, 100, 0))), "granted twice in one allocation"),
        (alloc("x", gpus=(GpuGrant(0, 1000, 100),)), "must carry all 16384 MiB"),
        (alloc("x", gpus=(GpuGrant(0, 0, 0),)), "invalid grant"),
        (alloc("x", node_name="b", idx=0), "names node 'b' at index 0: no such node"),
    ],
)
def test_refused_allocations_change_nothing(bad: Allocation, message: str) -> None:
    s = snap()
    before = columns(s)
    with pytest.raises(AllocationError, match=message):
        s.allocate(bad)
    assert_same(before, columns(s))
    assert not s.allocations


def test_no_share_granted_twice_and_no_whole_gpu_over_a_share() -> None:
    s = snap()
    s.allocate(alloc("s1", gpus=(GpuGrant(0, 600, 1024),), tag=-1))
    with pytest.raises(AllocationError, match="already granted"):
        s.allocate(alloc("s1", gpus=(GpuGrant(1, 100, 0),), tag=-1))
    with pytest.raises(AllocationError, match="GPU over-commit \\(500 > 400 milli free\\)"):
        s.allocate(alloc("s2", gpus=(GpuGrant(0, 500, 0),), tag=-1))
    with pytest.raises(AllocationError, match="a whole GPU was granted but part of it is already held"):
        s.allocate(alloc("w", gpus=(GpuGrant(0, 1000, 16384),), tag=1))
    # A memory-only share keeps the GPU from being granted whole too.
    s.allocate(alloc("m", gpus=(GpuGrant(1, 0, 4096),), tag=-1))
    assert s.gpu_full_free[0] == 0
    with pytest.raises(AllocationError, match="part of it is already held"):
        s.allocate(alloc("w2", gpus=(GpuGrant(1, 1000, 16384),), tag=1))
    with pytest.raises(AllocationError, match="allocation 'nope' is not granted"):
        s.release("nope")


def test_copy_is_independent() -> None:
    s = snap()
    c = s.copy()
    c.allocate(alloc("x"))
    assert s.cpu_free[0] == 8000 and c.cpu_free[0] == 7000


def test_bad_clusters() -> None:
    with pytest.raises(InvalidRequest, match="appears twice"):
        cluster(node("a"), node("a"))
    with pytest.raises(InvalidRequest, match="at least one node"):
        ClusterSnapshot([])
    with pytest.raises(InvalidRequest, match="one tie-break rank per node \\(1\\), got 2"):
        cluster(node("a"), ranks=[0, 1])
    s = snap()
    with pytest.raises(InvalidRequest, match="node b has no GPU 0"):
        s.set_gpu_utilization(1, 0, 0.5)
    with pytest.raises(InvalidRequest, match=re.escape("utilization: must be in 0..1")):
        s.set_gpu_utilization(0, 0, 1.5)


def test_share_owners_keep_to_their_gpus() -> None:
    s = snap()
    s.allocate(Allocation("a", "a", 0, 0, 0, (GpuGrant(0, 300, 0),), -1, share_owner="alice"))
    before = columns(s)
    with pytest.raises(AllocationError, match="a GPU 0: its shares belong to another owner than 'bob'"):
        s.allocate(Allocation("b", "a", 0, 0, 0, (GpuGrant(0, 300, 0),), -1, share_owner="bob"))
    assert_same(before, columns(s))
    s.allocate(Allocation("a2", "a", 0, 0, 0, (GpuGrant(0, 300, 0),), -1, share_owner="alice"))
    assert int(s.gpu_owner_shares[0, 0]) == 2
    s.release("a")
    s.release("a2")
    assert int(s.gpu_owner[0, 0]) == -1
    s.allocate(Allocation("b", "a", 0, 0, 0, (GpuGrant(0, 300, 0),), -1, share_owner="bob"))


def _busy(seed: int) -> tuple[ClusterSnapshot, list[str]]:
    """Three 4-GPU nodes filled at random with whole GPUs, shares (some owned) and CPU-only allocations."""
    rng = np.random.default_rng(seed)
    s = cluster(*(node(f"n{i}").gpus(4, memory_gib=16).cpu(64).mem(256) for i in range(3)))
    ids: list[str] = []
    for k in range(40):
        i = int(rng.integers(3))
        kind = int(rng.integers(3))
        j = int(rng.integers(4))
        owner = "" if kind != 1 or rng.random() < 0.5 else f"o{int(rng.integers(2))}"
        gpus = () if kind == 2 else (GpuGrant(j, 1000, 16384),) if kind == 0 else (GpuGrant(j, 250, 1024),)
        tag = 0 if kind == 2 else 1 if kind == 0 else -1
        a = Allocation(f"a{k}", f"n{i}", i, int(rng.integers(1, 4)) * 500, 1024, gpus, tag, share_owner=owner)
        try:
            s.allocate(a)
        except AllocationError:
            continue
        ids.append(a.request_id)
    return s, ids


@pytest.mark.parametrize("seed", range(12))
def test_release_many_is_the_releases_one_by_one(seed: int) -> None:
    s, ids = _busy(seed)
    assert len(ids) >= 16
    rng = np.random.default_rng(seed + 100)
    chosen = [ids[i] for i in rng.permutation(len(ids))[: int(rng.integers(8, len(ids)))]]
    one, many = s.copy(), s.copy()
    for r in chosen:
        one.release(r)
    got = many.release_many(chosen)
    assert [a.request_id for a in got] == chosen
    assert_same(columns(one), columns(many))
    assert np.array_equal(one.version, many.version)
    assert one.allocations == many.allocations
    for a in reversed(got):  # what was released can be granted again: back to the start
        many.allocate(a)
    assert_same(columns(s), columns(many))
    probe = s.copy(allocations=False)  # a what-if copy: the same columns, from the allocations themselves
    probe.release_held([s.allocations[r] for r in chosen])
    assert_same(columns(one), columns(probe))


def test_release_many_refuses_whole() -> None:
    s, ids = _busy(1)
    before = columns(s)
    with pytest.raises(AllocationError, match="allocation 'nope' is not granted"):
        s.release_many([*ids[:10], "nope"])
    with pytest.raises(AllocationError, match="named twice"):
        s.release_many([*ids[:10], ids[0]])
    assert_same(before, columns(s))
    assert set(s.allocations) == set(ids)


def test_copies_share_only_what_never_changes() -> None:
    s, ids = _busy(2)
    c = s.copy()
    for key in ClusterSnapshot.STATIC_COLUMNS:
        assert getattr(c, key) is getattr(s, key)
    for key in (*COLUMNS, "version", "gpu_util"):
        assert getattr(c, key) is not getattr(s, key)
    probe = s.copy(allocations=False)
    assert probe.allocations == {} and set(s.allocations) == set(ids)
    assert_same(columns(s), columns(probe))


@pytest.mark.parametrize("seed", range(12))
def test_giving_back_holdings_columns_is_release_held(seed: int) -> None:
    """`holdings.give_back` (a reservation's probe, a preemption search's every-candidate-gone copy) leaves the
    columns exactly as `release_held` of the same allocations; the Holdings columns are each allocation's own, kept
    between calls (a second call with the same objects reads nothing again) and follow allocations that change."""
    s, ids = _busy(seed)
    rng = np.random.default_rng(seed + 200)
    unowned = [r for r in ids if not s.allocations[r].share_owner]
    chosen = [unowned[i] for i in rng.permutation(len(unowned))[: int(rng.integers(4, len(unowned)))]]
    allocs = [s.allocations[r] for r in chosen]
    holdings = Holdings()
    cols = holdings.of(allocs, s.max_gpus)
    assert holdings.of(list(allocs), s.max_gpus) is cols
    assert cols[7].tolist() == [len(a.gpus) for a in allocs] and not cols[4].any()
    want, got = s.copy(allocations=False), s.copy(allocations=False)
    want.release_held(allocs)
    give_back(got, cols[0], cols[1], cols[2], cols[3], cols[5], cols[6])
    assert_same(columns(want), columns(got))
    assert np.array_equal(want.version, got.version)
    again = holdings.of(allocs[1:] + allocs[:1], s.max_gpus)  # the same objects in another order: their own rows
    assert all(np.array_equal(a, np.roll(b, -1, axis=0)) for a, b in zip(again, cols, strict=True))


def test_holdings_kept_across_calls_grow_and_read_as_a_fresh_one() -> None:
    """Holdings fed new grants call after call (a cluster's churn: its room grows by doubling, the new rows written in
    place) gives every call the columns a fresh Holdings reads from the same grants."""
    kept = Holdings()
    made: list[Allocation] = []
    for step in range(6):
        for k in range(700):  # past the first room of 1,024 rows and its doubling
            made.append(Allocation(f"a{step}-{k}", f"n{k % 7}", k % 7, 1000 + k, 512, (GpuGrant(k % 4, 500, 1024),), 0))
        window = made[-1500:]  # the oldest leave, as pods end
        got, want = kept.of(window, 4), Holdings().of(window, 4)
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)), step
