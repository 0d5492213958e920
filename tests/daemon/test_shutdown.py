"""SIGTERM stops `corral serve` even while a scheduling round holds the lock and never returns (issue 12, finding 2:
a hostile schedule held it for minutes, and the daemon could not be stopped).

The daemon runs in a subprocess whose Daemon.tick is replaced by one that blocks forever once it holds the lock, and
a client request waits for that lock; SIGTERM must still end the process, with status 0 and its socket removed.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.daemon.realusers import wait_for

STUCK_DAEMON = textwrap.dedent(
    """
    import sys, threading
    from corral.daemon import core

    def stuck(self, unlocked=None):
        sys.stdout.write("tick holds the lock\\n")
        sys.stdout.flush()
        threading.Event().wait()  # a round that never ends

    core.Daemon.tick = stuck
    from corral.cli.main import app
    app(prog_name="corral")
    """
)


def test_sigterm_stops_a_daemon_whose_tick_never_returns(tmp_path: Path) -> None:
    sock = tmp_path / "corral.sock"
    server = subprocess.Popen(
        [sys.executable, "-c", STUCK_DAEMON, "serve", "--simulate-gpus", "1xA100-80GB",
         "--state-dir", str(tmp_path / "state"), "--socket", str(sock)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        wait_for("the socket", lambda: sock.exists() or server.poll() is not None)
        assert server.poll() is None, server.communicate()[0]
        assert server.stdout is not None
        assert "tick holds the lock" in server.stdout.readline() + server.stdout.readline()
        # a request that needs the lock: it waits for the stuck round
        waiting.connect(str(sock))
        waiting.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: corral\r\n\r\n")
        server.send_signal(signal.SIGTERM)
        try:
            output, _ = server.communicate(timeout=30)  # a liveness bound, not a timing: it stops in ~5 s
        except subprocess.TimeoutExpired:
            server.kill()
            raise AssertionError("SIGTERM did not stop a daemon whose tick holds the lock") from None
        assert server.returncode == 0, output
        assert not sock.exists()
    finally:
        waiting.close()
        if server.poll() is None:
            server.kill()
            server.communicate()
