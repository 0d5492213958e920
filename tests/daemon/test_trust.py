"""The trust boundary of a root `corral serve` (issue 12, finding 1), tried by real Unix users made for the test.

User A submits jobs whose environment holds AWS_SECRET and whose output prints it, and keeps definitions (Metronome,
Chronos, Marathon) with it in their env. User B (a group of its own) and user C (A's primary group, `useradd -N`)
then try every path: corral's API and the Mesos faces, the state directory's files (jobs.db, its WAL and SHM, the
token file, the logs), SQLite read-only, /proc (environ and cmdline of the jobs and of the daemon). Nothing they
get back may hold A's secret. Root's CORRAL_TOKEN, in the daemon's environment and in the submitting CLI's, is
stored nowhere and reaches no job.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.realusers import (
    CLI,
    NEEDS_ROOT,
    PROBE,
    User,
    as_user,
    can_run,
    local_users,
    processes_of,
    root_daemon,
    user_env,
    wait_for,
)

pytestmark = pytest.mark.skipif(not can_run(), reason=NEEDS_ROOT)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder other users may traverse (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="corral-trust-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def post(user: User, sock: Path, url: str, body: dict[str, Any]) -> dict[str, Any]:
    done = as_user(user, [*PROBE, str(sock), "post", json.dumps({"url": url, "json": body})])
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    assert answer["status"] in (200, 201, 204), answer
    return answer


def job_pid(uid: int, job_id: str) -> int:
    """The process of `uid` whose environment names the job (read as root)."""
    for pid in processes_of(uid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"CORRAL_JOB_ID={job_id}".encode() in env:
            return pid
    raise AssertionError(f"no process of uid {uid} runs job {job_id}")


def test_no_other_user_learns_a_jobs_environment_or_output(shared_tmp: Path) -> None:
    secret = "AKIA" + secrets.token_hex(12)  # A's: in A's jobs' environments and printed by one of them
    root_token = "corral_" + secrets.token_urlsafe(32)  # root's: in the daemon's and the root CLI's environment
    a_token = "corral_" + secrets.token_urlsafe(32)  # A's own, sent by A's raw API client in a job's env
    state, runtime = shared_tmp / "state", shared_tmp / "run"
    sock = runtime / "corral.sock"
    root_env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "CORRAL_TOKEN": root_token}
    root_env.pop("CORRAL_URL", None)
    root_env.pop("CORRAL_SOCKET", None)
    root_env["CORRAL_RUNTIME_DIR"] = str(runtime)

    with (
        local_users(("a", "lab"), ("b", None), ("c", "lab")) as users,
        root_daemon(state, ["--runtime-dir", str(runtime)], sock, root_env) as daemon,
    ):
        a, b, c = users["a"], users["b"], users["c"]
        assert c.gid == a.gid != b.gid
        a_env = user_env(CORRAL_RUNTIME_DIR=str(runtime), AWS_SECRET=secret, CORRAL_TOKEN=a_token)

        # A: a job through the CLI that prints the secret and keeps running (its /proc entries are tried below)
        script = 'printf "leaked:%s\\n" "$AWS_SECRET"; exec sleep 120'
        done = as_user(a, [*CLI, "submit", "--name", "a-job", "--", "sh", "-c", script], env=a_env)
        assert done.returncode == 0, done.stderr
        cli_job = done.stdout.strip()
        # ... one through the raw API that carries a CORRAL_ variable (the server must drop it, whatever the client)
        raw = post(a, sock, "/v1/jobs", {"command": ["true"], "env": {"AWS_SECRET": secret, "CORRAL_TOKEN": a_token}})
        raw_job = raw["body"]["id"]
        # ... and definitions of the three Mesos faces with the secret in their env
        post(a, sock, "/metronome/v1/jobs", {
            "id": "secretjob", "run": {"cmd": "true", "cpus": 0.1, "mem": 32, "disk": 0, "env": {"AWS_SECRET": secret}},
        })  # fmt: skip
        post(a, sock, "/chronos/v1/scheduler/iso8601", {
            "name": "secretchronos", "command": "true", "schedule": "R/2099-01-01T00:00:00Z/PT24H",
            "environmentVariables": [{"name": "AWS_SECRET", "value": secret}],
        })  # fmt: skip
        post(a, sock, "/marathon/v2/apps", {
            "id": "/secretapp", "cmd": "true", "cpus": 0.1, "mem": 32, "instances": 0, "env": {"AWS_SECRET": secret},
        })  # fmt: skip
        # root submits through its CLI with CORRAL_TOKEN set
        done = subprocess.run([*CLI, "submit", "--", "true"], env=root_env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        root_job = done.stdout.strip()

        log = state / "logs" / f"{cli_job}.log"
        wait_for("A's job to print", lambda: log.exists() and secret in log.read_text())
        pid = job_pid(a.uid, cli_job)

        # --- what A's own jobs got: the secret (the job is A's), no credential of corral's, not root's token
        job_env = dict(
            item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item
        )
        assert job_env["AWS_SECRET"] == secret and job_env["CORRAL_JOB_ID"] == cli_job
        assert not [k for k in job_env if k.startswith("CORRAL_") and k != "CORRAL_JOB_ID"], job_env
        for uid in (a.uid,):
            for p in processes_of(uid):
                try:
                    text = Path(f"/proc/{p}/environ").read_bytes()
                except OSError:
                    continue
                assert root_token.encode() not in text and a_token.encode() not in text, f"token in pid {p}'s env"

        # --- the files: the state directory is root's alone; the socket's folder is open, the socket reachable
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        for name in ("jobs.db", "jobs.db-wal", "jobs.db-shm", "tokens.json"):
            if (state / name).exists():
                assert stat.S_IMODE((state / name).stat().st_mode) == 0o600, name
        assert stat.S_IMODE((state / "logs").stat().st_mode) == 0o700
        st = log.stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, a.uid)  # A's own log, readable by A alone
        assert stat.S_IMODE(runtime.stat().st_mode) == 0o755 and stat.S_IMODE(sock.stat().st_mode) == 0o666
        # no token in the database, its WAL or its SHM; A's secret is there (the scan would find it), privately
        stored = b"".join(p.read_bytes() for p in state.glob("jobs.db*"))
        assert root_token.encode() not in stored and a_token.encode() not in stored
        assert secret.encode() in stored
        stored_env = json.loads(
            subprocess.run(
                ["sqlite3", str(state / "jobs.db"), f"SELECT spec FROM jobs WHERE id = {int(root_job)}"],
                capture_output=True, text=True, check=True,
            ).stdout
        )["env"]  # fmt: skip
        assert not [k for k in stored_env if k.startswith("CORRAL_")], stored_env

        # --- B and C try everything
        urls = [
            "/v1/jobs", "/v1/jobs?all=true", "/v1/gpus", "/v1/tokens", "/v1/definitions",
            "/v1/definitions/secretjob", "/v1/definitions/secretjob/runs",
            "/metronome/v1/jobs?embed=activeRuns&embed=history&embed=schedules", "/metronome/v1/jobs/secretjob",
            "/metronome/v1/jobs/secretjob/runs", "/metronome/v1/queue",
            "/chronos/v1/scheduler/jobs", "/chronos/v1/scheduler/jobs/search?name=secret", "/scheduler/jobs",
            "/marathon/v2/apps", "/marathon/v2/apps/secretapp", "/marathon/v2/apps/secretapp/tasks",
            # the peers' views added for their real clients, and corral's own view of their objects
            "/metronome/v1/jobs/secretjob/runs?corral=true", "/metronome/v1/jobs?embed=activeRuns&corral=true",
            "/chronos/v1/scheduler/jobs?corral=true", "/chronos/v1/scheduler/job/stat/secretchronos",
            "/chronos/v1/scheduler/graph/csv", "/chronos/v1/scheduler/graph/dot", "/chronos/v1/scheduler/jobs/summary",
            "/chronos/metrics", "/marathon/v2/apps?embed=apps.tasks&embed=apps.deployments&corral=true",
            "/marathon/v2/apps/secretapp?corral=true", "/marathon/v2/apps/secretapp/versions", "/marathon/v2/tasks",
            "/marathon/v2/deployments", "/marathon/v2/queue",
            # queues and fair share: every user's usage numbers are shown (as Slurm's sshare), never a job's words
            "/v1/queues", "/v1/queues/default", "/v1/shares",
        ]  # fmt: skip
        for job in (cli_job, raw_job, root_job):
            urls += [f"/v1/jobs/{job}", f"/v1/jobs/{job}/logs", f"/v1/jobs/{job}/explain"]
        files = [state / n for n in ("jobs.db", "jobs.db-wal", "jobs.db-shm", "tokens.json")]
        files += [state, state / "logs", log, state / "logs" / f"{raw_job}.log"]
        plan = {
            "urls": urls,
            "db": str(state / "jobs.db"),
            "files": [str(f) for f in files],
            "daemon_pid": daemon.process.pid,
        }
        for intruder in (b, c):
            done = as_user(intruder, [*PROBE, str(sock), "snoop", json.dumps(plan)])
            assert done.returncode == 0, done.stderr
            report = json.loads(done.stdout)
            assert report["uid"] == intruder.uid
            everything = json.dumps(report)
            for leaked in (secret, root_token, a_token):
                assert leaked not in everything, f"{intruder.name} learned {leaked[:8]}...: {everything[:3000]}"
            assert set(report["files"].values()) == {"denied"}, report["files"]
            assert report["sqlite"].startswith("error:"), report["sqlite"]
            assert report["proc"]["foreign_environ"] == {}, list(report["proc"]["foreign_environ"])
            assert report["daemon_environ"] == "denied"
            http = report["http"]
            for job in (cli_job, raw_job, root_job):
                assert http[f"/v1/jobs/{job}"][0] == 404 and http[f"/v1/jobs/{job}/logs"][0] == 404
            assert json.loads(http["/v1/jobs?all=true"][1]) == []
            assert http["/v1/shares"][0] == 200 and http["/v1/queues"][0] == 200
            assert json.loads(http["/marathon/v2/apps"][1]) == {"apps": []}
            # the CLI as the user says the same, and a plain sqlite3 cannot open the database
            env = user_env(CORRAL_RUNTIME_DIR=str(runtime))
            shown = as_user(intruder, [*CLI, "logs", cli_job], env=env)
            assert shown.returncode == 2 and shown.stderr.strip() == f"error: job: no job {cli_job}"
            assert json.loads(as_user(intruder, [*CLI, "ps", "--all", "--json"], env=env).stdout) == []
            opened = as_user(intruder, ["sqlite3", f"file:{state}/jobs.db?mode=ro", "SELECT spec FROM jobs"])
            assert opened.returncode != 0 and secret not in opened.stdout + opened.stderr

        # A sees its own job and output through the API, as before
        shown = as_user(a, [*CLI, "logs", cli_job], env=a_env)
        assert shown.returncode == 0 and shown.stdout == f"leaked:{secret}\n"
        as_user(a, [*CLI, "cancel", cli_job], env=a_env)
