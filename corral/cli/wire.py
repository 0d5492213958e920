"""What `corral submit` and `corral ps` send, and the wire they send it on, with only what a Python start has loaded
already (os, sys, posix) and two C modules (_socket, _json): so that corral.cli.fast answers the two commands people
run most without loading click, dataclasses, typing, socket, json or orjson (issue 26, item 7).

    corral.cli.client (click)  --\\
                                  >-- submit_body / ps_params (here) --> exchange (here, over the Unix socket)
    corral.cli.fast (argv)     --/

One body for one command line: both parsers hand their values to the same functions here, and
tests/cli/test_fast.py holds the two parsers equal over generated command lines. Bad input raises `BadInput`; the
click commands print it as `error: ...`, the fast path hands the command line to click, which prints the same.
"""

from __future__ import annotations

import _json
import _socket
import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (about 3 ms of a start); mypy reads it alike
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    Param = tuple[str, str | int | float]


class BadInput(ValueError):
    """A flag's value the daemon would refuse or that cannot be read; str() is the user's one-line error."""


# ------------------------------------------------------------------------------------------------ submit
def gpu_count(text: str | None) -> int | None:
    """`--gpus`: a whole number of GPUs. 0.5 is a share, which --gpu-fraction asks for (a corral error, not click's)."""
    if text is None:
        return None
    value = text.strip()
    if value.isdigit():
        return int(value)
    try:
        share = float(value)
    except ValueError:
        raise BadInput(f"--gpus: a whole number of GPUs, got {text!r}") from None
    if 0 < share < 1:
        raise BadInput(
            f"--gpus: a whole number of GPUs, got {text!r}; for a share of one GPU use --gpu-fraction {value} "
            "(with --gpu-memory for its memory)"
        )
    raise BadInput(f"--gpus: a whole number of GPUs, got {text!r}")


def gres_gpus(text: str) -> tuple[int, str]:
    """`--gres gpu:N` or `gpu:MODEL:N` (Slurm's generic resources; GPUs are the only kind here): (N, MODEL or "")."""
    parts = text.strip().split(":")
    if parts[0] != "gpu" or not 2 <= len(parts) <= 3 or not parts[-1].isdigit() or not all(parts):
        raise BadInput(f"--gres: give gpu:N or gpu:MODEL:N (GPUs are the only generic resource here), got {text!r}")
    return int(parts[-1]), parts[1] if len(parts) == 3 else ""


def submit_body(
    command: Sequence[str],
    gpus: str | int | None,
    gpu_fraction: float | None,
    gpu_memory: str | None,
    cpus: str,
    memory: str,
    gpu_model: Sequence[str],
    priority: int,
    name: str,
    queue: str | None,
    retries: int,
    time_limit: str | None,
    no_preempt: bool,
    instances: int,
    gang: bool,
    gres: str | None = None,
    dependency: str | None = None,
    kill_on_invalid_dep: bool = False,
    output: str | None = None,
    error: str | None = None,
    array: str | None = None,
) -> dict[str, Any]:
    """The body of `POST /v1/jobs` for `corral submit`'s options (tests/api/test_first_day.py sends every mix).
    Slurm's spellings become corral's here: `--gres gpu:MODEL:N` is --gpus N --gpu-model MODEL."""
    from corral.jobs.environment import admitted_environment  # os and pwd only

    count = gpu_count(str(gpus) if gpus is not None else None)
    models = tuple(gpu_model)
    if gres is not None:
        if gpus is not None:
            raise BadInput("--gres: give the GPUs once: --gpus N or --gres gpu:N, not both")
        count, model = gres_gpus(gres)
        models = (*models, model) if model else models
    return {
        "command": list(command),
        "gpus": count,
        "gpu_fraction": gpu_fraction,
        "gpu_memory": gpu_memory,
        "cpus": cpus,
        "memory": memory,
        "gpu_model": list(models),
        "priority": priority,
        "name": name,
        **({"queue": queue} if queue is not None else {}),  # absent: an older daemon takes the request as before
        "retries": retries,
        "time_limit": time_limit,
        "preemptible": not no_preempt,
        "instances": instances,
        "gang": gang,
        # absent unless asked: an older daemon takes the request as before
        **({"dependency": dependency} if dependency is not None else {}),
        **({"kill_on_invalid_dep": True} if kill_on_invalid_dep else {}),
        **({"output": output} if output is not None else {}),
        **({"error": error} if error is not None else {}),
        **({"array": array} if array is not None else {}),
        # the rule of corral.jobs.environment: never corral's own variables (CORRAL_TOKEN), never the login's agents
        "env": admitted_environment(os.environ),
        "cwd": os.getcwd(),
    }


#: The Idempotency-Key the next submission of this process uses instead of a new one: set by the fast path when it
#: hands a submission it sent (its answer lost or an error) to the click command, which then sends the same key, so
#: that a resend gets the job the first attempt made, never a second one.
preset_key: str | None = None


def idempotency_key() -> str:
    """A submission's Idempotency-Key: a random UUID (version 4) in its usual text, without importing uuid."""
    if preset_key is not None:
        return preset_key
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# ------------------------------------------------------------------------------------------------ ps
#: `corral ps` hides jobs that ended longer ago than this, unless --all, --state or --since says otherwise.
RECENT_S = 3600.0
#: `corral ps` asks the daemon for this many jobs a request (its most), and for as many pages as it takes.
PS_PAGE = 10000
#: What `corral ps`'s table shows of a job (its --json: every field).
PS_FIELDS = "id,name,user,state,command,submitted_at,finished_at,gpus,reason,preempted,array_job_id,array_task_id,array"


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
        raise BadInput(
            f"--since: give a duration ago (45m, 2h) or a date and time (2026-11-26T17:00): {exc.message}"
        ) from None


def ps_params(
    everyone: bool,
    state: Sequence[str],
    user: str | None,
    name: str | None,
    since: str | None,
    newest: bool,
    array_ref: str | None,
    as_json: bool,
    now: float,
) -> list[Param]:
    """The query of `GET /v1/jobs` for `corral ps`'s options (without the page's limit and after)."""
    params: list[Param] = [("state", s) for s in state]
    if everyone:
        params.append(("all", "true"))
    elif not state and since is None:
        params.append(("ended_after", now - RECENT_S))
    for key, value in (("user", user), ("name", name)):
        if value is not None:
            params.append((key, value))
    if since is not None:
        params.append(("since", since_time(since, now)))
    if newest:
        params.append(("order", "newest"))
    if array_ref is not None:
        params.append(("array", array_ref))
    if not as_json:  # the table's fields only: under half the bytes to send, decode and read
        params.append(("fields", PS_FIELDS))
    params.append(("layout", "columns"))  # a list per field: the names once, no object a job (an older daemon: rows)
    return params


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def quoted(text: str) -> str:
    """`urllib.parse.quote(text, safe="")` (RFC 3986's unreserved characters as they are), without importing it."""
    if text.isascii() and all(ord(c) in _UNRESERVED for c in text):
        return text
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in text.encode("utf-8"))


def query(params: Sequence[Param]) -> str:
    """`urlencode(params, doseq=True, quote_via=quote)` for (key, value) pairs of str, int and float."""
    return "&".join(f"{quoted(k)}={quoted(v if isinstance(v, str) else str(v))}" for k, v in params)


# ------------------------------------------------------------------------------------------------ the socket
SYSTEM_RUNTIME_DIR = "/run/corral"
SOCKET_NAME = "corral.sock"


def default_state_dir() -> str:
    """A user's own daemon's state: $CORRAL_STATE_DIR, else ~/.local/state/corral."""
    return os.environ.get("CORRAL_STATE_DIR") or os.path.join(os.path.expanduser("~"), ".local", "state", "corral")


def runtime_dir() -> str:
    """Where a shared (root) daemon's socket is: $CORRAL_RUNTIME_DIR, else /run/corral."""
    return os.environ.get("CORRAL_RUNTIME_DIR") or SYSTEM_RUNTIME_DIR


def answers(path: str) -> bool:
    probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        probe.settimeout(2)
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def locate_socket() -> tuple[str, list[str]]:
    """The daemon's socket, and every place looked at: $CORRAL_SOCKET if set; else your own daemon's
    (STATE_DIR/corral.sock) when one answers there, else a shared daemon's (RUNTIME_DIR/corral.sock)."""
    env = os.environ.get("CORRAL_SOCKET")
    if env:
        return env, [env]
    personal = os.path.join(default_state_dir(), SOCKET_NAME)
    shared = os.path.join(runtime_dir(), SOCKET_NAME)
    looked = [personal, shared]
    if os.path.exists(personal) and answers(personal):
        return personal, looked
    if os.path.exists(shared):
        return shared, looked
    return personal, looked


class TransportError(Exception):
    """The request could not be made or its answer not read; `str()` says why in one line."""


class NotConnected(TransportError):
    """No connection: nothing was sent."""


class AnswerLost(TransportError):
    """Connected and (maybe) sent, but no complete answer came back."""


#: Seconds to wait for the connection and then for each read of the answer (as with httpx's timeout=30 before).
TIMEOUT = 30.0
#: What AnswerLost says when the daemon closed the connection before its whole answer came.
CUT_SHORT = "the connection closed before the whole answer came"


def exchange(
    path: str, method: str, where: str, body: bytes | None, headers: Mapping[str, str]
) -> tuple[int, list[tuple[str, str]], bytes]:
    """One HTTP/1.1 request over the daemon's Unix socket, written and read here: (status, header pairs, content).
    `Connection: close`, so the answer ends where the daemon closes the connection, and its Content-Length (or its
    chunks) says whether it all came."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(TIMEOUT)
        try:
            sock.connect(path)
        except TimeoutError:
            raise AnswerLost("timed out connecting") from None
        except OSError as exc:
            raise NotConnected(exc.strerror or str(exc)) from None
        lines = [f"{method} {where} HTTP/1.1", "Host: corral", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "strict")
        chunks: list[bytes] = []
        try:
            sock.sendall(head + (body or b""))
            while chunk := sock.recv(1 << 18):
                chunks.append(chunk)
        except TimeoutError:
            raise AnswerLost(f"no answer in {TIMEOUT:g} s") from None
        except OSError as exc:
            if not chunks:
                raise AnswerLost(why(exc)) from None
            # e.g. a reset after the whole answer came (the daemon closed with our request's bytes unread)
    finally:
        sock.close()
    return parse(b"".join(chunks))


def header(pairs: Sequence[tuple[str, str]], name: str) -> str | None:
    """The first header of this name (any case), or None."""
    name = name.lower()
    for key, value in pairs:
        if key.lower() == name:
            return value
    return None


def parse(raw: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    """An HTTP/1.1 answer read to its end; AnswerLost if it is not whole."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        raise AnswerLost(CUT_SHORT)
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    version, _, code = status_line.partition(" ")
    if not version.startswith("HTTP/") or not code[:3].isdigit():
        raise AnswerLost(f"not an HTTP answer: {status_line[:80]!r}")
    pairs = []
    for line in header_lines:
        name, colon, value = line.partition(":")
        if colon:
            pairs.append((name.strip(), value.strip()))
    if (header(pairs, "Transfer-Encoding") or "").lower() == "chunked":
        content = _unchunk(rest)
    else:
        length = header(pairs, "Content-Length")
        if length is not None and (not length.isdigit() or len(rest) < int(length)):
            raise AnswerLost(CUT_SHORT)
        content = rest if length is None else rest[: int(length)]
    return int(code[:3]), pairs, content


def _unchunk(data: bytes) -> bytes:
    parts: list[bytes] = []
    at = 0
    while True:
        end = data.find(b"\r\n", at)
        if end < 0:
            raise AnswerLost(CUT_SHORT)
        try:
            size = int(data[at:end].split(b";")[0], 16)
        except ValueError:
            raise AnswerLost("a malformed chunk in the answer") from None
        if size == 0:
            return b"".join(parts)
        start = end + 2
        if len(data) < start + size + 2:
            raise AnswerLost(CUT_SHORT)
        parts.append(data[start : start + size])
        at = start + size + 2


def why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


# ------------------------------------------------------------------------------------------------ JSON
def dumps(value: object) -> bytes:
    """`value` (dicts, lists, str, int, float, bool, None) as JSON, as json.dumps writes it, without importing json:
    strings through _json's own escaping (ASCII, a lone surrogate escaped)."""
    out: list[str] = []
    _dump(value, out)
    return "".join(out).encode("ascii")


def _dump(value: object, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(_json.encode_basestring_ascii(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        if value != value:
            out.append("NaN")
        elif value in (float("inf"), float("-inf")):
            out.append("Infinity" if value > 0 else "-Infinity")
        else:
            out.append(float.__repr__(value))
    elif isinstance(value, dict):
        out.append("{")
        for i, (k, v) in enumerate(value.items()):
            if not isinstance(k, str):
                raise TypeError(f"keys must be str, not {type(k).__name__}")
            out.append(", " if i else "")
            out.append(_json.encode_basestring_ascii(k))
            out.append(": ")
            _dump(v, out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, v in enumerate(value):
            out.append(", " if i else "")
            _dump(v, out)
        out.append("]")
    else:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


class _Context:
    """What _json's scanner reads from a json.JSONDecoder: the defaults of json.loads."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> float:
        return {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}[name]


_scan = _json.make_scanner(_Context())  # type: ignore[arg-type]  # typeshed: a JSONDecoder; it reads these


def loads(data: bytes) -> Any:
    """JSON as json.loads reads it (its C scanner), without importing json (and re with it); ValueError when
    `data` is not one JSON document."""
    text = data.decode("utf-8")
    at = len(text) - len(text.lstrip(" \t\n\r"))
    try:
        value, end = _scan(text, at)
    except StopIteration:
        raise ValueError(f"not JSON at character {at}") from None
    if text[end:].strip(" \t\n\r"):
        raise ValueError(f"extra data at character {end}")
    return value
