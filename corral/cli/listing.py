"""`corral ps`: every page of the daemon's listing, and the table (or JSON) it prints. Shared by the click command
(corral.cli.client.ps_cmd) and the fast path (corral.cli.fast), which fetch the pages each their own way; so the
two print the same, from the same code. Import-light: no click, dataclasses or typing at import.

The jobs come and stay a column at a time (issue 26, item 7): `GET /v1/jobs?layout=columns` sends a list per field
(`{"id": [...], "state": [...]}`), the pages are joined list by list, and the table's cells are made a column at a
time, each distinct value worded once (5,000 waiting jobs mostly share their state, command, reason and the second
they were submitted in), with no object a job on either side:

    pages: {"id": [...], ...} + {"id": [...], ...}  ->  columns  ->  show: a list of cells per column  ->  the lines

An older daemon answers rows (`[{"id": ..., ...}, ...]`): its pages are made columns here, and print the same. An
array's tasks fold into one row (views.array_rows), and --json prints objects: those two make rows of the columns.
"""

from __future__ import annotations

import sys

from corral.cli.render import Columns, Styled, Terminal, row, say, table
from corral.cli.views import (
    TIME_FIELDS,
    ago,
    array_rows,
    command_text,
    duration_text,
    gpus_text,
    iso,
    short_reason,
)
from corral.cli.wire import PS_PAGE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from corral.cli.wire import Param

    #: Jobs a column at a time: each field's values, a job each, in the listing's order.
    Jobs = dict[str, list[Any]]
    #: One page: the query (with its limit and after) -> (the jobs as columns, or as rows from an older daemon; the
    #: X-Corral-Next-After header or None).
    Fetch = Callable[[list[Param]], tuple[Jobs | list[dict[str, Any]], str | None]]

FINAL_STATES = {"succeeded", "failed", "cancelled", "lost"}
#: How a state shows on a colour terminal: what needs a look (failed, lost) stands out, what is over recedes.
STATE_STYLES = {
    "queued": "yellow", "starting": "cyan", "running": "bold green", "succeeded": "green", "failed": "bold red",
    "cancelled": "dim", "lost": "bold magenta",
}  # fmt: skip

out = Terminal()
err = Terminal(stderr=True, soft_wrap=True)


def state_cell(state: str) -> object:
    """A job's state for a table: corral's own word with its colour; anything else (a newer daemon's) literal."""
    style = STATE_STYLES.get(state)
    return Styled(state, style) if style is not None else state


def columns_of(page: Jobs | list[dict[str, Any]]) -> Jobs:
    """A page as columns: as it came (`layout=columns`), or an older daemon's rows made columns (its rows all have
    the same fields, those of its first)."""
    if isinstance(page, dict):
        return page
    return {key: [job.get(key) for job in page] for key in page[0]} if page else {}


def rows_of(jobs: Jobs) -> list[dict[str, Any]]:
    """The jobs as one object each, their fields in the listing's order."""
    return [dict(zip(jobs, values, strict=True)) for values in zip(*jobs.values(), strict=True)]


def count(jobs: Jobs) -> int:
    return len(next(iter(jobs.values()), ()))


def column_pages(
    fetch: Fetch, params: Sequence[Param], limit: int | None, after: str | None, page_size: int = PS_PAGE
) -> tuple[Jobs, str | None]:
    """Every job the daemon lists for `params` (at most `limit`), page after page from `after`, as columns; and,
    when `limit` cut the list, the id to page on from (None: nothing left out)."""
    jobs: Jobs = {}
    have = 0
    while True:
        # With a limit, one job more than it shows: whether any was left out (a full page alone does not say).
        want = page_size if limit is None else min(page_size, limit + 1 - have)
        page, after = fetch([*params, ("limit", want)] + ([("after", after)] if after is not None else []))
        columns = columns_of(page)
        if not jobs:
            jobs = {key: list(values) for key, values in columns.items()}  # its own lists: the page's stay as sent
        else:
            for key, values in columns.items():
                jobs.setdefault(key, []).extend(values)
        have = count(jobs)
        if limit is not None and have > limit:
            for values in jobs.values():
                del values[limit:]
            return jobs, jobs["id"][-1]
        if not after:
            return jobs, None


def pages(
    fetch: Fetch, params: Sequence[Param], limit: int | None, after: str | None, page_size: int = PS_PAGE
) -> tuple[list[dict[str, Any]], str | None]:
    """`column_pages` as one object a job."""
    jobs, more = column_pages(fetch, params, limit, after, page_size)
    return rows_of(jobs), more


def ago_column(times: Sequence[float | None], now: float) -> list[str]:
    """`views.ago(t, now)` of each time, worded once a distinct whole second: ago's text depends on the whole
    seconds of now - t alone (0: "now"; N > 0: "N's duration ago"; N < 0: "in ..."), and a queue's jobs share a few
    hundred of those (tests/cli/test_ps_columns.py holds the two equal)."""
    seconds = [None if t is None else int(now - t) for t in times]
    words = {s: _ago_seconds(s) for s in set(seconds)}
    return [words[s] for s in seconds]


def _ago_seconds(seconds: int | None) -> str:
    """views.ago of a time `seconds` whole seconds ago (negative: ahead)."""
    if seconds is None:
        return "-"
    if seconds == 0:
        return "now"
    return f"{duration_text(seconds)} ago" if seconds > 0 else f"in {duration_text(seconds)}"


def each(convert: Callable[[Any], object], keys: Sequence[Any]) -> list[object]:
    """`convert(key)` of every key, worded once a distinct key (the loops over the keys are dict's and map's)."""
    done: dict[Any, object] = dict.fromkeys(keys)
    for key in done:
        done[key] = convert(key)
    return list(map(done.__getitem__, keys))


def show(jobs: Jobs, more: str | None, limit: int | None, expand: bool, as_json: bool, now: float) -> None:
    """Print `corral ps`'s answer: the table, or with `as_json` every field as JSON; on stderr, how to page on."""
    if more:  # on stderr, so that --json output stays one JSON document
        say(err, f"more jobs not shown (--limit {limit}): the next ones with --after {more}, or a larger --limit")
    if as_json:
        import json

        timed = {k: [iso_time(v) for v in values] if k in TIME_FIELDS else values for k, values in jobs.items()}
        sys.stdout.write(json.dumps(rows_of(timed), indent=2) + "\n")
        return
    view = table("ID", "NAME", "USER", "STATE", "GPUS", "SUBMITTED", "ENDED", "COMMAND", "REASON")
    n = count(jobs)
    if any(jobs.get("array_job_id") or ()):  # arrays fold into a row each (or show ID_TASK): a row at a time
        draw_rows(view, rows_of(jobs), expand, now)
        out.print(view)
        return
    nothing = [None] * n
    states: list[Any] = jobs.get("state") or nothing
    color = out.color()
    reasons = jobs.get("reason") or nothing
    preempted = jobs.get("preempted") or nothing
    # A job's REASON cell, by (state, reason) for a job never preempted (the cell then depends on nothing else): the
    # jobs of a long queue mostly share one. A preempted job's names its preemption.
    reason_cells = each(
        lambda state_reason: short_reason(dict(zip(("state", "reason"), state_reason, strict=True)), now),
        list(zip(states, reasons, strict=True)),
    )
    for i in (i for i, p in enumerate(preempted) if p):
        reason_cells[i] = short_reason({k: values[i] for k, values in jobs.items()}, now)
    view.add_columns(
        jobs.get("id") or [],
        [name or "-" for name in jobs.get("name") or nothing],
        jobs.get("user") or [],
        # a state's colour only on a colour terminal: without, a Styled cell draws as its word
        each(state_cell, states) if color else states,
        [gpus_text({"gpus": g}) if g else "-" for g in jobs.get("gpus") or nothing],
        ago_column(jobs.get("submitted_at") or [], now),
        ago_column(
            [t if s in FINAL_STATES else None for t, s in zip(jobs.get("finished_at") or nothing, states, strict=True)],
            now,
        ),
        each(command_text, list(map(tuple, jobs.get("command") or []))),
        reason_cells,
    )
    out.print(view)


def iso_time(value: Any) -> Any:
    """A `*_at` field's value as `views.iso_times` writes it for --json."""
    return iso(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def draw_rows(view: Columns, jobs: list[dict[str, Any]], expand: bool, now: float) -> None:
    """The table's rows a job at a time: an array's tasks folded into one row (or, with `expand`, as ID_TASK)."""
    if expand:  # each task as ID_TASK
        jobs = [{**j, "id": f"{j['array_job_id']}_{j['array_task_id']}"} if j.get("array_job_id") else j for j in jobs]
    else:
        jobs = array_rows(jobs)
    states: dict[str, object] = {}
    reasons: dict[tuple[str, str], str] = {}
    for j in jobs:
        state = j["state"]
        ended = j.get("ended", state in FINAL_STATES)
        key = (state, j.get("reason") or "")
        if j.get("preempted"):
            reason = short_reason(j, now)
        elif key in reasons:
            reason = reasons[key]
        else:
            reason = reasons[key] = short_reason(j, now)
        if (cell := states.get(state)) is None:
            cell = states[state] = state_cell(state)
        row(
            view,
            j["id"],
            j["name"] or "-",
            j["user"],
            cell,
            gpus_text(j),
            ago(j["submitted_at"], now),
            ago(j["finished_at"], now) if ended else "-",
            command_text(j["command"]),
            reason,
        )
