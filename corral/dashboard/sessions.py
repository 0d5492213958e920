"""Browser sessions for the dashboard over TCP: a browser cannot send a bearer header when it loads a page.

    POST /ui/login {"token": "corral_..."}   (JSON only: a cross-site form cannot send it, and Origin must match)
        -> the token is checked as the API checks it -> a new random session id and a second random value, the
           check, both kept here (as digests) with the token's id
        -> Set-Cookie: corral_ui=<id>; HttpOnly; SameSite=Strict; Path=/; Max-Age=43200, and {"check": <check>}
           in the answer, which the page keeps in its origin's localStorage
    GET  with that cookie and "X-Corral-Session: <check>"  -> the token's (uid, gid, user), while the token exists
                                       and the session has not expired
    POST /v1/jobs/ID/cancel with the cookie, the check, and no foreign Origin   -> the same: the one write a session
                                       may make (SESSION_WRITES; the API's rule applies: a user cancels only their own
                                       jobs). A forged request from another site cannot send the check (it is in this
                                       origin's storage, and a custom header from elsewhere needs a CORS preflight
                                       that the daemon never grants), so it is answered 401. Nothing else is written.
    GET  /ui/reports/PATH with the cookie alone  (an <iframe> cannot send a header; reports hold no one's jobs)

Why two halves: a browser sends a cookie to every port of a host (cookies ignore ports, and so does SameSite), so
another user's web server on 127.0.0.1:OTHER would receive the cookie; localStorage belongs to one origin (port
included), so that server never gets the check. The browser never stores the bearer token itself, and a session is
worthless once the daemon restarts, the session expires, or the token is revoked. Sessions live in memory only.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from corral.daemon.tokens import Token, TokenStore, digest

COOKIE = "corral_ui"
CHECK_HEADER = b"x-corral-session"
#: Paths a session cookie opens without the check header (what an iframe loads).
COOKIE_ONLY_PREFIX = "/ui/reports/"
#: A session lasts this long after login (seconds); then the browser asks for the token again.
SESSION_TTL_S = 12 * 3600
#: Sessions kept at once; the oldest goes first (a valid token is needed to make one, so this only bounds memory).
MAX_SESSIONS = 1000
SAFE_METHODS = frozenset({"GET", "HEAD"})
#: The writes a session may make (method, path), each only with the check header and from the page's own origin:
#: cancelling one job (the page's cancel button).
SESSION_WRITES = (("POST", re.compile(r"/v1/jobs/[^/]+/cancel")),)


def cross_origin(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a browser says the request comes from a page of another origin (Origin or Sec-Fetch-Site)."""
    found = {k.lower(): v.decode("latin-1") for k, v in headers}
    origin = found.get(b"origin")
    if origin is not None and urlsplit(origin).netloc != found.get(b"host", ""):
        return True
    return found.get(b"sec-fetch-site", "same-origin") not in ("same-origin", "none")


@dataclass(frozen=True)
class Session:
    token_id: str
    check: str  # digest of the value the page sends in X-Corral-Session
    uid: int
    gid: int
    user: str
    expires: float


# Only digests of session ids and checks are kept (tokens.digest, as for tokens), so a memory dump of the daemon does
# not hand out live cookies.
_key = digest


def cookie_value(headers: Iterable[tuple[bytes, bytes]], name: str = COOKIE) -> str | None:
    """The value of cookie `name` in a request's Cookie headers, None if absent."""
    for key, raw in headers:
        if key.lower() != b"cookie":
            continue
        for part in raw.decode("latin-1").split(";"):
            k, sep, v = part.strip().partition("=")
            if sep and k == name:
                return v.strip()
    return None


class Sessions:
    def __init__(self, tokens: TokenStore, clock: Callable[[], float] = time.time) -> None:
        self.tokens = tokens
        self.clock = clock
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def login(self, secret: str) -> tuple[str, str, Token] | None:
        """A new session for the token `secret` as (session id, check, token), or None if it is not a valid token."""
        token = self.tokens.verify(secret)
        if token is None:
            return None
        session_id, check = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        entry = Session(token.id, _key(check), token.uid, token.gid, token.user, self.clock() + SESSION_TTL_S)
        with self._lock:
            self._sessions[_key(session_id)] = entry
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return session_id, check, token

    def logout(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(_key(session_id), None)

    def peer(self, session_id: str, check: str | None) -> tuple[int, int, str] | None:
        """(uid, gid, user) of a live session whose token still exists, else None (and the session is dropped).
        `check`: the value the page sends beside the cookie; None where the cookie alone may do (COOKIE_ONLY_PREFIX).
        """
        key = _key(session_id)
        with self._lock:
            entry = self._sessions.get(key)
        if entry is None:
            return None
        if check is not None and not secrets.compare_digest(_key(check), entry.check):
            return None
        alive = entry.expires > self.clock() and any(t.id == entry.token_id for t in self.tokens.list(entry.uid))
        if not alive:
            with self._lock:
                self._sessions.pop(key, None)
            return None
        return entry.uid, entry.gid, entry.user

    def peer_of_request(
        self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]]
    ) -> tuple[int, int, str] | None:
        """The caller a request's session names: for reads, and for SESSION_WRITES with the check from the page's
        own origin (see the module's note)."""
        headers = list(headers)
        write = method.upper() not in SAFE_METHODS
        if write and not any(m == method.upper() and p.fullmatch(path) for m, p in SESSION_WRITES):
            return None
        session_id = cookie_value(headers)
        if not session_id:
            return None
        check = next((v.decode("latin-1") for k, v in headers if k.lower() == CHECK_HEADER), None)
        if write and (check is None or cross_origin(headers)):
            return None
        if check is None:
            if not path.startswith(COOKIE_ONLY_PREFIX):
                return None
            return self.peer(session_id, None)
        return self.peer(session_id, check)
