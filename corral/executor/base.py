"""The executor protocol: how the daemon starts, watches, cancels and re-adopts job processes.

    daemon                          executor
    ------                          --------
    launch(LaunchSpec)      ----->  process started       -> Handle(job_id, pid, start_time)
    poll()                  ----->  ended since last poll -> [Exit, ...]   (each exit handed over exactly once)
    cancel(job_id)          ----->  SIGTERM to the job's processes, SIGKILL after the grace period (its cgroup)
    forget(job_id, attempt) ----->  the daemon has stored that attempt's outcome: its durable record may go
    reattach(id, attempt)   ----->  after a daemon restart: what became of an attempt the previous daemon started
                                    -> ALIVE (watched from now on) | ENDED (its real Exit) | NEVER_STARTED | GONE
    sweep(keep)             ----->  after recovery: drop the records of attempts the store no longer needs
    adopt(id, pid, start)   ----->  a process started before supervisors existed (exit status unknown)

Outcomes outlive the daemon (`local`): each attempt runs under a supervisor process (`_supervise.py`) that holds
the job's cgroup (`cgroup`; its process group where no cgroup can be made), enforces the time limit, forwards
cancels and writes the exit durably where a restarted daemon reads it. An exit is reported only once nothing of the
job runs any more (its cgroup is empty), so the daemon never hands its GPUs on while a process of it lives.
An exit handed over by `poll` is the daemon's to keep (in memory) until it is stored; the record stays on disk
until `forget`, so a daemon that dies in between finds it again through `reattach`.

A bare process is identified across restarts by its PID *and* the process start time (/proc/<pid>/stat field 22): a
PID alone may have been reused by an unrelated process by the time the daemon comes back.

Implementations: `local` (real processes on this machine, CUDA_VISIBLE_DEVICES and MPS variables) and `fake`
(recorded launches, exits driven by tests). `tests/executor/test_contract.py` runs one suite over both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
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
    attempt: int = 1  # the job's attempt number: names the attempt's durable record
    #: One process of a gang (corral.daemon.gang): `job_id` is then "<job>_<instance>"; its environment says both.
    instance: int = 0
    instances: int = 1
    #: The request's CPU (milli) and memory (MiB) per process: its cgroup's cpu.max and memory.max where enforced.
    cpu_milli: int = 0
    memory_mib: int = 0
    #: A batch script's text (corral.jobs.batch): run from a private copy through its #! line, `command` its argv.
    script: str | None = None
    #: --output / --error, expanded and absolute: opened as the job's user (truncated on attempt 1, appended to after).
    output: str | None = None
    error: str | None = None
    #: corral's own variables for this job beyond its id (an array task's CORRAL_ARRAY_* and SLURM_ARRAY_*): set on
    #: top of `env`, whose CORRAL_* variables the executor drops (a submitted one is never corral's).
    corral_env: Mapping[str, str] = field(default_factory=dict)

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
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(f"job {self.job_id}: cpu_milli and memory_mib must be >= 0")
        if self.attempt < 1:
            raise ValueError(f"job {self.job_id}: attempt must be >= 1, got {self.attempt}")
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise ValueError(f"job {self.job_id}: time_limit_s must be > 0 seconds, got {self.time_limit_s}")
        for label, path in (("output", self.output), ("error", self.error)):
            if path is not None and not path.startswith("/"):
                raise ValueError(f"job {self.job_id}: {label} must be an absolute path, got {path!r}")

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
    None when the ending could not be observed (a process adopted without a supervisor, or a supervisor that died
    without writing its record). `cancelled`: it ended after a cancel reached it. `ended_at`: when it ended
    (epoch seconds; None if unknown), which may be long before the daemon hears of it. `oom_killed`: the kernel's
    out-of-memory killer took a process of its cgroup (its memory.max, the request's memory)."""

    job_id: str
    exit_code: int | None
    signal: int | None
    timed_out: bool
    cancelled: bool = False
    ended_at: float | None = field(default=None, compare=False)
    oom_killed: bool = False

    @property
    def unknown(self) -> bool:
        return self.exit_code is None and self.signal is None and not self.timed_out and not self.cancelled

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 and self.signal is None and not self.timed_out


class Found(Enum):
    ALIVE = "alive"  # its supervisor runs: watched from now on
    ENDED = "ended"  # it ended (maybe while no daemon ran): `exit` is what its supervisor recorded
    NEVER_STARTED = "never started"  # no supervisor ever ran for it: nothing ran, the attempt was not used
    GONE = "gone"  # it started, and its supervisor is gone without recording an end (a reboot, a kill -9 of it)


@dataclass(frozen=True)
class Reattached:
    found: Found
    handle: Handle | None = None  # ALIVE: the job's process (None while its supervisor has not reported it yet)
    exit: Exit | None = None  # ENDED


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

    def reattach(self, job_id: str, attempt: int) -> Reattached:
        """After a daemon restart: what became of that attempt. ALIVE jobs are watched (their exit comes through
        `poll`); a GONE job's leftover processes are killed, so a retry never runs beside them."""
        ...

    def forget(self, job_id: str, attempt: int) -> None:
        """The daemon has stored the attempt's outcome: its record may be deleted. A no-op while it still runs."""
        ...

    def sweep(self, keep: set[tuple[str, int]]) -> None:
        """Delete the records of every ended attempt not in `keep` (left by a daemon that died before `forget`)."""
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
