"""`corral submit script.sh [args]`: a batch script's directives as submit's own options (docs/batch-scripts.md).

    command line  --click-->  ctx.params (each with its source: the command line, or a default)
    script.sh     --corral.jobs.batch-->  #CORRAL lines: parsed by submit's own click command, line by line
                                          #SBATCH lines: the options corral honours, as submit's parameters
    merged: the command line's options win over every directive, a later directive over an earlier one

Imported only when the command names a file, so `corral submit -- true` loads none of it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import click
from click.core import ParameterSource

from corral.jobs.batch import (
    Directive,
    Script,
    ScriptError,
    Setting,
    dialect_of,
    directives,
    pattern_problem,
    read_script,
    sbatch_settings,
)
from corral.jobs.batch import warning as sbatch_warning

#: A stand-in for the command when a #CORRAL line is parsed by submit's command (which needs one).
_PLACEHOLDER = "\0script"
#: Parameters that are never a directive's: the command itself.
_NOT_DIRECTIVES = {"command"}
#: Parameters that say one thing (the GPUs): a source that gives either decides both.
_GPU_SLOT = ("gpus", "gres")


@dataclass
class Submission:
    """A batch script's submission: submit's parameters merged, the script to store, the warning to print (or
    None), and for each parameter a directive decided, that directive (to name it in the daemon's errors)."""

    params: dict[str, Any]
    script: Script
    warning: str | None
    origins: dict[str, Setting] = field(default_factory=dict)


def corral_settings(command: click.Command, found: list[Directive], name: str) -> list[Setting]:
    """Each #CORRAL line parsed by submit's own command: the parameters it gives. ScriptError names the line."""
    settings: list[Setting] = []
    for d in found:
        if d.dialect != "corral":
            continue
        where = d.where(name)
        if "--help" in d.words:
            raise ScriptError(f"{where}: --help is no directive")
        try:
            ctx = command.make_context("submit", [*d.words, "--", _PLACEHOLDER], resilient_parsing=False)
        except click.ClickException as exc:
            raise ScriptError(f"{where}: {exc.format_message()}") from None
        if tuple(ctx.params.get("command", ())) != (_PLACEHOLDER,):
            raise ScriptError(f"{where}: #CORRAL lines take submit's options only, not a command")
        for param, value in ctx.params.items():
            if param not in _NOT_DIRECTIVES and ctx.get_parameter_source(param) == ParameterSource.COMMANDLINE:
                _check(param, value, where)
                settings.append(Setting(d, param, value, " ".join(d.words)))
    return settings


def _check(param: str, value: Any, where: str) -> None:
    """What the client itself reads of a directive's value (the GPUs), checked here so that the error names the
    line; the daemon checks the rest, and its errors name the line too (`directive_error`)."""
    if param == "gpus" and not str(value).strip().isdigit():
        hint = ""
        try:
            if 0 < float(value) < 1:
                hint = f"; for a share of one GPU use --gpu-fraction {str(value).strip()}"
        except ValueError:
            pass
        raise ScriptError(f"{where}: --gpus: a whole number of GPUs, got {value!r}{hint}")
    if param == "gres":
        parts = str(value).strip().split(":")
        if parts[0] != "gpu" or not 2 <= len(parts) <= 3 or not parts[-1].isdigit() or not all(parts):
            raise ScriptError(f"{where}: --gres: give gpu:N or gpu:MODEL:N, got {value!r}")
    if param in ("output", "error"):
        problem = pattern_problem(str(value))
        if problem is not None:
            raise ScriptError(f"{where}: --{param}: {problem}")


def merge(ctx: click.Context, settings: list[Setting]) -> tuple[dict[str, Any], dict[str, Setting]]:
    """submit's parameters: the command line's where it gave them, else the last directive's, else the default.
    A repeatable option (--gpu-model) collects every directive's values. Returns them and, for each parameter a
    directive decided, that directive."""
    params = dict(ctx.params)
    given = {p for p in params if ctx.get_parameter_source(p) in (ParameterSource.COMMANDLINE,
                                                                  ParameterSource.ENVIRONMENT)}  # fmt: skip
    if given & set(_GPU_SLOT):
        given |= set(_GPU_SLOT)
    multiple = {p.name for p in ctx.command.params if getattr(p, "multiple", False)}
    origins: dict[str, Setting] = {}
    for s in settings:
        if s.param not in params:
            raise ScriptError(
                f"{s.directive.where(ctx.params['command'][0])}: this corral has no --{s.param.replace('_', '-')} "
                "to give it to"
            )
        if s.param in given:
            continue
        if s.param in _GPU_SLOT:  # the last directive that names the GPUs decides them, in either spelling
            for other in _GPU_SLOT:
                params[other] = None
                origins.pop(other, None)
        if s.param in multiple:
            was = () if s.param not in origins else tuple(params[s.param])
            params[s.param] = (*was, *s.value) if isinstance(s.value, tuple) else (*was, s.value)
        else:
            params[s.param] = s.value
        origins[s.param] = s
    return params, origins


def submission(ctx: click.Context, command: tuple[str, ...]) -> Submission | None:
    """The batch-script submission of `command` (its first word a batch script), or None for an ordinary command.
    Raises ScriptError for a bad script or directive."""
    name = command[0]
    text = read_script(name)
    if text is None:
        return None
    found = directives(text, name)
    sbatch, ignored = sbatch_settings(found, name)
    corral = corral_settings(ctx.command, found, name)
    ordered = sorted([*sbatch, *corral], key=lambda s: s.directive.line)  # stable: a line's own order kept
    params, origins = merge(ctx, ordered)
    if not params.get("name"):  # as sbatch: a batch job's name is its script's file name unless one is given
        params["name"] = os.path.basename(name)
    script = Script(text, dialect_of(found), name, tuple(command[1:]))
    return Submission(params, script, sbatch_warning(name, ignored) if ignored else None, origins)


def directive_error(field: str, message: str, origins: Mapping[str, Setting], name: str) -> str | None:
    """The daemon's error on `field` (an API field) as the directive that gave it, or None if no directive did."""
    setting = origins.get(field)
    if setting is None and field == "gpus":
        setting = origins.get("gres")
    if setting is None:
        return None
    return f"{setting.directive.where(name)}: {message}"
