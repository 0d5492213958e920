"""ClusterSnapshot: the cluster as column arrays, updated in place by allocate/release.

    nodes x dims            nodes x GPUs (padded to the largest node; absent GPUs hold -1)
    cpu_cap  cpu_free       gpu_milli_free   gpu_mem_cap   gpu_mem_free   gpu_model (id, -1 absent)
    mem_cap  mem_free       gpu_numa  gpu_switch  (-1 unknown)   gpu_util (NaN unknown)
    gpu_free_total (U)      nvlink: nodes x GPUs x GPUs
    gpu_full_free (#GPUs with nothing granted)
    tag_counts (pods per GpuClustering tag)   version (bumped on every change of the node)

Absent GPUs hold -1 free milli and -1 memory, so no request (which asks for >= 0 of each) ever fits them and no
mask has to be and-ed with a "present" column on the hot path. `version` lets score caches recompute only the nodes
that changed since they last looked (see `placement.cache`).

Invariants kept by allocate/release (and checked by the property tests): no dimension goes below zero, a whole GPU
is granted only when nothing else holds any of it, an allocation id is granted once, release restores exactly what
allocate took.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from corral.model.arrays import BoolArray, FloatArray, IntArray
from corral.model.errors import AllocationError, InvalidRequest
from corral.model.resources import MILLI_PER_GPU, Allocation, Constraint, GpuGrant, Node


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU as the per-node reference implementation sees it."""

    index: int
    model: str
    memory_mib: int
    milli_free: int
    memory_free: int
    utilization: float | None


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node's free resources, for the plain per-node reference implementation and for display."""

    index: int
    name: str
    rank: int
    cpu_milli: int
    memory_mib: int
    cpu_free: int
    memory_free: int
    gpus: tuple[GpuState, ...]
    labels: Mapping[str, str]
    tags: Mapping[int, int]  # GpuClustering tag -> pods holding it


def _nbytes(value: Any) -> int:
    """Bytes of the numpy arrays an entry holds (directly, in a tuple or list, or as a dataclass's fields)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    fields = getattr(value, "__dict__", None)
    if fields is not None:
        return sum(_nbytes(v) for v in fields.values())
    return 0


_NODE_INDEX = attrgetter("node_index")
_CPU = attrgetter("cpu_milli")
_MEMORY = attrgetter("memory_mib")
_TAG = attrgetter("tag")
_GPUS = attrgetter("gpus")
_INDEX = attrgetter("index")
_MILLI = attrgetter("milli")
_MIB = attrgetter("memory_mib")

#: The memo entries that depend only on the static columns (kept by copies).
_STATIC_MEMO = frozenset(("static", "constraint", "static-bits"))


class Memo(OrderedDict[Any, Any]):
    """A small LRU map for what is derived from the snapshot: static masks and per-request-shape score caches.

    Bounded by entries and by the bytes of their arrays, so that a long-running daemon seeing many request shapes
    does not grow without limit; an evicted entry is simply recomputed. The entry bound is generous (a replay of a
    trace with a few hundred request shapes keeps two or three entries per shape: with 256 entries, gpuspec20 evicted
    and recomputed whole-cluster score caches all the time); the byte bound is what keeps memory in check.
    """

    def __init__(self, capacity: int = 4096, max_bytes: int = 512 << 20) -> None:
        super().__init__()
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.bytes = 0
        self._sizes: dict[Any, int] = {}

    def get(self, key: Any, default: Any = None) -> Any:
        # One lookup and one move (not a membership test first): keys are hashed on each, and this is on the hot path.
        try:
            value = self[key]
        except KeyError:
            return default
        self.move_to_end(key)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        size = _nbytes(value)
        self.bytes += size - self._sizes.get(key, 0)
        self._sizes[key] = size
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > 1 and (len(self) > self.capacity or self.bytes > self.max_bytes):
            old, _ = self.popitem(last=False)
            self.bytes -= self._sizes.pop(old, 0)

    def clear(self) -> None:
        super().clear()
        self._sizes.clear()
        self.bytes = 0


class ClusterSnapshot:
    """Column arrays over nodes and GPUs. Build once; allocate/release per decision."""

    #: The columns allocate/release change (what "release restores the snapshot" compares).
    STATE_COLUMNS = (
        "cpu_free",
        "mem_free",
        "gpu_milli_free",
        "gpu_mem_free",
        "gpu_free_total",
        "gpu_full_free",
        "tag_counts",
        "gpu_owner",
        "gpu_owner_shares",
    )

    #: The columns nothing changes once the snapshot is built: shared by copies (a write to one would change every
    #: copy: nothing writes them after __init__; not made read-only only because numba's typed kernels take them).
    STATIC_COLUMNS = frozenset(
        (
            "rank",
            "cpu_cap",
            "mem_cap",
            "gpu_count",
            "gpu_model",
            "gpu_mem_cap",
            "gpu_numa",
            "gpu_switch",
            "nvlink",
            "has_topology",
            "gpu_present",
        )
    )

    def __init__(self, nodes: Sequence[Node], ranks: Sequence[int] | None = None) -> None:
        if not nodes:
            raise InvalidRequest("nodes", "a cluster needs at least one node")
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.names: list[str] = [n.name for n in nodes]
        self.index: dict[str, int] = {}
        for i, name in enumerate(self.names):
            if name in self.index:
                raise InvalidRequest("nodes", f"node name {name!r} appears twice")
            self.index[name] = i
        n = len(nodes)
        if ranks is None:
            self.rank: IntArray = np.arange(n, dtype=np.int64)
        else:
            if len(ranks) != n:
                raise InvalidRequest("ranks", f"need one tie-break rank per node ({n}), got {len(ranks)}")
            self.rank = np.asarray(ranks, dtype=np.int64)
        self.labels: list[Mapping[str, str]] = [n.labels for n in nodes]
        self.cpu_cap: IntArray = np.array([nd.cpu_milli for nd in nodes], dtype=np.int64)
        self.mem_cap: IntArray = np.array([nd.memory_mib for nd in nodes], dtype=np.int64)
        self.cpu_free: IntArray = self.cpu_cap.copy()
        self.mem_free: IntArray = self.mem_cap.copy()
        self.gpu_count: IntArray = np.array([len(nd.gpus) for nd in nodes], dtype=np.int64)
        g = max(1, int(self.gpu_count.max()))
        self.max_gpus = g
        self.models: list[str] = sorted({gpu.model for nd in nodes for gpu in nd.gpus})
        self.model_id: dict[str, int] = {m: i for i, m in enumerate(self.models)}
        self.gpu_model = np.full((n, g), -1, dtype=np.int64)
        self.gpu_mem_cap = np.full((n, g), -1, dtype=np.int64)
        self.gpu_numa = np.full((n, g), -1, dtype=np.int64)
        self.gpu_switch = np.full((n, g), -1, dtype=np.int64)
        self.nvlink = np.zeros((n, g, g), dtype=np.bool_)
        self.has_topology = np.zeros(n, dtype=np.bool_)
        for i, nd in enumerate(nodes):
            for gpu in nd.gpus:
                j = gpu.index
                self.gpu_model[i, j] = self.model_id[gpu.model]
                self.gpu_mem_cap[i, j] = gpu.memory_mib
                if gpu.numa_node is not None:
                    self.gpu_numa[i, j] = gpu.numa_node
                if gpu.pcie_switch is not None:
                    self.gpu_switch[i, j] = gpu.pcie_switch
                for peer in gpu.nvlink_peers:
                    if 0 <= peer < len(nd.gpus) and peer != j:
                        self.nvlink[i, j, peer] = self.nvlink[i, peer, j] = True
                if gpu.numa_node is not None or gpu.pcie_switch is not None or gpu.nvlink_peers:
                    self.has_topology[i] = True
        present = self.gpu_model >= 0
        self.gpu_present: BoolArray = present
        self.gpu_milli_free: IntArray = np.where(present, MILLI_PER_GPU, -1).astype(np.int64)
        self.gpu_mem_free: IntArray = self.gpu_mem_cap.copy()
        self.gpu_util: FloatArray = np.full((n, g), np.nan, dtype=np.float64)
        self.gpu_free_total: IntArray = self.gpu_count * MILLI_PER_GPU
        self.gpu_full_free: IntArray = self.gpu_count.copy()
        # GpuClustering tags: column tag + 1 (tag -1 = share, 0 = no GPU, k = k whole GPUs).
        self.tag_counts = np.zeros((n, g + 2), dtype=np.int64)
        # Share owners (see Request.share_owner): owner id per GPU (-1 none) and how many shares it holds there.
        self.gpu_owner: IntArray = np.full((n, g), -1, dtype=np.int64)
        self.gpu_owner_shares: IntArray = np.zeros((n, g), dtype=np.int64)
        self.owner_ids: dict[str, int] = {}
        self.version: IntArray = np.zeros(n, dtype=np.int64)
        self.allocations: dict[str, Allocation] = {}
        #: Memo of things derived from the static columns or cached per request shape. Pure memoisation:
        #: every entry is either static or validated against `version` before use.
        self.memo = Memo()

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self.names)

    @property
    def total_gpus(self) -> int:
        return int(self.gpu_count.sum())

    @property
    def gpu_allocated_milli(self) -> int:
        return int(self.gpu_count.sum() * MILLI_PER_GPU - self.gpu_free_total.sum())

    def node_index(self, name: str) -> int:
        try:
            return self.index[name]
        except KeyError:
            raise InvalidRequest("node", f"unknown node {name!r}") from None

    def gpu_static_mask(self, models: frozenset[str] | None, min_memory_mib: int) -> BoolArray:
        """GPUs that could ever serve a request: of an allowed model and with enough memory in total."""
        key = ("static", models, min_memory_mib)
        mask: BoolArray | None = self.memo.get(key)
        if mask is None:
            mask = self.gpu_present.copy()
            if models is not None:
                ids = [self.model_id[m] for m in models if m in self.model_id]
                mask &= np.isin(self.gpu_model, ids)
            if min_memory_mib:
                mask &= self.gpu_mem_cap >= min_memory_mib
            self.memo[key] = mask
        return mask

    def constraint_mask(self, constraint: Constraint) -> BoolArray:
        key = ("constraint", constraint)
        mask: BoolArray | None = self.memo.get(key)
        if mask is None:
            mask = np.fromiter(
                (constraint.matches(lb, nm) for lb, nm in zip(self.labels, self.names, strict=True)),
                dtype=np.bool_,
                count=len(self.names),
            )
            self.memo[key] = mask
        return mask

    def owner_id(self, owner: str) -> int:
        """The number standing for a share owner in `gpu_owner` (assigned on first use)."""
        return self.owner_ids.setdefault(owner, len(self.owner_ids))

    def node_state(self, i: int) -> NodeState:
        gpus = tuple(
            GpuState(
                index=j,
                model=self.models[int(self.gpu_model[i, j])],
                memory_mib=int(self.gpu_mem_cap[i, j]),
                milli_free=int(self.gpu_milli_free[i, j]),
                memory_free=int(self.gpu_mem_free[i, j]),
                utilization=None if np.isnan(self.gpu_util[i, j]) else float(self.gpu_util[i, j]),
            )
            for j in range(int(self.gpu_count[i]))
        )
        tags = {t - 1: int(c) for t, c in enumerate(self.tag_counts[i]) if c}
        return NodeState(
            index=i,
            name=self.names[i],
            rank=int(self.rank[i]),
            cpu_milli=int(self.cpu_cap[i]),
            memory_mib=int(self.mem_cap[i]),
            cpu_free=int(self.cpu_free[i]),
            memory_free=int(self.mem_free[i]),
            gpus=gpus,
            labels=self.labels[i],
            tags=tags,
        )

    # ------------------------------------------------------------------ measurements
    def set_gpu_utilization(self, node: int, gpu: int, fraction: float | None) -> None:
        """Record measured utilisation (0..1) of one GPU; None forgets it. Used by the load term."""
        if not 0 <= gpu < self.gpu_count[node]:
            raise InvalidRequest("gpu", f"node {self.names[node]} has no GPU {gpu}")
        if fraction is not None and not 0.0 <= fraction <= 1.0:
            raise InvalidRequest("utilization", f"must be in 0..1, got {fraction}")
        self.gpu_util[node, gpu] = np.nan if fraction is None else fraction
        self.version[node] += 1

    # ------------------------------------------------------------------ allocate / release
    def allocate(self, alloc: Allocation) -> None:
        """Grant an allocation, or raise AllocationError and change nothing."""
        if alloc.request_id in self.allocations:
            raise AllocationError(f"allocation {alloc.request_id!r} is already granted")
        i = alloc.node_index
        if not (0 <= i < len(self.names)) or self.names[i] != alloc.node:
            raise AllocationError(
                f"allocation {alloc.request_id!r} names node {alloc.node!r} at index {i}: no such node"
            )
        if alloc.cpu_milli < 0 or alloc.memory_mib < 0:
            raise AllocationError(f"allocation {alloc.request_id!r} has negative CPU or memory")
        if alloc.cpu_milli > self.cpu_free[i]:
            raise AllocationError(f"{alloc.node}: CPU over-commit ({alloc.cpu_milli}m > {self.cpu_free[i]}m free)")
        if alloc.memory_mib > self.mem_free[i]:
            raise AllocationError(
                f"{alloc.node}: memory over-commit ({alloc.memory_mib} > {self.mem_free[i]} MiB free)"
            )
        seen: set[int] = set()
        for grant in alloc.gpus:
            self._check_grant(alloc, grant, seen)
        owner = self.owner_id(alloc.share_owner) if alloc.share_owner else -1
        if owner >= 0:
            for grant in alloc.gpus:
                held = int(self.gpu_owner[i, grant.index])
                if held not in (-1, owner):
                    raise AllocationError(
                        f"{alloc.node} GPU {grant.index}: its shares belong to another owner than {alloc.share_owner!r}"
                    )
        self.cpu_free[i] -= alloc.cpu_milli
        self.mem_free[i] -= alloc.memory_mib
        for grant in alloc.gpus:
            self.gpu_milli_free[i, grant.index] -= grant.milli
            self.gpu_mem_free[i, grant.index] -= grant.memory_mib
            self.gpu_free_total[i] -= grant.milli
            if owner >= 0:
                self.gpu_owner[i, grant.index] = owner
                self.gpu_owner_shares[i, grant.index] += 1
        if alloc.gpus:
            self._recount_full_free(i)
        self.tag_counts[i, alloc.tag + 1] += 1
        self.version[i] += 1
        self.allocations[alloc.request_id] = alloc

    def _check_grant(self, alloc: Allocation, grant: GpuGrant, seen: set[int]) -> None:
        i, j = alloc.node_index, grant.index
        where = f"{alloc.node} GPU {j}"
        if not 0 <= j < self.gpu_count[i]:
            raise AllocationError(f"{where}: no such GPU")
        if j in seen:
            raise AllocationError(f"{where}: granted twice in one allocation")
        seen.add(j)
        if (
            not 0 <= grant.milli <= MILLI_PER_GPU
            or grant.memory_mib < 0
            or (grant.milli == 0 and grant.memory_mib == 0)
        ):
            raise AllocationError(f"{where}: invalid grant ({grant.milli} milli, {grant.memory_mib} MiB)")
        free_milli = int(self.gpu_milli_free[i, j])
        free_mem = int(self.gpu_mem_free[i, j])
        if grant.milli == MILLI_PER_GPU:
            if free_milli != MILLI_PER_GPU or free_mem != self.gpu_mem_cap[i, j]:
                raise AllocationError(f"{where}: a whole GPU was granted but part of it is already held")
            if grant.memory_mib != self.gpu_mem_cap[i, j]:
                raise AllocationError(f"{where}: a whole GPU grant must carry all {self.gpu_mem_cap[i, j]} MiB")
        if grant.milli > free_milli:
            raise AllocationError(f"{where}: GPU over-commit ({grant.milli} > {free_milli} milli free)")
        if grant.memory_mib > free_mem:
            raise AllocationError(f"{where}: GPU memory over-commit ({grant.memory_mib} > {free_mem} MiB free)")
        if free_milli == 0 and free_mem == 0:
            raise AllocationError(f"{where}: GPU is fully held")

    def release(self, request_id: str) -> Allocation:
        """Give back everything an allocation took; returns it."""
        alloc = self.allocations.pop(request_id, None)
        if alloc is None:
            raise AllocationError(f"allocation {request_id!r} is not granted")
        i = alloc.node_index
        self.cpu_free[i] += alloc.cpu_milli
        self.mem_free[i] += alloc.memory_mib
        for grant in alloc.gpus:
            self.gpu_milli_free[i, grant.index] += grant.milli
            self.gpu_mem_free[i, grant.index] += grant.memory_mib
            self.gpu_free_total[i] += grant.milli
            if alloc.share_owner:
                self.gpu_owner_shares[i, grant.index] -= 1
                if self.gpu_owner_shares[i, grant.index] == 0:
                    self.gpu_owner[i, grant.index] = -1
        if alloc.gpus:
            self._recount_full_free(i)
        self.tag_counts[i, alloc.tag + 1] -= 1
        self.version[i] += 1
        return alloc

    def release_many(self, request_ids: Iterable[str]) -> list[Allocation]:
        """`release` of each allocation in turn, in one pass: the columns end exactly as after the releases one by
        one (they only add up), with one numpy update per column instead of a few per allocation (a preemption
        search or a reservation releases thousands on a cluster). Raises AllocationError, changing nothing, when an
        id is not granted or is named twice."""
        ids = list(request_ids)
        if len(ids) < 8:
            return [self.release(r) for r in ids]
        held = self.allocations
        missing = next((r for r in ids if r not in held), None)
        if missing is not None:
            raise AllocationError(f"allocation {missing!r} is not granted")
        if len(set(ids)) != len(ids):
            raise AllocationError("an allocation is named twice")
        out = [held.pop(r) for r in ids]
        self.release_held(out)
        return out

    def release_held(self, out: Sequence[Allocation]) -> None:
        """What `release_many` does to the columns, for allocations this snapshot keeps no record of (a what-if copy,
        `copy(allocations=False)`): each must be held here. Nothing is checked."""
        n = len(out)
        node = np.fromiter(map(_NODE_INDEX, out), dtype=np.int64, count=n)
        np.add.at(self.cpu_free, node, np.fromiter(map(_CPU, out), dtype=np.int64, count=n))
        np.add.at(self.mem_free, node, np.fromiter(map(_MEMORY, out), dtype=np.int64, count=n))
        np.subtract.at(self.tag_counts, (node, np.fromiter(map(_TAG, out), dtype=np.int64, count=n) + 1), 1)
        np.add.at(self.version, node, 1)
        per = np.fromiter(map(len, map(_GPUS, out)), dtype=np.int64, count=n)  # grants per allocation
        if per.any():
            grants = [g for a in out for g in a.gpus]
            m = len(grants)
            g_node = np.repeat(node, per)
            g_gpu = np.fromiter(map(_INDEX, grants), dtype=np.int64, count=m)
            g_milli = np.fromiter(map(_MILLI, grants), dtype=np.int64, count=m)
            np.add.at(self.gpu_milli_free, (g_node, g_gpu), g_milli)
            np.add.at(self.gpu_mem_free, (g_node, g_gpu), np.fromiter(map(_MIB, grants), dtype=np.int64, count=m))
            np.add.at(self.gpu_free_total, g_node, g_milli)
            shared = np.repeat(np.fromiter((bool(a.share_owner) for a in out), dtype=np.bool_, count=n), per)
            if shared.any():
                np.subtract.at(self.gpu_owner_shares, (g_node[shared], g_gpu[shared]), 1)
                gone = self.gpu_owner_shares[g_node[shared], g_gpu[shared]] == 0
                self.gpu_owner[g_node[shared][gone], g_gpu[shared][gone]] = -1
            rows = np.unique(g_node)
            whole = (self.gpu_milli_free[rows] == MILLI_PER_GPU) & (self.gpu_mem_free[rows] == self.gpu_mem_cap[rows])
            self.gpu_full_free[rows] = np.count_nonzero(whole, axis=1)

    def _recount_full_free(self, i: int) -> None:
        # "Fully free" = nothing of the GPU is granted, neither compute nor memory.
        row_m = self.gpu_milli_free[i]
        self.gpu_full_free[i] = int(
            np.count_nonzero((row_m == MILLI_PER_GPU) & (self.gpu_mem_free[i] == self.gpu_mem_cap[i]))
        )

    def copy(self, allocations: bool = True) -> ClusterSnapshot:
        """An independent copy of what allocate/release change, sharing what they never change: the node objects,
        the static columns (read-only: STATIC_COLUMNS) and the memo's static masks.

        `allocations=False`: a what-if copy with no allocation records (its arrays are the books'; nothing can be
        released from it by id), for probes that only ask where a request would fit: a cluster's books hold tens of
        thousands of allocations, and copying their map cost more than the arrays (k8s_round, BENCHMARKS.md)."""
        other = ClusterSnapshot.__new__(ClusterSnapshot)
        static = self.STATIC_COLUMNS
        for key, value in self.__dict__.items():
            if isinstance(value, np.ndarray):
                setattr(other, key, value if key in static else value.copy())
            elif key == "allocations":
                setattr(other, key, dict(value) if allocations else {})
            elif key == "owner_ids":
                setattr(other, key, dict(value))
            elif key == "memo":
                memo = Memo()
                for k, v in value.items():  # (oldest first, as they were used)
                    if isinstance(k, tuple) and k and k[0] in _STATIC_MEMO:
                        memo[k] = v
                setattr(other, key, memo)
            else:
                setattr(other, key, value)
        return other
