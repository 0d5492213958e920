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
    by_state: bool = False,
) -> tuple[FloatArray, IntArray]:
    """Node-local scores (and a per-node int, e.g. the best GPU) for `nodes`, recomputing only changed nodes.

    Valid because these scores depend only on the node's own state and the request's shape: the cache keeps, per
    (policy, shape), the arrays and the `version` of every node when it was computed. `generation` is what else the
    scores depend on that changes now and then (fgd-scarcity's weights): when it differs from the one the entry was
    computed with, every node is recomputed, in the same entry (one memo entry per shape, however often it moves).

    With `by_state`, a changed node whose state equals one this entry already scored takes that score without
    computing (`node_state_keys`: everything of a node a fragmentation-scored policy reads). Valid for scores that
    are a function of that state alone: fgd's, fgd-scarcity's and fgd-priced's are, and there nodes of a kind pass
    through the same states again and again (on openb `default`, 70 % of the nodes such a replay recomputes).
    """
    snap = ctx.snapshot
    key = ("scores", policy, shape_key(ctx.request), extra_key)
    entry: list[Any] | None = snap.memo.get(key)
    if entry is None:
        n = len(snap)
        entry = [
            np.full(n, -1, dtype=np.int64),
            np.zeros(n, dtype=np.float64),
            np.zeros(n, dtype=np.int64),
            generation,
            {},  # by_state: node state -> (score, aux)
        ]
        snap.memo[key] = entry
    versions, scores, aux, seen, by_key = entry
    if seen != generation:
        versions.fill(-1)
        by_key.clear()
        entry[3] = generation
    stale = nodes[versions[nodes] != snap.version[nodes]]
    if len(stale):
        if by_state:
            _by_state(ctx, stale, compute, by_key, scores, aux)
        else:
            s, a = compute(stale)
            scores[stale] = s
            aux[stale] = a
        versions[stale] = snap.version[stale]
    return scores[nodes], aux[nodes]


#: Node states one by_state entry remembers before it starts afresh (bounds memory: about 250 bytes each).
_STATES_PER_SHAPE = 1 << 14


def node_state_keys(ctx: Context, nodes: IntArray) -> list[bytes]:
    """Per node, its state as int64 bytes: free CPU, per-GPU free milli, per-GPU model (which gives the GPUs
    present, the workload's access and the model level) and the request's GPU fit (which also says what the GPU
    memory and the share owners allow). Two nodes with equal keys are scored alike by fgd, fgd-scarcity and
    fgd-priced."""
    s = ctx.snapshot
    fit = ctx.fit.gpu_fit
    if len(nodes) == 1:  # one changed node (the usual case): the same bytes, without building an array first
        i = int(nodes[0])
        return [
            s.cpu_free[i : i + 1].astype(np.int64, copy=False).tobytes()
            + s.gpu_milli_free[i].astype(np.int64, copy=False).tobytes()
            + s.gpu_model[i].astype(np.int64, copy=False).tobytes()
            + fit[i].astype(np.int64).tobytes()
        ]
    rows = np.concatenate(
        [s.cpu_free[nodes][:, None], s.gpu_milli_free[nodes], s.gpu_model[nodes], fit[nodes]], axis=1
    ).astype(np.int64, copy=False)
    raw, width = rows.tobytes(), rows.shape[1] * 8
    return [raw[i * width : (i + 1) * width] for i in range(len(nodes))]


def _by_state(
    ctx: Context,
    stale: IntArray,
    compute: Callable[[IntArray], tuple[FloatArray, IntArray]],
    by_key: dict[bytes, tuple[float, int]],
    scores: FloatArray,
    aux: IntArray,
) -> None:
    keys = node_state_keys(ctx, stale)
    # One node per state not yet known (the first time a shape is seen, most nodes of a kind are in one state).
    first: dict[bytes, int] = {}
    for i, k in enumerate(keys):
        if k not in by_key:
            first.setdefault(k, i)
    if len(by_key) + len(first) > _STATES_PER_SHAPE:
        by_key.clear()
        first = {}
        for i, k in enumerate(keys):
            first.setdefault(k, i)
    new = list(first.values())
    if len(new) == len(keys):
        # Every state is new (the engine's steady state: a state is rarely seen twice): one computation for all,
        # stored as computed, without a lookup per node.
        s, a = compute(stale)
        scores[stale] = s
        aux[stale] = a
        by_key.update(zip(keys, zip(s.tolist(), a.tolist(), strict=True), strict=True))
        return
    if new:
        idx = np.asarray(new, dtype=np.int64)
        s, a = compute(stale[idx])
        for i, sc, ax in zip(new, s.tolist(), a.tolist(), strict=True):
            by_key[keys[i]] = (sc, ax)
    got = [by_key[k] for k in keys]
    scores[stale] = [g[0] for g in got]
    aux[stale] = [g[1] for g in got]
