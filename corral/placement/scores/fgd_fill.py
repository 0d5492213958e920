"""fgd-fill: FGD's fragmentation step first; among FGD's ties, the node whose future fill suffers least.

    score = fgd points (integer 0..100, exactly `fgd`'s)  +  0.999 x sigmoid(fill gain / 1000)   (fraction in [0, 1))
    fill gain = W(n) - W(n')      W: GPU milli the target workload could not fill, counting every pod that fits
                                     (CPU slots included; `placement.fill`)

FGD scores are integers, so ties are the rule: every CPU-only pod scores 50 almost everywhere, and whole-GPU pods
tie across all nodes of a kind. FGD breaks them by the node's fixed random rank; fgd-fill breaks them by the fill
gain, which sees what FGD's one-pod-fits test does not: a CPU-only or CPU-heavy pod on a node with idle GPUs strands
them, and a share that leaves a residue no common type fits wastes it. The integer part is exactly `fgd`'s score and
the fraction orders only within it, so an explanation's top scores read "FGD points . fill" (50.73 beats 50.41, both
lose to 51.02). A one-GPU share goes to the GPU with the best combined score (lowest index on ties).

Both measures use only the node's own state and the target workload's statistics, never the rest of the trace, and
are cached per request shape like `fgd` (`common.cached_node_scores`).
"""

from __future__ import annotations

import numpy as np

from corral.model.arrays import FloatArray, IntArray
from corral.placement.context import Context
from corral.placement.fill import node_unfilled, share_unfilled_after
from corral.placement.scores.common import cached_node_scores
from corral.placement.scores.fgd import fgd_score
from corral.placement.select import first_k_ascending, whole_gpus
from corral.placement.workload import node_fragmentation, share_fragmentation_after

#: The fill fraction stays below 1 so it can never lift a node past a higher FGD integer.
FILL_WEIGHT = 0.999


def fill_fraction(gain: FloatArray) -> FloatArray:
    """Map a fill gain (milli-GPU, any sign) monotonically into [0, FILL_WEIGHT]."""
    return FILL_WEIGHT / (1.0 + np.exp(-np.clip(gain, -50_000.0, 50_000.0) / 1000.0))


class FgdFill:
    name = "fgd-fill"

    def _compute(self, ctx: Context, nodes: IntArray) -> tuple[FloatArray, IntArray]:
        s, r, w = ctx.snapshot, ctx.request, ctx.workload
        frag_before = node_fragmentation(s, w, nodes)
        fill_before = node_unfilled(s, w, nodes)
        if r.wants_gpu and r.gpu_count == 1 and not r.whole_gpus:
            frag_after = share_fragmentation_after(s, w, nodes, r.cpu_milli, r.gpu_milli)
            fill_after = share_unfilled_after(s, w, nodes, r.cpu_milli, r.gpu_milli)
            combined = fgd_score(frag_before[:, None] - frag_after) + fill_fraction(fill_before[:, None] - fill_after)
            per_gpu = np.where(ctx.fit.gpu_fit[nodes], combined, -1.0)
            best = np.argmax(per_gpu, axis=1)
            return per_gpu[np.arange(len(nodes)), best], best.astype(np.int64)
        cpu_after = s.cpu_free[nodes] - r.cpu_milli
        u_after = s.gpu_milli_free[nodes]
        if r.wants_gpu:
            chosen = first_k_ascending(u_after, ctx.fit.gpu_fit[nodes], r.gpu_count)
            u_after = u_after - np.where(chosen, r.gpu_milli, 0)
        frag_gain = frag_before - node_fragmentation(s, w, nodes, cpu_after, u_after)
        fill_gain = fill_before - node_unfilled(s, w, nodes, cpu_after, u_after)
        return fgd_score(frag_gain) + fill_fraction(fill_gain), np.full(len(nodes), -1, dtype=np.int64)

    def _scores(self, ctx: Context, nodes: IntArray) -> tuple[FloatArray, IntArray]:
        return cached_node_scores(
            ctx, self.name, nodes, lambda idx: self._compute(ctx, idx), extra_key=ctx.workload.key
        )

    def score(self, ctx: Context, nodes: IntArray) -> FloatArray:
        return self._scores(ctx, nodes)[0]

    def choose_gpus(self, ctx: Context, node: int) -> list[int]:
        r = ctx.request
        if r.gpu_count == 1 and not r.whole_gpus:
            return [int(self._scores(ctx, np.array([node], dtype=np.int64))[1][0])]
        if r.whole_gpus:
            return whole_gpus(ctx, node)
        # Exactly the GPUs both measures assumed: tightest free milli first, lowest index on ties.
        row = np.array([node], dtype=np.int64)
        chosen = first_k_ascending(ctx.snapshot.gpu_milli_free[row], ctx.fit.gpu_fit[row], r.gpu_count)[0]
        return [int(j) for j in np.flatnonzero(chosen)]
