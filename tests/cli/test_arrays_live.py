"""A job array through the real CLI against a real `corral serve` (issue 26, item 2), with a restart between: each
task's process gets its variables, `wait` and `logs` take the array, and a throttled array left waiting survives
the restart. The in-process tests (tests/daemon/test_arrays.py) cover the rules and every message."""

from __future__ import annotations

from pathlib import Path

from tests.api.test_serve import serving, wait_for


def test_an_array_runs_each_task_with_its_variables_and_survives_a_restart(tmp_path: Path) -> None:
    sock, state = tmp_path / "corral.sock", tmp_path / "state"
    script = 'echo "task $CORRAL_ARRAY_TASK_ID of $CORRAL_ARRAY_TASK_COUNT in $CORRAL_ARRAY_JOB_ID"'
    small = ("--cpus", "100m", "--memory", "16MiB")
    with serving(sock, state) as (corral, _):
        corral.env["NO_COLOR"] = "1"
        a = corral.submit(*small, "--array", "1,3", "--", "sh", "-c", script)
        assert corral.run("wait", a).returncode == 0
        assert corral.run("logs", a).stdout == f"==> {a}_1 <==\ntask 1 of 2 in {a}\n==> {a}_3 <==\ntask 3 of 2 in {a}\n"
        blocker = corral.submit("--gpus", "2", "--", "sleep", "60")
        wait_for("the blocker to run", lambda: corral.state(blocker) == "running")
        waiting = corral.submit(*small, "--gpus", "1", "--array", "0-3%1", "--", "sh", "-c", script)
        held = corral.run("hold", f"{waiting}_[2-3]").stdout  # a range in the path, through the real transport
        assert held == (
            f"array {waiting}_[2-3]: 2 waiting tasks held (corral release {waiting}_[2-3]); 2 tasks: 2 queued\n"
        )
    with serving(sock, state) as (corral, _):
        corral.env["NO_COLOR"] = "1"
        rows = corral.run("ps", "--array", waiting).stdout.splitlines()[1:]
        assert [r.split()[0] for r in rows] == [f"{waiting}_{t}" for t in range(4)]
        assert corral.run("release", waiting).stdout == f"array {waiting}: 2 held tasks released\n"
        corral.run("cancel", blocker)
        assert corral.run("wait", waiting).returncode == 0
        assert corral.run("logs", f"{waiting}_2").stdout == f"task 2 of 4 in {waiting}\n"
