"""The live web dashboard of `corral serve`, at /ui/ (docs/dashboard.md).

    browser --GET /, /ui/, /ui/static/*--> the page and its assets (from this package: no CDN, no build step)
            --GET /v1/gpus, /v1/jobs, /v1/jobs/ID/explain, /v1/jobs/ID/logs, /v1/queues, /v1/shares,
              /v1/definitions, /marathon/v2/apps; POST /v1/jobs/ID/cancel--> the daemon's API, as the viewer: it
              sees exactly what `corral ps/show/logs/explain/job list` (or a Marathon client) would show them
            --GET /ui/api/me, /ui/api/history, /ui/api/reports, /ui/reports/PATH--> what only the page needs

Who the viewer is:
    Unix socket  the connection's peer (SO_PEERCRED), as for every API call: e.g. `ssh -L 8470:/run/corral/corral.sock`
                 and http://127.0.0.1:8470/ui/ shows the ssh user's view, with no token
    TCP          the page (open: it holds no data) asks for a token once and posts it to /ui/login, which sets an
                 HttpOnly, SameSite=Strict session cookie and hands the page a check it sends as X-Corral-Session
                 (corral.dashboard.sessions); a session authorises reads, and cancelling a job with the check
                 (the page's Cancel button; nothing else is written). A Bearer header works too.

Every request over the socket must name this machine in Host (corral.api.hosts: DNS rebinding through a forward),
and a browser's write over the socket must come from the page's own origin (cross_site_write: a forged form or fetch).

Every UI answer carries a Content-Security-Policy that allows nothing but this origin (UI_CSP): no inline script,
no third-party request. The page renders every user's and peer's text with textContent, never as markup.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, Field

from corral.api.app import Caller, error
from corral.daemon.core import Daemon
from corral.daemon.tokens import TokenStore
from corral.dashboard.history import History
from corral.dashboard.reports import REPORT_CSP, ReportsFolder
from corral.dashboard.sessions import COOKIE, SAFE_METHODS, SESSION_TTL_S, Sessions, cookie_value, cross_origin

UI_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
#: The page's files, by the name under /ui/static/ (nothing else in the package is served).
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
PREFIX = "/ui"


def is_open(method: str, path: str) -> bool:
    """Paths a TCP client may ask without a token: the page and its assets (no data in them), `/` (a redirect to
    the page), login and logout."""
    if method in ("GET", "HEAD"):
        return path in ("/", PREFIX, PREFIX + "/") or path.startswith(PREFIX + "/static/")
    return method == "POST" and path in (PREFIX + "/login", PREFIX + "/logout")


def cross_site_write(method: str, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """Why a browser's write over the socket is refused (it comes from a page of another origin), else None.

    Over the socket a request needs no token, so without this any site the user visits could post a form or a
    `text/plain` fetch through a forwarded port (`ssh -L 8470:SOCKET`) and act as them: cancel their jobs, or make a
    Marathon app that runs a command of its choosing. Browsers name the page's origin in `Origin` and
    `Sec-Fetch-Site`; corral's own clients send neither. Reads stay open (a link from elsewhere to /ui/ works; the
    answer is not readable by the other site)."""
    if method.upper() in SAFE_METHODS or not cross_origin(headers):
        return None
    return "a page of another site may not write through the socket (Origin or Sec-Fetch-Site says it is one)"


def _headers(csp: str = UI_CSP, frame: str = "DENY") -> dict[str, str]:
    return {
        "Content-Security-Policy": csp,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": frame,
        "Cache-Control": "no-cache",
    }


def _asset(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


class LoginIn(BaseModel):
    token: str = Field(min_length=1, max_length=256)


def _same_origin(request: Request) -> bool:
    """A login must come from the page itself: a browser names the page's origin in `Origin` (absent for non-browser
    clients such as curl, which are no forgery risk)."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    return urlsplit(origin).netloc == host


def _secure(request: Request) -> bool:
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto", "").lower() == "https"


class Dashboard:
    """The dashboard's routes and state (sessions, GPU history, the reports folder) for one daemon."""

    def __init__(self, daemon: Daemon, tokens: TokenStore | None, reports: Path | None = None) -> None:
        self.daemon = daemon
        self.sessions = Sessions(tokens) if tokens is not None else None
        # Opened now, held for the daemon's life: reports are read through this descriptor only (dashboard.reports).
        self.reports = ReportsFolder(reports) if reports is not None else None
        self.history = History(daemon)

    def start(self) -> None:
        self.history.start()

    def close(self) -> None:
        self.history.stop()
        if self.reports is not None:
            self.reports.close()

    def router(self) -> APIRouter:
        router = APIRouter(include_in_schema=False)

        @router.get("/")
        def home() -> Response:
            # A browser pointed at the daemon's address lands on the page (307: the next version may serve more).
            return RedirectResponse(PREFIX + "/", status_code=307)

        @router.get(PREFIX)
        def root() -> Response:
            return RedirectResponse(PREFIX + "/", status_code=308)

        @router.get(PREFIX + "/")
        def page() -> Response:
            return Response(_asset("index.html"), media_type="text/html; charset=utf-8", headers=_headers())

        @router.get(PREFIX + "/static/{name}")
        def asset(name: str) -> Response:
            if name not in ASSETS:
                return error(404, "path", f"no file {name!r} in the dashboard")
            return Response(_asset(name), media_type=ASSETS[name], headers=_headers())

        @router.post(PREFIX + "/login")
        def login(body: LoginIn, request: Request) -> Response:
            if not _same_origin(request):
                return error(403, "origin", "log in from the dashboard's own page")
            made = self.sessions.login(body.token) if self.sessions is not None else None
            if made is None:
                return error(401, "token", "not a valid token (see `corral token create`)")
            session_id, check, token = made
            # The check goes to the page's script (it keeps it in localStorage, which no other port can read).
            answer = JSONResponse({"user": token.user, "check": check}, headers=_headers())
            answer.set_cookie(
                COOKIE, session_id, max_age=SESSION_TTL_S, path="/", httponly=True, samesite="strict",
                secure=_secure(request),
            )  # fmt: skip
            return answer

        @router.post(PREFIX + "/logout")
        def logout(request: Request) -> Response:
            session_id = cookie_value(request.scope.get("headers", ()))
            if session_id and self.sessions is not None:
                self.sessions.logout(session_id)
            answer = Response(status_code=204, headers=_headers())
            answer.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=_secure(request))
            return answer

        @router.get(PREFIX + "/api/me")
        def me(who: Caller) -> dict[str, Any]:
            return {
                "user": who.user,
                "uid": who.uid,
                "root": who.root,
                "via": who.via,
                "reports": self.reports is not None,
                "host": self.daemon.node.name,
            }

        @router.get(PREFIX + "/api/history")
        def history(who: Caller) -> dict[str, Any]:
            """Each GPU's last samples: [epoch s, milli granted, MiB granted, utilisation % or null, MiB used or
            null]; no job or user in them."""
            del who  # any caller: the same totals /v1/gpus shows everyone
            return {
                "every_s": self.history.every_s,
                "columns": ["at", "granted_milli", "granted_memory_mib", "utilization_pct", "used_memory_mib"],
                "gpus": [
                    {
                        "index": index,
                        "samples": [
                            [s.at, s.granted_milli, s.granted_memory_mib, s.utilization_pct, s.used_memory_mib]
                            for s in samples
                        ],
                    }
                    for index, samples in sorted(self.history.snapshot().items())
                ],
            }

        @router.get(PREFIX + "/api/reports")
        def reports(who: Caller) -> Response:
            del who  # reports are what the administrator chose to show every user of the daemon
            if self.reports is None:
                return error(404, "reports", "this daemon shows no reports (corral serve --reports DIR)")
            found = self.reports.list()
            return JSONResponse(
                [{"path": r.path, "size": r.size, "modified": r.modified} for r in found], headers=_headers()
            )

        @router.get(PREFIX + "/reports/{path:path}")
        def report(path: str, who: Caller) -> Response:
            del who
            if self.reports is None:
                return error(404, "reports", "this daemon shows no reports (corral serve --reports DIR)")
            content = self.reports.read(path)
            if content is None:
                return error(404, "path", f"no report {path!r}")
            return Response(
                content,
                media_type="text/html; charset=utf-8",
                headers=_headers(REPORT_CSP, frame="SAMEORIGIN"),
            )

        return router
