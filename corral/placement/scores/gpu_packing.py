"""gpu-packing (FGD study, section 3.5): fill used GPUs first, then free GPUs of used nodes, then empty nodes.

no GPU request                          0
node with every GPU free                33 - G        (smaller nodes first)
else take the request's k GPUs in ascending free milli among those that fit:
  some chosen GPU fully free            max(50 - #fully free chosen, 33)
  only partly used GPUs chosen          max(100 - floor(sum floor(u_g/10) / 10), 50)
"""

from __future__ import annotations

import numpy as np

from corral.model.arrays import FloatArray, IntArray
from corral.model.resources import MILLI_PER_GPU
from corral.placement.context import Context
from corral.placement.select import best_fit_gpus, first_k_ascending


class GpuPacking:
    name = "gpu-packing"

    def score(self, ctx: Context, nodes: IntArray) -> FloatArray:
        s, r = ctx.snapshot, ctx.request
        if not r.wants_gpu:
            return np.zeros(len(nodes), dtype=np.float64)
        u = s.gpu_milli_free[nodes]
        chosen = first_k_ascending(u, ctx.fit.gpu_fit[nodes], r.gpu_count)
        # "Fully free" = nothing of the GPU granted: a GPU holding only a memory share is a used GPU.
        untouched = (u == MILLI_PER_GPU) & (s.gpu_mem_free[nodes] == s.gpu_mem_cap[nodes])
        full_used = (chosen & untouched).sum(axis=1)
        partial = 100 - (np.where(chosen, u // 10, 0).sum(axis=1) // 10)
        g = s.gpu_count[nodes]
        score = np.where(full_used > 0, np.maximum(50 - full_used, 33), np.maximum(partial, 50))
        score = np.where(s.gpu_full_free[nodes] == g, 33 - g, score)
        return score.astype(np.float64)

    def choose_gpus(self, ctx: Context, node: int) -> list[int]:
        return best_fit_gpus(ctx, node)
