"""The thin client: the commands that talk to `corral serve`, over its Unix socket or, with CORRAL_URL, over TCP.

corral serve --simulate-gpus 2xA100-80GB          run the daemon (corral.cli.serve; socket: see serve_locations)
corral submit --gpus 1 -- python train.py        prints the job id
corral ps [-a] [--state S] [--user U] [--name N] [--since 2h] [--limit N] [--newest] [--after ID] [--json]
                                                 your jobs (root: everyone's), all of them (--limit: at most N)
corral cancel ID... | --state queued | --name N  cancel one job, several, or all of yours that match
corral show ID | logs [-f] ID | explain ID | gpus
corral hold ID | release ID | update ID [--priority P] [--time-limit T] [--queue Q] [--gpus N] [--name N]
corral wait ID [--timeout S]                     until the job ends; exits with its status (so does logs -f)
corral token create NAME | list | revoke ID      bearer tokens for TCP (over the Unix socket)

CORRAL_URL=http://host:8470 CORRAL_TOKEN=corral_...  talk to a daemon started with --listen instead of the socket.

These are the commands people type all day, so each must answer at once (issue 15: 150 ms from start to exit; see
benchmarks/cli_startup.py). They are written with click rather than Typer: Typer (0.2x) converts every parameter
through pydantic, which costs more to import (about 60 ms) than the rest of a command together. The request is
written on the daemon's Unix socket by corral.cli.transport itself (http.client only for CORRAL_URL), Rich is
imported only to draw a table (corral.cli.render), and nothing of the daemon, the engine or the simulator is loaded
(tests/cli/test_startup.py holds this).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from corral.cli import listing, wire
from corral.cli.listing import FINAL_STATES
from corral.cli.listing import STATE_STYLES as STATE_STYLES  # its names before (corral.cli.acct's)
from corral.cli.listing import state_cell as state_cell
from corral.cli.render import Terminal, error_line, row, say, table
from corral.cli.transport import AnswerLost, Endpoint, NotConnected, Response, request
from corral.cli.views import FLAGS, change_text, explain_text, flag_error, iso_times, show_lines
from corral.cli.wire import PS_FIELDS as PS_FIELDS  # its names before
from corral.cli.wire import RECENT_S as RECENT_S
from corral.cli.wire import BadInput

EXIT_BAD_INPUT = 2
EXIT_SERVER = 1
#: Resends of a submission whose answer was lost (with backoff: about 6 s in all), enough for a daemon restart.
SUBMIT_RETRIES = 5

out = Terminal()
err = Terminal(stderr=True, soft_wrap=True)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> SystemExit:
    """Print `error: MESSAGE`; the exit to raise. A SystemExit, which click and Typer both let through, since the
    commands written with Typer (serve) use it too."""
    error_line(err, message)
    return SystemExit(code)


def read_document(file: Path) -> Any:
    """The JSON document of a `--file` option (`-`: stdin), or exit with an error naming the flag."""
    try:
        text = sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
    except OSError as exc:
        raise fail(f"--file: cannot read {file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise fail(f"--file: {file} is not UTF-8 text (byte {exc.start}), so not JSON") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise fail(f"--file: {file} is not JSON: {exc}") from None


#: A root daemon's defaults: the system's places for a service's state and for its socket (a shared machine).
SYSTEM_STATE_DIR = Path("/var/lib/corral")
SYSTEM_RUNTIME_DIR = Path("/run/corral")
SOCKET_NAME = "corral.sock"


def default_state_dir() -> Path:
    """A user's own daemon's state: $CORRAL_STATE_DIR, else ~/.local/state/corral."""
    return Path(wire.default_state_dir())


def runtime_dir() -> Path:
    """Where a shared (root) daemon's socket is: $CORRAL_RUNTIME_DIR, else /run/corral."""
    return Path(wire.runtime_dir())


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


def locate_socket() -> tuple[Path, list[Path]]:
    """The daemon's socket, and every place looked at: $CORRAL_SOCKET if set; else your own daemon's
    (STATE_DIR/corral.sock) when one answers there, else a shared daemon's (RUNTIME_DIR/corral.sock)."""
    path, looked = wire.locate_socket()
    return Path(path), [Path(p) for p in looked]


def socket_for(socket_opt: Path | None) -> Path:
    return socket_opt if socket_opt is not None else locate_socket()[0]


SOCKET_HELP = (
    "Daemon socket (default: $CORRAL_SOCKET, else your own daemon's STATE_DIR/corral.sock if it runs, else the shared "
    "one, /run/corral/corral.sock or $CORRAL_RUNTIME_DIR/corral.sock)."
)
JSON_HELP = "Print as JSON."


def error_text(response: Response, flags: Mapping[str, str] | None = None) -> str:
    """corral's own error answer as a line; `flags`: the command's flag for each field (views.FLAGS)."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        return f"HTTP {response.status_code}: {response.text.strip()[:200]}"
    if isinstance(detail, dict) and "message" in detail:
        return flag_error(str(detail.get("field", "")), str(detail["message"]), flags)
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        first = detail[0]
        loc = [str(p) for p in first.get("loc", []) if p != "body"]
        return flag_error(".".join(loc) or "request", str(first.get("msg", "invalid")), flags)
    return f"HTTP {response.status_code}: {detail}"


def flag_errors(response: Response) -> str:
    """`error_text` for the commands whose request fields are their flags (submit, ps, cancel)."""
    return error_text(response, FLAGS)


def call(
    socket_opt: Path | None,
    method: str,
    url: str,
    describe: Callable[[Response], str] | None = None,
    *,
    retries: int = 0,
    params: Any = None,
    json: Any = None,
    headers: dict[str, str] | None = None,
) -> Response:
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
        if not (token.isascii() and token.isprintable()) or " " in token:  # a header can carry no other
            raise fail("CORRAL_TOKEN: not a token (corral's are printable ASCII, e.g. corral_...)")
        try:
            endpoint = Endpoint.url(base, token)
        except ValueError as exc:
            raise fail(f"CORRAL_URL: {exc}") from None
    else:
        path, looked = (socket_opt, [socket_opt]) if socket_opt is not None else locate_socket()
        where = " nor at ".join(str(p) for p in looked)
        endpoint = Endpoint.unix(str(path))

    attempt = 0
    while True:
        try:
            response = request(endpoint, method, url, params=params, json=json, headers=headers)
            break
        except NotConnected:
            # Nothing was sent. The first time: no daemon. After a lost answer: it may be restarting, so try again.
            if attempt == 0 or attempt >= retries:
                raise fail(f"corral serve is not running at {where}") from None
        except AnswerLost as exc:  # sent, but the answer was lost
            if attempt >= retries:
                raise fail(f"talking to corral serve at {where}: {exc}", EXIT_SERVER) from None
        attempt += 1
        time.sleep(min(0.1 * 2**attempt, 2.0))
    if response.status_code >= 400:
        text = (describe or error_text)(response)
        raise fail(text, EXIT_BAD_INPUT if response.status_code < 500 else EXIT_SERVER)
    return response


def dump(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


#: `corral wait`'s and `corral logs -f`'s exit status for a job that ended without an exit code of its own.
EXIT_CANCELLED = 143  # 128 + SIGTERM, what a shell reports for a process that `cancel` stops
EXIT_NO_CODE = 1  # failed without one (its time limit, could not start) or lost (its outcome is unknown)
EXIT_STILL_RUNNING = 124  # `wait --timeout` ran out (timeout(1)'s status)
_SIGNAL = re.compile(r"killed by signal (\d+)")


def job_exit_status(job: dict[str, Any]) -> int:
    """The status a shell would give for the job's process: 0 when it succeeded, its exit code when it failed with
    one, 128 + N when signal N killed it; EXIT_CANCELLED when cancelled, EXIT_NO_CODE otherwise."""
    state, code = job.get("state"), job.get("exit_code")
    if state == "succeeded":
        return 0
    if state == "cancelled":
        return EXIT_CANCELLED
    if state == "failed" and isinstance(code, int) and code != 0:
        return code if 0 < code < 256 else EXIT_NO_CODE
    killed = _SIGNAL.search(str(job.get("reason", "")))
    if state == "failed" and killed:
        return 128 + int(killed.group(1))
    return EXIT_NO_CODE


# ------------------------------------------------------------------------------------------------ commands
socket_option = click.option("--socket", type=click.Path(path_type=Path), default=None, help=SOCKET_HELP)
json_option = click.option("--json", "as_json", is_flag=True, help=JSON_HELP)


@click.command("submit", context_settings={"allow_interspersed_args": False})
@click.argument("command", nargs=-1, required=True)
@click.option("--gpus", default=None, help="Number of whole GPUs (a share of one: --gpu-fraction).")
@click.option("--gres", default=None, help="Slurm's spelling of GPUs: gpu:N, or gpu:MODEL:N (as --gpu-model MODEL).")
@click.option("--gpu-fraction", type=float, default=None, help="Share of each GPU, e.g. 0.3.")
@click.option("--gpu-memory", default=None, help="GPU memory per GPU for a share, e.g. 10GiB.")
@click.option("--cpus", default="1", show_default=True, help="CPUs, e.g. 4 or 500m.")
@click.option("--memory", default="1GiB", show_default=True, help="Memory, e.g. 8GiB.")
@click.option("--gpu-model", multiple=True, help="Allowed GPU model (repeatable).")
@click.option("--priority", type=int, default=0, show_default=True, help="Priority (higher first).")
@click.option("--name", default="", help="A name for the job.")
@click.option("--queue", default=None, help="The queue (default: the daemon's default queue).")
@click.option("--retries", type=int, default=0, show_default=True, help="Retries after a failure.")
@click.option(
    "--time-limit", "--time", "-t", "time_limit", default=None,
    help="Time limit: 45m, 2h, 1h30m, or Slurm's MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (a bare number is "
    "minutes).",
)  # fmt: skip
@click.option(
    "--no-preempt",
    is_flag=True,
    help="Never preempt this job for a higher-priority one (with queues: it starts only within its queue's "
    "guarantee). See docs/preemption.md.",
)
@click.option(
    "--dependency", "-d", default=None,
    help="Start only after other jobs of yours: afterok:ID[:ID...] (succeeded), afterany:ID (ended), afternotok:ID "
    "(failed), after:ID (started), singleton (no other job of your name running); several joined with ','.",
)  # fmt: skip
@click.option(
    "--kill-on-invalid-dep", is_flag=True,
    help="Cancel the job if its dependency can never be met (default: it waits, and its reason says so).",
)  # fmt: skip
@click.option("--instances", type=int, default=1, show_default=True, help="Processes, each with this request.")
@click.option("--gang", is_flag=True, help="Start all the instances or none; one failing stops the others.")
@click.option(
    "--output", "-o", default=None,
    help="Write the job's output to this file (patterns: %j job id, %A %a array job and task, %u user, %x name, %% "
    "a %; relative to this directory), opened as you; stderr too unless --error. Default: corral's log (corral logs).",
)  # fmt: skip
@click.option("--error", "-e", default=None, help="Write the job's stderr to this file (patterns as --output).")
@click.option(
    "--array", "-a", "array", default=None,
    help="A job array: one job per task, 0-99, 1,3,5-7 or 0-99:2, and %N to run at most N at once (0-99%8); each "
    "task gets CORRAL_ARRAY_TASK_ID. Prints the array's id; its tasks are ID_TASK.",
)  # fmt: skip
@socket_option
def submit_cmd(
    command: tuple[str, ...],
    gpus: str | None,
    gres: str | None,
    gpu_fraction: float | None,
    gpu_memory: str | None,
    cpus: str,
    memory: str,
    gpu_model: tuple[str, ...],
    priority: int,
    name: str,
    queue: str | None,
    retries: int,
    time_limit: str | None,
    no_preempt: bool,
    dependency: str | None,
    kill_on_invalid_dep: bool,
    instances: int,
    gang: bool,
    output: str | None,
    error: str | None,
    array: str | None,
    socket: Path | None,
) -> None:
    """Submit a job; prints its id. The job runs in this directory with this environment.

    COMMAND and its arguments come after the options (after --, so that its own options stay its own). A batch
    script as COMMAND (its first lines #CORRAL or #SBATCH directives) is read now and stored with the job; the
    options given here win over its directives (docs/batch-scripts.md)."""
    describe: Callable[[Response], str] = flag_errors
    extra: dict[str, Any] = {}
    if os.path.isfile(command[0]):  # maybe a batch script: corral.cli.scripts reads its directives
        from corral.cli.scripts import submission
        from corral.jobs.batch import ScriptError

        try:
            batch = submission(click.get_current_context(), command)
        except ScriptError as exc:
            raise fail(str(exc)) from None
        if batch is not None:
            if batch.warning is not None:
                say(err, f"warning: {batch.warning}")
            p = batch.params
            gpus, gres, gpu_fraction, gpu_memory = p["gpus"], p["gres"], p["gpu_fraction"], p["gpu_memory"]
            cpus, memory, gpu_model, priority, name = p["cpus"], p["memory"], p["gpu_model"], p["priority"], p["name"]
            queue, retries, time_limit, no_preempt = p["queue"], p["retries"], p["time_limit"], p["no_preempt"]
            dependency, kill_on_invalid_dep = p["dependency"], p["kill_on_invalid_dep"]
            instances, gang, output, error, array = p["instances"], p["gang"], p["output"], p["error"], p["array"]
            extra["script"] = {"text": batch.script.text, "dialect": batch.script.dialect}
            describe = _directive_errors(batch.origins, command[0])
    body = submit_body(
        command, gpus, gpu_fraction, gpu_memory, cpus, memory, gpu_model, priority, name, queue, retries, time_limit,
        no_preempt, instances, gang, gres=gres, dependency=dependency, kill_on_invalid_dep=kill_on_invalid_dep,
        output=output, error=error, array=array,
    ) | extra  # fmt: skip
    # One key per submission: a retry after a lost answer gets the job the first attempt made, not a second one.
    key = {"Idempotency-Key": wire.idempotency_key()}
    job = call(socket, "POST", "/v1/jobs", describe, json=body, headers=key, retries=SUBMIT_RETRIES).json()
    sys.stdout.write(f"{job['id']}\n")


def _directive_errors(origins: Mapping[str, Any], script: str) -> Callable[[Response], str]:
    """`flag_errors`, but an error on a field that a directive of `script` gave names that directive's line."""
    from corral.cli.scripts import directive_error

    def describe(response: Response) -> str:
        text = flag_errors(response)
        try:
            detail = response.json().get("detail")
        except (ValueError, AttributeError):
            return text
        if isinstance(detail, dict) and "field" in detail:
            return directive_error(str(detail["field"]), text, origins, script) or text
        return text

    return describe


def gpu_count(text: str | None) -> int | None:
    """`--gpus`: a whole number of GPUs (corral.cli.wire.gpu_count); exits with its error."""
    try:
        return wire.gpu_count(text)
    except BadInput as exc:
        raise fail(str(exc)) from None


def submit_body(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """The body of `POST /v1/jobs` for `corral submit`'s options: corral.cli.wire.submit_body, the fast path's too
    (tests/api/test_first_day.py sends every mix); exits with its error."""
    try:
        return wire.submit_body(*args, **kwargs)
    except BadInput as exc:
        raise fail(str(exc)) from None


def since_time(value: str, now: float) -> float:
    """`--since`: a duration ago or a date and time (corral.cli.wire.since_time); exits with its error."""
    try:
        return wire.since_time(value, now)
    except BadInput as exc:
        raise fail(str(exc)) from None


#: `corral ps` asks the daemon for this many jobs a request (its most), and for as many pages as it takes.
PS_PAGE = wire.PS_PAGE


def list_pages(
    socket: Path | None, params: list[tuple[str, str | int | float]], limit: int | None, after: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Every job the daemon lists for `params` (at most `limit`), page after page from `after`; and, when `limit` cut
    the list, the id to page on from (None: nothing left out)."""
    return listing.pages(jobs_fetch(socket), params, limit, after, PS_PAGE)


def jobs_fetch(socket: Path | None) -> listing.Fetch:
    """One page of `GET /v1/jobs`: (its jobs, as columns with layout=columns, else rows; the next page's cursor)."""

    def fetch(page_params: list[tuple[str, str | int | float]]) -> tuple[Any, str | None]:
        response = call(socket, "GET", "/v1/jobs", flag_errors, params=page_params)
        return response.json(), response.headers.get("X-Corral-Next-After") or None

    return fetch


@click.command("ps")
@click.option(
    "--all", "-a", "everyone", is_flag=True,
    help="Also jobs that ended more than an hour ago (hidden by default).",
)  # fmt: skip
@click.option(
    "--state", multiple=True,
    help="Only jobs in this state (repeatable, or comma-separated: queued,running; pending is queued).",
)  # fmt: skip
@click.option(
    "--user", "-u", default=None, help="Root: this user's jobs (others: only your own name; other users' are refused)."
)
@click.option("--name", default=None, help="Only jobs with this name.")
@click.option("--since", default=None, help="Submitted since: 45m, 2h (ago) or a date (old finished jobs included).")
@click.option(
    "--limit", type=click.IntRange(min=1), default=None,
    help="At most this many (default: every job that matches).",
)  # fmt: skip
@click.option("--newest", is_flag=True, help="Newest first (default: oldest first).")
@click.option("--after", default=None, help="The page after this job id (see the hint).")
@click.option(
    "--expand", "-e", is_flag=True,
    help="A job array's tasks one row each (ID_TASK); by default an array is one row, its tasks counted by state.",
)  # fmt: skip
@click.option("--array", "array_ref", default=None, help="Only this array's tasks (ID), or some of them (ID_[1-5]).")
@json_option
@socket_option
def ps_cmd(
    everyone: bool,
    state: tuple[str, ...],
    user: str | None,
    name: str | None,
    since: str | None,
    limit: int | None,
    newest: bool,
    after: str | None,
    expand: bool,
    array_ref: str | None,
    as_json: bool,
    socket: Path | None,
) -> None:
    """List your jobs (root: everyone's, as squeue does for an admin), oldest first, every one that matches.

    Jobs that ended more than an hour ago are left out unless --all, --state or --since asks for them. --limit N
    shows at most N (and says how to page on with --after). Times are relative here (3m ago) and ISO 8601 with
    --json."""
    now = time.time()
    try:
        params = wire.ps_params(everyone, state, user, name, since, newest, array_ref, as_json, now)
    except BadInput as exc:
        raise fail(str(exc)) from None
    jobs, more = listing.column_pages(jobs_fetch(socket), params, limit, after, PS_PAGE)
    listing.show(jobs, more, limit, expand or array_ref is not None, as_json, now)


@click.command("show")
@click.argument("job_id")
@click.option("--script", "script", is_flag=True, help="Print a batch job's script, as stored with the job.")
@json_option
@socket_option
def show_cmd(job_id: str, script: bool, as_json: bool, socket: Path | None) -> None:
    """One job in full.

    An array's id: its first task, and its tasks by state; a task: ID_TASK; a range: ID_[1-5], each of its tasks."""
    if script:
        sys.stdout.buffer.write(call(socket, "GET", f"/v1/jobs/{job_id}/script").content)
        return
    if "_[" in job_id:
        tasks, _ = list_pages(socket, [("array", job_id)], None, None)
        if as_json:
            dump(iso_times(tasks))
            return
        for k, task in enumerate(tasks):
            if k:
                say(out, "")
            for label, text in show_lines(task):
                say(out, f"{label:>11}: ", text)
        return
    job = call(socket, "GET", f"/v1/jobs/{job_id}").json()
    if as_json:
        dump(iso_times(job))
        return
    for label, text in show_lines(job):
        say(out, f"{label:>11}: ", text)


@click.command("logs")
@click.argument("job_id")
@click.option("--follow", "-f", is_flag=True, help="Keep printing output until the job ends.")
@click.option(
    "--instance", type=click.IntRange(min=0), default=None,
    help="A gang's instance K only (default: every instance, each line prefixed [K]).",
)  # fmt: skip
@click.option(
    "--json", "as_json", is_flag=True,
    help='Print {"job", "state", "offset", "next_offset", "text"} (a line per chunk; a gang\'s with "instance").',
)  # fmt: skip
@click.option(
    "--interval", type=click.FloatRange(min=0.05), default=0.5, show_default=True,
    help="Seconds between polls with --follow.",
)  # fmt: skip
@socket_option
def logs_cmd(
    job_id: str, follow: bool, instance: int | None, as_json: bool, interval: float, socket: Path | None
) -> None:
    """A job's output so far; with -f, until the job ends (Ctrl-C stops following, not the job).

    An array (ID) or a range of its tasks (ID_[1-5]): each task's log in turn, after a line "==> ID_TASK <==" (not
    with -f); one task: ID_TASK."""
    tasks = array_tasks(socket, job_id)
    if tasks is not None:
        if follow:
            raise fail(f"--follow: {job_id} is a job array: follow one task's log (corral logs -f {job_id}_TASK)")
        for task in tasks:
            name = f"{task['array_job_id']}_{task['array_task_id']}"
            if not as_json:
                sys.stdout.write(f"==> {name} <==\n")
                sys.stdout.flush()
            _logs(name, False, instance, as_json, interval, socket)
        return
    try:
        _logs(job_id, follow, instance, as_json, interval, socket)
    except KeyboardInterrupt:
        raise SystemExit(130) from None


def tasks_text(counts: dict[str, int]) -> str:
    """An array's tasks by state (corral.jobs.array.tasks_text, imported only when an array is shown)."""
    from corral.jobs import array

    return array.tasks_text(counts)


def array_tasks(socket: Path | None, ref: str) -> list[dict[str, Any]] | None:
    """The tasks `ref` names when it is an array's id or a range of tasks (ID_[1-5]), in task order; None for one job
    (or one task)."""
    if "_" in ref and "_[" not in ref:
        return None
    if "_[" not in ref:
        head = call(socket, "GET", f"/v1/jobs/{ref}").json()
        if head.get("array_tasks") is None:
            return None
    fields = "id,state,exit_code,reason,array_job_id,array_task_id"
    return list_pages(socket, [("array", ref), ("fields", fields)], None, None)[0]


class _InstanceLog:
    """One log being read: where the next read starts, and (prefixed) the start of a line not yet complete."""

    def __init__(self, instance: int | None) -> None:
        self.instance = instance
        self.offset = 0
        self.partial = b""


def _logs(job_id: str, follow: bool, instance: int | None, as_json: bool, interval: float, socket: Path | None) -> None:
    """Read the job's log (or each instance's of a gang, prefixed) until its end; with `follow` until the job ends.

    The first answer says how many instances the job has (X-Corral-Instances): a gang's logs are then all read, one
    after the other on each poll, each line prefixed with its instance ("[1] ..."); --instance K reads one, as is."""
    logs = [_InstanceLog(instance)]
    prefixed = False
    noted = False  # the note that --output / --error took the job's output elsewhere, said once
    while True:
        got = False
        state = ""
        k = 0
        while k < len(logs):  # a gang's other instances join the list on the first pass, and are read in it
            log = logs[k]
            k += 1
            params = {"offset": log.offset} | ({"instance": log.instance} if log.instance is not None else {})
            r = call(socket, "GET", f"/v1/jobs/{job_id}/logs", flag_errors, params=params)
            start, log.offset = log.offset, int(r.headers.get("X-Corral-Next-Offset", log.offset + len(r.content)))
            state = r.headers.get("X-Corral-Job-State", "")
            if instance is None and not prefixed and int(r.headers.get("X-Corral-Instances") or 1) > 1:
                prefixed = True  # a gang: instance 0's log came first; the others' follow on this same pass
                log.instance = 0
                logs += [_InstanceLog(k) for k in range(1, int(r.headers["X-Corral-Instances"]))]
            got = got or bool(r.content)
            if not noted and not as_json and (redirected := r.headers.get("X-Corral-Redirected")):
                noted = True
                streams = " and ".join(redirected.split(","))
                say(err, f"note: job {job_id} writes its {streams} to the file of its --output/--error, not to this "
                         f"log (corral show {job_id} names it)")  # fmt: skip
            if as_json:
                if r.content or not follow:
                    line: dict[str, object] = {
                        "job": job_id,
                        "state": state,
                        "offset": start,
                        "next_offset": log.offset,
                    }
                    if prefixed or instance is not None:
                        line["instance"] = log.instance
                    sys.stdout.write(json.dumps({**line, "text": r.content.decode("utf-8", "replace")}) + "\n")
            elif prefixed:
                _write_prefixed(log, r.content)
                if not follow:  # instance by instance: this one to its end, then the next
                    if r.content:
                        k -= 1
                    elif log.partial:
                        _write_prefixed(log, b"\n")
            else:
                sys.stdout.buffer.write(r.content)
        sys.stdout.flush()
        if got and (follow or prefixed):
            continue  # more may be waiting already (a chunk is at most 4 MiB)
        if not follow or state in FINAL_STATES:
            for log in logs:  # a last line without its newline
                if log.partial:
                    _write_prefixed(log, b"\n")
            sys.stdout.flush()
            if not follow:
                return
            # what the job's process gave, like a shell (or `corral wait`): a script can follow and check
            status = job_exit_status(call(socket, "GET", f"/v1/jobs/{job_id}").json())
            if status:
                raise SystemExit(status)
            return
        time.sleep(interval)


def _write_prefixed(log: _InstanceLog, data: bytes) -> None:
    """Write the complete lines of `data` (after what came before of its line), each as "[K] line"."""
    *lines, log.partial = (log.partial + data).split(b"\n")
    for line in lines:
        sys.stdout.buffer.write(f"[{log.instance}] ".encode() + line + b"\n")


@click.command("wait")
@click.argument("job_id")
@click.option(
    "--timeout", type=click.FloatRange(min=0), default=None,
    help=f"Give up after this many seconds (exit status {EXIT_STILL_RUNNING}; the job goes on).",
)  # fmt: skip
@click.option(
    "--interval", type=click.FloatRange(min=0.05), default=0.5, show_default=True, help="Seconds between polls."
)
@socket_option
def wait_cmd(job_id: str, timeout: float | None, interval: float, socket: Path | None) -> None:
    """Wait for a job to end; exit with its exit status.

    \b
    0        it succeeded
    N        it failed with exit code N (128 + S: killed by signal S)
    143      it was cancelled (128 + SIGTERM)
    1        it failed without an exit code (time limit, could not start), or was lost
    124      --timeout ran out first
    Ctrl-C stops waiting, not the job (130).

    An array (ID) or a range of its tasks (ID_[1-5]): until every task has ended; 0 when all succeeded, else the
    status of the first task that did not."""
    deadline = None if timeout is None else time.monotonic() + timeout
    tasks = array_tasks(socket, job_id)
    if tasks is not None:
        _wait_tasks(job_id, tasks, deadline, timeout, interval, socket)
        return
    try:
        while True:
            job = call(socket, "GET", f"/v1/jobs/{job_id}").json()
            if job["state"] in FINAL_STATES:
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                error_line(err, f"job {job_id} is still {job['state']} after {timeout:g} s")
                raise SystemExit(EXIT_STILL_RUNNING)
            time.sleep(interval if left is None else min(interval, left))
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    status = job_exit_status(job)
    if status:
        say(err, f"job {job_id} {job['state']}: ", job["reason"] or "-")
        raise SystemExit(status)


def _wait_tasks(
    ref: str,
    tasks: list[dict[str, Any]],
    deadline: float | None,
    timeout: float | None,
    interval: float,
    socket: Path | None,
) -> None:
    """`corral wait` of an array or a range: poll its tasks until all have ended."""
    try:
        while True:
            counts: dict[str, int] = {}
            for task in tasks:
                counts[task["state"]] = counts.get(task["state"], 0) + 1
            if all(t["state"] in FINAL_STATES for t in tasks):
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                error_line(err, f"array {ref}: {tasks_text(counts)}, after {timeout:g} s")
                raise SystemExit(EXIT_STILL_RUNNING)
            time.sleep(interval if left is None else min(interval, left))
            fields = "id,state,exit_code,reason,array_job_id,array_task_id"
            tasks = list_pages(socket, [("array", ref), ("fields", fields)], None, None)[0]
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    bad = next((t for t in tasks if job_exit_status(t)), None)
    if bad is not None:
        name = f"{bad['array_job_id']}_{bad['array_task_id']}"
        say(err, f"array {ref}: {tasks_text(counts)}; task {name} {bad['state']}: ", bad["reason"] or "-")
        raise SystemExit(job_exit_status(bad))


@click.command("cancel")
@click.argument("job_ids", nargs=-1)
@click.option("--state", multiple=True, help="Every job in this state (repeatable).")
@click.option("--name", default=None, help="Every job with this name.")
@click.option("--user", default=None, help="Root: that user's jobs (with --state/--name).")
@click.option("--all", "everyone", is_flag=True, help="Root: every user's jobs (with --state/--name).")
@socket_option
def cancel_cmd(
    job_ids: tuple[str, ...],
    state: tuple[str, ...],
    name: str | None,
    user: str | None,
    everyone: bool,
    socket: Path | None,
) -> None:
    """Cancel jobs: by id, or every job of yours in a state or with a name (a running one gets SIGTERM).

    An array's id cancels every task; ID_TASK one task; ID_[1-5] a range of them."""
    ids = list(job_ids)
    if len(ids) == 1 and not (state or name):
        r = call(socket, "POST", f"/v1/jobs/{ids[0]}/cancel")
        job = r.json()
        if job.get("array_tasks") is not None:  # an array, or a range of its tasks
            changed = r.headers.get("X-Corral-Changed", "0")
            say(out, f"array {ids[0]}: {changed} tasks cancelled or being cancelled; {tasks_text(job['array_tasks'])}")
            return
        say(out, f"job {job['id']}: {job['state']} (", job["reason"], ")")
        return
    if not (ids or state or name):
        raise fail("say which jobs to cancel: job ids, --state or --name")
    body: dict[str, object] = {
        "ids": ids or None, "state": list(state) or None, "name": name, "user": user, "all": everyone,
    }  # fmt: skip
    done = call(socket, "POST", "/v1/jobs/cancel", flag_errors, json=body).json()
    say(
        out,
        f"cancelled {len(done['cancelled'])}, cancelling {len(done['cancelling'])} (running: SIGTERM sent), "
        f"already ended {len(done['ended'])}",
    )
    if done["not_found"]:
        raise fail(f"no job {', '.join(done['not_found'])}")


@click.command("hold")
@click.argument("job_id")
@socket_option
def hold_cmd(job_id: str, socket: Path | None) -> None:
    """Hold a waiting job: it is not started until `corral release ID`.

    An array (ID), or a range of its tasks (ID_[1-5]): each of its waiting tasks."""
    r = call(socket, "POST", f"/v1/jobs/{job_id}/hold")
    job = r.json()
    if job.get("array_tasks") is not None:
        held = r.headers.get("X-Corral-Changed", "0")
        counts = tasks_text(job["array_tasks"])
        say(out, f"array {job_id}: {held} waiting tasks held (corral release {job_id}); {counts}")
        return
    say(out, f"job {job['id']}: held by {job['held_by']} (corral release {job['id']})")


@click.command("release")
@click.argument("job_id")
@socket_option
def release_cmd(job_id: str, socket: Path | None) -> None:
    """Release a held job: it waits for its turn again.

    An array (ID), or a range of its tasks (ID_[1-5]): each of its held tasks."""
    r = call(socket, "POST", f"/v1/jobs/{job_id}/release")
    job = r.json()
    if job.get("array_tasks") is not None:
        say(out, f"array {job_id}: {r.headers.get('X-Corral-Changed', '0')} held tasks released")
        return
    say(out, f"job {job['id']}: released, {job['state']}")


@click.command("update")
@click.argument("job_id")
@click.option("--priority", type=int, default=None, help="New priority (users: within their bounds).")
@click.option("--time-limit", "--time", "-t", "time_limit", default=None, help="New time limit, as submit takes it.")
@click.option("--queue", default=None, help="Move it to this queue.")
@click.option("--gpus", type=click.IntRange(min=0), default=None, help="New number of GPUs.")
@click.option("--name", default=None, help="New name.")
@socket_option
def update_cmd(
    job_id: str,
    priority: int | None,
    time_limit: str | None,
    queue: str | None,
    gpus: int | None,
    name: str | None,
    socket: Path | None,
) -> None:
    """Change a waiting job; each change is in its history (`corral show ID`).

    An array (ID), or a range of its tasks (ID_[1-5]): each of its waiting tasks."""
    body = {"priority": priority, "time_limit": time_limit, "queue": queue, "gpus": gpus, "name": name}
    body = {k: v for k, v in body.items() if v is not None}
    if not body:
        raise fail("say what to change: --priority, --time-limit, --queue, --gpus or --name")
    r = call(socket, "PATCH", f"/v1/jobs/{job_id}", flag_errors, json=body)
    job = r.json()
    changes = [change_text(c) for c in job.get("history") or ()]
    if job.get("array_tasks") is not None:
        updated = r.headers.get("X-Corral-Changed", "0")
        say(out, f"array {job_id}: {updated} waiting tasks updated", f" ({changes[-1]})" if changes else "")
        return
    say(out, f"job {job['id']}: ", changes[-1] if changes else "unchanged")


@click.command("explain")
@click.argument("job_id")
@json_option
@socket_option
def explain_cmd(job_id: str, as_json: bool, socket: Path | None) -> None:
    """Why a job waits, or how it ended.

    An array (ID) or a range of its tasks (ID_[1-5]): its tasks by state, then its first waiting task's why."""
    data = call(socket, "GET", f"/v1/jobs/{job_id}/explain").json()
    if as_json:
        dump(data)
        return
    for line in explain_text(job_id, data):
        say(out, line)


@click.command("gpus")
@json_option
@socket_option
def gpus_cmd(as_json: bool, socket: Path | None) -> None:
    """Each GPU: who holds which share, and live use where the daemon can measure it."""
    answer = call(socket, "GET", "/v1/gpus")
    rows = answer.json()
    if as_json:
        dump(rows)
        return
    view = table("GPU", "MODEL", "GRANTED", "HELD BY", "USED MiB", "NOT CORRAL'S MiB", "UTIL %")
    for r in rows:
        held = ", ".join(f"{h['job']}({h['user'] or '?'}) {h['milli']}m" for h in r["held"]) or "-"

        def known(v: object) -> str:
            return "-" if v is None else str(v)

        row(
            view, f"{r['index']} {r['uuid']}", r["model"], f"{r['granted_milli'] / 10:g} %", held,
            known(r["used_memory_mib"]), known(r["foreign_memory_mib"]), known(r["utilization_pct"]),
        )  # fmt: skip
    out.print(view)
    notice = answer.headers.get("X-Corral-Containment")
    if notice:  # a job's processes may outlive it there: its user should know
        say(out, f"note: {notice}")


@click.group("token", no_args_is_help=True)
def token_group() -> None:
    """Bearer tokens for talking to corral serve over TCP."""


@token_group.command("create")
@click.argument("name")
@click.option("--user", default=None, help="Root: a token for this user.")
@json_option
@socket_option
def token_create_cmd(name: str, user: str | None, as_json: bool, socket: Path | None) -> None:
    """Create a token (printed once: keep it secret; it acts as you).

    NAME says what the token is for, e.g. laptop."""
    token = call(socket, "POST", "/v1/tokens", json={"name": name, "user": user}).json()
    if as_json:
        dump(token)
        return
    sys.stdout.write(f"{token['token']}\n")
    say(err, f"token {token['id']} ({token['name']}) for {token['user']}: use it as CORRAL_TOKEN")


@token_group.command("list")
@json_option
@socket_option
def token_list_cmd(as_json: bool, socket: Path | None) -> None:
    """Your tokens (root: everyone's); never their secrets."""
    tokens = call(socket, "GET", "/v1/tokens").json()
    if as_json:
        dump(tokens)
        return
    view = table("ID", "NAME", "USER", "CREATED")
    for t in tokens:
        row(view, t["id"], t["name"], t["user"], time.strftime("%Y-%m-%d %H:%M", time.localtime(t["created_at"])))
    out.print(view)


@token_group.command("revoke")
@click.argument("token_id")
@socket_option
def token_revoke_cmd(token_id: str, socket: Path | None) -> None:
    """Revoke a token: requests carrying it get 401 from now on."""
    call(socket, "DELETE", f"/v1/tokens/{token_id}")
    say(out, f"token {token_id} revoked")
