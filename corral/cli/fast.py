"""`corral`, the console script: `corral submit` and `corral ps` answered with the interpreter's own start and
little more; every other command line handed, untouched, to the click command line (corral.cli.main).

    corral submit [OPTIONS] [--] COMMAND...   parsed here  ->  wire.submit_body  ->  POST /v1/jobs over the socket
    corral ps [OPTIONS]                       parsed here  ->  wire.ps_params  ->  GET /v1/jobs pages, a list per
                                              field (layout=columns)  ->  listing.show, a column at a time
    anything else                             corral.cli.main (click): help, errors, batch scripts, CORRAL_URL

Why (issue 26, item 7): four shells submitting at once spend nearly all their time starting Python. click, with the
dataclasses, inspect, typing, socket and uuid modules it and the request code pull in, cost about 35 ms of CPU on top
of the interpreter's 10, where Slurm's `sbatch` takes 3-4 ms in all. Here a command line is read with `str`
operations, the body is built by the functions the click command calls too (corral.cli.wire), and the request goes
out on a `_socket` and comes back through `_json`'s scanner: nothing of the above is imported
(tests/cli/test_startup.py holds that).

The fast path knows the options of the two commands and their common spellings (`--opt value`, `--opt=value`, the
short `-t 5`); whatever it does not know (an unknown option, `--help`, `-t5`, a missing value or command, a batch
script, a value click would refuse) it does not guess at: the click command runs instead, and so prints exactly
what it always printed. The same goes for an answer it does not expect: no daemon, an error answer, a lost answer.
A submission whose request went out is handed over with its Idempotency-Key, so click's resend cannot make a second
job. tests/cli/test_fast.py holds the two parsers equal over generated command lines.
"""

from __future__ import annotations

import os
import sys

from corral import __version__
from corral.cli import wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

USER_AGENT = f"corral-cli/{__version__}"


class Fallback(Exception):
    """This command line (or its answer) is for the click command to deal with."""


class Spec:
    """A command's options as click declares them: the flag's spellings to the parameter's name."""

    def __init__(
        self,
        values: Mapping[str, str],
        flags: Mapping[str, str],
        defaults: Mapping[str, object],
        multiple: frozenset[str] = frozenset(),
        types: Mapping[str, Callable[[str], object]] | None = None,
        arguments: bool = False,
    ) -> None:
        self.values = values
        self.flags = flags
        self.defaults = defaults
        self.multiple = multiple
        self.types = types or {}
        self.arguments = arguments  # whether the command takes arguments after its options (submit's COMMAND)


SUBMIT = Spec(
    values={
        "--gpus": "gpus", "--gres": "gres", "--gpu-fraction": "gpu_fraction", "--gpu-memory": "gpu_memory",
        "--cpus": "cpus", "--memory": "memory", "--gpu-model": "gpu_model", "--priority": "priority",
        "--name": "name", "--queue": "queue", "--retries": "retries", "--time-limit": "time_limit",
        "--time": "time_limit", "-t": "time_limit", "--dependency": "dependency", "-d": "dependency",
        "--instances": "instances", "--output": "output", "-o": "output", "--error": "error", "-e": "error",
        "--array": "array", "-a": "array", "--socket": "socket",
    },
    flags={"--no-preempt": "no_preempt", "--kill-on-invalid-dep": "kill_on_invalid_dep", "--gang": "gang"},
    defaults={
        "gpus": None, "gres": None, "gpu_fraction": None, "gpu_memory": None, "cpus": "1", "memory": "1GiB",
        "gpu_model": (), "priority": 0, "name": "", "queue": None, "retries": 0, "time_limit": None,
        "no_preempt": False, "dependency": None, "kill_on_invalid_dep": False, "instances": 1, "gang": False,
        "output": None, "error": None, "array": None, "socket": None,
    },
    multiple=frozenset({"gpu_model"}),
    types={"gpu_fraction": float, "priority": int, "retries": int, "instances": int},
    arguments=True,
)  # fmt: skip

PS = Spec(
    values={
        "--state": "state", "--user": "user", "-u": "user", "--name": "name", "--since": "since", "--limit": "limit",
        "--after": "after", "--array": "array_ref", "--socket": "socket",
    },
    flags={"--all": "everyone", "-a": "everyone", "--newest": "newest", "--expand": "expand", "-e": "expand",
           "--json": "as_json"},
    defaults={
        "everyone": False, "state": (), "user": None, "name": None, "since": None, "limit": None, "newest": False,
        "after": None, "expand": False, "array_ref": None, "as_json": False, "socket": None,
    },
    multiple=frozenset({"state"}),
    types={"limit": int},
)  # fmt: skip


def parse(spec: Spec, args: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """(the parameters as click's would be, the arguments after the options); Fallback for anything not plain.

    As click with `allow_interspersed_args=False`: options until `--` or the first argument that is not one; an
    option's value is the next argument whatever it looks like; a repeated option's last value wins (a `multiple`
    one collects them)."""
    params = dict(spec.defaults)
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or arg[:1] != "-" or arg == "-":
            if not spec.arguments:
                raise Fallback  # click's "Got unexpected extra argument"
            rest = list(args[i + 1 :] if arg == "--" else args[i:])
            break
        if arg.startswith("--"):
            opt, eq, value = arg.partition("=")
        elif len(arg) == 2:
            opt, eq, value = arg, "", ""
        else:
            raise Fallback  # -t5, -ae: click's to read
        if opt in spec.flags:
            if eq:
                raise Fallback  # "Option '--gang' does not take a value."
            params[spec.flags[opt]] = True
        elif opt in spec.values:
            if not eq:
                i += 1
                if i == len(args):
                    raise Fallback  # "Option '--name' requires an argument."
                value = args[i]
            key = spec.values[opt]
            convert = spec.types.get(key)
            try:
                typed = convert(value) if convert is not None else value
            except ValueError:
                raise Fallback from None  # "'x' is not a valid integer."
            params[key] = (*params[key], typed) if key in spec.multiple else typed  # type: ignore[misc]
        else:
            raise Fallback  # "No such option", --help
        i += 1
    if params["socket"] == "":
        raise Fallback
    return params, rest


def socket_path(params: Mapping[str, Any]) -> str:
    return str(params["socket"]) if params["socket"] is not None else wire.locate_socket()[0]


def submit(args: Sequence[str]) -> None:
    p, command = parse(SUBMIT, args)
    if not command or os.path.isfile(command[0]):
        raise Fallback  # "Missing argument 'COMMAND...'", or a batch script to read
    try:
        body = submit_body(p, command)
    except wire.BadInput:
        raise Fallback from None
    path = socket_path(p)
    key = wire.idempotency_key()
    headers = {
        "User-Agent": USER_AGENT, "Accept": "application/json, */*", "Content-Type": "application/json",
        "Idempotency-Key": key,
    }  # fmt: skip
    try:
        status, _, content = wire.exchange(path, "POST", "/v1/jobs", wire.dumps(body), headers)
    except wire.NotConnected:
        raise Fallback from None  # nothing was sent
    except wire.AnswerLost:
        wire.preset_key = key  # sent: click's resend carries the same key
        raise Fallback from None
    try:
        job_id = wire.loads(content)["id"] if status < 300 else None
    except (ValueError, KeyError, TypeError):
        job_id = None
    if not isinstance(job_id, str):
        wire.preset_key = key  # an error answer: click sends it again (the same key) and words the error
        raise Fallback
    sys.stdout.write(f"{job_id}\n")


def submit_body(p: Mapping[str, Any], command: Sequence[str]) -> dict[str, Any]:
    """wire.submit_body for `parse(SUBMIT, ...)`'s parameters (the click command passes its own the same way)."""
    return wire.submit_body(
        tuple(command), p["gpus"], p["gpu_fraction"], p["gpu_memory"], p["cpus"], p["memory"], p["gpu_model"],
        p["priority"], p["name"], p["queue"], p["retries"], p["time_limit"], p["no_preempt"], p["instances"],
        p["gang"], gres=p["gres"], dependency=p["dependency"], kill_on_invalid_dep=p["kill_on_invalid_dep"],
        output=p["output"], error=p["error"], array=p["array"],
    )  # fmt: skip


def ps(args: Sequence[str]) -> None:
    import time

    p, _ = parse(PS, args)
    if p["limit"] is not None and p["limit"] < 1:
        raise Fallback  # "0 is not in the range x>=1."
    now = time.time()
    try:
        params = wire.ps_params(
            p["everyone"], p["state"], p["user"], p["name"], p["since"], p["newest"], p["array_ref"], p["as_json"], now
        )
    except wire.BadInput:
        raise Fallback from None
    path = socket_path(p)
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json, */*"}

    def fetch(page: list[wire.Param]) -> tuple[Any, str | None]:
        try:
            status, pairs, content = wire.exchange(path, "GET", f"/v1/jobs?{wire.query(page)}", None, headers)
            if status >= 300:
                raise Fallback  # refused (another user's jobs), or the daemon's error: click words it
            return wire.loads(content), wire.header(pairs, "X-Corral-Next-After") or None
        except (wire.TransportError, ValueError):
            raise Fallback from None

    from corral.cli import listing

    jobs, more = listing.column_pages(fetch, params, p["limit"], p["after"])
    listing.show(jobs, more, p["limit"], p["expand"] or p["array_ref"] is not None, p["as_json"], now)


COMMANDS: dict[str, Callable[[Sequence[str]], None]] = {"submit": submit, "ps": ps}


def main() -> Any:
    """Run `corral` (sys.argv): the fast path where it applies, else the click command line."""
    args = sys.argv[1:]
    command = COMMANDS.get(args[0]) if args and not os.environ.get("CORRAL_URL") else None
    if command is not None:
        try:
            command(args[1:])
            sys.stdout.flush()
            return 0
        except Fallback:
            pass
        except BrokenPipeError:  # `corral ps | head`: as click ends then, quietly with status 1
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
            return 1
        except KeyboardInterrupt:  # Ctrl-C: as click says it
            sys.stderr.write("\nAborted!\n")
            return 1
    from corral.cli.main import main as full

    return full()


if __name__ == "__main__":
    sys.exit(main())
