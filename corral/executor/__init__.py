"""Executors: start, watch, cancel and re-adopt job processes (`base.Executor`); `local` runs real processes, each
under a supervisor (`_supervise.py`) that outlives the daemon and records its outcome; `fake` records launches for
tests."""

from corral.executor.base import Executor, Exit, Found, Handle, LaunchSpec, Reattached
from corral.executor.fake import FakeExecutor
from corral.executor.local import LocalExecutor, ProcStat, job_environment, pid_start_time, read_proc_stat

__all__ = [
    "Executor",
    "Exit",
    "FakeExecutor",
    "Found",
    "Handle",
    "LaunchSpec",
    "LocalExecutor",
    "ProcStat",
    "Reattached",
    "job_environment",
    "pid_start_time",
    "read_proc_stat",
]
