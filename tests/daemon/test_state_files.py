"""The state directory as an older corral left it: open modes, and CORRAL_TOKEN stored with jobs (in the WAL too).

A daemon started on it takes the directory back (0700, files 0600) and scrubs the credentials from the database and
its WAL before it listens, keeping everything else of the jobs. No root needed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.daemon.server import ServeError, make_private, prepare_runtime_dir
from corral.jobs.environment import RULE, admitted_environment
from corral.jobs.model import JobSpec, JobState, spec_from_json
from corral.model.resources import Request
from corral.store import SqliteStore
from tests.daemon.realusers import wait_for

CLI = [sys.executable, "-m", "corral.cli.main"]
TOKEN = "corral_" + "T0ken" * 8 + "xyz"


def spec(env: dict[str, str], origin: str = "") -> JobSpec:
    return JobSpec(
        command=("true",),
        request=Request(cpu_milli=100),
        user="u",
        uid=os.getuid(),
        gid=os.getgid(),
        env=env,
        origin=origin,
    )


@pytest.fixture
def old_state(tmp_path: Path) -> Path:
    """An older corral's state directory, copied while its daemon ran (so the WAL still holds the jobs)."""
    live = tmp_path / "live"
    live.mkdir()
    store = SqliteStore(live / "jobs.db")
    submitted = store.add(spec({"CORRAL_TOKEN": TOKEN, "CORRAL_URL": "http://h:1", "AWS_SECRET": "mine"}), now=1.0)
    store.transition(submitted.id, JobState.CANCELLED, expect=[JobState.QUEUED])
    # a definition's run: its env comes from the definition, and corral's container variable must survive
    run = store.add(spec({"CORRAL_CONTAINER_ENV": "A B", "A": "1"}, origin="metronome:x:1"), now=2.0)
    store.transition(run.id, JobState.CANCELLED, expect=[JobState.QUEUED])
    old = tmp_path / "old"
    old.mkdir()
    for name in ("jobs.db", "jobs.db-wal", "jobs.db-shm"):
        shutil.copy(live / name, old / name)
    store.close()
    assert TOKEN.encode() in (old / "jobs.db-wal").read_bytes()
    (old / "logs").mkdir()
    (old / "logs" / "1.log").write_text("output\n")
    (old / "tokens.json").write_text('{"tokens": []}')
    (old / "notes.sh").write_text("#!/bin/sh\n")  # not corral's: keeps its mode
    (old / "notes.sh").chmod(0o755)
    for path in [old, old / "logs"]:
        path.chmod(0o755)
    for path in [*old.glob("jobs.db*"), old / "logs" / "1.log", old / "tokens.json"]:
        path.chmod(0o644)
    return old


@pytest.fixture
def daemon_on(tmp_path: Path, old_state: Path) -> Iterator[Path]:
    sock = tmp_path / "corral.sock"
    server = subprocess.Popen(
        [*CLI, "serve", "--simulate-gpus", "1xA100-80GB", "--state-dir", str(old_state), "--socket", str(sock)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for("the socket", lambda: sock.exists() or server.poll() is not None)
        assert server.poll() is None, server.communicate()[0]
        yield old_state
    finally:
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=20)
        assert server.returncode == 0, output


def test_a_daemon_takes_back_an_older_corrals_state_directory(daemon_on: Path) -> None:
    state = daemon_on
    modes = {
        str(p.relative_to(state)): stat.S_IMODE(p.stat().st_mode)
        for p in [state, *state.rglob("*")]
        if not p.is_socket()
    }
    assert modes == {
        ".": 0o700, "logs": 0o700, "logs/1.log": 0o600, "tokens.json": 0o600,
        "jobs.db": 0o600, "jobs.db-wal": 0o600, "jobs.db-shm": 0o600, "notes.sh": 0o755,
        "run": 0o700,  # the supervisors' records (corral.executor)
        "daemon.lock": 0o600,  # held by the running daemon (one per state directory)
    }  # fmt: skip
    # the token is gone from the database, its WAL and its SHM while the daemon runs ...
    for path in state.glob("jobs.db*"):
        assert TOKEN.encode() not in path.read_bytes(), path.name
    # ... and nothing else was lost: the submitter's own variables, and a definition's corral variable
    out = subprocess.run(
        ["sqlite3", f"file:{state}/jobs.db?mode=ro", "SELECT spec FROM jobs ORDER BY id"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    envs = [spec_from_json(line).env for line in out.splitlines()]
    assert envs == [{"AWS_SECRET": "mine"}, {"CORRAL_CONTAINER_ENV": "A B", "A": "1"}]


def test_scrub_reports_what_it_changed_and_is_idempotent(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    try:
        kept = store.add(spec({"PATH": "/bin", "SSH_AUTH_SOCK": "/tmp/agent", "corral_token": TOKEN}), now=1.0)
        assert store.scrub_submitted_env(admitted_environment, RULE) == 1
        assert store.get(kept.id).spec.env == {"PATH": "/bin"}  # type: ignore[union-attr]
        assert (tmp_path / "jobs.db-wal").stat().st_size == 0  # checkpointed and truncated
        # once scrubbed under a rule, a start does not scan again (admission applies the rule to new jobs) ...
        dirty = store.add(spec({"CORRAL_TOKEN": TOKEN}), now=2.0)
        assert store.scrub_submitted_env(admitted_environment, RULE) == 0
        # ... until the rule changes
        assert store.scrub_submitted_env(admitted_environment, RULE + " and more") == 1
        assert store.get(dirty.id).spec.env == {}  # type: ignore[union-attr]
    finally:
        store.close()
    assert TOKEN.encode() not in (tmp_path / "jobs.db").read_bytes()


def test_admitted_environment_is_the_documented_rule() -> None:
    submitted = {
        "PATH": "/usr/bin", "AWS_SECRET_ACCESS_KEY": "k", "VIRTUAL_ENV": "/v", "CUDA_HOME": "/c",
        "CORRAL_TOKEN": TOKEN, "CORRAL_URL": "u", "CORRAL_SOCKET": "s", "CORRAL_STATE_DIR": "d", "Corral_Token": "t",
        "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1", "SSH_AGENT_PID": "1", "GPG_AGENT_INFO": "g", "SSH_CONNECTION": "c",
    }  # fmt: skip
    assert admitted_environment(submitted) == {
        "PATH": "/usr/bin", "AWS_SECRET_ACCESS_KEY": "k", "VIRTUAL_ENV": "/v", "CUDA_HOME": "/c", "SSH_CONNECTION": "c",
    }  # fmt: skip
    assert json.dumps(admitted_environment({})) == "{}"


def test_folders_others_may_write_to_are_refused_for_the_socket_and_the_state(tmp_path: Path) -> None:
    state = tmp_path / "state"
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    with pytest.raises(ServeError, match=r"writable by other users, who could replace the socket \(mode 777\)"):
        prepare_runtime_dir(open_to_all, state)
    open_to_all.chmod(0o1777)  # sticky, as /tmp: others cannot remove or rename what is not theirs
    prepare_runtime_dir(open_to_all, state)
    created = tmp_path / "made" / "run"
    prepare_runtime_dir(created, state)
    assert stat.S_IMODE(created.stat().st_mode) == 0o755
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(ServeError, match=r"is a shared folder \(mode 1777\): give corral serve a directory of its own"):
        make_private(shared)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, 4242, 4242)
        with pytest.raises(ServeError, match="belongs to uid 4242: another user could replace the socket"):
            prepare_runtime_dir(theirs, state)
        with pytest.raises(ServeError, match="belongs to uid 4242, not to the daemon's user"):
            make_private(theirs)


def test_serve_refuses_an_unknown_policy_before_touching_its_state_dir(tmp_path: Path) -> None:
    """`--policy` is checked at start (where the kernels of a fragmentation-scored policy are loaded), with a clear
    error naming it, and nothing is created."""
    from corral.daemon.server import serve

    state = tmp_path / "state"
    with pytest.raises(ServeError, match=r"--policy: unknown policy 'nope'; use one of .*binpack"):
        serve(state, tmp_path / "run" / "corral.sock", "1xA100-80GB", "nope")
    assert not state.exists()
