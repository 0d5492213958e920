"""One daemon per state directory (issue 23, finding 7): a second `corral serve --state-dir SAME` with another socket
started and ran the same database's jobs. It is refused now, naming the first's pid, creating and changing nothing;
and the lock ends with the daemon, not with its jobs (which outlive it under their supervisors)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.api.test_serve import CLI, Corral, wait_for


def start(state: Path, sock: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "serve", "--simulate-gpus", "1xA100-80GB", "--state-dir", str(state), "--socket", str(sock)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def listening(server: subprocess.Popen[str], sock: Path) -> None:
    wait_for("the socket", lambda: sock.exists() or server.poll() is not None)
    assert server.poll() is None, server.communicate()[1]


def stop(server: subprocess.Popen[str]) -> None:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=30)  # a hang detector
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    assert server.returncode == 0


def entries(state: Path) -> set[str]:
    return {str(p.relative_to(state)) for p in state.rglob("*")}


@contextlib.contextmanager
def killing(*servers: subprocess.Popen[str]) -> Iterator[None]:
    try:
        yield
    finally:
        for server in servers:
            if server.poll() is None:
                server.kill()
                server.communicate()


def test_a_second_daemon_on_the_same_state_dir_is_refused_and_a_restart_is_not(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first_sock, other_sock = tmp_path / "a" / "corral.sock", tmp_path / "b" / "corral.sock"
    first = start(state, first_sock)
    with killing(first):
        listening(first, first_sock)
        client = Corral(first_sock)
        job = client.submit("--", "sleep", "60")
        wait_for("the job to run", lambda: client.state(job) == "running")
        before = entries(state)
        assert (state / "daemon.lock").read_text() == f"{first.pid}\n"

        second = start(state, other_sock)
        with killing(second):
            _, err = second.communicate(timeout=60)
        assert second.returncode == 2
        assert err.strip() == (
            f"error: another corral serve (pid {first.pid}) is running on the state directory {state} (it holds "
            f"{state / 'daemon.lock'}): stop it first, or give this one another --state-dir"
        )
        # nothing of the second: no socket, no socket folder, no file in the state directory; the first runs on
        assert not other_sock.parent.exists()
        assert entries(state) == before
        assert (state / "daemon.lock").read_text() == f"{first.pid}\n"
        assert client.state(job) == "running"
        stop(first)

    # The job outlives the daemon under its supervisor, which must not hold the lock: a restart starts and adopts it.
    again = start(state, other_sock)
    with killing(again):
        listening(again, other_sock)
        client = Corral(other_sock)
        assert client.state(job) == "running"
        assert (state / "daemon.lock").read_text() == f"{again.pid}\n"
        client.run("cancel", job)
        wait_for("the job to end", lambda: client.state(job) == "cancelled")
        stop(again)
