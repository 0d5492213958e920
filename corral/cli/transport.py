"""One HTTP request to `corral serve`, over its Unix socket or over TCP, with the standard library.

    request(Endpoint.unix(path) | Endpoint.url(CORRAL_URL, token), "GET", "/v1/jobs", params=..., json=...)
        connect   -- fails: NotConnected (nothing was sent: no daemon there)
        send, read the answer   -- fails: AnswerLost (the request went out; whether it took effect is unknown)
        -> Response(status_code, headers, content)

Why not httpx (the daemon's tests use it): importing it costs about 120 ms, nearly all of the 150 ms a `corral ps`
may take from start to exit. Over the Unix socket (every command on the daemon's machine) the request is written and
its answer read here, on a plain socket: http.client costs about 20 ms to import (it imports email.parser and ssl),
a fifth of what a `corral submit` costs in all, and 4 shells submitting at once spend most of their time starting
Python (issue 26, item 7). The socket's side (exchange, parse) is corral.cli.wire's, which `corral submit` and
`corral ps` use directly on their fast path (corral.cli.fast). Over TCP (CORRAL_URL, maybe https), http.client does
it, imported then. Each call opens one connection and closes it: a command makes one request (a few for `logs -f`,
seconds apart).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

if TYPE_CHECKING:
    import http.client

from corral import __version__
from corral.cli.wire import CUT_SHORT, TIMEOUT, AnswerLost, NotConnected, TransportError, exchange, why

__all__ = ["CUT_SHORT", "TIMEOUT", "AnswerLost", "Endpoint", "Headers", "NotConnected", "Response", "TransportError"]

USER_AGENT = f"corral-cli/{__version__}"
#: Characters left as they are in a request's path: RFC 3986's pchar and "/", and "%" so that a path quoted by its
#: caller (an app id) is not quoted twice. Anything else (a space, a control character in a job id) is %-escaped.
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"


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
        """A connection over TCP (the Unix socket's requests do not need one: see `request`)."""
        import http.client

        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=TIMEOUT)
        return http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT)


class Headers:
    """An answer's headers, looked up by name whatever its case (the first of a repeated header)."""

    def __init__(self, pairs: Iterable[tuple[str, str]] = ()) -> None:
        self._by_name: dict[str, str] = {}
        for name, value in pairs:
            self._by_name.setdefault(name.lower(), value)

    def get(self, name: str, default: Any = None) -> Any:
        return self._by_name.get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return self._by_name[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._by_name


@dataclass(frozen=True)
class Response:
    status_code: int
    headers: Headers
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
            import json

            return json.loads(self.content)


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
        body = _dumps(json)
        sent["Content-Type"] = "application/json"
    sent.update(headers or {})
    for name, value in sent.items():  # as http.client refuses them: a header cannot end early or smuggle another
        if any(c in name for c in "\r\n\0: ") or any(c in value for c in "\r\n\0"):
            raise ValueError(f"invalid HTTP header {name!r}: {value!r}")
    where = target(endpoint.prefix, url, params)
    if endpoint.socket_path is not None:
        return _over_unix(endpoint.socket_path, method, where, body, sent)
    import http.client

    conn = endpoint.connection()
    try:
        try:
            conn.connect()
        except TimeoutError:
            raise AnswerLost("timed out connecting") from None
        except OSError as exc:
            raise NotConnected(exc.strerror or str(exc)) from None
        try:
            conn.request(method, where, body=body, headers=sent)
            answer = conn.getresponse()
            content = answer.read()
        except TimeoutError:
            raise AnswerLost(f"no answer in {TIMEOUT:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            if isinstance(exc, http.client.RemoteDisconnected | http.client.IncompleteRead):
                raise AnswerLost(CUT_SHORT) from None
            raise AnswerLost(why(exc)) from None
        return Response(answer.status, Headers(answer.getheaders()), content)
    finally:
        conn.close()


def _dumps(value: Any) -> bytes:
    """A request's JSON body: orjson (imported in about 1 ms; json costs more), json for what orjson refuses (a
    string with a lone surrogate, which json escapes)."""
    import orjson

    try:
        return orjson.dumps(value)
    except TypeError:
        import json

        return json.dumps(value).encode()


def _over_unix(path: str, method: str, where: str, body: bytes | None, headers: dict[str, str]) -> Response:
    """One HTTP/1.1 request over the daemon's Unix socket, written and read by corral.cli.wire (the fast path's
    too): `Connection: close`, and its Content-Length (or its chunks) says whether the whole answer came."""
    status, pairs, content = exchange(path, method, where, body, headers)
    return Response(status, Headers(pairs), content)
