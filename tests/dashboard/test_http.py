"""The dashboard's HTTP side against a live `corral serve` (no browser): what is open without a token, the login
session and what it may do, the CSP, the reports folder and its edges, the GPU history, and `logs?tail=`."""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.dashboard import ASSETS
from corral.dashboard.reports import MAX_DEPTH
from tests.api.test_serve import wait_for
from tests.mesos.live import Live, live_corral

STATIC = Path(__file__).resolve().parents[2] / "corral" / "dashboard" / "static"


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reports")
    (root / "run").mkdir()
    (root / "run" / "report.html").write_text("<!DOCTYPE html><h1>run report</h1>")
    (root / "online.html").write_text("<!DOCTYPE html><h1>online</h1>")
    (root / "run" / "events.csv").write_text("t,x\n")  # not a report
    deep = root.joinpath(*[f"d{i}" for i in range(MAX_DEPTH + 1)])
    deep.mkdir(parents=True)
    (deep / "deep.html").write_text("too deep")
    outside = tmp_path_factory.mktemp("outside") / "secret.html"
    outside.write_text("<h1>not a report</h1>")
    (root / "link.html").symlink_to(outside)  # a link out of the folder is not served
    return root


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, reports: Path) -> Iterator[Live]:
    with live_corral(tmp_path_factory.mktemp("dash"), "--reports", str(reports)) as running:
        yield running


@pytest.fixture
def anonymous(live: Live) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=30) as client:
        yield client


def login(client: httpx.Client, token: str) -> httpx.Response:
    """Log in as the page does: the cookie goes to the client's jar, the check into its headers."""
    done = client.post("/ui/login", json={"token": token}, headers={"Origin": str(client.base_url).rstrip("/")})
    if done.status_code == 200:
        client.headers["X-Corral-Session"] = done.json()["check"]
    return done


def test_the_page_and_its_assets_need_no_token_and_carry_a_strict_csp(anonymous: httpx.Client) -> None:
    page = anonymous.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    for name, kind in ASSETS.items():
        got = anonymous.get(f"/ui/static/{name}")
        assert got.status_code == 200 and got.headers["content-type"] == kind
        assert got.headers["content-security-policy"] == csp
    assert anonymous.get("/ui", follow_redirects=False).headers["location"] == "/ui/"
    # nothing but the listed assets: not the package's Python, not a path out of static/
    for name in ("__init__.py", "..%2F__init__.py", "index.html.bak"):
        assert anonymous.get(f"/ui/static/{name}").status_code == 404
    # the data is not open
    for path in ("/ui/api/me", "/ui/api/history", "/ui/api/reports", "/ui/reports/online.html", "/v1/jobs"):
        assert anonymous.get(path).status_code == 401, path


def test_the_assets_load_nothing_from_elsewhere_and_never_write_markup() -> None:
    # The browser test records every request the page makes; this names the rules in the source as well.
    page = (STATIC / "index.html").read_text()
    for ref in re.findall(r'(?:src|href)="([^"]*)"', page):
        assert ref.startswith(("/ui/static/", "#", "data:")), ref
    script = (STATIC / "app.js").read_text()
    for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert banned not in script, banned
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", script + (STATIC / "style.css").read_text())


def test_login_gives_a_read_only_session_that_logout_and_revocation_end(live: Live, anonymous: httpx.Client) -> None:
    assert login(anonymous, "corral_not-a-token").status_code == 401
    assert anonymous.cookies.get("corral_ui") is None
    # a page elsewhere cannot log the browser in (a forged login), nor post a form
    forged = anonymous.post("/ui/login", json={"token": live.token}, headers={"Origin": "http://evil.example"})
    assert forged.status_code == 403 and forged.json()["detail"]["field"] == "origin"
    form = anonymous.post(
        "/ui/login", content=f"token={live.token}", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert form.status_code == 415

    done = login(anonymous, live.token)
    assert done.status_code == 200, done.text
    cookie = done.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert live.token not in cookie  # the browser keeps a session id, not the bearer token
    me = anonymous.get("/ui/api/me").json()
    assert me["via"] == "session" and me["reports"] is True
    assert anonymous.get("/v1/jobs").status_code == 200
    # The cookie alone, as a browser would send it to a server of another user on another port of this host (cookies
    # ignore ports): nothing but the reports, which an iframe must load without a header.
    check = anonymous.headers.pop("X-Corral-Session")
    for path in ("/ui/api/me", "/v1/jobs", "/v1/gpus", "/ui/api/reports"):
        assert anonymous.get(path).status_code == 401, path
        assert anonymous.get(path, headers={"X-Corral-Session": check[::-1]}).status_code == 401, path
    assert anonymous.get("/ui/reports/online.html").status_code == 200
    anonymous.headers["X-Corral-Session"] = check
    # the cookie never authorises a write: a forged cross-site POST could not cancel or submit anything
    submit = anonymous.post("/v1/jobs", json={"command": ["true"]})
    assert submit.status_code == 401
    assert anonymous.post("/v1/jobs/cancel", json={"state": "queued"}).status_code == 401
    # tokens are never reachable through a session
    assert anonymous.get("/v1/tokens").status_code == 403

    assert anonymous.post("/ui/logout").status_code == 204
    assert anonymous.get("/ui/api/me").status_code == 401

    # a revoked token ends its sessions at once
    with httpx.Client(transport=httpx.HTTPTransport(uds=live.local.env["CORRAL_SOCKET"]), timeout=30) as unix:
        made = unix.post("http://corral/v1/tokens", json={"name": "browser"}).json()
        assert login(anonymous, made["token"]).status_code == 200
        assert anonymous.get("/ui/api/me").status_code == 200
        assert unix.delete(f"http://corral/v1/tokens/{made['id']}").status_code == 204
    assert anonymous.get("/ui/api/me").status_code == 401


def test_over_the_socket_the_caller_needs_no_login(live: Live) -> None:
    sock = live.local.env["CORRAL_SOCKET"]
    with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://corral", timeout=30) as unix:
        assert unix.get("/ui/").status_code == 200
        me = unix.get("/ui/api/me").json()
        assert me["via"] == "unix" and me["user"]
        # a browser through a forwarded port (ssh -L 8470:SOCKET), as the page asks
        browser = {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}
        for host in ("127.0.0.1:8470", "localhost:8470", "[::1]:8470"):
            assert unix.get("/v1/jobs", headers={**browser, "Host": host}).status_code == 200, host
        # a page elsewhere that rebound its name to 127.0.0.1 reads nothing through that port, whatever it sends
        for host in ("evil.example:8470", "127.0.0.1.evil.example", "corral.example", "localhost.evil.example"):
            for extra in (browser, {"Origin": f"http://{host}"}, {}):
                refused = unix.get("/ui/api/me", headers={**extra, "Host": host})
                assert refused.status_code == 421 and refused.json()["detail"] == {
                    "field": "host",
                    "message": f"Host {host!r} is not this machine: over the Unix socket, Host must be corral, "
                    "localhost, 127.0.0.1 or [::1] (any port), or be left out; a browser reaches a forwarded socket "
                    "as http://localhost:PORT or http://127.0.0.1:PORT",
                }, (host, extra)


def test_reports_are_the_folders_html_files_served_sandboxed(live: Live) -> None:
    with live.http() as client:
        listed = [r["path"] for r in client.get("/ui/api/reports").json()]
        assert listed == ["online.html", "run/report.html"]
        got = client.get("/ui/reports/run/report.html")
        assert got.status_code == 200 and "run report" in got.text
        csp = got.headers["content-security-policy"]
        assert "sandbox" in csp and "default-src 'none'" in csp and "script-src" not in csp
        for path in ("link.html", "run/events.csv", "../outside/secret.html", "run/../../x.html", "nope.html",
                     "d0/d1/d2/d3/deep.html", "%2e%2e/secret.html"):  # fmt: skip
            answer = client.get(f"/ui/reports/{path}")
            assert answer.status_code == 404, path
            assert "not a report" not in answer.text


def test_gpu_history_follows_the_grants(live: Live) -> None:
    job = live.local.submit("--gpu-fraction", "0.5", "--gpu-memory", "10GiB", "--", "sleep", "30")
    try:
        with live.http() as client:

            def granted() -> bool:
                gpus = client.get("/ui/api/history").json()["gpus"]
                return any(g["samples"] and g["samples"][-1][1:3] == [500, 10240] for g in gpus)

            wait_for("a sample with the share", granted)
            body = client.get("/ui/api/history").json()
            assert body["columns"][:3] == ["at", "granted_milli", "granted_memory_mib"]
            # totals only: no job, no user in it
            assert set(body) == {"every_s", "columns", "gpus"}
            assert all(set(g) == {"index", "samples"} and all(len(s) == 5 for s in g["samples"]) for g in body["gpus"])
    finally:
        live.local.run("cancel", job, ok=False)


def test_logs_tail_answers_the_last_bytes_and_where_to_go_on(live: Live) -> None:
    job = live.local.submit("--", "sh", "-c", "seq 1 2000")
    wait_for("the job to end", lambda: live.local.state(job) == "succeeded")
    with live.http() as client:
        whole = client.get(f"/v1/jobs/{job}/logs").content
        tail = client.get(f"/v1/jobs/{job}/logs", params={"tail": 10})
        assert tail.content == whole[-10:] == b"\n1999\n2000\n"[-10:]
        assert tail.headers["x-corral-next-offset"] == str(len(whole))
        assert client.get(f"/v1/jobs/{job}/logs", params={"tail": 10**9}).status_code == 422
        assert client.get(f"/v1/jobs/{job}/logs", params={"tail": 100000}).content == whole


def test_the_daemons_address_leads_to_the_page(live: Live, anonymous: httpx.Client) -> None:
    # Before: `/` answered a JSON 404 ("Not Found"); a browser pointed at the daemon now lands on the dashboard.
    home = anonymous.get("/", follow_redirects=False)
    assert home.status_code == 307 and home.headers["location"] == "/ui/"
    page = anonymous.get("/", follow_redirects=True)
    assert page.url.path == "/ui/" and page.status_code == 200
    sock = live.local.env["CORRAL_SOCKET"]
    with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://corral", timeout=30) as unix:
        answer = unix.get("/", follow_redirects=False)
        assert answer.status_code == 307 and answer.headers["location"] == "/ui/"


def _cancel(client: httpx.Client, job: str, **headers: str) -> httpx.Response:
    return client.post(f"/v1/jobs/{job}/cancel", headers=headers)


def test_a_session_cancels_its_own_job_only_with_the_check_from_the_page(live: Live, anonymous: httpx.Client) -> None:
    job = live.local.submit("--", "sleep", "300")
    try:
        assert login(anonymous, live.token).status_code == 200
        origin = str(anonymous.base_url).rstrip("/")
        check = anonymous.headers.pop("X-Corral-Session")
        # a forged cancel: the cookie alone (a form on another site), a wrong check, the check from another origin
        assert _cancel(anonymous, job).status_code == 401
        assert _cancel(anonymous, job, **{"X-Corral-Session": check[::-1]}).status_code == 401
        refused = _cancel(anonymous, job, **{"X-Corral-Session": check, "Origin": "http://evil.example"})
        assert refused.status_code == 401
        assert refused.json()["detail"]["message"] == "a bearer token is required over TCP (see `corral token create`)"
        assert _cancel(anonymous, job, **{"X-Corral-Session": check, "Sec-Fetch-Site": "cross-site"}).status_code == 401
        assert live.local.state(job) == "running"
        # the page's own request: the cookie, the check, its own origin
        done = _cancel(anonymous, job, **{"X-Corral-Session": check, "Origin": origin, "Sec-Fetch-Site": "same-origin"})
        assert done.status_code == 200, done.text
        assert done.json()["state"] in ("cancelled", "running")  # running: being stopped
        wait_for("the cancel", lambda: live.local.state(job) == "cancelled")
    finally:
        live.local.run("cancel", job, ok=False)
        anonymous.post("/ui/logout")


def test_a_session_cannot_cancel_another_users_job(live: Live, anonymous: httpx.Client) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: a token for another user (nobody)")
    job = live.local.submit("--", "sleep", "300")
    try:
        sock = live.local.env["CORRAL_SOCKET"]
        with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://corral", timeout=30) as unix:
            made = unix.post("/v1/tokens", json={"name": "other", "user": "nobody"})
            assert made.status_code == 201, made.text
        assert login(anonymous, made.json()["token"]).status_code == 200
        refused = _cancel(anonymous, job, Origin=str(anonymous.base_url).rstrip("/"))
        assert refused.status_code == 404 and refused.json()["detail"]["message"] == f"no job {job}"
        assert live.local.state(job) == "running"
    finally:
        live.local.run("cancel", job, ok=False)
        anonymous.post("/ui/logout")


def test_over_the_socket_a_page_of_another_site_cannot_write(live: Live) -> None:
    # Before: through a forwarded port (ssh -L 8470:SOCKET) any site the user visited could post a form that cancelled
    # their job (200) or made a Marathon app running its own command (201): the socket needs no token.
    job = live.local.submit("--", "sleep", "300")
    sock = live.local.env["CORRAL_SOCKET"]
    port = {"Host": "127.0.0.1:8470"}
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://corral", timeout=30) as unix:
            for forged in (
                {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"},
                {"Origin": "http://127.0.0.1:9999", "Sec-Fetch-Site": "same-site"},  # another port: the same site
                {"Origin": "null"},  # a sandboxed frame or a file
                {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"},
            ):
                refused = unix.post(f"/v1/jobs/{job}/cancel", headers={**port, **forged})
                assert refused.status_code == 403, (forged, refused.text)
                assert refused.json()["detail"] == {
                    "field": "origin",
                    "message": "a page of another site may not write through the socket (Origin or Sec-Fetch-Site"
                    " says it is one)",
                }
                app = b'{"id": "/forged", "cmd": "touch /tmp/forged", "cpus": 0.1, "mem": 32}'
                made = unix.post(
                    "/marathon/v2/apps", content=app, headers={**port, **forged, "Content-Type": "text/plain"}
                )
                assert made.status_code == 403, made.text
            assert live.local.state(job) == "running"
            # reads from elsewhere stay open (a link to the page); the page's own writes, and the CLI's, go through
            link = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
            assert unix.get("/ui/", headers={**port, **link}).status_code == 200
            own = {"Origin": "http://127.0.0.1:8470", "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}
            done = unix.post(f"/v1/jobs/{job}/cancel", headers={**port, **own})
            assert done.status_code == 200, done.text
            wait_for("the cancel", lambda: live.local.state(job) == "cancelled")
            assert unix.get("/marathon/v2/apps").json()["apps"] == []
    finally:
        live.local.run("cancel", job, ok=False)


def test_a_report_flipped_to_a_link_to_a_root_only_file_is_never_served(live: Live, reports: Path) -> None:
    """Issue 23, finding 2, through the route: the old check-then-open served the link's target in some answers."""
    secret = reports.parent / "shadow"
    secret.write_text("root:$6$not-for-the-dashboard")
    os.chown(secret, 0, 0)
    secret.chmod(0o600)
    flip = reports / "flip"
    flip.mkdir()
    (flip / "r.html").write_text("<h1>flipped report</h1>")
    stop = threading.Event()

    def flipper() -> None:
        while not stop.is_set():
            (flip / "l.tmp").symlink_to(secret)
            os.replace(flip / "l.tmp", flip / "r.html")
            (flip / "f.tmp").write_text("<h1>flipped report</h1>")
            os.replace(flip / "f.tmp", flip / "r.html")

    thread = threading.Thread(target=flipper)
    thread.start()
    statuses: dict[int, int] = {}
    try:
        with httpx.Client(
            transport=httpx.HTTPTransport(uds=live.local.env["CORRAL_SOCKET"]), base_url="http://corral", timeout=30
        ) as unix:
            for _ in range(1000):
                got = unix.get("/ui/reports/flip/r.html")
                statuses[got.status_code] = statuses.get(got.status_code, 0) + 1
                assert "not-for-the-dashboard" not in got.text
                assert (got.status_code, got.text) == (200, "<h1>flipped report</h1>") or got.status_code == 404
    finally:
        stop.set()
        thread.join()
        shutil.rmtree(flip)
        secret.unlink()
    assert statuses.get(200, 0) > 0, statuses
