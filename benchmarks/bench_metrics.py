"""What a Prometheus scrape of `corral serve` costs, and what the metric hooks add to a scheduling round.

    python -m benchmarks.bench_metrics [--jobs 0,1000,10000] [--repeat 20] [--write BENCHMARKS.md]

An 8-GPU machine over the SQLite store with 8 running jobs (seven whole GPUs and a half) and a queue of `--jobs`
waiting jobs (the request shapes of bench_queue). Timed: `render_daemon` as root sees it (per-job series included),
which reads the queue and the running jobs from the store and computes the fragmentation; and, for comparison, the
daemon's steady round over the same queue (its metric hooks are one counter increment per round, per start and
per end, so they are part of that figure).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.bench_engine import cpu_name, emit, memory_gib
from benchmarks.bench_queue import queue
from corral.daemon.core import Daemon
from corral.executor.fake import FakeExecutor
from corral.jobs.model import JobSpec
from corral.metrics import render_daemon
from corral.model.resources import GpuBehavior, GpuDevice, Node, Request
from corral.placement import PlacementConfig
from corral.store import SqliteStore


def measure(waiting: int, repeat: int) -> tuple[float, float, float, int]:
    """(median scrape ms, max scrape ms, median round ms, bytes per scrape) with `waiting` queued jobs."""
    gpus = tuple(GpuDevice(i, "A100", 81920, f"GPU-{i}") for i in range(8))
    box = Node("box", 128_000, 1_048_576, gpus)
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "jobs.db")
        daemon = Daemon(store, FakeExecutor(), box, PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED), Path(tmp))
        holders = [Request(cpu_milli=4000, memory_mib=8192, gpu_count=1, gpu_milli=1000)] * 7
        for r in [*holders, Request(cpu_milli=4000, memory_mib=8192, gpu_count=1, gpu_milli=500)]:
            daemon.submit(JobSpec(("true",), r, "u", 1000, 1000))
        assert len(daemon.tick() + daemon.tick()) == 8  # at most STARTS_PER_ROUND starts a round
        for job in queue(waiting, 40, 1):
            store.add(job.spec, 0.0)
        daemon.tick()  # the first round writes every waiting job's reason
        size = len(render_daemon(daemon, jobs=True))
        scrapes, rounds = [], []
        for _ in range(repeat):
            start = time.perf_counter()
            render_daemon(daemon, jobs=True)
            scrapes.append(time.perf_counter() - start)
            start = time.perf_counter()
            daemon.tick()
            rounds.append(time.perf_counter() - start)
        store.close()
    return 1000 * statistics.median(scrapes), 1000 * max(scrapes), 1000 * statistics.median(rounds), size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="0,1000,10000")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    rows = []
    for n in (int(x) for x in args.jobs.split(",")):
        scrape, worst, round_ms, size = measure(n, args.repeat)
        rows.append(f"| {n:,} | {scrape:.1f} | {worst:.1f} | {size:,} | {round_ms:.1f} |")
    load = os.getloadavg()
    text = (
        f"## corral serve: a /metrics scrape ({datetime.date.today()})\n\n"
        f"Machine: 2-core dev machine ({cpu_name()}, {os.cpu_count()} logical CPUs, {memory_gib()}), load average "
        f"{load[0]:.2f} at the end (shared with other engineers); Python {platform.python_version()}, numpy "
        f"{np.__version__}. Command: `python -m benchmarks.bench_metrics --jobs {args.jobs} --repeat {args.repeat}`. "
        "8 GPUs, 8 running jobs, the SQLite store; a scrape as root (per-job series included), and the daemon's "
        "steady round over the same queue for scale.\n\n"
        "| queued jobs | scrape median ms | scrape max ms | bytes | round median ms |\n|---:|---:|---:|---:|---:|\n"
        + "\n".join(rows)
        + "\n"
    )
    emit(text, args.write)


if __name__ == "__main__":
    main()
