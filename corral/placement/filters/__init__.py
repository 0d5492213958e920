"""Filters: which nodes can take a request now, and for each node that cannot, every reason why.

    static (cached per snapshot)         dynamic (per decision)
    constraints, GPU model, GPU memory   free CPU / memory, GPUs that fit now
    capacity (cpu, memory, #GPUs)        scarce-GPU behaviour for work without GPUs (behaviour.py)

The result is a boolean mask and one reason bitmask per node (`reasons.Reason`), plus the GPU-level fit matrix
that scores and GPU choice reuse.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from corral.model.resources import MILLI_PER_GPU, GpuBehavior, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement.filters.behaviour import scarce_gpu
from corral.placement.reasons import Reason
from corral.placement.workload import GpuReserve

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class FitResult:
    feasible: BoolArray  # nodes
    reasons: IntArray  # nodes: bitmask of Reason bits, 0 where feasible
    gpu_fit: BoolArray  # nodes x GPUs: GPUs that could take one of the request's GPUs now
    preferred: BoolArray | None  # nodes: preference class for `preferential` (True = preferred), else None
    warn_undefined: BoolArray | None  # nodes where `undefined` behaviour would put non-GPU work beside free GPUs


def gpu_fit_matrix(snapshot: ClusterSnapshot, request: Request, static: BoolArray) -> BoolArray:
    """GPUs that can take one of the request's GPUs now (whole: nothing of it held; share: enough left)."""
    fit: BoolArray
    if request.whole_gpus:
        whole = (snapshot.gpu_milli_free == MILLI_PER_GPU) & (snapshot.gpu_mem_free == snapshot.gpu_mem_cap)
        fit = static & whole
        return fit
    fit = static & (snapshot.gpu_milli_free >= request.gpu_milli)
    if request.gpu_memory_mib:
        fit &= snapshot.gpu_mem_free >= request.gpu_memory_mib
    return fit


def static_gpu_mask(snapshot: ClusterSnapshot, request: Request) -> BoolArray:
    return snapshot.gpu_static_mask(request.gpu_models, max(request.min_gpu_memory_mib, request.gpu_memory_mib))


def evaluate(
    snapshot: ClusterSnapshot,
    request: Request,
    behavior: GpuBehavior,
    reserve: GpuReserve,
) -> FitResult:
    n = len(snapshot)
    bits = np.zeros(n, dtype=np.int64)
    for constraint in request.constraints:
        bits |= np.where(snapshot.constraint_mask(constraint), 0, Reason.CONSTRAINT.bit)

    c, m = request.cpu_milli, request.memory_mib
    if c:
        bits |= np.where(snapshot.cpu_cap < c, Reason.CPU_CAPACITY.bit, 0)
        bits |= np.where((snapshot.cpu_cap >= c) & (snapshot.cpu_free < c), Reason.INSUFFICIENT_CPU.bit, 0)
    if m:
        bits |= np.where(snapshot.mem_cap < m, Reason.MEMORY_CAPACITY.bit, 0)
        bits |= np.where((snapshot.mem_cap >= m) & (snapshot.mem_free < m), Reason.INSUFFICIENT_MEMORY.bit, 0)

    preferred = warn = None
    if request.wants_gpu:
        k = request.gpu_count
        static = static_gpu_mask(snapshot, request)
        fit = gpu_fit_matrix(snapshot, request, static)
        no_gpus = snapshot.gpu_count == 0
        bits |= np.where(no_gpus, Reason.NO_GPUS.bit, 0)
        if request.gpu_models is not None:
            model_ok = snapshot.gpu_static_mask(request.gpu_models, 0).any(axis=1)
        else:
            model_ok = ~no_gpus
        bits |= np.where(~no_gpus & ~model_ok, Reason.GPU_MODEL.bit, 0)
        n_static = static.sum(axis=1)
        bits |= np.where(model_ok & (n_static == 0), Reason.GPU_MEMORY.bit, 0)
        bits |= np.where((n_static > 0) & (n_static < k), Reason.TOO_FEW_GPUS.bit, 0)
        bits |= np.where((n_static >= k) & (fit.sum(axis=1) < k), Reason.INSUFFICIENT_GPU.bit, 0)
    else:
        fit = np.zeros((n, snapshot.max_gpus), dtype=np.bool_)
        decline, preferred, warn = scarce_gpu(snapshot, request, behavior, reserve)
        if decline is not None:
            # Declines are reported only where everything else fit (Marathon's funnel order).
            bits |= np.where(bits == 0, decline, 0)
    return FitResult(bits == 0, bits, fit, preferred, warn)
