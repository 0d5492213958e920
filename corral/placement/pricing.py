"""What a GPU's free room is worth to the target workload's shares: prices from the packing LP of those shares.

Shares of one GPU (one GPU, under 1000 milli) are what leave GPU capacity idle: whole GPUs fill a GPU exactly. Given
the target workload's share sizes s_i with probabilities p_i, the best any packing can do is the LP

    minimise   sum_c x_c (1000 - size(c))           x_c = GPUs packed with configuration c (a multiset of sizes
    subject to sum_c a_ic x_c = p_i   for each i                     with sum <= 1000; a_ic = copies of i in c)
               x >= 0

Its dual prices y_i give each size an *effective size* v_i = s_i + y_i: the milli of a GPU the share really costs
once the waste it causes or avoids is counted (on the openb `default` list: an 810-milli share costs the whole GPU,
650 costs 2/3, 470 a half, 320 a third, shares of 160 milli or less ride free in the residues of the 810s). No
configuration is worth more than a GPU (sum of v over c <= 1000), and the ones the optimum uses are worth exactly
that.

The value of free room u on one GPU is the unbounded knapsack over the effective sizes

    R(u) = max { sum_i k_i v_i : sum_i k_i s_i <= u }        (R(1000) = 1000 at the optimum)

and putting a share of size m on a GPU with u free costs

    loss(u, m) = R(u) - R(u - m) - v_m        >= 0

milli of the GPU's worth beyond the share's own: zero where the share completes or continues a configuration that an
optimal packing uses, positive where it spoils room that other shares would have filled better (a 320 in the 530
left beside a 470 costs 167: that room was worth a 470's half, what is left after it fits nothing). A size the
workload does not list is priced by the room it takes (v_m = R(m)).

The LP is solved by column generation: start from one share per GPU, and after each solve the knapsack above with
the current prices finds the configuration with the most negative reduced cost (1000 - R(1000)); stop when none is
below zero. The same knapsack then gives R. Everything depends only on the workload's share sizes and
probabilities, so it is computed once per workload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from corral.model.arrays import FloatArray, IntArray
from corral.model.resources import MILLI_PER_GPU
from corral.placement.workload import TargetWorkload, WorkloadKey

#: Column generation stops when no configuration improves the LP by more than this (milli per unit of demand).
_TOLERANCE = 1e-7
_MAX_ROUNDS = 500


@dataclass(frozen=True)
class SharePrices:
    """Effective sizes of the workload's share sizes and the value of free room, for u = 0..1000 milli."""

    sizes: tuple[int, ...]  # the workload's share sizes (milli), descending
    value: tuple[float, ...]  # effective size of each, same order
    room: FloatArray  # room[u] = R(u)
    #: Derived lookup tables, kept with the prices (fgd-priced's keys per share size: `scores.fgd_priced`).
    tables: dict[tuple[int, bool], FloatArray] = field(default_factory=dict, compare=False, repr=False)

    def size_value(self, milli: int) -> float:
        for s, v in zip(self.sizes, self.value, strict=True):
            if s == milli:
                return v
        return float(self.room[min(max(milli, 0), MILLI_PER_GPU)])

    def loss(self, free_milli: IntArray, milli: int) -> FloatArray:
        """loss(u, milli) for each free room u (where u < milli the share does not fit: +inf)."""
        u = np.clip(free_milli, 0, MILLI_PER_GPU)
        after = np.clip(u - milli, 0, MILLI_PER_GPU)
        out: FloatArray = np.where(
            free_milli >= milli, self.room[u] - self.room[after] - self.size_value(milli), np.inf
        )
        return np.maximum(out, 0.0)


def _knapsack(sizes: IntArray, values: FloatArray) -> tuple[FloatArray, IntArray]:
    """The unbounded knapsack of `values` with weights `sizes` (milli) for u = 0..1000: R(u), and per u the item
    that achieves it (the first of equal ones), -2 where leaving one milli unused is as good.

    Plain Python floats: a thousand steps over a handful of sizes, where numpy's per-call cost was most of the
    time (the same IEEE additions and comparisons, so the same R to the last bit; `solve_prices` runs it once per
    round of column generation, twenty or so per workload)."""
    sz = [int(x) for x in sizes]
    vals = [float(x) for x in values]
    items = list(zip(range(len(sz)), sz, vals, strict=True))
    room = [0.0] * (MILLI_PER_GPU + 1)
    last = [-1] * (MILLI_PER_GPU + 1)
    for u in range(1, MILLI_PER_GPU + 1):
        best, arg = room[u - 1], -2  # free room can always be left unused
        top, top_i = 0.0, -1  # the first largest candidate, as np.argmax picks it
        for i, size, value in items:
            if size <= u:
                c = room[u - size] + value
                if top_i < 0 or c > top:
                    top, top_i = c, i
        if top_i >= 0 and top > best:
            best, arg = top, top_i
        room[u], last[u] = best, arg
    return np.array(room, dtype=np.float64), np.array(last, dtype=np.int64)


def room_values(sizes: IntArray, values: FloatArray) -> FloatArray:
    """R(u) for u = 0..1000: the unbounded knapsack of `values` with weights `sizes` (milli)."""
    return _knapsack(sizes, values)[0]


def _best_configuration(sizes: IntArray, values: FloatArray) -> tuple[float, IntArray]:
    """The configuration of greatest total value within one GPU (the knapsack with its argmax), and that value."""
    room, last = _knapsack(sizes, values)
    counts = np.zeros(len(sizes), dtype=np.int64)
    u = MILLI_PER_GPU
    while u > 0 and last[u] != -1:
        if last[u] == -2:
            u -= 1
        else:
            counts[last[u]] += 1
            u -= int(sizes[last[u]])
    return float(room[MILLI_PER_GPU]), counts


def solve_prices(sizes: list[int], probabilities: list[float]) -> SharePrices:
    """Prices for share sizes (milli, each in 1..999) with their probabilities (any positive scale)."""
    # scipy (0.26 s to import, 1.3 s on a loaded machine) only when prices are solved: `corral serve` imports every
    # policy at its start and should answer within a second of it (issue 26, item 7), and `corral k8s scheduler`'s
    # start-up is part of its measured throughput (issue 24).
    from scipy.optimize import linprog

    order = np.argsort(-np.asarray(sizes), kind="stable")
    s = np.asarray(sizes, dtype=np.int64)[order]
    p = np.asarray(probabilities, dtype=np.float64)[order]
    p = p / p.sum()
    columns: list[IntArray] = [np.eye(len(s), dtype=np.int64)[i] for i in range(len(s))]
    values = s.astype(np.float64)
    for _ in range(_MAX_ROUNDS):
        a = np.array(columns, dtype=np.float64).T
        waste = MILLI_PER_GPU - s.astype(np.float64) @ a
        res = linprog(waste, A_eq=a, b_eq=p, bounds=(0, None), method="highs")
        if res.status != 0:  # cannot happen for a feasible, bounded LP; keep the last good prices
            break
        values = s.astype(np.float64) + np.asarray(res.eqlin.marginals, dtype=np.float64)
        best, counts = _best_configuration(s, values)
        if best <= MILLI_PER_GPU + _TOLERANCE or any((counts == c).all() for c in columns):
            break
        columns.append(counts)
    room = room_values(s, values)
    return SharePrices(tuple(int(x) for x in s), tuple(float(v) for v in values), room)


@lru_cache(maxsize=32)
def _prices_for(key: tuple[tuple[int, float], ...]) -> SharePrices | None:
    if not key:
        return None
    return solve_prices([k for k, _ in key], [p for _, p in key])


def share_prices(workload: TargetWorkload) -> SharePrices | None:
    """Prices for the workload's one-GPU shares (merged by size), or None when it has no shares."""
    return _prices_of(workload.key)


@lru_cache(maxsize=32)
def _prices_of(key: WorkloadKey) -> SharePrices | None:
    # Keyed by the workload's key (hashed once): fgd-priced asks on every share decision.
    by_size: dict[int, float] = {}
    for t in key.types:
        if t.gpu_count == 1 and 0 < t.gpu_milli < MILLI_PER_GPU and t.probability > 0:
            by_size[t.gpu_milli] = by_size.get(t.gpu_milli, 0.0) + t.probability
    return _prices_for(tuple(sorted(by_size.items())))
