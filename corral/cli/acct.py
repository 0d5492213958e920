"""`corral acct`: the jobs that ended, with their hours and GPU efficiency, as Slurm's sacct lists them.

    corral acct                                   your jobs that ended since midnight (root, admins: everyone's)
    corral acct -S now-7d -E now-1d -s failed     a window of time, one state (repeatable, or failed,cancelled)
    corral acct -u bob -o id,user,elapsed,gpu_util   one user's (root or an admin), these fields (sacct's names too)
    corral acct --summary -S 2026-11-01           per user and queue: jobs, elapsed, GPU-hours, CPU-hours, mean use
    corral acct --json | --csv                    every field as JSON, or the fields as CSV

Times (--since, --until) are read by corral.model.times (2026-11-01, 2026-11-01T10:00, now-7d, 7d, today) and sent to
`GET /v1/acct` as seconds since the epoch; the command pages the API itself, as `corral ps` does. Figures of
simulated GPUs are made up: the table marks them with `*` (and says so), JSON and CSV with `simulated`.

A thin-client command (corral.cli.client): click and the standard library, nothing of the daemon.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import click

from corral.cli import client
from corral.cli.render import Columns, Styled, escaped, row, say, table, width
from corral.cli.transport import Response
from corral.cli.views import iso, mem_text

T = TypeVar("T")
#: `corral acct` asks the daemon for this many records a request (its most), and for as many pages as it takes.
PAGE = 10000
#: Records as `GET /v1/acct?layout=columns` sends them: a list per field of the API's records.
Records = dict[str, list[Any]]
#: A field's cells in a table or values in CSV, a column at a time, from the records' columns.
ColumnCells = Callable[[Records], list[Any]]
SIMULATED_NOTE = "*: made-up figures of simulated GPUs (corral serve --simulate-gpus), not measured"
#: How the daemon's field errors read on this command's line.
FLAGS = {"since": "--since", "until": "--until", "state": "--state", "user": "--user", "queue": "--queue"}


def clock(when: float | None) -> str:
    """Local time as sacct writes it: 2026-11-28T14:05:03; "-" for none."""
    return "-" if when is None else datetime.fromtimestamp(when).strftime("%Y-%m-%dT%H:%M:%S")


def elapsed_text(seconds: float) -> str:
    """Slurm's elapsed time: [D-]HH:MM:SS (90061 s -> "1-01:01:01")."""
    s = int(seconds)
    days, s = divmod(s, 86400)
    text = f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}-{text}" if days else text


def amount(value: float) -> str:
    """2.0 -> "2", 0.3 -> "0.3"."""
    return f"{value:g}"


def each(convert: Callable[[Any], T], values: list[Any]) -> list[T]:
    """`convert` of every value, computed once a distinct value (a history repeats its elapsed times, GPU counts and
    states: 100,000 records are a few hundred conversions)."""
    done = {value: convert(value) for value in set(values)}
    return [done[value] for value in values]


def marked(text: str, simulated: bool) -> str:
    return f"{text}*" if simulated and text != "-" else text


def util_cell(util: float | None, simulated: bool) -> str:
    return "-" if util is None else marked(f"{util:.0f}%", simulated)


def gpu_mem_cell(mib: int | None, simulated: bool) -> str:
    if mib is None:
        return "-"
    return marked(f"{mib / 1024:.1f}GiB" if mib >= 1024 else mem_text(int(mib)), simulated)


def util_text(r: Mapping[str, Any]) -> str:
    return util_cell(r.get("gpu_util_pct"), bool(r.get("simulated")))


def paired(convert: Callable[[Any, bool], str], key: str) -> ColumnCells:
    """A column of `convert(value, simulated)`."""
    return lambda c: each(lambda pair: convert(*pair), list(zip(c[key], c["simulated"], strict=True)))


def _optional(value: object) -> object:
    return "" if value is None else value


def column(key: str, convert: Callable[[Any], object] | None = None) -> ColumnCells:
    """A column of the API's field `key`, each value through `convert` (once a distinct value)."""
    if convert is None:
        return lambda c: c[key]
    return lambda c: each(convert, c[key])


def ids_text(ids: list[int]) -> str:
    return ",".join(map(str, ids))


#: name -> (header, the table's cells, the CSV's values, the API's keys for --json); cells and values a column at a
#: time, from the records' columns (`GET /v1/acct?layout=columns`)
FIELDS: dict[str, tuple[str, ColumnCells, ColumnCells, tuple[str, ...]]] = {
    "id": ("ID", column("id"), column("id"), ("id",)),
    "name": ("NAME", column("name", lambda n: n or "-"), column("name"), ("name",)),
    "user": ("USER", column("user"), column("user"), ("user",)),
    "uid": ("UID", column("uid"), column("uid"), ("uid",)),
    "queue": ("QUEUE", column("queue", lambda q: q or "-"), column("queue"), ("queue",)),
    "state": ("STATE", column("state", client.state_cell), column("state"), ("state",)),
    "exit": (
        "EXIT", column("exit_code", lambda x: "-" if x is None else x), column("exit_code", _optional),
        ("exit_code",),
    ),
    "submitted": ("SUBMITTED", column("submitted_at", clock), column("submitted_at", iso), ("submitted_at",)),
    "started": (
        "STARTED", column("started_at", clock), column("started_at", lambda t: _optional(iso(t))), ("started_at",)
    ),
    "ended": ("ENDED", column("ended_at", clock), column("ended_at", iso), ("ended_at",)),
    "elapsed": ("ELAPSED", column("elapsed_s", elapsed_text), column("elapsed_s"), ("elapsed_s",)),
    "gpus": ("GPUS", column("gpus", amount), column("gpus"), ("gpus",)),
    "gpu_ids": (
        "GPU_IDS", lambda c: [ids_text(ids) or "-" for ids in c["gpu_ids"]],
        lambda c: [ids_text(ids) for ids in c["gpu_ids"]], ("gpu_ids",),
    ),
    "cpus": ("CPUS", column("cpus", amount), column("cpus"), ("cpus",)),
    "gpu_hours": ("GPU_HOURS", column("gpu_hours", lambda h: f"{h:.2f}"), column("gpu_hours"), ("gpu_hours",)),
    "cpu_hours": ("CPU_HOURS", column("cpu_hours", lambda h: f"{h:.2f}"), column("cpu_hours"), ("cpu_hours",)),
    "gpu_util": (
        "GPU_UTIL", paired(util_cell, "gpu_util_pct"), column("gpu_util_pct", _optional),
        ("gpu_util_pct", "simulated"),
    ),
    "gpu_mem": (
        "GPU_MEM", paired(gpu_mem_cell, "gpu_mem_peak_mib"), column("gpu_mem_peak_mib", _optional),
        ("gpu_mem_peak_mib", "simulated"),
    ),
    "samples": ("SAMPLES", column("gpu_samples"), column("gpu_samples"), ("gpu_samples",)),
    "simulated": (
        "SIMULATED", column("simulated", lambda s: "yes" if s else "no"),
        column("simulated", lambda s: str(s).lower()), ("simulated",),
    ),
}  # fmt: skip
#: sacct's names for the same fields (its --format is case-insensitive, and so is this one).
ALIASES = {
    "jobid": "id", "jobname": "name", "partition": "queue", "exitcode": "exit", "submit": "submitted",
    "start": "started", "end": "ended", "ncpus": "cpus", "alloccpus": "cpus", "elapsedraw": "elapsed",
}  # fmt: skip
DEFAULT_FIELDS = "id,name,user,queue,state,exit,elapsed,gpus,gpu_hours,cpu_hours,gpu_util,gpu_mem"
SUMMARY_FIELDS = ("user", "queue", "jobs", "elapsed", "gpu_hours", "cpu_hours", "gpu_util")


def parse_fields(text: str) -> list[str]:
    """`--format`'s field list ("JobID,elapsed,gpu_util%10": a width, as sacct takes it, is ignored)."""
    names = [part.strip().lower().partition("%")[0] for part in text.split(",") if part.strip()]
    if not names:
        raise client.fail(f"--format: name at least one field: {', '.join(FIELDS)}")
    unknown = [n for n in names if n not in FIELDS and n not in ALIASES]
    if unknown:
        raise client.fail(
            f"--format: unknown field {', '.join(map(repr, unknown))}; the fields: {', '.join(FIELDS)} "
            f"(and sacct's {', '.join(ALIASES)})"
        )
    return [ALIASES.get(n, n) for n in names]


def window(since: str | None, until: str | None, now: float) -> tuple[float | None, float | None]:
    """(since, until) in seconds since the epoch; by default since midnight (sacct's default), until now."""
    from corral.model.errors import InvalidRequest
    from corral.model.times import parse_time

    try:
        start = parse_time(since, now, "--since") if since is not None else None
        end = parse_time(until, now, "--until") if until is not None else None
        if start is None and end is None:
            start = parse_time("today", now, "--since")
    except InvalidRequest as exc:
        raise client.fail(f"{exc.field}: {exc.message}") from None
    if start is not None and end is not None and start >= end:
        raise client.fail(f"--since ({clock(start)}) must be before --until ({clock(end)})")
    return start, end


class Pages:
    """The records the daemon lists for `params` (at most `limit`), a page at a time, column by column (a list per
    field of the API's records); `cut` once iterated: whether `limit` cut them.

    Once a page says there is another, the rest are fetched by a thread one page ahead, so that the daemon reads and
    sends the next page while this process draws the one it has (100,000 records: 10 pages)."""

    def __init__(self, socket: Path | None, params: list[tuple[str, Any]], limit: int | None) -> None:
        self.socket, self.params, self.limit = socket, params, limit
        self.cut = False

    def fetch(self, after: str | None, have: int) -> tuple[Records, str | None]:
        """One page (trimmed to `limit`) and the cursor after it (None: the last)."""
        limit = self.limit
        want = PAGE if limit is None else min(PAGE, limit + 1 - have)
        page_params = [*self.params, ("limit", want), ("layout", "columns")]
        if after is not None:
            page_params.append(("after", after))
        response = client.call(self.socket, "GET", "/v1/acct", errors, params=page_params)
        page = response.json()
        if isinstance(page, list):  # a daemon from before layout=columns: its rows
            page = {key: [r[key] for r in page] for key in page[0]} if page else {}
        if limit is not None and have + len(page.get("id", ())) > limit:
            self.cut = True
            return {key: values[: limit - have] for key, values in page.items()}, None
        return page, response.headers.get("X-Corral-Next-After") or None

    def __iter__(self) -> Iterator[Records]:
        page, after = self.fetch(None, 0)
        yield page
        if after is None:
            return
        import queue  # here: a command whose records fit one page (most) never needs them
        import threading

        ahead: queue.Queue[tuple[Records, str | None] | BaseException] = queue.Queue(maxsize=1)

        def read_ahead(after: str | None, have: int) -> None:
            try:
                while after is not None:
                    page, after = self.fetch(after, have)
                    have += len(page.get("id", ()))
                    ahead.put((page, after))
            except BaseException as exc:  # a failed request exits (SystemExit): in the main thread, not this one
                ahead.put(exc)

        threading.Thread(target=read_ahead, args=(after, len(page.get("id", ()))), daemon=True).start()
        while after is not None:
            got = ahead.get()
            if isinstance(got, BaseException):
                raise got
            page, after = got
            yield page


def errors(response: Response) -> str:
    return client.error_text(response, FLAGS)


def write_csv(header: list[str], lines: Iterable[Sequence[object]]) -> None:
    import csv

    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(lines)


def json_rows(columns: Records, keys: list[str] | None) -> list[dict[str, Any]]:
    """The API's records for --json, its times as ISO 8601; only `keys` when --format chose fields."""
    chosen = [k for k in columns if keys is None or k in keys]
    values = [
        [iso(t) for t in columns[k]] if k in ("submitted_at", "started_at", "ended_at") else columns[k] for k in chosen
    ]
    return [dict(zip(chosen, record, strict=True)) for record in zip(*values, strict=True)]


def cell_text(cell: object) -> str:
    """What `Columns` prints of a cell when piped without colour: a `Styled` cell's text, anything else literal."""
    if type(cell) is str and cell.isprintable():
        return cell
    return cell.text if isinstance(cell, Styled) else escaped(cell)


def plain_table(headers: list[str], cells: list[list[object]]) -> str:
    """The table `Terminal.print(Columns)` draws when piped without colour (no style, no cut), the same text to the
    character, drawn a column at a time: 100,000 records in a fraction of the time of a `Columns` row by row.
    `cells` is a list of columns, each a cell a record, as `row` takes them (a `Styled` cell: its text)."""
    return plain_lines(headers, [each(cell_text, column_cells) for column_cells in cells])


def plain_lines(headers: list[str], texts: list[list[str]]) -> str:
    """`plain_table` of cells already made text (`cell_text`)."""
    columns = [[header, *column] for header, column in zip(headers, texts, strict=True)]
    gap = Columns.GAP
    if all("".join(column).isascii() for column in columns):  # a character a cell: printf's padding
        widest = [max(map(len, column)) for column in columns]
        form = gap.join([*(f"%-{w}s" for w in widest[:-1]), "%s"])
        return "\n".join([(form % line).rstrip() for line in zip(*columns, strict=True)]) + "\n"
    padded: list[list[str]] = []
    for column in columns:
        widths = [width(t) for t in column]
        most = max(widths)
        padded.append([t + " " * (most - w) for t, w in zip(column, widths, strict=True)])
    padded[-1] = columns[-1]
    return "".join(gap.join(line).rstrip() + "\n" for line in zip(*padded, strict=True))


@click.command("acct")
@click.option(
    "--since", "--starttime", "-S", default=None,
    help="Jobs that ended at or after: 2026-11-01, 2026-11-01T10:00, now-7d, 7d (ago), today (default: midnight).",
)  # fmt: skip
@click.option("--until", "--endtime", "-E", default=None, help="Jobs that ended before this time (default: now).")
@click.option("--user", "-u", default=None, help="Root or an admin: this user's jobs (others see only their own).")
@click.option(
    "--state", "-s", multiple=True,
    help="Only jobs that ended so: succeeded, failed, cancelled, lost (repeatable or comma-separated).",
)  # fmt: skip
@click.option("--queue", "--partition", "-r", default=None, help="Only jobs of this queue.")
@click.option(
    "--format", "-o", "fields", default=None,
    help=f"The fields, comma-separated (default {DEFAULT_FIELDS}; sacct's names too).",
)  # fmt: skip
@click.option("--summary", is_flag=True, help="Per user and queue: jobs, elapsed, GPU-hours, CPU-hours, mean GPU use.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many jobs (default: all).")
@click.option("--csv", "as_csv", is_flag=True, help="Print as CSV (the fields chosen, a header line first).")
@client.json_option
@client.socket_option
def acct_cmd(
    since: str | None,
    until: str | None,
    user: str | None,
    state: tuple[str, ...],
    queue: str | None,
    fields: str | None,
    summary: bool,
    limit: int | None,
    as_csv: bool,
    as_json: bool,
    socket: Path | None,
) -> None:
    """Jobs that ended: elapsed, state, exit code, queue, GPUs, GPU and CPU hours, GPU use (as sacct).

    Your jobs (root and the queues file's admins: everyone's, or --user's) that ended since midnight unless --since
    or --until says otherwise. GPU_UTIL is the mean utilisation of the job's GPUs over the daemon's samples (of the
    whole GPU, for a share), GPU_MEM the most GPU memory its processes held; `*` marks simulated GPUs' made-up
    figures. Every job that matches is listed (--limit N: at most N)."""
    if as_json and as_csv:
        raise client.fail("--json and --csv: choose one")
    if summary and fields is not None:
        raise client.fail(f"--format: --summary has its own columns ({', '.join(SUMMARY_FIELDS)})")
    if summary and limit is not None:
        raise client.fail("--limit: --summary sums every job that matches")
    chosen = parse_fields(fields if fields is not None else DEFAULT_FIELDS)
    start, end = window(since, until, time.time())
    params: list[tuple[str, Any]] = [("state", s) for s in state]
    for key, value in (("since", start), ("until", end), ("user", user), ("queue", queue)):
        if value is not None:
            params.append((key, value))
    if summary:
        show_summary(client.call(socket, "GET", "/v1/acct/summary", errors, params=params).json(), as_json, as_csv)
        return
    found = Pages(socket, params, limit)
    headers = [FIELDS[f][0] for f in chosen]
    piped = not (as_json or as_csv or client.out.isatty() or client.out.color())
    texts: list[list[str]] = [[] for _ in chosen]
    simulated = False
    columns: Records = {}
    for page in found:
        if not page:
            continue
        if piped:  # the common case for 100,000 records: each page made text while the next one comes
            simulated = simulated or any(page["simulated"])
            for f, column in zip(chosen, texts, strict=True):
                column.extend(each(cell_text, FIELDS[f][1](page)))
            continue
        for key, values in page.items():
            columns.setdefault(key, []).extend(values)
    if not columns:
        columns = {key: [] for f in FIELDS.values() for key in f[3]}
    if found.cut:  # on stderr, so that --json and --csv stay one document
        say(client.err, f"more jobs not shown (--limit {limit}): narrow --since/--until, or a larger --limit")
    if as_json:
        keys = None if fields is None else [k for f in chosen for k in FIELDS[f][3]]
        client.dump(json_rows(columns, keys))
        return
    if as_csv:
        shown = [*chosen, *(["simulated"] if {"gpu_util", "gpu_mem"} & set(chosen) - {"simulated"} else [])]
        shown = list(dict.fromkeys(shown))
        write_csv(shown, zip(*(FIELDS[f][2](columns) for f in shown), strict=True))
        return
    if piped:
        client.out.write_text(plain_lines(headers, texts))
    else:  # cut to the terminal, or styled: drawn row by row
        simulated = any(columns["simulated"])
        view = table(*headers)
        for record in zip(*(FIELDS[f][1](columns) for f in chosen), strict=True):
            row(view, *record)
        client.out.print(view)
    if simulated and {"gpu_util", "gpu_mem"} & set(chosen):
        say(client.err, SIMULATED_NOTE)


def show_summary(rows: list[dict[str, Any]], as_json: bool, as_csv: bool) -> None:
    if as_json:
        client.dump(rows)
        return
    if as_csv:
        write_csv(
            [*SUMMARY_FIELDS, "simulated"],
            [
                [s["user"], s["queue"], s["jobs"], s["elapsed_s"], s["gpu_hours"], s["cpu_hours"],
                 _optional(s["gpu_util_pct"]), str(s["simulated"]).lower()]
                for s in rows
            ],
        )  # fmt: skip
        return
    view = table("USER", "QUEUE", "JOBS", "ELAPSED", "GPU_HOURS", "CPU_HOURS", "GPU_UTIL")
    for s in rows:
        row(
            view, s["user"], s["queue"] or "-", s["jobs"], elapsed_text(s["elapsed_s"]), f"{s['gpu_hours']:.2f}",
            f"{s['cpu_hours']:.2f}", util_text(s),
        )  # fmt: skip
    client.out.print(view)
    if any(s.get("simulated") for s in rows):
        say(client.err, SIMULATED_NOTE)
