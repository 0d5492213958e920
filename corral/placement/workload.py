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

Two paths give the same floats: numpy over blocks of nodes (`_node_fragmentation`, a first look at the cluster),
and plain Python one node at a time, memoised by node state (`_Scalar`, the one or two nodes of a decision, where
numpy's per-call overhead on 35 types x 8 GPUs cost several times the maths).
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
    # One category per (type, element), then one weighted bincount over (category, element) bins fed in type
    # order: bincount adds each weight to its bin strictly in input order, starting from 0.0, so every bucket is
    # the same additions in the same order as one ordered sum per category (where the other categories' 0.0 added
    # nothing). One pass over types x elements, where a (types, categories, elements) array took four.
    cat = np.where(
        cpu_only,
        np.where(cpu_ok, _XL, _XR),
        np.where(access, np.where(cpu_ok, _Q2, np.where(gpu_ok, _Q4, _Q1)), _NA),
    )
    value = np.where(~cpu_only & access & gpu_ok & cpu_ok, p * unusable, p * total)
    size = int(np.prod(shape[1:], dtype=np.int64))
    bins = np.broadcast_to(cat, shape).reshape(shape[0], size) * size + np.arange(size)
    weights = np.broadcast_to(value, shape).reshape(-1)
    counted = np.bincount(bins.reshape(-1), weights=weights, minlength=len(_CATEGORIES) * size)
    buckets: FloatArray = counted.astype(np.float64, copy=False).reshape(len(_CATEGORIES), size)
    # q1 + q2 + q4 + xl + xr + no_access, left to right (the categories are numbered in that order).
    out: FloatArray = _sequential_sum(buckets).reshape(shape[1:])
    return out


#: Up to this many nodes, F is computed node by node in plain Python (`_Scalar`): a decision computes F for one
#: node or two, where numpy's per-call overhead on arrays of 35 types x 8 GPUs costs several times the maths.
_FEW = 4


class _Scalar:
    """One workload's target types as Python numbers, for F of one node at a time, and F memoised by node state.

    The same integers and the same float operations in the same order as `_fragmentation` (p x milli added per
    category in type order, starting from 0.0, then q1 + q2 + q4 + xl + xr + no_access left to right), so the
    floats are bit-identical to the vectorised path's. A node's state is its free CPU and the multiset of its
    present GPUs' (model, free milli): F depends on nothing else (integer counts and sums over GPUs do not depend
    on their order), so twin nodes, and a node that comes back to a state it had, share one entry."""

    __slots__ = ("memo", "probes", "types")

    #: States remembered per workload before the memo starts afresh (about 200 bytes each).
    LIMIT = 1 << 16

    def __init__(self, snapshot: ClusterSnapshot, workload: TargetWorkload) -> None:
        # Types that ask for GPUs differ in what they ask of one GPU (milli, allowed models) far less often than
        # in CPU or count (default: 12 probes for 30 GPU types): count fitting GPUs once per probe.
        probes: dict[tuple[int, tuple[bool, ...]], int] = {}
        self.types: list[tuple[int, int, float, bool, int]] = []
        for t in workload.types:
            j = -1
            if t.gpu_count:
                # Per GPU model id: whether the type may use a GPU of that model (`compile_workload`'s access).
                access = tuple(t.models is None or name in t.models for name in snapshot.models)
                j = probes.setdefault((t.gpu_milli, access), len(probes))
            self.types.append((t.cpu_milli, t.gpu_count, t.probability, t.gpu_count == 0, j))
        self.probes = list(probes)
        self.memo: dict[tuple[int, tuple[tuple[int, int, int], ...]], float] = {}

    @staticmethod
    def groups(models: list[int], free: list[int]) -> tuple[tuple[int, int, int], ...]:
        """The present GPUs as sorted (model, free milli, how many) triples."""
        counts: dict[tuple[int, int], int] = {}
        for m, u in zip(models, free, strict=True):
            if m >= 0:
                counts[m, u] = counts.get((m, u), 0) + 1
        return tuple(sorted((m, u, k) for (m, u), k in counts.items()))

    def usable(self, groups: tuple[tuple[int, int, int], ...]) -> tuple[list[bool], list[int], list[int]]:
        """Per probe: whether any GPU is of an allowed model, how many such GPUs fit it, and their free milli."""
        anys, counts, sums = [], [], []
        for milli, access in self.probes:
            seen, n, s = False, 0, 0
            for m, u, k in groups:
                if access[m]:
                    seen = True
                    if u >= milli:
                        n += k
                        s += max(u, 0) * k
            anys.append(seen)
            counts.append(n)
            sums.append(s)
        return anys, counts, sums

    def node(self, cpu: int, models: list[int], free: list[int]) -> float:
        """F of one node with free CPU `cpu` and per-GPU `models` / free milli `free` (-1 model: absent)."""
        groups = self.groups(models, free)
        key = (cpu, groups)
        f = self.memo.get(key)
        if f is None:
            total = sum(max(u, 0) * k for _, u, k in groups)
            anys, counts, sums = self.usable(groups)
            f = self._f(cpu, total, anys, counts, sums)
            if len(self.memo) >= self.LIMIT:
                self.memo.clear()
            self.memo[key] = f
        return f

    def _f(self, cpu: int, total: int, anys: list[bool], counts: list[int], sums: list[int]) -> float:
        b = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        for c_m, k_m, p, cpu_only, j in self.types:
            cpu_ok = cpu >= c_m
            if cpu_only:
                b[_XL if cpu_ok else _XR] += p * total
            elif not anys[j]:
                b[_NA] += p * total
            elif cpu_ok:
                b[_Q2] += p * (total - sums[j]) if counts[j] >= k_m else p * total
            else:
                b[_Q4 if counts[j] >= k_m else _Q1] += p * total
        return b[0] + b[1] + b[2] + b[3] + b[4] + b[5]

    def share(self, cpu: int, models: list[int], free: list[int], cpu_req: int, milli_req: int) -> list[float]:
        """`share_fragmentation_after` of one node: per GPU column, F once a share of `milli_req` took that GPU
        (with the vectorised path's arithmetic for every column, absent and unfitting GPUs included)."""
        groups = self.groups(models, free)
        total2 = sum(max(u, 0) * k for _, u, k in groups) - milli_req
        cpu2 = cpu - cpu_req
        anys, counts, sums = self.usable(groups)
        out: list[float] = []
        done: dict[tuple[int, int], float] = {}
        for m, u in zip(models, free, strict=True):
            f = done.get((m, u))
            if f is None:
                if m < 0:  # an absent GPU changes no probe's count or sum
                    f = self._f(cpu2, total2, anys, counts, sums)
                else:
                    after = u - milli_req
                    counts2, sums2 = list(counts), list(sums)
                    for j, (milli, access) in enumerate(self.probes):
                        if access[m]:
                            if u >= milli:
                                counts2[j] -= 1
                                sums2[j] -= u
                            if after >= milli:
                                counts2[j] += 1
                                sums2[j] += after
                    f = self._f(cpu2, total2, anys, counts2, sums2)
                done[m, u] = f
            out.append(f)
        return out


def _scalar(snapshot: ClusterSnapshot, workload: TargetWorkload) -> _Scalar:
    key = ("workload-scalar", workload.key)
    scalar: _Scalar | None = snapshot.memo.get(key)
    if scalar is None:
        scalar = _Scalar(snapshot, workload)
        snapshot.memo[key] = scalar
    return scalar


def node_fragmentation(
    snapshot: ClusterSnapshot,
    workload: TargetWorkload,
    nodes: IntArray,
    cpu_free: IntArray | None = None,
    milli_free: IntArray | None = None,
) -> FloatArray:
    """F(n) for the given node indices, on their current state or on hypothetical free CPU / GPU milli."""
    c_all = snapshot.cpu_free[nodes] if cpu_free is None else cpu_free
    u_all = snapshot.gpu_milli_free[nodes] if milli_free is None else milli_free
    if len(nodes) <= _FEW:
        scalar = _scalar(snapshot, workload)
        return np.array(
            [
                scalar.node(c, m, u)
                for c, m, u in zip(c_all.tolist(), snapshot.gpu_model[nodes].tolist(), u_all.tolist(), strict=True)
            ],
            dtype=np.float64,
        )
    return _node_fragmentation(snapshot, workload, nodes, c_all, u_all)


def _node_fragmentation(
    snapshot: ClusterSnapshot, workload: TargetWorkload, nodes: IntArray, c_all: IntArray, u_all: IntArray
) -> FloatArray:
    """The vectorised `node_fragmentation`, in blocks of nodes."""
    w = compile_workload(snapshot, workload)
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
    if len(nodes) <= _FEW:
        scalar = _scalar(snapshot, workload)
        rows = zip(
            snapshot.cpu_free[nodes].tolist(),
            snapshot.gpu_model[nodes].tolist(),
            snapshot.gpu_milli_free[nodes].tolist(),
            strict=True,
        )
        return np.array([scalar.share(c, m, u, cpu_req, milli_req) for c, m, u in rows], dtype=np.float64).reshape(
            len(nodes), snapshot.max_gpus
        )
    return _share_fragmentation_after(snapshot, workload, nodes, cpu_req, milli_req)


def _share_fragmentation_after(
    snapshot: ClusterSnapshot, workload: TargetWorkload, nodes: IntArray, cpu_req: int, milli_req: int
) -> FloatArray:
    """The vectorised `share_fragmentation_after`, in blocks of nodes."""
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
