"""hold, update and release through the real CLI against a real `corral serve` (issue 26, item 5), with a restart
between: the in-process tests (tests/api/test_hold_update.py) cover the rules; this one the path end to end."""

from __future__ import annotations

from pathlib import Path

from tests.api.test_serve import serving, wait_for


def test_a_held_job_survives_a_restart_and_runs_once_released_with_its_history_shown(tmp_path: Path) -> None:
    sock, state = tmp_path / "corral.sock", tmp_path / "state"
    with serving(sock, state) as (corral, _):
        corral.env["COLUMNS"] = "400"
        corral.env["NO_COLOR"] = "1"
        blocker = corral.submit("--gpus", "2", "--", "sleep", "60")
        wait_for("the blocker to run", lambda: corral.state(blocker) == "running")
        job = corral.submit("--gpus", "1", "--name", "first", "--", "true")
        assert corral.run("hold", job).stdout == f"job {job}: held by root (corral release {job})\n"
        told = corral.run("update", job, "--priority", "5", "--name", "second", "--time", "1:00:00").stdout
        assert told.startswith(f"job {job}: ") and told.endswith(" by root\n")
        bad = corral.run("update", job, "--gpus", "3", ok=False)
        assert bad.returncode == 2 and bad.stderr.startswith("error: can never run on this machine"), bad.stderr
        corral.run("cancel", blocker)
        wait_for("the blocker to end", lambda: corral.state(blocker) == "cancelled")
    with serving(sock, state) as (corral, _):
        corral.env["COLUMNS"] = "400"
        corral.env["NO_COLOR"] = "1"
        other = corral.submit("--gpus", "1", "--", "true")
        assert corral.run("wait", other).returncode == 0  # rounds ran; the held job was not offered
        assert corral.state(job) == "queued"
        assert corral.jobs()[job]["reason"] == f"held by root (corral release {job})"
        assert corral.run("release", job).stdout == f"job {job}: released, queued\n"
        assert corral.run("wait", job).returncode == 0
        shown = corral.run("show", job).stdout
        assert "held by root" in shown and "released by root" in shown
        assert "name: first -> second by root" in shown and "priority: 0 -> 5 by root" in shown
        assert "time limit: none -> 1h by root" in shown
        ended = corral.run("hold", job, ok=False)
        assert ended.returncode == 2
        assert ended.stderr == f"error: state: job {job} is succeeded: only a waiting job can be held\n"
