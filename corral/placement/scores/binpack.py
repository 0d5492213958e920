"""binpack and spread: fill the fullest node first, or the emptiest.

Score = 100 x weighted used fraction of the node after placement (GPU compute 3, CPU 1, memory 1; without a GPU
request only CPU and memory). `spread` is 100 minus that. GPU choice: binpack gives a share to the fullest GPU that
fits (best fit), spread to the emptiest (worst fit); whole GPUs are chosen by topology or lowest index.
"""

from __future__ import annotations

from corral.model.arrays import FloatArray, IntArray
from corral.placement.context import Context
from corral.placement.scores.common import used_fraction_after
from corral.placement.select import best_fit_gpus, worst_fit_gpus


class Binpack:
    name = "binpack"

    def score(self, ctx: Context, nodes: IntArray) -> FloatArray:
        return 100.0 * used_fraction_after(ctx.snapshot, ctx.request, nodes)

    def choose_gpus(self, ctx: Context, node: int) -> list[int]:
        return best_fit_gpus(ctx, node)


class Spread:
    name = "spread"

    def score(self, ctx: Context, nodes: IntArray) -> FloatArray:
        return 100.0 - 100.0 * used_fraction_after(ctx.snapshot, ctx.request, nodes)

    def choose_gpus(self, ctx: Context, node: int) -> list[int]:
        return worst_fit_gpus(ctx, node)
