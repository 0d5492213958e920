"""bestfit (FGD study, section 3.6): the node left with the least free CPU and GPU, equally weighted.

    raw = 1/2 (c - c_p)/128000 + 1/2 (U - D_p)/8000;   score = floor(100 (1 - raw))

The study then min-max normalises the scores over the feasible nodes; with scores in 0..100 that keeps order and
ties exactly, so it is left out.
"""

from __future__ import annotations

import numpy as np

from corral.model.arrays import FloatArray, IntArray
from corral.placement.context import Context
from corral.placement.scores.common import STUDY_CPU_NORM, STUDY_GPU_NORM
from corral.placement.select import best_fit_gpus


class BestFit:
    name = "bestfit"

    def score(self, ctx: Context, nodes: IntArray) -> FloatArray:
        s, r = ctx.snapshot, ctx.request
        raw = (
            0.5 * (s.cpu_free[nodes] - r.cpu_milli) / STUDY_CPU_NORM
            + 0.5 * (s.gpu_free_total[nodes] - r.gpu_demand_milli) / STUDY_GPU_NORM
        )
        return np.floor(100.0 * (1.0 - raw))

    def choose_gpus(self, ctx: Context, node: int) -> list[int]:
        return best_fit_gpus(ctx, node)
