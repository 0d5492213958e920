"""`corral serve` as a real process on a Unix socket, driven by the `corral` CLI."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
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


@contextlib.contextmanager
def serving(sock: Path, state: Path, *extra: str) -> Iterator[tuple[Corral, str]]:
    """`corral serve` on simulated GPUs; yields a client and the daemon's first line (where it listens)."""
    server = subprocess.Popen(
        [*CLI, "serve", "--simulate-gpus", "2xA100-80GB", "--state-dir", str(state), "--socket", str(sock), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for("the socket", lambda: sock.exists() or server.poll() is not None, timeout=15)
        assert server.poll() is None, server.communicate()[0]
        assert server.stdout is not None
        yield Corral(sock), server.stdout.readline()
    finally:
        # A daemon that stops leaves its jobs running (a restart re-adopts them); a test's daemon must not.
        jobs = _children(server.pid)
        server.send_signal(signal.SIGTERM)
        try:
            output, _ = server.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            output, _ = server.communicate()
        for group in jobs:
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)
        assert server.returncode == 0, output
        assert not sock.exists()


def _children(pid: int) -> set[int]:
    """PIDs whose parent is `pid` (a daemon's job leaders: each is its job's process group)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                    found.add(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


@pytest.fixture
def corral(tmp_path: Path) -> Iterator[Corral]:
    with serving(tmp_path / "corral.sock", tmp_path / "state") as (client, _):
        yield client


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
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --memory: not a memory amount: 'lots' " + (
        "(examples: 512MiB, 10GiB, 16Gi, 2TB)"
    )
    missing = corral.run("show", "99", ok=False)
    assert missing.returncode == 2 and missing.stderr.strip() == "error: job: no job 99"


def test_logs_follow_until_the_job_ends(corral: Corral) -> None:
    # the job writes in three bursts, one of them a character split over two writes
    script = (
        "printf 'one\\n'; sleep 0.6; printf '\\303'; sleep 0.6; printf '\\251t\\303\\251\\n'; sleep 0.3; echo three"
    )
    job = corral.submit("--", "sh", "-c", script)
    followed = corral.run("logs", "-f", "--interval", "0.1", job)
    assert followed.stdout == "one\nété\nthree\n"
    assert corral.state(job) == "succeeded"  # -f returned because the job ended
    chunks = [json.loads(line) for line in corral.run("logs", "--json", job).stdout.splitlines()]
    assert chunks == [{"job": job, "state": "succeeded", "offset": 0, "next_offset": 16, "text": "one\nété\nthree\n"}]


def test_client_without_server(tmp_path: Path) -> None:
    sock = tmp_path / "nope.sock"
    done = Corral(sock).run("ps", ok=False)
    assert done.returncode == 2 and done.stderr.strip() == f"error: corral serve is not running at {sock}"


def test_tcp_with_bearer_tokens(tmp_path: Path) -> None:
    with serving(tmp_path / "corral.sock", tmp_path / "state", "--listen", "127.0.0.1:0") as (local, first):
        found = re.search(r"and (http://127\.0\.0\.1:\d+) \(bearer tokens\)", first)
        assert found, first
        url = found.group(1)
        secret = local.run("token", "create", "laptop").stdout.strip()
        token_id = json.loads(local.run("token", "list", "--json").stdout)[0]["id"]
        remote = Corral(tmp_path / "unused.sock")
        remote.env.pop("CORRAL_SOCKET")
        remote.env.update(CORRAL_URL=url, CORRAL_TOKEN=secret)

        job = remote.submit("--", "echo", "over tcp")
        wait_for("the job over TCP", lambda: remote.state(job) == "succeeded")
        assert remote.run("logs", job).stdout == "over tcp\n"
        assert local.jobs()[job]["user"] == remote.jobs()[job]["user"]  # the token acts as its creator

        # token management is not for TCP callers; a wrong or missing token is 401 in one line
        refused = remote.run("token", "create", "more", ok=False)
        assert refused.returncode == 2
        assert (
            refused.stderr.strip() == "error: tokens: tokens are created, listed and revoked over the Unix socket only"
        )
        wrong = Corral(tmp_path / "unused.sock")
        wrong.env.update(CORRAL_URL=url, CORRAL_TOKEN="corral_guess")
        wrong.env.pop("CORRAL_SOCKET")
        bad = wrong.run("ps", ok=False)
        assert bad.returncode == 2
        assert bad.stderr.strip() == ("error: authorization: the bearer token is not valid (see `corral token create`)")
        raw = httpx.get(f"{url}/v1/jobs")
        assert raw.status_code == 401 and raw.headers["www-authenticate"] == "Bearer"
        assert raw.json()["detail"]["message"] == "a bearer token is required over TCP (see `corral token create`)"

        # DC/OS clients send "token=<t>" (marathon-python's and dcos-metronome's auth_token=); Basic auth carries the
        # token as its password (chronos-python knows only a user and a password)
        for header in (f"token={secret}", "Basic " + base64.b64encode(f"anyone:{secret}".encode()).decode()):
            assert httpx.get(f"{url}/v1/jobs", headers={"Authorization": header}).status_code == 200, header
        for header in ("token=corral_guess", "Basic " + base64.b64encode(b"anyone:corral_guess").decode(), "Basic %%"):
            assert httpx.get(f"{url}/v1/jobs", headers={"Authorization": header}).status_code == 401, header
        # under a peer's prefix the 401 comes in the peer's shape
        peer = httpx.get(f"{url}/marathon/v2/apps", headers={"Authorization": "token=corral_guess"})
        assert peer.status_code == 401
        assert peer.json() == {"message": "the bearer token is not valid (see `corral token create`)"}

        local.run("token", "revoke", token_id)
        assert remote.run("ps", ok=False).returncode == 2


def as_user(uid: int, gid: int, sock: Path, method: str, url: str, body: object = None) -> tuple[int, Any]:
    """One HTTP request over the daemon's socket from a forked child that has become uid:gid (no exec: the child
    needs no access to this Python installation)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(str(sock))
            payload = b"" if body is None else json.dumps(body).encode()
            head = f"{method} {url} HTTP/1.1\r\nHost: corral\r\nConnection: close\r\n"
            head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
            conn.sendall(head.encode() + payload)
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
            os.write(write_end, answer)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        reply = f.read()
    _, status = os.waitpid(pid, 0)
    assert status == 0, "the child could not talk to the daemon"
    headers, _, content = reply.partition(b"\r\n\r\n")
    return int(headers.split()[1]), json.loads(content) if content.strip() else None


@pytest.mark.skipif(os.getuid() != 0, reason="needs root: a root daemon runs each job as its submitter")
def test_root_daemon_runs_each_job_as_its_submitter(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    # the socket must be reachable by another user (pytest's tmp_path is private to root)
    shared = Path(tempfile.mkdtemp(prefix="corral-users-"))
    shared.chmod(0o755)
    try:
        with serving(shared / "corral.sock", tmp_path / "state") as (root, _):
            script = "id -u; id -g; cat /root/.bashrc >/dev/null 2>&1 && echo READ-ROOT || echo denied; pwd"
            code, job = as_user(
                nobody.pw_uid, nobody.pw_gid, shared / "corral.sock", "POST", "/v1/jobs",
                {"command": ["sh", "-c", script], "cwd": "/tmp"},
            )  # fmt: skip
            assert code == 201 and job["user"] == "nobody"
            assert job["id"] in root.jobs()  # root's ps shows everyone's, as squeue does for an admin

            def state_of(job_id: str) -> str:
                return str({j["id"]: j for j in json.loads(root.run("ps", "--json").stdout)}[job_id]["state"])

            wait_for("nobody's job", lambda: state_of(job["id"]) == "succeeded")
            assert root.run("logs", job["id"]).stdout.split() == [
                str(nobody.pw_uid), str(nobody.pw_gid), "denied", "/tmp"
            ]  # fmt: skip
            mine = root.submit("--", "sleep", "30")
            code, seen = as_user(nobody.pw_uid, nobody.pw_gid, shared / "corral.sock", "GET", "/v1/jobs")
            assert code == 200 and [j["id"] for j in seen] == [job["id"]]  # not root's job
            code, answer = as_user(
                nobody.pw_uid, nobody.pw_gid, shared / "corral.sock", "POST", f"/v1/jobs/{mine}/cancel"
            )
            assert code == 404 and answer["detail"]["message"] == f"no job {mine}"
            assert root.state(mine) == "running"
            everyone = json.loads(root.run("ps", "--all", "--json").stdout)
            assert {j["id"]: j["user"] for j in everyone} == {job["id"]: "nobody", mine: "root"}
            root.run("cancel", mine)
            wait_for("root's job to end", lambda: root.state(mine) == "cancelled")
    finally:
        shutil.rmtree(shared, ignore_errors=True)
