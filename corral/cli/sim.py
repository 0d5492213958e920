"""`corral sim`: replay traces through the placement engine and compare policies.

corral sim run    --nodes N.csv --pods P.csv --policy fgd --seed 42 --tune 1.3 --out DIR [--order FILE]
corral sim run    --online --policy fgd,bestfit ...             real arrival and departure times, pending queue
corral sim matrix --nodes N.csv --pods A.csv --pods B.csv --policies ... --seeds 42-51 --published E.csv --out DIR
corral sim fair   --nodes N.csv --pods P.csv --users 50 --time-compression 4000 --out DIR   queue policies with users
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from multiprocessing import Pool
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from corral.model.errors import InvalidRequest
from corral.model.inventory import load_inventory
from corral.model.resources import GpuBehavior, Node
from corral.placement import get_policy
from corral.sim.experiment import atomic_dir, run_experiment, write_run
from corral.sim.openb import TracePod, load_order
from corral.sim.pods import check_models, load_pod_file

app = typer.Typer(no_args_is_help=True, help="Replay cluster traces through the placement engine.")
out = Console(stderr=True, soft_wrap=True)

#: Policy names as the FGD study's result files spell them.
STUDY_NAMES = {
    "random": "Random",
    "dotprod": "DotProd",
    "gpu-clustering": "GpuClustering",
    "gpu-packing": "GpuPacking",
    "bestfit": "BestFit",
    "fgd": "FGD",
}
STUDY_POLICIES = ("random", "dotprod", "gpu-clustering", "gpu-packing", "bestfit", "fgd")


def fail(message: str) -> typer.Exit:
    out.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(2)


def parse_seeds(text: str) -> list[int]:
    """'42-51' or '42,43,50'."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("-")
            seeds.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    except ValueError:
        raise InvalidRequest("--seeds", f"expected e.g. 42-51 or 42,43, got {text!r}") from None
    if not seeds:
        raise InvalidRequest("--seeds", "no seeds given")
    return seeds


def parse_list(text: str, option: str) -> list[str]:
    items = [p.strip() for p in text.split(",") if p.strip()]
    if not items:
        raise InvalidRequest(option, "give at least one name")
    return items


def check_ratio(value: float, option: str, what: str) -> float:
    """A finite ratio > 0, checked before any file is read or any progress bar is drawn."""
    if not math.isfinite(value) or value <= 0:
        raise InvalidRequest(option, f"must be a positive {what}, got {value}")
    return value


def check_seed(value: int, option: str = "--seed") -> int:
    if value < 0:  # numpy's generators take no negative seed; say so before any work starts
        raise InvalidRequest(option, f"must be 0 or more, got {value}")
    return value


def check_out(out_dir: Path) -> Path:
    """Refuse an --out that cannot become a folder now, not after the replay (atomic_dir checks again at the end)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InvalidRequest("--out", f"{out_dir} exists and is not a folder")
    return out_dir


def load_inputs(nodes_path: Path, pods_path: Path) -> tuple[list[Node], list[TracePod]]:
    if not nodes_path.is_file():
        raise InvalidRequest(str(nodes_path), "no such file")
    nodes = load_inventory(nodes_path)
    pods = load_pod_file(pods_path)
    check_models(pods_path, pods, nodes)
    return nodes, pods


def progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=out
    )


@app.command("run")
def run_cmd(
    nodes: Annotated[Path, typer.Option(help="Nodes: openb node CSV or corral YAML/JSON.")],
    pods: Annotated[Path, typer.Option(help="Pods: openb pod CSV or corral YAML/JSON.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the results (written only when complete).")],
    policy: Annotated[str, typer.Option(help="Policy; with --online a comma list to compare.")] = "fgd-priced",
    seed: Annotated[int, typer.Option(help="Seed of the shuffle, tuning and tie-break ranks.")] = 42,
    tune: Annotated[float, typer.Option(help="Tune the arriving GPU demand to this x GPU capacity.")] = 1.3,
    order: Annotated[Path | None, typer.Option(help="Replay this exact order file instead of drawing one.")] = None,
    behavior: Annotated[str, typer.Option(help="GPU scheduling behaviour for pods without GPUs.")] = "unrestricted",
    online: Annotated[bool, typer.Option(help="Real creation/deletion times with departures and a queue.")] = False,
    time_compression: Annotated[
        float, typer.Option(help="--online: arrivals this many times denser, runtimes unchanged.")
    ] = 1.0,
) -> None:
    """Replay one experiment and write events.csv, curves.csv, summary.json, plots and report.html."""
    try:
        check_ratio(tune, "--tune", "ratio of GPU capacity")
        check_ratio(time_compression, "--time-compression", "factor (arrivals this many times denser)")
        check_seed(seed)
        check_out(out_dir)
        if online and order is not None:
            raise InvalidRequest(
                "--order", "an arrival order replays the offline study; --online uses the trace's own times"
            )
        mode = GpuBehavior.parse(behavior, "--behavior")
        policies = parse_list(policy, "--policy")
        for p in policies:
            get_policy(p)
        if len(policies) > 1 and not online:
            raise InvalidRequest("--policy", "several policies only with --online; use `corral sim matrix` otherwise")
        node_list, pod_list = load_inputs(nodes, pods)
        exact = load_order(order) if order else None
        if online:
            from corral.sim.online import compress_time

            if time_compression != 1.0:
                pod_list = compress_time(pod_list, time_compression)
            label = pods.stem if time_compression == 1.0 else f"{pods.stem}, arrivals {time_compression:g}x denser"
            run_online_cmd(node_list, pod_list, policies, mode, seed, out_dir, label)
            return
        with progress_bar() as bar:
            task = bar.add_task(f"{pods.stem} {policies[0]} seed {seed}", total=None)
            result = run_experiment(
                node_list,
                pod_list,
                policies[0],
                seed,
                tune,
                exact,
                mode,
                lambda done, total: bar.update(task, completed=done, total=total),
                pods.stem,
            )
        with atomic_dir(out_dir) as tmp:
            write_run(tmp, result, f"corral sim: {pods.stem}, {policies[0]}, seed {seed}")
    except InvalidRequest as exc:
        raise fail(str(exc)) from None
    s = result.summary
    out.print(
        f"{s['pods']} pods, {s['failed_pods']} failed; GPU allocation {s['alloc_at_100']} % at 100 % arrived, "
        f"{s['alloc_at_130']} % at 130 %; fragmentation {s['frag_at_100']} % at 100 %; "
        f"{s['wall_seconds']} s -> {out_dir}",
        highlight=False,
    )


def run_online_cmd(
    nodes: list[Node],
    pods: list[TracePod],
    policies: list[str],
    mode: GpuBehavior,
    seed: int,
    out_dir: Path,
    label: str,
) -> None:
    from corral.placement import PlacementConfig
    from corral.sim.online import OnlineResult, run_online, write_curves, write_events
    from corral.sim.openb import target_workload
    from corral.sim.report import write_online_report

    summaries: dict[str, dict[str, Any]] = {}
    series: dict[str, tuple[Sequence[float], Sequence[float]]] = {}
    results: dict[str, OnlineResult] = {}
    with progress_bar() as bar:
        for p in policies:
            task = bar.add_task(f"{label} {p} online", total=None)
            config = PlacementConfig(policy=p, gpu_behavior=mode, workload=target_workload(pods))

            def tick(done: int, total: int, task: TaskID = task) -> None:
                bar.update(task, completed=done, total=total)

            result = run_online(nodes, pods, config, seed, tick)
            results[p] = result
            summaries[p] = dict(result.summary())
            pct = 100.0 * result.allocated_milli / max(result.capacity_milli, 1)
            series[p] = (result.times.tolist(), pct.tolist())
    with atomic_dir(out_dir) as tmp:
        (tmp / "summary.json").write_text(json.dumps(summaries, indent=2) + "\n")
        write_events(tmp / "events.csv", results)
        write_curves(tmp / "curves.csv", results)
        ends = [r.arrivals_end for r in results.values() if r.arrivals_end == r.arrivals_end]
        write_online_report(tmp, summaries, series, f"corral sim online: {label}", max(ends) if ends else None)
    out.print(f"-> {out_dir} (events.csv, curves.csv, summary.json, online.png, online.html)", highlight=False)
    for p, s in summaries.items():
        out.print(
            f"{p}: {s['placed']}/{s['pods']} pods placed, {s['rejected']} rejected, {s['never_placed']} never "
            f"started; {s['delayed_pods']} pods waited (mean {s['delay_mean_s']:.2f} s, p99 {s['delay_p99_s']:.0f} s, "
            f"max {s['delay_max_s']:.0f} s); GPU allocation peak {s['alloc_peak_pct']:.1f} %, mean while work "
            f"arrives {s['alloc_mean_arrivals_pct']:.2f} %",
            highlight=False,
        )


# ---------------------------------------------------------------------------------------------------- fair
@app.command("fair")
def fair_cmd(
    nodes: Annotated[Path, typer.Option(help="Nodes: openb node CSV or corral YAML/JSON.")],
    pods: Annotated[Path, typer.Option(help="Pods with creation and deletion times (openb pod CSV).")],
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the report (written only when complete).")],
    policies: Annotated[
        str, typer.Option(help="Queue policies to compare (comma list).")
    ] = "fifo,fifo-backfill,fair-backfill,fair-backfill-preempt",
    placement: Annotated[str, typer.Option(help="Placement policy of the engine, the same for all.")] = "fgd",
    users: Annotated[int, typer.Option(help="Users the pods are drawn among.")] = 50,
    zipf: Annotated[float, typer.Option(help="Zipf exponent of the users' draw: P(rank k) ~ 1/k^zipf.")] = 1.1,
    overestimate: Annotated[
        float, typer.Option(help="Time limit = run time x U(1, this): what backfill plans with (1 = exact).")
    ] = 2.0,
    half_life: Annotated[float, typer.Option(help="Half-life of fair share's decayed usage (s).")] = 3600.0,
    round_s: Annotated[float, typer.Option("--round", help="Seconds between rounds (0: after every event).")] = 30.0,
    time_compression: Annotated[float, typer.Option(help="Arrivals this many times denser, runtimes unchanged.")] = 1.0,
    limit: Annotated[int, typer.Option(help="Replay only the first N pods by creation time (0: all).")] = 0,
    node_stride: Annotated[int, typer.Option(help="Keep every Nth node of the node file (a smaller cluster).")] = 1,
    behavior: Annotated[str, typer.Option(help="GPU scheduling behaviour for pods without GPUs.")] = "unrestricted",
    seed: Annotated[int, typer.Option(help="Seed of the users' draw, time limits and tie-breaks.")] = 42,
) -> None:
    """Compare queue policies on a trace with users: GPU allocation, JCT by size, waits, fairness, preemption."""
    from corral.sim.fair.replay import check_policy, check_round
    from corral.sim.fair.workload import check_users

    try:
        names = parse_list(policies, "--policies")
        for name in names:
            check_policy(name)
        if len(set(names)) != len(names):
            raise InvalidRequest("--policies", f"names a policy twice: {policies}")
        get_policy(placement)
        check_users(users, zipf, overestimate)
        check_ratio(half_life, "--half-life", "number of seconds")
        check_round(round_s)
        check_ratio(time_compression, "--time-compression", "factor (arrivals this many times denser)")
        if limit < 0:
            raise InvalidRequest("--limit", f"must be 0 (all pods) or more, got {limit}")
        if node_stride < 1:
            raise InvalidRequest("--node-stride", f"must be 1 (every node) or more, got {node_stride}")
        check_seed(seed)
        check_out(out_dir)
        mode = GpuBehavior.parse(behavior, "--behavior")
        node_list, pod_list = load_inputs(nodes, pods)
        run_fair_cmd(
            node_list[::node_stride], pod_list, names, placement, mode, users, zipf, overestimate, half_life,
            round_s, time_compression, limit, seed, out_dir, pods.stem, node_stride,
        )  # fmt: skip
    except InvalidRequest as exc:
        raise fail(str(exc)) from None


def run_fair_cmd(
    nodes: list[Node],
    pods: list[TracePod],
    names: list[str],
    placement: str,
    mode: GpuBehavior,
    users: int,
    zipf: float,
    overestimate: float,
    half_life: float,
    round_s: float,
    compression: float,
    limit: int,
    seed: int,
    out_dir: Path,
    label: str,
    stride: int,
) -> None:
    from corral.placement import PlacementConfig
    from corral.sim.fair.replay import FairResult, run_fair
    from corral.sim.fair.report import markdown, write_report
    from corral.sim.fair.workload import make_jobs, offered_load
    from corral.sim.online import compress_time
    from corral.sim.openb import target_workload

    if limit:
        pods = sorted(pods, key=lambda p: (p.creation_time or 0, p.name))[:limit]
    if compression != 1.0:
        pods = compress_time(pods, compression)
    jobs = make_jobs(pods, users, zipf, overestimate, seed)
    config = PlacementConfig(policy=placement, gpu_behavior=mode, workload=target_workload(pods))
    capacity = sum(len(n.gpus) for n in nodes) * 1000
    load = offered_load(jobs, capacity)
    results: dict[str, FairResult] = {}
    with progress_bar() as bar:
        for name in names:
            task = bar.add_task(f"{label} {name}", total=None)

            def tick(done: int, total: int, task: TaskID = task) -> None:
                bar.update(task, completed=done, total=total)

            results[name] = run_fair(nodes, jobs, name, config, half_life, round_s, seed, tick)
    settings = {
        "pods": f"{label} ({len(jobs)} pods)",
        "nodes": f"{len(nodes)} nodes (every {stride}), {capacity // 1000} GPUs",
        "offered GPU load (while arriving)": round(load, 3),
        "users": f"{users}, Zipf exponent {zipf}",
        "time limits": f"run time x U(1, {overestimate})",
        "arrivals": f"{compression:g}x denser",
        "round every (s)": round_s,
        "fair-share half-life (s)": half_life,
        "placement": placement,
        "seed": seed,
    }
    title = f"corral sim fair: {label}"
    with atomic_dir(out_dir) as tmp:
        rows = write_report(tmp, results, settings, title)
    out.print(f"offered GPU load {load:.2f} x capacity; -> {out_dir} (fairness.html, .csv, .json, .md, jobs.csv)")
    typer.echo(markdown(rows))


# ---------------------------------------------------------------------------------------------------- matrix
_CACHE: dict[tuple[str, str], tuple[list[Node], list[TracePod]]] = {}


def _matrix_task(args: tuple[str, str, str, str, int, float]) -> dict[str, Any]:
    nodes_path, pods_path, policy, behavior, seed, tune = args
    key = (nodes_path, pods_path)
    if key not in _CACHE:
        _CACHE[key] = load_inputs(Path(nodes_path), Path(pods_path))
    nodes, pods = _CACHE[key]
    result = run_experiment(nodes, pods, policy, seed, tune, None, GpuBehavior(behavior), None, Path(pods_path).stem)
    return result.summary


def read_published(path: Path) -> dict[tuple[str, str], dict[str, float]]:
    """expected_results.csv of the FGD study: (pod list, policy) -> its columns."""
    table: dict[tuple[str, str], dict[str, float]] = {}
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        need = {"workload", "policy", "alloc_at_100_mean"}
        if not reader.fieldnames or not need <= set(reader.fieldnames):
            raise InvalidRequest(str(path), f"expected columns {', '.join(sorted(need))}")
        for line, row in enumerate(reader, 2):
            try:
                table[(row["workload"], row["policy"])] = {
                    k: float(v) for k, v in row.items() if k not in {"workload", "policy"} and v not in (None, "")
                }
            except ValueError as exc:
                raise InvalidRequest(f"{path}:{line}", f"not a number: {exc}") from None
    return table


MATRIX_COLUMNS = [
    "pod_list",
    "policy",
    "behavior",
    "seeds",
    "alloc_at_100_mean",
    "alloc_at_100_std",
    "alloc_at_100_min",
    "alloc_at_100_max",
    "published_alloc_at_100",
    "diff_alloc_at_100",
    "alloc_at_130_mean",
    "published_alloc_at_130",
    "frag_at_100_mean",
    "published_frag_at_100",
    "failed_pods_without_gpu_mean",
    "wall_seconds_mean",
]


def aggregate(
    summaries: list[dict[str, Any]], published: dict[tuple[str, str], dict[str, float]]
) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for s in summaries:
        groups.setdefault((s["pod_list"], s["policy"], s["behavior"]), []).append(s)
    rows = []
    for (pod_list, policy, behavior), runs in groups.items():
        a100 = np.array([r["alloc_at_100"] for r in runs], dtype=np.float64)
        pub = published.get((pod_list, STUDY_NAMES.get(policy, policy)), {})
        mean = round(float(a100.mean()), 3)
        p100 = pub.get("alloc_at_100_mean")
        rows.append(
            {
                "pod_list": pod_list,
                "policy": policy,
                "behavior": behavior,
                "seeds": len(runs),
                "alloc_at_100_mean": mean,
                "alloc_at_100_std": round(float(a100.std(ddof=1)), 3) if len(runs) > 1 else 0.0,
                "alloc_at_100_min": float(a100.min()),
                "alloc_at_100_max": float(a100.max()),
                "published_alloc_at_100": p100,
                "diff_alloc_at_100": None if p100 is None else round(mean - p100, 3),
                "alloc_at_130_mean": round(float(np.mean([r["alloc_at_130"] for r in runs])), 3),
                "published_alloc_at_130": pub.get("alloc_at_130_final_mean"),
                "frag_at_100_mean": round(float(np.mean([r["frag_at_100"] for r in runs])), 3),
                "published_frag_at_100": pub.get("frag_at_100_mean"),
                "failed_pods_without_gpu_mean": round(float(np.mean([r["failed_pods_without_gpu"] for r in runs])), 1),
                "wall_seconds_mean": round(float(np.mean([r["wall_seconds"] for r in runs])), 2),
            }
        )
    return rows


@app.command("matrix")
def matrix_cmd(
    nodes: Annotated[Path, typer.Option(help="Nodes: openb node CSV or corral YAML/JSON.")],
    pods: Annotated[list[Path], typer.Option(help="Pod list (repeatable).")],
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for matrix.csv/.md/.png/.html.")],
    policies: Annotated[
        str, typer.Option("--policy", "--policies", help="Comma list of policies (as `sim run --policy`).")
    ] = ",".join(STUDY_POLICIES),
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. 42-51.")] = "42-51",
    tune: Annotated[float, typer.Option(help="Tune ratio.")] = 1.3,
    behaviors: Annotated[
        str, typer.Option("--behavior", "--behaviors", help="Comma list of GPU behaviours for pods without GPUs.")
    ] = "unrestricted",
    published: Annotated[Path | None, typer.Option(help="Published results (expected_results.csv).")] = None,
    jobs: Annotated[int, typer.Option(help="Worker processes (default: all cores).")] = 0,
) -> None:
    """Run pod lists x policies x behaviours x seeds on all cores; one table of means beside published numbers."""
    try:
        names = parse_list(policies, "--policy")
        for p in names:
            get_policy(p)
        modes = [GpuBehavior.parse(b, "--behavior").value for b in parse_list(behaviors, "--behavior")]
        seed_list = parse_seeds(seeds)
        for one in seed_list:
            check_seed(one, "--seeds")
        check_ratio(tune, "--tune", "ratio of GPU capacity")
        check_out(out_dir)
        if jobs < 0:
            raise InvalidRequest("--jobs", f"must be 0 (all cores) or more, got {jobs}")
        for pod_file in pods:
            load_inputs(nodes, pod_file)  # fail fast, before any worker starts
        pub = read_published(published) if published else {}
    except InvalidRequest as exc:
        raise fail(str(exc)) from None
    tasks = [(str(nodes), str(f), name, m, s, tune) for f in pods for name in names for m in modes for s in seed_list]
    summaries: list[dict[str, Any]] = []
    with progress_bar() as bar, Pool(jobs or os.cpu_count() or 1) as pool:
        task = bar.add_task("matrix", total=len(tasks))
        for summary in pool.imap_unordered(_matrix_task, tasks):
            summaries.append(summary)
            bar.advance(task)
    rows = sorted(aggregate(summaries, pub), key=lambda r: (r["pod_list"], r["policy"], r["behavior"]))
    from corral.sim.report import matrix_markdown, write_matrix_report

    with atomic_dir(out_dir) as tmp:
        (tmp / "runs.json").write_text(
            json.dumps(sorted(summaries, key=lambda s: tuple(map(str, s.values()))), indent=1)
        )
        write_matrix_report(tmp, rows, MATRIX_COLUMNS, "corral sim matrix")
    typer.echo(matrix_markdown(rows, MATRIX_COLUMNS))
