"""At submission: would a job's --output / --error be refused at its start? (docs/batch-scripts.md)

The file itself is opened only at launch, by the job's child as the job's user (`_supervise.open_output`: O_NOFOLLOW
on the last component, no other user's symbolic link on the way, a directory that user may write, or /dev/null).
What can be known before, is known here, so that a pattern that escapes the user's reach is refused at submit
rather than failing the job later:

    out/%j.log      the folder `out` (no pattern in it) is walked now; the file's name waits for the job id
    %u/out.log      a pattern in a folder: nothing to check before the launch
    a missing folder  accepted (an earlier job may make it); the launch fails, naming the path, if it is still missing

The daemon may be root and cannot become the user here (it has threads), so this reads the modes of what is on the
path for the user's uid and groups. A folder with an ACL may grant more than its mode says: such a folder is left to
the launch, which is the authority either way.
"""

from __future__ import annotations

import contextlib
import os
import stat

from corral.jobs.batch import expand, has_pattern

SEARCH, WRITE = 0o1, 0o2
DEV_NULL = os.makedev(1, 3)


def _acl(path: str) -> bool:
    with contextlib.suppress(OSError):
        return "system.posix_acl_access" in os.listxattr(path, follow_symlinks=False)
    return False


def _may(st: os.stat_result, path: str, uid: int, groups: frozenset[int], want: int) -> bool:
    """Whether `uid` (in `groups`) may `want` (SEARCH | WRITE bits) the folder `st` by its mode; True for root, and
    where an ACL may say more than the mode."""
    if uid == 0 or _acl(path):
        return True
    if st.st_uid == uid:
        bits = (st.st_mode >> 6) & 7
    elif st.st_gid in groups:
        bits = (st.st_mode >> 3) & 7
    else:
        bits = st.st_mode & 7
    return bits & want == want


def reach_problem(pattern: str, cwd: str, uid: int, groups: frozenset[int]) -> str | None:
    """Why the output file `pattern` (relative to `cwd`) is out of the user's reach, as far as can be known before
    the launch; None when nothing is known against it."""
    absolute = pattern if pattern.startswith("/") else f"{cwd.rstrip('/')}/{pattern}"
    folder, _, last = absolute.rpartition("/")
    if has_pattern(folder):
        return None
    folder = expand(folder, job="", user="", name="")  # only %% is left in it: a % sign
    shown = absolute
    todo = [p for p in folder.split("/") if p not in ("", ".")][::-1]
    here, hops = "/", 0
    while todo:
        part = todo.pop()
        try:
            st_here = os.stat(here)
        except OSError:
            return None
        if not _may(st_here, here, uid, groups, SEARCH):
            return f"{shown}: the job's user may not enter {here}"
        path = os.path.join(here, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None  # it may exist by the time the job starts
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (uid, 0):
                return (
                    f"{shown}: {path} is a symbolic link of uid {st.st_uid}, not of the job's user: corral does not "
                    "write through another user's link"
                )
            hops += 1
            if hops > 40:
                return f"{shown}: too many symbolic links"
            target = os.readlink(path)
            if target.startswith("/"):
                here = "/"
            todo.extend([p for p in target.split("/") if p not in ("", ".")][::-1])
            continue
        if not stat.S_ISDIR(st.st_mode):
            return f"{shown}: {path} is not a directory"
        here = os.path.normpath(path) if part == ".." else path
    try:
        st_here = os.stat(here)
    except OSError:
        return None
    if not _may(st_here, here, uid, groups, SEARCH):  # before anything in it is looked at: nothing of it is told
        return f"{shown}: the job's user may not enter {here}"
    last_st: os.stat_result | None = None
    if not has_pattern(last):
        with contextlib.suppress(OSError):
            last_st = os.lstat(os.path.join(here, expand(last, job="", user="", name="")))
    if last_st is not None and stat.S_ISLNK(last_st.st_mode):
        return f"{shown}: is a symbolic link; corral opens output files only without following one (O_NOFOLLOW)"
    if last_st is not None and stat.S_ISCHR(last_st.st_mode) and last_st.st_rdev == DEV_NULL:
        return None
    if last_st is not None and not stat.S_ISREG(last_st.st_mode):
        return f"{shown}: is not a regular file"
    if not _may(st_here, here, uid, groups, SEARCH | WRITE):
        return f"{shown}: the job's user cannot write in its directory"
    return None
