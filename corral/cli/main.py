"""`corral`: the command line. A command's code is imported only when it runs, so that `corral ps` answers at once.

    corral ps ...          click root  ->  import corral.cli.client (click, a socket)  ->  ps
    corral place ...       click root  ->  corral.cli.typer_app: import corral.cli.place (numpy, scipy)  ->  place
    corral --help          click root: each command's line from COMMANDS, nothing imported

Two kinds of command. The thin client's (submit, ps, show, logs, cancel, explain, gpus, wait, acct, token, app, job) is
written with click: it must start in 150 ms or less (issue 15), and Typer 0.2x converts every parameter through
pydantic, which costs more to import than the rest of such a command together. The others (serve, place, discover,
policies, sim, k8s) load the daemon, the engine, the simulator or the Kubernetes client anyway; they stay with
Typer, and the root hands them their arguments untouched (`corral sim --help` is Typer's).

pyproject's `corral` script calls corral.cli.fast:main, which answers the common forms of `corral submit` and
`corral ps` without click and hands every other command line to `main` here, untouched. `app` is what it called
before (and what scripts installed then still call); `app(...)` runs the command line. For the rest it is the Typer app
of the Typer-written commands (typer.testing.CliRunner drives those through it), built on first use.
tests/cli/test_startup.py checks what a thin-client command imports.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

import corral

if TYPE_CHECKING:
    from typer import Typer


@dataclass(frozen=True)
class Lazy:
    """A command imported when it runs: `module`'s `attr`, a click command (`typer` False) or a Typer app or a
    function that Typer makes a command of (`typer` True)."""

    module: str
    attr: str
    help: str  # its line in `corral --help` (tests/cli/test_startup.py checks it against the command's own help)
    typer: bool = False


#: Every command, in the order `corral --help` lists them.
COMMANDS: dict[str, Lazy] = {
    "submit": Lazy(
        "corral.cli.client", "submit_cmd", "Submit a job; prints its id. The job runs in this directory with this "
        "environment.",
    ),
    "ps": Lazy(
        "corral.cli.client", "ps_cmd", "List your jobs (root: everyone's, as squeue does for an admin), oldest first, "
        "every one that matches.",
    ),
    "show": Lazy("corral.cli.client", "show_cmd", "One job in full."),
    "logs": Lazy(
        "corral.cli.client", "logs_cmd", "A job's output so far; with -f, until the job ends (Ctrl-C stops "
        "following, not the job).",
    ),
    "cancel": Lazy(
        "corral.cli.client", "cancel_cmd", "Cancel jobs: by id, or every job of yours in a state or with a name (a "
        "running one gets SIGTERM).",
    ),
    "explain": Lazy("corral.cli.client", "explain_cmd", "Why a job waits, or how it ended."),
    "hold": Lazy("corral.cli.client", "hold_cmd", "Hold a waiting job: it is not started until `corral release ID`."),
    "release": Lazy("corral.cli.client", "release_cmd", "Release a held job: it waits for its turn again."),
    "update": Lazy(
        "corral.cli.client", "update_cmd", "Change a waiting job; each change is in its history (`corral show ID`)."
    ),
    "wait": Lazy("corral.cli.client", "wait_cmd", "Wait for a job to end; exit with its exit status."),
    "gpus": Lazy(
        "corral.cli.client", "gpus_cmd", "Each GPU: who holds which share, and live use where the daemon can "
        "measure it.",
    ),
    "acct": Lazy(
        "corral.cli.acct", "acct_cmd", "Jobs that ended: elapsed, state, exit code, queue, GPUs, GPU and CPU "
        "hours, GPU use (as sacct).",
    ),
    "token": Lazy("corral.cli.client", "token_group", "Bearer tokens for talking to corral serve over TCP."),
    "queue": Lazy("corral.cli.queues", "queue_group", "Queues, fair share and priority factors (docs/queues.md)."),
    "serve": Lazy(
        "corral.cli.serve", "serve_cmd", "Run the corral daemon on this machine until SIGTERM or Ctrl-C.", typer=True
    ),
    "app": Lazy("corral.cli.services", "app", "Services (Marathon apps): keep instances running."),
    "job": Lazy("corral.cli.jobs", "job_app", "Named job definitions (Metronome or Chronos JSON) and their runs."),
    "place": Lazy(
        "corral.cli.place", "place_cmd", "Place one request on a cluster and say why. Exit code 3 when no node "
        "fits, 2 on bad input.", typer=True,
    ),
    "discover": Lazy(
        "corral.cli.place", "discover_cmd", "The GPUs of this machine as corral sees them (NVML): UUID, model, "
        "memory, use and topology.", typer=True,
    ),
    "policies": Lazy("corral.cli.place", "policies_cmd", "List the placement policies.", typer=True),
    "sim": Lazy("corral.cli.sim", "app", "Replay cluster traces through the placement engine.", typer=True),
    "k8s": Lazy("corral.k8s.cli", "app", "corral on Kubernetes: scheduler extender and device plugin.", typer=True),
}  # fmt: skip


def _to_typer(name: str) -> click.Command:
    """A click command that hands everything after NAME to the Typer app (its own options, --help included)."""

    @click.pass_context
    def run(ctx: click.Context, args: tuple[str, ...]) -> None:
        from corral.cli.typer_app import app as typer_app

        typer_app(args=[name, *args], prog_name=ctx.find_root().info_name)

    return click.Command(
        name,
        callback=run,
        params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
        help=COMMANDS[name].help,
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    )


class Root(click.Group):
    """`corral`: its commands are COMMANDS, each imported when it runs; its help lists them without importing any."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = COMMANDS.get(cmd_name)
        if spec is None:
            return None
        if spec.typer:
            return _to_typer(cmd_name)
        command = getattr(importlib.import_module(spec.module), spec.attr)
        assert isinstance(command, click.Command), f"{spec.module}.{spec.attr} is not a click command"
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, spec.help) for name, spec in COMMANDS.items()])

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            if args and args[0] not in COMMANDS and not args[0].startswith("-"):
                import difflib

                close = difflib.get_close_matches(args[0], list(COMMANDS))
                if close:
                    hint = f"{exc.message.rstrip('.')}. Did you mean {', '.join(map(repr, close))}?"
                    raise click.UsageError(hint, exc.ctx) from None
            raise


@click.group(cls=Root, no_args_is_help=True)
@click.version_option(corral.__version__, "--version", prog_name="corral", message="%(prog)s %(version)s")
def cli() -> None:
    """corral: a GPU-aware scheduler."""


def main(args: Sequence[str] | None = None, prog_name: str | None = None) -> Any:
    """Run the command line (sys.argv unless `args`); exits the process with the command's exit code."""
    return cli.main(args=list(args) if args is not None else None, prog_name=prog_name)


class _Entry:
    """`corral.cli.main:app`, the console script's entry point since before the thin client (installed scripts call
    `app()`): calling it runs `main`; anything else is asked of the Typer app (corral.cli.typer_app), imported then.
    So an installed `corral` starts as fast as `python -m corral.cli.main`, and `CliRunner().invoke(app, [...])`
    still drives the Typer-written commands."""

    def __call__(self, args: Sequence[str] | None = None, prog_name: str | None = None, **_: Any) -> Any:
        return main(args, prog_name)

    def __getattr__(self, name: str) -> Any:
        from corral.cli.typer_app import app as typer_app

        return getattr(typer_app, name)


if TYPE_CHECKING:
    app: Typer
else:
    app = _Entry()


if __name__ == "__main__":
    main()
