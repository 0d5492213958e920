"""Durable job submissions per second at the store level (SqliteStore, WAL, synchronous=FULL, one commit per add).

    python -m benchmarks.bench_store [--adds 2000] [--write BENCHMARKS.md]

A building block of issue 4's target (300 submissions/s through the API with durable commits): the API cannot be
faster than this.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time
from pathlib import Path

from benchmarks.bench_engine import cpu_name, emit, memory_gib
from corral.jobs.model import JobSpec, JobState
from corral.model.resources import Request
from corral.store import MemoryStore, SqliteStore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adds", type=int, default=2000)
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    spec = JobSpec(
        ("python", "train.py"), Request(cpu_milli=4000, memory_mib=8192, gpu_count=1, gpu_milli=500), "u", 1000, 1000
    )
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, store in (("sqlite", SqliteStore(Path(tmp) / "jobs.db")), ("memory", MemoryStore())):
            start = time.perf_counter()
            for i in range(args.adds):
                store.add(spec, float(i))
            rates[f"{name} add"] = args.adds / (time.perf_counter() - start)
            start = time.perf_counter()
            for i in range(1, args.adds + 1):
                store.transition(str(i), JobState.STARTING, expect=[JobState.QUEUED])
            rates[f"{name} transition"] = args.adds / (time.perf_counter() - start)
            store.close()
    text = (
        f"## corral serve: job store ({datetime.date.today()})\n\n"
        f"Machine: {cpu_name()}, {os.cpu_count()} logical CPUs, {memory_gib()}, local disk under /tmp; Python "
        f"{platform.python_version()}. Command: `python -m benchmarks.bench_store --adds {args.adds}`. Each write is "
        "its own durable transaction (SQLite WAL, synchronous=FULL: one fdatasync per commit).\n\n"
        "| operation | per second |\n|---|---:|\n" + "".join(f"| {k} | {v:,.0f} |\n" for k, v in rates.items())
    )
    emit(text, args.write)


if __name__ == "__main__":
    main()
