"""fgd-scarcity: FGD's fragmentation step first; FGD's ties go to the node that costs the future pods least.

    score = fgd points (integer 0..100, exactly `fgd`'s)  +  tie-break (fraction in [0, 1))

    tie-break, pod without GPUs:  0.999 sigmoid(fill gain / 1000)
    tie-break, pod with GPUs:     0.999 (L - 1 - model level + sigmoid(scarce fill gain / 1000)) / L
                                  (lexicographic: lower model level first, then the larger scarce fill gain)

    fill gain        = sum_m p_m          (unfilled_m(n) - unfilled_m(n'))      (`placement.fill`: GPU milli type m
    scarce fill gain = sum_m p_m weight_m (unfilled_m(n) - unfilled_m(n'))       could not fill, every pod counted)
    weight_m         = how close room for type m is to running out cluster-wide   (`placement.scarcity`)
    model level      = how much model-constrained demand leans on the node's GPU model (`placement.scarcity`)

FGD's integer scores tie most of the time (every CPU-only pod scores 50 almost everywhere, whole-GPU pods tie across
all nodes of a kind), and FGD breaks ties by a fixed random node rank. The tie-break here looks ahead over the target
workload instead:

* a pod without GPUs goes where its CPU strands the least GPU capacity (the fill gain);
* a pod with GPUs first stays off GPU models that model-constrained types need (a pod that can run anywhere takes a
  G2 before a P100 that P100-only pods depend on), then takes the node where it removes the least room for future
  pods of the types whose room is scarce cluster-wide. Unweighted, the fill gain draws pods to nodes whose capacity
  no common type could use (CPU-poor P100 or V100 nodes); that helps when nothing else needs those GPUs and hurts
  when CPU is short everywhere or when constrained types need those models. Weighting by scarcity keeps the pull
  only where it saves a pod that would otherwise fail.

The integer part is exactly `fgd`'s score (a property test checks it), so an explanation's top scores read
"FGD points . tie-break". Decisions use only the cluster's current state and the target workload's statistics, never
the rest of the trace. Node scores are cached per request shape and scarcity weights, like `fgd`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from corral.model.arrays import BoolArray, FloatArray, IntArray
from corral.model.resources import MILLI_PER_GPU
from corral.placement.context import Context
from corral.placement.native import kernels
from corral.placement.scarcity import horizons, model_levels, scarcity_weights
from corral.placement.scores.common import shape_key
from corral.placement.scores.fgd import FragmentationScored
from corral.placement.workload import compile_workload

#: The tie-break stays below 1 so it can never lift a node past a higher FGD integer.
TIE_WEIGHT = 0.999
_NO_KEY = np.zeros((0, 0), dtype=np.float64)


class FgdScarcity(FragmentationScored):
    """The policy; the class attributes switch its parts off for the ablation in `benchmarks/beyond_fgd.py`."""

    name = "fgd-scarcity"
    cpu_pods = True  # tie-break pods without GPUs by the fill gain
    gpu_pods = True  # tie-break pods with GPUs (model level, then fill gain)
    weighted = True  # weight the GPU pods' fill gain by scarcity (False: every type counts fully)
    model_guard = True  # the model level comes first for GPU pods
    #: every type counts fully (no scarcity weights) while free CPU runs out before free GPU milli (fgd-priced's)
    unweighted_cpu_bound = False

    _weights_of: tuple[Context, FloatArray] | None = None  # the last decision's weights (an object per decision)
    _horizons_of: tuple[Context, tuple[float, float]] | None = None  # and its horizons

    def _horizons(self, ctx: Context) -> tuple[float, float]:
        """`scarcity.horizons` of this decision (the weights and fgd-priced's reserve both ask), computed once."""
        if self._horizons_of is None or self._horizons_of[0] is not ctx:
            self._horizons_of = (ctx, horizons(ctx.snapshot, ctx.workload))
        return self._horizons_of[1]

    def _cpu_bound(self, ctx: Context) -> bool:
        """Whether the scarcity weights are off for this decision: free CPU runs out before free GPU milli (the
        CPU-aware horizon is the smaller) and the policy says so (`unweighted_cpu_bound`)."""
        if not self.unweighted_cpu_bound:
            return False
        h_gpu, h_cpu = self._horizons(ctx)
        return h_cpu < h_gpu

    def _weights(self, ctx: Context) -> FloatArray:
        # `score` and then `choose_gpus` ask within one decision, on the same unchanged snapshot: computed once.
        if self._weights_of is not None and self._weights_of[0] is ctx:
            return self._weights_of[1]
        n_types = len(ctx.workload.types)
        if ctx.request.wants_gpu and self.gpu_pods and self.weighted and not self._cpu_bound(ctx):
            weights = scarcity_weights(ctx.snapshot, ctx.workload, self._horizons(ctx)[0])
        else:
            weights = np.ones(n_types, dtype=np.float64)
        self._weights_of = (ctx, weights)
        return weights

    def _compute(self, ctx: Context, nodes: IntArray, weights: FloatArray) -> tuple[FloatArray, IntArray]:
        """Scores (and the GPU of a share) of `nodes` under `weights`, from per-node parts kept per request shape.

        The parts are F(n) - F(n') and, per target type, the unfilled milli the pod removes (before - after): per
        GPU for a one-GPU share (one hypothetical state per GPU it could take). Neither depends on the scarcity
        weights, so they are kept per request shape and recomputed only for nodes that changed; the weights, which
        move in steps as the cluster fills, are applied here (`kernels.share_exponents` / `pod_exponents` keep the
        parts and weigh them, numpy takes the exp of FGD's and the gain's sigmoids, `kernels.share_choice` /
        `pod_scores` finish the scores)."""
        s, r, wl = ctx.snapshot, ctx.request, ctx.workload
        k, w = kernels(), compile_workload(s, wl)
        share = r.wants_gpu and r.gpu_count == 1 and not r.whole_gpus
        seen, delta, drop = self._parts(ctx, share)
        pw = w.prob * weights
        use = self.gpu_pods if r.wants_gpu else self.cpu_pods
        guard = use and self.model_guard and r.wants_gpu
        level, levels = model_levels(s, wl)
        fit = np.ascontiguousarray(ctx.fit.gpu_fit)
        if share:
            e = k.share_exponents(
                nodes, seen, s.version, delta, drop, s.cpu_free, s.gpu_milli_free, s.gpu_present, w.by_node, w.table,
                w.prob, r.cpu_milli, r.gpu_milli, pw, use,
            )  # fmt: skip
            np.exp(e, out=e)
            mode, key = self._share_key(ctx, nodes)
            got: tuple[FloatArray, IntArray] = k.share_choice(
                nodes, e, use, guard, level, levels, self._consts, mode, key, s.gpu_milli_free, fit
            )
            return got
        # The after state is `fgd.node_after`'s (the GPUs FGD's scoring takes), worked out in the kernel.
        e = k.pod_exponents(
            nodes, seen, s.version, delta, drop, s.cpu_free, s.gpu_milli_free, fit, s.gpu_present, w.by_node, w.table,
            w.prob, r.cpu_milli, r.gpu_milli, r.gpu_count if r.wants_gpu else 0, pw, use, *_now(ctx),
        )  # fmt: skip
        np.exp(e, out=e)
        scores: FloatArray = k.pod_scores(nodes, e, use, guard, level, levels, TIE_WEIGHT)
        return scores, np.full(len(nodes), -1, dtype=np.int64)

    def _parts(self, ctx: Context, share: bool) -> tuple[IntArray, FloatArray, npt.NDArray[np.int16 | np.int32]]:
        """This request shape's parts entry: per node the version its parts were computed at, F(n) - F(n') (nodes x
        GPUs for a share, nodes x 1 otherwise) and the unfilled milli removed (nodes x types x GPUs or 1)."""
        s = ctx.snapshot
        key = ("scarcity-parts", shape_key(ctx.request), ctx.workload.key)
        entry: tuple[IntArray, FloatArray, npt.NDArray[np.int16 | np.int32]] | None = s.memo.get(key)
        if entry is None:
            n, t, g = len(s), len(ctx.workload.types), s.max_gpus if share else 1
            # The unfilled milli a pod removes from a node lies within +-(its GPUs x 1000): int16 up to 32 GPUs
            # quarters the largest memo entries (150 types x 8 GPUs x 1,213 nodes on gpuspec33p, per share shape:
            # in int32 the memo's byte bound evicted them, and the filters' caches with them, all replay long).
            small = s.max_gpus * MILLI_PER_GPU <= np.iinfo(np.int16).max
            entry = (
                np.full(n, -1, dtype=np.int64),
                np.zeros((n, g), dtype=np.float64),
                np.zeros((n, t, g), dtype=np.int16 if small else np.int32),  # node-major: one block per node
            )
            s.memo[key] = entry
        return entry

    #: What `kernels.share_choice` packs with: the tie-break's weight, and for a subclass's key its stride and the
    #: steps of FGD's points and of the tightness (`priced_order`).
    _consts = np.array([TIE_WEIGHT, 0.0, 0.0, 0.0])

    def _share_key(self, ctx: Context, nodes: IntArray) -> tuple[int, FloatArray]:
        """A criterion a subclass puts before fgd-scarcity's score of a one-GPU share, per (node, GPU): how it is
        packed (`kernels.share_choice`'s mode; 0: none) and its key."""
        return 0, _NO_KEY

    _scored: tuple[Context, IntArray, FloatArray, IntArray] | None = None  # the last `_scores` of this decision

    def _scores(self, ctx: Context, nodes: IntArray) -> tuple[FloatArray, IntArray]:
        last = self._scored
        if last is not None and last[0] is ctx and len(nodes) == 1:
            # `choose_gpus` asks for the chosen node of the scores just computed (on the same, unchanged snapshot).
            at = int(np.searchsorted(last[1], nodes[0]))
            if at < len(last[1]) and last[1][at] == nodes[0]:
                return last[2][at : at + 1], last[3][at : at + 1]
        weights = self._weights(ctx)
        generation = tuple(weights.tolist())
        scores, aux, rising = state_scores(
            ctx, self.name, nodes, lambda idx: self._compute(ctx, idx, weights), generation
        )
        if len(nodes) > 1 and rising:  # sorted (the engine's feasible nodes are)
            self._scored = (ctx, nodes, scores, aux)
        return scores, aux


def _now(ctx: Context) -> tuple[IntArray, FloatArray, IntArray]:
    """Per node, F and the unfilled milli per type of its state now, at the version they were computed at (for every
    request shape; `kernels.pod_exponents` keeps them)."""
    s = ctx.snapshot
    key = ("node-now", ctx.workload.key)
    entry: tuple[IntArray, FloatArray, IntArray] | None = s.memo.get(key)
    if entry is None:
        n = len(s)
        entry = (
            np.full(n, -1, dtype=np.int64),
            np.zeros(n, dtype=np.float64),
            np.zeros((n, len(ctx.workload.types)), dtype=np.int64),  # node-major, as the kernels read it
        )
        s.memo[key] = entry
    return entry


#: Node states one shape's entry remembers before it starts afresh (bounds memory: about 250 bytes each).
_STATES_PER_SHAPE = 1 << 14


@dataclass
class _StateScores:
    """Per request shape: each node's state id (taken at its `version`), the states seen (one row each, found by an
    open addressing table: `kernels.assign_states`), and per state id its score and aux under `generation` (`valid`
    says which are computed)."""

    versions: IntArray
    sid: IntArray
    rows: IntArray  # ids x (1 + 3 x GPUs): free CPU, per-GPU free milli, model and fit
    slots: IntArray  # the table: id + 1 per slot, 0 empty (a power of two, at least twice the rows)
    count: IntArray  # [ids in use]
    score: FloatArray
    aux: IntArray
    valid: BoolArray
    generation: object

    def room_for(self, more: int) -> None:
        """Grow the rows (and the table and the per-id arrays with them) so that `more` new ids fit."""
        need = int(self.count[0]) + more
        if need <= len(self.rows):
            return
        cap = max(2 * len(self.rows), need)
        rows = np.zeros((cap, self.rows.shape[1]), dtype=np.int64)
        rows[: len(self.rows)] = self.rows
        self.rows = rows
        self.slots = np.zeros(1 << (2 * cap - 1).bit_length(), dtype=np.int64)
        kernels().rehash(self.rows, int(self.count[0]), self.slots)
        self.score = np.resize(self.score, cap)
        self.aux = np.resize(self.aux, cap)
        self.valid = np.concatenate([self.valid, np.zeros(cap - len(self.valid), dtype=np.bool_)])

    def clear(self) -> None:
        self.count[0] = 0
        self.slots.fill(0)
        self.versions.fill(-1)
        self.valid[:] = False


def state_scores(
    ctx: Context,
    policy: str,
    nodes: IntArray,
    compute: Callable[[IntArray], tuple[FloatArray, IntArray]],
    generation: object,
) -> tuple[FloatArray, IntArray, bool]:
    """Scores (and the GPU of a share) of `nodes`, computed once per distinct node state and `generation`, and
    whether `nodes` rise strictly.

    Valid because fgd-scarcity's and fgd-priced's scores are a function of the node's state (free CPU, per-GPU free
    milli and model, the request's GPU fit: `common.node_state_keys`' values), the request's shape and the
    generation (the scarcity weights). A node's state id is taken only when its `version` moved
    (`kernels.assign_states`, an open addressing table over the states' rows: the bytes keys it replaced cost more
    than the scores on lists with many request shapes); when the weights move (often: a step of any type's weight),
    no node is keyed again: the states in use are rescored, one node each, in one call.
    """
    s = ctx.snapshot
    key = ("state-scores", policy, shape_key(ctx.request), ctx.workload.key)
    e: _StateScores | None = s.memo.get(key)
    if e is None:
        n, cap = len(s), 64
        e = _StateScores(
            np.full(n, -1, dtype=np.int64),
            np.zeros(n, dtype=np.int64),
            np.zeros((cap, 1 + 3 * s.max_gpus), dtype=np.int64),
            np.zeros(2 * cap, dtype=np.int64),
            np.zeros(1, dtype=np.int64),
            np.zeros(cap, dtype=np.float64),
            np.zeros(cap, dtype=np.int64),
            np.zeros(cap, dtype=np.bool_),
            generation,
        )
        s.memo[key] = e
    if e.generation != generation:
        e.valid[:] = False
        e.generation = generation
    k = kernels()
    stale = k.stale(nodes, e.versions, s.version)
    if len(stale):
        if int(e.count[0]) + len(stale) > _STATES_PER_SHAPE:  # start afresh: every node is keyed again when asked
            e.clear()
            stale = nodes
        if int(e.count[0]) + len(stale) > len(e.rows):
            e.room_for(len(stale))
            s.memo[key] = e  # the memo counts the entry's bytes again
        k.assign_states(
            stale, s.cpu_free, s.gpu_milli_free, s.gpu_model, np.ascontiguousarray(ctx.fit.gpu_fit), e.rows, e.slots,
            e.count, e.sid, e.versions, s.version,
        )  # fmt: skip
    # The states without a score under this generation, each computed once, on the first node found in it.
    want, reps = k.missing_states(nodes, e.sid, e.valid)  # (marked valid)
    if len(want):
        try:
            e.score[want], e.aux[want] = compute(reps)
        except BaseException:
            e.valid[want] = False
            raise
    got: tuple[FloatArray, IntArray, bool] = k.by_state(nodes, e.sid, e.score, e.aux)
    return got
