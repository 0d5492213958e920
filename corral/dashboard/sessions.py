"""Browser sessions for the dashboard over TCP: a browser cannot send a bearer header when it loads a page.

    POST /ui/login {"token": "corral_..."}   (JSON only: a cross-site form cannot send it, and Origin must match)
        -> the token is checked as the API checks it -> a new random session id, kept here with the token's id
        -> Set-Cookie: corral_ui=<id>; HttpOnly; SameSite=Strict; Path=/; Max-Age=43200
    GET  any path with that cookie  -> the token's (uid, gid, user), while the token exists and the session has not
                                       expired; only GET and HEAD (the dashboard only reads, so a cookie never
                                       authorises a write: no cross-site request forgery can cancel a job)

The browser never stores the bearer token itself (JavaScript cannot read the cookie, and the cookie is worthless once
the daemon restarts, the session expires, or the token is revoked). Sessions live in memory only.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from corral.daemon.tokens import Token, TokenStore

COOKIE = "corral_ui"
#: A session lasts this long after login (seconds); then the browser asks for the token again.
SESSION_TTL_S = 12 * 3600
#: Sessions kept at once; the oldest goes first (a valid token is needed to make one, so this only bounds memory).
MAX_SESSIONS = 1000
SAFE_METHODS = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class Session:
    token_id: str
    uid: int
    gid: int
    user: str
    expires: float


def _key(session_id: str) -> str:
    # Only a digest is kept, so a memory dump of the daemon does not hand out live cookies.
    return hashlib.sha256(session_id.encode()).hexdigest()


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

    def login(self, secret: str) -> tuple[str, Token] | None:
        """A new session for the token `secret`, or None if it is not a valid token."""
        token = self.tokens.verify(secret)
        if token is None:
            return None
        session_id = secrets.token_urlsafe(32)
        entry = Session(token.id, token.uid, token.gid, token.user, self.clock() + SESSION_TTL_S)
        with self._lock:
            self._sessions[_key(session_id)] = entry
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return session_id, token

    def logout(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(_key(session_id), None)

    def peer(self, session_id: str) -> tuple[int, int, str] | None:
        """(uid, gid, user) of a live session whose token still exists, else None (and the session is dropped)."""
        key = _key(session_id)
        with self._lock:
            entry = self._sessions.get(key)
        if entry is None:
            return None
        alive = entry.expires > self.clock() and any(t.id == entry.token_id for t in self.tokens.list(entry.uid))
        if not alive:
            with self._lock:
                self._sessions.pop(key, None)
            return None
        return entry.uid, entry.gid, entry.user

    def peer_of_request(self, method: str, headers: Iterable[tuple[bytes, bytes]]) -> tuple[int, int, str] | None:
        """The caller a request's session cookie names, for reading requests only (see the module's note)."""
        if method.upper() not in SAFE_METHODS:
            return None
        session_id = cookie_value(headers)
        return self.peer(session_id) if session_id else None
