"""A plain per-node reference implementation of the filters, the deterministic scores and fragmentation.

Written from the documented definitions (the docstrings of `filters`, `filters.behaviour`, each `scores` module, and
the FGD study's sections 3 and 4.3), one node at a time over `ClusterSnapshot.node_state`, with ordinary loops and
no numpy. It is slow on purpose and exists so the property tests can check the vectorised engine against an
independent reading of the same rules. Nothing in the engine imports it; `corral serve`'s /metrics takes its one
machine's F from here (the engine's F is compiled, `placement.kernels`, which a daemon need not load for a gauge).

Float results follow the formulas in their written order, so they come out bit-identical to any implementation that
evaluates the same formula left to right (integers stay integers until a formula divides).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from corral.model.resources import MILLI_PER_GPU, GpuBehavior, Request, affinity_tag
from corral.model.snapshot import ClusterSnapshot, GpuState, NodeState
from corral.placement.reasons import Reason
from corral.placement.workload import GpuReserve, TargetWorkload

#: The policies whose score depends only on the snapshot and the request (no random draw, no measurements).
DETERMINISTIC_POLICIES: tuple[str, ...] = (
    "binpack",
    "spread",
    "bestfit",
    "dotprod",
    "gpu-packing",
    "gpu-clustering",
    "fgd",
)

#: The FGD study's fixed normalisers: a 128-core node and an 8-GPU node.
_CPU_NORM = 128000.0
_GPU_NORM = 8000.0


# ---------------------------------------------------------------------------------------------------- GPU predicates
def gpu_untouched(gpu: GpuState) -> bool:
    """Nothing of the GPU is granted: all of its compute and all of its memory are free."""
    return gpu.milli_free == MILLI_PER_GPU and gpu.memory_free == gpu.memory_mib


def gpu_of_allowed_model(gpu: GpuState, request: Request) -> bool:
    return request.gpu_models is None or gpu.model in request.gpu_models


def gpu_eligible(gpu: GpuState, request: Request) -> bool:
    """Could this GPU ever serve one of the request's GPUs: an allowed model with enough memory in total?"""
    needed = max(request.min_gpu_memory_mib, request.gpu_memory_mib)
    return gpu_of_allowed_model(gpu, request) and gpu.memory_mib >= needed


def gpu_fits_now(gpu: GpuState, request: Request) -> bool:
    """Can this GPU take one of the request's GPUs now (whole: untouched; share: enough compute and memory left)?"""
    if not gpu_eligible(gpu, request):
        return False
    if request.whole_gpus:
        return gpu_untouched(gpu)
    return gpu.milli_free >= request.gpu_milli and gpu.memory_free >= request.gpu_memory_mib


def fitting_gpus(node: NodeState, request: Request) -> list[GpuState]:
    """The GPUs of the node that fit the request now, in index order."""
    return [g for g in node.gpus if gpu_fits_now(g, request)]


def gpus_taken(node: NodeState, request: Request) -> list[GpuState]:
    """The k GPUs a multi-GPU or whole-GPU request is taken from by the packing scores and fgd.

    The fitting GPUs visited in ascending free milli, lowest index first among equals (for whole GPUs every
    fitting GPU has 1000 free, so these are the lowest-index free ones).
    """
    ordered = sorted(fitting_gpus(node, request), key=lambda g: (g.milli_free, g.index))
    return ordered[: request.gpu_count]


# ---------------------------------------------------------------------------------------------------- filters
def node_reasons(node: NodeState, request: Request, behavior: GpuBehavior, reserve: GpuReserve) -> int:
    """The Reason bitmask of one node: every dimension that failed, 0 when the node can take the request now."""
    bits = 0
    for constraint in request.constraints:
        if not constraint.matches(node.labels, node.name):
            bits |= Reason.CONSTRAINT.bit

    # CPU and memory: a capacity that can never hold the request, else what is free now.
    if node.cpu_milli < request.cpu_milli:
        bits |= Reason.CPU_CAPACITY.bit
    elif node.cpu_free < request.cpu_milli:
        bits |= Reason.INSUFFICIENT_CPU.bit
    if node.memory_mib < request.memory_mib:
        bits |= Reason.MEMORY_CAPACITY.bit
    elif node.memory_free < request.memory_mib:
        bits |= Reason.INSUFFICIENT_MEMORY.bit

    if request.wants_gpu:
        # The funnel: any GPU at all, then an allowed model, then enough memory, then enough such GPUs, then free.
        if not node.gpus:
            bits |= Reason.NO_GPUS.bit
        else:
            of_model = [g for g in node.gpus if gpu_of_allowed_model(g, request)]
            eligible = [g for g in node.gpus if gpu_eligible(g, request)]
            if not of_model:
                bits |= Reason.GPU_MODEL.bit
            elif not eligible:
                bits |= Reason.GPU_MEMORY.bit
            elif len(eligible) < request.gpu_count:
                bits |= Reason.TOO_FEW_GPUS.bit
            elif len(fitting_gpus(node, request)) < request.gpu_count:
                bits |= Reason.INSUFFICIENT_GPU.bit
        return bits

    # Work without GPUs: the scarce-GPU declines count only where everything else fit.
    if bits:
        return bits
    if behavior is GpuBehavior.RESTRICTED:
        if any(gpu_untouched(g) for g in node.gpus):
            bits |= Reason.DECLINED_SCARCE.bit
    elif behavior is GpuBehavior.PREFERENTIAL:
        free_milli = sum(g.milli_free for g in node.gpus)
        if free_milli > 0:
            cpu_left = node.cpu_free - request.cpu_milli
            memory_left = node.memory_free - request.memory_mib
            # Keep free_milli / 1000 x the per-GPU reserve (compared in integers, scaled by 1000).
            eats_cpu = cpu_left * MILLI_PER_GPU < reserve.cpu_milli_per_gpu * free_milli
            eats_memory = memory_left * MILLI_PER_GPU < reserve.memory_mib_per_gpu * free_milli
            if eats_cpu or eats_memory:
                bits |= Reason.GPU_RESERVE.bit
    return bits


def reference_reasons(
    snapshot: ClusterSnapshot, request: Request, behavior: GpuBehavior, reserve: GpuReserve
) -> list[int]:
    """The Reason bitmask of every node, in node order."""
    return [node_reasons(snapshot.node_state(i), request, behavior, reserve) for i in range(len(snapshot))]


def reference_preferred(snapshot: ClusterSnapshot, node_index: int) -> bool:
    """`preferential`'s preference class: the node has no unallocated GPU compute at all."""
    return sum(g.milli_free for g in snapshot.node_state(node_index).gpus) == 0


# ---------------------------------------------------------------------------------------------------- fragmentation
def fragmentation(cpu_free: int, gpus: Sequence[tuple[str, int]], workload: TargetWorkload) -> float:
    """F(n) of a node with `cpu_free` free CPU and GPUs given as (model, free milli), per the FGD study §4.3.

    Each target type m (probability p_m) falls in one category, and the idle GPU milli U it cannot use is fragment:

        CPU-only type (no GPU)              xl_satisfied if c >= c_m else xr_lack_cpu     f = U
        no GPU of an allowed model          no_access                                     f = U
        enough GPUs fit (allowed model, free milli >= m_m, at least k_m of them):
            and c >= c_m                    q3_satisfied; the milli outside those GPUs is booked as q2_lack_gpu
            else                            q4_lack_cpu                                   f = U
        too few GPUs fit, c >= c_m          q2_lack_gpu                                   f = U
        neither                             q1_lack_both                                  f = U

    F(n) = sum_m p_m f(n, m). As in the study's code (fgd-experiment.md §7, C2) p_m x f is added to its category's
    bucket walking the types in order, and F = q1 + q2 + q4 + xl + xr + no_access; the order only changes rounding
    residues, but those decide FGD's 49-or-50 ties.
    """
    total = 0
    for _model, free in gpus:
        total += free
    q1 = q2 = q4 = xl = xr = no_access = 0.0
    for t in workload.types:
        p = t.probability
        cpu_ok = cpu_free >= t.cpu_milli
        if t.gpu_count == 0:
            if cpu_ok:
                xl += p * total
            else:
                xr += p * total
            continue
        accessible = [free for model, free in gpus if t.models is None or model in t.models]
        if not accessible:
            no_access += p * total
            continue
        usable = [free for free in accessible if free >= t.gpu_milli]
        gpu_ok = len(usable) >= t.gpu_count
        if gpu_ok and cpu_ok:
            q2 += p * (total - sum(usable))  # the rest, sum(usable), is q3: not fragment
        elif gpu_ok:
            q4 += p * total
        elif cpu_ok:
            q2 += p * total
        else:
            q1 += p * total
    return q1 + q2 + q4 + xl + xr + no_access


def _gpu_pairs(node: NodeState) -> list[tuple[str, int]]:
    return [(g.model, g.milli_free) for g in node.gpus]


def reference_fragmentation(snapshot: ClusterSnapshot, workload: TargetWorkload, node_index: int) -> float:
    """F(n) of the node as it is now (milli-GPU; 0 for nodes without GPUs)."""
    node = snapshot.node_state(node_index)
    return fragmentation(node.cpu_free, _gpu_pairs(node), workload)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def fgd_points(delta: float) -> float:
    """floor(100 sigmoid(delta / 1000)), delta = F(n) - F(n') in milli-GPU."""
    return float(math.floor(100.0 * _sigmoid(delta / 1000.0)))


def _fgd_share_scores(node: NodeState, request: Request, workload: TargetWorkload) -> list[tuple[int, float]]:
    """(GPU index, score) for every GPU that can take a one-GPU share."""
    before = fragmentation(node.cpu_free, _gpu_pairs(node), workload)
    out: list[tuple[int, float]] = []
    for g in fitting_gpus(node, request):
        after_gpus = [
            (
                other.model,
                other.milli_free - request.gpu_milli if other.index == g.index else other.milli_free,
            )
            for other in node.gpus
        ]
        after = fragmentation(node.cpu_free - request.cpu_milli, after_gpus, workload)
        out.append((g.index, fgd_points(before - after)))
    return out


def reference_fgd_share_gpu(
    snapshot: ClusterSnapshot, request: Request, node_index: int, workload: TargetWorkload
) -> int:
    """The GPU fgd grants a one-GPU share on the node: the best-scoring fitting GPU, lowest index on ties."""
    scored = _fgd_share_scores(snapshot.node_state(node_index), request, workload)
    best = max(s for _, s in scored)
    return min(j for j, s in scored if s == best)


def _fgd(node: NodeState, request: Request, workload: TargetWorkload) -> float:
    if request.wants_gpu and request.gpu_count == 1 and not request.whole_gpus:
        return max(s for _, s in _fgd_share_scores(node, request, workload))
    before = fragmentation(node.cpu_free, _gpu_pairs(node), workload)
    taken = {g.index for g in gpus_taken(node, request)} if request.wants_gpu else set()
    after_gpus = [(g.model, g.milli_free - request.gpu_milli if g.index in taken else g.milli_free) for g in node.gpus]
    after = fragmentation(node.cpu_free - request.cpu_milli, after_gpus, workload)
    return fgd_points(before - after)


# ---------------------------------------------------------------------------------------------------- scores
def _used_fraction_after(capacity: int, free: int, want: int) -> float:
    """Fraction of the capacity in use once `want` more is taken; a dimension the node lacks counts as full."""
    if capacity <= 0:
        return 1.0
    return (capacity - free + want) / capacity


def _weighted_used_after(node: NodeState, request: Request) -> float:
    cpu = _used_fraction_after(node.cpu_milli, node.cpu_free, request.cpu_milli)
    memory = _used_fraction_after(node.memory_mib, node.memory_free, request.memory_mib)
    if not request.wants_gpu:
        return (cpu + memory) / 2
    gpu_capacity = len(node.gpus) * MILLI_PER_GPU
    gpu_free = sum(g.milli_free for g in node.gpus)
    gpu = _used_fraction_after(gpu_capacity, gpu_free, request.gpu_demand_milli)
    return (3 * gpu + cpu + memory) / 5


def _bestfit(node: NodeState, request: Request) -> float:
    free_gpu = sum(g.milli_free for g in node.gpus)
    raw = (
        0.5 * (node.cpu_free - request.cpu_milli) / _CPU_NORM + 0.5 * (free_gpu - request.gpu_demand_milli) / _GPU_NORM
    )
    return float(math.floor(100.0 * (1.0 - raw)))


def _dotprod(node: NodeState, request: Request) -> float:
    if node.cpu_free < request.cpu_milli:
        return 0.0
    free_gpu = sum(g.milli_free for g in node.gpus)
    x = (node.cpu_free / _CPU_NORM, free_gpu / _GPU_NORM)
    y = (request.cpu_milli / _CPU_NORM, request.gpu_demand_milli / _GPU_NORM)
    dot = x[0] * y[0] + x[1] * y[1]
    return float(math.floor(100.0 * (1.0 - dot / 2.0)))


def _gpu_packing(node: NodeState, request: Request) -> float:
    if not request.wants_gpu:
        return 0.0
    gpu_count = len(node.gpus)
    if all(gpu_untouched(g) for g in node.gpus):
        return float(33 - gpu_count)
    taken = gpus_taken(node, request)
    # "Fully free" means nothing of the GPU is granted, as for "every GPU free" above (gpu_full_free): a GPU that
    # holds only a memory share has all 1000 milli free but is a used GPU, and filling it is packing.
    opened = sum(1 for g in taken if gpu_untouched(g))
    if opened > 0:
        return float(max(50 - opened, 33))
    tenths = sum((100 * g.milli_free) // MILLI_PER_GPU for g in taken)
    return float(max(100 - tenths // 10, 50))


def _gpu_clustering(node: NodeState, request: Request) -> float:
    if not request.wants_gpu:
        return 0.0
    free_gpu = sum(g.milli_free for g in node.gpus)
    b = (25 * (8000 - free_gpu)) // 8000
    mine_tag = affinity_tag(request)
    gpu_tags = {tag for tag, count in node.tags.items() if tag != 0 and count > 0}
    mine = mine_tag in gpu_tags
    others = bool(gpu_tags - {mine_tag})
    if mine and not others:
        base = 75
    elif mine:
        base = 50
    elif not others:
        base = 25
    else:
        base = 0
    return float(base + b)


def reference_score(
    policy_name: str, snapshot: ClusterSnapshot, request: Request, node_index: int, workload: TargetWorkload
) -> float:
    """The score `policy_name` gives node `node_index` for `request` (the node must be feasible)."""
    node = snapshot.node_state(node_index)
    if policy_name == "binpack":
        return 100.0 * _weighted_used_after(node, request)
    if policy_name == "spread":
        return 100.0 - 100.0 * _weighted_used_after(node, request)
    if policy_name == "bestfit":
        return _bestfit(node, request)
    if policy_name == "dotprod":
        return _dotprod(node, request)
    if policy_name == "gpu-packing":
        return _gpu_packing(node, request)
    if policy_name == "gpu-clustering":
        return _gpu_clustering(node, request)
    if policy_name == "fgd":
        return _fgd(node, request, workload)
    raise ValueError(f"no reference score for policy {policy_name!r}; use one of {', '.join(DETERMINISTIC_POLICIES)}")
