"""random: a feasible node uniformly at random (seeded), a share on a random fitting GPU.

As in the FGD study, one draw picks the node among the feasible ones in node order; whole GPUs are the
lowest-index free ones.
"""

from __future__ import annotations

import numpy as np

from corral.model.arrays import FloatArray, IntArray
from corral.placement.context import Context
from corral.placement.select import whole_gpus


class RandomPolicy:
    name = "random"

    def score(self, ctx: Context, nodes: IntArray) -> FloatArray:
        scores = np.zeros(len(nodes), dtype=np.float64)
        scores[int(ctx.rng.integers(len(nodes)))] = 100.0
        return scores

    def choose_gpus(self, ctx: Context, node: int) -> list[int]:
        if ctx.request.whole_gpus:
            return whole_gpus(ctx, node)
        fit = np.flatnonzero(ctx.fit.gpu_fit[node])
        picked = ctx.rng.choice(fit, size=ctx.request.gpu_count, replace=False)
        return sorted(int(j) for j in picked)
