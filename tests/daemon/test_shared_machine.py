"""A shared machine (issue 12, finding 8): a root daemon at system locations, found by every user's plain CLI.

root:  corral serve            state /var/lib/corral, socket /run/corral/corral.sock (0755 folder, 0666 socket)
users: corral submit ...       their own daemon's socket if one answers, else /run/corral/corral.sock
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.cli import client
from tests.daemon.realusers import (
    CLI,
    NEEDS_ROOT,
    as_user,
    can_run,
    kill_processes_of,
    local_users,
    root_daemon,
    user_argv,
    user_env,
    wait_for,
)


# ------------------------------------------------------------------------------------------------ where things are
def test_serve_locations_root_uses_system_places_and_a_user_keeps_their_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("CORRAL_STATE_DIR", "CORRAL_SOCKET", "CORRAL_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    personal = tmp_path / ".local" / "state" / "corral"
    assert client.serve_locations(None, None, None, root=True) == (
        Path("/var/lib/corral"), Path("/run/corral/corral.sock")
    )  # fmt: skip
    assert client.serve_locations(None, None, None, root=False) == (personal, personal / "corral.sock")
    # flags first, then the environment; a root daemon with another state directory still serves at /run/corral
    assert client.serve_locations(tmp_path / "s", None, None, root=True) == (
        tmp_path / "s", Path("/run/corral/corral.sock")
    )  # fmt: skip
    assert client.serve_locations(None, None, tmp_path / "r", root=True)[1] == tmp_path / "r" / "corral.sock"
    assert client.serve_locations(None, tmp_path / "x.sock", tmp_path / "r", root=True)[1] == tmp_path / "x.sock"
    monkeypatch.setenv("CORRAL_RUNTIME_DIR", str(tmp_path / "env-run"))
    monkeypatch.setenv("CORRAL_STATE_DIR", str(tmp_path / "env-state"))
    assert client.serve_locations(None, None, None, root=False) == (
        tmp_path / "env-state", tmp_path / "env-run" / "corral.sock"
    )  # fmt: skip
    monkeypatch.setenv("CORRAL_SOCKET", str(tmp_path / "env.sock"))
    assert client.serve_locations(None, None, None, root=True)[1] == tmp_path / "env.sock"


@contextlib.contextmanager
def listening(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    try:
        yield
    finally:
        server.close()


@pytest.fixture
def short() -> Iterator[Path]:
    """A temporary folder with a short path: a socket's path has room for 107 bytes, which pytest's tmp_path under
    xdist (.../pytest-N/popen-gwK/test_name0/) and HOME/.local/state/corral/corral.sock together pass."""
    path = Path(tempfile.mkdtemp(prefix="corral-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_the_cli_prefers_a_personal_daemon_then_the_shared_one(monkeypatch: pytest.MonkeyPatch, short: Path) -> None:
    tmp_path = short
    monkeypatch.delenv("CORRAL_SOCKET", raising=False)
    monkeypatch.delenv("CORRAL_STATE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CORRAL_RUNTIME_DIR", str(tmp_path / "run"))
    personal, shared = tmp_path / "home/.local/state/corral/corral.sock", tmp_path / "run/corral.sock"
    assert client.locate_socket() == (personal, [personal, shared])  # neither: the error names both
    with listening(shared):
        assert client.locate_socket()[0] == shared
        with listening(personal):
            assert client.locate_socket()[0] == personal
        assert personal.exists()  # a personal daemon that died leaves its socket: the shared one is used
        assert client.locate_socket()[0] == shared
    monkeypatch.setenv("CORRAL_SOCKET", str(tmp_path / "given.sock"))
    assert client.locate_socket()[0] == tmp_path / "given.sock"


def test_no_daemon_anywhere_says_where_it_looked(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(HOME=str(tmp_path), CORRAL_RUNTIME_DIR=str(tmp_path / "run"))
    done = subprocess.run([*CLI, "ps"], env=env, capture_output=True, text=True, timeout=60)
    personal, shared = tmp_path / ".local/state/corral/corral.sock", tmp_path / "run/corral.sock"
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: corral serve is not running at {personal} nor at {shared}"


# ------------------------------------------------------------------------------------------------ end to end
@pytest.fixture
def system_runtime() -> Iterator[tuple[Path, dict[str, str]]]:
    """/run/corral itself where the machine has none (removed afterwards): users then need no setting at all.
    Where one exists (a real corral lives here), a folder of our own, named to users by $CORRAL_RUNTIME_DIR."""
    if not client.SYSTEM_RUNTIME_DIR.exists():
        try:
            yield client.SYSTEM_RUNTIME_DIR, {}
        finally:
            shutil.rmtree(client.SYSTEM_RUNTIME_DIR, ignore_errors=True)
        return
    parent = Path(tempfile.mkdtemp(prefix="corral-run-"))
    parent.chmod(0o755)
    try:
        yield parent / "run", {"CORRAL_RUNTIME_DIR": str(parent / "run")}
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.skipif(not can_run(), reason=NEEDS_ROOT)
def test_users_find_the_root_daemon_with_no_flags(system_runtime: tuple[Path, dict[str, str]]) -> None:
    runtime, setting = system_runtime
    state = Path(tempfile.mkdtemp(prefix="corral-state-"))
    root_env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    root_env.update(setting)
    args = [] if not setting else ["--runtime-dir", str(runtime)]
    try:
        with (
            local_users(("a", None), ("b", None), ("c", None)) as users,
            root_daemon(state, args, runtime / "corral.sock", root_env),
        ):
            assert stat.S_IMODE(runtime.stat().st_mode) == 0o755
            assert stat.S_IMODE((runtime / "corral.sock").stat().st_mode) == 0o666
            env = user_env(**setting)
            jobs = {}
            for role in ("a", "b"):
                done = as_user(users[role], [*CLI, "submit", "--", "sh", "-c", "id -un; umask"], env=env)
                assert done.returncode == 0, done.stderr
                jobs[role] = done.stdout.strip()

            def everyone() -> dict[str, dict[str, object]]:  # root, over the socket, from this process
                transport = httpx.HTTPTransport(uds=str(runtime / "corral.sock"))
                with httpx.Client(transport=transport, base_url="http://corral") as http:
                    return {j["id"]: j for j in http.get("/v1/jobs", params={"all": "true"}).json()}

            wait_for("the jobs", lambda: {j["state"] for j in everyone().values()} == {"succeeded"})
            assert {i: j["user"] for i, j in everyone().items()} == {jobs[r]: users[r].name for r in ("a", "b")}
            as_root = subprocess.run([*CLI, "ps", "--json"], env=env, capture_output=True, text=True, timeout=60)
            assert {j["id"] for j in json.loads(as_root.stdout)} == set(jobs.values())  # root's ps: everyone's
            for role in ("a", "b", "c"):  # each sees their own job only (c: none)
                done = as_user(users[role], [*CLI, "ps", "--json"], env=env)
                assert done.returncode == 0, done.stderr
                assert [j["id"] for j in json.loads(done.stdout)] == ([jobs[role]] if role in jobs else [])
            shown = as_user(users["a"], [*CLI, "logs", jobs["a"]], env=env)
            assert shown.stdout == f"{users['a'].name}\n0022\n"  # it ran as a, with a login's umask

            # C starts a daemon of its own: C's CLI now talks to it, not to root's. (Its serve runs without the
            # shared runtime folder's setting, which names where root's daemon listens: with it, C's serve would
            # find root's socket there and refuse.)
            home_sock = Path(users["c"].home) / ".local/state/corral/corral.sock"
            own_env = {k: v for k, v in env.items() if k != "CORRAL_RUNTIME_DIR"}
            personal = subprocess.Popen(
                user_argv(users["c"], [*CLI, "serve", "--simulate-gpus", "1xT4-16GB"]),
                env=own_env, cwd="/tmp", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            try:
                wait_for("C's own daemon", lambda: home_sock.exists() or personal.poll() is not None)
                assert personal.poll() is None
                assert stat.S_IMODE(home_sock.parent.stat().st_mode) == 0o700
                done = as_user(users["c"], [*CLI, "submit", "--", "true"], env=env)
                assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr  # its own daemon's first job
                assert {j["user"] for j in everyone().values()} == {users["a"].name, users["b"].name}
            finally:
                kill_processes_of(users["c"].uid)
                personal.wait(timeout=20)
    finally:
        shutil.rmtree(state, ignore_errors=True)
