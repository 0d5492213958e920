"""The executor protocol: how the daemon starts, watches, cancels and re-adopts job processes.

    daemon                       executor
    ------                       --------
    launch(LaunchSpec)   ----->  process started       -> Handle(job_id, pid, start_time)
    poll()               ----->  ended since last poll -> [Exit, ...]   (each exit reported exactly once)
    cancel(job_id)       ----->  SIGTERM to the job's process group, SIGKILL after the grace period
    adopt(id, pid, start) ---->  after a daemon restart: watch a job process started by the previous daemon

A job is identified across restarts by its PID *and* the process start time (/proc/<pid>/stat field 22): a PID alone
may have been reused by an unrelated process by the time the daemon comes back.

Implementations: `local` (real processes on this machine, CUDA_VISIBLE_DEVICES and MPS variables) and `fake`
(recorded launches, exits driven by tests). `tests/executor/test_contract.py` runs one suite over both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

MILLI_PER_GPU = 1000


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one attempt of a job. Built by the daemon from a `Job` and its grant."""

    job_id: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    uid: int
    gid: int
    gpu_uuids: tuple[str, ...]
    gpu_milli: int  # per GPU; 1000 = the whole GPU
    gpu_memory_mib: int  # per GPU; 0 = no memory cap
    log_path: Path
    time_limit_s: float | None
    mps_pipe_dir: str | None = None  # set when the GPUs are shared under MPS

    def __post_init__(self) -> None:
        if not self.job_id:
            raise ValueError("LaunchSpec.job_id must be non-empty")
        if not self.command or not self.command[0]:
            raise ValueError(f"job {self.job_id}: the command must be non-empty")
        if self.uid < 0 or self.gid < 0:
            raise ValueError(f"job {self.job_id}: uid and gid must be >= 0, got {self.uid}:{self.gid}")
        if not 0 <= self.gpu_milli <= MILLI_PER_GPU:
            raise ValueError(f"job {self.job_id}: gpu_milli must be in 0..1000, got {self.gpu_milli}")
        if self.gpu_memory_mib < 0:
            raise ValueError(f"job {self.job_id}: gpu_memory_mib must be >= 0, got {self.gpu_memory_mib}")
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise ValueError(f"job {self.job_id}: time_limit_s must be > 0 seconds, got {self.time_limit_s}")

    @property
    def is_share(self) -> bool:
        """True when the job gets a part of each of its GPUs (a compute share and/or a memory cap)."""
        return bool(self.gpu_uuids) and (self.gpu_milli < MILLI_PER_GPU or self.gpu_memory_mib > 0)


@dataclass(frozen=True)
class Handle:
    """A started job process. `start_time` is /proc/<pid>/stat field 22 (clock ticks since boot)."""

    job_id: str
    pid: int
    start_time: int


@dataclass(frozen=True)
class Exit:
    """How a job process ended. A signal death has `exit_code` None and the signal number in `signal`; both are
    None when the ending could not be observed (an adopted process that is not our child)."""

    job_id: str
    exit_code: int | None
    signal: int | None
    timed_out: bool

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 and self.signal is None and not self.timed_out


@runtime_checkable
class Executor(Protocol):
    def launch(self, spec: LaunchSpec) -> Handle:
        """Start the job's process. Raises ValueError for a job id that is already running, PermissionError when
        the job may not run as the asked user, OSError when the process cannot be started."""
        ...

    def poll(self) -> list[Exit]:
        """Jobs that ended since the last poll, each reported exactly once. Never blocks."""
        ...

    def cancel(self, job_id: str, grace_s: float = 10.0) -> None:
        """SIGTERM to the job's process group, SIGKILL after `grace_s`. Returns at once; the exit comes through
        `poll`. A no-op for an unknown or already ended job."""
        ...

    def adopt(self, job_id: str, pid: int, start_time: int, time_limit_s: float | None = None) -> bool:
        """After a daemon restart: True if that exact process (pid and start time) still runs; it is then watched
        for exit (and killed after `time_limit_s` more seconds, if given). False if it is gone or the PID now
        belongs to another process."""
        ...

    def running(self) -> set[str]:
        """Ids of jobs launched or adopted whose exit `poll` has not reported yet."""
        ...


class Watched(Protocol):
    @property
    def pid(self) -> int: ...

    @property
    def start_time(self) -> int: ...


def readopt(known: Watched | None, job_id: str, pid: int, start_time: int) -> bool:
    """`adopt` of a job the executor may already watch: True for that very process, an error for another one,
    False when the job is not watched (the caller then checks the process itself)."""
    if known is None:
        return False
    if (known.pid, known.start_time) == (pid, start_time):
        return True
    raise ValueError(f"job {job_id} is already watched as pid {known.pid}; cannot adopt pid {pid}")
