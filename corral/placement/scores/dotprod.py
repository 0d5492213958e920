"""dotprod (FGD study, section 3.3): the smallest dot product of free and demand vectors wins.

x = (c/128000, U/8000), y = (c_p/128000, D_p/8000);   score = floor(100 (1 - x.y / 2));  0 if c < c_p
"""

from __future__ import annotations

import numpy as np

from corral.model.arrays import FloatArray, IntArray
from corral.placement.context import Context
from corral.placement.scores.common import STUDY_CPU_NORM, STUDY_GPU_NORM
from corral.placement.select import best_fit_gpus


class DotProd:
    name = "dotprod"

    def score(self, ctx: Context, nodes: IntArray) -> FloatArray:
        s, r = ctx.snapshot, ctx.request
        c = s.cpu_free[nodes]
        dot = (c / STUDY_CPU_NORM) * (r.cpu_milli / STUDY_CPU_NORM) + (s.gpu_free_total[nodes] / STUDY_GPU_NORM) * (
            r.gpu_demand_milli / STUDY_GPU_NORM
        )
        return np.where(c < r.cpu_milli, 0.0, np.floor(100.0 * (1.0 - dot / 2.0)))

    def choose_gpus(self, ctx: Context, node: int) -> list[int]:
        return best_fit_gpus(ctx, node)
