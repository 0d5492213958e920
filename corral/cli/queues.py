"""`corral queue`: queues, fair share and priority factors, as the daemon reports them (docs/queues.md).

    corral queue list            each queue: weight, guarantee, limit, in use, borrowing, pending, running
    corral queue show [NAME]     sshare: each queue and user: weight, norm shares, decayed usage, dominant share,
                                 effective usage, fair-share factor; then sprio: your waiting jobs' factors
    corral queue reload          read the queues file again (root or an admin)

A thin client (tests/cli/test_startup.py): it formats what the daemon returns, and loads neither numpy nor the
fair-share code.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from corral.cli.client import call, dump, json_option, out, socket_option
from corral.cli.render import row, say, table

#: Decayed usage comes in resource-seconds; shown per hour, as sshare's GrpTRESRaw is read.
_HOUR = 3600.0


def amounts_text(d: Mapping[str, Any] | None) -> str:
    """A quota as the queues file writes it: "gpus=2 memory=64GiB" ("-" when unset)."""
    if not d:
        return "-"
    parts = []
    for key, value in d.items():
        if key in ("gpu_memory", "memory") and isinstance(value, int):
            parts.append(f"{key}={value / 1024:g}GiB" if value % 1024 == 0 else f"{key}={value}MiB")
        elif key == "cpus" and isinstance(value, int):
            parts.append(f"cpus={value / 1000:g}")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


def in_use_text(d: Mapping[str, Any] | None) -> str:
    """Holdings without the dimensions at zero ("-" for none)."""
    return amounts_text({k: v for k, v in (d or {}).items() if v})


def list_lines(data: Mapping[str, Any]) -> list[list[str]]:
    """The rows of `corral queue list`."""
    rows = []
    for q in data.get("queues", []):
        if q.get("missing"):
            rows.append([f"{q['name']} (removed)", "-", "-", "-", "-", "-", str(q.get("pending", 0)),
                         str(q.get("running", 0))])  # fmt: skip
            continue
        name = q["name"] + (" (default)" if q.get("default") else "")
        rows.append(
            [
                name,
                f"{q['weight']:g}",
                amounts_text(q.get("guarantee")),
                amounts_text(q.get("limit")),
                in_use_text(q.get("in_use")),
                in_use_text(q.get("borrowing")),
                str(q.get("pending", 0)),
                str(q.get("running", 0)),
            ]
        )
    return rows


def share_lines(data: Mapping[str, Any], queue: str | None = None) -> list[list[str]]:
    """The rows of `corral queue show`: sshare's columns, a queue's users indented under it."""
    rows = []
    for a in data.get("accounts", []):
        if queue is not None and a["queue"] != queue:
            continue
        usage = a.get("usage", {})
        name = a["queue"] if a.get("user") is None else f"  {a['user']}"
        rows.append(
            [
                name,
                f"{a['weight']:g}",
                f"{a['norm_shares']:.6f}",
                f"{usage.get('gpu_milli', 0.0) / 1000 / _HOUR:.2f}",
                f"{usage.get('cpu_milli', 0.0) / 1000 / _HOUR:.2f}",
                f"{a['dominant_share']:.6f}",
                f"{a['effective_usage']:.6f}",
                f"{a['fairshare_factor']:.6f}",
            ]
        )
    return rows


def priority_lines(jobs: list[Mapping[str, Any]], shares: Mapping[str, Any], now: float) -> list[list[str]]:
    """sprio's view of waiting jobs: priority, the fair-share factor of their account, age."""
    factor = {(a["queue"], a["user"]): a["fairshare_factor"] for a in shares.get("accounts", []) if a.get("user")}
    rows = []
    for j in jobs:
        f = factor.get((j.get("queue") or "", j["user"]))
        age = max(0.0, now - float(j["submitted_at"]))
        rows.append([j["id"], j.get("queue") or "-", j["user"], str(j["priority"]),
                     "1.000000" if f is None else f"{f:.6f}", f"{age:.0f}s"])  # fmt: skip
    return rows


@click.group("queue", no_args_is_help=True)
def queue_group() -> None:
    """Queues, fair share and priority factors (docs/queues.md)."""


@queue_group.command("list")
@json_option
@socket_option
def list_cmd(as_json: bool, socket: Path | None) -> None:
    """Each queue: weight, guarantee, limit, in use, borrowing, pending and running jobs."""
    data = call(socket, "GET", "/v1/queues").json()
    if as_json:
        dump(data)
        return
    view = table("QUEUE", "WEIGHT", "GUARANTEE", "LIMIT", "IN USE", "BORROWING", "PENDING", "RUNNING")
    for cells in list_lines(data):
        row(view, *cells)
    out.print(view)
    if not data.get("fair_share"):
        say(out, "no queues file: one queue, first come first served (see docs/queues.md)")


@queue_group.command("show")
@click.argument("name", required=False)
@json_option
@socket_option
def show_cmd(name: str | None, as_json: bool, socket: Path | None) -> None:
    """Fair share per queue and user (as Slurm's sshare), then your waiting jobs' priority factors (as sprio)."""
    if name is not None:
        call(socket, "GET", f"/v1/queues/{name}")  # an unknown queue: the daemon's 404, in words
    shares = call(socket, "GET", "/v1/shares").json()
    jobs = call(socket, "GET", "/v1/jobs", params={"state": "queued"}).json()
    if name is not None:
        jobs = [j for j in jobs if j.get("queue") == name]
    if as_json:
        dump({"shares": shares, "jobs": jobs})
        return
    headers = ("ACCOUNT", "WEIGHT", "NORM SHARES", "GPU-HOURS", "CPU-HOURS", "DOM SHARE", "EFFECTV USAGE", "FAIRSHARE")
    view = table(*headers)
    for cells in share_lines(shares, name):
        row(view, *cells)
    out.print(view)
    say(out, f"usage decays by half every {shares.get('half_life_s', 0) / 86400:g} days (decayed GPU and CPU hours)")
    if jobs:
        view = table("JOBID", "QUEUE", "USER", "PRIORITY", "FAIRSHARE", "AGE")
        for cells in priority_lines(jobs, shares, time.time()):
            row(view, *cells)
        out.print(view)


@queue_group.command("reload")
@socket_option
def reload_cmd(socket: Path | None) -> None:
    """Read the queues file again (root or an admin); a bad file is refused and the old configuration stays."""
    data = call(socket, "POST", "/v1/queues/reload").json()
    sys.stdout.write(f"queues reloaded from {data['source']}: {', '.join(data['queues'])}\n")
