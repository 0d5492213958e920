"""`corral job ...`: named job definitions (Metronome or Chronos JSON) kept by `corral serve`.

corral job create -f job.json      a Metronome job ({"id", "run": {...}}) or a Chronos job ({"name", "command"})
corral job list [--json]           your definitions: schedule, next run, last outcome
corral job show NAME [--json]      one definition, as its source system shows it, with its runs
corral job run NAME                run it now; prints the run id and its corral job
corral job runs NAME [--json]      its runs (active and recent), with the corral jobs that ran them
corral job delete NAME [--stop-runs]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from corral.cli.client import call, dump, json_option, out, read_document, socket_option
from corral.cli.render import row, say, table


@click.group("job", no_args_is_help=True)
def job_app() -> None:
    """Named job definitions (Metronome or Chronos JSON) and their runs."""


def _when(value: str | None) -> str:
    return "-" if not value else value.replace("T", " ").replace(".000Z", "Z")


def _schedule_text(d: dict[str, Any]) -> str:
    parts = []
    for s in d["schedules"]:
        zone = f" {s['timezone']}" if s["timezone"] and s["timezone"] != "UTC" else ""
        off = "" if s["enabled"] else " (disabled)"
        parts.append(f"{s['expression']}{zone}{off}")
    if d["parents"]:
        parts.append("after " + ", ".join(d["parents"]))
    return "; ".join(parts) or "-"


@job_app.command("create")
@click.option(
    "--file", "-f", "file", type=click.Path(path_type=Path), required=True,
    help="The job's JSON (Metronome or Chronos); - for stdin.",
)  # fmt: skip
@json_option
@socket_option
def create_cmd(file: Path, as_json: bool, socket: Path | None) -> None:
    """Create a job definition from Metronome or Chronos JSON (which one is detected)."""
    created = call(socket, "POST", "/v1/definitions", json=read_document(file)).json()
    if as_json:
        dump(created)
        return
    nxt = f"; next run {_when(created['next_run_at'])}" if created["next_run_at"] else ""
    say(out, f"job {created['name']} created ({created['source']}){nxt}")


@job_app.command("list")
@json_option
@socket_option
def list_cmd(as_json: bool, socket: Path | None) -> None:
    """Your job definitions (root: everyone's)."""
    rows = call(socket, "GET", "/v1/definitions").json()
    if as_json:
        dump(rows)
        return
    view = table("NAME", "SOURCE", "USER", "SCHEDULE", "NEXT RUN", "ACTIVE", "LAST", "OK/FAILED")
    for d in rows:
        row(
            view, d["name"], d["source"], d["user"], _schedule_text(d), _when(d["next_run_at"]), str(d["active_runs"]),
            d["last_status"] or "-", f"{d['success_count']}/{d['failure_count']}",
        )  # fmt: skip
    out.print(view)


@job_app.command("show")
@click.argument("name")
@json_option
@socket_option
def show_cmd(name: str, as_json: bool, socket: Path | None) -> None:
    """One job definition with its runs."""
    d = call(socket, "GET", f"/v1/definitions/{name}").json()
    if as_json:
        dump(d)
        return
    for key in ("name", "source", "user", "description", "command", "image", "cpus", "memory_mib", "gpus"):
        value = d[key]
        text = " ".join(value) if isinstance(value, list) else ("-" if value in (None, "") else value)
        say(out, f"{key:>13}: ", text)
    say(out, f"{'schedule':>13}: ", _schedule_text(d))
    say(out, f"{'next run':>13}: ", _when(d["next_run_at"]))
    say(out, f"{'runs':>13}: {d['success_count']} succeeded, {d['failure_count']} failed")
    for r in d["runs"][-10:]:
        tasks = ",".join(t["id"] for t in r["tasks"]) or "-"
        say(out, f"{'':>13}  {r['id']} {r['status']:<8} {r['trigger']:<10} jobs {tasks}")


@job_app.command("run")
@click.argument("name")
@json_option
@socket_option
def run_cmd(name: str, as_json: bool, socket: Path | None) -> None:
    """Run a job definition now (whatever its schedule says)."""
    run = call(socket, "POST", f"/v1/definitions/{name}/runs").json()
    if as_json:
        dump(run)
        return
    tasks = ",".join(t["id"] for t in run["tasks"])
    sys.stdout.write(f"{run['id']}\n")
    say(out, f"run {run['id']} of {name}: {run['status']}" + (f" (corral job {tasks})" if tasks else ""))


@job_app.command("runs")
@click.argument("name")
@json_option
@socket_option
def runs_cmd(name: str, as_json: bool, socket: Path | None) -> None:
    """A job definition's runs, oldest first, with the corral jobs that ran them (`corral logs ID`)."""
    runs = call(socket, "GET", f"/v1/definitions/{name}/runs").json()
    if as_json:
        dump(runs)
        return
    view = table("RUN", "STATUS", "TRIGGER", "CREATED", "COMPLETED", "JOBS", "REASON")
    for r in runs:
        row(
            view, r["id"], r["status"], r["trigger"], _when(r["createdAt"]), _when(r["completedAt"]),
            ",".join(t["id"] for t in r["tasks"]) or "-", r["reason"],
        )  # fmt: skip
    out.print(view)


@job_app.command("delete")
@click.argument("name")
@click.option("--stop-runs", is_flag=True, help="Stop its active runs too.")
@socket_option
def delete_cmd(name: str, stop_runs: bool, socket: Path | None) -> None:
    """Delete a job definition (refused while it has active runs, unless --stop-runs)."""
    call(socket, "DELETE", f"/v1/definitions/{name}", params={"stop_runs": str(stop_runs).lower()})
    say(out, f"job {name} deleted")
