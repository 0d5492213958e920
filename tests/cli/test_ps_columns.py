"""`corral ps` reads the listing as columns (`GET /v1/jobs?layout=columns`) and draws its table a column at a time
(issue 26, item 7): what it prints is the table drawn a job at a time (listing.draw_rows, the path arrays still take),
byte for byte, piped or in colour; --json prints what it printed from rows; an older daemon's rows print the same."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from corral.cli import listing, render
from corral.cli.views import ago, iso_times
from tests.cli.test_fast import FakeDaemon, http, run_main

NOW = 1_800_000_000.25
STATES = ["queued", "starting", "running", "succeeded", "failed", "cancelled", "lost", "held", ""]
REASONS = [
    "", "0/1 nodes fit: 1 insufficient GPU (need 4 whole GPUs)", "exit code 3", "being preempted: by job 9",
    "preempted by job 7 (priority 9 > 0)", "ending: past its time limit: its processes get SIGTERM",
    "waits for afterok:12", "a\x1b[2Jb", "名前がない",
]  # fmt: skip
TEXT = st.one_of(st.sampled_from(["", "w1", "a b", "名前", "\x1b[31m", "[/bold]", "é"]), st.text(max_size=5))
TIME = st.one_of(
    st.none(),
    st.floats(min_value=NOW - 400_000, max_value=NOW + 400_000, allow_nan=False),
    st.sampled_from([NOW, NOW - 0.5, NOW + 0.5, NOW - 1, NOW + 1, NOW - 59.99, NOW - 3600, NOW - 86400.5]),
)
GPUS = st.lists(
    st.fixed_dictionaries(
        {"index": st.integers(0, 7)},
        optional={"milli": st.sampled_from([1000, 300, 0]), "memory_mib": st.sampled_from([0, 10240])},
    ),
    max_size=3,
)
JOB = st.fixed_dictionaries(
    {
        "name": TEXT,
        "user": st.sampled_from(["ann", "bob", "root"]),
        "state": st.sampled_from(STATES),
        "command": st.lists(TEXT, min_size=1, max_size=3),
        "submitted_at": st.floats(min_value=NOW - 400_000, max_value=NOW + 5, allow_nan=False),
        "finished_at": TIME,
        "gpus": GPUS,
        "reason": st.sampled_from(REASONS),
        "preempted": st.one_of(
            st.none(), st.builds(lambda c, a: {"count": c, "at": a, "reason": "by job 5"}, st.integers(1, 3), TIME)
        ),
        "array_job_id": st.just(""),
        "array_task_id": st.none(),
        "array": st.just(""),
    }
)


def printed(jobs: list[dict[str, Any]], env: dict[str, str], draw: Any) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        draw()
    return out.getvalue(), err.getvalue()


def by_rows(jobs: list[dict[str, Any]]) -> None:
    """The table drawn a job at a time, as `corral ps` drew it before columns (and still draws arrays)."""
    view = render.table("ID", "NAME", "USER", "STATE", "GPUS", "SUBMITTED", "ENDED", "COMMAND", "REASON")
    listing.draw_rows(view, [dict(j) for j in jobs], False, NOW)
    listing.out.print(view)


FIELDS = ["name", "user", "state", "command", "submitted_at", "finished_at", "gpus", "reason", "preempted",
          "array_job_id", "array_task_id", "array"]  # fmt: skip


def numbered(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The jobs with ids, each with its fields in one order (as a daemon's rows are)."""
    return [{"id": str(i + 1), **{k: j[k] for k in FIELDS}} for i, j in enumerate(jobs)]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(JOB, max_size=12), st.sampled_from([{"NO_COLOR": "1"}, {"FORCE_COLOR": "1"}]))
@example([], {"NO_COLOR": "1"})
def test_the_table_drawn_by_columns_is_the_one_drawn_by_rows(jobs: list[dict[str, Any]], env: dict[str, str]) -> None:
    jobs = numbered(jobs)
    env = {"NO_COLOR": "", "FORCE_COLOR": "", **env}
    shown = printed(jobs, env, lambda: listing.show(listing.columns_of(jobs), None, None, False, False, NOW))
    assert shown == printed(jobs, env, lambda: by_rows(jobs))
    assert shown[0].count("\n") == len(jobs) + 1


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(JOB, max_size=6))
def test_json_from_columns_is_json_from_rows(jobs: list[dict[str, Any]]) -> None:
    """--json: every field of every job, times as ISO 8601, in the fields' order, as printed from rows."""
    jobs = numbered(jobs)
    shown, _ = printed(jobs, {}, lambda: listing.show(listing.columns_of(jobs), None, None, False, True, NOW))
    assert shown == json.dumps(iso_times(jobs), indent=2) + "\n"


@given(st.one_of(st.none(), st.floats(min_value=-1e7, max_value=1e7, allow_nan=False)))
@example(NOW - 1e-9)
@example(NOW + 0.999999)
def test_ago_worded_once_a_second_is_ago(when: float | None) -> None:
    for t in (when, None if when is None else NOW - when, None if when is None else NOW + when):
        assert listing.ago_column([t], NOW) == [ago(t, NOW)]


def test_a_page_of_rows_or_columns_is_the_same_jobs() -> None:
    rows = [{"id": "1", "state": "queued"}, {"id": "2", "state": "running"}]
    columns = {"id": ["1", "2"], "state": ["queued", "running"]}
    assert listing.columns_of(rows) == columns and listing.columns_of(columns) is columns
    assert listing.rows_of(columns) == rows and listing.columns_of([]) == {}


def test_pages_of_columns_join_and_a_limit_cuts_them() -> None:
    asked: list[dict[str, Any]] = []
    answers = [
        ({"id": ["1", "2"], "state": ["a", "b"]}, "2"),
        ([{"id": "3", "state": "c"}, {"id": "4", "state": "d"}], "4"),  # rows, as an older daemon's
        ({"id": [], "state": []}, None),
    ]

    def fetch(params: list[Any]) -> Any:
        asked.append(dict(params))
        return answers[len(asked) - 1]

    assert listing.column_pages(fetch, [("q", 1)], None, None, 2) == (
        {"id": ["1", "2", "3", "4"], "state": ["a", "b", "c", "d"]}, None
    )  # fmt: skip
    assert [a.get("after") for a in asked] == [None, "2", "4"]
    asked.clear()
    assert listing.column_pages(fetch, [], 3, None, 2) == ({"id": ["1", "2", "3"], "state": ["a", "b", "c"]}, "3")
    assert [a["limit"] for a in asked] == [2, 2]  # the second page: 2 of the 3 + 1 that show whether more are left


def test_an_arrays_tasks_still_fold_into_one_row() -> None:
    task = {"name": "arr", "user": "ann", "command": ["true"], "gpus": [], "submitted_at": NOW - 60,
            "finished_at": None, "reason": "", "preempted": None, "array_job_id": "5", "array": "0-1"}  # fmt: skip
    jobs = [{**task, "id": "5", "state": "running", "array_task_id": 0},
            {**task, "id": "6", "state": "queued", "array_task_id": 1}]  # fmt: skip
    shown, _ = printed(
        jobs, {"NO_COLOR": "1"}, lambda: listing.show(listing.columns_of(jobs), None, None, False, False, NOW)
    )
    assert shown.splitlines()[1].split()[:5] == ["5_[0-1]", "arr", "ann", "1", "queued,"]
    expanded, _ = printed(
        jobs, {"NO_COLOR": "1"}, lambda: listing.show(listing.columns_of(jobs), None, None, True, False, NOW)
    )
    assert [line.split()[0] for line in expanded.splitlines()] == ["ID", "5_0", "5_1"]


@pytest.mark.parametrize("cells", [None, 30])
@pytest.mark.parametrize("color", [False, True])
def test_a_table_given_by_columns_draws_as_given_by_rows(color: bool, cells: int | None) -> None:
    rows = [("1", "名前", render.Styled("queued", "yellow")), ("22", "a\x1bb", "running"), ("3", None, 7)]
    by_rows, by_columns = render.table("ID", "NAME", "STATE"), render.table("ID", "NAME", "STATE")
    for r in rows:
        render.row(by_rows, *r)
    by_columns.add_columns(*([r[i] for r in rows] for i in range(3)))
    assert by_columns.lines(color=color, cells=cells) == by_rows.lines(color=color, cells=cells)
    render.row(by_rows, "4", "x", "lost")
    render.row(by_columns, "4", "x", "lost")  # a row after the columns: below them
    by_columns.add_columns(["5"], ["y"], ["queued"])
    render.row(by_rows, "5", "y", "queued")
    assert by_columns.lines(color=color, cells=cells) == by_rows.lines(color=color, cells=cells)
    with pytest.raises(ValueError, match="3 columns of as many cells each, got"):
        by_columns.add_columns(["1"], ["2"])


def test_ps_asks_for_columns_and_prints_an_older_daemons_rows_the_same(tmp_path: Path) -> None:
    """The fast path asks for layout=columns; a daemon from before it answers rows (it ignores the parameter), and the
    table is the same."""
    rows = [
        {"id": "1", "name": "", "user": "ann", "state": "running", "command": ["sleep", "9"], "gpus": [{"index": 0}],
         "submitted_at": NOW - 120, "finished_at": None, "reason": "", "preempted": None, "array_job_id": "",
         "array_task_id": None, "array": ""},
        {"id": "2", "name": "w", "user": "ann", "state": "queued", "command": ["true"], "gpus": [],
         "submitted_at": NOW - 60, "finished_at": None,
         "reason": "0/1 nodes fit: 1 insufficient GPU (need 4 whole GPUs)", "preempted": None, "array_job_id": "",
         "array_task_id": None, "array": ""},
    ]  # fmt: skip
    printed_by: dict[str, str] = {}
    for layout, page in (("rows", rows), ("columns", listing.columns_of(rows))):
        daemon = FakeDaemon(tmp_path / layout, [http("200 OK", json.dumps(page).encode())])
        try:
            with mock.patch("time.time", return_value=NOW):
                code, out, err = run_main(["ps"], tmp_path / layout)
        finally:
            daemon.close()
        assert (code, err) == (0, "")
        assert "&layout=columns&limit=10000 HTTP/1.1" in daemon.requests[0].decode()
        printed_by[layout] = out
    assert printed_by["rows"] == printed_by["columns"]
    assert printed_by["rows"].splitlines()[2].split() == [
        "2", "w", "ann", "queued", "-", "1m", "ago", "-", "true", "insufficient", "GPU", "(need", "4", "whole", "GPUs)"
    ]  # fmt: skip
