"""Run jobs as processes on this machine.

    launch: log file (append, parents created) -> Popen in a new session (pgid = pid), stdin /dev/null,
            stdout+stderr -> log, env = job env + CORRAL_JOB_ID + CUDA/NVIDIA_VISIBLE_DEVICES (+ MPS caps for a share)
    watcher thread: time limit -> SIGTERM to the group, SIGKILL `grace_s` later; cancel's SIGKILL after its grace
    poll:   our children: waitid(WNOWAIT) sees the exit while the zombie still pins the PID, so the rest of the
            group (a backgrounded grandchild still holding the GPU) is SIGKILLed safely, then the child is reaped.
            adopted processes (not our children): /proc/<pid> gone, zombie, or start time changed -> ended.

Signals go to the job's process group, never to a bare number that might have been reused: a child is not reaped
before its group is signalled, and an adopted process is signalled only after its start time is checked again.

When the daemon runs as root, a job for another user drops to that user's uid, gid and supplementary groups in the
child; its working directory is entered after the drop (through /bin/sh), so root's right to traverse any directory
does not leak to the job. A daemon that is not root runs only jobs of its own uid.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import stat
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from corral.executor.base import Exit, Handle, LaunchSpec, readopt

#: Runs as the job's user: enter the working directory, then become the job's command (same PID, same start time).
_ENTER_AND_EXEC = (
    'cd -- "$1" 2>/dev/null || { printf "corral: the job cannot enter its working directory %s as its user\\n" "$1" '
    '>&2; exit 126; }; shift; exec "$@"'
)


# ------------------------------------------------------------------------------------------------ /proc helpers
class ProcStat(NamedTuple):
    state: str  # R, S, D, Z (zombie), X (dead), ...
    pgrp: int
    start_time: int  # clock ticks after boot


def parse_proc_stat(text: str) -> ProcStat:
    """Parse a /proc/<pid>/stat line. The command name (field 2) is in parentheses and may itself contain spaces
    and parentheses, so fields are counted after the *last* ')'."""
    close = text.rfind(")")
    if close < 0:
        raise ValueError(f"not a /proc/<pid>/stat line: {text[:80]!r}")
    rest = text[close + 1 :].split()
    # rest[0] is field 3 (state), so field n is rest[n - 3]
    if len(rest) < 20:
        raise ValueError(f"/proc/<pid>/stat line too short: {text[:80]!r}")
    return ProcStat(state=rest[0], pgrp=int(rest[2]), start_time=int(rest[19]))


def read_proc_stat(pid: int) -> ProcStat | None:
    """The process's stat, or None when there is no such process."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return parse_proc_stat(f.read())
    except (FileNotFoundError, ProcessLookupError):
        return None


def pid_start_time(pid: int) -> int | None:
    """/proc/<pid>/stat field 22 (start time in clock ticks after boot), or None when the process does not exist."""
    st = read_proc_stat(pid)
    return None if st is None else st.start_time


# ------------------------------------------------------------------------------------------------ environment
def job_environment(spec: LaunchSpec) -> dict[str, str]:
    """The job's environment: its own variables, then corral's, which always win.

    CUDA_VISIBLE_DEVICES lists the granted GPUs by UUID; with no GPUs it is set to the empty string, which hides all
    GPUs (unset would show them all). For a share under MPS, corral owns every CUDA_MPS_* variable: the pipe
    directory of the GPU's MPS daemon, the SM thread cap and the memory cap of each visible device (the job sees only
    its GPUs, numbered from 0).
    """
    env = dict(spec.env)
    visible = ",".join(spec.gpu_uuids)
    env["CUDA_VISIBLE_DEVICES"] = visible
    env["NVIDIA_VISIBLE_DEVICES"] = visible
    env["CORRAL_JOB_ID"] = spec.job_id
    if spec.is_share and spec.mps_pipe_dir:
        for key in [k for k in env if k.startswith("CUDA_MPS_")]:
            del env[key]
        env["CUDA_MPS_PIPE_DIRECTORY"] = spec.mps_pipe_dir
        if spec.gpu_milli > 0:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(-(-spec.gpu_milli // 10))  # ceil: never below the grant
        if spec.gpu_memory_mib > 0:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
                f"{i}={spec.gpu_memory_mib}M" for i in range(len(spec.gpu_uuids))
            )
    return env


# ------------------------------------------------------------------------------------------------ identity
@dataclass(frozen=True)
class _Identity:
    uid: int
    gid: int
    groups: tuple[int, ...]


def _identity_for(spec: LaunchSpec) -> _Identity | None:
    """The identity to switch to in the child, None to run as the daemon. Raises PermissionError when the job may
    not run as its user."""
    me = os.getuid()
    if me != 0:
        if spec.uid != me:
            raise PermissionError(
                f"job {spec.job_id} asks to run as uid {spec.uid}, but the corral daemon runs as uid {me}, not root: "
                f"it can only run jobs as itself. Submit as uid {me}, or run the daemon as root to serve several users"
            )
        return None  # a non-root daemon cannot take another gid; the job runs with the daemon's groups
    if spec.uid == me and spec.gid == os.getgid():
        return None
    try:
        name = pwd.getpwuid(spec.uid).pw_name
        groups = tuple(os.getgrouplist(name, spec.gid))
    except (KeyError, OSError):
        groups = (spec.gid,)  # unknown user: its primary group only, never root's supplementary groups
    return _Identity(spec.uid, spec.gid, groups)


def _open_log(path: Path, owner: _Identity | None) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o640)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"log path {path} is not a regular file")
        if owner is not None and (st.st_uid, st.st_gid) != (owner.uid, owner.gid):
            if st.st_nlink != 1:  # a hard link planted to make root hand some other file to the user
                raise PermissionError(f"log {path} has {st.st_nlink} links; refusing to hand it to uid {owner.uid}")
            os.fchown(fd, owner.uid, owner.gid)
    except BaseException:
        os.close(fd)
        raise
    return fd


# ------------------------------------------------------------------------------------------------ executor
@dataclass
class _Tracked:
    job_id: str
    pid: int
    start_time: int
    popen: subprocess.Popen[bytes] | None  # None for an adopted process (not our child)
    group: bool  # signal the process group (pgid == pid), not only the process
    deadline: float | None  # monotonic time of the time limit
    kill_at: float | None = None  # monotonic time of the SIGKILL that follows a SIGTERM
    timed_out: bool = False


class LocalExecutor:
    """Jobs as local processes, one session and process group each. Thread-safe."""

    def __init__(self, grace_s: float = 10.0) -> None:
        if grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        self.grace_s = grace_s  # between the SIGTERM and the SIGKILL of a job over its time limit
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._jobs: dict[str, _Tracked] = {}
        self._watcher: threading.Thread | None = None
        self._closed = False

    # -------------------------------------------------------------------------------------------- protocol
    def launch(self, spec: LaunchSpec) -> Handle:
        identity = _identity_for(spec)
        env = job_environment(spec)
        if identity is None:
            argv: tuple[str, ...] = spec.command
            cwd = spec.cwd
        else:
            argv = ("/bin/sh", "-c", _ENTER_AND_EXEC, "corral-job", spec.cwd, *spec.command)
            cwd = "/"
        with self._lock:
            if self._closed:
                raise RuntimeError("the executor is closed")
            if spec.job_id in self._jobs:
                raise ValueError(f"job {spec.job_id} is already running (pid {self._jobs[spec.job_id].pid})")
            log_fd = _open_log(spec.log_path, identity)
            try:
                popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_fd,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                    env=env,
                    start_new_session=True,
                    umask=0o022,  # a login's, not the daemon's 077 (which keeps the state directory private)
                    user=None if identity is None else identity.uid,
                    group=None if identity is None else identity.gid,
                    extra_groups=None if identity is None else list(identity.groups),
                )
            finally:
                os.close(log_fd)
            start = pid_start_time(popen.pid)  # the unreaped child keeps its /proc entry, so this is always found
            if start is None:  # pragma: no cover - only if someone else reaped our child already
                popen.returncode = -1
                raise OSError(f"job {spec.job_id}: process {popen.pid} vanished right after it started")
            deadline = None if spec.time_limit_s is None else time.monotonic() + spec.time_limit_s
            self._jobs[spec.job_id] = _Tracked(spec.job_id, popen.pid, start, popen, True, deadline)
            if deadline is not None:
                self._kick()
            return Handle(spec.job_id, popen.pid, start)

    def poll(self) -> list[Exit]:
        exits: list[Exit] = []
        with self._lock:
            for job_id, tracked in list(self._jobs.items()):
                ended = self._reap(tracked)
                if ended is not None:
                    del self._jobs[job_id]
                    exits.append(ended)
        return exits

    def cancel(self, job_id: str, grace_s: float = 10.0) -> None:
        with self._lock:
            tracked = self._jobs.get(job_id)
            if tracked is None or not self._alive(tracked):
                return
            self._signal(tracked, signal.SIGTERM)
            if grace_s <= 0:
                self._signal(tracked, signal.SIGKILL)
                return
            kill_at = time.monotonic() + grace_s
            if tracked.kill_at is None or kill_at < tracked.kill_at:
                tracked.kill_at = kill_at
                self._kick()

    def adopt(self, job_id: str, pid: int, start_time: int, time_limit_s: float | None = None) -> bool:
        with self._lock:
            if readopt(self._jobs.get(job_id), job_id, pid, start_time):
                return True
            st = read_proc_stat(pid)
            if st is None or st.start_time != start_time or st.state in ("Z", "X", "x"):
                return False
            deadline = None if time_limit_s is None else time.monotonic() + max(0.0, time_limit_s)
            self._jobs[job_id] = _Tracked(job_id, pid, start_time, None, st.pgrp == pid, deadline)
            if deadline is not None:
                self._kick()
            return True

    def running(self) -> set[str]:
        with self._lock:
            return set(self._jobs)

    # -------------------------------------------------------------------------------------------- extras
    def handle(self, job_id: str) -> Handle | None:
        with self._lock:
            t = self._jobs.get(job_id)
            return None if t is None else Handle(t.job_id, t.pid, t.start_time)

    def close(self) -> None:
        """Stop the watcher thread: no further launches, time limits or SIGKILL escalations. Running jobs are left
        alone (a restarted daemon adopts them); `poll` and `cancel`'s SIGTERM still work."""
        with self._lock:
            self._closed = True
            self._wake.notify_all()
            watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join()

    # -------------------------------------------------------------------------------------------- internals
    # Everything below runs with self._lock held.
    def _alive(self, t: _Tracked) -> bool:
        if t.popen is not None:
            try:
                return os.waitid(os.P_PID, t.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
            except ChildProcessError:
                return False
        st = read_proc_stat(t.pid)
        return st is not None and st.start_time == t.start_time and st.state not in ("Z", "X", "x")

    def _reap(self, t: _Tracked) -> Exit | None:
        if t.popen is None:
            return None if self._alive(t) else Exit(t.job_id, None, None, t.timed_out)
        try:
            if os.waitid(os.P_PID, t.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return None
        except ChildProcessError:  # reaped behind our back: the PID may be reused, so signal nothing
            t.popen.returncode = -1
            return Exit(t.job_id, None, None, t.timed_out)
        # The zombie still pins the PID and the group id: kill what is left of the group, then reap.
        self._killpg(t.pid, signal.SIGKILL)
        code = t.popen.wait()
        if code < 0:
            return Exit(t.job_id, None, -code, t.timed_out)
        return Exit(t.job_id, code, None, t.timed_out)

    def _signal(self, t: _Tracked, sig: signal.Signals) -> None:
        if t.popen is None:  # not our child: make sure the PID still names the adopted process
            st = read_proc_stat(t.pid)
            if st is None or st.start_time != t.start_time or st.state in ("Z", "X", "x"):
                return
            if not t.group:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(t.pid, sig)
                return
        self._killpg(t.pid, sig)

    @staticmethod
    def _killpg(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def _kick(self) -> None:
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="corral-executor-watcher", daemon=True)
            self._watcher.start()
        self._wake.notify_all()

    def _watch(self) -> None:
        with self._wake:
            while not self._closed:
                now = time.monotonic()
                next_due: float | None = None
                for t in self._jobs.values():
                    if t.deadline is not None and t.deadline <= now:
                        t.deadline = None
                        if self._alive(t):
                            t.timed_out = True
                            self._signal(t, signal.SIGTERM)
                            kill_at = now + self.grace_s
                            t.kill_at = kill_at if t.kill_at is None else min(t.kill_at, kill_at)
                    if t.kill_at is not None and t.kill_at <= now:
                        t.kill_at = None
                        self._signal(t, signal.SIGKILL)
                    for due in (t.deadline, t.kill_at):
                        if due is not None and (next_due is None or due < next_due):
                            next_due = due
                self._wake.wait(None if next_due is None else max(0.0, next_due - now))
