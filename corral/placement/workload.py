"""The target workload and the fragmentation measure of the FGD study, vectorised over nodes.

FGD (Weng et al., USENIX ATC'23) calls the GPU capacity of a node *fragmented* for a task type when that type
could not use it; a node's fragmentation F(n) is the expectation over the target workload's types. For node n
(free CPU c, per-GPU free milli u_g, total free U) and target type m = (c_m, m_m, k_m, models_m):

    CPU-only type                         f = U      (no GPU is usable by it)
    no GPU of an allowed model            f = U      (no_access)
    >= k_m accessible GPUs with u_g >= m_m
        and c >= c_m                      f = U - sum of those GPUs' u_g   (q3: the rest is fragment)
    otherwise                             f = U      (lack of GPU, CPU or both)

    F(n) = sum_m p_m * f(n, m)        (milli-GPU; nodes without GPUs give 0; memory is ignored)

f is computed in integers; p_m x f is summed per category (q1, q2, q4, xl, xr, no_access) in the target types' order
and the categories are then added, exactly as the study's code does, so F of a node is bit-identical to the authors'
value however it was reached (FGD's 49-or-50 ties depend on those rounding residues).

F is computed by compiled loops (`placement.kernels`), one node at a time over its types and GPUs: a decision computes
F for one node or two, where numpy's per-call overhead on 35 types x 8 GPUs cost several times the maths (and a
plain-Python path, memoised by node state, still cost more than the maths).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from corral.model.arrays import BoolArray, FloatArray, IntArray
from corral.model.errors import InvalidRequest
from corral.model.resources import MILLI_PER_GPU, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement.native import kernels


@dataclass(frozen=True, slots=True)
class GpuReserve:
    """What `preferential` keeps free per free GPU (whole-GPU equivalents) so the GPU stays usable."""

    cpu_milli_per_gpu: int = 4000
    memory_mib_per_gpu: int = 16384

    def __post_init__(self) -> None:
        if self.cpu_milli_per_gpu < 0 or self.memory_mib_per_gpu < 0:
            raise InvalidRequest("reserve", "per-GPU reserve must be >= 0 CPU milli and MiB")


@dataclass(frozen=True, slots=True)
class TargetType:
    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for CPU-only types
    gpu_count: int
    models: frozenset[str] | None
    probability: float


class WorkloadKey:
    """A workload's target types (and tail) as a memo key: equal for equal workloads, hashed once.

    The engine looks several memo entries up per decision with the workload in the key; a plain tuple of frozen
    dataclasses rehashes every field of every type on each lookup (a third of an fgd replay's time went there)."""

    __slots__ = ("_hash", "tail", "types")

    def __init__(self, types: tuple[TargetType, ...], tail: tuple[TargetType, ...]) -> None:
        self.types = types
        self.tail = tail
        self._hash = hash((types, tail))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            isinstance(other, WorkloadKey)
            and self._hash == other._hash
            and self.types == other.types
            and self.tail == other.tail
        )


@dataclass(frozen=True)
class TargetWorkload:
    """The task types fragmentation is measured against, with their probabilities (summing to 1).

    `tail` holds the shapes beyond the typical ones (rare, often the largest pods), with probabilities on the same
    scale (a tail type of probability p arrives p times per typical pod). FGD's measure ignores them;
    `placement.reserve` keeps hosts for the multi-GPU ones.
    """

    types: tuple[TargetType, ...]
    tail: tuple[TargetType, ...] = ()

    def __post_init__(self) -> None:
        if not self.types:
            raise InvalidRequest("workload", "a target workload needs at least one task type")
        if any(t.probability < 0 for t in self.types):
            raise InvalidRequest("workload", "task type probabilities must be >= 0")

    @cached_property
    def key(self) -> WorkloadKey:
        return WorkloadKey(self.types, self.tail)

    @classmethod
    def from_requests(cls, requests: Iterable[Request], coverage: float = 0.95) -> TargetWorkload:
        """The FGD study's "typical pods" of these requests (see `from_shapes`); models are keyed sorted."""
        return cls.from_shapes(
            (
                (r.cpu_milli, r.gpu_milli, r.gpu_count, "|".join(sorted(r.gpu_models)) if r.gpu_models else "")
                for r in requests
            ),
            coverage,
        )

    @classmethod
    def from_shapes(cls, shapes: Iterable[tuple[int, int, int, str]], coverage: float = 0.95) -> TargetWorkload:
        """The FGD study's "typical pods": the most frequent (cpu, gpu milli, count, model spec) shapes.

        Shapes are counted (memory is not part of the key), sorted by count descending (ties: larger CPU, GPU milli,
        count, then spec string first), and the shortest prefix covering `coverage` of the requests is kept, its
        counts renormalised to probabilities. The spec is a `|`-separated model list and is keyed as written, so a
        trace's "V100M16|V100M32|V100M32" stays a type of its own, as in the study.
        """
        if not 0 < coverage <= 1:
            raise InvalidRequest("coverage", f"must be in (0, 1], got {coverage}")
        counts: Counter[tuple[int, int, int, str]] = Counter(shapes)
        total = sum(counts.values())
        if total == 0:
            raise InvalidRequest("workload", "cannot build a target workload from no requests")
        keys = sorted(counts, key=lambda k: (-counts[k], -k[0], -k[1], -k[2], _neg_str(k[3])))
        kept: list[tuple[tuple[int, int, int, str], int]] = []
        cum = 0
        for k in keys:
            kept.append((k, counts[k]))
            cum += counts[k]
            if cum / total >= coverage:
                break

        def typed(k: tuple[int, int, int, str], c: int) -> TargetType:
            models = frozenset(k[3].split("|")) if k[3] else None
            probability = (c / total) / (cum / total)  # written so, the typical types' values stay bit-identical
            return TargetType(k[0], k[1], k[2], models, probability)

        return cls(tuple(typed(k, c) for k, c in kept), tuple(typed(k, counts[k]) for k in keys[len(kept) :]))


def _neg_str(s: str) -> tuple[int, ...]:
    # Sort key that orders strings descending inside an ascending sort.
    return (*(-ord(ch) for ch in s), 1)


#: Used by `fgd` when no target workload is configured: half whole GPUs, half common shares, a little CPU each.
DEFAULT_WORKLOAD = TargetWorkload(
    (
        TargetType(4000, MILLI_PER_GPU, 1, None, 0.4),
        TargetType(4000, MILLI_PER_GPU, 2, None, 0.1),
        TargetType(2000, 500, 1, None, 0.25),
        TargetType(2000, 250, 1, None, 0.25),
    )
)


@dataclass(frozen=True)
class _Compiled:
    cpu: IntArray  # per type, shaped for broadcasting against (types, nodes[, GPUs])
    milli: IntArray
    count: IntArray
    prob: FloatArray
    cpu_only: BoolArray
    access: BoolArray  # types x nodes x GPUs: GPUs of an allowed model (every present GPU for types without models)
    # Derived per type, for `fill.type_fill` (computed there on every call before).
    share: BoolArray  # a share of one GPU (one GPU, under 1000 milli)
    milli_div: IntArray  # max(milli, 1)
    count_div: IntArray  # max(count, 1)
    cpu_div: IntArray  # max(cpu, 1)
    table: IntArray  # types x `kernels.COLUMNS`: the columns above as the compiled kernels read them
    by_node: BoolArray  # `access` as nodes x types x GPUs: the kernels read one node's types at a time (one block)


def compile_workload(snapshot: ClusterSnapshot, workload: TargetWorkload) -> _Compiled:
    key = ("workload", workload.key)
    compiled: _Compiled | None = snapshot.memo.get(key)
    if compiled is None:
        access = np.stack(
            [
                snapshot.gpu_present if t.models is None else snapshot.gpu_static_mask(t.models, 0)
                for t in workload.types
            ]
        )
        cpu = np.array([t.cpu_milli for t in workload.types], dtype=np.int64)
        milli = np.array([t.gpu_milli for t in workload.types], dtype=np.int64)
        count = np.array([t.gpu_count for t in workload.types], dtype=np.int64)
        share = (count == 1) & (milli < MILLI_PER_GPU)
        cpu_only = count == 0
        k = kernels()
        table = np.zeros((len(workload.types), k.COLUMNS), dtype=np.int64)
        for col, values in (
            (k.CPU, cpu),
            (k.MILLI, milli),
            (k.COUNT, count),
            (k.CPU_ONLY, cpu_only),
            (k.SHARE, share),
            (k.MILLI_DIV, np.maximum(milli, 1)),
            (k.COUNT_DIV, np.maximum(count, 1)),
            (k.CPU_DIV, np.maximum(cpu, 1)),
        ):
            table[:, col] = values
        compiled = _Compiled(
            cpu=cpu,
            milli=milli,
            count=count,
            prob=np.array([t.probability for t in workload.types], dtype=np.float64),
            cpu_only=cpu_only,
            access=access,
            share=share,
            milli_div=np.maximum(milli, 1),
            count_div=np.maximum(count, 1),
            cpu_div=np.maximum(cpu, 1),
            table=table,
            by_node=np.ascontiguousarray(access.transpose(1, 0, 2)),
        )
        snapshot.memo[key] = compiled
    return compiled


def node_fragmentation(
    snapshot: ClusterSnapshot,
    workload: TargetWorkload,
    nodes: IntArray,
    cpu_free: IntArray | None = None,
    milli_free: IntArray | None = None,
) -> FloatArray:
    """F(n) for the given node indices, on their current state or on hypothetical free CPU / GPU milli."""
    w = compile_workload(snapshot, workload)
    c_all = snapshot.cpu_free[nodes] if cpu_free is None else cpu_free
    u_all = snapshot.gpu_milli_free[nodes] if milli_free is None else milli_free
    out: FloatArray = kernels().fragmentation(
        _ints(nodes), _ints(c_all), _ints(u_all), snapshot.gpu_present, w.by_node, w.table, w.prob
    )
    return out


def _ints(a: IntArray) -> IntArray:
    """`a` as a C-ordered int64 array (what the kernels are compiled for: one signature, one compilation)."""
    out: IntArray = np.ascontiguousarray(a, dtype=np.int64)
    return out


def current_fragmentation(snapshot: ClusterSnapshot, workload: TargetWorkload, nodes: IntArray) -> FloatArray:
    """F(n) of the given nodes as they are now, kept per node and recomputed only where `version` moved.

    The same values `node_fragmentation` gives (it computes them): fgd needs F(n) of every changed node before
    scoring it, and the simulator's fragmentation curve needs it after every placement; this computes it once."""
    key = ("fragmentation", workload.key)
    entry: tuple[IntArray, FloatArray] | None = snapshot.memo.get(key)
    if entry is None:
        entry = (np.full(len(snapshot), -1, dtype=np.int64), np.zeros(len(snapshot), dtype=np.float64))
        snapshot.memo[key] = entry
    versions, values = entry
    stale = nodes[versions[nodes] != snapshot.version[nodes]]
    if len(stale):
        values[stale] = node_fragmentation(snapshot, workload, stale)
        versions[stale] = snapshot.version[stale]
    out: FloatArray = values[nodes]
    return out


def cluster_fragmentation(snapshot: ClusterSnapshot, workload: TargetWorkload) -> float:
    """Sum of F(n) over every node (milli-GPU)."""
    return float(node_fragmentation(snapshot, workload, np.arange(len(snapshot), dtype=np.int64)).sum())


def share_fragmentation_after(
    snapshot: ClusterSnapshot,
    workload: TargetWorkload,
    nodes: IntArray,
    cpu_req: int,
    milli_req: int,
) -> FloatArray:
    """F(n') per (node, GPU) for placing a one-GPU share of `milli_req` on that GPU (nodes x GPUs).

    Updates each type's usable-GPU count and sum for the one changed GPU instead of recomputing whole nodes, in
    integers, so an unchanged type contributes exactly what it contributed to F(n).
    """
    w = compile_workload(snapshot, workload)
    s = snapshot
    out: FloatArray = kernels().share_fragmentation(
        _ints(nodes), s.cpu_free, s.gpu_milli_free, s.gpu_present, w.by_node, w.table, w.prob, cpu_req, milli_req
    )
    return out
