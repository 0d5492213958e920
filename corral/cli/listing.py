"""`corral ps`: every page of the daemon's listing, and the table (or JSON) it prints. Shared by the click command
(corral.cli.client.ps_cmd) and the fast path (corral.cli.fast), which fetch the pages each their own way; so the
two print the same, from the same code. Import-light: no click, dataclasses or typing at import.
"""

from __future__ import annotations

import sys

from corral.cli.render import Styled, Terminal, row, say, table
from corral.cli.views import ago, array_rows, command_text, gpus_text, iso_times, short_reason
from corral.cli.wire import PS_PAGE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from corral.cli.wire import Param

    #: One page: the query (with its limit and after) -> (the jobs, the X-Corral-Next-After header or None).
    Fetch = Callable[[list[Param]], tuple[list[dict[str, Any]], str | None]]

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


def pages(
    fetch: Fetch, params: Sequence[Param], limit: int | None, after: str | None, page_size: int = PS_PAGE
) -> tuple[list[dict[str, Any]], str | None]:
    """Every job the daemon lists for `params` (at most `limit`), page after page from `after`; and, when `limit` cut
    the list, the id to page on from (None: nothing left out)."""
    jobs: list[dict[str, Any]] = []
    while True:
        # With a limit, one job more than it shows: whether any was left out (a full page alone does not say).
        want = page_size if limit is None else min(page_size, limit + 1 - len(jobs))
        page, after = fetch([*params, ("limit", want)] + ([("after", after)] if after is not None else []))
        jobs.extend(page)
        if limit is not None and len(jobs) > limit:
            del jobs[limit:]
            return jobs, jobs[-1]["id"]
        if not after:
            return jobs, None


def show(
    jobs: list[dict[str, Any]], more: str | None, limit: int | None, expand: bool, as_json: bool, now: float
) -> None:
    """Print `corral ps`'s answer: the table, or with `as_json` every field as JSON; on stderr, how to page on."""
    if more:  # on stderr, so that --json output stays one JSON document
        say(err, f"more jobs not shown (--limit {limit}): the next ones with --after {more}, or a larger --limit")
    if as_json:
        import json

        sys.stdout.write(json.dumps(iso_times(jobs), indent=2) + "\n")
        return
    view = table("ID", "NAME", "USER", "STATE", "GPUS", "SUBMITTED", "ENDED", "COMMAND", "REASON")
    if expand:  # each task as ID_TASK
        jobs = [{**j, "id": f"{j['array_job_id']}_{j['array_task_id']}"} if j.get("array_job_id") else j for j in jobs]
    else:
        jobs = array_rows(jobs)
    states: dict[str, object] = {}
    # A job's REASON cell, by (state, reason) for a job never preempted (the cell then depends on nothing else): the
    # jobs of a long queue mostly share one.
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
    out.print(view)
