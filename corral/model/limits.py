"""What a job may carry: the bounds every face checks at admission, so that nothing stored can fail at launch.

    command   1..MAX_ARGS arguments, each at most MAX_ARG_BYTES, together at most MAX_COMMAND_BYTES (UTF-8)
    env       at most MAX_ENV_VARS; keys 1..MAX_ENV_KEY printable characters without '='; each NAME=value at most
              MAX_ARG_BYTES; all of it <= MAX_ENV_BYTES
    cwd       an absolute path of at most MAX_PATH bytes
    any text  valid Unicode (no lone UTF-16 surrogate, which has no UTF-8 form) and no NUL (execve and C strings end
              at NUL, so the process would get something else than what was stored)

The numbers follow the kernel where it has one (MAX_ARG_STRLEN = 128 KiB per argument, PATH_MAX = 4096) and are
otherwise chosen to sit well inside the 1 MiB body limit of the API; docs/limits.md lists them all. Each check
returns the problems as (sub-field, message) pairs, so each face names the field in its own error shape
(`command.3` on corral's API, `/run/args/3` for Metronome).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

MAX_NAME = 200
MAX_ARGS = 4096
MAX_ARG_BYTES = 128 * 1024  # the kernel's MAX_ARG_STRLEN: a longer argument makes execve fail with E2BIG
MAX_COMMAND_BYTES = 256 * 1024
MAX_ENV_VARS = 1024
MAX_ENV_KEY = 256
MAX_ENV_BYTES = 256 * 1024
MAX_PATH = 4096  # PATH_MAX
MAX_TEXT = 64 * 1024  # descriptions, labels, other free text

Problem = tuple[str, str]  # (sub-field, message); "" = the field itself


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def text_problem(text: str) -> str | None:
    """Why `text` cannot be stored and handed to a process, or None."""
    if "\x00" in text:
        return "must not contain a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        return f"is not valid Unicode: it has a lone surrogate {ascii(bad)[1:-1]} at character {exc.start}"
    return None


def name_problem(name: str, limit: int = MAX_NAME) -> str | None:
    """A job's name: shown in tables and terminals, so no control characters besides the rules of any text."""
    why = text_problem(name)
    if why is not None:
        return why
    if len(name) > limit:
        return f"must be at most {limit} characters, got {len(name)}"
    for ch in name:
        if not ch.isprintable() and ch != " ":
            return f"must not contain control characters, got {ch!a}"
    return None


def command_problems(args: Iterable[str]) -> list[Problem]:
    """Problems of an argv: per argument ("3", ...) and of the whole ("")."""
    out: list[Problem] = []
    total = 0
    count = 0
    for i, arg in enumerate(args):
        count += 1
        why = text_problem(arg)
        if why is not None:
            out.append((str(i), why))
            continue
        size = _utf8_len(arg)
        total += size + 1
        if size > MAX_ARG_BYTES:
            out.append((str(i), f"must be at most {MAX_ARG_BYTES} bytes, got {size}"))
    if count > MAX_ARGS:
        out.append(("", f"must have at most {MAX_ARGS} arguments, got {count}"))
    if total > MAX_COMMAND_BYTES:
        out.append(("", f"must be at most {MAX_COMMAND_BYTES} bytes in all, got {total}"))
    return out


def env_key_problem(key: str) -> str | None:
    if not key:
        return "an environment variable needs a name"
    why = text_problem(key)
    if why is not None:
        return f"the name {why}"
    if len(key) > MAX_ENV_KEY:
        return f"the name must be at most {MAX_ENV_KEY} characters, got {len(key)}"
    if "=" in key:
        return f"the name must not contain '=', got {key!r}"
    if not key.isprintable():  # the kernel takes any byte but '=' and NUL; shells and `env` print them raw
        return f"the name must not contain control characters, got {key!r}"
    return None


def env_problems(env: Mapping[str, str]) -> list[Problem]:
    """Problems of an environment: per variable (its name) and of the whole ("")."""
    out: list[Problem] = []
    if len(env) > MAX_ENV_VARS:
        out.append(("", f"must have at most {MAX_ENV_VARS} variables, got {len(env)}"))
    total = 0
    for key, value in env.items():
        why = env_key_problem(key)
        if why is not None:  # a bad name is reported on the environment: it cannot name a field itself
            out.append(("", why if len(key) <= MAX_ENV_KEY else why.replace("the name", "a name")))
            continue
        why = text_problem(value) if isinstance(value, str) else None
        if why is not None:
            out.append((key, f"the value {why}"))
            continue
        if isinstance(value, str) and _utf8_len(key) + 1 + _utf8_len(value) > MAX_ARG_BYTES:
            # NAME=value is one string for execve, under the same per-string limit as an argument
            out.append((key, f"NAME=value must be at most {MAX_ARG_BYTES} bytes, got {_utf8_len(value)} for the value"))
            continue
        total += _utf8_len(key) + (_utf8_len(value) if isinstance(value, str) else 0) + 2
    if total > MAX_ENV_BYTES:
        out.append(("", f"must be at most {MAX_ENV_BYTES} bytes in all, got {total}"))
    return out


def cwd_problem(cwd: str) -> str | None:
    why = text_problem(cwd)
    if why is not None:
        return why
    if not cwd.startswith("/"):
        return f"must be an absolute path, got {cwd!r}"
    if _utf8_len(cwd) > MAX_PATH:
        return f"must be at most {MAX_PATH} bytes"
    return None


def free_text_problem(text: str, limit: int = MAX_TEXT) -> str | None:
    why = text_problem(text)
    if why is None and len(text) > limit:
        why = f"must be at most {limit} characters, got {len(text)}"
    return why


def joined(field: str, sub: str, sep: str = ".") -> str:
    """`command` + `3` -> `command.3`; an empty sub-field is the field itself."""
    return f"{field}{sep}{sub}" if sub else field
