"""Limits every request meets before any route sees it, and the error shape of each face that answers it.

    client --> InputLimits (ASGI) --> FastAPI routing --> route
                 |  body larger than MAX_BODY_BYTES (Content-Length, or counted while read)  -> 413
                 |  body not JSON (not UTF-8, a syntax error, NaN/Infinity, a number that is not finite)  -> 400
                 |  JSON nested deeper than MAX_JSON_DEPTH, an integer beyond +-MAX_JSON_INT           -> 422
                 |  a string (key or value) with NUL or a lone UTF-16 surrogate                         -> 422
                 '-> the body is handed on unchanged (parsed once more by the route: cheap at 1 MiB)

Why here and not in each route: the peers' routes read raw JSON (their error shapes are not FastAPI's), and Python's
`json` module recurses per nesting level, so a deep document must be refused before any route parses it; a
RecursionError or an OverflowError deep in a route is a 500. The checks are the same for every face; only the shape
of the answer differs (`face_of`):

    corral's own API   {"detail": {"field": "command.0", "message": ...}}   (/v1/definitions: the JSON pointer)
    Metronome/Marathon {"message": "Object is not valid", "details": [{"path": "/run/cmd", "errors": [...]}]} (422)
                       {"message": ...}                                       (other statuses)
    Chronos            the details shape with 400, as Chronos answered bad jobs; {"message": ...} otherwise

The numbers are in docs/limits.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from fastapi.responses import JSONResponse

from corral.mesos.errors import OBJECT_NOT_VALID, pointer
from corral.model.limits import text_problem

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY_BYTES = 1024 * 1024
MAX_JSON_DEPTH = 32
#: Integers in a body: beyond 2^53 a JSON number is not exact in most clients (JavaScript, jq), and nothing corral
#: counts comes near it; refusing them here keeps 10^30 out of every int64 column, timedelta and numpy array.
MAX_JSON_INT = 2**53
#: Query and path integers that name a byte offset (logs): what a signed 64-bit file offset can hold.
MAX_OFFSET = 2**63 - 1

PEERS = {"/metronome": "metronome", "/marathon": "marathon", "/chronos": "chronos"}
CHRONOS_STATUS = 400


def face_of(path: str) -> str:
    """Whose error shape answers a request to `path`: "metronome", "marathon", "chronos", "definitions" or "corral"."""
    for prefix, face in PEERS.items():
        if path == prefix or path.startswith(prefix + "/"):
            return face
    if path == "/v1/definitions" or path.startswith("/v1/definitions/"):
        return "definitions"
    return "corral"


class SafeJSONResponse(JSONResponse):
    """JSON that always encodes: a lone surrogate in stored text (kept by an older corral) goes out as its JSON
    escape `\\ud800` instead of failing the whole answer with a UnicodeEncodeError."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def clean(text: str) -> str:
    """`text` as valid UTF-8 for an answer: a lone surrogate becomes the six characters `\\ud800`."""
    if text.isascii():  # O(1) in CPython, and nearly every text: a listing of 20,000 jobs pays almost nothing
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def message_answer(
    status: int, path: str, field: str, message: str, *, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """An error that is not about one part of a body, in the shape of the face that owns `path`."""
    if face_of(path) in ("corral", "definitions"):
        content: dict[str, Any] = {"detail": {"field": field, "message": message}}
    else:
        content = {"message": message}
    return SafeJSONResponse(status_code=status, content=content, headers=headers)


def invalid_answer(path: str, where: tuple[str | int, ...], message: str) -> JSONResponse:
    """A part of the body broke a rule: corral's 422 naming the field, or the peer's validation shape."""
    face = face_of(path)
    if face == "corral":
        return SafeJSONResponse(
            status_code=422, content={"detail": {"field": ".".join(map(str, where)) or "body", "message": message}}
        )
    if face == "definitions":
        return SafeJSONResponse(status_code=422, content={"detail": {"field": pointer(*where), "message": message}})
    status = CHRONOS_STATUS if face == "chronos" else 422
    details = [{"path": pointer(*where) if where else "/", "errors": [message]}]
    return SafeJSONResponse(status_code=status, content={"message": OBJECT_NOT_VALID, "details": details})


class BodyRejected(Exception):
    """A body that no route may see: `status`, where in the document (`where`, empty: the whole body), and why."""

    def __init__(self, status: int, where: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.status = status
        self.where = where
        self.message = message


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def check_json(raw: bytes) -> Any:
    """The parsed body, or BodyRejected saying what is wrong with it and where."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyRejected(400, (), f"the body is not UTF-8 (byte {exc.start}): send JSON in UTF-8") from None
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise BodyRejected(422, (), f"the JSON is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise BodyRejected(400, (), f"the body is not valid JSON: {exc}") from None
    # Depth first, iteratively (no recursion for a hostile document to exhaust), checking every key and value.
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack:
        value, where = stack.pop()
        if len(where) > MAX_JSON_DEPTH:
            raise BodyRejected(422, (), f"the JSON is nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(value, str):
            why = text_problem(value)
            if why is not None:
                raise BodyRejected(422, where, why)
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if abs(value) > MAX_JSON_INT:
                shown = str(value) if len(str(value)) <= 30 else f"a number of {len(str(value))} digits"
                raise BodyRejected(422, where, f"must be at most {MAX_JSON_INT} in size (2^53), got {shown}")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise BodyRejected(422, where, "must be a finite number")
        elif isinstance(value, dict):
            for key, item in value.items():
                why = text_problem(key)
                if why is not None:
                    raise BodyRejected(422, where, f"a key {why}")
                stack.append((item, (*where, key)))
        elif isinstance(value, list):
            stack.extend((item, (*where, i)) for i, item in enumerate(value))
    return data


def _json_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


class InputLimits:
    """The ASGI middleware of the module docstring; wraps the whole app (corral's routes and the peers')."""

    def __init__(self, app: AsgiApp, max_body: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        headers = dict(scope.get("headers") or ())
        too_big = message_answer(
            413, path, "body", f"the request body is larger than {self.max_body} bytes (1 MiB), the limit"
        )
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await message_answer(400, path, "content-length", "not a number")(scope, receive, send)
                return
            if declared > self.max_body:
                await too_big(scope, receive, send)
                return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await too_big(scope, receive, send)
                return
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        if body.strip():
            content_type = headers.get(b"content-type", b"").decode("latin-1")
            face = face_of(path)
            if face == "corral" and content_type and not _json_type(content_type):
                answer = message_answer(
                    415, path, "content-type", f"the body must be application/json, got {content_type[:100]!r}"
                )
                await answer(scope, receive, send)
                return
            try:
                check_json(body)
            except BodyRejected as exc:
                if exc.status == 422 or exc.where:
                    answer = invalid_answer(path, exc.where, exc.message)
                else:
                    answer = message_answer(exc.status, path, "body", exc.message)
                await answer(scope, receive, send)
                return
            if not _json_type(content_type):
                # The peers' clients often send JSON without saying so (curl -d): the routes read it as JSON.
                scope = dict(scope)
                scope["headers"] = [(k, v) for k, v in scope.get("headers", ()) if k != b"content-type"] + [
                    (b"content-type", b"application/json")
                ]

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
