"""The thin client stays thin: `corral ps` must start in well under 150 ms (benchmarks/cli_startup.py measures it), so
what it imports is held here, as behaviour, in a fresh interpreter each time (tests never assert on time).

Layers point one way: the client does not load the daemon, the engine, the simulator or the Kubernetes face, nor
the libraries only they need; the API does not borrow from the CLI."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest
from typer.testing import CliRunner

import corral

ROOT = Path(__file__).resolve().parents[2]
#: What a thin-client command must never load (a package and everything under it).
HEAVY = (
    "corral.daemon", "corral.placement", "corral.sim", "corral.k8s", "corral.api",
    "scipy", "numpy", "fastapi", "starlette", "uvicorn", "httpx", "pydantic", "matplotlib", "kubernetes", "grpc",
)  # fmt: skip


def loaded_after(code: str, *argv: str, env: dict[str, str] | None = None) -> list[str]:
    """The modules a fresh interpreter holds after running `code` (its own output goes to stderr)."""
    probe = (
        "import sys, json\n"
        f"sys.argv = ['corral', *{list(argv)!r}]\n"
        "try:\n" + "".join(f"    {line}\n" for line in code.splitlines()) + "except SystemExit:\n    pass\n"
        "sys.__stdout__.write('\\n' + json.dumps(sorted(sys.modules)) + '\\n')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


@pytest.mark.parametrize(
    "module",
    [
        "corral.cli.main",
        "corral.cli.client",
        "corral.cli.jobs",
        "corral.cli.services",
        "corral.cli.queues",
        "corral.cli.acct",
    ],
)
def test_importing_the_thin_client_loads_nothing_heavy(module: str) -> None:
    modules = loaded_after(f"import {module}")
    assert heavy(modules) == []
    assert "rich.console" not in modules  # Rich is imported only to draw a table
    assert "typer" not in modules  # it parses through pydantic: the heavy commands' only


def test_running_a_command_loads_nothing_heavy(tmp_path: Path) -> None:
    """`corral ps` with no daemon there: parses its flags, tries the socket, prints one error line."""
    modules = loaded_after(
        "from corral.cli.main import app\napp(prog_name='corral')", "ps", env={"CORRAL_SOCKET": str(tmp_path / "x")}
    )
    assert "corral.cli.client" in modules
    assert heavy(modules) == []
    assert "rich.console" not in modules and "typer" not in modules


def test_help_lists_every_command_without_loading_any() -> None:
    modules = loaded_after("from corral.cli.main import app\napp(prog_name='corral')", "--help")
    assert [m for m in modules if m.startswith("corral.cli.") and m != "corral.cli.main"] == []
    assert heavy(modules) == []


def test_help_lines_are_the_commands_own(capsys: pytest.CaptureFixture[str]) -> None:
    """`corral --help` shows COMMANDS' one-line help without loading a command: it must be the command's own."""
    from corral.cli import main
    from corral.cli.main import COMMANDS
    from corral.cli.typer_app import load

    with pytest.raises(SystemExit) as done:
        main.main(["--help"], prog_name="corral")
    assert done.value.code == 0
    listing = " ".join(capsys.readouterr().out.split())
    for name, spec in COMMANDS.items():
        command: Any = load(name, spec) if spec.typer else main.cli.get_command(click.Context(main.cli), name)
        first = " ".join((command.help or "").split("\n\n")[0].split())
        assert spec.help == first, f"COMMANDS[{name!r}].help differs from the command's docstring"
        assert f"{name} {spec.help}" in listing


def test_heavy_commands_still_run_when_asked() -> None:
    from corral.cli.main import app

    runner = CliRunner()
    done = runner.invoke(app, ["policies", "--json"])
    assert done.exit_code == 0, done.output
    assert "binpack" in json.loads(done.output)
    assert "extender" in runner.invoke(app, ["k8s", "--help"]).output
    assert "matrix" in runner.invoke(app, ["sim", "--help"]).output


def test_a_mistyped_command_gets_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    from corral.cli import main

    with pytest.raises(SystemExit) as done:
        main.main(["sumbit"], prog_name="corral")
    assert done.value.code == 2
    assert "Error: No such command 'sumbit'. Did you mean 'submit'?" in capsys.readouterr().err


def test_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "corral.cli.main", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"corral {corral.__version__}\n"
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert corral.__version__ == declared


def test_the_api_does_not_borrow_from_the_cli() -> None:
    assert not [m for m in loaded_after("import corral.api.app") if m.startswith("corral.cli")]


def test_shell_completion_of_commands_and_options() -> None:
    """bash completion (click's: `eval "$(_CORRAL_COMPLETE=bash_source corral)"`) of the root and a thin command."""

    def complete(words: str) -> list[str]:
        env = {"COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1), "_CORRAL_COMPLETE": "bash_complete"}
        done = subprocess.run(
            [sys.executable, "-c", "from corral.cli.main import main; main(prog_name='corral')"],
            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        )  # fmt: skip
        return [line.split(",", 1)[1] for line in done.stdout.splitlines()]

    assert complete("corral p") == ["ps", "place", "policies"]
    assert complete("corral ps --s") == ["--state", "--since", "--socket"]


#: What `corral submit` and `corral ps` must not load on the fast path (corral.cli.fast): click and what it costs,
#: and the standard modules the slower path needs (each a few ms of a start that is the floor of 4 shells' rate).
NOT_ON_THE_FAST_PATH = (
    "click", "dataclasses", "inspect", "typing", "socket", "json", "orjson", "uuid", "http", "urllib", "pathlib",
    "corral.cli.main", "corral.cli.client", "corral.cli.transport", "rich", "typer",
)  # fmt: skip


def on_the_fast_path(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == n or m.startswith(n + ".") for n in NOT_ON_THE_FAST_PATH)]


@pytest.mark.parametrize(
    ("argv", "answer"),
    [
        (["submit", "--gpus", "1", "--name", "x", "--", "true"], b'{"id": "7"}'),
        (["ps"], b"[]"),
        (["ps", "-a", "--state", "pending", "-u", "root"], b"[]"),  # --json: json writes it
    ],
)
def test_the_fast_path_loads_neither_click_nor_dataclasses(tmp_path: Path, argv: list[str], answer: bytes) -> None:
    """The console script's entry point (corral.cli.fast) against a socket that answers: no click, no dataclasses,
    typing, socket, json, uuid (the ps table's own views and render, and re with them, are fine)."""
    from tests.cli.test_fast import FakeDaemon, http

    sock = tmp_path / "s"
    daemon = FakeDaemon(sock, [http("201 Created", answer)])
    # loaded_after's probe imports json itself: this one reports with repr; -S: what site loads (an editable
    # install's finder: pathlib, urllib) is the environment's, not the command's
    probe = (
        f"import sys\nsys.argv = ['corral', *{argv!r}]\nfrom corral.cli.fast import main\nmain()\n"
        "sys.__stdout__.write('\\n' + repr(sorted(sys.modules)) + '\\n')\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-S", "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "CORRAL_SOCKET": str(sock)},
        )  # fmt: skip
    finally:
        daemon.close()
    assert done.returncode == 0, done.stderr
    modules = list(ast.literal_eval(done.stdout.strip().splitlines()[-1]))
    assert daemon.requests, "nothing was sent"
    assert "corral.cli.fast" in modules
    assert on_the_fast_path(modules) == []
    assert heavy(modules) == []
    if argv[0] == "submit":  # nothing but corral's own three modules and what they need of the core
        assert [m for m in modules if m.startswith("corral")] == [
            "corral", "corral.cli", "corral.cli.fast", "corral.cli.wire", "corral.jobs", "corral.jobs.environment"
        ]  # fmt: skip
        assert "re" not in modules and "collections" not in modules


def test_the_console_script_is_the_fast_path() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"corral": "corral.cli.fast:main"}
