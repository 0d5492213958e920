"""A real `corral serve` with hostile schedules: refused at admission, cheap when accepted, and SIGTERM ends it
(issue 12, finding 2: one schedule held the daemon's lock for 55 s and SIGTERM did not stop it)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

CHRONOS = "/chronos/v1/scheduler"


def test_sigterm_ends_a_daemon_busy_with_dense_schedules_and_it_reports_its_lock() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sock = Path(tmp) / "corral.sock"
        err_path = Path(tmp) / "serve.err"
        with err_path.open("w") as err:
            server = subprocess.Popen(
                [sys.executable, "-m", "corral.cli.main", "serve", "--simulate-gpus", "2xA100-80GB",
                 "--state-dir", tmp, "--socket", str(sock)],
                stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
            try:
                for _ in range(400):
                    if sock.exists():
                        break
                    time.sleep(0.05)
                client = httpx.Client(
                    transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://corral", timeout=30
                )
                fast = {"name": "fast", "command": "true", "schedule": "R/2020-01-01T00:00:00Z/PT0.001S"}
                refused = client.post(f"{CHRONOS}/iso8601", json=fast)
                assert refused.status_code == 400 and refused.json()["details"][0]["path"] == "/schedule"
                for i in range(5):
                    body = {"name": f"every-second-{i}", "command": "true", "schedule": "R/2000-01-01T00:00:00Z/PT1S"}
                    assert client.post(f"{CHRONOS}/iso8601", json=body).status_code == 204
                # The daemon keeps answering while the schedules run (the lock is never held for long).
                for _ in range(10):
                    assert client.get(f"{CHRONOS}/jobs").status_code == 200
                    time.sleep(0.1)
                client.close()
            finally:
                server.send_signal(signal.SIGTERM)
                try:
                    code = server.wait(timeout=30)  # a hang detector, not a measurement (see benchmarks/lock_hold.py)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
                    raise AssertionError("corral serve did not stop within 30 s of SIGTERM") from None
        assert code == 0
        lines = err_path.read_text().splitlines()
    stats = [ln for ln in lines if ln.startswith("corral serve: lock stats ")]
    assert len(stats) == 1, lines[-10:]
    figures = json.loads(stats[0].removeprefix("corral serve: lock stats "))
    assert figures["lock"] == "daemon lock" and figures["holds"] > 0
    assert any(h.startswith("corral-tick in corral.daemon.server.serve") for h in figures["by_holder"])
