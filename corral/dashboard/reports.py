"""The simulator's reports (`corral sim ... --out DIR`) that the administrator shows on the dashboard:
`corral serve --reports DIR`.

Every `.html` file under DIR (in it or at most MAX_DEPTH folders down, MAX_REPORTS files) is listed by its path
relative to DIR. The reports are self-contained (images inlined as data: URIs, no scripts); the dashboard shows them
in an `<iframe sandbox>`, and they are served with a CSP that lets them load nothing and run nothing (REPORT_CSP), so a
report from an untrusted trace cannot act for the viewer.

Users who may write under DIR are not trusted, and the daemon (often root) reads what they could not. So a path is
never checked and then opened again by name (a link swapped in between was served: issue 23, finding 2). DIR is opened
once, when the daemon starts (ReportsFolder), and a report is opened relative to that descriptor without following
any link at all:

    openat2(DIR_FD, "run/report.html", O_RDONLY | O_NONBLOCK, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)   Linux >= 5.6
    else: openat(fd, "run", O_DIRECTORY | O_NOFOLLOW), then openat(run_fd, "report.html", O_NOFOLLOW) (a walk)

then checked on the open descriptor (fstat): a regular file (not a FIFO, a device or a folder), of one link only
(st_nlink == 1: a hard link to a file elsewhere, e.g. where fs.protected_hardlinks is off, is refused, since
it is the same file as the one outside), at most MAX_REPORT_BYTES; and read from that descriptor only. Whatever
fails is "no report" (404). The listing walks the same way (os.fwalk: descriptors, links not followed) and lists only
what would be served.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

MAX_DEPTH = 3
MAX_REPORTS = 500
#: A report's size limit: the simulator's reports with their inlined plots are well under 10 MiB.
MAX_REPORT_BYTES = 32 * 1024 * 1024
#: What a report may do: draw its inline styles and data: images; no scripts, no requests, no forms, framed only by
#: the dashboard itself, in a sandbox even when opened directly.
REPORT_CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'self'; sandbox"
)

#: openat2(2): the same number on every architecture that has it (the syscalls added since 5.1 share one table).
SYS_OPENAT2 = 437
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
#: How a report is opened: reading only, never blocking on a FIFO, never becoming a terminal, never inherited.
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Report:
    path: str  # relative to the reports folder, with "/"
    size: int
    modified: float


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _Openat2:
    """openat2 through libc's syscall(), or None where the kernel (ENOSYS) or the sandbox (EPERM) lacks it."""

    def __init__(self) -> None:
        self.available: bool | None = None  # unknown until the first call
        try:
            self._syscall = ctypes.CDLL(None, use_errno=True).syscall
        except (OSError, AttributeError):
            self.available = False
            return
        self._syscall.restype = ctypes.c_long

    def __call__(self, dir_fd: int, path: str, flags: int, resolve: int) -> int | None:
        """The descriptor, None if openat2 is not there; OSError as open() raises it."""
        if self.available is False:
            return None
        how = _OpenHow(flags, 0, resolve)
        fd = self._syscall(
            ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dir_fd), ctypes.c_char_p(os.fsencode(path)),
            ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)),
        )  # fmt: skip
        if fd >= 0:
            self.available = True
            return int(fd)
        err = ctypes.get_errno()
        if self.available is None and err in (errno.ENOSYS, errno.EPERM):
            self.available = False
            return None
        raise OSError(err, os.strerror(err), path)


_openat2 = _Openat2()


def _parts(wanted: str) -> list[str] | None:
    """The components of a report's path as the listing names it, None for anything no listing holds."""
    parts = wanted.split("/")
    if (
        "\x00" in wanted
        or not wanted.lower().endswith(".html")
        or len(parts) > MAX_DEPTH + 1
        or any(p in ("", ".", "..") for p in parts)
    ):
        return None
    return parts


def _walk_open(dir_fd: int, parts: list[str]) -> int:
    """The fallback: one component at a time, each opened relative to the last, none of them a link (O_NOFOLLOW)."""
    fd = os.open(".", DIR_FLAGS, dir_fd=dir_fd)
    try:
        for name in parts[:-1]:
            inner = os.open(name, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
        return os.open(parts[-1], OPEN_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)


def open_beneath(dir_fd: int, wanted: str, *, use_openat2: bool = True) -> int | None:
    """A descriptor of the plain file `wanted` beneath the folder `dir_fd`, reached through no link; None otherwise."""
    parts = _parts(wanted)
    if parts is None:
        return None
    try:
        fd = None
        if use_openat2:
            fd = _openat2(
                dir_fd, "/".join(parts), OPEN_FLAGS, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
            )
        if fd is None:
            fd = _walk_open(dir_fd, parts)
    except OSError:
        return None  # ELOOP (a link), ENOENT, ENOTDIR, EXDEV (out of the folder), EACCES...
    return fd


def servable(st: os.stat_result) -> bool:
    """What the dashboard serves: a regular file of one name (a hard link is the file elsewhere), not too big."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_size <= MAX_REPORT_BYTES


class ReportsFolder:
    """The reports folder, held open from the daemon's start: every listing and read goes through its descriptor.

    The administrator's path may itself be a link (/srv/reports -> /data/reports): it is followed once, here."""

    def __init__(self, folder: Path, *, use_openat2: bool = True) -> None:
        self.folder = folder
        self.use_openat2 = use_openat2
        self.fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def list(self) -> list[Report]:
        """The reports under the folder, by path."""
        found: list[Report] = []
        for current, dirs, files, cur_fd in os.fwalk(".", dir_fd=self.fd, follow_symlinks=False):
            depth = len(Path(current).parts)  # Path("./a").parts == ("a",)
            if depth >= MAX_DEPTH:
                dirs[:] = []
            dirs.sort()
            for name in sorted(files):
                if not name.lower().endswith(".html"):
                    continue
                try:
                    st = os.stat(name, dir_fd=cur_fd, follow_symlinks=False)
                except OSError:
                    continue
                if not servable(st):
                    continue
                found.append(Report(Path(current, name).as_posix().removeprefix("./"), st.st_size, st.st_mtime))
                if len(found) >= MAX_REPORTS:
                    return sorted(found, key=lambda r: r.path)
        return sorted(found, key=lambda r: r.path)

    def read(self, wanted: str) -> bytes | None:
        """The content of report `wanted` (a path as the listing names it), None for anything that is not one."""
        fd = open_beneath(self.fd, wanted, use_openat2=self.use_openat2)
        if fd is None:
            return None
        try:
            if not servable(os.fstat(fd)):
                return None
            chunks: list[bytes] = []
            left = MAX_REPORT_BYTES + 1
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            data = b"".join(chunks)
            return data if len(data) <= MAX_REPORT_BYTES else None  # grown since fstat
        except OSError:
            return None
        finally:
            os.close(fd)
