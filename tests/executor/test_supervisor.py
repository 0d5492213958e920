"""Each job attempt under its own supervisor, with real processes: what a restarted daemon (a second LocalExecutor on
the same run folder) finds of the first one's jobs, and what the supervisor keeps from other users."""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.executor import Exit, Found, LocalExecutor
from corral.executor.local import _Supervised, parse_record
from tests.executor.specs import PATH, make_spec
from tests.executor.test_local import env_of, gone, wait_exit, wait_until


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


def executor_on(run_dir: Path) -> Iterator[LocalExecutor]:
    """A daemon's executor on `run_dir`; afterwards, whatever it still watches is killed and reaped."""
    ex = LocalExecutor(grace_s=0.2, run_dir=run_dir)
    yield ex
    for job_id in ex.running():
        ex.cancel(job_id, grace_s=0)
    wait_until(lambda: not (ex.poll() or ex.running()))
    ex.close()


@pytest.fixture
def first(run_dir: Path) -> Iterator[LocalExecutor]:
    """The daemon before its crash: it launches, then stops watching (it is never polled again)."""
    yield from executor_on(run_dir)


@pytest.fixture
def second(run_dir: Path) -> Iterator[LocalExecutor]:
    """The restarted daemon: same run folder, none of the jobs is its child."""
    yield from executor_on(run_dir)


def record(run_dir: Path, job_id: str, attempt: int = 1) -> dict[str, object]:
    path = run_dir / f"{job_id}.{attempt}.json"
    return (parse_record(path.read_bytes()) or {}) if path.exists() else {}


def supervisor_pid(ex: LocalExecutor, job_id: str) -> int:
    tracked = ex._jobs[job_id]
    assert isinstance(tracked, _Supervised)
    return tracked.supervisor_pid


def test_an_exit_while_no_daemon_watches_is_read_back_with_its_code_and_time(
    first: LocalExecutor, second: LocalExecutor, tmp_path: Path, run_dir: Path
) -> None:
    first.launch(make_spec(tmp_path, "j", "sh", "-c", "exit 3", attempt=2))
    assert wait_until(lambda: bool(record(run_dir, "j", 2).get("ended"))), "the supervisor wrote no exit record"
    found = second.reattach("j", 2)
    assert found.found is Found.ENDED and found.exit == Exit("j", 3, None, False)
    assert found.exit.ended_at is not None and found.exit.ended_at <= record(run_dir, "j", 2)["ended_at"]  # type: ignore[operator]
    assert second.running() == set()  # nothing to watch: it is over
    second.forget("j", 2)
    assert list(run_dir.iterdir()) == []


def test_an_adopted_job_that_exits_0_reports_exit_code_0(
    first: LocalExecutor, second: LocalExecutor, tmp_path: Path
) -> None:
    handle = first.launch(make_spec(tmp_path, "j", "sh", "-c", "sleep 0.5; exit 0"))
    found = second.reattach("j", 1)
    assert found.found is Found.ALIVE and found.handle == handle
    assert second.running() == {"j"}
    assert wait_exit(second, "j") == Exit("j", 0, None, False)  # not "exit code unknown": the record says 0


def test_cancel_reaches_an_adopted_job_through_its_supervisor(
    first: LocalExecutor, second: LocalExecutor, tmp_path: Path
) -> None:
    spec = make_spec(
        tmp_path, "j", "sh", "-c", 'trap "echo got TERM; exit 7" TERM; echo ready; while :; do sleep 0.05; done'
    )
    first.launch(spec)
    assert wait_until(lambda: "ready" in spec.log_path.read_text())
    assert second.reattach("j", 1).found is Found.ALIVE
    second.cancel("j", grace_s=5)
    assert wait_exit(second, "j") == Exit("j", 7, None, False, cancelled=True)
    assert "got TERM" in spec.log_path.read_text()


def test_the_time_limit_holds_while_no_daemon_runs(first: LocalExecutor, second: LocalExecutor, tmp_path: Path) -> None:
    first.launch(make_spec(tmp_path, "slow", "sleep", "30", time_limit_s=0.3))
    first.close()  # the daemon is gone: its supervisor enforces the limit alone
    assert second.reattach("slow", 1).found is Found.ALIVE
    assert wait_exit(second, "slow") == Exit("slow", None, signal.SIGTERM, True)


def test_a_supervisor_killed_without_a_record_is_gone_and_its_job_is_killed(
    first: LocalExecutor, second: LocalExecutor, tmp_path: Path
) -> None:
    handle = first.launch(make_spec(tmp_path, "j", "sleep", "30"))
    os.kill(supervisor_pid(first, "j"), signal.SIGKILL)
    assert wait_until(lambda: bool(first.poll()))  # reaped by its parent, the first daemon
    found = second.reattach("j", 1)
    assert found.found is Found.GONE
    assert wait_until(lambda: gone(handle.pid)), "a job left behind by its supervisor would run beside its retry"


def test_an_attempt_never_started_is_told_apart(second: LocalExecutor, tmp_path: Path) -> None:
    assert second.reattach("j", 1).found is Found.NEVER_STARTED
    with pytest.raises(FileNotFoundError):
        second.launch(make_spec(tmp_path, "k", "no-such-command-corral"))
    assert second.reattach("k", 1).found is Found.NEVER_STARTED  # its supervisor said so: nothing ran


def test_sweep_drops_ended_records_and_keeps_live_ones(first: LocalExecutor, tmp_path: Path, run_dir: Path) -> None:
    first.launch(make_spec(tmp_path, "done", "true"))
    first.launch(make_spec(tmp_path, "live", "sleep", "30"))
    wait_exit(first, "done")
    first.sweep(set())
    assert sorted(p.name for p in run_dir.iterdir()) == ["live.1.json", "live.1.lock"]


def test_the_job_env_travels_by_pipe_never_in_argv_or_the_supervisors_env(first: LocalExecutor, tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "j", "sleep", "30", env={"PATH": PATH, "AWS_SECRET": "hunter2"})
    first.launch(spec)
    sup = supervisor_pid(first, "j")
    for what in ("cmdline", "environ"):
        assert b"hunter2" not in Path(f"/proc/{sup}/{what}").read_bytes(), what
    assert Path(f"/proc/{sup}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-I", b"-S"]


def test_corral_variables_never_reach_the_job(first: LocalExecutor, tmp_path: Path) -> None:
    env = {"PATH": PATH, "CORRAL_TOKEN": "root-token", "CORRAL_SOCKET": "/x", "CORRAL_JOB_ID": "forged", "OK": "1"}
    first.launch(make_spec(tmp_path, "j", "env", env=env))
    wait_exit(first, "j")
    seen = env_of((tmp_path / "logs" / "j.log").read_text())
    assert {k: v for k, v in seen.items() if k.startswith("CORRAL_")} == {"CORRAL_JOB_ID": "j"}
    assert seen["OK"] == "1"


def test_logs_are_0600_even_one_left_0640_by_an_older_corral(first: LocalExecutor, tmp_path: Path) -> None:
    old = tmp_path / "logs" / "old.log"
    old.parent.mkdir()
    old.write_text("before\n")
    old.chmod(0o640)
    first.launch(make_spec(tmp_path, "old", "true"))
    wait_exit(first, "old")
    first.launch(make_spec(tmp_path, "new", "true"))
    wait_exit(first, "new")
    assert stat.S_IMODE(old.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "logs" / "new.log").stat().st_mode) == 0o600


def test_the_daemons_process_group_kill_does_not_reach_the_supervisor(first: LocalExecutor, tmp_path: Path) -> None:
    first.launch(make_spec(tmp_path, "j", "sleep", "30"))
    sup = supervisor_pid(first, "j")
    assert os.getpgid(sup) != os.getpgrp() and os.getsid(sup) != os.getsid(0)
