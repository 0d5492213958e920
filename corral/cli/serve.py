"""`corral serve`: the daemon (written with Typer: it loads the daemon, FastAPI and uvicorn anyway, so the start-up
cost of Typer's parameter parsing does not matter here, unlike in corral.cli.client)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from corral.cli.client import fail, serve_locations


def serve_cmd(
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            help="Jobs, tokens, logs, private to the daemon's user (default: $CORRAL_STATE_DIR, else /var/lib/corral "
            "for root, ~/.local/state/corral for a user).",
        ),
    ] = None,
    socket: Annotated[
        Path | None,
        typer.Option(
            "--socket", help="Socket (default: $CORRAL_SOCKET, else RUNTIME_DIR/corral.sock, else STATE_DIR's)."
        ),
    ] = None,
    runtime_dir: Annotated[
        Path | None,
        typer.Option(
            "--runtime-dir",
            help="Folder of the socket, reachable by other users (default: $CORRAL_RUNTIME_DIR, else /run/corral for "
            "root; a user's daemon keeps its socket in its state directory).",
        ),
    ] = None,
    simulate_gpus: Annotated[
        str | None, typer.Option("--simulate-gpus", help="Simulated GPUs instead of this machine's, e.g. 2xA100-80GB.")
    ] = None,
    policy: Annotated[str, typer.Option(help="Placement policy (see `corral policies`).")] = "binpack",
    sharing: Annotated[
        str,
        typer.Option(
            help="mps: a share of one GPU is enforced with MPS where available (one user per GPU at a time); "
            "time-slicing: shares of different users share GPUs without MPS."
        ),
    ] = "mps",
    gpu_memory_watchdog: Annotated[
        str, typer.Option(help="A job over its GPU memory grant where MPS does not cap it: off, warn or kill.")
    ] = "kill",
    gpu_behavior: Annotated[
        str,
        typer.Option(
            "--behavior",
            help="Work without GPUs on this GPU machine: preferential (keeps each free GPU's CPU/memory reserve), "
            "restricted (waits while a GPU is free: DeclinedScarceResources), unrestricted, undefined (warns).",
        ),
    ] = "preferential",
    # the spelling that shipped first; `--behavior` is what place, sim and k8s call it
    gpu_behavior_old: Annotated[str | None, typer.Option("--gpu-behavior", hidden=True)] = None,
    service_ports: Annotated[
        str | None,
        typer.Option(envvar="CORRAL_SERVICE_PORTS", help="Ports for services' $PORT0...: LOW-HIGH (31000-32000)."),
    ] = None,
    listen: Annotated[
        str | None,
        typer.Option(help="Also serve over TCP at [HOST:]PORT (127.0.0.1 unless a host is given), with bearer tokens."),
    ] = None,
    container_runtime: Annotated[
        str | None,
        typer.Option(help="docker or podman: runs job definitions that name a container image (default: none)."),
    ] = None,
    default_time_limit: Annotated[
        str,
        typer.Option(
            help="How long a job without a time limit is expected to run (e.g. 90m, 2h), when the head of the queue's "
            "reservation is planned for backfill. Not enforced: such jobs are not stopped.",
        ),
    ] = "1h",
    reports: Annotated[
        Path | None,
        typer.Option(help="A folder of `corral sim` reports to show on the dashboard (/ui/, docs/dashboard.md)."),
    ] = None,
    preempt_grace: Annotated[
        str,
        typer.Option(
            help="Grace between the SIGTERM and the SIGKILL of a preempted job (e.g. 30, 2m); it then goes back to "
            "the queue. See docs/preemption.md.",
        ),
    ] = "30",
    queues: Annotated[
        Path | None,
        typer.Option(
            "--queues",
            help="Queues, limits and fair share (TOML, docs/queues.md; default: STATE_DIR/queues.toml if it exists, "
            "else one queue, first come first served). SIGHUP or `corral queue reload` reads it again.",
        ),
    ] = None,
    acct_retention: Annotated[
        str,
        typer.Option(
            help="How long jobs that ended are kept, with their accounting (corral acct; e.g. 30d, 365d), or "
            "never to keep them all. Older ones are deleted in small batches, hourly.",
        ),
    ] = "90d",
) -> None:
    """Run the corral daemon on this machine until SIGTERM or Ctrl-C."""
    from corral.daemon.server import ServeError, serve
    from corral.model.errors import InvalidRequest
    from corral.model.units import parse_duration_seconds
    from corral.store import StoreError
    from corral.store.retention import parse_retention

    try:
        default_time_limit_s = parse_duration_seconds(default_time_limit, "--default-time-limit")
        if not default_time_limit_s > 0:
            raise InvalidRequest("--default-time-limit", f"must be more than 0 seconds, got {default_time_limit!r}")
        preempt_grace_s = parse_duration_seconds(preempt_grace, "--preempt-grace")
        if not preempt_grace_s >= 0:
            raise InvalidRequest("--preempt-grace", f"must be 0 seconds or more, got {preempt_grace!r}")
        retention_s = parse_retention(acct_retention)
    except InvalidRequest as exc:
        raise fail(str(exc)) from None
    state, sock = serve_locations(state_dir, socket, runtime_dir, root=os.geteuid() == 0)
    try:
        serve(
            state, sock, simulate_gpus, policy, watchdog=gpu_memory_watchdog, sharing=sharing, listen=listen,
            gpu_behavior=gpu_behavior_old or gpu_behavior, service_ports=service_ports,
            container_runtime=container_runtime, default_time_limit_s=default_time_limit_s, reports=reports,
            preempt_grace_s=preempt_grace_s, queues_file=queues, exit_process=True, retention_s=retention_s,
        )  # fmt: skip
    except (ServeError, InvalidRequest, StoreError, OSError) as exc:
        raise fail(str(exc)) from None
