"""Each job attempt in a cgroup v2 leaf of its own: what its supervisor kills, and what must be empty before its grant
is released (issue 23).

    the v2 mount       from /proc/self/mountinfo (fstype cgroup2), never assumed (/sys/fs/cgroup, or
                       /sys/fs/cgroup/unified on a hybrid machine)
    the daemon's own   from /proc/self/cgroup (the "0::" line)
    the subtree        delegated (systemd Delegate=yes: the cgroup carries trusted.delegate=1, or user.delegate=1):
                         the daemon's own cgroup; the daemon moves itself into OWN/daemon first (no process may sit
                         in a cgroup that hands controllers to its children)
                       otherwise: OWN/corral-<hash of the run folder>, made by the daemon (root can; an unprivileged
                         user's daemon usually cannot: then no cgroups, process groups as before, and it says so)
    a leaf             SUBTREE/job-<job id>.<attempt> (a gang instance's id is "<job>_<i>"), made before the launch
                       with the request's limits where the controllers are there: cpu.max (CPU milli), memory.max
                       (memory MiB; swap off), pids.max (a fork bomb's bound); the job's first act, in the
                       supervisor's child, is to write itself into the leaf's cgroup.procs
    the end            the supervisor kills the leaf (cgroup.kill) and waits for cgroup.events "populated 0" before
                       it records the end and exits; a daemon finding a dead supervisor does the same
                       (`LocalExecutor`); empty leaves are removed

Only cgroup v2 is used: on a hybrid machine the v1 controllers (memory, pids on their own mounts) are left alone,
and the leaf still contains and kills the job; where the v2 controllers exist the limits are written.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from corral.executor._supervise import empty_cgroup, kill_cgroup, populated

__all__ = [
    "DEFAULT_PIDS_MAX",
    "Limits",
    "NoCgroups",
    "Subtree",
    "empty_cgroup",
    "find_v2_mount",
    "kill_cgroup",
    "own_cgroup",
    "populated",
    "prepare",
]

#: pids.max of a job's leaf where the pids controller is there: ample for a real job, a wall for a fork bomb.
DEFAULT_PIDS_MAX = 32768
#: The controllers corral sets limits with, where the v2 hierarchy has them.
WANTED = ("cpu", "memory", "pids")
#: cpu.max's period (microseconds): the kernel's default.
CPU_PERIOD_US = 100_000
LEAF_PREFIX = "job-"
log = logging.getLogger("corral.executor")


@dataclass(frozen=True)
class Limits:
    """What a leaf enforces where the controllers exist; 0 (or None) = no limit."""

    cpu_milli: int = 0
    memory_mib: int = 0
    pids_max: int | None = DEFAULT_PIDS_MAX


@dataclass(frozen=True)
class NoCgroups:
    """No cgroup can be made: jobs are contained by their process groups only (a setsid escapes them)."""

    reason: str

    @property
    def notice(self) -> str:
        return f"no cgroups: falling back to process groups ({self.reason})"


@dataclass(frozen=True)
class Subtree:
    """The cgroup under which this executor makes one leaf per attempt."""

    path: Path
    controllers: frozenset[str]  # enabled for the leaves (those of WANTED the v2 hierarchy has here)
    delegated: bool  # the daemon's own cgroup, delegated to it (never removed)

    @property
    def notice(self) -> str:
        limits = ", ".join(sorted(self.controllers)) or "none (no v2 controllers here)"
        return f"jobs contained in cgroup v2 leaves under {self.path}; limits: {limits}"

    def leaf(self, job_id: str, attempt: int) -> Path:
        return self.path / f"{LEAF_PREFIX}{job_id}.{attempt}"

    def make_leaf(self, job_id: str, attempt: int, limits: Limits) -> Path:
        """A fresh, empty leaf with `limits` written where the controllers are there. OSError if it cannot be made
        (the launch then fails: a job never runs uncontained where cgroups work)."""
        leaf = self.leaf(job_id, attempt)
        try:
            leaf.mkdir()
        except FileExistsError:  # left by an attempt of a reused id (tests): it must be empty to be reused
            if populated(str(leaf)):
                empty_cgroup(str(leaf))
        for name, value in self.limit_files(limits).items():
            try:
                (leaf / name).write_text(value)
            except OSError as exc:  # a limit the kernel refuses is logged; containment itself does not depend on it
                log.warning("cgroup %s: cannot write %s = %s (%s)", leaf, name, value, exc)
        return leaf

    def limit_files(self, limits: Limits) -> dict[str, str]:
        """The interface files and values for `limits`, for the controllers enabled here."""
        files: dict[str, str] = {}
        if "cpu" in self.controllers and limits.cpu_milli > 0:
            files["cpu.max"] = f"{limits.cpu_milli * CPU_PERIOD_US // 1000} {CPU_PERIOD_US}"
        if "memory" in self.controllers and limits.memory_mib > 0:
            files["memory.max"] = str(limits.memory_mib * 1024 * 1024)
            files["memory.swap.max"] = "0"  # the request is memory, not memory plus swap
        if "pids" in self.controllers and limits.pids_max:
            files["pids.max"] = str(limits.pids_max)
        return files

    def remove_leaf(self, leaf: Path) -> bool:
        """Remove an empty leaf (and any empty cgroup below it). False while it has processes."""
        if populated(str(leaf)):
            return False
        for folder, subdirs, _ in os.walk(leaf, topdown=False):
            for sub in subdirs:
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(os.path.join(folder, sub))
        try:
            leaf.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            return False
        return True

    def leaves(self) -> list[Path]:
        try:
            return sorted(p for p in self.path.iterdir() if p.name.startswith(LEAF_PREFIX) and p.is_dir())
        except OSError:
            return []

    def close(self) -> None:
        """Remove the subtree if nothing is left in it (never a delegated one: it is the daemon's own cgroup)."""
        if not self.delegated:
            with contextlib.suppress(OSError):
                self.path.rmdir()


# ------------------------------------------------------------------------------------------------ discovery
def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def find_v2_mount(mountinfo: str) -> Path | None:
    """The cgroup2 mount point in a /proc/self/mountinfo text, None if there is none."""
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        fstype = line.split(" - ", 1)[1].split()[0]
        if fstype == "cgroup2":
            return Path(_unescape(fields[4]))
    return None


def own_cgroup(proc_cgroup: str) -> str | None:
    """This process's v2 cgroup ("/" or "/system.slice/corral.service") from a /proc/self/cgroup text."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].removesuffix(" (deleted)") or "/"
    return None


def _delegated(path: Path) -> bool:
    for name in ("trusted.delegate", "user.delegate"):
        with contextlib.suppress(OSError):
            if os.getxattr(path, name).strip() == b"1":
                return True
    return False


def _read(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text()
    return ""


def _enable(folder: Path, controllers: list[str]) -> set[str]:
    """Enable `controllers` for `folder`'s children, one by one; the ones that took."""
    done = set(_read(folder / "cgroup.subtree_control").split())
    for name in controllers:
        if name in done:
            continue
        try:
            (folder / "cgroup.subtree_control").write_text(f"+{name}")
            done.add(name)
        except OSError as exc:
            log.info("cgroup %s: controller %s not enabled (%s)", folder, name, exc)
    return done


def prepare(
    run_dir: Path,
    *,
    mountinfo: str | None = None,
    proc_cgroup: str | None = None,
    mount: Path | None = None,
) -> Subtree | NoCgroups:
    """The executor's subtree, made (or found again after a restart) for `run_dir`, or why there is none.

    `mountinfo`, `proc_cgroup`: the texts of /proc/self/mountinfo and /proc/self/cgroup (read when None); `mount`:
    the v2 mount point, overriding the one found (tests point it at a folder shaped like a cgroup tree)."""
    if mount is None:
        if mountinfo is None:
            mountinfo = _read(Path("/proc/self/mountinfo"))
        mount = find_v2_mount(mountinfo)
        if mount is None:
            return NoCgroups("no cgroup v2 hierarchy is mounted")
    if proc_cgroup is None:
        proc_cgroup = _read(Path("/proc/self/cgroup"))
    own = own_cgroup(proc_cgroup)
    if own is None:
        return NoCgroups("this process is in no cgroup v2 (no 0:: line in /proc/self/cgroup)")
    home = mount / own.lstrip("/")
    if not (home / "cgroup.procs").exists():
        return NoCgroups(f"this process's cgroup {home} is not visible (a cgroup namespace?)")
    if own != "/" and _delegated(home):
        return _prepare_delegated(home)
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:12]
    path = home / f"corral-{digest}"
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        hint = "; run the daemon as root, or under systemd with Delegate=yes" if exc.errno in _DENIED else ""
        return NoCgroups(f"cannot create {path}: {why}{hint}")
    if not (path / "cgroup.kill").exists() and not (path / "cgroup.freeze").exists():
        with contextlib.suppress(OSError):
            path.rmdir()
        return NoCgroups(f"the kernel's cgroup v2 at {mount} has neither cgroup.kill nor cgroup.freeze (Linux < 5.2)")
    wanted = [c for c in WANTED if c in _read(path / "cgroup.controllers").split()]
    if own == "/":  # the root cgroup may hold processes and hand controllers down; any other may not (no-internal-
        wanted = [c for c in wanted if c in _enable(home, wanted)]  # processes rule), so its own setting stands
    controllers = _enable(path, [c for c in wanted if c in _read(path / "cgroup.controllers").split()])
    return Subtree(path, frozenset(controllers) & set(WANTED), delegated=False)


_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)


def _prepare_delegated(home: Path) -> Subtree | NoCgroups:
    """systemd's Delegate=yes: the service's cgroup is the daemon's to manage. Its own processes (the daemon, its
    zygote, the supervisors) go to HOME/daemon, so that HOME may hand controllers to the jobs' leaves."""
    daemon = home / "daemon"
    try:
        daemon.mkdir(exist_ok=True)
        for pid in _read(home / "cgroup.procs").split():
            with contextlib.suppress(ProcessLookupError):  # gone meanwhile
                (daemon / "cgroup.procs").write_text(pid)
    except OSError as exc:
        return NoCgroups(f"cannot move the daemon into {daemon}: {os.strerror(exc.errno or errno.EIO)}")
    wanted = [c for c in WANTED if c in _read(home / "cgroup.controllers").split()]
    return Subtree(home, frozenset(_enable(home, wanted)) & set(WANTED), delegated=True)
