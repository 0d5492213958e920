"""`ps`, `show`, `explain` and the errors of `submit` as a user sees them, against a real `corral serve` on two
simulated A100s (one daemon for the module: each CLI call is a process, so assertions are grouped)."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.api.test_serve import Corral, serving, wait_for


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Corral, Path]]:
    tmp = tmp_path_factory.mktemp("views")
    with serving(tmp / "corral.sock", tmp / "state") as (client, _):
        client.env["COLUMNS"] = "400"
        client.env["NO_COLOR"] = "1"
        yield client, tmp


def lines_of(table: str) -> dict[str, str]:
    """A `ps` table's rows by job id."""
    return {line.split()[0]: line for line in table.splitlines()[1:]}


def test_ps_show_explain_and_errors(daemon: tuple[Corral, Path]) -> None:
    corral, _ = daemon
    cpu = corral.submit("--cpus", "100m", "--memory", "16MiB", "--", "sh", "-c", "date >> /dev/null; sleep 30")
    share = corral.submit("--gpus", "1", "--gpu-fraction", "0.3", "--gpu-memory", "10GiB", "--", "sleep", "30")
    whole = corral.submit("--gpus", "1", "--cpus", "100m", "--", "sleep", "30")
    waits = corral.submit("--gpus", "2", "--time-limit", "90m", "--name", "big", "--", "true")
    wait_for("three jobs to run", lambda: [corral.state(j) for j in (cpu, share, whole)] == ["running"] * 3)

    table = corral.run("ps").stdout
    assert table.split("\n")[0].split() == [
        "ID", "NAME", "USER", "STATE", "GPUS", "SUBMITTED", "ENDED", "COMMAND", "REASON",
    ]  # fmt: skip
    rows = lines_of(table)
    assert "sh -c 'date >> /dev/null; sleep 30'" in rows[cpu] and rows[cpu].rstrip().endswith(" -")  # no placement note
    assert " 0:300m/10GiB " in rows[share] or " 1:300m/10GiB " in rows[share]
    gpu_of_share = "0" if " 0:300m" in rows[share] else "1"
    assert f" {'1' if gpu_of_share == '0' else '0'} " in rows[whole]
    assert "insufficient GPU (need 2 whole GPUs)" in rows[waits]
    assert re.search(r" (now|\d+s ago) ", rows[waits]) and "1795" not in table  # relative times, no epoch seconds

    assert list(lines_of(corral.run("ps", "--state", "queued").stdout)) == [waits]
    assert list(lines_of(corral.run("ps", "--state", "queued,running", "--limit", "2").stdout)) == [cpu, share]
    assert list(lines_of(corral.run("ps", "--user", "nobody-here").stdout)) == []
    listed = json.loads(corral.run("ps", "--json").stdout)
    assert datetime.fromisoformat(listed[0]["submitted_at"]).timestamp() > time.time() - 600

    shown = corral.run("show", waits).stdout
    for expected in (
        "command: true", "state: queued", "cpus: 1", "memory: 1GiB", "gpus: 2 whole", "time limit: 90m",
        "log: ", "logs/" + waits + ".log", "env: ", "submitted: 20",
    ):  # fmt: skip
        assert expected in shown, (expected, shown)
    assert f"cwd: {Path.cwd()}" in shown and "started: -" in shown
    assert "command: sh -c 'date >> /dev/null; sleep 30'" in corral.run("show", cpu).stdout
    assert json.loads(corral.run("show", waits, "--json").stdout)["request"]["gpu_count"] == 2

    running = corral.run("explain", cpu).stdout
    assert running.startswith(f"job {cpu} is running") and ": -" not in running
    said = corral.run("explain", share).stdout.splitlines()
    assert said[0] == f"job {share} is running" and said[1].startswith(f"It holds GPU {gpu_of_share} (")
    assert said[1].endswith("): 300 milli of compute and 10 GiB of memory.") and said[3] == "No time limit."
    assert any(line.startswith("Protected from preemption until ") for line in said)  # its minimum runtime
    said = corral.run("explain", waits).stdout.splitlines()
    assert said[0] == f"job {waits} is waiting: does not fit on this machine now: insufficient GPU (need 2 whole GPUs)"
    # then the queue's story, a sentence a line: its place, who holds the GPUs until when, and its reservation
    assert said[1] == "Position 1 of 1 in the queue."
    assert said[2].startswith(f"Held by job {cpu} (") or said[2].startswith("Held by job ")
    assert said[3].startswith("Reserved for it: GPUs 0, 1 from ") and len(said) == 4
    corral.run("cancel", waits)
    assert corral.run("explain", waits).stdout == f"job {waits} was cancelled\n"

    too_much = corral.run("submit", "--gpus", "1", "--gpu-memory", "900GiB", "--", "true", ok=False)
    assert too_much.returncode == 2 and too_much.stderr.startswith("error: --gpu-memory: ")
    never = corral.run("submit", "--cpus", "100000", "--", "true", ok=False)
    assert never.stderr == "error: can never run on this machine: CPU capacity below 100000000m\n"
    assert corral.run("ps", "--state", "bogus", ok=False).stderr.startswith("error: --state: must be one of")
    corral.run("cancel", cpu, share, whole)


def test_ps_hides_jobs_that_ended_over_an_hour_ago(daemon: tuple[Corral, Path]) -> None:
    corral, tmp = daemon
    old, recent = (corral.submit("--cpus", "100m", "--memory", "16MiB", "--", "true") for _ in range(2))
    wait_for("both to end", lambda: {corral.state(old), corral.state(recent)} == {"succeeded"})
    db = sqlite3.connect(tmp / "state" / "jobs.db")
    try:  # as if it had ended two hours ago
        db.execute("UPDATE jobs SET finished_at = ? WHERE id = ?", (time.time() - 7200, int(old)))
        db.commit()
    finally:
        db.close()
    shown = lines_of(corral.run("ps").stdout)
    assert recent in shown and old not in shown
    for asks in (("--all",), ("-a",), ("--state", "succeeded"), ("--since", "1d")):
        assert old in lines_of(corral.run("ps", *asks).stdout), asks
    assert "2h ago" in lines_of(corral.run("ps", "-a").stdout)[old]


def test_app_create_json_and_a_duplicate_said_literally(daemon: tuple[Corral, Path]) -> None:
    corral, tmp = daemon
    spec = tmp / "infer.json"
    spec.write_text(json.dumps({"id": "/infer", "cmd": "sleep 30", "cpus": 0.1, "mem": 16, "instances": 0}))
    created = json.loads(corral.run("app", "create", "-f", str(spec), "--json").stdout)
    assert created["id"] == "/infer" and created["instances"] == 0
    again = corral.run("app", "create", "-f", str(spec), ok=False)
    # Marathon's own message, its brackets as they are (Rich would have read `[/infer]` as a closing tag)
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert again.stderr.startswith("error: ") and "[/infer]" in again.stderr and "already exists" in again.stderr
    corral.run("app", "delete", "/infer")


def test_serve_takes_behavior_like_the_other_commands(tmp_path: Path) -> None:
    for flag in ("--behavior", "--gpu-behavior"):  # the second: the spelling that shipped first, kept hidden
        done = Corral(tmp_path / "none.sock").run(
            "serve", "--simulate-gpus", "1xA100-80GB", "--state-dir", str(tmp_path / flag), flag, "sometimes", ok=False
        )
        assert done.returncode == 2 and done.stderr.startswith("error: Setting sometimes is invalid."), done.stderr
    assert "--gpu-behavior" not in Corral(tmp_path / "none.sock").run("serve", "--help").stdout
