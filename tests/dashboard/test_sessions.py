"""Dashboard sessions without a server: both halves, reads only, expiry, revocation, the bound on how many."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.daemon.tokens import TokenStore
from corral.dashboard import sessions as sessions_module
from corral.dashboard.sessions import COOKIE, SESSION_TTL_S, Sessions, cookie_value


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def tokens(tmp_path: Path) -> TokenStore:
    return TokenStore(tmp_path / "tokens.json")


def headers(session_id: str, check: str | None) -> list[tuple[bytes, bytes]]:
    found = [(b"cookie", f"other=1; {COOKIE}={session_id}; x=y".encode())]
    return found + ([(b"x-corral-session", check.encode())] if check is not None else [])


def test_a_session_needs_both_halves_and_only_reads(tokens: TokenStore) -> None:
    _, secret = tokens.create("web", 1001, 1001, "alice", 0)
    sessions = Sessions(tokens)
    assert sessions.login("corral_wrong") is None
    made = sessions.login(secret)
    assert made is not None
    session_id, check, token = made
    assert token.user == "alice" and secret not in (session_id, check)
    assert sessions.peer_of_request("GET", "/v1/jobs", headers(session_id, check)) == (1001, 1001, "alice")
    assert sessions.peer_of_request("GET", "/v1/jobs", headers(session_id, None)) is None
    assert sessions.peer_of_request("GET", "/v1/jobs", headers(session_id, check + "x")) is None
    assert sessions.peer_of_request("GET", "/v1/jobs", headers(check, session_id)) is None  # halves swapped
    assert sessions.peer_of_request("GET", "/ui/reports/a.html", headers(session_id, None)) == (1001, 1001, "alice")
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        assert sessions.peer_of_request(method, "/v1/jobs", headers(session_id, check)) is None
    sessions.logout(session_id)
    assert sessions.peer_of_request("GET", "/v1/jobs", headers(session_id, check)) is None


def test_sessions_end_with_time_and_with_their_token(tokens: TokenStore) -> None:
    clock = Clock()
    sessions = Sessions(tokens, clock)
    first, secret = tokens.create("web", 1001, 1001, "alice", 0)
    made = sessions.login(secret)
    assert made is not None
    clock.now += SESSION_TTL_S - 1
    assert sessions.peer(made[0], made[1]) is not None
    clock.now += 2
    assert sessions.peer(made[0], made[1]) is None
    again = sessions.login(secret)
    assert again is not None and sessions.peer(again[0], again[1]) is not None
    tokens.revoke(first.id)
    assert sessions.peer(again[0], again[1]) is None


def test_the_oldest_session_goes_first_past_the_bound(tokens: TokenStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessions_module, "MAX_SESSIONS", 3)
    _, secret = tokens.create("web", 1001, 1001, "alice", 0)
    sessions = Sessions(tokens)
    made = [sessions.login(secret) for _ in range(4)]
    alive = [m is not None and sessions.peer(m[0], m[1]) is not None for m in made]
    assert alive == [False, True, True, True]


def test_cookie_value() -> None:
    assert cookie_value([(b"Cookie", b"a=1; corral_ui=abc ; b=2")]) == "abc"
    assert cookie_value([(b"cookie", b"corral_uix=1")]) is None
    assert cookie_value([(b"accept", b"corral_ui=1")]) is None


def test_the_one_write_a_session_makes_is_a_cancel_with_the_check_from_its_own_origin(tokens: TokenStore) -> None:
    _, secret = tokens.create("web", 1001, 1001, "alice", 0)
    sessions = Sessions(tokens)
    made = sessions.login(secret)
    assert made is not None
    session_id, check, _ = made
    alice = (1001, 1001, "alice")
    page = [(b"host", b"127.0.0.1:8470"), (b"origin", b"http://127.0.0.1:8470"), (b"sec-fetch-site", b"same-origin")]
    assert sessions.peer_of_request("POST", "/v1/jobs/7/cancel", headers(session_id, check) + page) == alice
    assert sessions.peer_of_request("POST", "/v1/jobs/7/cancel", headers(session_id, check)) == alice  # not a browser
    # without the check (a forged form or fetch from elsewhere can send the cookie, never the check), or a wrong one
    assert sessions.peer_of_request("POST", "/v1/jobs/7/cancel", headers(session_id, None) + page) is None
    assert sessions.peer_of_request("POST", "/v1/jobs/7/cancel", headers(session_id, check + "x") + page) is None
    # from another origin, even with the check
    for foreign in ([(b"host", b"127.0.0.1:8470"), (b"origin", b"http://127.0.0.1:9999")],
                    [(b"host", b"127.0.0.1:8470"), (b"sec-fetch-site", b"same-site")],
                    [(b"host", b"127.0.0.1:8470"), (b"origin", b"null")]):  # fmt: skip
        assert sessions.peer_of_request("POST", "/v1/jobs/7/cancel", headers(session_id, check) + foreign) is None
    # no other write: not the bulk cancel, not a submit, not another method on the same path
    others = (("POST", "/v1/jobs/cancel"), ("POST", "/v1/jobs"), ("DELETE", "/v1/jobs/7/cancel"),
              ("POST", "/v1/jobs/7/cancel/x"), ("POST", "/marathon/v2/apps"), ("POST", "/v1/tokens"))  # fmt: skip
    for method, path in others:
        assert sessions.peer_of_request(method, path, headers(session_id, check) + page) is None, (method, path)
