"""Placement engine throughput: decisions per second on a half-full cluster of 8-GPU nodes.

    .venv/bin/python -m benchmarks.bench_engine [--nodes 1000,5000,10000,50000] [--policies binpack,fgd]
        [--decisions N] [--warmup N] [--seed S] [--fill F] [--fill-shard S] [--clock wall|cpu] [--write BENCHMARKS.md]

Per cluster size and policy:

1. Build N nodes (seeded): 8 GPUs each, one model per node (A100-80GB, H100-80GB or T4-16GB, with GPU memory,
   NUMA node and PCIe switch per GPU), 64..128 cores, 512 GiB.
2. Fill it to about half of its GPU compute with a seeded mix of requests (CPU-only; 1/2/4/8 whole GPUs; one
   GPU at 100..900 milli; one GPU by memory) by `place` + `snapshot.allocate` with the policy under test.
   Filling 50 000 nodes one global decision at a time would take far longer than the measurement, so the fill
   runs shard by shard (`--fill-shard` nodes, each its own snapshot, its allocations then granted on the
   whole cluster); `--fill-shard 0` fills globally. Not timed.
3. Clear the snapshot's caches (`snapshot.memo`: FGD's per-request-shape scores, the static masks) and run
   decisions from the same mix, each timed as a whole with `time.perf_counter` (`--clock cpu`: `process_time`):
   `place(snapshot, request, config, rng)`, `snapshot.allocate(decision.allocation)` when placed and, while
   the cluster is at or above the fill level, `snapshot.release` of a random earlier allocation, so it stays
   about half full. The very first decision (cold caches) is "first ms"; then one decision of every request
   shape (each the first of its shape since the caches were cleared; "cold ms" is their mean) and `--warmup`
   random ones run untimed; the next `--decisions` give the steady-state figures.

The request stream, victims and policy randomness are seeded, so every policy sees the same requests.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import itertools
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from corral.model.arrays import FloatArray
from corral.model.errors import InvalidRequest
from corral.model.resources import MILLI_PER_GPU, GpuDevice, Node, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement.engine import PlacementConfig, place

GIB = 1024
GPUS_PER_NODE = 8
NODE_MEMORY_MIB = 512 * GIB
#: (model, GPU memory MiB, probability of a node having it)
GPU_MODELS: tuple[tuple[str, int, float], ...] = (
    ("A100-80GB", 80 * GIB, 0.40),
    ("H100-80GB", 80 * GIB, 0.35),
    ("T4-16GB", 16 * GIB, 0.25),
)
HEADING = "## Placement engine: decisions per second"


def _shapes() -> tuple[tuple[str, float, Request], ...]:
    """The request mix: (name, probability, request template without an id)."""
    out: list[tuple[str, float, Request]] = [
        ("cpu-4c", 0.10, Request(cpu_milli=4000, memory_mib=16 * GIB)),
        ("cpu-16c", 0.05, Request(cpu_milli=16000, memory_mib=64 * GIB)),
    ]
    for count, prob, cores, mem_gib in (
        (1, 0.20, 8, 64),
        (2, 0.08, 16, 128),
        (4, 0.05, 32, 192),
        (8, 0.02, 48, 256),
    ):
        out.append(
            (
                f"{count}xGPU",
                prob,
                Request(cpu_milli=cores * 1000, memory_mib=mem_gib * GIB, gpu_count=count, gpu_milli=MILLI_PER_GPU),
            )
        )
    for milli in range(100, 1000, 100):
        out.append(
            (
                f"gpu-{milli}m",
                0.40 / 9,
                Request(cpu_milli=2000, memory_mib=8 * GIB, gpu_count=1, gpu_milli=milli),
            )
        )
    for mem_gib in (4, 8):
        out.append(
            (
                f"gpu-{mem_gib}GiB",
                0.05,
                Request(cpu_milli=2000, memory_mib=8 * GIB, gpu_count=1, gpu_memory_mib=mem_gib * GIB),
            )
        )
    return tuple(out)


SHAPES = _shapes()
SHAPE_PROBS: FloatArray = np.array([p for _, p, _ in SHAPES], dtype=np.float64) / sum(p for _, p, _ in SHAPES)


# ---------------------------------------------------------------------------------------------------- cluster
def build_nodes(n: int, seed: int) -> list[Node]:
    rng = np.random.default_rng([seed, n, 1])
    model_idx = rng.choice(len(GPU_MODELS), size=n, p=[p for _, _, p in GPU_MODELS])
    cores = rng.integers(64, 129, size=n)
    nodes: list[Node] = []
    for i in range(n):
        model, mem, _ = GPU_MODELS[int(model_idx[i])]
        gpus = tuple(
            GpuDevice(index=j, model=model, memory_mib=mem, numa_node=j // 4, pcie_switch=j // 2)
            for j in range(GPUS_PER_NODE)
        )
        nodes.append(Node(f"node-{i:06d}", int(cores[i]) * 1000, NODE_MEMORY_MIB, gpus))
    return nodes


class RequestStream:
    """Seeded requests from the mix, each with a fresh id."""

    def __init__(self, seed: Sequence[int], prefix: str) -> None:
        self.rng = np.random.default_rng(list(seed))
        self.prefix = prefix
        self.count = 0

    def of_shape(self, k: int) -> Request:
        self.count += 1
        return dataclasses.replace(SHAPES[k][2], id=f"{self.prefix}{self.count}")

    def next(self) -> Request:
        return self.of_shape(int(self.rng.choice(len(SHAPES), p=SHAPE_PROBS)))


def granted_milli(snapshot: ClusterSnapshot, request_id: str) -> int:
    return sum(g.milli for g in snapshot.allocations[request_id].gpus)


def fill(snapshot: ClusterSnapshot, config: PlacementConfig, level: float, shard: int, seed: int) -> list[str]:
    """Bring `snapshot` to `level` of its GPU compute by place + allocate, shard by shard; returns the ids."""
    n = len(snapshot)
    size = n if shard <= 0 else shard
    live: list[str] = []
    for s, start in enumerate(range(0, n, size)):
        stop = min(n, start + size)
        part = snapshot if size >= n else ClusterSnapshot(snapshot.nodes[start:stop])
        stream = RequestStream([seed, n, 2, s], f"fill-{s}-")
        rng = np.random.default_rng([seed, n, 3, s])
        target = level * GPUS_PER_NODE * MILLI_PER_GPU * (stop - start)
        used = 0
        misses = 0
        while used < target and misses < 200:
            request = stream.next()
            decision = place(part, request, config, rng)
            if decision.allocation is None:
                misses += 1
                continue
            misses = 0
            part.allocate(decision.allocation)
            if part is not snapshot:
                snapshot.allocate(
                    dataclasses.replace(decision.allocation, node_index=decision.allocation.node_index + start)
                )
            used += granted_milli(part, request.id)
            live.append(request.id)
    return live


# ---------------------------------------------------------------------------------------------------- measure
@dataclass(frozen=True)
class Result:
    nodes: int
    policy: str
    times_s: FloatArray  # steady-state decisions
    first_ms: float
    cold_ms: float
    placed: float  # fraction of steady-state decisions that placed
    occupancy_before: float
    occupancy_after: float
    setup_s: float

    @property
    def per_second(self) -> float:
        return len(self.times_s) / float(self.times_s.sum())

    @property
    def mean_ms(self) -> float:
        return 1000.0 * float(self.times_s.mean())

    def percentile_ms(self, q: float) -> float:
        return 1000.0 * float(np.percentile(self.times_s, q))


def occupancy(snapshot: ClusterSnapshot) -> float:
    return snapshot.gpu_allocated_milli / (snapshot.total_gpus * MILLI_PER_GPU)


def measure(
    nodes: list[Node],
    policy: str,
    decisions: int,
    warmup: int,
    seed: int,
    level: float,
    shard: int,
    clock: Callable[[], float] = time.perf_counter,
) -> Result:
    config = PlacementConfig(policy=policy)
    t_setup = time.perf_counter()
    snapshot = ClusterSnapshot(nodes)
    live = fill(snapshot, config, level, shard, seed)
    setup_s = time.perf_counter() - t_setup
    occupancy_before = occupancy(snapshot)
    target = level * snapshot.total_gpus * MILLI_PER_GPU
    used = snapshot.gpu_allocated_milli

    stream = RequestStream([seed, 4], "r-")
    victims = np.random.default_rng([seed, 5])
    rng = np.random.default_rng([seed, 6])

    def decide(request: Request) -> tuple[float, bool]:
        """One timed decision: place, allocate, release. Bookkeeping is outside the timed span."""
        nonlocal used
        victim: str | None = None
        slot = -1
        if used >= target and live:
            slot = int(victims.integers(len(live)))
            victim = live[slot]
        victim_milli = 0 if victim is None else granted_milli(snapshot, victim)
        t0 = clock()
        decision = place(snapshot, request, config, rng)
        if decision.allocation is not None:
            snapshot.allocate(decision.allocation)
        if victim is not None:
            snapshot.release(victim)
        elapsed = clock() - t0
        if victim is not None:
            live[slot] = live[-1]
            live.pop()
            used -= victim_milli
        if decision.allocation is not None:
            live.append(request.id)
            used += sum(g.milli for g in decision.allocation.gpus)
        return elapsed, decision.allocation is not None

    snapshot.memo.clear()  # start cold: FGD's per-shape score caches and the static masks
    gc.collect()
    first_s, _ = decide(stream.next())
    cold = [decide(stream.of_shape(k))[0] for k in range(len(SHAPES))]
    for _ in range(warmup):
        decide(stream.next())
    gc.collect()
    times = np.empty(decisions, dtype=np.float64)
    placed = 0
    for i in range(decisions):
        times[i], ok = decide(stream.next())
        placed += ok
    return Result(
        nodes=len(nodes),
        policy=policy,
        times_s=times,
        first_ms=1000.0 * first_s,
        cold_ms=1000.0 * float(np.mean(cold)),
        placed=placed / max(decisions, 1),
        occupancy_before=occupancy_before,
        occupancy_after=occupancy(snapshot),
        setup_s=setup_s,
    )


# ---------------------------------------------------------------------------------------------------- report
COLUMNS = (
    "nodes",
    "policy",
    "decisions/s",
    "mean ms",
    "p50 ms",
    "p99 ms",
    "first ms",
    "cold ms",
    "placed",
    "GPU used",
)


def row(r: Result) -> tuple[str, ...]:
    return (
        f"{r.nodes:,}",
        r.policy,
        f"{r.per_second:,.0f}",
        f"{r.mean_ms:.2f}",
        f"{r.percentile_ms(50):.2f}",
        f"{r.percentile_ms(99):.2f}",
        f"{r.first_ms:.2f}",
        f"{r.cold_ms:.2f}",
        f"{100 * r.placed:.0f} %",
        f"{100 * r.occupancy_before:.0f}→{100 * r.occupancy_after:.0f} %",
    )


def text_table(results: Sequence[Result]) -> str:
    rows = [COLUMNS, *(row(r) for r in results)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(c.rjust(w) if i != 1 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(results: Sequence[Result]) -> str:
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---:" if i != 1 else "---" for i in range(len(COLUMNS))) + "|",
    ]
    lines += ["| " + " | ".join(row(r)) + " |" for r in results]
    return "\n".join(lines)


def growth(results: Sequence[Result]) -> list[str]:
    """Per policy: ms/decision ratio between consecutive sizes vs the node ratio (should be <= linear)."""
    out: list[str] = []
    for policy in dict.fromkeys(r.policy for r in results):
        mine = sorted((r for r in results if r.policy == policy), key=lambda r: r.nodes)
        steps = []
        for a, b in itertools.pairwise(mine):
            node_ratio = b.nodes / a.nodes
            ms_ratio = b.mean_ms / a.mean_ms
            verdict = (
                "sub-linear"
                if ms_ratio < 0.9 * node_ratio
                else "linear"
                if ms_ratio <= 1.1 * node_ratio
                else "WORSE than linear"
            )
            steps.append(f"{a.nodes:,}→{b.nodes:,}: nodes ×{node_ratio:.1f}, ms/decision ×{ms_ratio:.2f} ({verdict})")
        if steps:
            out.append(f"{policy}: " + "; ".join(steps))
    return out


def emit(text: str, write: Path | None) -> None:
    """Print a benchmark's Markdown section and, with --write FILE, append it to FILE (BENCHMARKS.md)."""
    sys.stdout.write(text)
    if write is not None:
        with write.open("a") as fh:
            fh.write("\n" + text)


def cpu_name() -> str:
    name = platform.processor()
    if not name or name == platform.machine():
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
    return name or platform.machine() or "unknown CPU"


def memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return "unknown memory"


def command_line(argv: Sequence[str]) -> str:
    return shlex.join(["python", "-m", "benchmarks.bench_engine", *argv])


def markdown_section(results: Sequence[Result], argv: Sequence[str], args: argparse.Namespace) -> str:
    lines = [
        HEADING,
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- machine: {cpu_name()}, {os.cpu_count()} logical CPUs, {memory_gib()}",
        f"- Python {platform.python_version()}, numpy {np.__version__}",
        f"- command: `{command_line(argv)}`",
        "- each timed decision = place + allocate + release of a random earlier allocation; "
        f"{args.decisions} timed decisions per row, after {len(SHAPES)} cold ones (one per request shape) "
        f"and {args.warmup} warm-up ones; cluster filled to {100 * args.fill:.0f} % of GPU compute "
        f"(fill shards of {args.fill_shard} nodes, not timed)",
        "- first ms: the first decision after clearing the snapshot's caches; "
        "cold ms: mean of the first decision of each request shape; GPU used: before → after the timed run",
        "",
        markdown_table(results),
        "",
    ]
    checks = growth(results)
    if checks:
        lines += ["Growth (ms/decision ratio vs node ratio; cost should grow no worse than linearly):", ""]
        lines += [f"- {c}" for c in checks]
        lines.append("")
    return "\n".join(lines)


def append_section(path: Path, section: str) -> None:
    existing = path.read_text() if path.exists() else ""
    sep = ""
    if existing and not existing.endswith("\n\n"):
        sep = "\n" if existing.endswith("\n") else "\n\n"
    with path.open("a") as fh:
        fh.write(sep + section)


def int_list(text: str) -> list[int]:
    try:
        values = [int(v.replace("_", "")) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive node counts, got {text!r}")
    return values


def name_list(text: str) -> list[str]:
    names = [v.strip().lower() for v in text.split(",") if v.strip()]
    for name in names:
        try:
            PlacementConfig(policy=name)
        except InvalidRequest as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    if not names:
        raise argparse.ArgumentTypeError("expected at least one policy")
    return names


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_engine", description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int_list, default=[1000, 5000, 10000, 50000], help="cluster sizes (comma list)")
    p.add_argument("--policies", type=name_list, default=["binpack", "fgd"], help="policies (comma list)")
    p.add_argument("--decisions", type=int, default=1000, help="timed steady-state decisions per row")
    p.add_argument("--warmup", type=int, default=50, help="untimed random decisions after the cold ones")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fill", type=float, default=0.5, help="fraction of GPU compute to allocate before timing")
    p.add_argument("--fill-shard", type=int, default=500, help="nodes per fill shard (0: fill globally)")
    p.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="time decisions by wall clock (perf_counter) or by this process's CPU time (process_time: steadier on "
        "a machine others share)",
    )
    p.add_argument("--write", type=Path, default=None, metavar="FILE", help="append a Markdown section to FILE")
    args = p.parse_args(list(argv))
    if args.decisions < 1 or args.warmup < 0 or not 0.0 <= args.fill < 1.0:
        p.error("need --decisions >= 1, --warmup >= 0 and 0 <= --fill < 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    results: list[Result] = []
    for n in args.nodes:
        t0 = time.perf_counter()
        nodes = build_nodes(n, args.seed)
        print(f"built {n:,} nodes in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        for policy in args.policies:
            clock = time.process_time if args.clock == "cpu" else time.perf_counter
            r = measure(nodes, policy, args.decisions, args.warmup, args.seed, args.fill, args.fill_shard, clock)
            print(
                f"  {policy}: setup {r.setup_s:.1f} s, {r.per_second:,.0f} decisions/s, mean {r.mean_ms:.2f} ms",
                file=sys.stderr,
                flush=True,
            )
            results.append(r)
    print(text_table(results))
    for line in growth(results):
        print(line)
    if args.write is not None:
        append_section(args.write, markdown_section(results, argv, args))
        print(f"appended to {args.write}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
