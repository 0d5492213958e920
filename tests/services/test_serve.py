"""End to end through the real `corral serve` and the `corral app` CLI: an app of two HTTP servers with an HTTP health
check; one instance is killed and the count comes back."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.services.ports import bindable
from tests.api.test_serve import Corral, serving, wait_for


def free_range(size: int = 20) -> str:
    for low in range(42000, 48000, 100):
        if all(bindable(p) for p in range(low, low + size)):
            return f"{low}-{low + size - 1}"
    pytest.skip("no free port range for the test")


def test_an_app_keeps_two_healthy_http_servers_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_SERVICE_PORTS", free_range())
    app = {
        "id": "/web",
        "cmd": f"exec {sys.executable} -m http.server --bind 127.0.0.1 $PORT0",
        "cpus": 0.1,
        "mem": 64,
        "instances": 2,
        "backoffSeconds": 0.5,
        "healthChecks": [{"protocol": "HTTP", "path": "/", "gracePeriodSeconds": 15, "intervalSeconds": 2,
                          "timeoutSeconds": 1, "maxConsecutiveFailures": 3}],
    }  # fmt: skip
    (tmp_path / "app.json").write_text(json.dumps(app))
    with serving(tmp_path / "corral.sock", tmp_path / "state") as (corral, _):
        assert corral.run("app", "create", "-f", str(tmp_path / "app.json")).stdout.strip() == "/web"

        def show() -> dict[str, Any]:
            return dict(json.loads(corral.run("app", "show", "web", "--json").stdout))

        def healthy_pair() -> bool:
            data = show()
            return bool(data["tasksRunning"] == 2 and data["tasksHealthy"] == 2)

        wait_for("two healthy instances", healthy_pair, timeout=30)
        first = show()["tasks"]
        ports = {t["ports"][0] for t in first}
        assert len(ports) == 2 and all(42000 <= p < 48000 for p in ports)
        text = corral.run("app", "show", "web").stdout
        assert "healthy" in text and str(min(ports)) in text

        victim = first[0]["corral"]["job"]
        pid = instance_process(victim, first[0]["ports"][0])
        assert pid is not None, "the instance's process was not found"
        os.killpg(os.getpgid(pid), signal.SIGKILL)

        def replaced() -> bool:
            tasks = show()["tasks"]
            return healthy_pair() and victim not in {t["corral"]["job"] for t in tasks}

        wait_for("the killed instance to be replaced", replaced, timeout=30)
        failure = show()["lastTaskFailure"]
        assert failure["state"] == "TASK_FAILED" and failure["taskId"] == first[0]["id"]
        assert "/web" in corral.run("app", "list").stdout

        corral.run("app", "scale", "web", "1")
        wait_for("one instance", lambda: len(show()["tasks"]) == 1, timeout=20)
        missing = corral.run("app", "show", "nope", ok=False)
        assert missing.returncode == 2 and missing.stderr.strip() == "error: App '/nope' does not exist"
        corral.run("app", "delete", "web")
        wait_for("the instances to stop", lambda: _no_live_jobs(corral), timeout=20)


def instance_process(job_id: str, port: int) -> int | None:
    """The PID of this daemon's instance: its CORRAL_JOB_ID and its PORT0 (another daemon's job 1 may be running)."""
    wanted = {f"CORRAL_JOB_ID={job_id}".encode(), f"PORT0={port}".encode()}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if wanted <= set((entry / "environ").read_bytes().split(b"\0")):
                    return int(entry.name)
            except OSError:
                continue
    return None


def _no_live_jobs(corral: Corral) -> bool:
    return all(j["state"] not in ("queued", "starting", "running") for j in corral.jobs().values())
