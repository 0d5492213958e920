"""GPU scheduling behaviour for work that asks for no GPU (the seeds' "scarce GPU" problem).

    behaviour      node with a free GPU                           chosen among feasible nodes
    undefined      fits (the explanation warns)                   by policy score
    unrestricted   fits                                           by policy score
    restricted     declined: DeclinedScarceResources              by policy score
    preferential   fits unless it takes the per-GPU reserve       nodes without free GPU capacity first,
                   (GPU_RESERVE)                                  then by policy score

"Free GPU" for `restricted` is Marathon's: a GPU nobody holds any of (what a Mesos offer would carry); a node whose
GPUs are all taken counts as a non-GPU node. `preferential` fixes that caveat: any unallocated GPU capacity, shares
included, counts, and the CPU/memory it needs stays reserved: a node with free GPU capacity U (milli) keeps
U/1000 x reserve free, so non-GPU work can still use such a node when nothing else fits, without stranding its GPUs.
"""

from __future__ import annotations

import numpy as np

from corral.model.arrays import BoolArray, IntArray
from corral.model.resources import MILLI_PER_GPU, GpuBehavior, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement.reasons import Reason
from corral.placement.workload import GpuReserve


def scarce_gpu(
    snapshot: ClusterSnapshot, request: Request, behavior: GpuBehavior, reserve: GpuReserve
) -> tuple[IntArray | None, BoolArray | None, BoolArray | None]:
    """(decline bits per node or None, preferred mask or None, undefined-warning mask or None)."""
    if behavior is GpuBehavior.RESTRICTED:
        return np.where(snapshot.gpu_full_free > 0, Reason.DECLINED_SCARCE.bit, 0), None, None
    if behavior is GpuBehavior.PREFERENTIAL:
        free = snapshot.gpu_free_total
        cpu_left = (snapshot.cpu_free - request.cpu_milli) * MILLI_PER_GPU
        mem_left = (snapshot.mem_free - request.memory_mib) * MILLI_PER_GPU
        eats = (cpu_left < reserve.cpu_milli_per_gpu * free) | (mem_left < reserve.memory_mib_per_gpu * free)
        return np.where(eats & (free > 0), Reason.GPU_RESERVE.bit, 0), free == 0, None
    if behavior is GpuBehavior.UNDEFINED:
        return None, None, snapshot.gpu_full_free > 0
    return None, None, None
