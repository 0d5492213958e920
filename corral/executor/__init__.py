"""Executors: start, watch, cancel and re-adopt job processes (`base.Executor`); `local` runs real processes,
`fake` records launches for tests."""

from corral.executor.base import Executor, Exit, Handle, LaunchSpec
from corral.executor.fake import FakeExecutor
from corral.executor.local import LocalExecutor, ProcStat, job_environment, pid_start_time, read_proc_stat

__all__ = [
    "Executor",
    "Exit",
    "FakeExecutor",
    "Handle",
    "LaunchSpec",
    "LocalExecutor",
    "ProcStat",
    "job_environment",
    "pid_start_time",
    "read_proc_stat",
]
