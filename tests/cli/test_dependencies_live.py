"""Dependencies through the real CLI against a real `corral serve`, with real `false` and `true` processes (issue 26,
item 3): the in-process tests (tests/daemon/test_dependencies.py) cover each kind; this one the path end to end."""

from __future__ import annotations

from pathlib import Path

from tests.api.test_serve import serving, wait_for


def test_afterok_afternotok_and_kill_on_invalid_dep_with_real_jobs(tmp_path: Path) -> None:
    with serving(tmp_path / "corral.sock", tmp_path / "state") as (corral, _):
        corral.env["COLUMNS"] = "400"
        corral.env["NO_COLOR"] = "1"
        failing = corral.submit("--name", "first", "--", "false")
        never = corral.submit("--dependency", f"afterok:{failing}", "--", "true")
        on_failure = corral.submit("-d", f"afternotok:{failing}", "--time", "1", "--", "true")
        killed = corral.submit("--dependency", f"afterok:{failing}", "--kill-on-invalid-dep", "--", "true")
        assert corral.run("wait", on_failure).returncode == 0  # it ran once the first had failed, and succeeded
        wait_for("the --kill-on-invalid-dep job to be cancelled", lambda: corral.state(killed) == "cancelled")
        wait_for("the never-met reason", lambda: "can never be met" in corral.jobs()[never]["reason"])
        assert corral.state(never) == "queued"
        told = corral.run("explain", never).stdout
        assert f"job {failing} failed (afterok needs it to succeed)" in told
        assert "It can never start: cancel it" in told
        assert never in corral.run("ps", "--state", "pending").stdout
        shown = corral.run("show", killed).stdout
        assert f"dependency: afterok:{failing} (cancelled if it can never be met)" in shown
        assert "cancelled: its dependency can never be met" in shown
        bad = corral.run("submit", "--dependency", "afterok:99999", "--", "true", ok=False)
        assert bad.returncode == 2
        assert bad.stderr == (
            "error: --dependency: no job 99999 that you can see (a job may depend on your own jobs; root's on "
            "anyone's)\n"
        )
        corral.run("cancel", never)
