"""fgd (FGD study, section 3.7): place where the target workload's fragmentation grows least.

    a share of one GPU:  for each fitting GPU g, n' = n with c - c_p and u_g - m_p;
                         s_g = floor(100 sigmoid((F(n) - F(n')) / 1000));  score = max_g s_g
                         (the arg-max GPU, lowest index on ties, is also the GPU granted)
    anything else:       n' = n with c - c_p and m_p taken from the k GPUs that fit, in ascending free milli
                         (whole GPUs: the lowest-index free ones); score = floor(100 sigmoid((F(n) - F(n'))/1000))

No change in fragmentation scores 50. Scores are cached per request shape and recomputed only for nodes that changed
since (`common.cached_node_scores`), which makes a decision cost about one node's worth of fragmentation maths; a
changed node in a state already scored for the shape takes that score (`by_state`: both scores are functions of the
node's free CPU, per-GPU free milli and model, and the request's GPU fit). A request shape seen for the first time
so scores one node per distinct state, not the whole cluster (default, seed 42: 4.63 -> 3.61 s per replay).
"""

from __future__ import annotations

import numpy as np

from corral.model.arrays import FloatArray, IntArray
from corral.placement.context import Context
from corral.placement.scores.common import cached_node_scores
from corral.placement.select import first_k_ascending, whole_gpus
from corral.placement.workload import current_fragmentation, node_fragmentation, share_fragmentation_after


def fgd_score(delta: FloatArray) -> FloatArray:
    """floor(100 * sigmoid(delta / 1000)) with delta = F(n) - F(n')."""
    return np.floor(100.0 / (1.0 + np.exp(-delta / 1000.0)))


def node_after(ctx: Context, nodes: IntArray) -> tuple[IntArray, IntArray]:
    """Free CPU and per-GPU free milli of `nodes` once the request (not a one-GPU share) took its CPU and the GPUs
    the FGD study picks when scoring: the k fitting GPUs with the least free milli, lowest index on ties."""
    s, r = ctx.snapshot, ctx.request
    cpu_after = s.cpu_free[nodes] - r.cpu_milli
    u_after = s.gpu_milli_free[nodes]
    if r.wants_gpu:
        chosen = first_k_ascending(u_after, ctx.fit.gpu_fit[nodes], r.gpu_count)
        u_after = u_after - np.where(chosen, r.gpu_milli, 0)
    return cpu_after, u_after


class FragmentationScored:
    """A policy whose cached node scores come with the GPU a one-GPU share would take (FGD and its descendants):
    `score` reads the scores, `choose_gpus` grants exactly the GPUs the score assumed."""

    compiled = True  # scores through `placement.kernels` (a daemon loads them at start: `placement.native`)

    def _scores(self, ctx: Context, nodes: IntArray) -> tuple[FloatArray, IntArray]:
        raise NotImplementedError

    def score(self, ctx: Context, nodes: IntArray) -> FloatArray:
        return self._scores(ctx, nodes)[0]

    def choose_gpus(self, ctx: Context, node: int) -> list[int]:
        r = ctx.request
        if r.gpu_count == 1 and not r.whole_gpus:
            return [int(self._scores(ctx, np.array([node], dtype=np.int64))[1][0])]
        if r.whole_gpus:
            return whole_gpus(ctx, node)
        # Exactly the GPUs the score assumed: tightest free milli first, lowest index on ties.
        row = np.array([node], dtype=np.int64)
        chosen = first_k_ascending(ctx.snapshot.gpu_milli_free[row], ctx.fit.gpu_fit[row], r.gpu_count)[0]
        return [int(j) for j in np.flatnonzero(chosen)]


class Fgd(FragmentationScored):
    name = "fgd"

    def _compute(self, ctx: Context, nodes: IntArray) -> tuple[FloatArray, IntArray]:
        s, r, w = ctx.snapshot, ctx.request, ctx.workload
        before = current_fragmentation(s, w, nodes)
        if r.wants_gpu and r.gpu_count == 1 and not r.whole_gpus:
            after = share_fragmentation_after(s, w, nodes, r.cpu_milli, r.gpu_milli)
            per_gpu = np.where(ctx.fit.gpu_fit[nodes], fgd_score(before[:, None] - after), -1.0)
            best = np.argmax(per_gpu, axis=1)
            return per_gpu[np.arange(len(nodes)), best], best.astype(np.int64)
        cpu_after, u_after = node_after(ctx, nodes)
        after_n = node_fragmentation(s, w, nodes, cpu_after, u_after)
        return fgd_score(before - after_n), np.full(len(nodes), -1, dtype=np.int64)

    def _scores(self, ctx: Context, nodes: IntArray) -> tuple[FloatArray, IntArray]:
        return cached_node_scores(
            ctx, self.name, nodes, lambda idx: self._compute(ctx, idx), extra_key=ctx.workload.key, by_state=True
        )
