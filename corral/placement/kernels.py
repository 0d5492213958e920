"""Compiled per-node arithmetic of the fragmentation-scored policies: F (`workload`) and the fill (`fill`).

fgd, fgd-scarcity and fgd-priced score one or two changed nodes per decision. In numpy each such step is a chain of
a few dozen calls on arrays of 35 types x 8 GPUs, and numpy's per-call overhead, not the maths, was most of a replay
(issue 16: fgd-priced cost 2.2-3.0x an fgd replay). These loops do the same integer counts per node and type, and
the same float operations in the same order, compiled once by numba (cached on disk, `cache=True`):

* F adds p_m x milli to its category bucket in type order, starting from 0.0, then q1 + q2 + q4 + xl + xr + no_access
  left to right (fgd-experiment.md section 7, C2), exactly as the vectorised bincount did, so every float is
  bit-identical to the numpy path it replaced and to `reference.fragmentation` (property tests check both).
* Nothing transcendental is computed here: exp (FGD's sigmoid, the fill gain's) stays in numpy, whose SIMD exp may
  round differently from the C library's.

Every kernel takes the snapshot's whole per-node arrays and the indices of the nodes to compute, so the caller
gathers nothing, and the workload as one int64 table (columns below, built by `workload.compile_workload`), its
probabilities and `access`, which GPUs each type may use, node-major (nodes x types x GPUs: a node's types are one
block of memory, where types x nodes x GPUs put each type of a node in its own cache line).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from numba import njit

from corral.model.arrays import BoolArray, FloatArray, IntArray

#: Columns of the per-type table.
CPU, MILLI, COUNT, CPU_ONLY, SHARE, MILLI_DIV, COUNT_DIV, CPU_DIV = range(8)
COLUMNS = 8
#: CPU slots of a type that asks for no CPU: unlimited (as `fill` counts them).
UNLIMITED = int(np.iinfo(np.int64).max)
_FULL = 1000  # MILLI_PER_GPU (a literal: compiled code reads module globals as constants)


def _sig(text: str) -> str:
    """A kernel's signature from shorthand: the public kernels are compiled (or loaded from numba's cache) when this
    module is imported, not inside the first decision that needs them, and for C-ordered int64, bool and float64
    arrays only (`workload._ints` makes hypothetical states so)."""
    for short, full in _TYPES.items():
        text = text.replace(short, full)
    return text


def _drops(text: str) -> list[str]:
    """`_sig` for a kernel taking a parts cache's drops (D3): int16 (nodes of up to 32 GPUs) or int32."""
    return [_sig(text.replace("D3", "H3")), _sig(text.replace("D3", "J3"))]


_TYPES = {
    "I1": "int64[::1]",
    "I2": "int64[:, ::1]",
    "I3": "int64[:, :, ::1]",
    "J2": "int32[:, ::1]",
    "J3": "int32[:, :, ::1]",
    "H3": "int16[:, :, ::1]",
    "B2": "boolean[:, ::1]",
    "B3": "boolean[:, :, ::1]",
    "F1": "float64[::1]",
    "F2": "float64[:, ::1]",
    "i8": "int64",
    "f8": "float64",
}


@njit(cache=True)
def _f(
    table: IntArray,
    prob: FloatArray,
    any_access: BoolArray,
    count: IntArray,
    fit_sum: IntArray,
    total: int,
    cpu: int,
) -> float:
    """F of one node from, per type, whether any GPU is of an allowed model, how many allowed GPUs fit one of its
    pods' GPUs and their free milli; `total` is the node's free milli, `cpu` its free CPU."""
    q1 = q2 = q4 = xl = xr = na = 0.0
    for m in range(table.shape[0]):
        p = prob[m]
        if table[m, CPU_ONLY]:
            if cpu >= table[m, CPU]:
                xl += p * total
            else:
                xr += p * total
        elif not any_access[m]:
            na += p * total
        elif cpu >= table[m, CPU]:
            if count[m] >= table[m, COUNT]:
                q2 += p * (total - fit_sum[m])
            else:
                q2 += p * total
        elif count[m] >= table[m, COUNT]:
            q4 += p * total
        else:
            q1 += p * total
    return q1 + q2 + q4 + xl + xr + na


@njit(cache=True)
def _usable(
    node: int,
    milli: IntArray,
    present: BoolArray,
    access: BoolArray,
    table: IntArray,
    any_access: BoolArray,
    count: IntArray,
    fit_sum: IntArray,
) -> int:
    """Per type, into the arrays given: whether any GPU of `node` is of an allowed model, how many allowed GPUs fit
    one of its pods' GPUs and their free milli, for per-GPU free milli `milli`; returns the node's free milli."""
    g = len(milli)
    total = 0
    for j in range(g):
        if present[node, j] and milli[j] > 0:
            total += milli[j]
    for m in range(table.shape[0]):
        seen, c, s, need = False, 0, 0, table[m, MILLI]
        for j in range(g):
            if access[node, m, j]:
                seen = True
                u = milli[j]
                if u >= need:
                    c += 1
                    if present[node, j] and u > 0:
                        s += u
        any_access[m], count[m], fit_sum[m] = seen, c, s
    return total


@njit(_sig("F1(I1, I1, I2, B2, B3, I2, F1)"), cache=True)
def fragmentation(
    nodes: IntArray,
    cpu: IntArray,
    milli: IntArray,
    present: BoolArray,
    access: BoolArray,
    table: IntArray,
    prob: FloatArray,
) -> FloatArray:
    """F of `nodes` in the given states: free CPU `cpu[i]` and per-GPU free milli `milli[i]` for node `nodes[i]`."""
    n, t = len(nodes), table.shape[0]
    out = np.empty(n, dtype=np.float64)
    any_access = np.zeros(t, dtype=np.bool_)
    count = np.zeros(t, dtype=np.int64)
    fit_sum = np.zeros(t, dtype=np.int64)
    for i in range(n):
        total = _usable(nodes[i], milli[i], present, access, table, any_access, count, fit_sum)
        out[i] = _f(table, prob, any_access, count, fit_sum, total, cpu[i])
    return out


@njit(cache=True)
def _twin(node: int, j: int, u: IntArray, present: BoolArray, access: BoolArray) -> int:
    """An earlier GPU column of `node` that a share would leave in the same state as column j (the same free milli,
    presence and allowed types: then every count the share changes changes alike), or -1. Nodes of one model hold
    many GPUs in few states (8 idle GPUs: one state): their columns are computed once."""
    for jj in range(j):
        if u[jj] == u[j] and present[node, jj] == present[node, j]:
            same = True
            for m in range(access.shape[1]):
                if access[node, m, jj] != access[node, m, j]:
                    same = False
                    break
            if same:
                return jj
    return -1


@njit(_sig("F2(I1, I1, I2, B2, B3, I2, F1, i8, i8)"), cache=True)
def share_fragmentation(
    nodes: IntArray,
    cpu_free: IntArray,
    milli_free: IntArray,
    present: BoolArray,
    access: BoolArray,
    table: IntArray,
    prob: FloatArray,
    cpu_req: int,
    milli_req: int,
) -> FloatArray:
    """F per (node, GPU column) once a one-GPU share of `milli_req` milli and `cpu_req` CPU took that GPU, from the
    nodes' current state (every column, absent and unfitting GPUs included, with the same arithmetic)."""
    n, t, g = len(nodes), table.shape[0], milli_free.shape[1]
    out = np.empty((n, g), dtype=np.float64)
    any_access = np.zeros(t, dtype=np.bool_)
    count = np.zeros(t, dtype=np.int64)
    fit_sum = np.zeros(t, dtype=np.int64)
    count2 = np.zeros(t, dtype=np.int64)
    fit_sum2 = np.zeros(t, dtype=np.int64)
    for i in range(n):
        node = nodes[i]
        total = _usable(node, milli_free[node], present, access, table, any_access, count, fit_sum)
        total2, cpu2 = total - milli_req, cpu_free[node] - cpu_req
        for j in range(g):
            twin = _twin(node, j, milli_free[node], present, access)
            if twin >= 0:
                out[i, j] = out[i, twin]
                continue
            u = milli_free[node, j]
            after = u - milli_req
            for m in range(t):
                c, s, need = count[m], fit_sum[m], table[m, MILLI]
                if access[node, m, j]:
                    if u >= need:
                        c -= 1
                        s -= u
                    if after >= need:
                        c += 1
                        s += after
                count2[m], fit_sum2[m] = c, s
            out[i, j] = _f(table, prob, any_access, count2, fit_sum2, total2, cpu2)
    return out


@njit(cache=True)
def _slots_unfilled(table: IntArray, m: int, cpu: int, gpu_slots: int, idle: int) -> tuple[int, int]:
    """Type m's slots (its CPU slots, and its GPU slots if it asks for GPUs) and the idle milli they leave unfilled,
    from free CPU (at least 0), the type's GPU slots and the node's idle milli."""
    cpu_slots = cpu // table[m, CPU_DIV] if table[m, CPU] > 0 else UNLIMITED
    if table[m, CPU_ONLY]:
        return cpu_slots, idle
    slots = min(gpu_slots, cpu_slots)
    return slots, idle - min(slots * (table[m, COUNT] * table[m, MILLI]), idle)


@njit(cache=True)
def _gpu_slots(node: int, m: int, free: IntArray, access: BoolArray, table: IntArray) -> int:
    """Type m's GPU slots on `node` with per-GPU free milli `free` (0 where absent): its shares that fit, summed over
    its allowed GPUs, or its pods that fit in whole free allowed GPUs."""
    k = 0
    if table[m, SHARE]:
        for j in range(len(free)):
            if access[node, m, j]:
                k += free[j] // table[m, MILLI_DIV]
        return k
    for j in range(len(free)):
        if access[node, m, j] and free[j] >= _FULL:
            k += 1
    out: int = k // table[m, COUNT_DIV]
    return out


@njit(cache=True)
def _fill_node(
    node: int,
    cpu: int,
    milli: IntArray,
    present: BoolArray,
    access: BoolArray,
    table: IntArray,
    slots: IntArray,
    unfilled: IntArray,
    gpu_slots: IntArray,
) -> int:
    """`fill.type_fill` of one node state (free CPU `cpu`, per-GPU free milli `milli`): per type its slots, unfilled
    milli and GPU slots into the arrays given; returns the node's idle milli."""
    g = len(milli)
    free = np.zeros(g, dtype=np.int64)
    total = 0
    for j in range(g):
        free[j] = max(milli[j], 0) if present[node, j] else 0
        total += free[j]
    c = max(cpu, 0)
    for m in range(table.shape[0]):
        k = _gpu_slots(node, m, free, access, table)
        gpu_slots[m] = k
        slots[m], unfilled[m] = _slots_unfilled(table, m, c, k, total)
    return total


@njit(cache=True)
def _unfilled_into(
    node: int, cpu: int, milli: IntArray, present: BoolArray, access: BoolArray, table: IntArray, out: IntArray
) -> None:
    """`fill`'s unfilled milli per type of one node state, into `out`."""
    t = table.shape[0]
    _fill_node(node, cpu, milli, present, access, table, np.empty(t, np.int64), out, np.empty(t, np.int64))


@njit(_sig("Tuple((I2, I2, I2, I1))(I1, I1, I2, B2, B3, I2)"), cache=True)
def fill(
    nodes: IntArray,
    cpu: IntArray,
    milli: IntArray,
    present: BoolArray,
    access: BoolArray,
    table: IntArray,
) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    """`fill.type_fill` of `nodes` in the given states (free CPU `cpu[i]`, per-GPU free milli `milli[i]`): per type
    and node its slots, unfilled milli and GPU slots (types x nodes), and per node its idle milli."""
    n, t = len(nodes), table.shape[0]
    slots = np.empty((t, n), dtype=np.int64)
    unfilled = np.empty((t, n), dtype=np.int64)
    gpu_slots = np.empty((t, n), dtype=np.int64)
    idle = np.empty(n, dtype=np.int64)
    for i in range(n):
        idle[i] = _fill_node(
            nodes[i], cpu[i], milli[i], present, access, table, slots[:, i], unfilled[:, i], gpu_slots[:, i]
        )
    return slots, unfilled, gpu_slots, idle


@njit(_sig("I3(I1, I1, I2, B3, I2, i8, i8)"), cache=True)
def share_unfilled(
    nodes: IntArray,
    cpu_free: IntArray,
    milli_free: IntArray,
    access: BoolArray,
    table: IntArray,
    cpu_req: int,
    milli_req: int,
) -> IntArray:
    """`fill.share_unfilled`: unfilled milli per (type, node, GPU) once a one-GPU share of `milli_req` milli and
    `cpu_req` CPU took that GPU, each type's GPU slots updated for the one GPU that changed."""
    n, t, g = len(nodes), table.shape[0], milli_free.shape[1]
    out = np.empty((t, n, g), dtype=np.int64)
    free = np.zeros(g, dtype=np.int64)
    take = max(milli_req, 0)
    for i in range(n):
        node = nodes[i]
        idle = 0
        for j in range(g):
            free[j] = max(milli_free[node, j], 0)  # an absent GPU holds -1: 0 here, without a mask
            idle += free[j]
        c = max(cpu_free[node] - cpu_req, 0)
        for m in range(t):
            div, share = table[m, MILLI_DIV], table[m, SHARE]
            share_before, whole_before = 0, 0
            for j in range(g):
                if access[node, m, j]:
                    share_before += free[j] // div
                    if free[j] >= _FULL:
                        whole_before += 1
            for j in range(g):
                after = max(milli_free[node, j] - take, 0)
                if share:
                    k = share_before
                    if access[node, m, j]:
                        k += after // div - free[j] // div
                else:
                    k = whole_before
                    if access[node, m, j]:
                        if free[j] >= _FULL:
                            k -= 1
                        if milli_req <= 0 and after >= _FULL:
                            k += 1
                    k //= table[m, COUNT_DIV]
                out[m, i, j] = _slots_unfilled(table, m, c, k, idle - free[j] + after)[1]
    return out


@njit(cache=True)
def _now(
    node: int,
    cpu_free: IntArray,
    milli_free: IntArray,
    present: BoolArray,
    access: BoolArray,
    table: IntArray,
    prob: FloatArray,
    any_access: BoolArray,
    scratch: IntArray,
    unfilled: IntArray,
) -> float:
    """F of `node` as it is, and its unfilled milli per type into `unfilled` (`scratch`: 2 x types working space)."""
    total = _usable(node, milli_free[node], present, access, table, any_access, scratch[0], scratch[1])
    _unfilled_into(node, cpu_free[node], milli_free[node], present, access, table, unfilled)
    out: float = _f(table, prob, any_access, scratch[0], scratch[1], total, cpu_free[node])
    return out


@njit(cache=True)
def _pod_after(
    node: int,
    cpu_free: IntArray,
    milli_free: IntArray,
    fit: BoolArray,
    present: BoolArray,
    access: BoolArray,
    table: IntArray,
    prob: FloatArray,
    cpu_req: int,
    milli_req: int,
    count_req: int,
    f_before: float,
    before: IntArray,
    any_access: BoolArray,
    scratch: IntArray,
    drop: npt.NDArray[np.int32],
) -> float:
    """`pod_parts` of one node from F and the unfilled milli of its state now: F(n) - F(n'), and per type the unfilled
    milli removed into `drop` (`scratch`: 4 x max(types, GPUs) working space)."""
    t, g = table.shape[0], milli_free.shape[1]
    count, fit_sum, after, milli_after = scratch[0], scratch[1], scratch[2], scratch[3]
    for j in range(g):
        milli_after[j] = milli_free[node, j]
    taken = 0  # a bit per GPU taken (at most 64 GPUs a node)
    for _ in range(count_req):
        best = -1
        for j in range(g):
            if fit[node, j] and not (taken >> j) & 1 and (best < 0 or milli_free[node, j] < milli_free[node, best]):
                best = j
        if best < 0:
            break
        taken |= 1 << best
        milli_after[best] -= milli_req
    cpu_after = cpu_free[node] - cpu_req
    total = _usable(node, milli_after[:g], present, access, table, any_access, count, fit_sum)
    delta = f_before - _f(table, prob, any_access, count, fit_sum, total, cpu_after)
    _unfilled_into(node, cpu_after, milli_after[:g], present, access, table, after)
    for m in range(t):
        drop[m] = before[m] - after[m]
    return delta


@njit(_sig("Tuple((F1, J2))(I1, I1, I2, B2, B2, B3, I2, F1, i8, i8, i8)"), cache=True)
def pod_parts(
    nodes: IntArray,
    cpu_free: IntArray,
    milli_free: IntArray,
    fit: BoolArray,
    present: BoolArray,
    access: BoolArray,
    table: IntArray,
    prob: FloatArray,
    cpu_req: int,
    milli_req: int,
    count_req: int,
) -> tuple[FloatArray, npt.NDArray[np.int32]]:
    """For each node, from its current state to the state after a pod that is not a one-GPU share (`cpu_req` CPU,
    and `count_req` GPUs of `milli_req` each, taken from the fitting GPUs in ascending free milli, lowest index on
    ties: `fgd.node_after`): F(n) - F(n') and, per type, the unfilled milli the pod removes (types x nodes)."""
    n, t, g = len(nodes), table.shape[0], milli_free.shape[1]
    delta = np.empty(n, dtype=np.float64)
    drop = np.empty((t, n), dtype=np.int32)
    any_access = np.zeros(t, dtype=np.bool_)
    scratch = np.zeros((4, max(t, g)), dtype=np.int64)
    before = np.zeros(t, dtype=np.int64)
    for i in range(n):
        f_before = _now(nodes[i], cpu_free, milli_free, present, access, table, prob, any_access, scratch, before)
        delta[i] = _pod_after(
            nodes[i], cpu_free, milli_free, fit, present, access, table, prob, cpu_req, milli_req, count_req,
            f_before, before, any_access, scratch, drop[:, i],
        )  # fmt: skip
    return delta, drop


@njit(cache=True)
def _share_node(
    node: int,
    cpu_free: IntArray,
    milli_free: IntArray,
    present: BoolArray,
    access: BoolArray,
    table: IntArray,
    prob: FloatArray,
    cpu_req: int,
    milli_req: int,
    delta: FloatArray,
    drop: npt.NDArray[np.int32],
    scratch: IntArray,
    any_access: BoolArray,
) -> None:
    """`share_parts` of one node, into `delta` (GPUs) and `drop` (types x GPUs): each type's counts of the node as it
    is are taken once and then updated for the one GPU the share takes, for F as in `share_fragmentation` and for the
    fill as in `share_unfilled` (the same integers and floats as those, which the tests check). `scratch` (8 x
    types, at least GPUs wide) and `any_access` (types) are working space."""
    t, g = table.shape[0], milli_free.shape[1]
    u = milli_free[node]
    count, fit_sum, count2, fit_sum2 = scratch[0], scratch[1], scratch[2], scratch[3]
    share_before, whole_before, unfilled_before, free = scratch[4], scratch[5], scratch[6], scratch[7]
    total, idle = 0, 0
    for j in range(g):
        free[j] = max(u[j], 0)  # the fill's free milli (an absent GPU holds -1: 0 here)
        idle += free[j]
        if present[node, j] and u[j] > 0:
            total += u[j]
    c_now = max(cpu_free[node], 0)
    for m in range(t):
        seen, c, sm, need, div = False, 0, 0, table[m, MILLI], table[m, MILLI_DIV]
        sb, wb = 0, 0
        for j in range(g):
            if access[node, m, j]:
                seen = True
                if u[j] >= need:
                    c += 1
                    if present[node, j] and u[j] > 0:
                        sm += u[j]
                sb += free[j] // div
                if free[j] >= _FULL:
                    wb += 1
        any_access[m], count[m], fit_sum[m] = seen, c, sm
        share_before[m], whole_before[m] = sb, wb
        k = sb if table[m, SHARE] else wb // table[m, COUNT_DIV]
        unfilled_before[m] = _slots_unfilled(table, m, c_now, k, idle)[1]
    f_before = _f(table, prob, any_access, count, fit_sum, total, cpu_free[node])
    total2, cpu2, c_after = total - milli_req, cpu_free[node] - cpu_req, max(cpu_free[node] - cpu_req, 0)
    take = max(milli_req, 0)
    for j in range(g):
        twin = _twin(node, j, u, present, access)
        if twin >= 0:
            delta[j] = delta[twin]
            for m in range(t):
                drop[m, j] = drop[m, twin]
            continue
        uj, after_f = u[j], u[j] - milli_req
        after = max(uj - take, 0)
        idle_after = idle - free[j] + after
        for m in range(t):
            c, sm, need = count[m], fit_sum[m], table[m, MILLI]
            k = share_before[m] if table[m, SHARE] else whole_before[m]
            if access[node, m, j]:
                if uj >= need:
                    c -= 1
                    sm -= uj
                if after_f >= need:
                    c += 1
                    sm += after_f
                if table[m, SHARE]:
                    k += after // table[m, MILLI_DIV] - free[j] // table[m, MILLI_DIV]
                else:
                    if free[j] >= _FULL:
                        k -= 1
                    if milli_req <= 0 and after >= _FULL:
                        k += 1
            if not table[m, SHARE]:
                k //= table[m, COUNT_DIV]
            count2[m], fit_sum2[m] = c, sm
            drop[m, j] = unfilled_before[m] - _slots_unfilled(table, m, c_after, k, idle_after)[1]
        delta[j] = f_before - _f(table, prob, any_access, count2, fit_sum2, total2, cpu2)


@njit(_sig("Tuple((F2, J3))(I1, I1, I2, B2, B3, I2, F1, i8, i8)"), cache=True)
def share_parts(
    nodes: IntArray,
    cpu_free: IntArray,
    milli_free: IntArray,
    present: BoolArray,
    access: BoolArray,
    table: IntArray,
    prob: FloatArray,
    cpu_req: int,
    milli_req: int,
) -> tuple[FloatArray, npt.NDArray[np.int32]]:
    """`pod_parts` for a one-GPU share of `milli_req` milli and `cpu_req` CPU placed on each GPU column in turn:
    F(n) - F(n') per (node, GPU) and the unfilled milli removed per (type, node, GPU)."""
    n, t, g = len(nodes), table.shape[0], milli_free.shape[1]
    delta = np.empty((n, g), dtype=np.float64)
    drop = np.empty((t, n, g), dtype=np.int32)  # milli of one node: int32 halves the largest memo entries
    scratch, any_access = np.zeros((8, max(t, g)), dtype=np.int64), np.zeros(t, dtype=np.bool_)
    for i in range(n):
        _share_node(
            nodes[i], cpu_free, milli_free, present, access, table, prob, cpu_req, milli_req, delta[i], drop[:, i, :],
            scratch, any_access,
        )  # fmt: skip
    return delta, drop


@njit(_sig("UniTuple(i8, 2)(I1, I1)"), cache=True)
def free_sums(gpu_free_total: IntArray, cpu_free: IntArray) -> tuple[int, int]:
    """The cluster's free GPU milli and free CPU (each node's counted from 0 up), exact in integers."""
    gpu, cpu = 0, 0
    for i in range(len(cpu_free)):
        gpu += gpu_free_total[i]
        if cpu_free[i] > 0:
            cpu += cpu_free[i]
    return gpu, cpu


@njit(_sig("none(I1, I1, I2, B2, B3, I2, I1, I2, I1, i8)"), cache=True)
def refresh_slots(
    version: IntArray,
    cpu_free: IntArray,
    milli_free: IntArray,
    present: BoolArray,
    access: BoolArray,
    table: IntArray,
    seen: IntArray,
    per_node: IntArray,
    totals: IntArray,
    cap: int,
) -> None:
    """`scarcity.cluster_slots`' entry brought up to date in place: for every node whose `version` moved since
    `seen`, its slots per type (as `fill`, capped at `cap`) replace its old ones in `per_node` and in `totals`."""
    t = table.shape[0]
    slots, unfilled, gpu_slots = np.empty(t, np.int64), np.empty(t, np.int64), np.empty(t, np.int64)
    for node in range(len(version)):
        if seen[node] == version[node]:
            continue
        _fill_node(node, cpu_free[node], milli_free[node], present, access, table, slots, unfilled, gpu_slots)
        for m in range(t):
            capped = min(slots[m], cap)
            totals[m] += capped - per_node[m, node]
            per_node[m, node] = capped
        seen[node] = version[node]


@njit(_sig("F1(F1, I1, f8, i8)"), cache=True)
def weights(prob: FloatArray, totals: IntArray, horizon: float, steps: int) -> FloatArray:
    """`scarcity.scarcity_weights` from the cluster's slots per type and H: min(1, p_m H / slots_m) rounded to
    1/steps (1 where a type with demand has no slot, 0 where it has neither)."""
    out = np.empty(len(prob), dtype=np.float64)
    for m in range(len(prob)):
        demand = prob[m] * horizon
        slots = float(totals[m])
        ratio = demand / max(slots, 1.0) if slots > 0 else 1.0 if demand > 0 else 0.0
        out[m] = np.rint(min(ratio, 1.0) * steps) / steps
    return out


@njit(_sig("none(I1, I1, I2, B3, I1, I1, I1, I1, I1, I1, I2, I1)"), cache=True)
def refresh_gang(
    version: IntArray,
    cpu_free: IntArray,
    milli_free: IntArray,
    masks: BoolArray,
    millis: IntArray,
    cpu: IntArray,
    count: IntArray,
    group: IntArray,
    seen: IntArray,
    cpu_seen: IntArray,
    room: IntArray,
    hosts: IntArray,
) -> None:
    """`reserve`'s gang table brought up to date in place: for every node whose `version` moved since `seen`, per GPU
    group (`masks`: its allowed GPUs, `millis`: milli per GPU) the GPUs with room for one GPU of it, and per type
    (`cpu`, `count`, `group`) the number of nodes where one pod fits, moved by that node's change."""
    groups, g = masks.shape[0], milli_free.shape[1]
    fresh = np.zeros(groups, dtype=np.int64)
    for node in range(len(version)):
        if seen[node] == version[node]:
            continue
        for k in range(groups):
            r = 0
            for j in range(g):
                if masks[k, node, j] and milli_free[node, j] >= millis[k]:
                    r += 1
            fresh[k] = r
        c, old_c = cpu_free[node], cpu_seen[node]
        for i in range(len(cpu)):
            now = c >= cpu[i] and fresh[group[i]] >= count[i]
            was = old_c >= cpu[i] and room[group[i], node] >= count[i]
            hosts[i] += int(now) - int(was)
        for k in range(groups):
            room[k, node] = fresh[k]
        cpu_seen[node] = c
        seen[node] = version[node]


@njit(_sig("I1(I1, I1, I1)"), cache=True)
def stale(nodes: IntArray, seen: IntArray, version: IntArray) -> IntArray:
    """Of `nodes`, those whose `version` moved since `seen` (in their order)."""
    out = np.empty(len(nodes), dtype=np.int64)
    k = 0
    for i in range(len(nodes)):
        if seen[nodes[i]] != version[nodes[i]]:
            out[k] = nodes[i]
            k += 1
    return out[:k]


@njit(cache=True)
def _exponents(
    nodes: IntArray, delta: FloatArray, drop: npt.NDArray[np.int32], pw: FloatArray, use: bool
) -> FloatArray:
    """Per state (node, or node and GPU), from the cached parts: -delta / 1000, the exponent of FGD's sigmoid, and
    -clip(gain, -5e4, 5e4) / 1000, gain = sum_m pw_m drop_m added in type order, the exponent of the fill gain's
    sigmoid 1 / (1 + exp(...)) (0 without the look-ahead); numpy takes their exp. The same float operations as
    `fgd_score`'s before its exp, and as the numpy gain fraction's before (`(pw[:, None] * drop).sum(axis=0)`)."""
    t = drop.shape[1]
    g = delta.shape[1]
    # A type of weight 0 adds +-0.0: nothing to a sum but its sign when the sum is 0, which exp(-0/1000) = exp(0)
    # does not see. Skipped (the first term stays, as numpy's sum starts from it): most weights are 0 until room
    # for a type runs short, and gpuspec33p has 150 types.
    weighted = np.empty(t, dtype=np.int64)
    k = 0
    for m in range(1, t):
        if pw[m] != 0.0:
            weighted[k] = m
            k += 1
    out = np.zeros((2, len(nodes) * g), dtype=np.float64)
    for i in range(len(nodes)):
        node = nodes[i]
        for j in range(g):
            c = i * g + j
            out[0, c] = -delta[node, j] / 1000.0
            if use:
                gain = pw[0] * drop[node, 0, j]
                for a in range(k):
                    m = weighted[a]
                    gain += pw[m] * drop[node, m, j]
                out[1, c] = -min(max(gain, -50_000.0), 50_000.0) / 1000.0
    return out


@njit(_drops("F2(I1, I1, I1, F2, D3, I1, I2, B2, B3, I2, F1, i8, i8, F1, b1)"), cache=True)
def share_exponents(
    nodes: IntArray,
    seen: IntArray,
    version: IntArray,
    delta: FloatArray,
    drop: npt.NDArray[np.int32],
    cpu_free: IntArray,
    milli_free: IntArray,
    present: BoolArray,
    access: BoolArray,
    table: IntArray,
    prob: FloatArray,
    cpu_req: int,
    milli_req: int,
    pw: FloatArray,
    use: bool,
) -> FloatArray:
    """A one-GPU share's parts per (node, GPU) kept in `delta` and `drop` (nodes x GPUs, nodes x types x GPUs),
    computed (`share_parts`) for the nodes whose `version` moved since `seen`; returns `_exponents` of `nodes`."""
    t, g = table.shape[0], milli_free.shape[1]
    scratch, any_access = np.zeros((8, max(t, g)), dtype=np.int64), np.zeros(t, dtype=np.bool_)
    for node in stale(nodes, seen, version):
        _share_node(
            node, cpu_free, milli_free, present, access, table, prob, cpu_req, milli_req, delta[node], drop[node],
            scratch, any_access,
        )  # fmt: skip
        seen[node] = version[node]
    return _exponents(nodes, delta, drop, pw, use)


@njit(_drops("F2(I1, I1, I1, F2, D3, I1, I2, B2, B2, B3, I2, F1, i8, i8, i8, F1, b1, I1, F1, I2)"), cache=True)
def pod_exponents(
    nodes: IntArray,
    seen: IntArray,
    version: IntArray,
    delta: FloatArray,
    drop: npt.NDArray[np.int32],
    cpu_free: IntArray,
    milli_free: IntArray,
    fit: BoolArray,
    present: BoolArray,
    access: BoolArray,
    table: IntArray,
    prob: FloatArray,
    cpu_req: int,
    milli_req: int,
    count_req: int,
    pw: FloatArray,
    use: bool,
    now_seen: IntArray,
    now_f: FloatArray,
    now_unfilled: IntArray,
) -> FloatArray:
    """`share_exponents` for a pod that is not a one-GPU share (`pod_parts`; `delta` nodes x 1, `drop` nodes x types
    x 1). F and the unfilled milli of each node as it is are kept apart (`now_*`, per node at `now_seen`), for every
    request shape: a changed node's "before" is computed once, not once per shape that scores it."""
    t, g = table.shape[0], milli_free.shape[1]
    any_access = np.zeros(t, dtype=np.bool_)
    scratch = np.zeros((4, max(t, g)), dtype=np.int64)
    for node in stale(nodes, seen, version):
        if now_seen[node] != version[node]:
            now_f[node] = _now(
                node, cpu_free, milli_free, present, access, table, prob, any_access, scratch, now_unfilled[node]
            )
            now_seen[node] = version[node]
        delta[node, 0] = _pod_after(
            node, cpu_free, milli_free, fit, present, access, table, prob, cpu_req, milli_req, count_req,
            now_f[node], now_unfilled[node], any_access, scratch, drop[node, :, 0],
        )  # fmt: skip
        seen[node] = version[node]
    return _exponents(nodes, delta, drop, pw, use)


@njit(cache=True)
def _score(e: FloatArray, c: int, use: bool, guard: bool, level: int, levels: int, tie_weight: float) -> float:
    """fgd-scarcity's score of state c from the exp of its `_exponents` (`e`, 2 x states): FGD's points
    (floor(100 sigmoid)) + tie_weight x the tie-break (the fill gain's sigmoid, below the model level where `guard`;
    0 where the look-ahead is off)."""
    points: float = np.floor(100.0 / (1.0 + e[0, c]))
    frac = 1.0 / (1.0 + e[1, c]) if use else 0.0
    if guard:
        frac = (levels - 1 - level + frac) / levels
    return points + tie_weight * frac


@njit(_sig("F1(I1, F2, b1, b1, I1, i8, f8)"), cache=True)
def pod_scores(
    nodes: IntArray, e: FloatArray, use: bool, guard: bool, level: IntArray, levels: int, tie_weight: float
) -> FloatArray:
    """fgd-scarcity's score of a pod that is not a one-GPU share, per node (`_score`)."""
    out = np.empty(len(nodes), dtype=np.float64)
    for i in range(len(nodes)):
        out[i] = _score(e, i, use, guard, level[nodes[i]], levels, tie_weight)
    return out


@njit(_sig("Tuple((F1, I1))(I1, F2, b1, b1, I1, i8, F1, i8, F2, I2, B2)"), cache=True)
def share_choice(
    nodes: IntArray,
    e: FloatArray,
    use: bool,
    guard: bool,
    level: IntArray,
    levels: int,
    consts: FloatArray,
    mode: int,
    key: FloatArray,
    milli_free: IntArray,
    fit: BoolArray,
) -> tuple[FloatArray, IntArray]:
    """A one-GPU share's score per node and the GPU it takes: per GPU, fgd-scarcity's score (`_score`) ordered by a
    key first (`mode` 1: `priced_order`'s packing of `key`, FGD's points and the tightness; 2: key x stride + score;
    0: no key); the best fitting GPU, the lowest index on ties (the first GPU's score where none fits). `consts` =
    (tie_weight, stride, points' step, tightness' step)."""
    n, g = len(nodes), milli_free.shape[1]
    tie_weight, stride, step_points, step_tight = consts[0], consts[1], consts[2], consts[3]
    score = np.empty(n, dtype=np.float64)
    best = np.empty(n, dtype=np.int64)
    for i in range(n):
        node = nodes[i]
        top, at, first = -1.0, 0, 0.0
        for j in range(g):
            per = _score(e, i * g + j, use, guard, level[node], levels, tie_weight)
            if mode == 1:
                whole = np.floor(per)
                tight = _FULL - min(max(milli_free[node, j], 0), _FULL)
                per = ((key[i, j] * step_points + whole) * step_tight + tight) + (per - whole)
            elif mode == 2:
                per = key[i, j] * stride + per
            value = per if fit[node, j] else -1.0
            if j == 0:
                top, first = value, per
            elif value > top:
                top, at, first = value, j, per
        score[i], best[i] = first, at
    return score, best


@njit(_sig("Tuple((I1, I1))(I1, I1, b1[::1])"), cache=True)
def missing_states(nodes: IntArray, sid: IntArray, valid: BoolArray) -> tuple[IntArray, IntArray]:
    """The state ids of `nodes` (`sid` per node) not `valid`, each once, and for each the first node in that state;
    each id returned is marked valid (the caller computes their scores next, and unmarks them if that fails)."""
    want = np.empty(len(nodes), dtype=np.int64)
    reps = np.empty(len(nodes), dtype=np.int64)
    k = 0
    for i in range(len(nodes)):
        state = sid[nodes[i]]
        if not valid[state]:
            valid[state] = True
            want[k], reps[k] = state, nodes[i]
            k += 1
    return want[:k], reps[:k]


@njit(_sig("Tuple((F1, I1, b1))(I1, I1, F1, I1)"), cache=True)
def by_state(nodes: IntArray, sid: IntArray, score: FloatArray, aux: IntArray) -> tuple[FloatArray, IntArray, bool]:
    """Each node's score and aux from its state's (`score[sid[node]]`, `aux[sid[node]]`), and whether `nodes` rise
    strictly (the engine's feasible nodes do: then the caller may search them)."""
    out_score = np.empty(len(nodes), dtype=np.float64)
    out_aux = np.empty(len(nodes), dtype=np.int64)
    rising = True
    for i in range(len(nodes)):
        state = sid[nodes[i]]
        out_score[i], out_aux[i] = score[state], aux[state]
        if i and nodes[i] <= nodes[i - 1]:
            rising = False
    return out_score, out_aux, rising


@njit(cache=True)
def _row_hash(row: IntArray) -> int:
    """FNV-1a over a state row's int64 values (as uint64)."""
    h = np.uint64(14695981039346656037)
    for v in row:
        h = (h ^ np.uint64(v)) * np.uint64(1099511628211)
    return int(h >> np.uint64(1))


@njit(cache=True)
def _find_or_add(row: IntArray, rows: IntArray, slots: IntArray, count: IntArray) -> int:
    """The id of the state `row` in `rows` (its first `count[0]` ids), added as the next id if new; `slots` is the open
    addressing table (id + 1, 0 empty; a power of two in size, more than twice `count`)."""
    mask = len(slots) - 1
    at = _row_hash(row) & mask
    width = len(row)
    while True:
        sid = slots[at] - 1
        if sid < 0:
            sid = count[0]
            rows[sid, :] = row
            slots[at] = sid + 1
            count[0] = sid + 1
            return int(sid)
        same = True
        for c in range(width):
            if rows[sid, c] != row[c]:
                same = False
                break
        if same:
            return int(sid)
        at = (at + 1) & mask


@njit(_sig("none(I1, I1, I2, I2, B2, I2, I1, I1, I1, I1, I1)"), cache=True)
def assign_states(
    nodes: IntArray,
    cpu_free: IntArray,
    milli_free: IntArray,
    model: IntArray,
    fit: BoolArray,
    rows: IntArray,
    slots: IntArray,
    count: IntArray,
    sid: IntArray,
    seen: IntArray,
    version: IntArray,
) -> None:
    """Each of `nodes` gets the id of its state (`sid[node]`, `seen[node]` = its version): free CPU, per-GPU free
    milli and model, and the request's GPU fit, as one row (`common.node_state_keys`' values); equal rows, one id.
    The caller leaves room in `rows` for every node given, and `slots` more than twice as large."""
    g = milli_free.shape[1]
    row = np.empty(1 + 3 * g, dtype=np.int64)
    for i in range(len(nodes)):
        node = nodes[i]
        row[0] = cpu_free[node]
        for j in range(g):
            row[1 + j] = milli_free[node, j]
            row[1 + g + j] = model[node, j]
            row[1 + 2 * g + j] = 1 if fit[node, j] else 0
        sid[node] = _find_or_add(row, rows, slots, count)
        seen[node] = version[node]


@njit(_sig("none(I2, i8, I1)"), cache=True)
def rehash(rows: IntArray, count: int, slots: IntArray) -> None:
    """`slots` (all empty, a power of two in size) filled with the first `count` ids of `rows`."""
    mask = len(slots) - 1
    for sid in range(count):
        at = _row_hash(rows[sid]) & mask
        while slots[at] != 0:
            at = (at + 1) & mask
        slots[at] = sid + 1


@njit(_sig("b1[::1](I1, I1, I2, I1, I1, I1, I1, I1)"), cache=True)
def broken_hosts(
    nodes: IntArray,
    cpu_free: IntArray,
    room: IntArray,
    group: IntArray,
    cpu: IntArray,
    cpu_high: IntArray,
    count: IntArray,
    count_high: IntArray,
) -> BoolArray:
    """`reserve`'s pass over the nodes: per node, whether it hosts one pod of some type t at its reserve (free CPU >=
    cpu[t], room in t's GPU group >= count[t]) that the request would break (free CPU < cpu_high[t] or room <
    count_high[t])."""
    out = np.zeros(len(nodes), dtype=np.bool_)
    for i in range(len(nodes)):
        node = nodes[i]
        free = cpu_free[node]
        for t in range(len(group)):
            r = room[group[t], node]
            if free >= cpu[t] and r >= count[t] and (free < cpu_high[t] or r < count_high[t]):
                out[i] = True
                break
    return out


@njit(_sig("b1[::1](I1, I1, I2, I1, I1, F1, I1, b1, f8, I1, I1, I1, i8, i8)"), cache=True)
def reserve_pass(
    nodes: IntArray,
    cpu_free: IntArray,
    room: IntArray,
    hosts: IntArray,
    gang: IntArray,
    probability: FloatArray,
    floor: IntArray,
    floors: bool,
    mh: float,
    group: IntArray,
    cpu: IntArray,
    count: IntArray,
    cpu_req: int,
    gpus_req: int,
) -> BoolArray:
    """`reserve.kept_hosts`' rule from its table: the gang types (`gang`, with the probability their reserve is made
    of and their floor) at their reserve, count <= max(ceil(margin x H x p), floor) (`floors`; without floors the
    same test as mh x p - 1e-9 > count - 1, exact in floats), and of `nodes` each host of one of them (free CPU >=
    its CPU, room in its GPU group >= its GPUs) the request would break (less CPU or room left than that)."""
    active = np.empty(len(gang), dtype=np.int64)
    k = 0
    for a in range(len(gang)):
        i = gang[a]
        have = hosts[i]
        if have == 0:
            continue
        if floors:
            at = have <= max(math.ceil(mh * probability[a] - 1e-9), floor[a])
        else:
            at = mh * probability[a] - 1e-9 > have - 1
        if at:
            active[k] = i
            k += 1
    out = np.zeros(len(nodes), dtype=np.bool_)
    if k == 0:
        return out
    for n in range(len(nodes)):
        node = nodes[n]
        free = cpu_free[node]
        for a in range(k):
            t = active[a]
            r = room[group[t], node]
            if free >= cpu[t] and r >= count[t] and (free < cpu[t] + cpu_req or r < count[t] + gpus_req):
                out[n] = True
                break
    return out


@njit(_sig("F1(I1, I1, I2, B2, B3, I2, I1, I2, I1, i8, F1, f8, i8)"), cache=True)
def scarcity(
    version: IntArray,
    cpu_free: IntArray,
    milli_free: IntArray,
    present: BoolArray,
    access: BoolArray,
    table: IntArray,
    seen: IntArray,
    per_node: IntArray,
    totals: IntArray,
    cap: int,
    prob: FloatArray,
    horizon: float,
    steps: int,
) -> FloatArray:
    """`refresh_slots` and then `weights`, in one call (a decision of a pod with GPUs asks both)."""
    refresh_slots(version, cpu_free, milli_free, present, access, table, seen, per_node, totals, cap)
    out: FloatArray = weights(prob, totals, horizon, steps)
    return out
