"""One machine, 8 GPUs with shares: which placement policy should `corral serve` start with (issue 16)?

    python -m benchmarks.one_node [--seeds 42-61] [--pods 400] [--load 1.0] [--source default]
                                  [--policies binpack,spread,fgd,fgd-priced,fgd-priced@default] [--keep DIR]

On one node the node choice is trivial; a policy differs only in which GPU a share goes to, and that decides
whether a later whole-GPU pod finds an empty GPU or waits. Per seed:

    node    the first 8-GPU row of openb's node list of --node-model (G2: 96 cores, 384 GiB, the most common one)
    pods    --pods drawn without replacement from the openb pod list --source among the pods that fit that node and
            ask for a share of one GPU or 1-2 whole GPUs, with their real run times (deletion - creation), each
            clipped at --max-runtime (a lab server's time limit; the trace's longest runs for 145 days)
    arrive  a Poisson process whose rate makes the offered GPU load --load x the node's 8 GPUs:
            rate = load x 8000 milli / mean(GPU milli x run time) of the drawn pods; arrivals are whole seconds

Each policy replays the same pods with `corral.sim.online.run_online` and the PlacementConfig `corral sim run
--online` builds (`--keep DIR` writes DIR/node.csv and DIR/pods-<seed>.csv so that command replays them as is). A
policy `NAME@default` runs NAME with the engine's DEFAULT_WORKLOAD instead of the pod list's target workload: what
`corral serve` and the Kubernetes extender feed the engine, as neither knows its future pods.

Columns, means over seeds (waits in seconds): pods that waited, mean / p99 / max wait of all pods, mean wait of
whole-GPU pods and of shares, mean GPU allocation from the first arrival until the last pod started (the contended
window: a policy that packs better keeps more of the GPUs busy while others wait), time the last pod started, and
the policy's mean wait minus the first policy's (binpack by default), paired by seed, as mean ± 2 standard errors,
and on how many seeds it is below / equal to / above.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.beyond_fgd import DEFAULT_TRACES
from corral.cli.sim import parse_seeds as sim_seeds
from corral.model.errors import InvalidRequest
from corral.model.inventory import load_inventory
from corral.model.resources import MILLI_PER_GPU, GpuBehavior
from corral.placement import PlacementConfig, get_policy
from corral.sim.online import OnlineResult, run_online
from corral.sim.openb import TracePod, target_workload
from corral.sim.pods import load_pod_file

POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "creation_time", "deletion_time")
DEFAULT_POLICIES = "binpack,spread,fgd,fgd-priced,fgd-priced@default"


def node_row(node_csv: Path, model: str) -> dict[str, str]:
    """The first 8-GPU node of `model` in an openb node list."""
    with node_csv.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["gpu"] == "8" and row["model"] == model:
                return row
    raise SystemExit(f"{node_csv}: no 8-GPU node of model {model!r}")


def eligible(pod_csv: Path, node: dict[str, str]) -> list[dict[str, str]]:
    """Pods with times that fit the node and ask for a share of one GPU or 1-2 whole GPUs."""
    cpu, mem = int(node["cpu_milli"]), int(node["memory_mib"])
    out = []
    with pod_csv.open(newline="") as fh:
        for r in csv.DictReader(fh):
            count, milli = int(r["num_gpu"]), int(r["gpu_milli"])
            share = count == 1 and 0 < milli < MILLI_PER_GPU
            whole = count in (1, 2) and milli == MILLI_PER_GPU
            fits = int(r["cpu_milli"]) <= cpu and int(r["memory_mib"]) <= mem
            timed = bool(r.get("creation_time") and r.get("deletion_time"))
            if (share or whole) and fits and timed and not (r.get("gpu_spec") or "").strip():
                out.append(r)
    return out


def draw(rows: Sequence[dict[str, str]], n: int, load: float, max_runtime: int, seed: int) -> list[dict[str, str]]:
    """n pods with real (clipped) run times, arriving as a Poisson process of offered GPU load `load` x 8 GPUs."""
    rng = np.random.default_rng(seed)
    picked = [rows[int(i)] for i in rng.choice(len(rows), size=min(n, len(rows)), replace=False)]
    runtimes = [min(int(r["deletion_time"]) - int(r["creation_time"]), max_runtime) for r in picked]
    demand = [int(r["num_gpu"]) * int(r["gpu_milli"]) for r in picked]
    work = float(np.mean([d * t for d, t in zip(demand, runtimes, strict=True)]))  # milli-seconds per pod
    rate = load * 8 * MILLI_PER_GPU / max(work, 1.0)  # pods per second
    arrivals = np.floor(np.cumsum(rng.exponential(1.0 / rate, size=len(picked)))).astype(np.int64)
    out = []
    for i, (r, t, a) in enumerate(zip(picked, runtimes, arrivals.tolist(), strict=True)):
        out.append(
            {
                "name": f"p{i:04d}-{r['name']}",  # arrival position first: ties at one second keep the draw's order
                "cpu_milli": r["cpu_milli"],
                "memory_mib": r["memory_mib"],
                "num_gpu": r["num_gpu"],
                "gpu_milli": r["gpu_milli"],
                "gpu_spec": "",
                "creation_time": str(a),
                "deletion_time": str(a + t),
            }
        )
    return out


def write_csv(path: Path, columns: Sequence[str], rows: Sequence[dict[str, str]]) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


@dataclass(frozen=True)
class Run:
    label: str
    seed: int
    result: OnlineResult
    whole_wait: float  # mean wait of pods asking for whole GPUs
    share_wait: float  # mean wait of pods asking for a share
    last_start: float
    alloc_contended: float  # mean GPU allocation % from the first arrival until the last start


def replay(node_csv: Path, pod_csv: Path, label: str, seed: int) -> Run:
    """One policy over one pod list, as `corral sim run --online --policy NAME` replays it."""
    name, _, workload = label.partition("@")
    nodes = load_inventory(node_csv)
    pods: list[TracePod] = load_pod_file(pod_csv)
    config = PlacementConfig(
        policy=name,
        gpu_behavior=GpuBehavior.UNRESTRICTED,  # `corral sim run`'s default; no pod here is without GPUs
        workload=None if workload == "default" else target_workload(pods),
    )
    result = run_online(nodes, pods, config, seed)
    whole = {p.name for p in pods if p.request.whole_gpus}
    waits: dict[bool, list[int]] = {True: [], False: []}
    last = 0.0
    for e in result.events:
        if e.kind == "start" and e.wait_s is not None:
            waits[e.pod in whole].append(e.wait_s)
            last = max(last, float(e.time))
    return Run(
        label,
        seed,
        result,
        float(np.mean(waits[True])) if waits[True] else 0.0,
        float(np.mean(waits[False])) if waits[False] else 0.0,
        last,
        result.alloc_mean_pct(last),
    )


def parse_seeds(text: str) -> list[int]:
    """`corral sim`'s --seeds rule ('42-61' or '42,43'), as argparse's error."""
    try:
        return sim_seeds(text)
    except InvalidRequest as e:
        raise argparse.ArgumentTypeError(e.message) from None


def parse_policies(text: str) -> list[str]:
    labels = [p.strip() for p in text.split(",") if p.strip()]
    for label in labels:
        name, at, workload = label.partition("@")
        try:
            get_policy(name)
        except InvalidRequest as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if at and workload != "default":
            raise argparse.ArgumentTypeError(f"{label}: the only suffix is @default (the engine's DEFAULT_WORKLOAD)")
    if not labels:
        raise argparse.ArgumentTypeError("expected at least one policy")
    return labels


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def table(runs: Sequence[Run], labels: Sequence[str], seeds: Sequence[int]) -> str:
    by = {(r.label, r.seed): r for r in runs}
    base = labels[0]
    head = (
        "| policy | pods placed | pods that waited | mean wait (s) | p99 wait (s) | max wait (s) | mean wait, whole "
        "GPUs (s) | mean wait, shares (s) | GPU allocation until the last start (%) | last start (s) | "
        f"mean wait - {base}'s (s; mean ± 2 s.e. over seeds) | seeds below / level / above {base} |"
    )
    lines = [head, "|---|" + "---:|" * 11]
    for label in labels:
        rs = [by[(label, s)] for s in seeds]
        sums = [r.result.summary() for r in rs]

        def mean(key: str, sums: list[dict[str, float | int]] = sums) -> float:
            return float(np.mean([float(s[key]) for s in sums]))

        placed = mean("placed")
        pods = mean("pods")
        cmp = [
            (by[(label, s)].result.summary()["delay_mean_s"], by[(base, s)].result.summary()["delay_mean_s"])
            for s in seeds
        ]
        below = sum(a < b - 1e-9 for a, b in cmp)
        above = sum(a > b + 1e-9 for a, b in cmp)
        diff = np.array([a - b for a, b in cmp], dtype=np.float64)
        spread = 2 * float(diff.std(ddof=1)) / math.sqrt(len(diff)) if len(diff) > 1 else 0.0
        lines.append(
            f"| {label} | {placed:,.0f} / {pods:,.0f} | {mean('delayed_pods'):.1f} | {mean('delay_mean_s'):,.0f} | "
            f"{mean('delay_p99_s'):,.0f} | {mean('delay_max_s'):,.0f} | {np.mean([r.whole_wait for r in rs]):,.0f} | "
            f"{np.mean([r.share_wait for r in rs]):,.0f} | {np.mean([r.alloc_contended for r in rs]):.2f} | "
            f"{np.mean([r.last_start for r in rs]):,.0f} | "
            + (
                "- | -"
                if label == base
                else f"{diff.mean():+,.0f} ± {spread:,.0f} | {below} / {len(seeds) - below - above} / {above}"
            )
            + " |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.one_node", description=__doc__.splitlines()[0])
    p.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="folder of the openb node and pod lists")
    p.add_argument("--source", default="default", help="pod list to draw from: openb_pod_list_<SOURCE>.csv")
    p.add_argument("--node-model", default="G2", help="GPU model of the 8-GPU node")
    p.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-61"))
    p.add_argument("--pods", type=positive_int, default=400, help="pods per seed")
    p.add_argument("--load", type=positive_float, default=1.0, help="offered GPU load, x the node's 8 GPUs")
    p.add_argument("--max-runtime", type=positive_int, default=6 * 3600, help="run times clipped here (s)")
    p.add_argument("--policies", type=parse_policies, default=parse_policies(DEFAULT_POLICIES))
    p.add_argument("--keep", type=Path, help="write node.csv and pods-<seed>.csv here for `corral sim run --online`")
    p.add_argument("--csv", type=Path, help="write one row per policy and seed here")
    args = p.parse_args(argv)
    node = node_row(args.traces / "openb_node_list_gpu_node.csv", args.node_model)
    rows = eligible(args.traces / f"openb_pod_list_{args.source}.csv", node)
    if not rows:
        raise SystemExit(f"no pod of {args.source} fits one {args.node_model} node")
    started = time.perf_counter()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        node_csv = write_csv(folder / "node.csv", ("sn", "cpu_milli", "memory_mib", "gpu", "model"), [node])
        for seed in args.seeds:
            pod_csv = write_csv(
                folder / f"pods-{seed}.csv", POD_COLUMNS, draw(rows, args.pods, args.load, args.max_runtime, seed)
            )
            for label in args.policies:
                runs.append(replay(node_csv, pod_csv, label, seed))
    if args.csv:
        with args.csv.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["policy", "seed", *runs[0].result.summary(), "whole_wait_s", "share_wait_s", "last_start_s",
                        "alloc_contended_pct"])  # fmt: skip
            for r in runs:
                w.writerow([r.label, r.seed, *r.result.summary().values(), r.whole_wait, r.share_wait, r.last_start,
                            r.alloc_contended])  # fmt: skip
    print(
        f"one {args.node_model} node ({node['sn']}: {int(node['cpu_milli']) // 1000} cores, "
        f"{int(node['memory_mib']) // 1024} GiB, 8 GPUs); {args.pods} pods per seed from {args.source} "
        f"({len(rows)} eligible), offered GPU load {args.load:g}x, run times clipped at {args.max_runtime} s; "
        f"seeds {','.join(map(str, args.seeds))}; {time.perf_counter() - started:.1f} s wall"
    )
    print(table(runs, args.policies, args.seeds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
