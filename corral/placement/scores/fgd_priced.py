"""fgd-priced: shares go where they spoil the least GPU room the workload's shares would fill; hosts for the
multi-GPU pods are kept while they run out; fgd-scarcity decides the rest.

    every pod:  0. a node kept for multi-GPU pods comes after every other feasible node    (`placement.reserve`)
               0'. while CPU and GPU run out nearly together (`packs_first`), a node with every GPU free comes
                   after every node that breaks nothing while a broken node of its shape fits (`breaks_intact`)
    a share of one GPU, per fitting GPU g (u_g free milli, m the share's milli), then:
                1. loss(u_g, m), rounded to whole milli, lowest first                     (`placement.pricing`)
                2. FGD's integer points on that GPU, highest first                    (`placement.priced_order`)
                3. u_g, lowest first                            (the tightest GPU among equally good ones)
                4. fgd-scarcity's look-ahead tie-break on that GPU
    any other pod, then: fgd-scarcity's score
    (while free CPU runs out before free GPU milli, fgd-scarcity's GPU pods' fill gain counts every target type
    fully, without its scarcity weights: `FgdScarcity.unweighted_cpu_bound`, issue 27)
    (two measured, opt-in forms of key 0 while free CPU runs out first, issue 27: `gpu_pods_free_cpu_bound`, pods
    with GPUs not kept off; `kept_price_cpu_bound`, pods with GPUs pay a price in milli of a GPU's worth on a kept
    host instead of ranking it last; both off, each loses a seed the hard rule keeps: docs/beyond-fgd.md)

loss(u, m) is what a GPU with u milli free loses beyond the share's own worth when a share of m milli lands on it,
priced with the dual prices of the LP that packs the workload's shares best. It is zero where the share continues a
configuration an optimal packing uses (a 470 beside a 470, a 320 beside a 650), positive where it spoils room others
would fill better (a 320 beside a 470 costs 167). Among GPUs of equal loss FGD's points come first, so the node's
fragmentation and CPU count before the GPU's tightness (issue 16: tightest first stranded GPUs on nodes whose CPU the
share took); among those still equal the tightest goes first, so a configuration that was started is completed
before a new one is opened, and fgd-scarcity's look-ahead decides the rest.

Key 0 exists because the rare largest pods (8 GPUs and 120 cores, which only an empty 8-GPU, 128-core node takes)
weigh nothing in the expectations above: fgd-scarcity's look-ahead sends 1-GPU pods to exactly those CPU-rich
nodes, and without key 0 such pods wait in the online replay while FGD, by the luck of its fixed node order, leaves
enough of those nodes empty.

Each decision's notes say it in words: what the share costs and what its GPU loses, and how many nodes were kept.
Keys 1-4 are packed into one float (`priced_order`), at most about 1.02e8, which keeps fgd-scarcity's fraction to
better than 1e-7; key 0 subtracts 2^28, key 0' 2^27. (With `fgd_first` off, the order issue 7 left, kept for the
ablation: 1, the tightness, then fgd-scarcity's whole score, packed as (1000 - loss) x 1001 + (1000 - u), times 128,
plus the score.)
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from corral.model.arrays import BoolArray, FloatArray, IntArray
from corral.model.resources import MILLI_PER_GPU
from corral.placement.context import Context
from corral.placement.priced_order import POINTS, TIGHT
from corral.placement.pricing import SharePrices, share_prices
from corral.placement.reserve import GPU_POD_MARGIN, kept_hosts
from corral.placement.scarcity import horizons
from corral.placement.scores.fgd_scarcity import _NO_KEY, TIE_WEIGHT, FgdScarcity
from corral.placement.workload import WorkloadKey

#: fgd-scarcity's scores lie in [0, 101); one step of the keys above outweighs any of them.
STRIDE = 128
#: Subtracted from the score of a host kept for multi-GPU pods: below every other node's score.
KEPT_OFF = float(1 << 28)
_NODE_SHAPES = ("fgd-priced", "node-shapes")  # memo key: a shape id per node (`FgdPriced.breaks_intact`)


class FgdPriced(FgdScarcity):
    name = "fgd-priced"
    tightest = True  # key 2 (False only for the ablation in `benchmarks/beyond_fgd.py`)
    reserve = True  # keep hosts for multi-GPU types while they run out (`placement.reserve`)
    cpu_horizon = True  # the reserve's horizon counts free CPU too (False only for the ablation)
    fgd_first = True  # among GPUs of equal loss, FGD's points before the tightest GPU (`placement.priced_order`)
    gpu_margin = GPU_POD_MARGIN  # reserve margin for pods with GPUs (`placement.reserve`; 1.0: none)
    cpu_margin = 1.0  # and for pods without GPUs
    margin_gpu_bound = True  # the margin only while free GPU milli runs out no later than free CPU
    unweighted_cpu_bound = True  # no scarcity weights while free CPU runs out first (`FgdScarcity._cpu_bound`)
    #: pods with GPUs not kept off the hosts while free CPU runs out first (`keeps_off`; off: issue 27 measured it)
    gpu_pods_free_cpu_bound = False
    #: > 0: while free CPU runs out first, a pod with GPUs is not ranked below every other node on a kept host but
    #: pays this price there, in milli of a GPU's worth (`kept_price`; 0: the hard rule; issue 27 measured it)
    kept_price_cpu_bound = 0.0
    #: > 0: while free CPU runs out first, a pod with GPUs keeps off the kept hosts only while another feasible node
    #: is CPU-rich: keeps, after the pod, at least this many times the workload's CPU per GPU milli for its free GPU
    #: milli (`cpu_rich_elsewhere`; 0: always kept off; issue 27 measured 4)
    cpu_rich_cpu_bound = 0.0
    #: while free CPU runs out first but strands less GPU milli than the multi-GPU pods still need (`packs_first`), a
    #: pod does not break a node with all its GPUs free while a node of the same shape already broken can take it
    #: (`breaks_intact`; issue 27)
    pack_first_cpu_bound = True
    pack_first_always = False  # the same whenever free CPU runs out first (`fgd-priced-pack-always`, the ablation)

    _kept = 0  # nodes the last `score` kept for multi-GPU pods (a policy object serves one decision)
    _priced = False  # and whether they were priced (`kept_price_cpu_bound`) rather than ranked last
    _freed = 0  # hosts kept for multi-GPU pods that the pod was not kept off (`cpu_rich_cpu_bound`)
    _packed = 0  # intact nodes ranked after a broken node of their shape (`pack_first_cpu_bound`)

    def keeps_off(self, ctx: Context) -> bool:
        """Whether this decision's pod keeps off the hosts kept for multi-GPU pods: always where the policy keeps
        hosts, except, under `gpu_pods_free_cpu_bound`, a pod with GPUs while free CPU runs out before free GPU milli.

        The switch exists for the ablation (`fgd-priced-gpu-pods-free`, issue 27, docs/beyond-fgd.md): on the real
        CPU-heavy lists it puts fgd-priced ahead of fgd on every seed, but on `cpu200p` seed 43 it lets 1-GPU pods
        break the last 8-GPU hosts (8 such pods fail against fgd's 3), so it is off."""
        if not self.reserve:
            return False
        if not (ctx.request.wants_gpu and (self.gpu_pods_free_cpu_bound or self.kept_price_cpu_bound > 0)):
            return True
        h_gpu, h_cpu = self._horizons(ctx)
        return not h_cpu < h_gpu

    def score(self, ctx: Context, nodes: IntArray) -> FloatArray:
        scores = super().score(ctx, nodes)
        self._kept, self._priced, self._freed, self._packed = 0, False, 0, 0
        if self.keeps_off(ctx):
            margin = self.gpu_margin if ctx.request.wants_gpu else self.cpu_margin
            h_gpu, h_cpu = self._horizons(ctx)
            if self.margin_gpu_bound and margin != 1.0 and h_cpu < h_gpu:  # (`reserve.gpu_runs_out_later`)
                margin = 1.0
            h = h_cpu if self.cpu_horizon else h_gpu
            kept = kept_hosts(ctx.snapshot, ctx.workload, ctx.request, nodes, self.cpu_horizon, margin, h)
            self._kept = int(np.count_nonzero(kept))
            rich_test = self._kept and self.cpu_rich_cpu_bound > 0 and ctx.request.wants_gpu and h_cpu < h_gpu
            if rich_test and not self.cpu_rich_elsewhere(ctx, nodes[~kept]):
                self._kept, self._freed = 0, self._kept  # every other node would be short of CPU for its GPUs
            if self._kept:
                scores = np.where(kept, scores - KEPT_OFF, scores)
        elif self.reserve and self.kept_price_cpu_bound > 0 and ctx.request.wants_gpu:
            h_cpu = self._horizons(ctx)[1]
            kept = kept_hosts(ctx.snapshot, ctx.workload, ctx.request, nodes, self.cpu_horizon, 1.0, h_cpu)
            self._kept, self._priced = int(np.count_nonzero(kept)), True
            if self._kept:
                scores = np.where(kept, scores - self.kept_price(ctx), scores)
        if self.pack_first_cpu_bound and len(nodes) and self.packs_first(ctx):
            intact = self.breaks_intact(ctx, nodes)
            self._packed = int(np.count_nonzero(intact))
            if self._packed:
                scores = np.where(intact, scores - KEPT_OFF / 2, scores)
        return scores

    def cpu_rich_elsewhere(self, ctx: Context, others: IntArray) -> bool:
        """Whether one of `others` (the feasible nodes not kept) keeps, once the pod took its CPU and GPU milli,
        at least `cpu_rich_cpu_bound` x c x its free GPU milli of free CPU, c the target workload's expected CPU per
        GPU milli over its pods with GPUs: a node where the pod's CPU does not cost that node's GPUs. Where none does,
        keeping the pod off the kept hosts strands GPUs wherever it lands, and the kept hosts compete on score."""
        s, r = ctx.snapshot, ctx.request
        per_milli = _cpu_per_gpu_milli(ctx.workload.key)
        if not len(others) or per_milli is None:
            return False
        cpu_after = s.cpu_free[others] - r.cpu_milli
        gpu_after = s.gpu_free_total[others] - r.gpu_count * r.gpu_milli
        return bool(np.any(cpu_after >= self.cpu_rich_cpu_bound * per_milli * gpu_after))

    def packs_first(self, ctx: Context) -> bool:
        """Whether this decision keeps whole nodes whole (`breaks_intact`): while free CPU runs out first, and the
        GPU milli that its running out would leave idle, (H_gpu - H_cpu) x the workload's GPU milli per pod, is less
        than the multi-GPU pods' GPU milli over the pods still to fit, H_cpu x their GPU milli per pod. Where CPU runs
        out well first, GPUs will be idle anyway and spreading pods over whole nodes costs nothing (the fill gain
        decides, as before); where the two run out nearly together, each whole node broken is an 8-GPU pod lost."""
        h_gpu, h_cpu = self._horizons(ctx)
        if not h_cpu < h_gpu:
            return False
        if self.pack_first_always:
            return True
        key = ("per-pod", ctx.workload.key)  # (GPU milli, CPU) per pod, as `scarcity.horizons` memoises it
        per_pod: tuple[float, float] | None = ctx.snapshot.memo.get(key)
        if per_pod is None:  # evicted since this decision's horizons: computed again
            horizons(ctx.snapshot, ctx.workload)
            per_pod = ctx.snapshot.memo.get(key)
        return per_pod is not None and (h_gpu - h_cpu) * per_pod[0] < h_cpu * _multi_gpu_milli(ctx.workload.key)

    def breaks_intact(self, ctx: Context, nodes: IntArray) -> BoolArray:
        """Of `nodes`, those the pod would break: all their GPUs free and more of them than the pod asks, while
        another of `nodes` of the same shape (CPU, GPUs, model) already has a GPU in use. Ranked after every node
        that breaks nothing, they keep whole nodes for multi-GPU pods where FGD's look-ahead would spread one pod
        over each (issue 27: on cpu235 seed 43 fgd-priced broke 33 of the 39 128-core 8-GPU nodes with one 1-GPU
        pod each within 2 % arrived; fgd kept 35 whole at 10 %)."""
        s, r = ctx.snapshot, ctx.request
        shapes: tuple[IntArray, IntArray, int] | None = s.memo.get(_NODE_SHAPES)
        if shapes is None:  # static: a shape id per node, its whole GPU milli, the number of shapes
            key = np.stack([s.cpu_cap, s.gpu_count, s.gpu_model[:, 0] if s.gpu_model.shape[1] else s.gpu_count])
            _, ids = np.unique(key, axis=1, return_inverse=True)
            ids = ids.reshape(-1).astype(np.int64)
            shapes = (ids, s.gpu_count * MILLI_PER_GPU, int(ids.max()) + 1 if len(ids) else 0)
            s.memo[_NODE_SHAPES] = shapes
        ids, whole, n_shapes = shapes
        gc = s.gpu_count[nodes]
        free = s.gpu_free_total[nodes]
        intact = (free == whole[nodes]) & (gc > r.gpu_count)
        broken = (free < whole[nodes]) & (gc > 0)
        if not intact.any() or not broken.any():
            return np.zeros(len(nodes), dtype=np.bool_)
        has_broken = np.bincount(ids[nodes[broken]], minlength=n_shapes) > 0
        out: BoolArray = intact & has_broken[ids[nodes]]
        return out

    def kept_price(self, ctx: Context) -> float:
        """`kept_price_cpu_bound` milli of a GPU's worth in this pod's score units: for a share, on the priced loss
        (key 1: a milli of loss is POINTS x TIGHT); for any other pod with GPUs, on fgd-scarcity's fill gain, at
        its tie-break's steepest slope (0.999 x 1/4 per 1000 milli: the gain goes through sigmoid(gain / 1000)),
        below FGD's points."""
        r = ctx.request
        if r.gpu_count == 1 and not r.whole_gpus and share_prices(ctx.workload) is not None:
            return self.kept_price_cpu_bound * POINTS * TIGHT
        return self.kept_price_cpu_bound * TIE_WEIGHT * 0.25 / MILLI_PER_GPU

    def notes(self, ctx: Context, node: int, gpus: list[int]) -> list[str]:
        """Why the node: the share's priced loss on its GPU, and how many nodes were kept for multi-GPU pods."""
        out: list[str] = []
        r, prices = ctx.request, share_prices(ctx.workload)
        if prices is not None and r.wants_gpu and r.gpu_count == 1 and not r.whole_gpus and gpus:
            free = int(ctx.snapshot.gpu_milli_free[node, gpus[0]])
            loss = float(prices.loss(np.array([free], dtype=np.int64), r.gpu_milli)[0])
            out.append(
                f"fgd-priced: the share costs {prices.size_value(r.gpu_milli):.0f} milli of a GPU's worth; GPU "
                f"{gpus[0]} had {free} milli free and loses {loss:.0f} more"
            )
        if self._kept and self._priced:
            out.append(
                f"fgd-priced: {self._kept} nodes kept free for multi-GPU pods cost {self.kept_price_cpu_bound:g} milli "
                "of a GPU's worth more (free CPU runs out first)"
            )
        elif self._kept:
            out.append(f"fgd-priced: {self._kept} nodes kept free for multi-GPU pods came last")
        if self._freed:
            out.append(
                f"fgd-priced: {self._freed} nodes kept free for multi-GPU pods competed on score: free CPU runs out "
                "first and every other node would be left short of CPU for its GPUs"
            )
        if self._packed:
            out.append(
                f"fgd-priced: {self._packed} nodes with every GPU free came after the broken nodes of their shape "
                "(free CPU runs out first)"
            )
        return out

    _consts = np.array([TIE_WEIGHT, STRIDE, POINTS, TIGHT])  # (`FgdScarcity._consts`)

    def _share_key(self, ctx: Context, nodes: IntArray) -> tuple[int, FloatArray]:
        """Keys 1-2 per (node, GPU), packed before fgd-scarcity's score (mode 1: FGD's points, then the tightness,
        between them, `priced_order`; mode 2, the ablation's order: key x STRIDE + score)."""
        prices = share_prices(ctx.workload)
        if prices is None:
            return 0, _NO_KEY
        free = ctx.snapshot.gpu_milli_free[nodes]
        fgd_first = self.fgd_first and self.tightest
        # With FGD's points first the tightness goes in after them (`priced_order`), so the loss key comes alone.
        tightest_key = self.tightest and not fgd_first
        if free.size and (free.min() < -1 or free.max() > MILLI_PER_GPU):  # not a snapshot's state: compute it
            key = _keys(prices, free, ctx.request.gpu_milli, tightest_key)
        else:
            # Keys 1-2 depend only on the GPU's free milli (-1 absent, 0..1000): looked up, the same floats as computed.
            key = _key_table(prices, ctx.request.gpu_milli, tightest_key)[free + 1]
        return (1 if fgd_first else 2), key


@lru_cache(maxsize=32)
def _cpu_per_gpu_milli(key: WorkloadKey) -> float | None:
    """The target workload's expected CPU milli per GPU milli over its pods with GPUs (None: it has none)."""
    with_gpus = [t for t in key.types if t.gpu_count > 0 and t.probability > 0]
    gpu = sum(t.probability * t.gpu_count * t.gpu_milli for t in with_gpus)
    return sum(t.probability * t.cpu_milli for t in with_gpus) / gpu if gpu > 0 else None


@lru_cache(maxsize=32)
def _multi_gpu_milli(key: WorkloadKey) -> float:
    """The target workload's expected GPU milli per pod in its multi-GPU types (the tail's included, as the kept
    hosts count them)."""
    types = (*key.types, *key.tail)
    return sum(t.probability * t.gpu_count * t.gpu_milli for t in types if t.gpu_count >= 2 and t.probability > 0)


def _keys(prices: SharePrices, free: IntArray, milli: int, tightest: bool) -> FloatArray:
    """Keys 1-2 (module docstring) of a share of `milli` on GPUs with `free` milli free."""
    lost = np.rint(np.minimum(prices.loss(free, milli), MILLI_PER_GPU))
    key: FloatArray = MILLI_PER_GPU - lost
    if tightest:
        key = key * (MILLI_PER_GPU + 1) + (MILLI_PER_GPU - np.clip(free, 0, MILLI_PER_GPU))
    return key


def _key_table(prices: SharePrices, milli: int, tightest: bool) -> FloatArray:
    """`_keys` for every free milli from -1 (no GPU) to 1000, at index free + 1 (elementwise maths: each entry is
    exactly the float `_keys` gives for that free milli); kept with the prices, per share size."""
    table = prices.tables.get((milli, tightest))
    if table is None:
        table = _keys(prices, np.arange(-1, MILLI_PER_GPU + 1, dtype=np.int64), milli, tightest)
        table.setflags(write=False)
        prices.tables[(milli, tightest)] = table
    return table
