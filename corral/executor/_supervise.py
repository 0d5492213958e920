"""The supervisor of one job attempt: a small process that outlives the daemon (the slurmstepd / conmon pattern).

Forked by the daemon's zygote (`python -I -S _supervise.py --zygote`, see `zygote`), in its own session, with:
    stdin    the launch spec as JSON (never argv: /proc/PID/cmdline is world-readable, the env holds secrets)
    stdout   a pipe on which it answers: {"pid", "start_time"} when the job runs, or {"errno", "message"}; kept open,
             and the end record is written there too when the job is over (the daemon, while alive, hears of the
             outcome without reading the state disk)
    LOCK_FD  an open file description on PREFIX.lock, locked (flock LOCK_EX) by the daemon *before* the spawn and
             held here for the supervisor's whole life: a daemon probing it with LOCK_NB knows, without any PID, whether
             the supervisor still lives (a PID may be reused; a lock dies with its holder)
    LOG_FD   the job's log, opened by the daemon with its checks (O_NOFOLLOW, link count, owner)
    RECORD_FD PREFIX.json, created by the daemon at its full size (RECORD_SIZE bytes of blanks): the record is only
             ever overwritten in place, so a full state disk cannot take the exit code (issue 23)

    nobody reads the answer pipe any more (the daemon gave up on the launch, or died): exit, the job never runs
    fork -> child: joins the attempt's cgroup leaf (spec "cgroup", when the daemon made one) before anything else,
                   setsid (the job's own process group), stdin /dev/null, stdout+stderr -> log, signals reset,
                   drop to the job's groups/gid/uid, enter cwd *as the user*, exec
    PREFIX.json slot 0 <- {"started": ...}     (pwrite in place: the daemon may need the pid before the answer)
    wait: the child's exit, the time limit, SIGUSR1 (cancel: SIGTERM to every process of the job, SIGKILL after the
          grace read from PREFIX.cancel), SIGUSR2 (cancel: SIGKILL now), SIGTERM/SIGINT/SIGHUP (forwarded, not a
          cancel)
    exit: the child has exited (its zombie still pins the PID): kill the whole cgroup (cgroup.kill; a setsid'd or
          double-forked grandchild dies too) and wait until it is empty (cgroup.events "populated 0"), else SIGKILL
          the process group; reap, then
    PREFIX.json slot 1 <- {"ended": exit code / signal, timed out, cancelled, OOM kills, end time}  (pwrite, fsync)
                 and the same line on the answer pipe
    Only then does it exit, which frees the lock: so the daemon, which releases a job's GPUs when the lock is free,
    never hands them on while a process of the job still runs.

Only the standard library, and nothing imported that is not needed: it starts once per job.
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import sys
import time

TYPE_CHECKING = False  # typing costs ~10 ms at every start; mypy reads this import, the interpreter never does
if TYPE_CHECKING:
    from typing import Any, NoReturn

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
CANCEL, KILL_NOW = signal.SIGUSR1, signal.SIGUSR2
WATCHED = {signal.SIGCHLD, CANCEL, KILL_NOW, *FORWARDED}


#: The attempt's record file: two fixed slots of blanks-padded JSON, written in place (pwrite), never resized. Slot 0
#: holds the start (pids), slot 1 the end: a torn end write (a machine crash) leaves the start readable.
RECORD_SIZE = 4096
SLOT = RECORD_SIZE // 2


def put(fd: int, slot: int, body: dict[str, Any], durable: bool) -> None:
    """Overwrite one slot of the record in place; `durable`: also survive a machine crash (fsync)."""
    data = json.dumps(body).encode()
    if len(data) >= SLOT and "error" in body:  # only an error's message can be long: cut it
        body = dict(body, error={**body["error"], "message": str(body["error"].get("message"))[: SLOT // 2]})
        data = json.dumps(body).encode()
    os.pwrite(fd, data.ljust(SLOT - 1) + b"\n", slot * SLOT)
    if durable:
        os.fsync(fd)


def fsync_dir(path: str) -> None:
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


# ------------------------------------------------------------------------------------------------ cgroups
# Shared with the daemon (corral.executor.cgroup imports them): the supervisor cannot import corral (-I -S).
def populated(leaf: str) -> bool:
    """True while a process is in the cgroup `leaf` or below (cgroup.events); False once it is empty or gone."""
    try:
        with open(f"{leaf}/cgroup.events", "rb") as f:
            return b"populated 1" in f.read()
    except FileNotFoundError:
        return False


def cgroup_pids(leaf: str) -> list[int]:
    """The processes of `leaf` and of any cgroup below it."""
    pids: list[int] = []
    for folder, _, _ in os.walk(leaf):
        try:
            with open(f"{folder}/cgroup.procs", "rb") as f:
                pids.extend(int(p) for p in f.read().split())
        except FileNotFoundError:
            continue
    return pids


def signal_cgroup(leaf: str, sig: int, signalled_group: int | None = None) -> None:
    """`sig` to every process of the cgroup (a SIGTERM reaches setsid'd children too, not only the job's group), but
    not to those of `signalled_group`, the job's process group that was just sent it: a process that handles SIGTERM
    must get it once (a shell's trap ran twice, saving its work twice)."""
    for pid in cgroup_pids(leaf):
        try:
            if signalled_group is None or os.getpgid(pid) != signalled_group:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_cgroup(leaf: str) -> None:
    """SIGKILL every process of the cgroup at once (cgroup.kill, Linux 5.14); where it is missing, freeze the cgroup
    (no fork can race the kill), SIGKILL each process, thaw."""
    try:
        with open(f"{leaf}/cgroup.kill", "w") as f:
            f.write("1")
        return
    except FileNotFoundError:
        if not os.path.isdir(leaf):
            return
    frozen = False
    try:
        with open(f"{leaf}/cgroup.freeze", "w") as f:
            f.write("1")
        frozen = True
    except OSError:
        pass
    signal_cgroup(leaf, signal.SIGKILL)
    if frozen:
        try:
            with open(f"{leaf}/cgroup.freeze", "w") as f:
                f.write("0")
        except OSError:
            pass


def empty_cgroup(leaf: str) -> None:
    """Kill the cgroup and return once it is empty (cgroup.events "populated 0"). A process stuck in the kernel (D
    state) keeps it populated: the kill is repeated every second and the wait goes on, with the job's grant held."""
    kill_cgroup(leaf)
    pause, last = 0.001, time.monotonic()
    while populated(leaf):
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
        if time.monotonic() - last >= 1.0:
            kill_cgroup(leaf)
            last = time.monotonic()


def oom_kills(folders: list[str]) -> int:
    """How many processes of the job the kernel's OOM killer took: memory.events (v2) or memory.oom_control (v1)
    `oom_kill` of its cgroups; 0 without a memory controller."""
    kills = 0
    for folder in folders:
        for name in ("memory.events", "memory.oom_control"):
            try:
                with open(f"{folder}/{name}", "rb") as f:
                    for line in f:
                        key, _, value = line.partition(b" ")
                        if key == b"oom_kill":
                            kills += int(value)
            except (OSError, ValueError):
                pass
    return kills


def start_time(pid: int) -> int:
    """/proc/<pid>/stat field 22 (clock ticks after boot); fields counted after the last ')'."""
    with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
        text = f.read()
    return int(text[text.rindex(")") + 2 :].split()[19])


def child(spec: dict[str, Any], err_w: int) -> NoReturn:
    """In the forked child: become the job. Never returns."""
    try:
        leaf = spec.get("cgroup")
        for folder in ([leaf] if leaf else []) + list(spec.get("cgroup_v1") or ()):
            # before the job's first instruction: nothing of it ever runs outside its cgroup (nor its v1 limits)
            with open(f"{folder}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
        os.setsid()
        os.umask(0o022)  # a login's, not the daemon's 077 (which keeps the state directory private)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):  # Python's own dispositions; exec keeps SIG_IGN
            signal.signal(sig, signal.SIG_DFL)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(spec["log_fd"], 1)
        os.dup2(spec["log_fd"], 2)
        drop = spec["drop"]
        if drop is not None:
            os.setgroups(drop["groups"])
            os.setgid(drop["gid"])
            os.setuid(drop["uid"])
        try:
            os.chdir(spec["cwd"])
        except OSError:
            if drop is None:
                raise
            # The user cannot enter it: root's right to traverse any directory must not leak to the job.
            os.write(2, f"corral: the job cannot enter its working directory {spec['cwd']} as its user\n".encode())
            os._exit(126)
        outputs = spec.get("outputs")
        if outputs:  # as the job's user, after the drop: only what that user may write (open_output)
            redirect(outputs, os.getuid())
        if spec.get("script") is not None:
            run_script(spec["script"], spec["argv"], spec["env"])
        execute(spec["argv"], spec["env"])
    except OSError as exc:
        os.write(err_w, json.dumps({"errno": exc.errno, "message": exc.strerror or str(exc)}).encode())
    except BaseException as exc:  # whatever it is, the daemon must hear of it
        os.write(err_w, json.dumps({"errno": None, "message": repr(exc)}).encode())
    os._exit(127)


# ------------------------------------------------------------------------------------------------ batch scripts
O_PATH = getattr(os, "O_PATH", 0o10000000)
MFD_EXEC = 0x10  # Linux 6.3: an executable memfd, said out loud (older kernels refuse the flag: then without it)
DEV_NULL = os.makedev(1, 3)


def output_dir(path: str, label: str, uid: int) -> tuple[int, str]:
    """(an O_PATH descriptor of the directory of `path`, its last component), walked one component at a time as
    the job's user: a symbolic link on the way is followed only when that user or root owns it (another user's
    link is how they would make the job write where they point). OSError names `label` and the path."""
    head, _, last = path.rpartition("/")
    if last in ("", ".", ".."):
        raise OSError(errno.EISDIR, f"{label} {path}: names a directory, not a file")
    fd = os.open("/", O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    todo = [p for p in head.split("/") if p not in ("", ".")][::-1]
    walked, hops = "", 0
    try:
        while todo:
            part = todo.pop()
            try:
                nfd = os.open(part, O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                raise OSError(exc.errno, f"{label} {path}: {walked}/{part}: {exc.strerror}") from None
            st = os.fstat(nfd)
            if st.st_mode & 0o170000 == 0o120000:  # a symbolic link (stat.S_ISLNK: one import less at every start)
                try:
                    if st.st_uid not in (uid, 0):
                        raise OSError(
                            errno.EACCES,
                            f"{label} {path}: {walked}/{part} is a symbolic link of uid {st.st_uid}, not of the job's "
                            "user: corral does not write through another user's link",
                        )
                    hops += 1
                    if hops > 40:
                        raise OSError(errno.ELOOP, f"{label} {path}: too many symbolic links")
                    target = os.readlink("", dir_fd=nfd)  # this very link (its name may have been swapped since)
                finally:
                    os.close(nfd)
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                    walked = ""
                todo.extend([p for p in target.split("/") if p not in ("", ".")][::-1])
                continue
            if st.st_mode & 0o170000 != 0o040000:
                os.close(nfd)
                raise OSError(errno.ENOTDIR, f"{label} {path}: {walked}/{part} is not a directory")
            os.close(fd)
            fd, walked = nfd, f"{walked}/{part}"
    except BaseException:
        os.close(fd)
        raise
    return fd, last


def open_output(path: str, label: str, uid: int, append: bool) -> int:
    """The file `path` opened for the job's output, as the job's user (the caller has dropped to it): a regular file
    in a directory that user may write (created 0600; truncated on a first attempt, appended to after), or
    /dev/null; never through a symbolic link as its last component (O_NOFOLLOW), nor another user's on the way."""
    dfd, last = output_dir(path, label, uid)
    try:
        writable = os.access(".", os.W_OK, dir_fd=dfd)
        flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
        if writable:
            flags |= os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
        else:
            flags |= os.O_APPEND  # only /dev/null passes below: nothing is truncated first
        try:  # what is there now, for a clear refusal (the open below checks again: it may change meanwhile)
            kind = os.stat(last, dir_fd=dfd, follow_symlinks=False).st_mode & 0o170000
        except FileNotFoundError:
            kind = 0o100000
        if kind == 0o120000:
            raise OSError(errno.ELOOP, f"{label} {path}: is a symbolic link; corral opens output files only "
                                       "without following one (O_NOFOLLOW)")  # fmt: skip
        if kind not in (0o100000, 0o020000):
            raise OSError(errno.EACCES, f"{label} {path}: is not a regular file")
        try:
            fd = os.open(last, flags, 0o600, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a FIFO put there since, without a reader
                raise OSError(errno.EACCES, f"{label} {path}: is not a regular file") from None
            if exc.errno == errno.ELOOP:
                raise OSError(exc.errno, f"{label} {path}: is a symbolic link; corral opens output files only "
                                         "without following one (O_NOFOLLOW)") from None  # fmt: skip
            if not writable and exc.errno == errno.ENOENT:
                raise OSError(errno.EACCES, f"{label} {path}: the job's user cannot write in its directory") from None
            raise OSError(exc.errno, f"{label} {path}: {exc.strerror}") from None
        st = os.fstat(fd)
        kind = st.st_mode & 0o170000
        problem = None
        if kind == 0o100000 and not writable:
            problem = f"{label} {path}: the job's user cannot write in its directory"
        elif kind == 0o020000 and st.st_rdev == DEV_NULL:
            pass
        elif kind != 0o100000:
            problem = f"{label} {path}: is not a regular file"
        if problem is not None:
            os.close(fd)
            raise OSError(errno.EACCES, problem)
        os.set_blocking(fd, True)
        return fd
    finally:
        os.close(dfd)


def redirect(outputs: dict[str, Any], uid: int) -> None:
    """stdout (and stderr, unless --error says otherwise) to --output, stderr to --error: opened as the job's user."""
    append = bool(outputs.get("append"))
    out, err = outputs.get("output"), outputs.get("error")
    if out:
        fd = open_output(out, "--output", uid, append)
        os.dup2(fd, 1)
        if not err or err == out:
            os.dup2(fd, 2)
        os.close(fd)
    if err and err != out:
        fd = open_output(err, "--error", uid, append)
        os.dup2(fd, 2)
        os.close(fd)


def run_script(text: str, argv: list[str], env: dict[str, str]) -> NoReturn:
    """Run a batch script from a private copy: its stored text in a memfd of the job's own (not the user's file,
    which may have changed since), executed through its #! line. The interpreter reads it as /dev/fd/N ($0)."""
    try:
        fd = os.memfd_create("corral-script", MFD_EXEC)
    except OSError:
        fd = os.memfd_create("corral-script", 0)
    data = text.encode("utf-8")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    try:  # noqa: SIM105 - contextlib is one more import at every start
        os.execve(fd, argv, env)  # fexecve; the descriptor stays open (not close-on-exec) for the interpreter to read
    except OSError:
        pass  # e.g. memfds made not executable (vm.memfd_noexec): run its interpreter ourselves, as the kernel would
    line = text.split("\n", 1)[0][2:].strip()
    interpreter, _, arg = line.partition(" ")
    arg = arg.strip()
    try:
        os.execve(interpreter, [interpreter, *([arg] if arg else []), f"/dev/fd/{fd}", *argv[1:]], env)
    except OSError as exc:
        raise OSError(exc.errno, f"the script's interpreter {line!r}: {exc.strerror}") from None
    raise OSError(errno.ENOEXEC, "the batch script did not run")  # pragma: no cover - execve returns only by raising


def execute(argv: list[str], env: dict[str, str]) -> NoReturn:
    """execvpe, by hand: os.execvpe imports `warnings` here, and after the drop the user may not read the stdlib."""
    name = argv[0]
    if "/" in name:
        os.execve(name, argv, env)
    failure: OSError = FileNotFoundError(errno.ENOENT, "No such file or directory", name)
    for folder in env.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(folder or ".", name), argv, env)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except PermissionError as exc:  # as execvp: go on looking, report EACCES if nothing else runs
            failure = exc
    raise failure


def killpg(pgid: int, sig: signal.Signals) -> None:
    try:  # noqa: SIM105 - contextlib is one more import at every start
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def terminate(pid: int, leaf: str | None, sig: signal.Signals) -> None:
    """`sig` to the whole job: its process group and, with a cgroup, every process in it (SIGKILL: cgroup.kill)."""
    killpg(pid, sig)
    if leaf and sig == signal.SIGKILL:
        kill_cgroup(leaf)
    elif leaf:
        signal_cgroup(leaf, sig, pid)


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def main() -> None:
    spec = json.loads(read_all(0))
    prefix, log_fd, lock_fd, record_fd = spec["prefix"], spec["log_fd"], spec["lock_fd"], spec["record_fd"]
    leaf = spec.get("cgroup") or None
    for fd in (lock_fd, log_fd, record_fd):  # the job must not hold the supervisor's lock, nor its record
        os.set_inheritable(fd, False)
    probe = select.poll()
    probe.register(1, select.POLLOUT)
    if any(events & select.POLLERR for _, events in probe.poll(0)):
        return  # nobody reads the answer: the daemon gave up on this launch (or died), so the job must not run
    signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
    err_r, err_w = os.pipe()  # close-on-exec: EOF once the child has exec'd
    pid = os.fork()
    if pid == 0:
        child(spec, err_w)
    os.close(err_w)
    os.close(log_fd)
    chunks = []
    while chunk := os.read(err_r, 65536):
        chunks.append(chunk)
    os.close(err_r)
    if chunks:  # the job could not start: nothing ran (what it may have forked before exec is in its cgroup)
        os.waitpid(pid, 0)
        if leaf:
            empty_cgroup(leaf)
        failed = json.loads(b"".join(chunks))
        put(record_fd, 1, {"job_id": spec["job_id"], "attempt": spec["attempt"], "error": failed}, True)
        os.write(1, (json.dumps(failed) + "\n").encode())
        return
    me = {"pid": os.getpid(), "start_time": start_time(os.getpid())}
    record = {
        "job_id": spec["job_id"],
        "attempt": spec["attempt"],
        "supervisor": me,
        "pid": pid,
        "start_time": start_time(pid),  # the child is not reaped before the end: its /proc entry is there
        "started_at": time.time(),
    }
    put(record_fd, 0, record, False)  # a daemon crash, not a machine crash, is what this must survive
    try:  # noqa: SIM105
        os.write(1, (json.dumps({"pid": pid, "start_time": record["start_time"], "supervisor": me}) + "\n").encode())
    except OSError:
        pass  # the daemon died meanwhile: the record says it all
    pipe = os.dup(1)  # the outcome goes there too (not inheritable: the job was forked already anyway)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    try:  # the reserved record and its name, durable now, after the answer: off the launch's path
        os.fsync(record_fd)
        fsync_dir(prefix)
    except OSError:
        pass

    grace = float(spec["grace_s"])
    limit = spec["time_limit_s"]
    deadline = None if limit is None else time.monotonic() + float(limit)
    kill_at = None
    timed_out = cancelled = False
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                break
        except ChildProcessError:
            break
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            deadline, timed_out = None, True
            terminate(pid, leaf, signal.SIGTERM)
            kill_at = now + grace if kill_at is None else min(kill_at, now + grace)
        if kill_at is not None and now >= kill_at:
            kill_at = None
            terminate(pid, leaf, signal.SIGKILL)
        due = [t for t in (deadline, kill_at) if t is not None]
        info = signal.sigtimedwait(WATCHED, max(0.0, min(due) - now) if due else 3600.0)
        if info is None or info.si_signo == signal.SIGCHLD:
            continue
        wait = grace
        if info.si_signo in (CANCEL, KILL_NOW):
            cancelled = True
            wait = 0.0 if info.si_signo == KILL_NOW else cancel_grace(prefix, grace)
        terminate(pid, leaf, signal.SIGTERM)
        if wait <= 0:
            terminate(pid, leaf, signal.SIGKILL)
        else:
            now = time.monotonic()
            kill_at = now + wait if kill_at is None else min(kill_at, now + wait)
    # The job's main process has exited; its zombie still pins the PID and the group id. Whatever it left behind (a
    # setsid'd or double-forked grandchild holding a GPU) is killed, and the end waits until the cgroup is empty.
    if leaf:
        empty_cgroup(leaf)
    killpg(pid, signal.SIGKILL)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            status = None
            break
    code = sig = None
    if status is not None and os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
    elif status is not None and os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
    record.update(
        ended_at=time.time(), exit_code=code, signal=sig, timed_out=timed_out, cancelled=cancelled, ended=True
    )
    v1 = list(spec.get("cgroup_v1") or ())
    if leaf:
        record["oom_kills"] = oom_kills([leaf, *v1])
    try:  # noqa: SIM105 - the daemon, if it lives and listens, has the outcome now, whatever the state disk does
        os.write(pipe, (json.dumps(record) + "\n").encode())
    except OSError:
        pass
    put(record_fd, 1, record, True)  # in the space reserved at the start: a full disk cannot refuse it
    for folder in [*v1, leaf] if leaf else ():  # empty now; the daemon removes them too (whichever comes first)
        try:  # noqa: SIM105
            os.rmdir(folder)
        except OSError:
            pass


def cancel_grace(prefix: str, default: float) -> float:
    try:
        with open(f"{prefix}.cancel", encoding="utf-8") as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return default


#: In a supervisor started by the zygote: where the five descriptors of a request are placed (see `zygote`).
SPEC_FD, ANSWER_FD, LOCK_FD, LOG_FD, RECORD_FD = 0, 1, 3, 4, 5
FDS = (SPEC_FD, ANSWER_FD, LOCK_FD, LOG_FD, RECORD_FD)


def zygote() -> None:
    """`--zygote`: one per daemon, started once. Python's start costs ~20 ms of CPU; a fork of this small process
    costs ~1 ms, so each launch forks a supervisor from here instead of starting an interpreter.

    Requests arrive on fd 0 (a Unix socket to the daemon): one byte with five descriptors attached (SCM_RIGHTS):
    the spec pipe's read end, the answer pipe's write end, the attempt's locked lock file, the log, the record. The
    child double-forks (so the supervisor is nobody's child but init's, and outlives this zygote and the daemon),
    starts a session, puts the descriptors at FDS and runs `main`. EOF: the daemon is gone."""
    import fcntl
    import socket

    ctl = socket.socket(fileno=0)
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 1, len(FDS))
        except InterruptedError:
            continue
        except OSError:
            return
        if not msg:
            return
        if len(fds) != len(FDS):
            for fd in fds:
                os.close(fd)
            continue
        child = os.fork()
        if child == 0:
            code = 1
            try:
                ctl.close()
                os.setsid()
                if os.fork() != 0:
                    os._exit(0)
                high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in fds]
                for fd in fds:
                    os.close(fd)
                for fd, target in zip(high, FDS, strict=True):
                    os.dup2(fd, target)
                    os.close(fd)
                main()
                code = 0
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        os.waitpid(child, 0)  # the middle child exits at once; the supervisor lives on


if __name__ == "__main__":
    try:
        zygote() if sys.argv[1:] == ["--zygote"] else main()
    except OSError as exc:  # pragma: no cover - the daemon reads a missing answer as a failed start
        sys.exit(errno.EIO if exc.errno is None else 1)
