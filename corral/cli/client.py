"""`corral serve` and the commands that talk to it, over its Unix socket or, with CORRAL_URL, over TCP.

corral serve --simulate-gpus 2xA100-80GB          run the daemon (socket: see serve_locations)
corral submit --gpus 1 -- python train.py        prints the job id
corral ps [--all] [--state S] [--user U] [--name N] [--since 2h] [--limit N] [--newest] [--after ID] [--json]
                                                 your jobs (root with --all: everyone's), 1000 at most per page
corral cancel ID... | --state queued | --name N  cancel one job, several, or all of yours that match
corral show ID | logs [-f] ID | explain ID | gpus
corral token create NAME | list | revoke ID      bearer tokens for TCP (over the Unix socket)

CORRAL_URL=http://host:8470 CORRAL_TOKEN=corral_...  talk to a daemon started with --listen instead of the socket.
"""

from __future__ import annotations

import json
import os
import socket as sock_module
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from corral.cli.render import error_line, row, say
from corral.jobs.environment import admitted_environment

EXIT_BAD_INPUT = 2
EXIT_SERVER = 1
#: Resends of a submission whose answer was lost (with backoff: about 6 s in all), enough for a daemon restart.
SUBMIT_RETRIES = 5

out = Console()
err = Console(stderr=True, soft_wrap=True)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    error_line(err, message)
    return typer.Exit(code)


#: A root daemon's defaults: the system's places for a service's state and for its socket (a shared machine).
SYSTEM_STATE_DIR = Path("/var/lib/corral")
SYSTEM_RUNTIME_DIR = Path("/run/corral")
SOCKET_NAME = "corral.sock"


def default_state_dir() -> Path:
    """A user's own daemon's state: $CORRAL_STATE_DIR, else ~/.local/state/corral."""
    env = os.environ.get("CORRAL_STATE_DIR")
    return Path(env) if env else Path.home() / ".local" / "state" / "corral"


def runtime_dir() -> Path:
    """Where a shared (root) daemon's socket is: $CORRAL_RUNTIME_DIR, else /run/corral."""
    env = os.environ.get("CORRAL_RUNTIME_DIR")
    return Path(env) if env else SYSTEM_RUNTIME_DIR


def serve_locations(state_dir: Path | None, socket: Path | None, runtime: Path | None, root: bool) -> tuple[Path, Path]:
    """(state directory, socket) of `corral serve`.

    state:  --state-dir, $CORRAL_STATE_DIR, then /var/lib/corral for root, ~/.local/state/corral for a user
    socket: --socket, $CORRAL_SOCKET, RUNTIME/corral.sock (--runtime-dir, $CORRAL_RUNTIME_DIR, /run/corral for root),
            then STATE/corral.sock for a user (a personal daemon: its socket stays in its private state directory)"""
    env_state = os.environ.get("CORRAL_STATE_DIR")
    if state_dir is not None:
        state = state_dir
    elif env_state:
        state = Path(env_state)
    else:
        state = SYSTEM_STATE_DIR if root else default_state_dir()
    if socket is not None:
        return state, socket
    if env_socket := os.environ.get("CORRAL_SOCKET"):
        return state, Path(env_socket)
    env_runtime = os.environ.get("CORRAL_RUNTIME_DIR")
    if runtime is None and env_runtime:
        runtime = Path(env_runtime)
    if runtime is None and root:
        runtime = SYSTEM_RUNTIME_DIR
    return state, (runtime if runtime is not None else state) / SOCKET_NAME


def _answers(path: Path) -> bool:
    probe = sock_module.socket(sock_module.AF_UNIX, sock_module.SOCK_STREAM)
    try:
        probe.settimeout(2)
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def locate_socket() -> tuple[Path, list[Path]]:
    """The daemon's socket, and every place looked at: $CORRAL_SOCKET if set; else your own daemon's
    (STATE_DIR/corral.sock) when one answers there, else a shared daemon's (RUNTIME_DIR/corral.sock)."""
    env = os.environ.get("CORRAL_SOCKET")
    if env:
        return Path(env), [Path(env)]
    personal, shared = default_state_dir() / SOCKET_NAME, runtime_dir() / SOCKET_NAME
    looked = [personal, shared]
    if personal.exists() and _answers(personal):
        return personal, looked
    if shared.exists():
        return shared, looked
    return personal, looked


def socket_for(socket_opt: Path | None) -> Path:
    return socket_opt if socket_opt is not None else locate_socket()[0]


SocketOpt = Annotated[
    Path | None,
    typer.Option(
        "--socket",
        help="Daemon socket (default: $CORRAL_SOCKET, else your own daemon's STATE_DIR/corral.sock if it runs, "
        "else the shared one, /run/corral/corral.sock or $CORRAL_RUNTIME_DIR/corral.sock).",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print as JSON.")]


def error_text(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        return f"HTTP {response.status_code}: {response.text.strip()[:200]}"
    if isinstance(detail, dict) and "message" in detail:
        return f"{detail.get('field', '')}: {detail['message']}"
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        first = detail[0]
        loc = [str(p) for p in first.get("loc", []) if p != "body"]
        return f"{'.'.join(loc) or 'request'}: {first.get('msg', 'invalid')}"
    return f"HTTP {response.status_code}: {detail}"


def call(
    socket_opt: Path | None,
    method: str,
    url: str,
    describe: Callable[[httpx.Response], str] | None = None,
    *,
    retries: int = 0,
    **kwargs: Any,
) -> httpx.Response:
    """One request to the daemon (CORRAL_URL if set, else its Unix socket); exits with a one-line error if it fails.

    `describe` words an error answer (default `error_text`, corral's own error bodies). `retries`: how often to send
    the request again when it went out but no answer came back (the connection broke, the daemon restarted), for
    requests that are safe to repeat (a submission with an Idempotency-Key)."""
    base = os.environ.get("CORRAL_URL", "").rstrip("/")
    token = os.environ.get("CORRAL_TOKEN", "")
    if base and socket_opt is None:
        where = base
        if not token:
            raise fail("CORRAL_URL is set but CORRAL_TOKEN is not: create one with `corral token create NAME`")
    else:
        path, looked = (socket_opt, [socket_opt]) if socket_opt is not None else locate_socket()
        where = " nor at ".join(str(p) for p in looked)

    def connect() -> httpx.Client:
        if base and socket_opt is None:
            return httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {token}"})
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://corral", timeout=30)

    attempt = 0
    while True:
        try:
            with connect() as client:
                response = client.request(method, url, **kwargs)
            break
        except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError):
            # Nothing was sent. The first time: no daemon. After a lost answer: it may be restarting, so try again.
            if attempt == 0 or attempt >= retries:
                raise fail(f"corral serve is not running at {where}") from None
        except httpx.TransportError as exc:  # sent, but the answer was lost
            if attempt >= retries:
                raise fail(f"talking to corral serve at {where}: {exc}", EXIT_SERVER) from None
        except httpx.HTTPError as exc:
            raise fail(f"talking to corral serve at {where}: {exc}", EXIT_SERVER) from None
        attempt += 1
        time.sleep(min(0.1 * 2**attempt, 2.0))
    if response.status_code >= 400:
        text = (describe or error_text)(response)
        raise fail(text, EXIT_BAD_INPUT if response.status_code < 500 else EXIT_SERVER)
    return response


def dump(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def gpus_text(job: dict[str, Any]) -> str:
    return ",".join(f"{g['index']}" + (f"({g['milli']}m)" if g["milli"] < 1000 else "") for g in job["gpus"]) or "-"


# ------------------------------------------------------------------------------------------------ commands
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
            help="Work without GPUs on this GPU machine: preferential (keeps each free GPU's CPU/memory reserve), "
            "restricted (waits while a GPU is free: DeclinedScarceResources), unrestricted, undefined (warns)."
        ),
    ] = "preferential",
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
) -> None:
    """Run the corral daemon on this machine until SIGTERM or Ctrl-C."""
    from corral.daemon.server import ServeError, serve
    from corral.model.errors import InvalidRequest
    from corral.store import StoreError

    state, sock = serve_locations(state_dir, socket, runtime_dir, root=os.geteuid() == 0)
    try:
        serve(
            state, sock, simulate_gpus, policy, watchdog=gpu_memory_watchdog, sharing=sharing, listen=listen,
            gpu_behavior=gpu_behavior, service_ports=service_ports,
            container_runtime=container_runtime,
        )  # fmt: skip
    except (ServeError, InvalidRequest, StoreError, OSError) as exc:
        raise fail(str(exc)) from None


def submit_cmd(
    command: Annotated[list[str], typer.Argument(help="The command and its arguments (after --).")],
    gpus: Annotated[int | None, typer.Option(help="Number of GPUs.")] = None,
    gpu_fraction: Annotated[float | None, typer.Option(help="Share of each GPU, e.g. 0.3.")] = None,
    gpu_memory: Annotated[str | None, typer.Option(help="GPU memory per GPU for a share, e.g. 10GiB.")] = None,
    cpus: Annotated[str, typer.Option(help="CPUs, e.g. 4 or 500m.")] = "1",
    memory: Annotated[str, typer.Option(help="Memory, e.g. 8GiB.")] = "1GiB",
    gpu_model: Annotated[list[str], typer.Option(help="Allowed GPU model (repeatable).")] = [],  # noqa: B006
    priority: Annotated[int, typer.Option(help="Priority (higher first).")] = 0,
    name: Annotated[str, typer.Option(help="A name for the job.")] = "",
    retries: Annotated[int, typer.Option(help="Retries after a failure.")] = 0,
    time_limit: Annotated[str | None, typer.Option(help="Time limit, e.g. 90, 45m, 2h.")] = None,
    socket: SocketOpt = None,
) -> None:
    """Submit a job; prints its id. The job runs in this directory with this environment."""
    body = {
        "command": command,
        "gpus": gpus,
        "gpu_fraction": gpu_fraction,
        "gpu_memory": gpu_memory,
        "cpus": cpus,
        "memory": memory,
        "gpu_model": gpu_model,
        "priority": priority,
        "name": name,
        "retries": retries,
        "time_limit": time_limit,
        # the rule of corral.jobs.environment: never corral's own variables (CORRAL_TOKEN), never the login's agents
        "env": admitted_environment(os.environ),
        "cwd": os.getcwd(),
    }
    # One key per submission: a retry after a lost answer gets the job the first attempt made, not a second one.
    key = {"Idempotency-Key": str(uuid.uuid4())}
    job = call(socket, "POST", "/v1/jobs", json=body, headers=key, retries=SUBMIT_RETRIES).json()
    sys.stdout.write(f"{job['id']}\n")


def since_time(value: str, now: float) -> float:
    """`--since`: a duration ago ("90", "45m", "2h") or a date and time ("2026-11-26", "2026-11-26T17:00")."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        pass
    from corral.model.errors import InvalidRequest
    from corral.model.units import parse_duration_seconds

    try:
        return now - parse_duration_seconds(value, "--since")
    except InvalidRequest as exc:
        raise fail(
            f"--since: give a duration ago (45m, 2h) or a date and time (2026-11-26T17:00): {exc.message}"
        ) from None


def ps_cmd(
    everyone: Annotated[bool, typer.Option("--all", help="Root: every user's jobs.")] = False,
    state: Annotated[list[str], typer.Option("--state", help="Only jobs in this state (repeatable).")] = [],  # noqa: B006
    user: Annotated[str | None, typer.Option("--user", help="Root: this user's jobs.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Only jobs with this name.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Submitted since: 45m, 2h (ago) or a date.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many (the daemon allows 10000).", min=1)] = 1000,
    newest: Annotated[bool, typer.Option("--newest", help="Newest first (default: oldest first).")] = False,
    after: Annotated[str | None, typer.Option("--after", help="The page after this job id (see the hint).")] = None,
    as_json: JsonOpt = False,
    socket: SocketOpt = None,
) -> None:
    """List your jobs (root with --all: everyone's), oldest first, 1000 at most: page on with --after."""
    params: list[tuple[str, str | int | float]] = [("limit", limit)] + [("state", s) for s in state]
    if everyone:
        params.append(("all", "true"))
    for key, value in (("user", user), ("name", name), ("after", after)):
        if value is not None:
            params.append((key, value))
    if since is not None:
        params.append(("since", since_time(since, time.time())))
    if newest:
        params.append(("order", "newest"))
    response = call(socket, "GET", "/v1/jobs", params=params)
    jobs = response.json()
    more = response.headers.get("X-Corral-Next-After")
    if more:  # on stderr, so that --json output stays one JSON document
        err.print(f"more jobs: corral ps ... --after {more}", highlight=False)
    if as_json:
        dump(jobs)
        return
    table = Table("ID", "NAME", "USER", "STATE", "GPUS", "COMMAND", "REASON")
    for j in jobs:
        row(table, j["id"], j["name"], j["user"], j["state"], gpus_text(j), " ".join(j["command"]), j["reason"])
    out.print(table)


def show_cmd(job_id: str, as_json: JsonOpt = False, socket: SocketOpt = None) -> None:
    """One job in full."""
    job = call(socket, "GET", f"/v1/jobs/{job_id}").json()
    if as_json:
        dump(job)
        return
    for key, value in job.items():
        text = gpus_text(job) if key == "gpus" else " ".join(value) if key == "command" else value
        say(out, f"{key:>13}: ", "" if text is None else text)


FINAL_STATES = {"succeeded", "failed", "cancelled", "lost"}


def logs_cmd(
    job_id: str,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing output until the job ends.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help='Print {"job", "state", "offset", "next_offset", "text"} (a line per chunk).')
    ] = False,
    interval: Annotated[float, typer.Option(help="Seconds between polls with --follow.", min=0.05)] = 0.5,
    socket: SocketOpt = None,
) -> None:
    """A job's output so far; with -f, until the job ends (Ctrl-C stops following, not the job)."""
    offset = 0
    try:
        while True:
            r = call(socket, "GET", f"/v1/jobs/{job_id}/logs", params={"offset": offset})
            start, offset = offset, int(r.headers.get("X-Corral-Next-Offset", offset + len(r.content)))
            state = r.headers.get("X-Corral-Job-State", "")
            if as_json:
                if r.content or not follow:
                    line = {"job": job_id, "state": state, "offset": start, "next_offset": offset}
                    sys.stdout.write(json.dumps({**line, "text": r.content.decode("utf-8", "replace")}) + "\n")
            else:
                sys.stdout.buffer.write(r.content)
            sys.stdout.flush()
            if r.content and follow:
                continue  # more may be waiting already (a chunk is at most 4 MiB)
            if not follow or state in FINAL_STATES:
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def cancel_cmd(
    job_ids: Annotated[list[str] | None, typer.Argument(help="Job ids.", show_default=False)] = None,
    state: Annotated[list[str], typer.Option("--state", help="Every job in this state (repeatable).")] = [],  # noqa: B006
    name: Annotated[str | None, typer.Option("--name", help="Every job with this name.")] = None,
    user: Annotated[str | None, typer.Option("--user", help="Root: that user's jobs (with --state/--name).")] = None,
    everyone: Annotated[bool, typer.Option("--all", help="Root: every user's jobs (with --state/--name).")] = False,
    socket: SocketOpt = None,
) -> None:
    """Cancel jobs: by id, or every job of yours in a state or with a name (a running one gets SIGTERM)."""
    ids = job_ids or []
    if len(ids) == 1 and not (state or name):
        job = call(socket, "POST", f"/v1/jobs/{ids[0]}/cancel").json()
        say(out, f"job {job['id']}: {job['state']} (", job["reason"], ")")
        return
    if not (ids or state or name):
        raise fail("say which jobs to cancel: job ids, --state or --name")
    body: dict[str, object] = {"ids": ids or None, "state": state or None, "name": name, "user": user, "all": everyone}
    done = call(socket, "POST", "/v1/jobs/cancel", json=body).json()
    out.print(
        f"cancelled {len(done['cancelled'])}, cancelling {len(done['cancelling'])} (running: SIGTERM sent), "
        f"already ended {len(done['ended'])}",
        highlight=False,
    )
    if done["not_found"]:
        raise fail(f"no job {', '.join(done['not_found'])}")


def explain_cmd(job_id: str, as_json: JsonOpt = False, socket: SocketOpt = None) -> None:
    """Why a job waits, or how it ended."""
    data = call(socket, "GET", f"/v1/jobs/{job_id}/explain").json()
    if as_json:
        dump(data)
        return
    say(out, f"job {job_id} is {data['state']}: ", data["reason"] or "-")


def gpus_cmd(as_json: JsonOpt = False, socket: SocketOpt = None) -> None:
    """Each GPU: who holds which share, and live use where the daemon can measure it."""
    rows = call(socket, "GET", "/v1/gpus").json()
    if as_json:
        dump(rows)
        return
    table = Table("GPU", "MODEL", "GRANTED", "HELD BY", "USED MiB", "NOT CORRAL'S MiB", "UTIL %")
    for r in rows:
        held = ", ".join(f"{h['job']}({h['user'] or '?'}) {h['milli']}m" for h in r["held"]) or "-"

        def known(v: object) -> str:
            return "-" if v is None else str(v)

        row(
            table, f"{r['index']} {r['uuid']}", r["model"], f"{r['granted_milli'] / 10:g} %", held,
            known(r["used_memory_mib"]), known(r["foreign_memory_mib"]), known(r["utilization_pct"]),
        )  # fmt: skip
    out.print(table)


token_app = typer.Typer(no_args_is_help=True, help="Bearer tokens for talking to corral serve over TCP.")


@token_app.command("create")
def token_create_cmd(
    name: Annotated[str, typer.Argument(help="What the token is for, e.g. laptop.")],
    user: Annotated[str | None, typer.Option(help="Root: a token for this user.")] = None,
    as_json: JsonOpt = False,
    socket: SocketOpt = None,
) -> None:
    """Create a token (printed once: keep it secret; it acts as you)."""
    token = call(socket, "POST", "/v1/tokens", json={"name": name, "user": user}).json()
    if as_json:
        dump(token)
        return
    sys.stdout.write(f"{token['token']}\n")
    say(err, f"token {token['id']} ({token['name']}) for {token['user']}: use it as CORRAL_TOKEN")


@token_app.command("list")
def token_list_cmd(as_json: JsonOpt = False, socket: SocketOpt = None) -> None:
    """Your tokens (root: everyone's); never their secrets."""
    tokens = call(socket, "GET", "/v1/tokens").json()
    if as_json:
        dump(tokens)
        return
    table = Table("ID", "NAME", "USER", "CREATED")
    for t in tokens:
        row(table, t["id"], t["name"], t["user"], time.strftime("%Y-%m-%d %H:%M", time.localtime(t["created_at"])))
    out.print(table)


@token_app.command("revoke")
def token_revoke_cmd(token_id: str, socket: SocketOpt = None) -> None:
    """Revoke a token: requests carrying it get 401 from now on."""
    call(socket, "DELETE", f"/v1/tokens/{token_id}")
    say(out, f"token {token_id} revoked")


def register(app: typer.Typer) -> None:
    app.add_typer(token_app, name="token")
    app.command("serve")(serve_cmd)
    app.command("submit", context_settings={"allow_interspersed_args": False})(submit_cmd)
    app.command("ps")(ps_cmd)
    app.command("show")(show_cmd)
    app.command("logs")(logs_cmd)
    app.command("cancel")(cancel_cmd)
    app.command("explain")(explain_cmd)
    app.command("gpus")(gpus_cmd)
