"""Run jobs as processes on this machine, each under its own supervisor that outlives the daemon.

    daemon (LocalExecutor)              zygote (one, started     supervisor (_supervise.py,        job
                                        once: python -I -S)      one per attempt)
    launch: RUN/<id>.<n>.lock flock'd,
            log opened, two pipes  ---> fds by SCM_RIGHTS -----> fork, setsid, fork (init's child)
            spec (JSON) on a pipe  ------------------------------> read spec; fork --------------->  setsid, log,
                                                                 RUN/<id>.<n>.json {started}       drop uid/gid,
            <-- {"pid", "start_time", "supervisor"} on a pipe                                      cd, exec
    poll:   the attempt's lock free -> read its record           waits: exit, time limit (SIGTERM, grace, SIGKILL),
                                                                 SIGUSR1/SIGUSR2 cancel, SIGTERM forwarded
                                                                 exit: SIGKILL the rest of the group, reap,
                                                                 RUN/<id>.<n>.json {ended} (write, fsync, rename,
                                                                 fsync dir)
    cancel: RUN/<id>.<n>.cancel (grace), SIGUSR1 (SIGUSR2 with no grace) to the supervisor (pid + start time checked)
    reattach (restart): record ended -> ENDED; lock held -> ALIVE; record started, lock free -> GONE (leftover group
            killed); neither -> NEVER_STARTED.  forget: the daemon stored the outcome, the record goes.

The lock is taken by the daemon before the request and inherited by the supervisor, so there is no moment when a
supervisor exists without holding it: a free lock means no supervisor, whatever happened to PIDs meanwhile. The
zygote exists for speed only (a fork costs ~1 ms, an interpreter's start ~20 ms of CPU); it holds no state, exits when
the daemon does, and is started again when needed. The job's environment (it may hold the user's secrets) travels
through a pipe, never through argv, which every user can read in /proc/<pid>/cmdline.

When the daemon runs as root, a job for another user drops to that user's uid, gid and supplementary groups in the
child; its working directory is entered after the drop, so root's right to traverse any directory does not leak to
the job. A daemon that is not root runs only jobs of its own uid. Logs are 0600 and owned by the job's user.

Processes started before supervisors existed (an upgrade) are still adopted by PID and start time (`adopt`): the
executor then signals them itself, and their exit status is unknown.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pwd
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from corral.executor._supervise import LOCK_FD, LOG_FD, RECORD_FD, RECORD_SIZE, SLOT
from corral.executor.base import Exit, Found, Handle, LaunchSpec, Reattached, readopt
from corral.executor.cgroup import DEFAULT_PIDS_MAX, Limits, NoCgroups, Subtree, kill_cgroup, populated, prepare

#: The supervisor: run by path with `-I -S` (no site-packages, no venv imports), so it starts in a few milliseconds.
SUPERVISOR = Path(__file__).with_name("_supervise.py")
#: How long a launch waits for its supervisor's answer (the job's pid) before it gives up.
ANSWER_TIMEOUT_S = 30.0
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


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
    """The job's environment: its own variables without any CORRAL_* one, then corral's, which always win.

    CUDA_VISIBLE_DEVICES lists the granted GPUs by UUID; with no GPUs it is set to the empty string, which hides all
    GPUs (unset would show them all). For a share under MPS, corral owns every CUDA_MPS_* variable: the pipe
    directory of the GPU's MPS daemon, the SM thread cap and the memory cap of each visible device (the job sees only
    its GPUs, numbered from 0).
    """
    # CORRAL_* variables are corral's to set: a token or a forged job id in the submitted env never reaches the job.
    env = {k: v for k, v in spec.env.items() if not k.startswith("CORRAL_")}
    visible = ",".join(spec.gpu_uuids)
    env["CUDA_VISIBLE_DEVICES"] = visible
    env["NVIDIA_VISIBLE_DEVICES"] = visible
    env["CORRAL_JOB_ID"] = spec.job_id
    env.update(spec.corral_env)
    if spec.instances > 1:  # one instance of a gang: the job's own id, and which instance of how many this is
        env["CORRAL_JOB_ID"] = spec.job_id.rpartition("_")[0]
        env["CORRAL_INSTANCE"] = str(spec.instance)
        env["CORRAL_INSTANCES"] = str(spec.instances)
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
    """The job's log, 0600 and owned by the job's user; never through a symlink, never a planted hard link."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"log path {path} is not a regular file")
        if owner is not None and (st.st_uid, st.st_gid) != (owner.uid, owner.gid):
            if st.st_nlink != 1:  # a hard link planted to make root hand some other file to the user
                raise PermissionError(f"log {path} has {st.st_nlink} links; refusing to hand it to uid {owner.uid}")
            os.fchown(fd, owner.uid, owner.gid)
        if stat.S_IMODE(st.st_mode) != 0o600 and st.st_nlink == 1:
            os.fchmod(fd, 0o600)  # a log left by an older corral (0640): nobody else reads it from now on
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


# ------------------------------------------------------------------------------------------------ records
def _write_text(path: Path, text: str) -> None:
    """Replace `path` atomically (a reader sees the old or the new text, never a part)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def parse_record(data: bytes) -> dict[str, Any] | None:
    """A supervisor's record: RECORD_SIZE bytes, two blank-padded slots (start, end; the end slot is the whole record),
    or, left by an older corral, one JSON object."""
    bodies: list[Any] = []
    parts = [data[:SLOT], data[SLOT:]] if len(data) == RECORD_SIZE else [data]
    for part in parts:
        text = part.strip(b" \n\0")
        if not text:
            continue
        try:
            bodies.append(json.loads(text))
        except ValueError:
            continue  # a torn write (a machine crash in the middle of it): the other slot may still say something
    merged: dict[str, Any] = {}
    for body in bodies:
        if isinstance(body, dict):
            merged.update(body)
    return merged or None


def _read_record(prefix: Path) -> dict[str, Any] | None:
    try:
        with open(f"{prefix}.json", "rb") as f:
            return parse_record(f.read(1 << 16))
    except OSError:
        return None


def _reserve_record(prefix: Path) -> int:
    """PREFIX.json at its full size, before the job exists: its end is later written in this space (issue 23)."""
    fd = os.open(f"{prefix}.json", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, b" " * (SLOT - 1) + b"\n" + b" " * (SLOT - 1) + b"\n")
    except OSError as exc:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(f"{prefix}.json")
        if exc.errno == errno.ENOSPC:
            raise OSError(exc.errno, "the state disk is full: no room to reserve the job's end record") from None
        raise
    return fd


def _lock_free(prefix: Path) -> bool:
    """True when no supervisor holds the attempt's lock (it never started, or it has ended)."""
    try:
        fd = os.open(f"{prefix}.lock", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops a lock we may just have taken
    return True


def _exit_of(job_id: str, record: dict[str, Any] | None) -> Exit:
    """The Exit a supervisor recorded; an unknown one if it recorded none."""
    if record is None or not record.get("ended"):
        return Exit(job_id, None, None, False)
    return Exit(
        job_id,
        record.get("exit_code"),
        record.get("signal"),
        bool(record.get("timed_out")),
        bool(record.get("cancelled")),
        record.get("ended_at"),
        oom_killed=int(record.get("oom_kills") or 0) > 0,
    )


#: Why a job whose supervisor is gone is still held: its cgroup has processes (shown as the job's reason).
ORPHANED = (
    "ending: its supervisor is gone without recording the exit; its cgroup is being killed and its grant is "
    "released once the cgroup is empty"
)


# ------------------------------------------------------------------------------------------------ executor
@dataclass
class _Supervised:
    """An attempt running under its supervisor."""

    job_id: str
    attempt: int
    prefix: Path  # RUN/<job id>.<attempt>: .lock, .json, .cancel
    pid: int  # the job's process (its process group id too)
    start_time: int
    supervisor_pid: int  # never our child (double-forked by the zygote): signalled only after its start time matches
    supervisor_start: int | None
    leaf: Path | None = None  # its cgroup (None: process groups only)
    pipe: int | None = None  # the supervisor's answer pipe, on which it also writes its end (None after a restart)
    heard: bytes = b""  # what came on the pipe so far
    ending: str | None = None  # its supervisor is gone and its cgroup still has processes: why it is held


@dataclass
class _Tracked:
    """A bare process adopted by PID (started before supervisors existed): signalled by the executor itself."""

    job_id: str
    pid: int
    start_time: int
    group: bool  # signal the process group (pgid == pid), not only the process
    deadline: float | None  # monotonic time of the time limit
    kill_at: float | None = None  # monotonic time of the SIGKILL that follows a SIGTERM
    timed_out: bool = False


class LocalExecutor:
    """Jobs as local processes under supervisors, one session and process group each. Thread-safe.

    `run_dir`: where the supervisors keep their records (the daemon's STATE/run, private to it); by default a fresh
    private temporary folder (outcomes then do not outlive this executor's process).
    `cgroups`: the subtree the jobs' cgroup leaves go in, or why there is none (`NoCgroups`: process groups only);
    by default found and made for `run_dir` (`corral.executor.cgroup.prepare`). `pids_max`: each leaf's pids.max
    where the pids controller is there."""

    def __init__(
        self,
        grace_s: float = 10.0,
        run_dir: Path | None = None,
        cgroups: Subtree | NoCgroups | None = None,
        pids_max: int | None = DEFAULT_PIDS_MAX,
    ) -> None:
        if grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        self.grace_s = grace_s  # between the SIGTERM and the SIGKILL of a job over its time limit or cancelled
        self._own_dir = run_dir is None  # a temporary folder no restart could find: removed by close()
        if run_dir is None:
            run_dir = Path(tempfile.mkdtemp(prefix="corral-run-"))
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.run_dir = run_dir
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._jobs: dict[str, _Supervised | _Tracked] = {}
        self._watcher: threading.Thread | None = None
        self._closed = False
        self._zygote: subprocess.Popen[bytes] | None = None  # forks the supervisors (see _supervise.zygote)
        self._ctl: socket.socket | None = None
        self.cgroups = prepare(run_dir) if cgroups is None else cgroups
        self.pids_max = pids_max

    @property
    def containment(self) -> str:
        """How jobs are contained, in words: their cgroup subtree, or the "no cgroups" notice."""
        return self.cgroups.notice

    @property
    def contained(self) -> bool:
        """True when each job runs in a cgroup leaf of its own (False: process groups, which a setsid escapes)."""
        return isinstance(self.cgroups, Subtree)

    def ending(self) -> dict[str, str]:
        """Jobs that have ended but are still held, by id, and why (their supervisor is gone and their cgroup still
        has processes): their exit comes through `poll` once the cgroup is empty."""
        with self._lock:
            return {j: t.ending for j, t in self._jobs.items() if isinstance(t, _Supervised) and t.ending}

    def _prefix(self, job_id: str, attempt: int) -> Path:
        if not _SAFE_ID.fullmatch(job_id):
            raise ValueError(f"job id {job_id!r} cannot name a file (letters, digits, '.', '_', '-')")
        return self.run_dir / f"{job_id}.{attempt}"

    # -------------------------------------------------------------------------------------------- protocol
    def launch(self, spec: LaunchSpec) -> Handle:
        identity = _identity_for(spec)
        prefix = self._prefix(spec.job_id, spec.attempt)
        with self._lock:
            if self._closed:
                raise RuntimeError("the executor is closed")
            if spec.job_id in self._jobs:
                raise ValueError(f"job {spec.job_id} is already running (pid {self._jobs[spec.job_id].pid})")
            lock_fd = os.open(f"{prefix}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            log_fd = record_fd = -1
            pipes: list[int] = []
            leaf: Path | None = None
            try:
                try:
                    fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise ValueError(f"job {spec.job_id} attempt {spec.attempt} already has a supervisor") from None
                for leftover in (".json", ".cancel"):  # an attempt never launched twice, but a test may reuse an id
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f"{prefix}{leftover}")
                record_fd = _reserve_record(prefix)
                log_fd = _open_log(spec.log_path, identity)
                if isinstance(self.cgroups, Subtree):
                    limits = Limits(spec.cpu_milli, spec.memory_mib, self.pids_max)
                    leaf = self.cgroups.make_leaf(spec.job_id, spec.attempt, limits)
                body = {
                    "job_id": spec.job_id,
                    "attempt": spec.attempt,
                    "argv": list(spec.command),
                    "env": job_environment(spec),
                    "cwd": spec.cwd,
                    "drop": None
                    if identity is None
                    else {"uid": identity.uid, "gid": identity.gid, "groups": list(identity.groups)},
                    "time_limit_s": spec.time_limit_s,
                    "grace_s": self.grace_s,
                    "prefix": str(prefix),
                    "log_fd": LOG_FD,
                    "lock_fd": LOCK_FD,
                    "record_fd": RECORD_FD,
                    "script": spec.script,
                    "outputs": None
                    if spec.output is None and spec.error is None
                    else {"output": spec.output, "error": spec.error, "append": spec.attempt > 1},
                    "cgroup": None if leaf is None else str(leaf),
                    "cgroup_v1": []
                    if leaf is None or not isinstance(self.cgroups, Subtree)
                    else [str(v) for v in self.cgroups.v1_leaves(leaf)],
                }
                spec_r, spec_w = os.pipe()
                answer_r, answer_w = os.pipe()
                pipes = [spec_w, answer_r]
                try:
                    self._send([spec_r, answer_w, lock_fd, log_fd, record_fd])
                finally:
                    os.close(spec_r)
                    os.close(answer_w)
            except BaseException:
                for fd in pipes:
                    os.close(fd)
                self._remove_leaf(leaf)
                raise
            finally:
                # The supervisor holds its own copies (the lock lives on in the shared open file description).
                os.close(lock_fd)
                for fd in (log_fd, record_fd):
                    if fd >= 0:
                        os.close(fd)
            answer, heard = self._answer(spec_w, answer_r, json.dumps(body).encode())
            if not answer and not _lock_free(prefix):
                # No answer in time, but a supervisor lives: if its record has a pid, it runs the job (a slow start).
                late = _read_record(prefix) or {}
                answer = late if "pid" in late else answer
            if "pid" not in answer:
                os.close(answer_r)
                self._remove_leaf(leaf)  # (only if empty: the child that failed before its exec is reaped)
                code = answer.get("errno")
                message = f"job {spec.job_id}: {answer.get('message', 'its supervisor did not answer')}"
                raise OSError(code, message) if isinstance(code, int) else OSError(errno.EIO, message)
            pid, start = int(answer["pid"]), int(answer["start_time"])
            sup = answer.get("supervisor") or {}
            os.set_blocking(answer_r, False)
            self._jobs[spec.job_id] = _Supervised(
                spec.job_id, spec.attempt, prefix, pid, start, int(sup.get("pid", 0)), sup.get("start_time"),
                leaf=leaf, pipe=answer_r, heard=heard,
            )  # fmt: skip
            return Handle(spec.job_id, pid, start)

    def _send(self, fds: list[int]) -> None:
        """Hand a request to the zygote (started, or started again, as needed)."""
        for tries in (1, 2):
            if self._ctl is None or self._zygote is None or self._zygote.poll() is not None:
                self._start_zygote()
            assert self._ctl is not None
            try:
                socket.send_fds(self._ctl, [b"L"], fds)
                return
            except OSError:
                if tries == 2:
                    raise
                self._stop_zygote()

    def _start_zygote(self) -> None:
        self._stop_zygote()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._zygote = subprocess.Popen(
                [sys.executable, "-I", "-S", str(SUPERVISOR), "--zygote"],
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},  # the jobs' env comes with each request
            )
        finally:
            theirs.close()
        self._ctl = ours

    def _stop_zygote(self) -> None:
        if self._ctl is not None:
            self._ctl.close()  # EOF: the zygote exits (its supervisors live on)
            self._ctl = None
        if self._zygote is not None:
            try:
                self._zygote.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._zygote.kill()
                self._zygote.wait()
            self._zygote = None

    @staticmethod
    def _answer(spec_w: int, answer_r: int, body: bytes) -> tuple[dict[str, Any], bytes]:
        """Send the spec, read the one-line answer (bounded in time), and whatever came after it. The pipe stays
        open: the supervisor writes the job's end on it too."""
        try:
            with open(spec_w, "wb") as pipe:  # closes spec_w
                pipe.write(body)
        except BrokenPipeError:
            pass
        line = b""
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while b"\n" not in line:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([answer_r], [], [], left)[0]:
                break
            chunk = os.read(answer_r, 4096)
            if not chunk:
                break
            line += chunk
        first, _, rest = line.partition(b"\n")
        try:
            answer = json.loads(first)
        except ValueError:
            return {}, rest
        return (answer if isinstance(answer, dict) else {}), rest

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
            if tracked is None:
                return
            if isinstance(tracked, _Supervised):
                self._cancel_supervised(tracked, grace_s)
                return
            if not self._alive(tracked):
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
            known = self._jobs.get(job_id)
            if readopt(known, job_id, pid, start_time):
                return True
            st = read_proc_stat(pid)
            if st is None or st.start_time != start_time or st.state in ("Z", "X", "x"):
                return False
            deadline = None if time_limit_s is None else time.monotonic() + max(0.0, time_limit_s)
            self._jobs[job_id] = _Tracked(job_id, pid, start_time, st.pgrp == pid, deadline)
            if deadline is not None:
                self._kick()
            return True

    def reattach(self, job_id: str, attempt: int) -> Reattached:
        prefix = self._prefix(job_id, attempt)
        with self._lock:
            known = self._jobs.get(job_id)
            if isinstance(known, _Supervised) and known.attempt == attempt:
                return Reattached(Found.ALIVE, Handle(job_id, known.pid, known.start_time))
            alive = not _lock_free(prefix)
            record = _read_record(prefix)
            leaf = self._leaf(job_id, attempt)
            if record is not None and record.get("ended") and (leaf is None or not populated(str(leaf))):
                self._remove_leaf(leaf)
                return Reattached(Found.ENDED, exit=_exit_of(job_id, record))
            if record is not None and "error" in record:  # it could not start: nothing ran
                return Reattached(Found.NEVER_STARTED)
            if alive:
                # The supervisor writes its "started" record right after the fork; wait for it briefly.
                deadline = time.monotonic() + 5.0
                while (
                    (record is None or "pid" not in record) and time.monotonic() < deadline and not _lock_free(prefix)
                ):
                    time.sleep(0.01)
                    record = _read_record(prefix)
                if record is None or "pid" not in record:
                    record = _read_record(prefix)
                    if record is not None and record.get("ended"):
                        return Reattached(Found.ENDED, exit=_exit_of(job_id, record))
                    return Reattached(Found.ALIVE)  # pragma: no cover - a supervisor stuck before its fork
                watched = self._watch_record(job_id, attempt, prefix, record, leaf)
                return Reattached(Found.ALIVE, Handle(job_id, watched.pid, watched.start_time))
            if record is not None and leaf is not None and populated(str(leaf)):
                # Its supervisor is gone (killed), its processes are not: the job is held until its cgroup is empty,
                # then reported with its exit unknown (or as recorded), like a job whose supervisor dies under us.
                kill_cgroup(str(leaf))
                watched = self._watch_record(job_id, attempt, prefix, record, leaf)
                watched.ending = ORPHANED
                return Reattached(Found.ALIVE, Handle(job_id, watched.pid, watched.start_time))
            if record is None:
                self._remove_leaf(leaf)
                return Reattached(Found.NEVER_STARTED)
            # Started, and its supervisor is gone without a word: kill what may be left, so a retry runs alone.
            pid, start = int(record.get("pid", 0)), record.get("start_time")
            st = read_proc_stat(pid)
            if st is not None and st.start_time == start and st.pgrp == pid:
                self._killpg(pid, signal.SIGKILL)
            self._remove_leaf(leaf)
            return Reattached(Found.GONE)

    def _watch_record(
        self, job_id: str, attempt: int, prefix: Path, record: dict[str, Any], leaf: Path | None
    ) -> _Supervised:
        sup = record.get("supervisor") or {}
        watched = _Supervised(
            job_id,
            attempt,
            prefix,
            int(record.get("pid", 0)),
            int(record.get("start_time", 0)),
            int(sup.get("pid", 0)),
            sup.get("start_time"),
            leaf=leaf,
        )
        self._jobs[job_id] = watched
        return watched

    def _leaf(self, job_id: str, attempt: int) -> Path | None:
        """The attempt's cgroup leaf, if it has one (it exists)."""
        if not isinstance(self.cgroups, Subtree):
            return None
        leaf = self.cgroups.leaf(job_id, attempt)
        return leaf if leaf.is_dir() else None

    def _remove_leaf(self, leaf: Path | None) -> None:
        if leaf is not None and isinstance(self.cgroups, Subtree):
            self.cgroups.remove_leaf(leaf)

    def forget(self, job_id: str, attempt: int) -> None:
        prefix = self._prefix(job_id, attempt)
        with self._lock:
            known = self._jobs.get(job_id)
            if isinstance(known, _Supervised) and known.attempt == attempt:
                return
            done = _read_record(prefix) or {}
            # An ended record is final (its supervisor only exits after writing it), so it may go before that exit.
            if done.get("ended") or "error" in done or _lock_free(prefix):
                leaf = self._leaf(job_id, attempt)
                if leaf is not None and populated(str(leaf)):
                    return  # never: its exit is reported only once the cgroup is empty; kept to be safe
                self._remove_leaf(leaf)
                for suffix in (".json", ".cancel", ".json.tmp", ".cancel.tmp", ".lock"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f"{prefix}{suffix}")

    def sweep(self, keep: set[tuple[str, int]]) -> None:
        names: set[tuple[str, int]] = set()
        for entry in os.scandir(self.run_dir):
            stem = entry.name.split(".json")[0].split(".lock")[0].split(".cancel")[0]
            job_id, _, number = stem.rpartition(".")
            if number.isdigit() and _SAFE_ID.fullmatch(job_id):
                names.add((job_id, int(number)))
        for job_id, attempt in sorted(names - keep):
            self.forget(job_id, attempt)
        if not isinstance(self.cgroups, Subtree):
            return
        with self._lock:
            watched = {(t.job_id, t.attempt) for t in self._jobs.values() if isinstance(t, _Supervised)}
        for leaf in self.cgroups.leaves():  # a leaf left without any record: empty it unless a supervisor holds it
            job_id, _, number = leaf.name.removeprefix("job-").rpartition(".")
            key = (job_id, int(number)) if number.isdigit() else None
            if key in keep or key in watched or key in names:
                continue
            if key is not None and _SAFE_ID.fullmatch(key[0]) and not _lock_free(self.run_dir / f"{key[0]}.{key[1]}"):
                continue
            if populated(str(leaf)):
                kill_cgroup(str(leaf))
            self.cgroups.remove_leaf(leaf)

    def running(self) -> set[str]:
        with self._lock:
            return set(self._jobs)

    # -------------------------------------------------------------------------------------------- extras
    def handle(self, job_id: str) -> Handle | None:
        with self._lock:
            t = self._jobs.get(job_id)
            return None if t is None else Handle(t.job_id, t.pid, t.start_time)

    def close(self) -> None:
        """Stop the watcher thread and further launches. Running jobs are left to their supervisors (a restarted
        daemon reattaches them); `poll` and `cancel` still work."""
        with self._lock:
            self._closed = True
            self._wake.notify_all()
            watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join()
        with self._lock:
            self._stop_zygote()
            for t in self._jobs.values():  # a supervisor writing to a closed pipe goes on (EPIPE is ignored)
                if isinstance(t, _Supervised) and t.pipe is not None:
                    os.close(t.pipe)
                    t.pipe = None
        if self._own_dir and not self.running():
            shutil.rmtree(self.run_dir, ignore_errors=True)
        if isinstance(self.cgroups, Subtree):
            self.cgroups.close()  # only once empty: the leaves of jobs that outlive this daemon keep it

    # -------------------------------------------------------------------------------------------- internals
    # Everything below runs with self._lock held.
    def _supervisor_alive(self, t: _Supervised) -> bool:
        return not _lock_free(t.prefix)

    def _cancel_supervised(self, t: _Supervised, grace_s: float) -> None:
        if not self._supervisor_alive(t):
            return
        if grace_s > 0:
            with contextlib.suppress(OSError):  # without it, the supervisor uses its own grace
                _write_text(Path(f"{t.prefix}.cancel"), f"{grace_s!r}")
        st = read_proc_stat(t.supervisor_pid)  # not our child: make sure the PID still names that supervisor
        if st is None or st.start_time != t.supervisor_start or st.state in ("Z", "X", "x"):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(t.supervisor_pid, signal.SIGUSR1 if grace_s > 0 else signal.SIGUSR2)

    def _alive(self, t: _Tracked) -> bool:
        st = read_proc_stat(t.pid)
        return st is not None and st.start_time == t.start_time and st.state not in ("Z", "X", "x")

    def _reap(self, t: _Supervised | _Tracked) -> Exit | None:
        if isinstance(t, _Tracked):
            return None if self._alive(t) else Exit(t.job_id, None, None, t.timed_out)
        if self._supervisor_alive(t):
            return None
        if t.leaf is not None and populated(str(t.leaf)):
            # Its supervisor is gone, yet processes of the job run (a kill -9 of the supervisor): they are killed,
            # and the job keeps its grant until its cgroup is empty.
            kill_cgroup(str(t.leaf))
            t.ending = ORPHANED
            return None
        record = _read_record(t.prefix)
        told = self._told(t)
        if told is not None and not (record or {}).get("ended"):
            record = told  # the state disk did not keep it; the pipe did
        self._remove_leaf(t.leaf)
        return _exit_of(t.job_id, record)

    @staticmethod
    def _told(t: _Supervised) -> dict[str, Any] | None:
        """The end record the supervisor wrote on its pipe, if any; the pipe is closed."""
        if t.pipe is None:
            return None
        data = t.heard
        with contextlib.suppress(OSError):
            while chunk := os.read(t.pipe, 65536):
                data += chunk
        os.close(t.pipe)
        t.pipe = None
        for line in reversed(data.split(b"\n")):
            with contextlib.suppress(ValueError):
                body = json.loads(line)
                if isinstance(body, dict) and body.get("ended"):
                    return body
        return None

    def _signal(self, t: _Tracked, sig: signal.Signals) -> None:
        # Not our child: make sure the PID still names the adopted process.
        if not self._alive(t):
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
        """Time limits and SIGKILL escalations of processes adopted without a supervisor."""
        with self._wake:
            while not self._closed:
                now = time.monotonic()
                next_due: float | None = None
                for t in self._jobs.values():
                    if not isinstance(t, _Tracked):
                        continue
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
