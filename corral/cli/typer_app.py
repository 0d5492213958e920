"""The commands written with Typer (serve, place, discover, policies, sim, k8s), as one Typer app that imports each
only when it runs: `corral serve` does not load the simulator, nor `corral sim` the daemon.

    corral.cli.main (click root)  --"sim", args-->  app(args=["sim", ...])  ->  LazyGroup.get_command("sim")
                                                     ->  import corral.cli.sim  ->  typer.main.get_group(sim.app)

Which commands these are, and their one-line help, is corral.cli.main.COMMANDS (the entries with typer=True).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from corral.cli.main import COMMANDS, Lazy

#: The Typer-written commands, in COMMANDS' order.
TYPER_COMMANDS = {name: spec for name, spec in COMMANDS.items() if spec.typer}


def load(name: str, spec: Lazy) -> TyperCommand | TyperGroup:
    """The command `spec` names, imported now: a Typer app becomes a group, a function a command."""
    target = getattr(importlib.import_module(spec.module), spec.attr)
    command: Any
    if isinstance(target, typer.Typer):
        command = typer.main.get_group(target)  # get_group: without the completion options of a root
    else:
        single = typer.Typer(add_completion=False)
        single.command(name)(target)
        command = typer.main.get_command(single)
    command.name = name
    assert isinstance(command, TyperCommand | TyperGroup)
    return command


class _Commands(MutableMapping[str, Any]):
    """A group's commands by name: every name of TYPER_COMMANDS is there, each loaded on first access."""

    def __init__(self, loaded: MutableMapping[str, Any]) -> None:
        self.loaded = dict(loaded)

    def __getitem__(self, name: str) -> Any:
        if name not in self.loaded:
            spec = TYPER_COMMANDS.get(name)
            if spec is None:
                raise KeyError(name)
            self.loaded[name] = load(name, spec)
        return self.loaded[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self.loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self.loaded[name]

    def __iter__(self) -> Iterator[str]:
        yield from TYPER_COMMANDS
        yield from (n for n in self.loaded if n not in TYPER_COMMANDS)

    def __len__(self) -> int:
        return len(TYPER_COMMANDS.keys() | self.loaded.keys())

    def __contains__(self, name: object) -> bool:
        return name in TYPER_COMMANDS or name in self.loaded


class LazyGroup(TyperGroup):
    """A Typer group whose commands are TYPER_COMMANDS, loaded one at a time when they run. Its help lists each with
    its line from COMMANDS, without loading any."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = _Commands(self.commands)
        self._listing = False

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        commands = self.commands
        if self._listing and isinstance(commands, _Commands) and cmd_name not in commands.loaded:
            spec = TYPER_COMMANDS.get(cmd_name)
            if spec is not None:
                return TyperCommand(name=cmd_name, help=spec.help)
        return commands.get(cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(cls=LazyGroup, add_completion=False, no_args_is_help=True, help="corral: a GPU-aware scheduler.")


@app.callback()
def _root() -> None:
    """corral: a GPU-aware scheduler."""
