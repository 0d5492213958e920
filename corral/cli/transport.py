"""One HTTP request to `corral serve`, over its Unix socket or over TCP, with the standard library.

    request(Endpoint.unix(path) | Endpoint.url(CORRAL_URL, token), "GET", "/v1/jobs", params=..., json=...)
        connect   -- fails: NotConnected (nothing was sent: no daemon there)
        send, read the answer   -- fails: AnswerLost (the request went out; whether it took effect is unknown)
        -> Response(status_code, headers, content)

Why not httpx (the daemon's tests use it): importing it costs about 120 ms, nearly all of the 150 ms a `corral ps`
may take from start to exit; http.client costs about 25 ms. Each call opens one connection and closes it: a command
makes one request (a few for `logs -f`, seconds apart).
"""

from __future__ import annotations

import http.client
import json as json_module
import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from corral import __version__

#: Seconds to wait for the connection and then for each read of the answer (as with httpx's timeout=30 before).
TIMEOUT = 30.0
USER_AGENT = f"corral-cli/{__version__}"
#: Characters left as they are in a request's path: RFC 3986's pchar and "/", and "%" so that a path quoted by its
#: caller (an app id) is not quoted twice. Anything else (a space, a control character in a job id) is %-escaped.
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"


class TransportError(Exception):
    """The request could not be made or its answer not read; `str()` says why in one line."""


class NotConnected(TransportError):
    """No connection: nothing was sent."""


class AnswerLost(TransportError):
    """Connected and (maybe) sent, but no complete answer came back."""


@dataclass(frozen=True)
class Endpoint:
    """Where the daemon is: a Unix socket, or an http(s) URL with a bearer token."""

    socket_path: str | None = None
    scheme: str = "http"
    host: str = ""
    port: int | None = None
    prefix: str = ""
    token: str = ""

    @classmethod
    def unix(cls, path: str) -> Endpoint:
        return cls(socket_path=path)

    @classmethod
    def url(cls, url: str, token: str) -> Endpoint:
        """CORRAL_URL (http://HOST:PORT[/PREFIX] or https://...); ValueError naming what is wrong."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected http://HOST:PORT or https://HOST:PORT, got {url!r}")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"not a port number in {url!r}") from None
        return cls(scheme=parts.scheme, host=parts.hostname, port=port, prefix=parts.path.rstrip("/"), token=token)

    def connection(self) -> http.client.HTTPConnection:
        if self.socket_path is not None:
            return _UnixConnection(self.socket_path)
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=TIMEOUT)
        return http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT)


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket; the Host header says `corral` (as the socket's clients always have)."""

    def __init__(self, path: str) -> None:
        super().__init__("corral", timeout=TIMEOUT)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


@dataclass(frozen=True)
class Response:
    status_code: int
    headers: http.client.HTTPMessage
    content: bytes = field(repr=False)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON (ValueError when it is not). Decoded by orjson: a page of 5,000 jobs (3 MB) about 3x
        faster than json; imported here, on first use (about 1 ms). What orjson refuses and json takes (the escape of
        a lone surrogate, `\\ud800`, which the daemon sends for text an older corral stored) goes to json."""
        import orjson

        try:
            return orjson.loads(self.content)
        except orjson.JSONDecodeError:
            return json_module.loads(self.content)


def target(prefix: str, url: str, params: Any = None) -> str:
    """The request target: the path %-escaped where it must be, and `params` (a mapping or (key, value) pairs; a
    list value repeats the key) as the query."""
    path, sep, query = url.partition("?")
    text = quote(prefix + path, safe=_PATH_SAFE) + (sep + query if sep else "")
    if params:
        encoded = urlencode(params, doseq=True, quote_via=quote)
        text += ("&" if sep else "?") + encoded
    return text


def request(
    endpoint: Endpoint,
    method: str,
    url: str,
    *,
    params: Any = None,
    json: Any = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """Send one request and read its whole answer; NotConnected or AnswerLost when that fails."""
    sent = {"User-Agent": USER_AGENT, "Accept": "application/json, */*"}
    if endpoint.token:
        sent["Authorization"] = f"Bearer {endpoint.token}"
    body = None
    if json is not None:
        body = json_module.dumps(json).encode()
        sent["Content-Type"] = "application/json"
    sent.update(headers or {})
    conn = endpoint.connection()
    try:
        try:
            conn.connect()
        except TimeoutError:
            raise AnswerLost("timed out connecting") from None
        except OSError as exc:
            raise NotConnected(exc.strerror or str(exc)) from None
        try:
            conn.request(method, target(endpoint.prefix, url, params), body=body, headers=sent)
            answer = conn.getresponse()
            content = answer.read()
        except TimeoutError:
            raise AnswerLost(f"no answer in {TIMEOUT:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise AnswerLost(_why(exc)) from None
        return Response(answer.status, answer.headers, content)
    finally:
        conn.close()


def _why(exc: BaseException) -> str:
    if isinstance(exc, http.client.RemoteDisconnected | http.client.IncompleteRead):
        return "the connection closed before the whole answer came"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__
