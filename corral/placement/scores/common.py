"""Shared pieces of scores: resource fractions and the per-request-shape score cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from corral.model.arrays import FloatArray, IntArray
from corral.model.resources import MILLI_PER_GPU, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement.context import Context

#: The FGD study's fixed normalisers (a 128-core node, an 8-GPU node), kept so its scores stay exact.
STUDY_CPU_NORM = 128000.0
STUDY_GPU_NORM = 8000.0


def shape_key(request: Request) -> tuple[Any, ...]:
    """Everything about a request that a cached node-local score may depend on.

    Host memory is left out on purpose: no cached score reads it (it only decides feasibility), and keeping it out
    lets requests that differ only in memory share one cache.
    """
    return (
        request.cpu_milli,
        request.gpu_count,
        request.gpu_milli,
        request.gpu_memory_mib,
        request.gpu_models,
        request.min_gpu_memory_mib,
        request.share_owner,
    )


def used_fraction_after(snapshot: ClusterSnapshot, request: Request, nodes: IntArray) -> FloatArray:
    """Weighted used fraction of the node after placing the request (GPU counts 3x for GPU requests)."""

    def frac(cap: IntArray, free: IntArray, want: int) -> FloatArray:
        capf = cap.astype(np.float64)
        return np.where(cap > 0, (capf - (free - want)) / np.maximum(capf, 1.0), 1.0)

    cpu = frac(snapshot.cpu_cap[nodes], snapshot.cpu_free[nodes], request.cpu_milli)
    mem = frac(snapshot.mem_cap[nodes], snapshot.mem_free[nodes], request.memory_mib)
    if not request.wants_gpu:
        return (cpu + mem) / 2
    gpu_cap = snapshot.gpu_count[nodes] * MILLI_PER_GPU
    gpu = frac(gpu_cap, snapshot.gpu_free_total[nodes], request.gpu_demand_milli)
    return (3 * gpu + cpu + mem) / 5


def cached_node_scores(
    ctx: Context,
    policy: str,
    nodes: IntArray,
    compute: Callable[[IntArray], tuple[FloatArray, IntArray]],
    extra_key: object = None,
    generation: object = None,
) -> tuple[FloatArray, IntArray]:
    """Node-local scores (and a per-node int, e.g. the best GPU) for `nodes`, recomputing only changed nodes.

    Valid because these scores depend only on the node's own state and the request's shape: the cache keeps, per
    (policy, shape), the arrays and the `version` of every node when it was computed. `generation` is what else the
    scores depend on that changes now and then (fgd-scarcity's weights): when it differs from the one the entry was
    computed with, every node is recomputed, in the same entry (one memo entry per shape, however often it moves).
    """
    snap = ctx.snapshot
    key = ("scores", policy, shape_key(ctx.request), extra_key)
    entry: list[Any] | None = snap.memo.get(key)
    if entry is None:
        n = len(snap)
        entry = [np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.float64), np.zeros(n, dtype=np.int64), generation]
        snap.memo[key] = entry
    versions, scores, aux, seen = entry
    if seen != generation:
        versions.fill(-1)
        entry[3] = generation
    stale = nodes[versions[nodes] != snap.version[nodes]]
    if len(stale):
        s, a = compute(stale)
        scores[stale] = s
        aux[stale] = a
        versions[stale] = snap.version[stale]
    return scores[nodes], aux[nodes]
