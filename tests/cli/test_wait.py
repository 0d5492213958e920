"""`corral wait ID` and `corral logs -f ID` end with the job's exit status, as a shell would give it, against a real
`corral serve` (one for the module: the jobs are independent)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.cli.client import EXIT_CANCELLED, EXIT_NO_CODE, job_exit_status
from tests.api.test_serve import Corral, serving


@pytest.fixture(scope="module")
def corral(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Corral]:
    tmp = tmp_path_factory.mktemp("wait")
    with serving(tmp / "corral.sock", tmp / "state") as (client, _):
        yield client


def small(corral: Corral, *command: str) -> str:
    return corral.submit("--cpus", "100m", "--memory", "16MiB", "--", *command)


def test_wait_exits_with_the_jobs_status(corral: Corral) -> None:
    ok, three, killed = (
        small(corral, "true"),
        small(corral, "sh", "-c", "exit 3"),
        small(corral, "sh", "-c", "kill -9 $$"),
    )
    done = corral.run("wait", "--interval", "0.1", ok)
    assert done.stdout == "" and done.stderr == ""
    failed = corral.run("wait", "--interval", "0.1", three, ok=False)
    assert failed.returncode == 3 and failed.stderr == f"job {three} failed: exit code 3\n"
    signalled = corral.run("wait", "--interval", "0.1", killed, ok=False)
    assert signalled.returncode == 128 + 9 and signalled.stderr == f"job {killed} failed: killed by signal 9\n"


def test_wait_gives_up_after_its_timeout_and_a_cancelled_job_is_143(corral: Corral) -> None:
    sleeper = small(corral, "sleep", "60")
    late = corral.run("wait", "--timeout", "0.3", "--interval", "0.1", sleeper, ok=False)
    assert late.returncode == 124
    assert late.stderr.startswith(f"error: job {sleeper} is still ") and late.stderr.endswith(" after 0.3 s\n")
    corral.run("cancel", sleeper)
    cancelled = corral.run("wait", "--interval", "0.1", sleeper, ok=False)
    assert cancelled.returncode == 143 and cancelled.stderr == f"job {sleeper} cancelled: cancelled\n"
    missing = corral.run("wait", "99999", ok=False)
    assert missing.returncode == 2 and missing.stderr == "error: job: no job 99999\n"


def test_logs_follow_exits_with_the_jobs_status(corral: Corral) -> None:
    job = small(corral, "sh", "-c", "echo before; sleep 0.3; echo after; exit 5")
    followed = corral.run("logs", "-f", "--interval", "0.1", job, ok=False)
    assert followed.returncode == 5 and followed.stdout == "before\nafter\n" and followed.stderr == ""
    # without -f the command only shows what there is: its own success
    assert corral.run("logs", job).stdout == "before\nafter\n"


def test_exit_status_of_each_ending() -> None:
    assert job_exit_status({"state": "succeeded", "exit_code": 0, "reason": "exit code 0"}) == 0
    assert job_exit_status({"state": "failed", "exit_code": 2, "reason": "exit code 2"}) == 2
    assert job_exit_status({"state": "failed", "exit_code": None, "reason": "killed by signal 15"}) == 143
    assert job_exit_status({"state": "failed", "exit_code": None, "reason": "time limit of 5 s reached"}) == 1
    assert job_exit_status({"state": "failed", "exit_code": None, "reason": "could not start: no such file"}) == 1
    assert job_exit_status({"state": "cancelled", "exit_code": None, "reason": "cancelled"}) == EXIT_CANCELLED
    assert job_exit_status({"state": "lost", "exit_code": None, "reason": "lost: ..."}) == EXIT_NO_CODE
    assert job_exit_status({"state": "failed", "exit_code": 300, "reason": "exit code 300"}) == EXIT_NO_CODE


def test_wait_is_listed(tmp_path: Path) -> None:
    assert "wait" in Corral(tmp_path / "none.sock").run("--help").stdout
