"""The cost of choosing preemption victims (corral.daemon.preemption.choose), paid once per preemption decided.

    python -m benchmarks.bench_preempt [--repeat 7]

An 8-GPU machine fully held, three ways: 8 whole-GPU jobs (the search finds one victim among 8), 56 shares of
1/7 GPU (a whole GPU needs 7 victims: the exhaustive search runs out of its budget and the greedy pass decides), and a
head that cannot fit even with every eligible job stopped (one placement, then no preemption: the cost of every round
in which a high-priority job waits in vain).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from corral.daemon.preemption import choose
from corral.daemon.scheduler import request_of, schedule
from corral.jobs.model import Job, JobSpec, JobState
from corral.model.resources import GpuBehavior, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig
from tests.builders import cluster, node

CONFIG = PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)
NOW = 100_000.0


def held(jobs: int, milli: int, priority: int = 0) -> tuple[ClusterSnapshot, list[Job]]:
    s = cluster(node("box").gpus(8).cpu(128).mem(1024))
    running = []
    for i in range(jobs):
        req = Request(cpu_milli=100, memory_mib=64, gpu_count=1, gpu_milli=milli, priority=priority)
        queued = Job(str(i + 1), JobSpec(("x",), req, "u", 1000, 1000), JobState.QUEUED, submitted_at=0)
        plan = schedule(s, [queued], CONFIG, 0)
        assert plan.starts, plan.waiting
        grant = plan.starts[0].allocation
        running.append(replace(queued, state=JobState.RUNNING, started_at=NOW - 10 * (i + 1), gpus=grant.gpus))
    return s, running


def timed(s: ClusterSnapshot, running: list[Job], gpus: int, repeat: int) -> tuple[float, int, int]:
    req = Request(cpu_milli=100, memory_mib=64, gpu_count=gpus, gpu_milli=1000, priority=5)
    head = Job("999", JobSpec(("x",), req, "v", 1001, 1001), JobState.QUEUED, submitted_at=NOW)
    times, victims, calls = [], 0, 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        choice = choose(s, head, request_of(head), running, CONFIG, NOW)
        times.append(time.perf_counter() - t0)
        victims = 0 if choice is None else len(choice.victims)
        calls = 1 if choice is None else choice.placements  # None: the one placement with every candidate released
    return statistics.median(times), victims, calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    whole = held(8, 1000)
    shares = held(56, 142)
    half_high = held(8, 1000)
    high = [replace(j, spec=replace(j.spec, request=replace(j.spec.request, priority=9))) for j in half_high[1][:4]]
    cases = [
        ("8 whole-GPU jobs, head wants 1 GPU", whole, 1),
        ("56 shares of 1/7 GPU, head wants 1 GPU", shares, 1),
        (
            "8 whole-GPU jobs, 4 of higher priority, head wants 5 GPUs (no fit)",
            (half_high[0], high + half_high[1][4:]),
            5,
        ),
    ]
    for name, (s, running), gpus in cases:
        median, victims, calls = timed(s, running, gpus, args.repeat)
        print(f"{name}: median {1000 * median:.1f} ms over {args.repeat} runs, {victims} victims, {calls} placements")


if __name__ == "__main__":
    main()
