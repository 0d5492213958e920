"""`corral serve` as a real process on a Unix socket, driven by the `corral` CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CLI = [sys.executable, "-m", "corral.cli.main"]


def wait_for(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class Corral:
    def __init__(self, sock: Path) -> None:
        self.env = {**os.environ, "CORRAL_SOCKET": str(sock)}

    def run(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*CLI, *args], env=self.env, capture_output=True, text=True, timeout=20)
        if ok:
            assert done.returncode == 0, done.stderr
        return done

    def submit(self, *args: str) -> str:
        return self.run("submit", *args).stdout.strip()

    def jobs(self) -> dict[str, Any]:
        return {j["id"]: j for j in json.loads(self.run("ps", "--json").stdout)}

    def state(self, job_id: str) -> str:
        return str(self.jobs()[job_id]["state"])


@pytest.fixture
def corral(tmp_path: Path) -> Iterator[Corral]:
    sock = tmp_path / "corral.sock"
    state = tmp_path / "state"
    server = subprocess.Popen(
        [*CLI, "serve", "--simulate-gpus", "2xA100-80GB", "--state-dir", str(state), "--socket", str(sock)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for("the socket", lambda: sock.exists() or server.poll() is not None, timeout=15)
        assert server.poll() is None, server.communicate()[0]
        yield Corral(sock)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            output, _ = server.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            output, _ = server.communicate()
        assert server.returncode == 0, output
        assert not sock.exists()


def test_serve_submit_logs_explain_cancel(corral: Corral) -> None:
    first = corral.submit("--gpus", "1", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES; echo $CORRAL_JOB_ID")
    assert first == "1"
    wait_for("job 1 to succeed", lambda: corral.state(first) == "succeeded")
    assert corral.run("logs", first).stdout.split() == ["SIM-GPU-0-0", "1"]
    assert json.loads(corral.run("show", first, "--json").stdout)["exit_code"] == 0

    busy = [corral.submit("--gpus", "1", "--", "sleep", "30") for _ in range(2)]
    big = corral.submit("--gpus", "2", "--", "true")
    try:
        wait_for("both GPUs busy", lambda: all(corral.state(b) == "running" for b in busy))

        def says_why() -> bool:
            data = json.loads(corral.run("explain", big, "--json").stdout)
            return data["state"] == "queued" and "insufficient GPU" in data["reason"]

        wait_for("job 3 to explain itself", says_why)
        assert "insufficient GPU" in corral.run("explain", big).stdout
        held = {g["uuid"]: [h["job"] for h in g["held"]] for g in json.loads(corral.run("gpus", "--json").stdout)}
        assert held == {"SIM-GPU-0-0": [busy[0]], "SIM-GPU-0-1": [busy[1]]}
        assert "SIM-GPU-0-1" in corral.run("gpus").stdout
        corral.run("cancel", big)
        assert corral.state(big) == "cancelled"
    finally:
        for b in busy:
            corral.run("cancel", b, ok=False)
    wait_for("the sleeps to end", lambda: all(corral.state(b) == "cancelled" for b in busy))

    bad = corral.run("submit", "--memory", "lots", "--", "true", ok=False)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: memory: not a memory amount: 'lots' " + (
        "(examples: 512MiB, 10GiB, 16Gi, 2TB)"
    )
    missing = corral.run("show", "99", ok=False)
    assert missing.returncode == 2 and missing.stderr.strip() == "error: job: no job 99"


def test_logs_follow_until_the_job_ends(corral: Corral) -> None:
    # the job writes in three bursts, one of them a character split over two writes
    script = "printf 'one\\n'; sleep 0.6; printf '\\303'; sleep 0.6; printf '\\251t\\303\\251\\n'; sleep 0.3; echo three"
    job = corral.submit("--", "sh", "-c", script)
    followed = corral.run("logs", "-f", "--interval", "0.1", job)
    assert followed.stdout == "one\nété\nthree\n"
    assert corral.state(job) == "succeeded"  # -f returned because the job ended
    chunks = [json.loads(line) for line in corral.run("logs", "--json", job).stdout.splitlines()]
    assert chunks == [
        {"job": job, "state": "succeeded", "offset": 0, "next_offset": 16, "text": "one\nété\nthree\n"}
    ]


def test_client_without_server(tmp_path: Path) -> None:
    sock = tmp_path / "nope.sock"
    done = Corral(sock).run("ps", ok=False)
    assert done.returncode == 2 and done.stderr.strip() == f"error: corral serve is not running at {sock}"
