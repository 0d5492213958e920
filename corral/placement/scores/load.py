"""load: prefer the least busy GPUs by measured utilisation (the KETI scheduler's live-metrics idea).

Score = 100 x (1 - mean measured utilisation of the k least busy fitting GPUs); unknown utilisation counts as
idle. Requests without GPUs score 100 x (1 - CPU used fraction after placement). The chosen GPUs are the k least
busy fitting ones (best fit among equals).

`load_term` is the same signal as a penalty any policy can add (`PlacementConfig.load_weight`).
"""

from __future__ import annotations

import numpy as np

from corral.model.arrays import BoolArray, FloatArray, IntArray
from corral.model.snapshot import ClusterSnapshot
from corral.placement.context import Context
from corral.placement.select import ordered_gpus


def measured_util(snapshot: ClusterSnapshot, nodes: IntArray) -> FloatArray:
    return np.nan_to_num(snapshot.gpu_util[nodes], nan=0.0)


def least_busy_mean(snapshot: ClusterSnapshot, fit: BoolArray, nodes: IntArray, k: int) -> FloatArray:
    """Mean utilisation of the k least busy fitting GPUs of each node."""
    util = np.where(fit[nodes], measured_util(snapshot, nodes), np.inf)
    lowest = np.sort(util, axis=1)[:, :k]
    mean: FloatArray = np.where(np.isfinite(lowest), lowest, 0.0).mean(axis=1)
    return mean


def load_term(ctx: Context, nodes: IntArray) -> FloatArray:
    """0..100: how busy the GPUs this request would get are (0 for requests without GPUs)."""
    if not ctx.request.wants_gpu:
        return np.zeros(len(nodes), dtype=np.float64)
    return 100.0 * least_busy_mean(ctx.snapshot, ctx.fit.gpu_fit, nodes, ctx.request.gpu_count)


class Load:
    name = "load"

    def score(self, ctx: Context, nodes: IntArray) -> FloatArray:
        s, r = ctx.snapshot, ctx.request
        if not r.wants_gpu:
            cap = np.maximum(s.cpu_cap[nodes], 1).astype(np.float64)
            return 100.0 * (s.cpu_free[nodes] - r.cpu_milli) / cap
        return 100.0 - load_term(ctx, nodes)

    def choose_gpus(self, ctx: Context, node: int) -> list[int]:
        s = ctx.snapshot
        # Utilisation in per-mille first, then fullness (best fit) among equally busy GPUs.
        util = np.rint(measured_util(s, np.array([node]))[0] * 1000).astype(np.int64)
        key = util * (1 << 40) + s.gpu_milli_free[node] * (1 << 20) + np.maximum(s.gpu_mem_free[node], 0)
        if ctx.request.whole_gpus:
            fit = np.flatnonzero(ctx.fit.gpu_fit[node])
            order = fit[np.argsort(key[fit], kind="stable")]
            return sorted(int(j) for j in order[: ctx.request.gpu_count])
        return ordered_gpus(ctx, node, key)
