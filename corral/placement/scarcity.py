"""How scarce room for each target type is across the whole cluster, and which GPU models constrained types need.

Two cluster-wide views of the target workload (the FGD study's "typical pods", `placement.workload`), both built
from the current snapshot and the workload's statistics only:

    slots_m     = sum over nodes of how many pods of type m still fit (`fill.type_fill`: GPU slots and CPU slots)
    horizon H   = free GPU milli of the cluster / expected GPU milli of one target pod
                  (how many more pods, drawn from the workload, it takes to fill the cluster)
    demand_m    = p_m x H                          (how many of those are of type m)
    weight_m    = min(1, demand_m / slots_m)       rounded to eighths, so it changes in steps, not every decision

A type whose room is plentiful (weight 0) cannot run short before the cluster is full, so losing a slot of it costs
nothing; a type whose room is about to run out (weight 1) loses a future pod with every slot. Rounding keeps the
weights, and with them the per-request-shape score cache (`scores.common.cached_node_scores`), stable for long runs
of decisions.

    model level(n) = rank of sum over model-constrained types m whose models include node n's GPUs of
                     p_m x (GPU milli of one pod of m) / (GPUs of those models in the cluster)

is the share of the constrained demand, per GPU, that leans on node n's models: 0 where no constrained type can run,
higher where a type that can run nowhere else competes for few GPUs. It is static (inventory and workload only).
"""

from __future__ import annotations

import numpy as np

from corral.model.arrays import FloatArray, IntArray
from corral.model.snapshot import ClusterSnapshot
from corral.placement.native import kernels
from corral.placement.workload import TargetWorkload, compile_workload

#: Weights move in steps of 1/WEIGHT_STEPS (see the module docstring).
WEIGHT_STEPS = 8
#: Slots above this count as unlimited (a type without CPU or GPU needs fits without bound).
_MANY = 1 << 40


def cluster_slots(snapshot: ClusterSnapshot, workload: TargetWorkload) -> IntArray:
    """Per target type: pods of it that still fit, summed over nodes (kept per node, refreshed where nodes changed;
    the sums are updated by the changed nodes' differences, exact in integers, instead of re-added each decision)."""
    return _slots(snapshot, workload)[2].copy()


def _slots(snapshot: ClusterSnapshot, workload: TargetWorkload) -> tuple[IntArray, IntArray, IntArray]:
    """`cluster_slots`' entry (per node the version its slots were counted at, slots per type and node, and their
    sums per type), brought up to date."""
    w, s = compile_workload(snapshot, workload), snapshot
    entry = _slots_entry(snapshot, workload)
    versions, per_node, totals = entry
    kernels().refresh_slots(
        s.version, s.cpu_free, s.gpu_milli_free, s.gpu_present, w.by_node, w.table, versions, per_node, totals,
        _MANY // max(len(s), 1),
    )  # fmt: skip
    return entry


def _slots_entry(snapshot: ClusterSnapshot, workload: TargetWorkload) -> tuple[IntArray, IntArray, IntArray]:
    """`_slots`' entry as it is (the caller refreshes it)."""
    key = ("slots", workload.key)
    entry: tuple[IntArray, IntArray, IntArray] | None = snapshot.memo.get(key)
    if entry is None:
        n, types = len(snapshot), len(compile_workload(snapshot, workload).prob)
        entry = (np.full(n, -1, dtype=np.int64), np.zeros((types, n), dtype=np.int64), np.zeros(types, dtype=np.int64))
        snapshot.memo[key] = entry
    return entry


def horizon(snapshot: ClusterSnapshot, workload: TargetWorkload, cpu: bool = False) -> float:
    """H: how many more pods drawn from the workload it takes to fill the cluster's free GPU milli.

    With `cpu`, the free CPU counts too: H is the smaller of the pods that fill the free GPU milli and the pods that
    take the free CPU (every target type, pods without GPUs included). Where pods without GPUs are many, CPU runs out
    long before GPU milli does, and the GPU-only horizon promises pods (multi-GPU ones among them) that never come.
    """
    return horizons(snapshot, workload)[1 if cpu else 0]


def horizons(snapshot: ClusterSnapshot, workload: TargetWorkload) -> tuple[float, float]:
    """`horizon` without and with the free CPU, from one pass over the nodes (a decision of fgd-priced needs both)."""
    key = ("per-pod", workload.key)
    per_pod: tuple[float, float] | None = snapshot.memo.get(key)
    if per_pod is None:
        w = compile_workload(snapshot, workload)
        per_pod = (float((w.prob * w.count * w.milli).sum()), float((w.prob * w.cpu).sum()))
        snapshot.memo[key] = per_pod
    milli, cores = per_pod
    # gpu_free_total is each node's free milli over its GPUs (kept by allocate/release): no pass over every GPU.
    free, free_cpu = kernels().free_sums(snapshot.gpu_free_total, snapshot.cpu_free)
    gpu = float(free) / milli if milli > 0 else 0.0
    return gpu, min(gpu, float(free_cpu) / cores) if cores > 0 else gpu


def scarcity_weights(snapshot: ClusterSnapshot, workload: TargetWorkload, h: float | None = None) -> FloatArray:
    """weight_m = min(1, p_m H / slots_m) in steps of 1/WEIGHT_STEPS (module docstring); `h`: H, where the caller has
    it."""
    w, s = compile_workload(snapshot, workload), snapshot
    versions, per_node, totals = _slots_entry(snapshot, workload)
    out: FloatArray = kernels().scarcity(
        s.version, s.cpu_free, s.gpu_milli_free, s.gpu_present, w.by_node, w.table, versions, per_node, totals,
        _MANY // max(len(s), 1), w.prob, horizon(snapshot, workload) if h is None else h, WEIGHT_STEPS,
    )  # fmt: skip
    return out


def model_levels(snapshot: ClusterSnapshot, workload: TargetWorkload) -> tuple[IntArray, int]:
    """Per node: its model level (0 = no constrained type needs its GPUs), and the number of distinct levels."""
    key = ("model-levels", workload.key)
    cached: tuple[IntArray, int] | None = snapshot.memo.get(key)
    if cached is None:
        w = compile_workload(snapshot, workload)
        constrained = np.array([t.models is not None for t in workload.types], dtype=np.bool_)
        gpus_of = w.access.sum(axis=(1, 2)).astype(np.float64)
        lean = np.where(constrained & (gpus_of > 0), w.prob * w.count * w.milli / np.maximum(gpus_of, 1.0), 0.0)
        # Rounded so that nodes of the same models land on exactly the same level whatever the summation order.
        pressure = np.round((lean[:, None] * w.access.any(axis=2)).sum(axis=0), 9)
        values = np.unique(np.concatenate([[0.0], pressure]))
        cached = (np.searchsorted(values, pressure).astype(np.int64), len(values))
        snapshot.memo[key] = cached
    return cached
