"""What a job's GPUs did while it ran: mean utilisation and peak memory, from the samples the daemon takes.

    Daemon round --(every sample_every_s)--> UsageMeter.observe(holding jobs, NVML sample per GPU)
    job ends      --> UsageMeter.finish(job) -> Usage, stored with the job's end (Job.usage) -> `corral acct`

Simulated GPUs (`corral serve --simulate-gpus`, UUIDs starting with SIM-) have no NVML to ask: their figures are
made up, from the job's id and grant, and every record that holds one says `simulated` (docs/acct.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Usage:
    """The GPU use of a job's last attempt. None for a figure no sample could give (the driver did not say)."""

    samples: int  # how many samples the figures come from
    gpu_util_pct: float | None  # mean over the samples of its GPUs' mean utilisation, 0..100
    gpu_mem_peak_mib: int | None  # the most GPU memory its processes held at once, over all its GPUs
    simulated: bool = False  # made up for simulated GPUs, not measured

    def to_json(self) -> str:
        return json.dumps(
            {
                "samples": self.samples,
                "gpu_util_pct": self.gpu_util_pct,
                "gpu_mem_peak_mib": self.gpu_mem_peak_mib,
                "simulated": self.simulated,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Usage:
        d = json.loads(text)
        util, mem = d.get("gpu_util_pct"), d.get("gpu_mem_peak_mib")
        return cls(
            int(d["samples"]),
            None if util is None else float(util),
            None if mem is None else int(mem),
            bool(d.get("simulated", False)),
        )
