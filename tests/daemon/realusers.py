"""Real Unix users and a real root `corral serve` for the trust-boundary tests (root only).

with local_users(("a", group), ("b", None)) as users: ...   useradd'd for the test (crl<random>), then removed
as_user(users["a"], [*CLI, "ps"])                           runuser -u NAME -- ... (user_argv: the same argv, to Popen)
with root_daemon(state, runtime, env) as daemon: ...        `corral serve` on simulated GPUs, stopped by SIGTERM

A user's command runs this checkout's python. Where another user cannot reach it (the checkout under a folder private
to root, such as /root/x; a venv whose python links into root's pyenv), `reach()` builds a view they can: a copy of
the checkout's `corral` and `tests`, and a venv of an interpreter they can run (the same Python version) with this
venv's packages linked in. as_user, user_argv and user_env use it; where no such view can be made, the test is skipped
with the reason, or fails with it under CI=true.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

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


# ------------------------------------------------------------------------- this checkout, as other users reach it
STANDARD_PATH = "/usr/local/bin:/usr/bin:/bin"
NOBODY = 65534  # the uid and gid a reach probe runs as: no group, no right a test user lacks


@dataclass(frozen=True)
class Reach:
    """How another user runs this checkout: `python` (this venv's packages) with `root` on PYTHONPATH."""

    python: str
    root: Path

    def argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` with this process's python and paths into the checkout swapped for the reachable ones."""
        out = []
        for arg in argv:
            if arg == sys.executable:
                arg = self.python
            elif arg.startswith(f"{ROOT}/"):
                arg = str(self.root / arg[len(str(ROOT)) + 1 :])
            out.append(arg)
        return out


class Unreachable(Exception):
    """No way for another user to run this checkout's python was found; the message says what was tried."""


def probe(python: str, root: Path) -> str | None:
    """None where an unprivileged process (uid and gid `NOBODY`, no supplementary groups) can start `python`, import
    the thin client and numpy from `root`, and read the trust probe there; else what it said."""
    script = f"import corral.cli.client, numpy; open({str(root / PROBE[1][len(str(ROOT)) + 1 :])!r}).close()"
    try:
        done = subprocess.run(
            [python, "-c", script],
            env={"PATH": STANDARD_PATH, "LANG": "C.UTF-8", "PYTHONPATH": str(root)},
            cwd="/",
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except OSError as exc:  # the exec itself was refused: EACCES on the interpreter or a folder above it
        return f"{python}: {exc.strerror}"
    return None if done.returncode == 0 else f"{python}: {done.stderr.strip()[-600:]}"


def _copy_sources(root: Path, into: Path) -> None:
    """This checkout's `corral` and `tests` (no caches), readable by all."""
    for part in ("corral", "tests"):
        shutil.copytree(root / part, into / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for folder, dirs, files in os.walk(into):
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)


def _link_tree(source: Path, into: Path) -> None:
    """`source` re-created at `into` with folders all may enter; a file that all may read is hard-linked (the same
    inode: its own mode and the pyc caches' source mtimes hold), any other copied and made readable. Across file
    systems everything is copied."""
    into.mkdir(mode=0o755)
    into.chmod(0o755)
    for entry in os.scandir(source):
        target = into / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.is_dir():
            _link_tree(Path(entry.path), target)
        else:
            if entry.stat().st_mode & stat.S_IROTH:
                try:
                    os.link(entry.path, target)
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                        raise
            shutil.copy2(entry.path, target)
            target.chmod(0o755 if entry.stat().st_mode & stat.S_IXUSR else 0o644)


def interpreters() -> list[str]:
    """Interpreters that may run this venv's packages, this one's first: its real file, the venv's base, and this
    version's python on the standard PATH (the distribution's, in /usr/bin, which every user may run)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = [
        os.path.realpath(sys.executable),
        getattr(sys, "_base_executable", ""),
        shutil.which(version, path=STANDARD_PATH),
    ]
    out: list[str] = []
    for python in found:
        if python and python not in out:
            out.append(python)
    return out


def build_view(root: Path, site: Path, candidates: Sequence[str], into: Path) -> Reach:
    """A view of checkout `root` and the packages in `site` at `into` (which others may traverse): `src` (the
    sources) and `venv` (each candidate interpreter in turn, with `site` linked in), the first that `probe` accepts."""
    src, venv = into / "src", into / "venv"
    _copy_sources(root, src)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (venv / "bin").mkdir(parents=True, mode=0o755)
    (venv / "lib").mkdir(mode=0o755)
    (venv / "lib" / version).mkdir(mode=0o755)
    _link_tree(site, venv / "lib" / version / "site-packages")
    for folder in (venv, venv / "bin", venv / "lib", venv / "lib" / version):
        folder.chmod(0o755)
    python = venv / "bin" / "python"
    tried = []
    for candidate in candidates:
        python.unlink(missing_ok=True)
        python.symlink_to(candidate)
        (venv / "pyvenv.cfg").write_text(
            f"home = {os.path.dirname(candidate)}\ninclude-system-site-packages = false\n"
            f"version = {'.'.join(map(str, sys.version_info[:3]))}\n"
        )
        (venv / "pyvenv.cfg").chmod(0o644)
        why = probe(str(python), src)
        if why is None:
            return Reach(str(python), src)
        tried.append(f"{candidate}: {why}")
    raise Unreachable("; ".join(tried) or "no interpreter to try")


_reach: Reach | Unreachable | None = None


def reach() -> Reach:
    """How another user runs this checkout (found once per process): as it is where they may, else through a view
    in a temporary folder (removed at exit). A checkout nobody else can use skips the calling test, or fails it
    under CI=true, with the reason."""
    global _reach
    if _reach is None:
        _reach = _find_reach()
    if isinstance(_reach, Unreachable):
        message = f"other users cannot run this checkout's python: {_reach}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return _reach


def _find_reach() -> Reach | Unreachable:
    why = probe(sys.executable, ROOT)
    if why is None:
        return Reach(sys.executable, ROOT)
    site = Path(sysconfig.get_paths()["purelib"])
    if sys.prefix == sys.base_prefix:
        return Unreachable(f"{why}; and this python is no venv whose packages a view could hold")
    into = Path(tempfile.mkdtemp(prefix="corral-reach-"))
    into.chmod(0o755)
    atexit.register(shutil.rmtree, into, True)
    try:
        return build_view(ROOT, site, interpreters(), into)
    except Unreachable as exc:
        return Unreachable(f"{why}; nor through a view in {into}: {exc}")


def user_env(**extra: str) -> dict[str, str]:
    """A plain login-like environment for a user's command, with this checkout importable."""
    return {"PATH": STANDARD_PATH, "LANG": "C.UTF-8", "PYTHONPATH": str(reach().root), **extra}


def user_argv(user: User, argv: Sequence[str]) -> list[str]:
    """`argv` to run as `user` (runuser: that uid, its groups, its HOME), through paths the user can reach."""
    return ["/usr/sbin/runuser", "-u", user.name, "--", *reach().argv(argv)]


def as_user(
    user: User, argv: Sequence[str], env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`argv` run as `user` (runuser: that uid, its groups, its HOME), from /tmp."""
    return subprocess.run(
        user_argv(user, argv),
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
