"""The supervisor of one job attempt: a small process that outlives the daemon (the slurmstepd / conmon pattern).

Forked by the daemon's zygote (`python -I -S _supervise.py --zygote`, see `zygote`), in its own session, with:
    stdin    the launch spec as JSON (never argv: /proc/PID/cmdline is world-readable, the env holds secrets)
    stdout   a pipe on which it answers once: {"pid", "start_time"} when the job runs, or {"errno", "message"}
    LOCK_FD  an open file description on PREFIX.lock, locked (flock LOCK_EX) by the daemon *before* the spawn and
             held here for the supervisor's whole life: a daemon probing it with LOCK_NB knows, without any PID, whether
             the supervisor still lives (a PID may be reused; a lock dies with its holder)
    LOG_FD   the job's log, opened by the daemon with its checks (O_NOFOLLOW, link count, owner)

    nobody reads the answer pipe any more (the daemon gave up on the launch, or died): exit, the job never runs
    fork -> child: setsid (the job's own process group), stdin /dev/null, stdout+stderr -> log, signals reset,
                   drop to the job's groups/gid/uid, enter cwd *as the user*, exec
    PREFIX.json  <- {"started": ...}            (write, rename: the daemon may need the pid before the answer)
    wait: the child's exit, the time limit, SIGUSR1 (cancel: SIGTERM to the group, SIGKILL after the grace read from
          PREFIX.cancel), SIGUSR2 (cancel: SIGKILL now), SIGTERM/SIGINT/SIGHUP (forwarded to the group, not a cancel)
    exit: SIGKILL what is left of the group while the zombie still pins the PID, reap, then
    PREFIX.json  <- {"ended": exit code / signal, timed out, cancelled, end time}   (write, fsync, rename, fsync dir)

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


def write_json(path: str, body: dict[str, Any], durable: bool) -> None:
    """Replace `path` atomically; `durable`: also survive a machine crash (fsync the file and the directory)."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(body).encode())
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    if durable:
        dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def start_time(pid: int) -> int:
    """/proc/<pid>/stat field 22 (clock ticks after boot); fields counted after the last ')'."""
    with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
        text = f.read()
    return int(text[text.rindex(")") + 2 :].split()[19])


def child(spec: dict[str, Any], err_w: int) -> NoReturn:
    """In the forked child: become the job. Never returns."""
    try:
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
        execute(spec["argv"], spec["env"])
    except OSError as exc:
        os.write(err_w, json.dumps({"errno": exc.errno, "message": exc.strerror or str(exc)}).encode())
    except BaseException as exc:  # whatever it is, the daemon must hear of it
        os.write(err_w, json.dumps({"errno": None, "message": repr(exc)}).encode())
    os._exit(127)


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


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def main() -> None:
    spec = json.loads(read_all(0))
    prefix, log_fd, lock_fd = spec["prefix"], spec["log_fd"], spec["lock_fd"]
    os.set_inheritable(lock_fd, False)  # the job must not hold the supervisor's lock
    os.set_inheritable(log_fd, False)
    answer = os.fdopen(1, "w")
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
    if chunks:  # the job could not start: nothing ran
        os.waitpid(pid, 0)
        failed = json.loads(b"".join(chunks))
        write_json(f"{prefix}.json", {"job_id": spec["job_id"], "attempt": spec["attempt"], "error": failed}, True)
        answer.write(json.dumps(failed) + "\n")
        answer.close()
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
    write_json(f"{prefix}.json", record, False)  # a daemon crash, not a machine crash, is what this must survive
    try:
        answer.write(json.dumps({"pid": pid, "start_time": record["start_time"], "supervisor": me}) + "\n")
        answer.close()
    except OSError:
        pass  # the daemon died meanwhile: the record says it all
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)

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
            killpg(pid, signal.SIGTERM)
            kill_at = now + grace if kill_at is None else min(kill_at, now + grace)
        if kill_at is not None and now >= kill_at:
            kill_at = None
            killpg(pid, signal.SIGKILL)
        due = [t for t in (deadline, kill_at) if t is not None]
        info = signal.sigtimedwait(WATCHED, max(0.0, min(due) - now) if due else 3600.0)
        if info is None or info.si_signo == signal.SIGCHLD:
            continue
        wait = grace
        if info.si_signo in (CANCEL, KILL_NOW):
            cancelled = True
            wait = 0.0 if info.si_signo == KILL_NOW else cancel_grace(prefix, grace)
        killpg(pid, signal.SIGTERM)
        if wait <= 0:
            killpg(pid, signal.SIGKILL)
        else:
            now = time.monotonic()
            kill_at = now + wait if kill_at is None else min(kill_at, now + wait)
    # The zombie still pins the PID and the group id: kill what is left of the group (a backgrounded grandchild
    # holding a GPU), then reap.
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
    write_json(f"{prefix}.json", record, True)


def cancel_grace(prefix: str, default: float) -> float:
    try:
        with open(f"{prefix}.cancel", encoding="utf-8") as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return default


#: In a supervisor started by the zygote: where the four descriptors of a request are placed (see `zygote`).
SPEC_FD, ANSWER_FD, LOCK_FD, LOG_FD = 0, 1, 3, 4


def zygote() -> None:
    """`--zygote`: one per daemon, started once. Python's start costs ~20 ms of CPU; a fork of this small process
    costs ~1 ms, so each launch forks a supervisor from here instead of starting an interpreter.

    Requests arrive on fd 0 (a Unix socket to the daemon): one byte with four descriptors attached (SCM_RIGHTS):
    the spec pipe's read end, the answer pipe's write end, the attempt's locked lock file, the log. The child
    double-forks (so the supervisor is nobody's child but init's, and outlives this zygote and the daemon), starts a
    session, puts the descriptors at SPEC_FD, ANSWER_FD, LOCK_FD, LOG_FD and runs `main`. EOF: the daemon is gone."""
    import fcntl
    import socket

    ctl = socket.socket(fileno=0)
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 1, 4)
        except InterruptedError:
            continue
        except OSError:
            return
        if not msg:
            return
        if len(fds) != 4:
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
                for fd, target in zip(high, (SPEC_FD, ANSWER_FD, LOCK_FD, LOG_FD), strict=True):
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
