"""topology: for multi-GPU requests, the node whose free GPUs are best connected.

Score = 100 x (pair affinity of the best k-set of free GPUs) / (3 x k(k-1)/2), i.e. 100 when every pair shares
NVLink, plus binpack's score / 1000 to break ties by packing. For other requests it is binpack. Nodes whose
topology is unknown score 0 affinity. The chosen GPUs are that best-connected set.
"""

from __future__ import annotations

import numpy as np

from corral.model.arrays import FloatArray, IntArray
from corral.placement.context import Context
from corral.placement.scores.common import used_fraction_after
from corral.placement.select import NVLINK, best_connected, best_fit_gpus


class Topology:
    name = "topology"

    def score(self, ctx: Context, nodes: IntArray) -> FloatArray:
        pack = 100.0 * used_fraction_after(ctx.snapshot, ctx.request, nodes)
        r = ctx.request
        if not (r.wants_gpu and r.whole_gpus and r.gpu_count > 1):
            return pack
        k = r.gpu_count
        best_possible = NVLINK * k * (k - 1) / 2
        affinity = np.zeros(len(nodes), dtype=np.float64)
        for pos, node in enumerate(nodes):
            if ctx.snapshot.has_topology[node]:
                free = [int(j) for j in np.flatnonzero(ctx.fit.gpu_fit[node])]
                affinity[pos] = best_connected(ctx.snapshot, int(node), free, k)[1]
        return 100.0 * affinity / best_possible + pack / 1000.0

    def choose_gpus(self, ctx: Context, node: int) -> list[int]:
        return best_fit_gpus(ctx, node)
