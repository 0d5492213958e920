"""How far any placement could get at arrived 100 %: the GPU-only packing of the shares that arrive by then.

    python -m benchmarks.share_bound [--traces DIR] [--lists default] [--seeds 42-51]

At arrived 100 % the allocation is 100 % minus the GPU demand that failed so far, and that equals the idle GPU milli
at that moment. Whole GPUs fill a GPU exactly; only shares (one GPU, < 1000 milli) leave idle residues. This script
drops nodes, CPU and memory altogether (a GPU is a bin of 1000 milli; k-GPU pods take k empty bins) and replays the
same arrival order (exact order files where they exist). Each rule's number shows how far that rule gets on GPU
packing alone; on the real cluster CPU, memory and node boundaries strand more (these are rules, not optima, so
none of them bounds every policy):

    offline FFD   all shares arrived by 100 %, packed first-fit decreasing (offline, knows the whole list)
    offline LP    the same shares packed optimally, LP relaxation (`corral.placement.pricing.solve_prices` on
                  their counts: the waste is sum_i n_i (v_i - s_i)); every share placed, so online rules that let
                  wasteful late shares fail can beat it
    best fit      online: each share to the fitting bin with the least free milli
    fgd per GPU   online: each share to the bin where FGD's per-GPU fragmentation u x P(size > u) grows least
                  (unrounded; sizes and P from the target workload's GPU types)
    one-step      online: each share to the bin where the expected leftover after one more target pod,
                  w(u) = sum_m P(m) (u if m > u else u - m), grows least
    priced        online: each share to the bin of least loss(u, m) under the share-packing LP's dual prices
                  (`corral.placement.pricing`), the tightest on ties: fgd-priced's GPU rule without nodes

Prints allocation % at the moment arrived demand first reaches 100 % of capacity, per seed and the mean.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.beyond_fgd import DEFAULT_TRACES, arrivals_for, seeds_of
from corral.model.resources import MILLI_PER_GPU, Request
from corral.placement.pricing import SharePrices, share_prices, solve_prices
from corral.placement.workload import TargetWorkload
from corral.sim.openb import load_nodes, load_pods, target_workload

STEP = 10  # every size in the openb lists is a multiple of 10 milli
BINS = MILLI_PER_GPU // STEP
Chooser = Callable[[list[int], int], int]  # (fitting free sizes with a bin, share size) -> free size to use


def _size_probabilities(workload: TargetWorkload) -> np.ndarray:
    p = np.zeros(BINS + 1)
    for t in workload.types:
        if t.gpu_count:
            p[t.gpu_milli // STEP] += t.probability * (t.gpu_count if t.gpu_milli == MILLI_PER_GPU else 1)
    out: np.ndarray = p / p.sum()
    return out


def online(requests: list[Request], gpus: int, choose: Chooser) -> float:
    free = np.zeros(BINS + 1, dtype=np.int64)  # free[u] = bins with u x STEP milli free
    free[BINS] = gpus
    arrived = allocated = 0
    for r in requests:
        arrived += r.gpu_demand_milli
        if r.gpu_count and (r.gpu_count > 1 or r.gpu_milli == MILLI_PER_GPU):
            if free[BINS] >= r.gpu_count:
                free[BINS] -= r.gpu_count
                allocated += r.gpu_demand_milli
        elif r.gpu_count:
            m = r.gpu_milli // STEP
            fits = [u for u in range(m, BINS + 1) if free[u]]
            if fits:
                u = choose(fits, m)
                free[u] -= 1
                free[u - m] += 1
                allocated += r.gpu_demand_milli
        if arrived >= gpus * MILLI_PER_GPU:
            break
    return 100.0 * allocated / (gpus * MILLI_PER_GPU)


def by_cost(cost: np.ndarray) -> Chooser:
    """The fitting free size where cost[free after] - cost[free before] is least (the tightest on ties)."""
    return lambda fits, m: min(fits, key=lambda free: (cost[free - m] - cost[free], free))


def by_price(prices: SharePrices) -> Chooser:
    """The fitting free size of least loss under the share prices (rounded to whole milli), the tightest on ties."""

    def choose(fits: list[int], m: int) -> int:
        losses = prices.loss(np.array(fits, dtype=np.int64) * STEP, m * STEP)
        return int(min(zip(np.rint(losses).tolist(), fits, strict=True))[1])

    return choose


def arrived_shares(requests: list[Request], gpus: int) -> list[int]:
    shares, arrived = [], 0
    for r in requests:
        arrived += r.gpu_demand_milli
        if arrived > gpus * MILLI_PER_GPU:
            break
        if r.gpu_count == 1 and r.gpu_milli < MILLI_PER_GPU:
            shares.append(r.gpu_milli)
    return shares


def offline_lp(requests: list[Request], gpus: int) -> float:
    counts = Counter(arrived_shares(requests, gpus))
    prices = solve_prices(list(counts), [float(n) for n in counts.values()])
    waste = sum(counts[s] * (v - s) for s, v in zip(prices.sizes, prices.value, strict=True))
    return 100.0 - 100.0 * waste / (gpus * MILLI_PER_GPU)


def offline_ffd(requests: list[Request], gpus: int) -> float:
    shares = arrived_shares(requests, gpus)
    room: Counter[int] = Counter()  # free milli -> open bins
    for x in sorted(shares, reverse=True):
        fit = min((u for u in room if u >= x and room[u]), default=None)  # the first bin that fits, by size
        if fit is None:
            room[MILLI_PER_GPU - x] += 1
        else:
            room[fit] -= 1
            room[fit - x] += 1
    return 100.0 - 100.0 * sum(u * n for u, n in room.items()) / (gpus * MILLI_PER_GPU)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--lists", default="default")
    ap.add_argument("--seeds", default="42-51")
    args = ap.parse_args()
    nodes = load_nodes(args.traces / "openb_node_list_gpu_node.csv")
    gpus = sum(len(n.gpus) for n in nodes)
    for pod_list in args.lists.split(","):
        pods = load_pods(args.traces / f"openb_pod_list_{pod_list}.csv")
        workload = target_workload(pods)
        p = _size_probabilities(workload)
        sizes = np.arange(BINS + 1)
        above = np.array([p[k + 1 :].sum() for k in sizes])
        one_step = np.array([k * above[k] + sum(p[m] * (k - m) for m in range(1, k + 1)) for k in sizes])
        choosers: dict[str, Chooser] = {
            "best fit": lambda fits, m: fits[0],
            "fgd per GPU": by_cost(sizes * above),
            "one-step": by_cost(one_step),
        }
        prices = share_prices(workload)
        if prices is not None:
            choosers["priced"] = by_price(prices)
        rows: dict[str, list[float]] = {"offline FFD": [], "offline LP": [], **{k: [] for k in choosers}}
        for seed in seeds_of(args.seeds):
            arrivals, _ = arrivals_for(args.traces, nodes, pods, pod_list, seed)
            rows["offline FFD"].append(offline_ffd(arrivals.requests, gpus))
            rows["offline LP"].append(offline_lp(arrivals.requests, gpus))
            for name, choose in choosers.items():
                rows[name].append(online(arrivals.requests, gpus, choose))
        for name, values in rows.items():
            cells = " ".join(f"{v:.2f}" for v in values)
            print(f"{pod_list:10s} {name:12s} mean {np.mean(values):.2f}  per seed: {cells}", flush=True)


if __name__ == "__main__":
    main()
