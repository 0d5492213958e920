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

    resource LP   offline, and a true upper bound for every policy (issue 16): the LP relaxation of placing the
                  pods arrived by then on the cluster's node types (`resource_lp`), counting CPU, memory, GPU
                  milli, GPU models, and whole GPUs against shares too big to share a GPU with q others

Prints allocation % at the moment arrived demand first reaches 100 % of capacity, per seed and the mean.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.beyond_fgd import DEFAULT_TRACES, arrivals_for, seeds_of
from corral.model.resources import MILLI_PER_GPU, Node, Request
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


def arrived_pods(requests: list[Request], gpus: int) -> list[Request]:
    """The pods arrived by the moment arrived GPU demand reaches 100 % of capacity (as `arrived_shares`)."""
    out, arrived = [], 0
    for r in requests:
        arrived += r.gpu_demand_milli
        if arrived > gpus * MILLI_PER_GPU:
            break
        out.append(r)
    return out


def _best_config(sizes: list[int], values: np.ndarray) -> tuple[float, list[int]]:
    """Unbounded knapsack of one GPU (sizes in milli, multiples of STEP): the most valuable multiset and its value."""
    best = np.zeros(BINS + 1)
    take = np.full(BINS + 1, -1)
    for u in range(1, BINS + 1):
        best[u], take[u] = best[u - 1], -1
        for i, size in enumerate(sizes):
            w = size // STEP
            if w <= u and best[u - w] + values[i] > best[u] + 1e-12:
                best[u], take[u] = best[u - w] + values[i], i
    counts = [0] * len(sizes)
    u = BINS
    while u > 0:
        if take[u] < 0:
            u -= 1
        else:
            counts[int(take[u])] += 1
            u -= sizes[int(take[u])] // STEP
    return float(best[BINS]), counts


def resource_lp(nodes: list[Node], requests: list[Request]) -> float:
    """Upper bound on allocation % at arrived 100 %: an LP relaxation over node types that no policy can beat.

    x_jk >= 0 pods of class j (same CPU, memory, GPU count, milli and allowed models) on nodes of type k (same CPU,
    memory, GPU count and model) where one fits; y_ck >= 0 GPUs of type k packed with share configuration c (a
    multiset of share sizes within 1000 milli); N_k nodes of type k with G_k GPUs each:

        maximise    sum_jk d_j x_jk                                       d_j: GPU milli of one pod of j
        subject to  sum_k x_jk <= n_j                                     (pods of j arrived by 100 %)
                    sum_j cpu_j x_jk <= N_k cpu_k,   memory alike         (per node type)
                    sum_c y_ck + sum_(whole j) count_j x_jk <= N_k G_k    (GPUs)
                    sum_(shares j of size s) x_jk <= sum_c a_sc y_ck      (shares ride in configurations)

    The configurations are generated as needed (column generation: per node type, the knapsack over the share
    sizes with the link constraints' dual prices finds the configuration worth more than a GPU's dual; stop when
    none is). CPU, memory and GPUs are fractional within a type, so this bounds every policy from above; the gap to
    a policy is the most that placement could still gain, not a target.
    """
    from scipy.optimize import linprog
    from scipy.sparse import lil_matrix

    gpus = sum(len(n.gpus) for n in nodes)
    types: Counter[tuple[int, int, int, str]] = Counter(
        (n.cpu_milli, n.memory_mib, len(n.gpus), n.gpus[0].model if n.gpus else "") for n in nodes
    )
    kinds = list(types)
    classes: Counter[tuple[int, int, int, int, frozenset[str] | None]] = Counter(
        (r.cpu_milli, r.memory_mib, r.gpu_count, r.gpu_milli, r.gpu_models) for r in requests
    )
    cls = list(classes)
    sizes = sorted({c[3] for c in cls if c[2] == 1 and c[3] < MILLI_PER_GPU})
    size_row = {m: i for i, m in enumerate(sizes)}
    x_vars = [
        (j, k)
        for j, (cpu, mem, count, _milli, models) in enumerate(cls)
        for k, (kcpu, kmem, kgpus, model) in enumerate(kinds)
        if cpu <= kcpu and mem <= kmem and count <= kgpus and (models is None or count == 0 or model in models)
    ]
    per_kind = 3 + len(sizes)  # cpu, memory, GPUs, one link row per share size
    rows = len(cls) + len(kinds) * per_kind
    b = np.zeros(rows)
    for j, c in enumerate(cls):
        b[j] = classes[c]
    for k, (kcpu, kmem, kgpus, _model) in enumerate(kinds):
        base = len(cls) + per_kind * k
        b[base : base + 3] = [types[kinds[k]] * kcpu, types[kinds[k]] * kmem, types[kinds[k]] * kgpus]
    configs: list[tuple[int, tuple[int, ...]]] = [
        (k, tuple(int(i == s) for i in range(len(sizes))))
        for k in range(len(kinds))
        if kinds[k][2]
        for s in range(len(sizes))
    ]
    demand = [float(c[2] * c[3]) for c in cls]
    for _ in range(200):
        a = lil_matrix((rows, len(x_vars) + len(configs)))
        for v, (j, k) in enumerate(x_vars):
            cpu, mem, count, milli, _ = cls[j]
            base = len(cls) + per_kind * k
            a[j, v] = 1.0
            a[base, v], a[base + 1, v] = cpu, mem
            if count and milli == MILLI_PER_GPU:
                a[base + 2, v] = count
            elif count == 1 and milli < MILLI_PER_GPU:
                a[base + 3 + size_row[milli], v] = 1.0
        for v, (k, counts) in enumerate(configs, start=len(x_vars)):
            base = len(cls) + per_kind * k
            a[base + 2, v] = 1.0
            for i, n in enumerate(counts):
                if n:
                    a[base + 3 + i, v] = -float(n)
        cost = -np.array([demand[j] for j, _ in x_vars] + [0.0] * len(configs))
        res = linprog(cost, A_ub=a.tocsr(), b_ub=b, bounds=(0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(f"resource LP failed: {res.message}")
        dual = -np.asarray(res.ineqlin.marginals)
        added = 0
        for k in range(len(kinds)):
            if not kinds[k][2] or not sizes:
                continue
            base = len(cls) + per_kind * k
            value, best = _best_config(sizes, dual[base + 3 : base + 3 + len(sizes)])
            if value > dual[base + 2] + 1e-7 and (k, tuple(best)) not in configs:
                configs.append((k, tuple(best)))
                added += 1
        if not added:
            break
    return 100.0 * float(-res.fun) / (gpus * MILLI_PER_GPU)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--lists", default="default")
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--only-resource-lp", action="store_true", help="compute the resource LP bound only")
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
        rows: dict[str, list[float]] = {
            "resource LP": [],
            "offline FFD": [],
            "offline LP": [],
            **{k: [] for k in choosers},
        }
        for seed in seeds_of(args.seeds):
            arrivals, _ = arrivals_for(args.traces, nodes, pods, pod_list, seed)
            rows["resource LP"].append(resource_lp(nodes, arrived_pods(arrivals.requests, gpus)))
            if args.only_resource_lp:
                continue
            rows["offline FFD"].append(offline_ffd(arrivals.requests, gpus))
            rows["offline LP"].append(offline_lp(arrivals.requests, gpus))
            for name, choose in choosers.items():
                rows[name].append(online(arrivals.requests, gpus, choose))
        for name, values in rows.items():
            if not values:
                continue
            cells = " ".join(f"{v:.2f}" for v in values)
            print(f"{pod_list:10s} {name:12s} mean {np.mean(values):.2f}  per seed: {cells}", flush=True)


if __name__ == "__main__":
    main()
