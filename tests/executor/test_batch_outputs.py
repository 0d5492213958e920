"""The local executor's side of batch scripts (issue 26 item 4): a script runs from a private copy of its stored
text, and --output / --error are opened by the job's child as the job's user: O_NOFOLLOW on the last component,
never through another user's symbolic link, only in a directory that user may write (tests/daemon/realusers.py for
the real users), or /dev/null."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from corral.executor import LocalExecutor
from tests.daemon.realusers import NEEDS_ROOT, User, can_run, local_users
from tests.executor.specs import make_spec
from tests.executor.test_local import wait_exit, wait_until


@pytest.fixture
def ex() -> Iterator[LocalExecutor]:
    executor = LocalExecutor(grace_s=0.2)
    yield executor
    for job_id in executor.running():
        executor.cancel(job_id, grace_s=0)
    wait_until(lambda: not (executor.poll() or executor.running()))
    executor.close()


SCRIPT = '#!/bin/sh\necho "out $0 $#: $*"\necho "err" >&2\n'


def test_a_script_runs_from_its_stored_text_and_writes_its_output_file(ex: LocalExecutor, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    spec = make_spec(tmp_path, "s1", "job.sh", "a b", "c", script=SCRIPT, output=str(out))
    ex.launch(spec)
    assert wait_exit(ex, "s1").succeeded
    first = out.read_text()
    assert first.startswith("out /dev/fd/") and first.endswith(" 2: a b c\nerr\n")  # stderr follows --output
    assert spec.log_path.read_text() == ""  # corral's log: nothing, the output went where it was asked
    # a retry (attempt 2) appends to what the first attempt wrote; --error apart takes stderr
    ex.launch(replace(spec, job_id="s1", attempt=2, error=str(tmp_path / "err.txt")))
    assert wait_exit(ex, "s1").succeeded
    assert out.read_text() == first + first.removesuffix("err\n")
    assert (tmp_path / "err.txt").read_text() == "err\n"
    assert (out.stat().st_mode & 0o777) == 0o600
    # a new first attempt truncates
    ex.launch(make_spec(tmp_path, "s2", "sh", "-c", "echo new", output=str(out)))
    assert wait_exit(ex, "s2").succeeded
    assert out.read_text() == "new\n"


def test_output_to_dev_null_and_error_only(ex: LocalExecutor, tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "n1", "sh", "-c", "echo o; echo e >&2", output="/dev/null", error=str(tmp_path / "e"))
    ex.launch(spec)
    assert wait_exit(ex, "n1").succeeded
    assert (tmp_path / "e").read_text() == "e\n" and spec.log_path.read_text() == ""
    only_err = make_spec(tmp_path, "n2", "sh", "-c", "echo o; echo e >&2", error=str(tmp_path / "e2"))
    ex.launch(only_err)
    assert wait_exit(ex, "n2").succeeded
    assert only_err.log_path.read_text() == "o\n" and (tmp_path / "e2").read_text() == "e\n"


def refused(ex: LocalExecutor, tmp_path: Path, job_id: str, output: str) -> OSError:
    with pytest.raises(OSError) as exc:
        ex.launch(make_spec(tmp_path, job_id, "true", output=output))
    return exc.value


def test_a_symlink_a_fifo_a_missing_folder_or_another_users_link_on_the_way_is_refused(
    ex: LocalExecutor, tmp_path: Path
) -> None:
    (tmp_path / "target").write_text("precious\n")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    err = refused(ex, tmp_path, "r1", str(tmp_path / "link"))
    assert err.errno == errno.ELOOP
    assert str(err) == (
        f"[Errno {errno.ELOOP}] job r1: --output {tmp_path}/link: is a symbolic link; corral opens output files only "
        "without following one (O_NOFOLLOW)"
    )
    assert (tmp_path / "target").read_text() == "precious\n"
    os.mkfifo(tmp_path / "fifo")
    assert str(refused(ex, tmp_path, "r2", str(tmp_path / "fifo"))).endswith(f"--output {tmp_path}/fifo: is not a "
                                                                             "regular file")  # fmt: skip
    assert str(refused(ex, tmp_path, "r3", str(tmp_path / "nope" / "out"))) == (
        f"[Errno {errno.ENOENT}] job r3: --output {tmp_path}/nope/out: {tmp_path}/nope: No such file or directory"
    )
    # a folder link another user owns (here uid 4242; the job runs as this test's uid): not followed
    (tmp_path / "real").mkdir()
    planted = tmp_path / "planted"
    planted.symlink_to(tmp_path / "real")
    if os.getuid() == 0:
        os.lchown(planted, 4242, 4242)
        assert str(refused(ex, tmp_path, "r4", f"{planted}/out")) == (
            f"[Errno {errno.EACCES}] job r4: --output {planted}/out: {planted} is a symbolic link of uid 4242, not of "
            "the job's user: corral does not write through another user's link"
        )
        assert not (tmp_path / "real" / "out").exists()
    own = tmp_path / "own"
    own.symlink_to("real")  # the job's user's (or root's) own link: followed, relative too
    ex.launch(make_spec(tmp_path, "r5", "sh", "-c", "echo through", output=f"{own}/out"))
    assert wait_exit(ex, "r5").succeeded
    assert (tmp_path / "real" / "out").read_text() == "through\n"


# ------------------------------------------------------------------------------------------------ real users
@pytest.fixture
def shared() -> Iterator[Path]:
    """A sticky, world-writable folder like /tmp, where any user may plant a name (pytest's tmp_path is root's)."""
    path = Path(tempfile.mkdtemp(prefix="corral-batch-"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def as_user(user: User, *argv: str) -> None:
    subprocess.run(["/usr/sbin/runuser", "-u", user.name, "--", *argv], check=True, capture_output=True, timeout=30)


@pytest.mark.skipif(not can_run(), reason=NEEDS_ROOT)
def test_another_users_symlink_attack_and_a_folder_the_user_cannot_write(
    ex: LocalExecutor, tmp_path: Path, shared: Path
) -> None:
    with local_users(("a", None), ("b", None)) as users:
        a, mallory = users["a"], users["b"]
        victim = Path(a.home) / "notes.txt"
        as_user(a, "sh", "-c", f"echo mine > {victim}")
        # mallory plants a link where a's job will write, to make it overwrite a's own file, and a folder link
        as_user(mallory, "ln", "-s", str(victim), str(shared / "out.txt"))
        as_user(mallory, "ln", "-s", a.home, str(shared / "dir"))
        job = {"uid": a.uid, "gid": a.gid, "cwd": a.home}
        with pytest.raises(OSError) as exc:
            ex.launch(make_spec(tmp_path, "u1", "true", output=str(shared / "out.txt"), **job))
        assert str(exc.value).endswith(f"--output {shared}/out.txt: is a symbolic link; corral opens output files "
                                       "only without following one (O_NOFOLLOW)")  # fmt: skip
        with pytest.raises(OSError) as exc:
            ex.launch(make_spec(tmp_path, "u2", "true", error=str(shared / "dir" / "notes.txt"), **job))
        assert str(exc.value) == (
            f"[Errno {errno.EACCES}] job u2: --error {shared}/dir/notes.txt: {shared}/dir is a symbolic link of uid "
            f"{mallory.uid}, not of the job's user: corral does not write through another user's link"
        )
        assert victim.read_text() == "mine\n"
        # a folder a may not write (root's), a file there that a could write: refused; /dev/null is fine
        (shared / "roots").mkdir(mode=0o755)
        (shared / "roots" / "open").write_text("")
        (shared / "roots" / "open").chmod(0o666)
        for target in ("new", "open"):
            with pytest.raises(OSError) as exc:
                ex.launch(make_spec(tmp_path, f"u3{target}", "true", output=str(shared / "roots" / target), **job))
            assert str(exc.value) == (
                f"[Errno {errno.EACCES}] job u3{target}: --output {shared}/roots/{target}: the job's user cannot "
                "write in its directory"
            )
        assert not (shared / "roots" / "new").exists()
        ex.launch(make_spec(tmp_path, "u4", "sh", "-c", "echo gone", output="/dev/null", **job))
        assert wait_exit(ex, "u4").succeeded
        # a's own file, written as a, from a's script copy (a memfd a's interpreter reads as /dev/fd/N)
        mine = Path(a.home) / "out-u5.txt"
        ex.launch(make_spec(tmp_path, "u5", "job.sh", script="#!/bin/sh\nid -u\n", output=str(mine), **job))
        assert wait_exit(ex, "u5").succeeded
        assert mine.read_text() == f"{a.uid}\n"
        assert (mine.stat().st_uid, mine.stat().st_mode & 0o777) == (a.uid, 0o600)


def test_a_script_whose_interpreter_is_missing_fails_to_start_naming_it(ex: LocalExecutor, tmp_path: Path) -> None:
    with pytest.raises(OSError) as exc:
        ex.launch(make_spec(tmp_path, "i1", "job.sh", script="#!/no/such/sh -e\ntrue\n"))
    assert str(exc.value) == (
        f"[Errno {errno.ENOENT}] job i1: the script's interpreter '/no/such/sh -e': No such file or directory"
    )
