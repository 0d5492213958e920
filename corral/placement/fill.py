"""How much of a node's idle GPU capacity the target workload could still fill, counting every pod that fits.

FGD's fragmentation (`placement.workload`) asks, per target type, whether *one* pod of the type fits. A node with
8 idle GPUs and 12 free cores then looks unfragmented for a 1-GPU, 11-core type, although 7 of those GPUs can never
be used: the first such pod takes the CPU. The fill measure asks how *many* pods of the type fit:

    slots_m(n) = min(GPU slots, CPU slots)
        GPU slots: one-GPU share type   sum over allowed GPUs of floor(u_g / m_m)
                   whole-GPU type       floor(#allowed GPUs with u_g = 1000 / k_m)
        CPU slots: floor(c / c_m)                       (c_m = 0: unlimited)
    unfilled_m(n) = U - min(U, slots_m x k_m x m_m)      (CPU-only types: U, as in FGD: they use no GPU)

    W(n) = sum_m p_m x unfilled_m(n)        (milli-GPU; nodes without GPUs give 0; memory is ignored, as in FGD)

W is the GPU milli of the node that would stay idle if the rest of the stream were made of the target types, one
type at a time, in proportion to their probabilities. Its decrease when a pod lands is the pod's "fill gain".
"""

from __future__ import annotations

import numpy as np

from corral.model.arrays import FloatArray, IntArray
from corral.model.resources import MILLI_PER_GPU
from corral.model.snapshot import ClusterSnapshot
from corral.placement.native import kernels
from corral.placement.workload import TargetWorkload, _Compiled, _ints, compile_workload

#: Nodes per block (bounds memory at types x block x GPUs, x GPUs again for per-GPU candidates).
_BLOCK = 1024
#: CPU slots of a type that asks for no CPU: unlimited.
_UNLIMITED = int(np.iinfo(np.int64).max)


def type_fill(
    snapshot: ClusterSnapshot,
    workload: TargetWorkload,
    nodes: IntArray,
    cpu_free: IntArray,
    milli_free: IntArray,
) -> tuple[IntArray, IntArray]:
    """Per target type: (slots_m, unfilled_m), each shaped (types, *S), for hypothetical node states.

    S is (nodes,) or (nodes, candidates) with free CPU shaped S and per-GPU free milli shaped S x GPUs: the second
    form scores several hypothetical states of each node at once (one per GPU a share could go to).
    """
    slots, unfilled, _, _ = _fill(snapshot, workload, nodes, cpu_free, milli_free)
    return slots, unfilled


def _fill(
    snapshot: ClusterSnapshot,
    workload: TargetWorkload,
    nodes: IntArray,
    cpu_free: IntArray,
    milli_free: IntArray,
) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    """`type_fill`'s slots and unfilled, with the GPU slots (types, *S) and idle milli (S) they were made of."""
    w = compile_workload(snapshot, workload)
    if cpu_free.ndim == 1:  # one state per node (every caller in the engine): the compiled loops
        got: tuple[IntArray, IntArray, IntArray, IntArray] = kernels().fill(
            _ints(nodes), _ints(cpu_free), _ints(milli_free), snapshot.gpu_present, w.by_node, w.table
        )
        return got
    t = len(w.prob)
    extra = (1,) * cpu_free.ndim
    present = snapshot.gpu_present[nodes][:, None, :]
    access = w.access[:, nodes][:, :, None, :]  # types x nodes x candidates x GPUs
    free = np.where(present, np.maximum(milli_free, 0), 0)
    idle = free.sum(axis=-1)
    share = w.share.reshape(t, *extra)
    share_slots = np.where(access, free[None] // w.milli_div.reshape(t, *extra, 1), 0).sum(axis=-1)
    whole_free = (access & (free[None] >= MILLI_PER_GPU)).sum(axis=-1)
    gpu_slots = np.where(share, share_slots, whole_free // w.count_div.reshape(t, *extra))
    slots, unfilled = _slots_unfilled(w, extra, np.maximum(cpu_free, 0)[None], gpu_slots, idle[None])
    return slots, unfilled, gpu_slots, idle


def _slots_unfilled(
    w: _Compiled, extra: tuple[int, ...], cpu_free: IntArray, gpu_slots: IntArray, idle: IntArray
) -> tuple[IntArray, IntArray]:
    """Per type, how many of its pods fit (its CPU slots, and its GPU slots for a type with GPUs) and the idle milli
    they leave unfilled, from free CPU (at least 0) and idle milli shaped (1, *S) and GPU slots (types, *S)."""
    t = len(w.prob)
    cpu = w.cpu.reshape(t, *extra)
    cpu_slots = np.where(cpu > 0, cpu_free // w.cpu_div.reshape(t, *extra), _UNLIMITED)
    cpu_only = w.cpu_only.reshape(t, *extra)
    slots = np.where(cpu_only, cpu_slots, np.minimum(gpu_slots, cpu_slots))
    usable = np.minimum(slots * (w.count * w.milli).reshape(t, *extra), idle)
    unfilled: IntArray = np.where(cpu_only, idle, idle - usable)
    return slots, unfilled


def _unfilled(
    snapshot: ClusterSnapshot,
    workload: TargetWorkload,
    nodes: IntArray,
    cpu_free: IntArray,
    milli_free: IntArray,
) -> FloatArray:
    """W for `nodes` with hypothetical free CPU (shape S) and per-GPU free milli (shape S x GPUs)."""
    w = compile_workload(snapshot, workload)
    _, unfilled = type_fill(snapshot, workload, nodes, cpu_free, milli_free)
    out: FloatArray = (w.prob.reshape(-1, *((1,) * cpu_free.ndim)) * unfilled).sum(axis=0)
    return out


def node_unfilled(
    snapshot: ClusterSnapshot,
    workload: TargetWorkload,
    nodes: IntArray,
    cpu_free: IntArray | None = None,
    milli_free: IntArray | None = None,
) -> FloatArray:
    """W(n) for the given nodes, on their current state or on hypothetical free CPU / per-GPU free milli."""
    c_all = snapshot.cpu_free[nodes] if cpu_free is None else cpu_free
    u_all = snapshot.gpu_milli_free[nodes] if milli_free is None else milli_free
    out = np.empty(len(nodes), dtype=np.float64)
    for lo in range(0, len(nodes), _BLOCK):
        hi = lo + _BLOCK
        out[lo:hi] = _unfilled(snapshot, workload, nodes[lo:hi], c_all[lo:hi], u_all[lo:hi])
    return out


def share_unfilled_after(
    snapshot: ClusterSnapshot,
    workload: TargetWorkload,
    nodes: IntArray,
    cpu_req: int,
    milli_req: int,
) -> FloatArray:
    """W(n') per (node, GPU) for a one-GPU share of `milli_req` placed on that GPU (nodes x GPUs)."""
    out = np.empty((len(nodes), snapshot.max_gpus), dtype=np.float64)
    block = max(1, _BLOCK // snapshot.max_gpus)
    for lo in range(0, len(nodes), block):
        idx = nodes[lo : lo + block]
        out[lo : lo + len(idx)] = _unfilled(snapshot, workload, idx, *share_states(snapshot, idx, cpu_req, milli_req))
    return out


def share_unfilled(
    snapshot: ClusterSnapshot, workload: TargetWorkload, nodes: IntArray, cpu_req: int, milli_req: int
) -> IntArray:
    """unfilled_m of `nodes` with a one-GPU share placed on each GPU in turn (types x nodes x GPUs).

    The same integers as `type_fill` on `share_states`, but each type's GPU slots are updated for the one GPU that
    changed instead of recounting every GPU of every hypothetical state (GPUs x fewer operations)."""
    w = compile_workload(snapshot, workload)
    s = snapshot
    out: IntArray = kernels().share_unfilled(
        _ints(nodes), s.cpu_free, s.gpu_milli_free, w.by_node, w.table, cpu_req, milli_req
    )
    return out


def share_states(snapshot: ClusterSnapshot, nodes: IntArray, cpu_req: int, milli_req: int) -> tuple[IntArray, IntArray]:
    """The hypothetical states of `nodes` with a one-GPU share placed on each GPU in turn: free CPU (nodes x GPUs)
    and per-GPU free milli (nodes x GPUs x GPUs, row j the share taken from GPU j), as `type_fill` takes them."""
    g = snapshot.max_gpus
    milli: IntArray = snapshot.gpu_milli_free[nodes][:, None, :] - np.eye(g, dtype=np.int64)[None] * milli_req
    cpu: IntArray = np.repeat((snapshot.cpu_free[nodes] - cpu_req)[:, None], g, axis=1)
    return cpu, milli
