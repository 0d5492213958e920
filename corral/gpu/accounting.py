"""Each running job's GPU use over its life, from the daemon's samples: what `corral acct` reports as efficiency.

    every round (at most every `every_s`):
        observe(holding jobs, the latest NVML sample as attributed per GPU)
            per RUNNING job with GPUs: the mean utilisation of its GPUs, and the memory its processes hold on them
    when the job ends:
        usage_of(job) -> Usage(samples, mean utilisation, peak memory, simulated)   stored with its end

What a GPU's figures say of a job:
- utilisation is the whole GPU's (NVML has no per-process figure without accounting mode): for a share of a GPU it
  is what every share on it did together;
- memory is what the job's own processes hold (`corral.gpu.metrics.attribute`); where the driver cannot list them,
  a whole GPU's used memory counts as the job's (nobody else may use it), and a share's counts as unknown.
A sample the daemon failed to take (NVML gone) is not counted again: the same attribution is used only once.

Simulated GPUs (UUIDs starting with SIM-) have nothing to sample: their figures are made up, steady per job (from its
id) with a small wobble per sample, and the Usage says `simulated`. A simulated job that ended before its first
sample gets one made-up sample at its end, so every simulated record shows figures.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from corral.gpu.metrics import GpuUse
from corral.jobs.model import Job, JobState
from corral.jobs.usage import Usage
from corral.model.resources import GpuGrant, Node

#: How simulated GPUs' UUIDs begin (corral.gpu.simulated).
SIMULATED_PREFIX = "SIM-"


@dataclass
class _Tally:
    samples: int = 0
    util_sum: float = 0.0
    util_samples: int = 0
    peak_mib: int | None = None
    simulated: bool = False


def simulated_sample(job: Job, grants: Sequence[GpuGrant], memory_of: Mapping[int, int], n: int) -> tuple[float, int]:
    """A made-up (utilisation %, memory MiB) for sample `n` of a job on simulated GPUs: 35..90 % and 40..90 % of its
    grant's memory, fixed per job (its id), the utilisation wobbling by up to 5 points from sample to sample."""
    h = zlib.crc32(job.id.encode())
    util = 35 + h % 56 + ((h >> 8) + n * 7919) % 11 - 5
    share = (40 + (h >> 16) % 51) / 100
    memory = sum(int((g.memory_mib or memory_of.get(g.index, 0)) * share) for g in grants)
    return float(min(100, max(0, util))), memory


class UsageMeter:
    """Per running job, the sums its Usage is made of. Driven by the daemon's round, under its lock."""

    def __init__(self, node: Node, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self._memory = {d.index: d.memory_mib for d in node.gpus}
        self._simulated = {d.index for d in node.gpus if d.uuid.startswith(SIMULATED_PREFIX)}
        self._tallies: dict[str, _Tally] = {}
        self._observed_at = float("-inf")
        self._last_use: Mapping[str, GpuUse] | None = None

    def observe(self, holding: Sequence[Job], gpu_use: Mapping[str, GpuUse], now: float) -> None:
        """One sample of every running job's GPUs. `gpu_use`: the daemon's latest attribution (a new mapping per NVML
        sample: the same mapping again means no new sample, and its figures are not counted twice)."""
        if now - self._observed_at < self.every_s:
            return
        self._observed_at = now
        fresh = gpu_use is not self._last_use and bool(gpu_use)
        self._last_use = gpu_use
        live: set[str] = set()
        for job in holding:
            if job.state is not JobState.RUNNING or not job.gpus:
                continue
            live.add(job.id)
            tally = self._tallies.setdefault(job.id, _Tally())
            if all(g.index in self._simulated for g in job.gpus):
                util, memory = simulated_sample(job, job.gpus, self._memory, tally.samples)
                self._add(tally, util, memory, simulated=True)
            elif fresh:
                self._add(tally, *self._measured(job, gpu_use), simulated=False)
        for gone in [job_id for job_id in self._tallies if job_id not in live]:
            del self._tallies[gone]  # ended (its Usage was taken), or back in the queue (preempted)

    def usage_of(self, job: Job) -> Usage | None:
        """The GPU use of `job`'s attempt so far (None: it held no GPU, or no sample could say anything)."""
        if not job.gpus:
            return None
        tally = self._tallies.get(job.id)
        if (tally is None or tally.samples == 0) and all(g.index in self._simulated for g in job.gpus):
            tally = _Tally()
            self._add(tally, *simulated_sample(job, job.gpus, self._memory, 0), simulated=True)
        if tally is None or tally.samples == 0:
            return None
        util = tally.util_sum / tally.util_samples if tally.util_samples else None
        return Usage(tally.samples, None if util is None else round(util, 2), tally.peak_mib, tally.simulated)

    @staticmethod
    def _add(tally: _Tally, util: float | None, memory: int | None, *, simulated: bool) -> None:
        if util is None and memory is None:
            return
        tally.samples += 1
        tally.simulated = tally.simulated or simulated
        if util is not None:
            tally.util_sum += util
            tally.util_samples += 1
        if memory is not None:
            tally.peak_mib = memory if tally.peak_mib is None else max(tally.peak_mib, memory)

    @staticmethod
    def _measured(job: Job, gpu_use: Mapping[str, GpuUse]) -> tuple[float | None, int | None]:
        # Per GPU, not per grant: a gang's instances may hold shares of one GPU, whose figures count once.
        held: dict[str, int] = {}
        for grant, uuid in zip(job.gpus, job.gpu_uuids, strict=False):
            held[uuid] = held.get(uuid, 0) + grant.milli
        utils: list[int] = []
        memory: int | None = None
        for uuid, milli in held.items():
            use = gpu_use.get(uuid)
            if use is None:
                continue
            if use.utilization_pct is not None:
                utils.append(use.utilization_pct)
            mine: int | None
            if job.id in use.jobs:
                mine = use.jobs[job.id]
            elif use.unknown:  # the driver does not say whose: a whole GPU's memory is its holder's
                mine = use.used_mib if milli >= 1000 else None
            else:
                mine = 0
            if mine is not None:
                memory = mine if memory is None else memory + mine
        return (sum(utils) / len(utils) if utils else None), memory
