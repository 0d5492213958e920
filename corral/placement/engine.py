"""`place()`: one decision, explained.

    validate request against the cluster (bad input -> InvalidRequest naming the field)
    filters.evaluate -> feasible mask, reason bits per node, GPU fit matrix
    policy.score(feasible) [- load_weight x load term] -> select.best_node (class, score, rank)
    policy.choose_gpus(node) -> Allocation + Explanation

`place` does not change the snapshot; the caller grants the allocation with `snapshot.allocate` (the simulator
at once, the daemon after it has recorded the decision).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from corral.model.arrays import IntArray
from corral.model.errors import InvalidRequest
from corral.model.resources import MILLI_PER_GPU, Allocation, GpuBehavior, GpuGrant, Request, affinity_tag
from corral.model.snapshot import ClusterSnapshot
from corral.placement.context import Context
from corral.placement.explain import Explanation, Shortfall, reason_labels
from corral.placement.filters import FitResult, evaluate, static_gpu_mask
from corral.placement.reasons import ORDER, UNRESOLVABLE_BITS, Reason, primary_reasons
from corral.placement.registry import get_policy
from corral.placement.scores.load import load_term
from corral.placement.select import best_node, top_order
from corral.placement.workload import DEFAULT_WORKLOAD, GpuReserve, TargetWorkload


@dataclass(frozen=True)
class PlacementConfig:
    """Global settings of the engine; a request may override `policy` and the GPU behaviour."""

    policy: str = "binpack"
    gpu_behavior: GpuBehavior = GpuBehavior.PREFERENTIAL
    reserve: GpuReserve = field(default_factory=GpuReserve)
    load_weight: float = 0.0  # 0..1: how much measured GPU utilisation lowers scores
    workload: TargetWorkload | None = None  # target workload of `fgd` (DEFAULT_WORKLOAD when None)
    top_scores: int = 5

    def __post_init__(self) -> None:
        get_policy(self.policy)  # raises InvalidRequest naming the known policies
        if not 0.0 <= self.load_weight <= 1.0:
            raise InvalidRequest("load_weight", f"must be in 0..1, got {self.load_weight}")
        if self.top_scores < 1:
            raise InvalidRequest("top_scores", f"must be >= 1, got {self.top_scores}")


@dataclass(frozen=True, eq=False)
class Decision:
    request: Request
    policy: str
    behavior: GpuBehavior
    allocation: Allocation | None
    explanation: Explanation
    node_reasons: IntArray  # per node: Reason bits, 0 where it fit

    @property
    def placed(self) -> bool:
        return self.allocation is not None

    def unresolvable(self, node: int) -> bool:
        """True when no waiting or preemption can make `node` fit (Kubernetes' FailedAndUnresolvable)."""
        return bool(self.node_reasons[node] & UNRESOLVABLE_BITS)


_LARGEST_GPU_MEMORY = ("largest-gpu-memory",)


def validate_against(snapshot: ClusterSnapshot, request: Request) -> None:
    """Refuse requests that name things this cluster does not have at all."""
    if request.gpu_models is not None:
        unknown = sorted(m for m in request.gpu_models if m not in snapshot.model_id)
        if unknown:
            known = ", ".join(snapshot.models) or "none"
            raise InvalidRequest("gpu_models", f"unknown GPU model {', '.join(unknown)}; this cluster has: {known}")
    want = max(request.gpu_memory_mib, request.min_gpu_memory_mib)
    if want:
        biggest: int | None = snapshot.memo.get(_LARGEST_GPU_MEMORY)
        if biggest is None:  # a pass over every GPU per decision otherwise: memory capacities never change
            biggest = int(snapshot.gpu_mem_cap.max())
            snapshot.memo[_LARGEST_GPU_MEMORY] = biggest
        if want > biggest:
            raise InvalidRequest(
                "gpu_memory_mib" if request.gpu_memory_mib >= request.min_gpu_memory_mib else "min_gpu_memory_mib",
                f"{want} MiB is more than any GPU of this cluster has (largest: {max(biggest, 0)} MiB)",
            )


def _rng(seed: np.random.Generator | int | None) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(0 if seed is None else seed)


def place(
    snapshot: ClusterSnapshot,
    request: Request,
    config: PlacementConfig | None = None,
    rng: np.random.Generator | int | None = None,
    explain_placed: bool = True,
    explain_refused: bool = True,
) -> Decision:
    """One decision. With `explain_placed=False` a placed request's explanation is left brief (counts, top scores
    and notes empty): the simulator, which keeps only where each pod went, spent a fifth of an fgd replay composing
    sentences nobody read. `explain_refused=False` does the same for a refusal (reason counts and shortfalls empty;
    `node_reasons` is always there): only for callers that never show it (a replay without per-pod outcomes: a
    quarter of the pods of a replay are refused, and their shortfalls cost a tenth of an fgd replay)."""
    config = config or PlacementConfig()
    validate_against(snapshot, request)
    policy = get_policy(request.policy or config.policy)
    behavior = request.effective_behavior(config.gpu_behavior)
    fit = evaluate(snapshot, request, behavior, config.reserve)
    ctx = Context(snapshot, request, fit, config.workload or DEFAULT_WORKLOAD, _rng(rng))
    feasible = np.flatnonzero(fit.feasible).astype(np.int64, copy=False)
    notes: list[str] = []
    allocation = None
    top: tuple[tuple[str, float], ...] = ()
    gpus: list[int] = []
    if len(feasible):
        scores = policy.score(ctx, feasible)
        if config.load_weight and request.wants_gpu:
            scores = scores - config.load_weight * load_term(ctx, feasible)
        win = best_node(feasible, scores, snapshot.rank, fit.preferred)
        node = int(feasible[win])
        if request.wants_gpu:
            gpus = policy.choose_gpus(ctx, node)
        allocation = _allocation(snapshot, request, node, gpus)
        if not explain_placed:
            brief = _brief(snapshot, request, policy.name, behavior, len(feasible), allocation, gpus)
            return Decision(request, policy.name, behavior, allocation, brief, fit.reasons)
        order = top_order(feasible, scores, snapshot.rank, fit.preferred, config.top_scores)
        if order[0] != win:  # keep the winner first even if a custom policy returns NaN scores
            order = np.concatenate([[win], order[order != win]])[: config.top_scores]
        top = tuple((snapshot.names[int(feasible[i])], float(scores[i])) for i in order)
        notes.extend(_behaviour_notes(snapshot, fit, behavior, node))
        policy_notes = getattr(policy, "notes", None)
        if callable(policy_notes):
            notes.extend(policy_notes(ctx, node, gpus))
    elif not explain_refused:
        brief = _brief(snapshot, request, policy.name, behavior, 0, None, gpus)
        return Decision(request, policy.name, behavior, None, brief, fit.reasons)
    patterns = _patterns(fit.reasons)
    explanation = Explanation(
        request=request.describe_gpus(),
        policy=policy.name,
        behavior=behavior.value,
        nodes_evaluated=len(snapshot),
        nodes_feasible=len(feasible),
        rejected=_counts_primary(fit.reasons, patterns),
        failing=_counts_any(fit.reasons, patterns),
        unresolvable_nodes=int(np.count_nonzero(fit.reasons & UNRESOLVABLE_BITS)),
        shortfalls=_shortfalls(snapshot, request, fit) if allocation is None else (),
        top=top,
        chosen=None if allocation is None else allocation.node,
        gpus=tuple(gpus),
        labels=reason_labels(request),
        notes=tuple(notes),
    )
    return Decision(request, policy.name, behavior, allocation, explanation, fit.reasons)


def _brief(
    snapshot: ClusterSnapshot,
    request: Request,
    policy: str,
    behavior: GpuBehavior,
    feasible: int,
    allocation: Allocation | None,
    gpus: list[int],
) -> Explanation:
    """An explanation without counts, shortfalls, top scores or notes (see `place`'s explain_* flags)."""
    return Explanation(
        request=request.describe_gpus(),
        policy=policy,
        behavior=behavior.value,
        nodes_evaluated=len(snapshot),
        nodes_feasible=feasible,
        rejected=(),
        failing=(),
        unresolvable_nodes=0,
        shortfalls=(),
        top=(),
        chosen=None if allocation is None else allocation.node,
        gpus=tuple(gpus),
        labels={},
    )


def _allocation(snapshot: ClusterSnapshot, request: Request, node: int, gpus: list[int]) -> Allocation:
    if request.wants_gpu and (len(gpus) != request.gpu_count or len(set(gpus)) != len(gpus)):
        raise RuntimeError(f"policy chose GPUs {gpus} for a request of {request.gpu_count} GPUs on node {node}")
    grants = tuple(
        GpuGrant(
            index=j,
            milli=request.gpu_milli,
            memory_mib=int(snapshot.gpu_mem_cap[node, j])
            if request.gpu_milli == MILLI_PER_GPU
            else request.gpu_memory_mib,
        )
        for j in sorted(gpus)
    )
    return Allocation(
        request_id=request.id,
        node=snapshot.names[node],
        node_index=node,
        cpu_milli=request.cpu_milli,
        memory_mib=request.memory_mib,
        gpus=grants,
        tag=affinity_tag(request),
        share_owner=request.share_owner if request.wants_gpu and not request.whole_gpus else "",
    )


def _behaviour_notes(snapshot: ClusterSnapshot, fit: FitResult, behavior: GpuBehavior, node: int) -> list[str]:
    notes = []
    if fit.warn_undefined is not None and fit.warn_undefined[node]:
        notes.append(
            "GPU scheduling behaviour is undefined: work without GPUs was placed on a node with free GPUs "
            "(set restricted, unrestricted or preferential)"
        )
    if fit.preferred is not None and not fit.preferred[node]:
        notes.append("no node without free GPUs fit; placed on a GPU node, keeping the per-GPU reserve free")
    return notes


def _patterns(bits: IntArray) -> tuple[IntArray, IntArray]:
    """The distinct non-zero reason bitmasks and how many nodes have each: a handful, where nodes are thousands,
    so the counts below cost a pass over the patterns, not one pass over every node per reason (found once per
    decision for both counts)."""
    hist = np.bincount(bits)
    patterns = np.flatnonzero(hist[1:]) + 1
    return patterns, hist[patterns]


def _counts_primary(bits: IntArray, found: tuple[IntArray, IntArray] | None = None) -> tuple[tuple[Reason, int], ...]:
    patterns, nodes = found or _patterns(bits)
    counts = np.zeros(len(ORDER), dtype=np.int64)
    np.add.at(counts, primary_reasons(patterns), nodes)
    pairs = [(r, int(counts[r.value])) for r in ORDER if counts[r.value]]
    return tuple(sorted(pairs, key=lambda p: (-p[1], p[0].value)))


#: Bit position of each reason, in ORDER (the enum's `bit` property costs more than the count it feeds).
_POSITIONS = np.array([r.value for r in ORDER], dtype=np.int64)


def _counts_any(bits: IntArray, found: tuple[IntArray, IntArray] | None = None) -> tuple[tuple[Reason, int], ...]:
    patterns, nodes = found or _patterns(bits)
    counts = (((patterns[:, None] >> _POSITIONS[None, :]) & 1) * nodes[:, None]).sum(axis=0).tolist()
    return tuple((r, n) for r, n in zip(ORDER, counts, strict=True) if n)


def _shortfalls(snapshot: ClusterSnapshot, request: Request, fit: FitResult) -> tuple[Shortfall, ...]:
    out: list[Shortfall] = []
    bits = fit.reasons
    # Only nodes rejected for resolvable reasons alone say how close the cluster came.
    resolvable_only = (bits & UNRESOLVABLE_BITS) == 0
    for reason, free, need, unit in (
        (Reason.INSUFFICIENT_CPU, snapshot.cpu_free, request.cpu_milli, "m"),
        (Reason.INSUFFICIENT_MEMORY, snapshot.mem_free, request.memory_mib, " MiB"),
    ):
        sel = resolvable_only & ((bits & reason.bit) != 0)
        if sel.any():
            out.append(Shortfall(reason, need, int(free[sel].max()), unit, int(sel.sum())))
    sel = resolvable_only & ((bits & Reason.INSUFFICIENT_GPU.bit) != 0)
    if sel.any():
        static = static_gpu_mask(snapshot, request)[sel]
        if request.whole_gpus:
            best = int(fit.gpu_fit[sel].sum(axis=1).max())
            out.append(Shortfall(Reason.INSUFFICIENT_GPU, request.gpu_count, best, " whole GPUs", int(sel.sum())))
        elif request.gpu_milli:
            best = int(np.where(static, snapshot.gpu_milli_free[sel], 0).max())
            out.append(Shortfall(Reason.INSUFFICIENT_GPU, request.gpu_milli, best, " GPU milli", int(sel.sum())))
        else:
            best = int(np.where(static, snapshot.gpu_mem_free[sel], 0).max())
            out.append(
                Shortfall(Reason.INSUFFICIENT_GPU, request.gpu_memory_mib, best, " MiB GPU memory", int(sel.sum()))
            )
    return tuple(out)
