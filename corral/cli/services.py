"""`corral app ...`: Marathon apps on corral serve (the daemon's /marathon/v2/apps).

corral app create -f app.json     the app's id
corral app list [--json]          each app: instances running/wanted, healthy, waiting reason
corral app show ID [--json]       the app and its instances: state, ports, GPUs, health
corral app scale ID N | restart ID | delete ID
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click

from corral.cli.client import call, dump, error_text, fail, json_option, out, read_document, socket_option
from corral.cli.render import row, say, table
from corral.cli.transport import Response


@click.group("app", no_args_is_help=True)
def app() -> None:
    """Services (Marathon apps): keep instances running."""


def _path(app_id: str) -> str:
    return "/marathon/v2/apps/" + quote(app_id.strip("/"), safe="/")


def marathon_error(response: Response) -> str:
    """Marathon's error bodies in one line: the message, and each invalid field with its errors."""
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text.strip()[:200]}"
    if not isinstance(body, dict) or "message" not in body:
        return f"HTTP {response.status_code}: {body}"
    details = body.get("details") or []
    parts = [f"{d.get('path', '/')}: {'; '.join(d.get('errors', []))}" for d in details if isinstance(d, dict)]
    return f"{body['message']}" + (f" ({', '.join(parts)})" if parts else "")


def _request(socket: Path | None, method: str, url: str, **kwargs: Any) -> Any:
    """One request to the daemon through `corral.cli.client.call`, with Marathon's error bodies read as such."""

    def describe(response: Response) -> str:
        return error_text(response) if '"detail"' in response.text[:20] else marathon_error(response)

    response = call(socket, method, url, describe, **kwargs)
    return response.json() if response.content else None


@app.command("create")
@click.option(
    "--file", "-f", "file", type=click.Path(path_type=Path), required=True,
    help="The app's JSON (Marathon format); - reads stdin.",
)  # fmt: skip
@json_option
@socket_option
def create_cmd(file: Path, as_json: bool, socket: Path | None) -> None:
    """Create an app from Marathon app JSON; prints its id (with --json, the app as Marathon answers it)."""
    created = _request(socket, "POST", "/marathon/v2/apps", json=read_document(file))
    if as_json:
        dump(created)
        return
    sys.stdout.write(f"{created['id']}\n")


@app.command("list")
@json_option
@socket_option
def list_cmd(as_json: bool, socket: Path | None) -> None:
    """Your apps (root: everyone's)."""
    # corral=true: the owner, the waiting reason and each task's job and GPUs (not in Marathon's own shape)
    apps = _request(socket, "GET", "/marathon/v2/apps", params={"corral": "true"})["apps"]
    if as_json:
        dump(apps)
        return
    view = table("ID", "INSTANCES", "HEALTHY", "GPUS", "USER", "WAITING")
    for a in apps:
        checks = "-" if not a.get("healthChecks") else str(a["tasksHealthy"])
        row(
            view, a["id"], f"{a['tasksRunning']}/{a['instances']}", checks, str(a["gpus"]), a["corral"]["user"],
            a["corral"]["waiting"] or "-",
        )  # fmt: skip
    out.print(view)


@app.command("show")
@click.argument("app_id")
@json_option
@socket_option
def show_cmd(app_id: str, as_json: bool, socket: Path | None) -> None:
    """One app: its instances with their state, ports, GPUs and health."""
    data = _request(socket, "GET", _path(app_id), params={"corral": "true"})["app"]
    if as_json:
        dump(data)
        return
    delay = data["corral"]["launchDelaySeconds"]
    lines = [
        ("id", data["id"]),
        ("command", data.get("cmd") or " ".join(data.get("args") or []) or "(the image's)"),
        ("instances", f"{data['tasksRunning']} running of {data['instances']}, {data['tasksStaged']} staged"),
        ("resources", f"cpus {data['cpus']:g}, mem {data['mem']:g} MiB, gpus {data['gpus']}"),
        ("version", data["version"]),
        ("waiting", data["corral"]["waiting"] or "-"),
        ("launch delay", f"{delay:g} s" if delay else "-"),
    ]
    failure = data.get("lastTaskFailure")
    if failure:
        lines.append(("last failure", f"{failure['taskId']} {failure['state']}: {failure['message']}"))
    for key, value in lines:
        say(out, f"{key:>13}: ", value)
    view = table("INSTANCE", "JOB", "STATE", "PORTS", "GPUS", "HEALTH", "STARTED")
    for t in data.get("tasks", []):
        results = t["healthCheckResults"]
        if not data.get("healthChecks"):
            health = "-"
        elif not results or any(r["lastSuccess"] is None and r["lastFailure"] is None for r in results):
            health = "unknown"
        elif all(r["alive"] for r in results):
            health = "healthy"
        else:
            health = "unhealthy: " + "; ".join(r["lastFailureCause"] or "" for r in results if not r["alive"])
        gpus = ",".join(f"{g['index']} ({g['model']})" for g in t["corral"]["gpus"]) or "-"
        row(
            view, t["id"], t["corral"]["job"], t["state"], ",".join(map(str, t["ports"])) or "-", gpus, health,
            t["startedAt"] or "-",
        )  # fmt: skip
    out.print(view)


@app.command("scale")
@click.argument("app_id")
@click.argument("instances", type=int)
@socket_option
def scale_cmd(app_id: str, instances: int, socket: Path | None) -> None:
    """Keep N instances running (killSelection picks whom a scale-down stops)."""
    if instances < 0:
        raise fail(f"instances must be >= 0, got {instances}")
    _request(socket, "PUT", _path(app_id), json={"instances": instances})
    say(out, f"app /{app_id.strip('/')}: scaling to {instances} instance(s)")


@app.command("restart")
@click.argument("app_id")
@socket_option
def restart_cmd(app_id: str, socket: Path | None) -> None:
    """Replace every instance (within the app's upgrade strategy)."""
    _request(socket, "POST", _path(app_id) + "/restart")
    say(out, f"app /{app_id.strip('/')}: restarting")


@app.command("delete")
@click.argument("app_id")
@socket_option
def delete_cmd(app_id: str, socket: Path | None) -> None:
    """Delete the app and stop its instances."""
    _request(socket, "DELETE", _path(app_id))
    say(out, f"app /{app_id.strip('/')}: deleted")
