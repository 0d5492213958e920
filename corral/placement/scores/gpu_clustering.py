"""gpu-clustering (FGD study, section 3.4): keep pods of one kind together.

Tags: no GPU, a share of one GPU, k whole GPUs. With b = floor(25 (8000 - U) / 8000):
    node holds only pods of the request's tag      75 + b
    the request's tag and others                   50 + b
    no GPU pods at all                             25 + b
    only other tags                                 b
Requests without GPUs score 0 everywhere (the tie-break decides).
"""

from __future__ import annotations

import numpy as np

from corral.model.arrays import FloatArray, IntArray
from corral.model.resources import affinity_tag
from corral.placement.context import Context
from corral.placement.select import best_fit_gpus


class GpuClustering:
    name = "gpu-clustering"

    def score(self, ctx: Context, nodes: IntArray) -> FloatArray:
        s, r = ctx.snapshot, ctx.request
        if not r.wants_gpu:
            return np.zeros(len(nodes), dtype=np.float64)
        b = (25 * (8000 - s.gpu_free_total[nodes])) // 8000
        counts = s.tag_counts[nodes].copy()
        counts[:, 1] = 0  # column of tag 0: pods without GPUs do not count
        col = affinity_tag(r) + 1
        if col >= counts.shape[1]:  # more GPUs than any node has: no node holds this tag
            counts = np.pad(counts, ((0, 0), (0, col + 1 - counts.shape[1])))
        mine = counts[:, col] > 0
        others = (counts.sum(axis=1) - counts[:, col]) > 0
        base = np.select([mine & ~others, mine & others, ~mine & ~others], [75, 50, 25], default=0)
        return (base + b).astype(np.float64)

    def choose_gpus(self, ctx: Context, node: int) -> list[int]:
        return best_fit_gpus(ctx, node)
