"""The options that the commands written with Typer (corral app, corral job) share with the thin client's."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from corral.cli.client import JSON_HELP, SOCKET_HELP

SocketOpt = Annotated[Path | None, typer.Option("--socket", help=SOCKET_HELP)]
JsonOpt = Annotated[bool, typer.Option("--json", help=JSON_HELP)]
