"""One scheduling pass of `corral serve` with a long queue (issue 4 target: 10,000 queued jobs in at most 200 ms).

    python -m benchmarks.bench_queue [--jobs 10000] [--shapes 40] [--write BENCHMARKS.md]

A machine with 8 GPUs, all held but one half GPU, and a queue of waiting jobs drawn from `--shapes` distinct request
shapes (whole GPUs, shares, CPU-only): the pass must look at every job and explain why each waits.

Measured twice: the pure pass (`schedule`), and the daemon's whole round (`Daemon.tick` over the SQLite store with
a fake executor: read the queue, schedule, store every changed reason in one durable write), first round (every
reason new) and the rounds after it.

Backfill with a reservation (issue 14): the same queue behind a 4-GPU head on a machine whose 8 GPUs are held by
jobs with time limits (distinct expected ends), two of them free: the pass books the head's reservation, then checks
every job that fits now against it (those that run past its start placed on the reservation's view, and on what is
free now only where they do not fit there), with the jobs' own time limits drawn from a few values.

Queues and fair share (issue 14): the backfill case with its jobs spread over 40 users in 4 queues (a guarantee, a
limit, a per-user limit, weights), a usage history of 2,000 finished jobs in the fair-share ledger: the pass orders
the queue by priority, then each (queue, user) account's projected weighted share, then age (`fair_order`), checks
every job's queue, user and group limits and borrowing (`quota.Gate`, once per account and shape between starts),
books the head's reservation and backfills. Measured cold (the first pass after a start or a reload: every job's
offer is built) and warm (the offers of unchanged jobs are kept across rounds, as the shapes are).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.bench_engine import cpu_name, emit, memory_gib
from corral.daemon.core import Daemon
from corral.daemon.queues import Queues
from corral.daemon.scheduler import ShapeCache, schedule
from corral.executor.fake import FakeExecutor
from corral.jobs.model import Job, JobSpec, JobState
from corral.model.resources import Allocation, GpuBehavior, GpuDevice, GpuGrant, Node, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig
from corral.store import SqliteStore
from corral.tenancy.config import parse_queues


def machine() -> ClusterSnapshot:
    gpus = tuple(GpuDevice(i, "A100", 81920, f"GPU-{i}") for i in range(8))
    snap = ClusterSnapshot([Node("box", 128_000, 1_048_576, gpus)])
    for i in range(8):
        milli = 500 if i == 7 else 1000
        mem = 0 if milli < 1000 else 81920
        snap.allocate(Allocation(f"held-{i}", "box", 0, 4000, 8192, (GpuGrant(i, milli, mem),), 1))
    return snap


def queue(n: int, shapes: int, seed: int) -> list[Job]:
    rng = np.random.default_rng(seed)
    kinds = []
    for k in range(shapes):
        cpu = 1000 * (1 + k % 8)
        if k % 4 == 0:
            kinds.append(Request(cpu_milli=cpu, memory_mib=4096, gpu_count=1 + k % 3, gpu_milli=1000))
        elif k % 4 == 1:
            kinds.append(Request(cpu_milli=cpu, memory_mib=4096, gpu_count=1, gpu_milli=600 + (7 * k) % 390))
        elif k % 4 == 2:
            kinds.append(Request(cpu_milli=cpu, memory_mib=4096, gpu_count=1, gpu_memory_mib=60_000 + k))
        else:
            kinds.append(Request(cpu_milli=200_000 + cpu, memory_mib=4096))  # more CPU than the machine has free
    return [
        Job(str(i + 1), JobSpec(("true",), kinds[int(rng.integers(shapes))], "u", 1000, 1000), JobState.QUEUED, i)
        for i in range(n)
    ]


def backfill_machine() -> tuple[ClusterSnapshot, dict[str, float]]:
    """8 GPUs: six held by one-GPU jobs that end at 100, 200, ... s, two free; their expected ends."""
    gpus = tuple(GpuDevice(i, "A100", 81920, f"GPU-{i}") for i in range(8))
    snap = ClusterSnapshot([Node("box", 128_000, 1_048_576, gpus)])
    ends = {}
    for i in range(6):
        snap.allocate(Allocation(f"held-{i}", "box", 0, 4000, 8192, (GpuGrant(i, 1000, 81920),), 1))
        ends[f"held-{i}"] = 100.0 * (i + 1)
    return snap, ends


def backfill_queue(n: int, shapes: int, seed: int) -> list[Job]:
    """A 4-GPU head, then `queue(n - 1, shapes)` with time limits of 30 s, 10 min, 2 h or none."""
    big = Request(cpu_milli=8000, memory_mib=4096, gpu_count=4, gpu_milli=1000)
    head = Job("0", JobSpec(("big",), big, "u", 1000, 1000), JobState.QUEUED, -1.0)
    rng = np.random.default_rng(seed + 1)
    limits = (30.0, 600.0, 7200.0, None)
    rest = [
        replace(j, spec=replace(j.spec, time_limit_s=limits[int(rng.integers(len(limits)))]))
        for j in queue(n - 1, shapes, seed)
    ]
    return [head, *rest]


def daemon_rounds(jobs: list[Job], repeat: int, queues: str | None = None) -> tuple[float, list[float]]:
    """Seconds of the daemon's first round over the queue, and of the `repeat` rounds after it (`queues`: a queues
    file's text: fair share and limits on)."""
    gpus = tuple(GpuDevice(i, "A100", 81920, f"GPU-{i}") for i in range(8))
    box = Node("box", 128_000, 1_048_576, gpus)
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "jobs.db")
        q = Queues(box, parse_queues(queues, "bench")) if queues is not None else None
        config = PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)
        daemon = Daemon(store, FakeExecutor(), box, config, Path(tmp), queues=q)
        holders = [Request(cpu_milli=4000, memory_mib=8192, gpu_count=1, gpu_milli=1000)] * 7
        for r in [*holders, Request(cpu_milli=4000, memory_mib=8192, gpu_count=1, gpu_milli=500)]:
            daemon.submit(JobSpec(("true",), r, "u", 1000, 1000))
        assert len(daemon.tick()) + len(daemon.tick()) == 8  # at most STARTS_PER_ROUND a round
        for job in jobs:
            store.add(job.spec, 0.0)
        start = time.perf_counter()
        daemon.tick()
        first = time.perf_counter() - start
        steady = []
        cpu = []
        for _ in range(repeat):
            start, began = time.perf_counter(), time.process_time()
            daemon.tick()
            steady.append(time.perf_counter() - start)
            cpu.append(time.process_time() - began)
        print(f"daemon round{' with queues' if queues else ''}: CPU time median {1000 * statistics.median(cpu):.1f} ms")
        store.close()
    return first, steady


QUEUES = """
half_life = "7d"
[queues.train]
weight = 3
guarantee = { gpus = 4 }
limit = { gpus = 8 }
[queues.train.users."*"]
limit = { gpus = 4 }
[queues.dev]
guarantee = { gpus = 2 }
limit = { gpus = 4, cpus = 64 }
[queues.batch]
weight = 0.5
[queues.default]
"""


def queues_case(n: int, shapes: int, repeat: int) -> tuple[list[float], list[float], list[float], int, int]:
    """Pass times with queues and fair share over the backfill case: cold (offers built), warm (kept), and warm with
    the daemon's cap of 4 starts; the starts and the jobs held back by a limit of the uncapped pass."""
    names = ("train", "dev", "batch", "default")
    jobs = [
        replace(j, spec=replace(j.spec, user=f"u{i % 40}", uid=2000 + i % 40, queue=names[(i % 40) % 4]))
        for i, j in enumerate(backfill_queue(n, shapes, 1))
    ]
    snap, ends = backfill_machine()
    node = Node("box", 128_000, 1_048_576, tuple(GpuDevice(i, "A100", 81920, f"GPU-{i}") for i in range(8)))
    qconfig = parse_queues(QUEUES, "bench")
    q = Queues(node, qconfig)
    for k in range(2000):  # a history: 2,000 finished jobs of the 40 users over the last two weeks
        start = -14 * 86400 + k * 600.0
        q.ledger.record(("user", names[k % 4], f"u{k % 40}"), q.capacity / 8, start, start + 1800 + 60 * (k % 7))
    config = PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)
    cold: list[float] = []
    warm: list[float] = []
    capped: list[float] = []
    cpu_times: dict[int, list[float]] = {id(cold): [], id(warm): [], id(capped): []}
    for _ in range(repeat):
        cache = ShapeCache()
        ledger, q = q.ledger, Queues(node, qconfig)  # a fresh daemon's: no offers kept yet
        q.ledger = ledger
        for out, cap in ((cold, None), (warm, None), (capped, 4)):
            s, e = snap.copy(), dict(ends)
            start, cpu = time.perf_counter(), time.process_time()
            rq = q.round(jobs, [], s, 0.0, 3600.0)
            plan = schedule(s, jobs, config, now=0.0, ends=e, cache=cache, queues=rq, max_starts=cap)
            out.append(time.perf_counter() - start)
            cpu_times[id(out)].append(time.process_time() - cpu)
            if cap is None:
                starts, limited = len(plan.starts), len(q.limited)
    assert plan.reservation is not None
    for name, out in (("cold", cold), ("warm", warm), ("warm, capped", capped)):  # the CPU it took, beside the clock
        print(f"queues pass {name}: CPU time median {1000 * statistics.median(cpu_times[id(out)]):.1f} ms")
    return cold, warm, capped, starts, limited


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--shapes", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    jobs = queue(args.jobs, args.shapes, 1)
    config = PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)
    times = []
    for _ in range(args.repeat):
        snap = machine()
        start = time.perf_counter()
        plan = schedule(snap, jobs, config, now=1e9)
        times.append(time.perf_counter() - start)
    first, steady = daemon_rounds(jobs, args.repeat)
    backlog = backfill_queue(args.jobs, args.shapes, 1)
    bf_times: list[float] = []
    bf_capped: list[float] = []
    for cap, out in ((None, bf_times), (4, bf_capped)):
        for _ in range(args.repeat):
            snap, ends = backfill_machine()
            start = time.perf_counter()
            bf = schedule(snap, backlog, config, now=0.0, ends=ends, max_starts=cap)
            out.append(time.perf_counter() - start)
            if cap is None:
                bf_plan = bf
    assert bf_plan.reservation is not None and bf_plan.reservation.job_id == "0"
    q_cold, q_warm, q_capped, q_starts, q_limited = queues_case(args.jobs, args.shapes, args.repeat)
    names = ("train", "dev", "batch", "default")
    spread = [
        replace(j, spec=replace(j.spec, user=f"u{i % 40}", uid=2000 + i % 40, queue=names[(i % 40) % 4]))
        for i, j in enumerate(jobs)
    ]
    q_first, q_steady = daemon_rounds(spread, args.repeat, QUEUES)
    delayed = sum(1 for r in bf_plan.waiting.values() if r.startswith("would delay"))
    text = (
        f"## corral serve: one scheduling pass ({datetime.date.today()})\n\n"
        f"Machine: {cpu_name()}, {os.cpu_count()} logical CPUs, {memory_gib()}; Python {platform.python_version()}, "
        f"numpy {np.__version__}. Command: `python -m benchmarks.bench_queue --jobs {args.jobs} --shapes "
        f"{args.shapes}`. {args.jobs:,} queued jobs of {args.shapes} request shapes on an 8-GPU machine with half a "
        f"GPU free: {len(plan.starts)} started, {len(plan.waiting):,} explained waits. Pass time over "
        f"{args.repeat} runs: median {1000 * statistics.median(times):.1f} ms, max {1000 * max(times):.1f} ms "
        "(target: at most 200 ms). The daemon's whole round over the SQLite store (queue read, pass, reasons stored "
        f"in one durable write): first round {1000 * first:.0f} ms (all {args.jobs:,} reasons written), then median "
        f"{1000 * statistics.median(steady):.1f} ms, max {1000 * max(steady):.1f} ms.\n\n"
        f"Backfill with a reservation (issue 14): the same {args.jobs:,} jobs behind a 4-GPU head, time limits of "
        "30 s, 10 min, 2 h or none, on the 8-GPU machine with six GPUs held by jobs ending at 100..600 s: the "
        f"head reserved GPUs {', '.join(map(str, bf_plan.reservation.allocation.gpu_indices))} from "
        f"{bf_plan.reservation.start:.0f} s, {len(bf_plan.starts)} started (backfill), {delayed:,} held back as they "
        f"would delay it, {bf_plan.placements} placements. Pass time over {args.repeat} runs: median "
        f"{1000 * statistics.median(bf_times):.1f} ms, max {1000 * max(bf_times):.1f} ms; with the daemon's cap of 4 "
        f"starts a round: median {1000 * statistics.median(bf_capped):.1f} ms, max {1000 * max(bf_capped):.1f} ms "
        "(target: at most 200 ms).\n\n"
        f"Queues and fair share: the backfill case over 40 users in 4 queues with limits and a ledger of 2,000 "
        f"finished jobs: {q_starts} started, {q_limited} held back by a limit. Pass time (order, limits, "
        f"reservation, backfill) over {args.repeat} runs: cold (offers built) median "
        f"{1000 * statistics.median(q_cold):.1f} ms, max {1000 * max(q_cold):.1f} ms; warm median "
        f"{1000 * statistics.median(q_warm):.1f} ms, max {1000 * max(q_warm):.1f} ms; warm with the daemon's cap of "
        f"4 starts median {1000 * statistics.median(q_capped):.1f} ms, max {1000 * max(q_capped):.1f} ms (target: "
        "at most 200 ms). The daemon's whole round with queues on over the SQLite store (the first case's jobs "
        f"spread the same way): first round {1000 * q_first:.0f} ms, then median "
        f"{1000 * statistics.median(q_steady):.1f} ms, max {1000 * max(q_steady):.1f} ms.\n"
    )
    emit(text, args.write)


if __name__ == "__main__":
    main()
