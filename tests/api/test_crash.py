"""kill -9 of `corral serve` in the middle of a burst of submissions: nothing acknowledged is lost, nothing runs twice.

Jobs append their CORRAL_JOB_ID to a shared file; the daemon is SIGKILLed while submissions arrive and jobs run, then
restarted on the same state folder. Every submission that got a 201 must end up run (its id in the file), exactly
once: a job still running at the crash is re-adopted, not started again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

CLI = [sys.executable, "-m", "corral.cli.main"]


def start(state: Path, sock: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [*CLI, "serve", "--simulate-gpus", "1xA100-80GB", "--state-dir", str(state), "--socket", str(sock)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://corral") as c:
                c.get("/v1/jobs")
            return proc
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise TimeoutError("corral serve did not come up")


def test_sigkill_during_a_burst_loses_nothing_and_runs_nothing_twice(tmp_path: Path) -> None:
    state, sock, ran = tmp_path / "state", tmp_path / "corral.sock", tmp_path / "ran"
    ran.touch()
    acked: list[str] = []
    server = start(state, sock)
    crashed = threading.Event()

    def burst() -> None:
        client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://corral", timeout=5)
        for i in range(150):
            body = {
                "command": ["sh", "-c", f'sleep 0.{i % 5}; echo "$CORRAL_JOB_ID" >> {ran}'],
                "cpus": "100m",
                "memory": "64MiB",
            }
            try:
                r = client.post("/v1/jobs", json=body)
            except httpx.TransportError:
                if crashed.is_set():
                    continue  # the daemon is down: not acknowledged, may be lost
                raise
            if r.status_code == 201:
                acked.append(r.json()["id"])
            if i == 60:
                os.killpg(server.pid, signal.SIGKILL)  # mid-burst, with jobs running
                server.wait()
                crashed.set()

    sender = threading.Thread(target=burst)
    sender.start()
    sender.join(timeout=60)
    assert crashed.is_set() and len(acked) >= 60
    server = start(state, sock)  # restart: recover, re-adopt, go on
    try:
        client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://corral", timeout=10)
        after = {"command": ["sh", "-c", f'echo "$CORRAL_JOB_ID" >> {ran}'], "cpus": "100m"}
        r = client.post("/v1/jobs", json=after)  # the restarted daemon takes new work too
        assert r.status_code == 201
        acked.append(r.json()["id"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            jobs = {j["id"]: j["state"] for j in client.get("/v1/jobs").json()}
            if all(jobs.get(a) in {"succeeded", "failed", "lost"} for a in acked):
                break
            time.sleep(0.2)
        jobs = {j["id"]: j for j in client.get("/v1/jobs").json()}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    assert set(acked) <= set(jobs), "an acknowledged submission was lost"
    lines = ran.read_text().split()
    assert len(lines) == len(set(lines)), f"a job ran twice: {sorted(x for x in lines if lines.count(x) > 1)}"
    # Every acknowledged job ran, except one the crash caught between launch and recording (then it is LOST, not
    # started a second time).
    not_run = [a for a in acked if a not in set(lines)]
    assert all(jobs[a]["state"] == "lost" for a in not_run), {a: jobs[a]["state"] for a in not_run}
    assert len(not_run) <= 2, not_run
