"""The daemon's own paths, checked once and then used by name (issue 23, finding 2's review): the state directory
(SQLite opens jobs.db by name), the socket's folder (the socket is bound, then made 0666, by name: a swap in between
made root chmod any file) and the queues file (read again on every reload). None of them may be reached through a
folder or a link another user could swap between the check and the use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.daemon.server import ServeError, hold_state_dir, prepare_runtime_dir, refuse_untrusted, untrusted_step

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes files of another uid (needs root)")
OTHER = 4242


def theirs(path: Path) -> Path:
    os.lchown(path, OTHER, OTHER)
    return path


def test_a_link_a_folder_or_an_open_folder_of_another_user_on_the_way_is_refused(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.mkdir()
    (tmp_path / "their-link").symlink_to(good)
    theirs(tmp_path / "their-link")  # a user's link in a sticky /tmp, say: they may point it elsewhere at any time
    with pytest.raises(ServeError) as refused:
        hold_state_dir(tmp_path / "their-link" / "state")
    assert str(refused.value) == (
        f"the state directory {tmp_path}/their-link/state is reached through what another user could swap for their "
        f"own: the link {tmp_path}/their-link belongs to uid {OTHER}; give a path whose folders and links belong to "
        "root or the daemon's user"
    )
    assert not (good / "state").exists()  # nothing created

    (tmp_path / "their-dir").mkdir()
    theirs(tmp_path / "their-dir")
    assert untrusted_step(tmp_path / "their-dir" / "run") == f"{tmp_path}/their-dir belongs to uid {OTHER}"
    with pytest.raises(ServeError, match=r"the socket's folder .* belongs to uid 4242"):
        prepare_runtime_dir(tmp_path / "their-dir" / "run", tmp_path / "state")
    assert not (tmp_path / "their-dir" / "run").exists()

    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    assert untrusted_step(tmp_path / "open" / "state") == f"{tmp_path}/open is writable by other users (mode 777)"
    # a root link to a folder of theirs: the target is checked as well
    (tmp_path / "root-link").symlink_to(tmp_path / "their-dir")
    assert untrusted_step(tmp_path / "root-link" / "x") == f"{tmp_path}/their-dir belongs to uid {OTHER}"


def test_trusted_ways_pass_links_and_sticky_folders_included(tmp_path: Path) -> None:
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)  # as /tmp: others cannot replace what is not theirs
    (sticky / "data").mkdir()
    (sticky / "link").symlink_to("data")  # relative, root's
    assert untrusted_step(sticky / "link" / "state") is None
    assert untrusted_step(sticky / "link" / ".." / "data" / "new" / "deeper") is None  # not there yet: ours to make
    lock = hold_state_dir(sticky / "link" / "state")
    try:
        assert (sticky / "data" / "state" / "daemon.lock").exists()
    finally:
        lock.close()
    prepare_runtime_dir(sticky / "link" / "run", sticky / "link" / "state")


def test_the_queues_file_must_be_writable_by_root_or_the_daemon_only(tmp_path: Path) -> None:
    queues = tmp_path / "queues.toml"
    queues.write_text("")
    queues.chmod(0o644)
    refuse_untrusted(queues, "--queues: the queues file", last=True)
    queues.chmod(0o666)
    with pytest.raises(ServeError, match=r"queues.toml is writable by other users \(mode 666\)"):
        refuse_untrusted(queues, "--queues: the queues file", last=True)
    queues.chmod(0o644)
    theirs(queues)
    with pytest.raises(ServeError, match=f"--queues: the queues file {queues} is reached through .*uid {OTHER}"):
        refuse_untrusted(queues, "--queues: the queues file", last=True)
