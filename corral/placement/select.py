"""Choosing the node and the GPUs.

Node: among feasible nodes, the preferred class first (only `preferential` sets one), then the highest score, then
the smallest tie-break rank (a fixed per-node priority, by default the node's position).

GPUs: the common methods of the FGD study's reserve step, plus topology:
    best_fit   a share goes to the fitting GPU with the least free milli (lowest index on ties)
    worst_fit  a share goes to the fitting GPU with the most free milli (spread)
    whole GPUs the lowest-index free ones, or, where the node's topology is known and k > 1, the set whose
               pairs are best connected (NVLink 3, same PCIe switch 2, same NUMA node 1)
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from corral.model.arrays import BoolArray, FloatArray, IntArray
from corral.model.snapshot import ClusterSnapshot
from corral.placement.context import Context

NVLINK, SAME_SWITCH, SAME_NUMA = 3, 2, 1


def best_node(candidates: IntArray, scores: FloatArray, rank: IntArray, preferred: BoolArray | None) -> int:
    """Index into `candidates` of the winner: preferred class, then max score, then min rank."""
    pref = None if preferred is None else preferred[candidates]
    if pref is not None and pref.any():
        idx = np.flatnonzero(pref & (scores == scores[pref].max()))
    else:
        idx = np.flatnonzero(scores == scores.max())
    if len(idx) == 1:  # the usual case: no tie to break
        return int(idx[0])
    return int(idx[np.argmin(rank[candidates[idx]])])


def top_order(
    candidates: IntArray, scores: FloatArray, rank: IntArray, preferred: BoolArray | None, limit: int
) -> IntArray:
    """Indices into `candidates` of the best `limit` nodes in selection order."""
    key = scores
    if preferred is not None:
        # Lift the preferred class above every other score so one partition finds the top of both keys.
        finite = scores[np.isfinite(scores)]
        lift = (float(finite.max() - finite.min()) + 1.0) if len(finite) else 1.0
        key = scores + np.where(preferred[candidates], lift, 0.0)
    if len(candidates) > 4 * limit:
        # Only nodes scoring at least the limit-th best key can be in the top list.
        threshold = np.partition(key, len(key) - limit)[len(key) - limit]
        subset = np.flatnonzero(key >= threshold)
    else:
        subset = np.arange(len(candidates))
    keys: list[npt.NDArray[np.generic]] = [rank[candidates[subset]], -scores[subset]]
    if preferred is not None:
        keys.append(~preferred[candidates[subset]])
    order = np.lexsort(keys)
    return subset[order[:limit]]


_FEW_ROWS = 4


def first_k_ascending(free: IntArray, fit: BoolArray, k: int) -> BoolArray:
    """Per node (row), the first k fitting GPUs in ascending free milli, lowest index on ties (nodes x GPUs mask).

    The FGD study's way of picking a request's GPUs when scoring (gpu-packing, fgd): tightest first.
    """
    if len(free) <= _FEW_ROWS:
        # A decision asks this of a node or two: sorting eight numbers in Python beats six numpy calls.
        chosen_rows = np.zeros(fit.shape, dtype=np.bool_)
        for i, (u_row, fit_row) in enumerate(zip(free.tolist(), fit.tolist(), strict=True)):
            fitting = sorted((u, j) for j, (u, ok) in enumerate(zip(u_row, fit_row, strict=True)) if ok)
            for _, j in fitting[:k]:
                chosen_rows[i, j] = True
        return chosen_rows
    order = np.argsort(np.where(fit, free, np.iinfo(np.int64).max), axis=1, kind="stable")
    fit_sorted = np.take_along_axis(fit, order, axis=1)
    chosen = np.zeros_like(fit)
    np.put_along_axis(chosen, order, fit_sorted & (np.cumsum(fit_sorted, axis=1) <= k), axis=1)
    return chosen


def pair_affinity(snapshot: ClusterSnapshot, node: int) -> IntArray:
    """GPU x GPU affinity on one node from its known topology (0 where unknown or unrelated)."""
    g = snapshot.max_gpus
    numa, switch = snapshot.gpu_numa[node], snapshot.gpu_switch[node]
    aff = np.zeros((g, g), dtype=np.int64)
    aff = np.maximum(aff, np.where((numa[:, None] == numa[None, :]) & (numa[:, None] >= 0), SAME_NUMA, 0))
    aff = np.maximum(aff, np.where((switch[:, None] == switch[None, :]) & (switch[:, None] >= 0), SAME_SWITCH, 0))
    aff = np.maximum(aff, np.where(snapshot.nvlink[node], NVLINK, 0))
    np.fill_diagonal(aff, 0)
    return aff


def best_connected(snapshot: ClusterSnapshot, node: int, candidates: list[int], k: int) -> tuple[list[int], int]:
    """A k-set of `candidates` with high total pair affinity (greedy from each start), and that affinity."""
    aff = pair_affinity(snapshot, node)
    best: list[int] = candidates[:k]
    best_score = int(aff[np.ix_(best, best)].sum() // 2)
    for start in candidates:
        chosen = [start]
        while len(chosen) < k:
            rest = [c for c in candidates if c not in chosen]
            gains = [int(aff[c, chosen].sum()) for c in rest]
            chosen.append(rest[int(np.argmax(gains))])
        score = int(aff[np.ix_(chosen, chosen)].sum() // 2)
        if score > best_score:
            best, best_score = sorted(chosen), score
    return best, best_score


def whole_gpus(ctx: Context, node: int) -> list[int]:
    """k whole GPUs: the best connected set where topology is known, else the lowest-index free ones."""
    k = ctx.request.gpu_count
    free = [int(j) for j in np.flatnonzero(ctx.fit.gpu_fit[node])]
    if k > 1 and ctx.snapshot.has_topology[node] and len(free) > k:
        return best_connected(ctx.snapshot, node, free, k)[0]
    return free[:k]


def ordered_gpus(ctx: Context, node: int, key: npt.NDArray[np.int64]) -> list[int]:
    """The request's k GPUs on `node`: whole ones by `whole_gpus`, shares by ascending `key` (stable)."""
    if ctx.request.whole_gpus:
        return whole_gpus(ctx, node)
    fit = np.flatnonzero(ctx.fit.gpu_fit[node])
    order = fit[np.argsort(key[fit], kind="stable")]
    return [int(j) for j in order[: ctx.request.gpu_count]]


def _fullness_key(snapshot: ClusterSnapshot, node: int) -> IntArray:
    # Free milli first, free memory second (memory-only shares are packed by memory).
    key: IntArray = snapshot.gpu_milli_free[node] * (1 << 32) + snapshot.gpu_mem_free[node]
    return key


def best_fit_gpus(ctx: Context, node: int) -> list[int]:
    return ordered_gpus(ctx, node, _fullness_key(ctx.snapshot, node))


def worst_fit_gpus(ctx: Context, node: int) -> list[int]:
    return ordered_gpus(ctx, node, -_fullness_key(ctx.snapshot, node))
