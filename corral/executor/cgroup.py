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

cgroup v2 contains and kills. Limits use the v2 controllers where they exist; on a hybrid machine, where memory and
pids live on v1 mounts, a root daemon makes a leaf of the same name in each of those two v1 hierarchies
(OWN_V1/corral-<hash>/job-<id>.<attempt>) with memory.limit_in_bytes and pids.max, which the job also joins first
thing: so an OOM kill is told (memory.oom_control oom_kill) and a fork bomb is bounded there too.
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
    "find_v1_mounts",
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
#: Those it takes from a v1 hierarchy where v2 lacks them (a hybrid machine).
V1_WANTED = ("memory", "pids")
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
    #: v1 hierarchies used where v2 lacks the controller: (controller, the folder its leaves go in)
    v1: tuple[tuple[str, Path], ...] = ()

    @property
    def notice(self) -> str:
        names = sorted(self.controllers) + [f"{name} (v1)" for name, _ in self.v1]
        limits = ", ".join(names) or "none (no v2 controllers here)"
        return f"jobs contained in cgroup v2 leaves under {self.path}; limits: {limits}"

    def leaf(self, job_id: str, attempt: int) -> Path:
        return self.path / f"{LEAF_PREFIX}{job_id}.{attempt}"

    def v1_leaves(self, leaf: Path) -> list[Path]:
        """The v1 leaves that go with the v2 leaf `leaf` (same name), made by `make_leaf`."""
        return [base / leaf.name for _, base in self.v1]

    def make_leaf(self, job_id: str, attempt: int, limits: Limits) -> Path:
        """A fresh, empty leaf with `limits` written where the controllers are there. OSError if it cannot be made
        (the launch then fails: a job never runs uncontained where cgroups work)."""
        leaf = self.leaf(job_id, attempt)
        try:
            leaf.mkdir()
        except FileNotFoundError:  # the subtree itself is gone (an admin's or a script's cleanup of empty cgroups):
            self.path.mkdir(exist_ok=True)  # made again, its controllers handed down again, then the leaf
            _enable(self.path, sorted(self.controllers))
            leaf.mkdir()
        except FileExistsError:  # left by an attempt of a reused id (tests): it must be empty to be reused
            if populated(str(leaf)):
                empty_cgroup(str(leaf))
        writes = [(leaf / name, value) for name, value in self.limit_files(limits).items()]
        for controller, base in self.v1:
            folder = base / leaf.name
            folder.mkdir(parents=True, exist_ok=True)
            writes += [(folder / name, value) for name, value in v1_limit_files(controller, limits, folder).items()]
        for path, value in writes:
            try:
                path.write_text(value)
            except OSError as exc:  # a limit the kernel refuses is logged; containment itself does not depend on it
                log.warning("cgroup: cannot write %s = %s (%s)", path, value, exc)
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
        for gone in [*self.v1_leaves(leaf), leaf]:
            try:
                gone.rmdir()
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
        for _, base in self.v1:
            with contextlib.suppress(OSError):
                base.rmdir()
        if not self.delegated:
            with contextlib.suppress(OSError):
                self.path.rmdir()


def v1_limit_files(controller: str, limits: Limits, folder: Path) -> dict[str, str]:
    """A v1 leaf's limit files (in writing order) for `limits`."""
    files: dict[str, str] = {}
    if controller == "memory" and limits.memory_mib > 0:
        files["memory.limit_in_bytes"] = str(limits.memory_mib * 1024 * 1024)
        if (folder / "memory.memsw.limit_in_bytes").exists():  # no swap beyond the request (after the limit: >=)
            files["memory.memsw.limit_in_bytes"] = files["memory.limit_in_bytes"]
    if controller == "pids" and limits.pids_max:
        files["pids.max"] = str(limits.pids_max)
    return files


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


def find_v1_mounts(mountinfo: str) -> dict[str, Path]:
    """The mount points of the v1 hierarchies of V1_WANTED's controllers in a /proc/self/mountinfo text."""
    found: dict[str, Path] = {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        tail = line.split(" - ", 1)[1].split()
        if len(tail) < 3 or tail[0] != "cgroup":
            continue
        for name in V1_WANTED:
            if name in tail[2].split(","):
                found.setdefault(name, Path(_unescape(fields[4])))
    return found


def own_v1(proc_cgroup: str) -> dict[str, str]:
    """This process's v1 cgroup per controller of V1_WANTED, from a /proc/self/cgroup text."""
    found: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        number, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        if number != "0":
            for name in names.split(","):
                if name in V1_WANTED:
                    found[name] = path or "/"
    return found


def _v1_bases(mountinfo: str, proc_cgroup: str, name: str, missing: list[str]) -> tuple[tuple[str, Path], ...]:
    """For each controller of `missing` (none in v2 here), a v1 folder for the leaves, where one can be made."""
    mounts, own = find_v1_mounts(mountinfo), own_v1(proc_cgroup)
    bases: list[tuple[str, Path]] = []
    for controller in missing:
        if controller not in mounts or controller not in own:
            continue
        base = mounts[controller] / own[controller].lstrip("/") / name
        try:
            base.mkdir(exist_ok=True)
        except OSError as exc:
            log.info("cgroup v1 %s: cannot create %s (%s)", controller, base, exc)
            continue
        bases.append((controller, base))
    return tuple(bases)


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
    controllers = frozenset(_enable(path, [c for c in wanted if c in _read(path / "cgroup.controllers").split()]))
    controllers &= set(WANTED)
    missing = [c for c in V1_WANTED if c not in controllers]
    v1 = _v1_bases(mountinfo, proc_cgroup, path.name, missing) if mountinfo is not None and missing else ()
    return Subtree(path, controllers, delegated=False, v1=v1)


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
