"""What the fairness report measures, from a `FairResult`.

    JCT (job completion time)  = completion - arrival                       (jobs that finished)
    wait                       = JCT - duration: time not spent in the run that finished (queueing, and runs that
                                 preemption threw away)
    size buckets               cpu (no GPU) | <1 GPU (a share) | 1 GPU | 2-4 GPUs | 8 GPUs (5 or more)
    contended window           [first arrival, last sample with a job queued]: where policies can differ; its
                               length is when the queue last empties
    GPU allocation             the step function allocated(t), its time-weighted mean over the contended window,
                               and over [first arrival, last arrival] (the same window for every policy) (%)

Jain's fairness index over users' dominant shares, in the contended window:

    s_u(t)  = dominant share of the cluster user u holds at t (max over GPU, GPU memory, CPU, memory of held/capacity)
    d_u(t)  = ... of what u holds plus what it has queued (capped at 1): its demand
    e_u(t)  = max-min fair (water-filling) split of sum_u s_u(t) over the demands d_u(t): what u would hold if what
              was allocated at t had been shared out fairly, no user given more than it asked for
    x_u     = integral of s_u / integral of e_u                              (users with integral e_u > 0)
    J       = (sum x_u)^2 / (n * sum x_u^2)         1 = every user got its fair part; 1/n = one user got everything

The entitlement is what was really allocated, not the capacity: fragmentation is placement's business, fairness
is how the allocation was split. A light user served at once and a heavy user given the rest both score 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from corral.model.arrays import FloatArray
from corral.model.resources import MILLI_PER_GPU, Request
from corral.sim.fair.replay import FairResult

BUCKETS = ("cpu", "<1 GPU", "1 GPU", "2-4 GPUs", "8 GPUs")


def bucket(request: Request) -> str:
    if not request.wants_gpu:
        return "cpu"
    if request.gpu_count == 1:
        return "1 GPU" if request.gpu_milli == MILLI_PER_GPU else "<1 GPU"
    return "2-4 GPUs" if request.gpu_count <= 4 else "8 GPUs"


def jain(values: Sequence[float] | FloatArray) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2); NaN for no values, 1 when all are 0."""
    x = np.asarray(values, dtype=np.float64)
    if not len(x):
        return math.nan
    squares = float(np.dot(x, x))
    if squares == 0:
        return 1.0
    return float(x.sum() ** 2 / (len(x) * squares))


def waterfill(demands: FloatArray, total: float) -> FloatArray:
    """Max-min fair split of `total` over `demands`: each gets min(demand, level), the level chosen so the parts
    add up to min(total, sum of demands)."""
    d = np.maximum(np.asarray(demands, dtype=np.float64), 0.0)
    if total >= d.sum():
        return d.copy()
    order = np.sort(d)
    left = float(total)
    level = 0.0
    for i, v in enumerate(order):
        share = left / (len(order) - i)
        if v >= share:
            level = share
            break
        left -= v
    else:
        level = float(order[-1]) if len(order) else 0.0
    out: FloatArray = np.minimum(d, level)
    return out


def _widths(times: FloatArray, start: float, end: float) -> FloatArray:
    """How long each sample's value holds inside [start, end] (sample i holds until sample i+1)."""
    if not len(times):
        return np.zeros(0)
    nxt = np.append(times[1:], end)
    lo = np.clip(times, start, end)
    hi = np.clip(nxt, start, end)
    out: FloatArray = np.maximum(hi - lo, 0.0)
    return out


def window(r: FairResult) -> tuple[float, float]:
    """The contended window: the first arrival to the last sample with a job queued (empty: none ever waited)."""
    if not len(r.times):
        return 0.0, 0.0
    t0 = float(min(j.arrival for j in r.jobs))
    waiting = np.nonzero(r.queued > 0)[0]
    if not len(waiting):
        return t0, t0
    last = int(waiting[-1])
    t1 = float(r.times[last + 1]) if last + 1 < len(r.times) else float(r.times[last])
    return t0, t1


def user_service(r: FairResult) -> tuple[FloatArray, FloatArray]:
    """Per user: the integral of s_u and of e_u over the contended window (share-seconds)."""
    t0, t1 = window(r)
    w = _widths(r.times, t0, t1)
    got = (r.held_share * w[:, None]).sum(axis=0) if len(w) else np.zeros(len(r.users))
    due = np.zeros(len(r.users))
    for i in np.nonzero(w > 0)[0]:
        due += waterfill(r.demand_share[i], float(r.held_share[i].sum())) * w[i]
    return got, due


def fairness(r: FairResult) -> tuple[float, FloatArray]:
    """Jain's index over x_u = received / fair (see the module doc) and the x_u (NaN where a user was due nothing)."""
    got, due = user_service(r)
    x = np.where(due > 0, got / np.where(due > 0, due, 1.0), np.nan)
    present = x[~np.isnan(x)]
    return (jain(present) if len(present) else math.nan), x


def alloc_mean_pct(r: FairResult, start: float, end: float) -> float:
    w = _widths(r.times, start, end)
    span = end - start
    if span <= 0 or not r.capacity_milli:
        return math.nan
    return 100.0 * float(np.dot(r.allocated_milli.astype(np.float64), w)) / span / r.capacity_milli


def allocated_area(r: FairResult) -> float:
    """GPU milli-seconds under the allocation curve, from the first sample to the last."""
    if not len(r.times):
        return 0.0
    w = _widths(r.times, float(r.times[0]), float(r.times[-1]))
    return float(np.dot(r.allocated_milli.astype(np.float64), w))


def _pct(values: FloatArray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


def summarize(r: FairResult) -> dict[str, Any]:
    """One row of the comparison table (keys carry their unit: _s, _pct, _h)."""
    arrival = np.array([j.arrival for j in r.jobs], dtype=np.float64)
    duration = np.array([j.duration for j in r.jobs], dtype=np.float64)
    buckets = np.array([bucket(j.request) for j in r.jobs])
    finished = ~np.isnan(r.completion)
    jct = r.completion - arrival
    wait = jct - duration
    t0, t1 = window(r)
    index, _ = fairness(r)
    row: dict[str, Any] = {
        "policy": r.policy,
        "jobs": len(r.jobs),
        "finished": int(finished.sum()),
        "rejected": int(r.rejected.sum()),
        "unfinished": int((~finished & (r.rejected == 0)).sum()),
        "contended_s": t1 - t0,
        "alloc_mean_pct": alloc_mean_pct(r, t0, t1),
        # the same window for every policy: while work arrives
        "alloc_arriving_pct": alloc_mean_pct(r, t0, float(max(j.arrival for j in r.jobs))) if r.jobs else math.nan,
        "jain": index,
        "preemptions": r.preemptions,
        "wasted_gpu_h": float(r.lost_gpu_milli_s.sum()) / MILLI_PER_GPU / 3600.0,
        "wait_p50_s": _pct(wait[finished], 50),
        "wait_p99_s": _pct(wait[finished], 99),
    }
    for b in BUCKETS:
        sel = finished & (buckets == b)
        row[f"jct_p50_{b}_s"] = _pct(jct[sel], 50)
        row[f"jct_p99_{b}_s"] = _pct(jct[sel], 99)
    largest = max((j.request.gpu_count for j in r.jobs), default=0)
    big = finished & np.array([j.request.gpu_count == largest for j in r.jobs], dtype=np.bool_)
    row["largest_gpus"] = largest
    row["largest_wait_max_s"] = float(wait[big].max()) if big.any() else math.nan
    row["rounds"] = r.rounds
    row["wall_s"] = r.wall_seconds
    return row


def per_bucket(r: FairResult) -> dict[str, dict[str, float]]:
    """JCT p50/p99 (s) and count per size bucket: for the plot."""
    arrival = np.array([j.arrival for j in r.jobs], dtype=np.float64)
    buckets = np.array([bucket(j.request) for j in r.jobs])
    finished = ~np.isnan(r.completion)
    jct = r.completion - arrival
    out = {}
    for b in BUCKETS:
        sel = finished & (buckets == b)
        out[b] = {"p50": _pct(jct[sel], 50), "p99": _pct(jct[sel], 99), "count": float(sel.sum())}
    return out
