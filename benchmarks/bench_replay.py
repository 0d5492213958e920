"""Exact replay of the FGD study through the placement engine: every order file x deterministic policy.

    python -m benchmarks.bench_replay [--traces DIR] [--jobs N] [--write BENCHMARKS.md]

For each order file in DIR/orders (the authors' arrival order and node tie-break ranks) and each of bestfit,
dotprod, gpu-packing, gpu-clustering and fgd, replays the pods and compares allocation % at arrived 100 % and 130 %
with DIR/expected_per_seed.csv, and reports seconds per run.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import re
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np

from benchmarks.bench_engine import cpu_name, emit, memory_gib
from corral.sim.experiment import run_experiment
from corral.sim.openb import load_nodes, load_order, load_pods

POLICIES = ("bestfit", "dotprod", "gpu-packing", "gpu-clustering", "fgd")
DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "openb"

Row = tuple[str, str, int, float, float, float, float, float, float, float]


def run_one(args: tuple[Path, str, str, int]) -> Row:
    traces, workload, policy, seed = args
    nodes = load_nodes(traces / "openb_node_list_gpu_node.csv")
    pods = load_pods(traces / f"openb_pod_list_{workload}.csv")
    order = load_order(traces / "orders" / f"openb_pod_list_{workload}.seed{seed}.order.gz")
    start = time.perf_counter()
    summary = run_experiment(nodes, pods, policy, seed, order=order).summary
    wall = time.perf_counter() - start
    e = published(traces)[(workload, policy, seed)]
    got = (summary["alloc_at_100"], summary["alloc_at_130"], summary["frag_at_100"])
    return workload, policy, seed, *got, *e, wall


def published(traces: Path) -> dict[tuple[str, str, int], tuple[float, float, float]]:
    with (traces / "expected_per_seed.csv").open() as fh:
        return {
            (r["workload"].removeprefix("openb_pod_list_"), r["policy"], int(r["seed"])): (
                float(r["alloc_at_100"]),
                float(r["alloc_at_130"]),
                float(r["frag_at_100"]),
            )
            for r in csv.DictReader(fh)
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    jobs = []
    for f in sorted((args.traces / "orders").glob("*.order.gz")):
        m = re.match(r"openb_pod_list_(\w+)\.seed(\d+)\.order\.gz", f.name)
        if m:
            jobs += [(args.traces, m.group(1), p, int(m.group(2))) for p in POLICIES]
    start = time.perf_counter()
    with Pool(args.jobs) as pool:
        rows = pool.map(run_one, jobs)
    total = time.perf_counter() - start
    exact = sum(1 for r in rows if r[3:6] == r[6:9])
    lines = [
        f"## Exact replay of the FGD study ({datetime.date.today()})",
        "",
        f"Machine: {cpu_name()}, {os.cpu_count()} logical CPUs, {memory_gib()}; Python "
        f"{platform.python_version()}, numpy {np.__version__}. Command: `python -m benchmarks.bench_replay "
        f"--jobs {args.jobs}`; {len(rows)} runs in {total:.0f} s wall.",
        "",
        f"**{exact}/{len(rows)} runs reproduce the published allocation at 100 % and 130 % and fragmentation at "
        "100 % exactly** "
        "(to the published 2 decimals).",
        "",
        "| pod list | policy | runs | exact | mean s/run | max s/run |",
        "|---|---|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r[0], r[1]), []).append(r)
    for (w, p), rs in sorted(groups.items()):
        ok = sum(1 for r in rs if r[3:6] == r[6:9])
        walls = [r[9] for r in rs]
        lines.append(f"| {w} | {p} | {len(rs)} | {ok} | {np.mean(walls):.2f} | {max(walls):.2f} |")
    misses = [r for r in rows if r[3:6] != r[6:9]]
    if misses:
        lines += [
            "",
            "Runs that differ (pod list, policy, seed: ours vs published alloc@100 / alloc@130 / frag@100):",
            "",
        ]
        lines += [f"- {r[0]} {r[1]} {r[2]}: {r[3]} / {r[4]} / {r[5]} vs {r[6]} / {r[7]} / {r[8]}" for r in misses]
    text = "\n".join(lines) + "\n"
    emit(text, args.write)


if __name__ == "__main__":
    main()
