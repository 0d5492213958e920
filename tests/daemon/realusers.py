"""Real Unix users and a real root `corral serve` for the trust-boundary tests (root only).

with local_users(("a", group), ("b", None)) as users: ...   useradd'd for the test (crl<random>), then removed
as_user(users["a"], [python, "-m", "corral.cli.main", "ps"]) runuser -u NAME -- ...
with root_daemon(state, runtime, env) as daemon: ...        `corral serve` on simulated GPUs, stopped by SIGTERM
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "corral.cli.main"]
PROBE = [sys.executable, str(Path(__file__).with_name("trust_probe.py"))]
NEEDS_ROOT = "needs root: creates Unix users and runs a root daemon that runs jobs as them"


def can_run() -> bool:
    return os.geteuid() == 0 and all(
        os.path.exists(p) for p in ("/usr/sbin/useradd", "/usr/sbin/userdel", "/usr/sbin/runuser")
    )


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: str


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def local_users(*specs: tuple[str, str | None]) -> Iterator[dict[str, User]]:
    """Users (role, group role or None for a group of its own), each with a home; a group role that is not a user
    is created as a group. Removed afterwards, their processes killed first (by pid)."""
    tag = secrets.token_hex(3)
    groups: dict[str, str] = {}
    users: dict[str, User] = {}
    try:
        for role, group in specs:
            name = f"crl{role}{tag}"
            if group is None:
                _run("/usr/sbin/useradd", "-m", "-U", "-s", "/bin/sh", name)
            else:
                if group not in groups and group not in users:
                    groups[group] = f"crl{group}{tag}"
                    _run("/usr/sbin/groupadd", groups[group])
                gname = groups.get(group) or users[group].name
                _run("/usr/sbin/useradd", "-m", "-N", "-g", gname, "-s", "/bin/sh", name)
            entry = pwd.getpwnam(name)
            users[role] = User(name, entry.pw_uid, entry.pw_gid, entry.pw_dir)
        yield users
    finally:
        for user in users.values():
            kill_processes_of(user.uid)
            subprocess.run(["/usr/sbin/userdel", "-r", "-f", user.name], capture_output=True, timeout=30)
        for gname in groups.values():
            subprocess.run(["/usr/sbin/groupdel", gname], capture_output=True, timeout=30)


def processes_of(uid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    found.append(int(entry.name))
    return found


def kill_processes_of(uid: int) -> None:
    for pid in processes_of(uid):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def user_env(**extra: str) -> dict[str, str]:
    """A plain login-like environment for a user's command, with this checkout importable."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONPATH": str(ROOT), **extra}


def as_user(
    user: User, argv: Sequence[str], env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`argv` run as `user` (runuser: that uid, its groups, its HOME), from /tmp."""
    return subprocess.run(
        ["/usr/sbin/runuser", "-u", user.name, "--", *argv],
        env=env if env is not None else user_env(),
        cwd="/tmp",
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass
class Daemon:
    process: subprocess.Popen[str]
    state: Path
    socket: Path


@contextlib.contextmanager
def root_daemon(state: Path, args: Sequence[str], socket: Path, env: dict[str, str]) -> Iterator[Daemon]:
    """`corral serve --simulate-gpus 2xA100-80GB --state-dir STATE ARGS` as root, until SIGTERM; `socket` is where
    it is expected to listen."""
    server = subprocess.Popen(
        [*CLI, "serve", "--simulate-gpus", "2xA100-80GB", "--state-dir", str(state), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for("the daemon's socket", lambda: socket.exists() or server.poll() is not None, timeout=30)
        assert server.poll() is None, server.communicate()[0]
        yield Daemon(server, state, socket)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            output, _ = server.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            output, _ = server.communicate()
        assert server.returncode == 0, output
