"""`corral acct` (issue 26 item 6): the table, --json, --csv, --format, --summary, paging, who sees whose jobs, and
every error text. The command's requests go to an in-process daemon (tests/api/test_read_views.py's Box: 4
simulated H100s, a fake executor, a clock the test moves), as root or as a user."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from corral.cli import acct as acct_cli
from corral.cli import client
from corral.cli.render import Columns, Styled
from tests.api.test_acct import run
from tests.api.test_api import ALICE, BOB, ROOT
from tests.api.test_read_views import T0, Box

Peer = tuple[int, int, str]
SINCE = ("-S", "2027-01-01")  # the Box's clock starts at T0, 2027-01-15


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


def acct(
    box: Box, monkeypatch: pytest.MonkeyPatch, *args: str, peer: Peer = ALICE, sent: list[Any] | None = None
) -> Result:
    api = box.client(peer)

    def call(_socket: Any, method: str, url: str, describe: Any = None, *_: Any, params: Any = None, **__: Any) -> Any:
        assert method == "GET" and url in ("/v1/acct", "/v1/acct/summary")
        if sent is not None:
            sent.append(dict(params))
        answer = api.get(url, params=params)
        if answer.status_code >= 400:
            raise client.fail((describe or client.error_text)(answer))
        return answer

    monkeypatch.setattr(client, "call", call)
    return CliRunner().invoke(acct_cli.acct_cmd, list(args))


def ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def failed(result: Result) -> str:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    return result.stderr.strip()


def test_the_table_shows_hours_and_marks_simulated_figures(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    job = run(box, 5400, gpus=2, cpus="4", name="resnet")
    result = acct(box, monkeypatch, *SINCE)
    lines = ok(result).splitlines()
    assert lines[0].split() == [
        "ID", "NAME", "USER", "QUEUE", "STATE", "EXIT", "ELAPSED", "GPUS", "GPU_HOURS", "CPU_HOURS", "GPU_UTIL",
        "GPU_MEM",
    ]  # fmt: skip
    cells = lines[1].split()
    assert cells[:10] == [job, "resnet", "alice", "default", "succeeded", "0", "01:30:00", "2", "3.00", "6.00"]
    assert cells[10].endswith("%*") and cells[11].endswith("GiB*")
    assert result.stderr.strip() == "*: made-up figures of simulated GPUs (corral serve --simulate-gpus), not measured"
    # without the GPU fields, no note
    plain = acct(box, monkeypatch, *SINCE, "-o", "JobID,jobname,Elapsed,partition%20")
    assert ok(plain).splitlines() == ["ID   NAME     ELAPSED    QUEUE", f"{job}    resnet   01:30:00   default"]
    assert plain.stderr == ""


def test_json_and_csv(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    job = run(box, 3600, gpus=1)
    (row,) = json.loads(ok(acct(box, monkeypatch, *SINCE, "--json")))
    assert list(row) == list(box.client(ALICE).get("/v1/acct").json()[0])  # the API's fields, in its order
    assert row["id"] == job and row["simulated"] is True and row["gpu_hours"] == 1.0
    assert row["ended_at"].startswith("2027-01-15T") and row["elapsed_s"] == 3600
    (few,) = json.loads(ok(acct(box, monkeypatch, *SINCE, "--json", "-o", "id,gpu_util")))
    assert set(few) == {"id", "gpu_util_pct", "simulated"}
    table = list(csv.reader(io.StringIO(ok(acct(box, monkeypatch, *SINCE, "--csv", "-o", "id,elapsed,gpu_util")))))
    assert table[0] == ["id", "elapsed", "gpu_util", "simulated"]
    assert table[1][:2] == [job, "3600.0"] and table[1][3] == "true" and 30 <= float(table[1][2]) <= 95


def test_summary_per_user_and_queue(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    run(box, 3600, gpus=2)
    run(box, 1800, peer=BOB, gpus=1)
    lines = ok(acct(box, monkeypatch, *SINCE, "--summary", peer=ROOT)).splitlines()
    assert lines[0].split() == ["USER", "QUEUE", "JOBS", "ELAPSED", "GPU_HOURS", "CPU_HOURS", "GPU_UTIL"]
    assert [line.split()[:5] for line in lines[1:]] == [
        ["alice", "default", "1", "01:00:00", "2.00"],
        ["bob", "default", "1", "00:30:00", "0.50"],
    ]
    rows = json.loads(ok(acct(box, monkeypatch, *SINCE, "--summary", "--json")))
    assert [(s["user"], s["jobs"]) for s in rows] == [("alice", 1)]  # a user's summary: their own jobs


def test_users_see_their_own_root_sees_everyones(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = run(box, 60, gpus=1)
    bobs = run(box, 60, peer=BOB, gpus=1)

    def ids(peer: Peer, *args: str) -> list[str]:
        return [r["id"] for r in json.loads(ok(acct(box, monkeypatch, *SINCE, "--json", *args, peer=peer)))]

    assert (
        ids(ALICE) == [mine] and ids(BOB) == [bobs] and ids(ROOT) == [mine, bobs] and ids(ROOT, "-u", "bob") == [bobs]
    )
    assert failed(acct(box, monkeypatch, *SINCE, "-u", "bob")) == (
        "error: --user: only root or an admin can see other users' jobs"
    )


def test_every_job_page_after_page_and_the_limit(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    made = [run(box, 60, ticks=1) for _ in range(5)]
    monkeypatch.setattr(acct_cli, "PAGE", 2)
    sent: list[Any] = []
    assert [r["id"] for r in json.loads(ok(acct(box, monkeypatch, *SINCE, "--json", sent=sent)))] == made
    assert [p["limit"] for p in sent] == [2, 2, 2]
    result = acct(box, monkeypatch, *SINCE, "--json", "--limit", "3")
    assert [r["id"] for r in json.loads(ok(result))] == made[:3]
    assert result.stderr.strip() == "more jobs not shown (--limit 3): narrow --since/--until, or a larger --limit"


def test_the_window_sent_defaults_to_midnight(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[Any] = []
    ok(acct(box, monkeypatch, sent=sent))
    (params,) = sent
    assert "until" not in params and params["since"] % 60 == 0 and params["since"] <= T0 + 10**9
    sent.clear()
    ok(acct(box, monkeypatch, "-S", "2026-11-01T10:00", "-E", "now", "-s", "failed", "-r", "train", sent=sent))
    assert sent[0]["state"] == "failed" and sent[0]["queue"] == "train" and sent[0]["since"] < sent[0]["until"]


def test_bad_input_gets_a_clear_error(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    def error(*args: str) -> str:
        return failed(acct(box, monkeypatch, *args))

    assert error("-S", "2026-11-10", "-E", "2026-11-01") == (
        "error: --since (2026-11-10T00:00:00) must be before --until (2026-11-01T00:00:00)"
    )
    assert "must be before --until" in error("-S", "now+1d", "-E", "now")
    assert error("-S", "last tuesday") == (
        "error: --since: not a time: 'last tuesday' (examples: 2026-11-01, 2026-11-01T10:00, now-7d, 7d (ago), today)"
    )
    assert error("-E", "99999-01-01").startswith("error: --until: not a time: '99999-01-01'")
    assert error("-S", "now-99999999999days") == (
        "error: --since: must be at most ten years from now, got 'now-99999999999days'"
    )
    assert error("-S", "1969-12-31T00:00+00:00") == (
        "error: --since: '1969-12-31T00:00+00:00' is before 1970: give a time from 1970 to 9999"
    )
    assert error("-o", "id,bogus,gpus") == (
        "error: --format: unknown field 'bogus'; the fields: id, name, user, uid, queue, state, exit, submitted, "
        "started, ended, elapsed, gpus, gpu_ids, cpus, gpu_hours, cpu_hours, gpu_util, gpu_mem, samples, simulated "
        "(and sacct's jobid, jobname, partition, exitcode, submit, start, end, ncpus, alloccpus, elapsedraw)"
    )
    assert error("-o", ",").startswith("error: --format: name at least one field: id, name,")
    assert error("--json", "--csv") == "error: --json and --csv: choose one"
    assert error("--summary", "-o", "id") == (
        "error: --format: --summary has its own columns (user, queue, jobs, elapsed, gpu_hours, cpu_hours, gpu_util)"
    )
    assert error("--summary", "--limit", "3") == "error: --limit: --summary sums every job that matches"
    assert error(*SINCE, "-s", "running") == (
        "error: --state: must be one of cancelled, failed, lost, succeeded (the states of jobs that ended; completed "
        "is succeeded), got 'running'"
    )


def test_the_piped_table_is_the_one_columns_draws(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    # drawn a column at a time when piped: the same text as a Columns table row by row, for any cell
    headers = ["ID", "NAME", "STATE", "EXIT", "LAST"]
    cells: list[list[object]] = [
        ["7", "12", "1234567"],
        ["[/bold]\x1b[2J", "训练作业", ""],
        [Styled("succeeded", "green"), "weird\tstate", Styled("failed", "red")],
        [0, None, 137],
        ["", "-", "x"],
    ]
    for chosen in (range(5), [0, 2, 3], [1, 4], [0]):
        view = Columns(*(headers[i] for i in chosen))
        for record in zip(*(cells[i] for i in chosen), strict=True):
            view.add_row(*record)
        expected = "".join(line + "\n" for line in view.lines(color=False, cells=None))
        assert acct_cli.plain_table([headers[i] for i in chosen], [cells[i] for i in chosen]) == expected
    assert acct_cli.plain_table(["ID", "NAME"], [[], []]) == "ID   NAME\n"
    # and through the command: piped, and styled for a terminal (FORCE_COLOR), the same text
    run(box, 3600, gpus=2, name="训练")
    run(box, 60, exit_code=3, ticks=0, name="[/bold]")
    run(box, 90)
    piped = ok(acct(box, monkeypatch, *SINCE))
    assert "训练" in piped and "[/bold]" in piped
    monkeypatch.setenv("FORCE_COLOR", "1")
    styled = ok(acct(box, monkeypatch, *SINCE))
    assert styled != piped and re.sub(r"\x1b\[[0-9;]*m", "", styled) == piped


def test_an_older_daemon_without_the_columns_layout(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in range(3):
        run(box, 3600, gpus=1)
    run(box, 60, exit_code=3, ticks=0)
    monkeypatch.setattr(acct_cli, "PAGE", 3)
    argvs = [[*SINCE], [*SINCE, "--csv", "-o", "id,gpu_ids,started,gpu_util"], [*SINCE, "--json"]]
    now = [ok(acct(box, monkeypatch, *argv)) for argv in argvs]
    api = box.client(ALICE)

    def rows_only(
        _socket: Any, method: str, url: str, describe: Any = None, *_: Any, params: Any = None, **__: Any
    ) -> Any:
        answer = api.get(url, params=[(k, v) for k, v in params if k != "layout"])  # as a daemon that ignores it
        assert answer.status_code == 200 and isinstance(answer.json(), list)
        return answer

    monkeypatch.setattr(client, "call", rows_only)
    assert [ok(CliRunner().invoke(acct_cli.acct_cmd, argv)) for argv in argvs] == now


def test_a_page_that_fails_after_the_first_fails_the_command(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in range(3):
        run(box, 60, ticks=1)
    monkeypatch.setattr(acct_cli, "PAGE", 1)
    api = box.client(ALICE)
    calls: list[Any] = []

    def call(_socket: Any, method: str, url: str, describe: Any = None, *_: Any, params: Any = None, **__: Any) -> Any:
        calls.append(params)
        if len(calls) == 3:  # the read-ahead thread's second page
            raise client.fail("corral serve stopped answering")
        return api.get(url, params=params)

    monkeypatch.setattr(client, "call", call)
    result = CliRunner().invoke(acct_cli.acct_cmd, [*SINCE])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip() == "error: corral serve stopped answering"
