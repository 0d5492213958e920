"""Batch scripts: `corral submit script.sh [args]` with `#CORRAL` and `#SBATCH` directive lines, and the `%j %A %a %u
%x` patterns of `--output` / `--error` (docs/batch-scripts.md).

    script.sh (the user's file, read by the client as the user)
        |  read_script: a regular file whose leading comment block has a directive; bounded, text (UTF-8, no NUL,
        |               no DOS line break), starting with #! (its interpreter)
        v
    directives(text)  ->  [Directive(line 3, "sbatch", ("--gres=gpu:2",)), Directive(line 4, "corral", ...)]
        |  sbatch_options: each #SBATCH option as the corral option it means (honoured), or named in one warning
        |  (#CORRAL lines are parsed by the CLI's own submit command: every option works)
        v
    POST /v1/jobs {"command": [name, *args], "script": {"text", "dialect"}, "output", "error", ...}
        |  the daemon stores Script(text, dialect, name, args) with the job: a retry or a requeue runs that text,
        |  whatever became of the file since, from a private copy (a memfd, `corral.executor._supervise`)
        v
    launch: expand(pattern) of --output / --error, opened by the job's child as the job's user (O_NOFOLLOW, never
            through another user's symlink, only in a directory that user may write)

Directives are read as sbatch reads them: lines that start with `#SBATCH` (or `#CORRAL`) at the first column, in the
leading block of comments and blank lines; the first other line ends it. Later directives win over earlier ones, and
the command line's options over every directive. Pure and standard-library only: the thin client imports it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

#: The longest script (UTF-8 bytes): it is stored with the job and sent in one request (the API takes 1 MiB), so
#: well below that, and far beyond any real batch script (Slurm's own default cap is 4 MB).
MAX_SCRIPT_BYTES = 256 * 1024
#: The longest --output / --error pattern (PATH_MAX).
MAX_PATTERN = 4096
PREFIXES = {"#CORRAL": "corral", "#SBATCH": "sbatch"}
Dialect = Literal["corral", "sbatch"]
DIALECTS: tuple[Dialect, ...] = ("corral", "sbatch")


class ScriptError(ValueError):
    """A batch script that cannot be submitted; the message names the file, and the line and directive if one."""


@dataclass(frozen=True)
class Script:
    """A batch script as stored with its job: its text, which directives it had ("sbatch" if any #SBATCH line, else
    "corral"), and the name and arguments it was submitted with (the job's command)."""

    text: str
    dialect: Dialect
    name: str
    args: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "dialect": self.dialect, "name": self.name, "args": list(self.args)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Script:
        dialect = str(d.get("dialect", "corral"))
        return cls(
            str(d["text"]),
            "sbatch" if dialect == "sbatch" else "corral",
            str(d.get("name", "")),
            tuple(str(a) for a in d.get("args", ())),
        )


@dataclass(frozen=True)
class Directive:
    """One directive line: its number (1-based), dialect, the line as written, and its words (quotes and a trailing
    `# comment` handled as sbatch does)."""

    line: int
    dialect: Dialect
    text: str
    words: tuple[str, ...]

    def where(self, name: str) -> str:
        return f"{name} line {self.line} ({self.text})"


def _prefix_of(line: str) -> str | None:
    for prefix in PREFIXES:
        if line.startswith(prefix) and (len(line) == len(prefix) or line[len(prefix)] in " \t"):
            return prefix
    return None


def has_directives(head: bytes) -> bool:
    """True when the leading comment block of `head` (a file's first bytes) has a #CORRAL or #SBATCH line."""
    for raw in head.split(b"\n"):
        line = raw.rstrip(b"\r")
        if not line.strip():
            continue
        if not line.startswith(b"#"):
            return False
        if _prefix_of(line[:8].decode("ascii", "replace")) is not None:
            return True
    return False


def read_script(path: str) -> str | None:
    """The text of the batch script at `path`, or None when `path` is not one (not a readable regular file, or no
    directive in its leading comment block: then it is an ordinary command, a binary or a script run as it is).
    Raises ScriptError for a batch script that cannot be submitted: too large, binary, not UTF-8, DOS line breaks,
    no #! line."""
    try:
        with open(path, "rb") as f:
            import os
            import stat

            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return None
            data = f.read(MAX_SCRIPT_BYTES + 1)
    except OSError:
        return None
    if not has_directives(data):
        return None
    if len(data) > MAX_SCRIPT_BYTES:
        raise ScriptError(
            f"{path}: a batch script of {st.st_size:,} bytes; the most is {MAX_SCRIPT_BYTES:,} bytes "
            f"({MAX_SCRIPT_BYTES // 1024} KiB): keep data out of the script and read it from a file"
        )
    return script_text(path, data)


def script_text(name: str, data: bytes) -> str:
    """`data` as a batch script's text; ScriptError naming the line of the first thing that makes it no script."""
    nul = data.find(b"\0")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise ScriptError(f"{name} line {line}: a NUL byte (binary data at byte {nul}): a batch script is text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ScriptError(f"{name} line {line}: not UTF-8 text (byte {exc.start}): save the script as UTF-8") from None
    crlf = text.find("\r\n")
    if crlf >= 0:
        line = text.count("\n", 0, crlf) + 1
        raise ScriptError(
            f"{name} line {line}: a DOS line break (\\r\\n): save the script with Unix line breaks (dos2unix)"
        )
    if not text.startswith("#!"):
        raise ScriptError(f"{name} line 1: a batch script starts with #! and its interpreter, e.g. #!/bin/bash")
    return text


def _cut_comment(rest: str) -> str:
    """`rest` without a trailing comment: a `#` that starts a word outside quotes (`out#1.txt` keeps its `#`)."""
    quote = ""
    prev = " "
    for i, ch in enumerate(rest):
        if quote:
            if ch == quote:
                quote = ""
            elif ch == "\\" and quote == '"':
                pass
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and prev in " \t":
            return rest[:i]
        prev = ch
    return rest


def directives(text: str, name: str) -> list[Directive]:
    """The directive lines of the script's leading comment block, in order."""
    found: list[Directive] = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        if not line.startswith("#"):
            break
        prefix = _prefix_of(line)
        if prefix is None:
            continue
        try:
            words = tuple(shlex.split(_cut_comment(line[len(prefix) :])))
        except ValueError as exc:  # no closing quotation
            raise ScriptError(f"{name} line {number} ({line.strip()}): {exc}") from None
        if words:
            found.append(Directive(number, "sbatch" if prefix == "#SBATCH" else "corral", line.strip(), words))
    return found


def dialect_of(found: list[Directive]) -> Dialect:
    return "sbatch" if any(d.dialect == "sbatch" for d in found) else "corral"


# ------------------------------------------------------------------------------------------------ #SBATCH
#: The #SBATCH options corral honours: each long and short spelling, and the corral option (submit's parameter) it
#: becomes. --gpus-per-node is --gpus on one machine. Every other option is named in the one warning.
SBATCH: dict[str, str] = {
    "--job-name": "name", "-J": "name",
    "--time": "time_limit", "-t": "time_limit",
    "--gres": "gres",
    "--gpus": "gpus", "-G": "gpus", "--gpus-per-node": "gpus",
    "--cpus-per-task": "cpus", "-c": "cpus",
    "--mem": "memory",
    "--array": "array", "-a": "array",
    "--dependency": "dependency", "-d": "dependency",
    "--output": "output", "-o": "output",
    "--error": "error", "-e": "error",
    "--partition": "queue", "-p": "queue",
}  # fmt: skip
_SLURM_MEM = re.compile(r"(\d+)([KMGT]?)B?", re.IGNORECASE)
_MEM_UNIT = {"": "MiB", "K": "KiB", "M": "MiB", "G": "GiB", "T": "TiB"}
_UNLIMITED = {"unlimited", "infinite"}


@dataclass(frozen=True)
class Setting:
    """A directive's value for one of submit's parameters (`param`), as the CLI would take it."""

    directive: Directive
    param: str
    value: Any  # as click gives it (#CORRAL: a flag's bool, a repeated option's tuple); None: unset (-t UNLIMITED)
    option: str  # the option as written: --gres=gpu:2


def _split_option(words: tuple[str, ...], i: int) -> tuple[str, str | None, int]:
    """(option, its value or None, index of the next word) for the option at words[i]."""
    word = words[i]
    if word.startswith("--"):
        if "=" in word:
            option, value = word.split("=", 1)
            return option, value, i + 1
        option = word
    elif len(word) > 2 and word[1] != "-":  # -J name, or -Jname
        return word[:2], word[2:].removeprefix("="), i + 1
    else:
        option = word
    if i + 1 < len(words) and not words[i + 1].startswith("-"):
        return option, words[i + 1], i + 2
    return option, None, i + 1


def _gres_value(value: str, where: str) -> tuple[str | None, list[str]]:
    """(corral's --gres gpu:[MODEL:]N, or None) and the generic resources other than GPUs (to warn of)."""
    gpu: str | None = None
    others: list[str] = []
    for part in value.split(","):
        kind = part.split(":", 1)[0]
        if kind != "gpu":
            others.append(part)
            continue
        pieces = part.split(":")
        if len(pieces) == 1:
            pieces.append("1")  # --gres=gpu: one GPU, as Slurm reads it
        if not 2 <= len(pieces) <= 3 or not pieces[-1].isdigit() or not all(pieces):
            raise ScriptError(f"{where}: --gres: give gpu:N or gpu:MODEL:N, got {part!r}")
        gpu = ":".join(pieces)
    return gpu, others


def sbatch_settings(found: list[Directive], name: str) -> tuple[list[Setting], list[str]]:
    """The #SBATCH directives as settings of submit's parameters, and the directives corral does not honour (each
    as written, with its line: what the one warning names). Raises ScriptError for a bad value of an honoured one."""
    settings: list[Setting] = []
    ignored: list[str] = []
    for d in found:
        if d.dialect != "sbatch":
            continue
        where = d.where(name)
        i = 0
        while i < len(d.words):
            if not d.words[i].startswith("-"):
                raise ScriptError(f"{where}: {d.words[i]!r} is not an option")
            option, value, i = _split_option(d.words, i)
            written = (
                option if value is None else f"{option}={value}" if option.startswith("--") else f"{option} {value}"
            )
            param = SBATCH.get(option)
            if param is None:
                ignored.append(f"{written} (line {d.line})")
                continue
            if value is None or value == "":
                raise ScriptError(f"{where}: {option} needs a value")
            settings.extend(_sbatch_setting(d, param, option, value, written, where, ignored))
    return settings, ignored


def _sbatch_setting(
    d: Directive, param: str, option: str, value: str, written: str, where: str, ignored: list[str]
) -> list[Setting]:
    if param == "gres":
        gpu, others = _gres_value(value, where)
        ignored.extend(f"--gres={o} (line {d.line})" for o in others)
        return [] if gpu is None else [Setting(d, "gres", gpu, written)]
    if param == "gpus":  # Slurm's --gpus=[TYPE:]N
        pieces = value.split(":")
        if not 1 <= len(pieces) <= 2 or not pieces[-1].isdigit() or not all(pieces):
            raise ScriptError(f"{where}: {option}: give a whole number of GPUs, N or TYPE:N, got {value!r}")
        if len(pieces) == 2:
            return [Setting(d, "gres", f"gpu:{pieces[0]}:{pieces[1]}", written)]
        return [Setting(d, "gpus", pieces[0], written)]
    if param == "cpus":
        if not value.isdigit() or int(value) < 1:
            raise ScriptError(f"{where}: {option}: give a whole number of CPUs (1 or more), got {value!r}")
        return [Setting(d, "cpus", value, written)]
    if param == "memory":
        m = _SLURM_MEM.fullmatch(value)
        if m is None:
            raise ScriptError(f"{where}: --mem: give an amount as Slurm does (16G, 512M, 1T; a bare number is MB), "
                              f"got {value!r}")  # fmt: skip
        if int(m.group(1)) == 0:
            raise ScriptError(f"{where}: --mem=0 asks Slurm for all of a node's memory; give an amount, e.g. --mem=16G")
        return [Setting(d, "memory", f"{m.group(1)}{_MEM_UNIT[m.group(2).upper()]}", written)]
    if param == "time_limit":
        if value.lower() in _UNLIMITED:
            return [Setting(d, "time_limit", None, written)]
        return [Setting(d, "time_limit", value, written)]
    if param == "queue" and "," in value:
        raise ScriptError(f"{where}: {option}: corral runs a job in one queue, got {value!r}")
    if param in ("output", "error"):
        problem = pattern_problem(value)
        if problem is not None:
            raise ScriptError(f"{where}: {option}: {problem}")
    return [Setting(d, param, value, written)]


def warning(name: str, ignored: list[str]) -> str:
    """The one warning line that names every #SBATCH directive corral does not honour."""
    return f"{name}: #SBATCH directives corral does not honour, ignored: {', '.join(ignored)}"


# ------------------------------------------------------------------------------------------------ output patterns
_PATTERN = re.compile(r"%(\d{0,2})(.?)")
#: What each pattern letter stands for (docs/batch-scripts.md).
PATTERN_LETTERS = {"j": "the job id", "A": "the array's job id", "a": "the array task id", "u": "the user name",
                   "x": "the job name", "%": "a % sign"}  # fmt: skip


def pattern_problem(pattern: str) -> str | None:
    """Why `pattern` is no --output / --error pattern, or None."""
    if not pattern:
        return "give a file name (patterns: %j %A %a %u %x, %% for a %)"
    if "\0" in pattern:
        return "must not contain a NUL character"
    if len(pattern.encode("utf-8", "surrogatepass")) > MAX_PATTERN:
        return f"must be at most {MAX_PATTERN} bytes"
    for m in _PATTERN.finditer(pattern):
        letter = m.group(2)
        if letter not in PATTERN_LETTERS:
            shown = f"%{m.group(1)}{letter}" if letter else "a % at the end"
            return f"{shown} is no pattern corral knows: %j %A %a %u %x, and %% for a % sign"
        if letter == "%" and m.group(1):
            return f"%{m.group(1)}% is no pattern: %% is a % sign"
    if pattern.endswith("/"):
        return "names a directory; give a file name in it (e.g. out/%j.log)"
    return None


def expand(
    pattern: str, *, job: str, user: str, name: str, array_job: str | None = None, task: str | None = None
) -> str:
    """`pattern` with %j (job id), %A (its array's job id; the job id outside an array), %a (its array task id; empty
    outside an array), %u (user), %x (job name), %% (a %). A number after % pads %j, %A and %a with zeros (%4a)."""

    def one(m: re.Match[str]) -> str:
        width, letter = m.group(1), m.group(2)
        value = {
            "j": job,
            "A": array_job if array_job is not None else job,
            "a": task if task is not None else "",
            "u": user,
            "x": name,
            "%": "%",
        }[letter]
        if width and letter in "jAa" and value:
            value = value.zfill(int(width))
        return value

    return _PATTERN.sub(one, pattern)


def has_pattern(text: str) -> bool:
    """True when `text` has a pattern other than %% (what it names is known only at launch)."""
    return any(m.group(2) != "%" for m in _PATTERN.finditer(text))


def admission_problems(script: Script | None, output: str, error: str, instances: int) -> list[tuple[str, str]]:
    """What makes a job's script or output patterns inadmissible, as (field, message) pairs (model.admission_problems
    adds them to the rest)."""
    out: list[tuple[str, str]] = []
    if script is not None:
        size = len(script.text.encode("utf-8", "surrogatepass"))
        if size > MAX_SCRIPT_BYTES:
            out.append(("script.text", f"must be at most {MAX_SCRIPT_BYTES} bytes, got {size}"))
        elif "\0" in script.text:
            line = script.text.count("\n", 0, script.text.index("\0")) + 1
            out.append(("script.text", f"line {line}: a NUL character (binary data): a batch script is text"))
        elif not script.text.startswith("#!"):
            out.append(("script.text", "a batch script starts with #! and its interpreter, e.g. #!/bin/bash"))
        else:
            try:
                script.text.encode("utf-8")
            except UnicodeEncodeError as exc:
                out.append(("script.text", f"is not valid Unicode: a lone surrogate at character {exc.start}"))
        if script.dialect not in DIALECTS:
            out.append(("script.dialect", f"must be one of {', '.join(DIALECTS)}, got {script.dialect!r}"))
    for field, pattern in (("output", output), ("error", error)):
        if pattern:
            problem = pattern_problem(pattern)
            if problem is not None:
                out.append((field, problem))
            elif instances > 1:
                out.append((field, "a gang's instances each write their own log; --output and --error take a job "
                                   "of one process"))  # fmt: skip
    return out


def launch_path(
    pattern: str, *, job: str, user: str, name: str, cwd: str, array_job: str | None = None, task: str | None = None
) -> str:
    """An --output / --error pattern as the file a launch opens: expanded, and absolute (relative to the job's
    working directory, as sbatch reads it). Outside an array %A is the job id and %a empty."""
    path = expand(pattern, job=job, user=user, name=name, array_job=array_job, task=task)
    return path if path.startswith("/") else f"{cwd.rstrip('/')}/{path}"
