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
value however it was reached (FGD's 49-or-50 ties depend on those rounding residues; see `_fragmentation`).
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
        compiled = _Compiled(
            cpu=cpu,
            milli=milli,
            count=count,
            prob=np.array([t.probability for t in workload.types], dtype=np.float64),
            cpu_only=np.array([t.gpu_count == 0 for t in workload.types], dtype=np.bool_),
            access=access,
            share=(count == 1) & (milli < MILLI_PER_GPU),
            milli_div=np.maximum(milli, 1),
            count_div=np.maximum(count, 1),
            cpu_div=np.maximum(cpu, 1),
        )
        snapshot.memo[key] = compiled
    return compiled


#: Nodes per block when fragmentation is computed for many nodes at once (bounds memory at types x block x GPUs).
_BLOCK = 2048


def _sequential_sum(x: FloatArray) -> FloatArray:
    """Sum over the first axis strictly in order (numpy's sum may pair terms up, which rounds differently)."""
    out: FloatArray = np.add.accumulate(x, axis=0)[-1]
    return out


#: Fragmentation categories (the study's buckets), in the order F adds them up.
_Q1, _Q2, _Q4, _XL, _XR, _NA = range(6)
_CATEGORIES = np.arange(6)


def _fragmentation(
    w: _Compiled,
    access: BoolArray,
    gpu_ok: BoolArray,
    cpu_ok: BoolArray,
    total: IntArray,
    unusable: IntArray,
) -> FloatArray:
    """F from per-type categories, summed as the study does (fgd-experiment.md section 7, C2).

    Each target type adds p_m x milli to one category bucket (a satisfied GPU type adds the milli it cannot use to
    q2_lack_gpu); buckets are summed over types in order, then F = q1 + q2 + q4 + xl + xr + no_access. Summing by
    category rather than by type only changes rounding residues, but those decide FGD's 49-or-50 ties. All arrays
    are (types, ...) and broadcast together.
    """
    shape = (len(w.prob), *np.broadcast_shapes(access.shape[1:], gpu_ok.shape[1:], total.shape[1:]))
    extra = (1,) * (len(shape) - 1)
    p = w.prob.reshape(-1, *extra)
    cpu_only = w.cpu_only.reshape(-1, *extra)
    # One category per (type, element), then one ordered sum over types of a (types, category, ...) array: the
    # same additions in the same order as one sum per category (adding the 0.0 of other categories is exact), in
    # a handful of numpy calls instead of thirty; a decision computes F for a node or two, so calls are the cost.
    cat = np.where(
        cpu_only,
        np.where(cpu_ok, _XL, _XR),
        np.where(access, np.where(cpu_ok, _Q2, np.where(gpu_ok, _Q4, _Q1)), _NA),
    )
    value = np.where(~cpu_only & access & gpu_ok & cpu_ok, p * unusable, p * total)
    buckets = np.where(cat[:, None] == _CATEGORIES.reshape(1, -1, *extra), value[:, None], 0.0)
    # q1 + q2 + q4 + xl + xr + no_access, left to right (the categories are numbered in that order).
    out: FloatArray = _sequential_sum(_sequential_sum(buckets))
    return out


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
    out = np.empty(len(nodes), dtype=np.float64)
    for lo in range(0, len(nodes), _BLOCK):
        idx, c, u = nodes[lo : lo + _BLOCK], c_all[lo : lo + _BLOCK], u_all[lo : lo + _BLOCK]
        up = np.where(snapshot.gpu_present[idx], np.maximum(u, 0), 0)
        total = up.sum(axis=1)
        a = w.access[:, idx]  # types x nodes x GPUs
        fit = a & (u[None] >= w.milli[:, None, None])
        any_access: BoolArray = np.asarray(a.any(axis=2))
        out[lo : lo + _BLOCK] = _fragmentation(
            w,
            any_access,
            fit.sum(axis=2) >= w.count[:, None],
            c[None] >= w.cpu[:, None],
            total[None],
            total[None] - (up[None] * fit).sum(axis=2),
        )
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
    out = np.empty((len(nodes), snapshot.max_gpus), dtype=np.float64)
    mm = w.milli[:, None, None]
    for lo in range(0, len(nodes), _BLOCK // 4):
        idx = nodes[lo : lo + _BLOCK // 4]
        u = snapshot.gpu_milli_free[idx]
        up = np.where(snapshot.gpu_present[idx], np.maximum(u, 0), 0)
        total2 = (up.sum(axis=1) - milli_req)[None, :, None]  # 1 x nodes x 1
        u_after = u - milli_req
        a = w.access[:, idx]  # types x nodes x GPUs (axis 2 = the GPU the share would go to)
        before = a & (u[None] >= mm)
        after = a & (u_after[None] >= mm)
        cnt2 = before.sum(axis=2, keepdims=True) - before + after
        s2 = (up[None] * before).sum(axis=2, keepdims=True) - np.where(before, u, 0) + np.where(after, u_after, 0)
        c2 = (snapshot.cpu_free[idx] - cpu_req)[None, :, None]
        any_access: BoolArray = np.asarray(a.any(axis=2, keepdims=True))
        out[lo : lo + len(idx)] = _fragmentation(
            w,
            any_access,
            cnt2 >= w.count[:, None, None],
            c2 >= w.cpu[:, None, None],
            total2,
            total2 - s2,
        )
    return out
