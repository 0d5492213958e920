"""The LaunchSpec builder both executor test modules use."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from corral.executor import LaunchSpec

PATH = "/usr/local/bin:/usr/bin:/bin"


def make_spec(tmp: Path, job_id: str, *command: str, **changes: Any) -> LaunchSpec:
    """A job with no GPUs, logging under `tmp/logs`; `changes` override any field."""
    base = LaunchSpec(
        job_id=job_id,
        command=command,
        env={"PATH": PATH},
        cwd=str(tmp),
        uid=os.getuid(),
        gid=os.getgid(),
        gpu_uuids=(),
        gpu_milli=1000,
        gpu_memory_mib=0,
        log_path=tmp / "logs" / f"{job_id}.log",
        time_limit_s=None,
    )
    return replace(base, **changes)
