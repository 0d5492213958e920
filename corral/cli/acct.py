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

import csv
import sys
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from corral.cli import client
from corral.cli.render import row, say, table
from corral.cli.transport import Response
from corral.cli.views import iso, mem_text

#: `corral acct` asks the daemon for this many records a request (its most), and for as many pages as it takes.
PAGE = 10000
#: A field's header, its text in a table and its value in CSV, from one record of `GET /v1/acct`.
Cell = Callable[[Mapping[str, Any]], object]
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


def marked(text: str, r: Mapping[str, Any]) -> str:
    return f"{text}*" if r.get("simulated") and text != "-" else text


def util_text(r: Mapping[str, Any]) -> str:
    util = r.get("gpu_util_pct")
    return "-" if util is None else marked(f"{util:.0f}%", r)


def gpu_mem_text(r: Mapping[str, Any]) -> str:
    mib = r.get("gpu_mem_peak_mib")
    if mib is None:
        return "-"
    return marked(f"{mib / 1024:.1f}GiB" if mib >= 1024 else mem_text(int(mib)), r)


def _optional(value: object) -> object:
    return "" if value is None else value


#: name -> (header, table cell, CSV value, the API's keys for --json)
FIELDS: dict[str, tuple[str, Cell, Cell, tuple[str, ...]]] = {
    "id": ("ID", lambda r: r["id"], lambda r: r["id"], ("id",)),
    "name": ("NAME", lambda r: r["name"] or "-", lambda r: r["name"], ("name",)),
    "user": ("USER", lambda r: r["user"], lambda r: r["user"], ("user",)),
    "uid": ("UID", lambda r: r["uid"], lambda r: r["uid"], ("uid",)),
    "queue": ("QUEUE", lambda r: r["queue"] or "-", lambda r: r["queue"], ("queue",)),
    "state": ("STATE", lambda r: client.state_cell(r["state"]), lambda r: r["state"], ("state",)),
    "exit": (
        "EXIT", lambda r: "-" if r["exit_code"] is None else r["exit_code"], lambda r: _optional(r["exit_code"]),
        ("exit_code",),
    ),
    "submitted": (
        "SUBMITTED", lambda r: clock(r["submitted_at"]), lambda r: iso(r["submitted_at"]), ("submitted_at",)
    ),
    "started": (
        "STARTED", lambda r: clock(r["started_at"]), lambda r: _optional(iso(r["started_at"])), ("started_at",)
    ),
    "ended": ("ENDED", lambda r: clock(r["ended_at"]), lambda r: iso(r["ended_at"]), ("ended_at",)),
    "elapsed": ("ELAPSED", lambda r: elapsed_text(r["elapsed_s"]), lambda r: r["elapsed_s"], ("elapsed_s",)),
    "gpus": ("GPUS", lambda r: amount(r["gpus"]), lambda r: r["gpus"], ("gpus",)),
    "gpu_ids": (
        "GPU_IDS", lambda r: ",".join(map(str, r["gpu_ids"])) or "-", lambda r: ",".join(map(str, r["gpu_ids"])),
        ("gpu_ids",),
    ),
    "cpus": ("CPUS", lambda r: amount(r["cpus"]), lambda r: r["cpus"], ("cpus",)),
    "gpu_hours": ("GPU_HOURS", lambda r: f"{r['gpu_hours']:.2f}", lambda r: r["gpu_hours"], ("gpu_hours",)),
    "cpu_hours": ("CPU_HOURS", lambda r: f"{r['cpu_hours']:.2f}", lambda r: r["cpu_hours"], ("cpu_hours",)),
    "gpu_util": ("GPU_UTIL", util_text, lambda r: _optional(r["gpu_util_pct"]), ("gpu_util_pct", "simulated")),
    "gpu_mem": ("GPU_MEM", gpu_mem_text, lambda r: _optional(r["gpu_mem_peak_mib"]), ("gpu_mem_peak_mib", "simulated")),
    "samples": ("SAMPLES", lambda r: r["gpu_samples"], lambda r: r["gpu_samples"], ("gpu_samples",)),
    "simulated": (
        "SIMULATED", lambda r: "yes" if r["simulated"] else "no", lambda r: str(r["simulated"]).lower(),
        ("simulated",),
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


def pages(socket: Path | None, params: list[tuple[str, Any]], limit: int | None) -> tuple[list[dict[str, Any]], bool]:
    """Every record the daemon lists for `params` (at most `limit`), page after page; and whether `limit` cut it."""
    rows: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        want = PAGE if limit is None else min(PAGE, limit + 1 - len(rows))
        page_params = [*params, ("limit", want)] + ([("after", after)] if after is not None else [])
        response = client.call(socket, "GET", "/v1/acct", errors, params=page_params)
        rows.extend(response.json())
        if limit is not None and len(rows) > limit:
            del rows[limit:]
            return rows, True
        after = response.headers.get("X-Corral-Next-After")
        if not after:
            return rows, False


def errors(response: Response) -> str:
    return client.error_text(response, FLAGS)


def write_csv(header: list[str], lines: list[list[object]]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(lines)


def json_rows(rows: list[dict[str, Any]], keys: list[str] | None) -> list[dict[str, Any]]:
    """The API's records for --json, its times as ISO 8601; only `keys` when --format chose fields."""
    out = []
    for r in rows:
        d = {k: v for k, v in r.items() if keys is None or k in keys}
        for k in ("submitted_at", "started_at", "ended_at"):
            if k in d:
                d[k] = iso(d[k])
        out.append(d)
    return out


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
    rows, cut = pages(socket, params, limit)
    if cut:  # on stderr, so that --json and --csv stay one document
        say(client.err, f"more jobs not shown (--limit {limit}): narrow --since/--until, or a larger --limit")
    if as_json:
        keys = None if fields is None else [k for f in chosen for k in FIELDS[f][3]]
        client.dump(json_rows(rows, keys))
        return
    if as_csv:
        columns = [*chosen, *(["simulated"] if {"gpu_util", "gpu_mem"} & set(chosen) - {"simulated"} else [])]
        columns = list(dict.fromkeys(columns))
        write_csv(columns, [[FIELDS[f][2](r) for f in columns] for r in rows])
        return
    view = table(*(FIELDS[f][0] for f in chosen))
    for r in rows:
        row(view, *(FIELDS[f][1](r) for f in chosen))
    client.out.print(view)
    if any(r.get("simulated") for r in rows) and {"gpu_util", "gpu_mem"} & set(chosen):
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
