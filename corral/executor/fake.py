"""An executor for tests: records what it was asked to do and spawns nothing.

    fake = FakeExecutor()
    h = fake.launch(spec)                 # recorded in fake.launched; fake pid and start time
    fake.finish(h.job_id, exit_code=3)    # the test decides when and how a job ends
    fake.poll()                           # -> [Exit(job_id, 3, None, False)], then [] again
    fake.cancel(job_id)                   # recorded in fake.cancelled; ends the job (SIGTERM) unless
                                          # `cancel_ends` is False (a job that ignores the cancel)
    fake2 = fake.restarted()              # a daemon restart: same "machine" (processes, supervisor records)
    fake2.finish(job_id, 0)               # the job ends while no daemon watches: its supervisor records the exit
    fake2.reattach(job_id, attempt)       # ENDED with that exit / ALIVE (watched again) / GONE / NEVER_STARTED
    fake2.adopt(job_id, h.pid, h.start_time)  # a bare process (no supervisor): True while it lives

The fake keeps the "machine": live processes (pid -> start time) and each attempt's supervisor record (alive, or
ended with an Exit), shared with its `restarted()` copies. So a job that ends while the daemon is away, a supervisor
that vanishes without a record (`kill_process`: a reboot, a kill -9 of the supervisor), a PID that was reused
(`spawn_process` with a live pid and another start time) can all be set up.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from corral.executor.base import Exit, Found, Handle, LaunchSpec, Reattached, readopt


@dataclass
class SupervisorRecord:
    """What a fake supervisor left for one attempt: alive, ended with `exit`, or gone without a word."""

    handle: Handle
    alive: bool = True
    exit: Exit | None = None


class FakeExecutor:
    def __init__(
        self,
        *,
        cancel_ends: bool = True,
        processes: Mapping[int, int] | None = None,
        first_pid: int = 10_000,
        first_start_time: int = 1_000_000,
        records: dict[tuple[str, int], SupervisorRecord] | None = None,
    ) -> None:
        self.cancel_ends = cancel_ends
        self.launch_error: BaseException | None = None  # raised (once) by the next launch
        self.launched: list[LaunchSpec] = []
        self.cancelled: list[tuple[str, float]] = []  # (job id, grace) for every cancel call
        self.adopted: list[tuple[str, int, int]] = []  # successful adoptions
        self.time_limits: dict[str, float | None] = {}  # job id -> time limit asked at launch / adopt
        self.processes: dict[int, int] = dict(processes or {})  # live fake processes: pid -> start time
        #: the machine's supervisor records, by (job id, attempt); shared with restarted() copies
        self.records: dict[tuple[str, int], SupervisorRecord] = {} if records is None else records
        self.forgotten: list[tuple[str, int]] = []  # records the daemon released (its outcome stored)
        self._jobs: dict[str, Handle] = {}
        self._attempts: dict[str, int] = {}  # job id -> attempt watched
        self._ended: list[Exit] = []
        self._next_pid = max([first_pid, *(p + 1 for p in self.processes)])
        self._next_start = first_start_time
        self._lock = threading.RLock()

    # -------------------------------------------------------------------------------------------- protocol
    def launch(self, spec: LaunchSpec) -> Handle:
        with self._lock:
            if self.launch_error is not None:
                error, self.launch_error = self.launch_error, None
                raise error
            if spec.job_id in self._jobs:
                raise ValueError(f"job {spec.job_id} is already running (pid {self._jobs[spec.job_id].pid})")
            pid, start = self.spawn_process()
            handle = Handle(spec.job_id, pid, start)
            self.launched.append(spec)
            self._jobs[spec.job_id] = handle
            self._attempts[spec.job_id] = spec.attempt
            self.records[(spec.job_id, spec.attempt)] = SupervisorRecord(handle)
            self.time_limits[spec.job_id] = spec.time_limit_s
            return handle

    def poll(self) -> list[Exit]:
        with self._lock:
            ended, self._ended = self._ended, []
            return ended

    def cancel(self, job_id: str, grace_s: float = 10.0) -> None:
        with self._lock:
            self.cancelled.append((job_id, grace_s))
            if self.cancel_ends and job_id in self._jobs:
                self.finish(job_id, None, signal=signal.SIGTERM, cancelled=True)

    def adopt(self, job_id: str, pid: int, start_time: int, time_limit_s: float | None = None) -> bool:
        with self._lock:
            if readopt(self._jobs.get(job_id), job_id, pid, start_time):
                return True
            if self.processes.get(pid) != start_time:
                return False
            self._jobs[job_id] = Handle(job_id, pid, start_time)
            self.adopted.append((job_id, pid, start_time))
            self.time_limits[job_id] = time_limit_s
            return True

    def running(self) -> set[str]:
        with self._lock:
            return set(self._jobs)

    def reattach(self, job_id: str, attempt: int) -> Reattached:
        with self._lock:
            if self._attempts.get(job_id) == attempt and job_id in self._jobs:
                return Reattached(Found.ALIVE, self._jobs[job_id])
            record = self.records.get((job_id, attempt))
            if record is None:
                return Reattached(Found.NEVER_STARTED)
            if record.exit is not None:
                return Reattached(Found.ENDED, exit=record.exit)
            if not record.alive:
                return Reattached(Found.GONE)
            self._jobs[job_id] = record.handle
            self._attempts[job_id] = attempt
            self.adopted.append((job_id, record.handle.pid, record.handle.start_time))
            return Reattached(Found.ALIVE, record.handle)

    def forget(self, job_id: str, attempt: int) -> None:
        with self._lock:
            record = self.records.get((job_id, attempt))
            if record is not None and (record.exit is not None or not record.alive):
                del self.records[(job_id, attempt)]
                self.forgotten.append((job_id, attempt))

    def sweep(self, keep: set[tuple[str, int]]) -> None:
        with self._lock:
            for key in sorted(set(self.records) - keep):
                self.forget(*key)

    # -------------------------------------------------------------------------------------------- test controls
    def finish(
        self,
        job_id: str,
        exit_code: int | None = 0,
        *,
        signal: int | None = None,
        timed_out: bool = False,
        cancelled: bool = False,
        ended_at: float | None = None,
        oom_killed: bool = False,
    ) -> Exit:
        """End a running job: its supervisor records the exit, and the next poll reports it if this executor watches
        the job (otherwise a restarted daemon finds it with `reattach`). KeyError for a job that does not run."""
        with self._lock:
            sig = None if signal is None else int(signal)
            ended = Exit(job_id, exit_code, sig, timed_out, cancelled, ended_at, oom_killed=oom_killed)
            handle = self._jobs.pop(job_id, None)
            if handle is not None:
                record = self.records.get((job_id, self._attempts.pop(job_id, 0)))
                if record is not None:  # None: a bare process adopted by PID, no supervisor
                    record.exit = ended
                self._ended.append(ended)
            else:
                live = [r for (j, _), r in self.records.items() if j == job_id and r.alive and r.exit is None]
                if not live:
                    raise KeyError(f"job {job_id} is not running on this fake machine (watched: {sorted(self._jobs)})")
                live[-1].exit = ended
                handle = live[-1].handle
            self.processes.pop(handle.pid, None)
            return ended

    def expire(self, job_id: str) -> Exit:
        """The job ran past its time limit and was terminated."""
        return self.finish(job_id, None, signal=signal.SIGTERM, timed_out=True)

    def spawn_process(self, pid: int | None = None) -> tuple[int, int]:
        """Put a live process on the fake machine (one not launched by this executor, e.g. from before a restart,
        or an unrelated process that reused a PID). Returns (pid, start time)."""
        with self._lock:
            if pid is None:
                pid = self._next_pid
            self._next_pid = max(self._next_pid, pid + 1)
            start = self._next_start
            self._next_start += 1
            self.processes[pid] = start
            return pid, start

    def kill_process(self, pid: int) -> None:
        """A process on the fake machine vanishes with its supervisor, leaving no exit record (a reboot, a kill -9
        of the supervisor). If it is a watched job, its exit (code unknown) is reported."""
        with self._lock:
            self.processes.pop(pid, None)
            for record in self.records.values():
                if record.handle.pid == pid and record.exit is None:
                    record.alive = False
            for job_id, handle in list(self._jobs.items()):
                if handle.pid == pid:
                    del self._jobs[job_id]
                    self._attempts.pop(job_id, None)
                    self._ended.append(Exit(job_id, None, None, False))

    def restarted(self) -> FakeExecutor:
        """A fresh executor on the same fake machine, as after a daemon restart: live processes stay, no jobs are
        watched until adopted."""
        with self._lock:
            fresh = FakeExecutor(
                cancel_ends=self.cancel_ends, processes=self.processes, first_pid=self._next_pid, records=self.records
            )
            fresh._next_start = self._next_start
            return fresh

    def spec(self, job_id: str) -> LaunchSpec:
        """The last LaunchSpec launched for the job."""
        with self._lock:
            for spec in reversed(self.launched):
                if spec.job_id == job_id:
                    return spec
            raise KeyError(f"job {job_id} was never launched (launched: {[s.job_id for s in self.launched]})")
