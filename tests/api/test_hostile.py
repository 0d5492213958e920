"""The hostile-input corpus (tests/api/hostile_corpus.py) against every API of a `corral serve` started here:
corral's own (/v1/jobs, /v1/definitions), Metronome, Chronos and Marathon.

For every request: no 5xx; a 4xx comes in the shape of the face that owns the route; what was accepted is read back
(and then deleted) and holds no garbage. After each API: the SQLite file itself holds no garbage (no NUL, no lone
surrogate, no number beyond the limits), and the daemon still serves. The counts go to the test's output.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import signal
import socket
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.api.limits import MAX_JSON_INT
from corral.model.limits import MAX_ARG_BYTES, MAX_COMMAND_BYTES, text_problem
from tests.api import hostile_corpus as corpus
from tests.api.test_serve import CLI, _children, wait_for


@dataclass
class Tally:
    attempts: int = 0
    server_errors: list[str] = field(default_factory=list)
    wrong_shape: list[str] = field(default_factory=list)
    garbage: list[str] = field(default_factory=list)
    accepted: int = 0

    def line(self) -> str:
        return (
            f"hostile corpus: {self.attempts} attempts, {len(self.server_errors)} 5xx, {len(self.wrong_shape)} answers "
            f"in the wrong shape, {self.accepted} accepted (read back and deleted), {len(self.garbage)} garbage found"
        )


def garbage_in(value: Any, where: str = "") -> list[str]:
    """What no stored or answered document may hold: NUL, a lone surrogate, oversized text, numbers past the limits."""
    found: list[str] = []
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            why = text_problem(item)
            if why is not None or len(item.encode("utf-8", "surrogatepass")) > MAX_COMMAND_BYTES:
                found.append(f"{at}: {why or 'oversized'} ({item[:40]!r})")
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if abs(item) > MAX_JSON_INT:
                found.append(f"{at}: an integer of {len(str(item))} digits")
        elif isinstance(item, float):
            if not math.isfinite(item) or abs(item) > 1e15:
                found.append(f"{at}: {item!r}")
        elif isinstance(item, dict):
            for k, v in item.items():
                stack.append((k, f"{at}/<key>"))
                stack.append((v, f"{at}/{k}"))
        elif isinstance(item, list):
            stack.extend((v, f"{at}/{i}") for i, v in enumerate(item))
    return found


def shape_ok(face: str, status: int, body: Any) -> bool:
    if face in ("corral", "definitions"):
        detail = body.get("detail") if isinstance(body, dict) else None
        return (
            isinstance(detail, dict) and isinstance(detail.get("field"), str) and isinstance(detail.get("message"), str)
        )
    if not isinstance(body, dict) or not isinstance(body.get("message"), str):
        return False
    details = body.get("details")
    return details is None or all(isinstance(d.get("path"), str) and isinstance(d.get("errors"), list) for d in details)


def face_of(path: str) -> str:
    for face in ("metronome", "marathon", "chronos"):
        if path.startswith(f"/{face}"):
            return face
    return "definitions" if path.startswith("/v1/definitions") else "corral"


LISTINGS = {
    "corral": ["/v1/jobs?all=true"],
    "definitions": ["/v1/definitions"],
    "metronome": ["/metronome/v1/jobs", "/metronome/v1/queue"],
    "chronos": ["/chronos/v1/scheduler/jobs"],
    "marathon": ["/marathon/v2/apps"],
}


def put(doc: dict[str, Any], where: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    target: Any = out
    for part in where[:-1]:
        target = target[part]
    last = where[-1]
    if isinstance(last, str) and last.startswith("*"):  # the value becomes a key of the dict
        old = target.pop(last[1:])
        if isinstance(value, str):
            target[value] = old
        return out
    if isinstance(target, list) and isinstance(last, int) and last >= len(target):
        target.append(value)
    else:
        target[last] = value
    return out


class Driver:
    def __init__(self, sock: Path, state: Path, tally: Tally) -> None:
        self.sock = sock
        self.state = state
        self.tally = tally
        self.client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://corral", timeout=30)

    def send(self, method: str, url: str, content: bytes | None = None) -> httpx.Response:
        self.tally.attempts += 1
        headers = {"content-type": "application/json"} if content is not None else {}
        try:
            r = self.client.request(method, url, content=content, headers=headers)
        except httpx.TransportError as exc:  # the daemon dropped the connection: a crash, or an unanswered request
            self.tally.server_errors.append(f"{method} {url[:80]} {(content or b'')[:80]!r}: no answer ({exc})")
            self.client.close()
            self.client = httpx.Client(
                transport=httpx.HTTPTransport(uds=str(self.sock)), base_url="http://corral", timeout=30
            )
            return httpx.Response(599, text="no answer")
        what = f"{method} {url[:80]} {(content or b'')[:80]!r} -> {r.status_code} {r.text[:200]}"
        if r.status_code >= 500:
            self.tally.server_errors.append(what)
        elif r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = None
            if not shape_ok(face_of(url), r.status_code, body):
                self.tally.wrong_shape.append(what)
        return r

    def accepted(self, face: str, r: httpx.Response, doc: Any) -> None:
        """Read back what was accepted, check it, and delete it (so the next case meets no 409)."""
        self.tally.accepted += 1
        reads: list[str] = []
        deletes: list[tuple[str, str]] = []
        if face == "corral":
            job = r.json()
            reads = [f"/v1/jobs/{job['id']}"]
            deletes = [("POST", f"/v1/jobs/{job['id']}/cancel")]
            command = job["command"]
            if sum(len(a.encode("utf-8", "surrogatepass")) + 1 for a in command) > MAX_COMMAND_BYTES or any(
                len(a.encode("utf-8", "surrogatepass")) > MAX_ARG_BYTES for a in command
            ):
                self.tally.garbage.append(f"job {job['id']}: a command past the limits was accepted")
        elif face == "definitions":
            name = r.json()["name"]
            reads, deletes = [f"/v1/definitions/{name}"], [("DELETE", f"/v1/definitions/{name}?stop_runs=true")]
        elif face == "metronome":
            jid = r.json()["id"]
            reads = [f"/metronome/v1/jobs/{jid}"]
            deletes = [("DELETE", f"/metronome/v1/jobs/{jid}?stopCurrentJobRuns=true")]
        elif face == "chronos":
            reads = ["/chronos/v1/scheduler/jobs"]
            for listed in self.client.get("/chronos/v1/scheduler/jobs").json():
                deletes.append(("DELETE", f"/chronos/v1/scheduler/job/{listed['name']}"))
        elif face == "marathon":
            app = r.json()["id"]
            reads, deletes = [f"/marathon/v2/apps{app}"], [("DELETE", f"/marathon/v2/apps{app}")]
        for url in reads:
            got = self.send("GET", url)
            if got.status_code != 200:
                self.tally.server_errors.append(f"read back {url}: {got.status_code} {got.text[:200]}")
            else:
                self.tally.garbage += [f"{url}: {g}" for g in garbage_in(got.json())]
        for method, url in deletes:
            self.send(method, url)

    def stored_garbage(self) -> list[str]:
        """Every job spec and document in the daemon's SQLite file, decoded and checked."""
        db = sqlite3.connect(f"file:{self.state / 'jobs.db'}?mode=ro", uri=True)
        try:
            rows = [(f"job {i}", s) for i, s in db.execute("SELECT id, spec FROM jobs")]
            rows += [(f"{k} {key}", b) for k, key, b in db.execute("SELECT kind, key, body FROM docs")]
        finally:
            db.close()
        found = []
        for what, text in rows:
            found += [f"{what}: {g}" for g in garbage_in(json.loads(text))]
        return found

    def alive(self) -> bool:
        return self.client.get("/v1/jobs").status_code == 200


def raw_exchange(sock: Path, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(sock))
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:  # the server may close first (it refused the request line or the headers)
            pass
        out = b""
        try:
            while len(out) < 65536:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except OSError:
            pass
    return out


@pytest.fixture(scope="module")
def daemon() -> Iterator[tuple[Path, Path]]:
    """`corral serve` on simulated GPUs, its output to a file (a pipe nobody reads would fill and stall it)."""
    with tempfile.TemporaryDirectory(prefix="corral-hostile-") as tmp:
        state, sock, log = Path(tmp) / "state", Path(tmp) / "corral.sock", Path(tmp) / "daemon.log"
        with log.open("w") as output:
            server = subprocess.Popen(
                [*CLI, "serve", "--simulate-gpus", "2xA100-80GB", "--state-dir", str(state), "--socket", str(sock)],
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_for("the socket", lambda: sock.exists() or server.poll() is not None, timeout=30)
            assert server.poll() is None, log.read_text()
            yield sock, state
            assert server.poll() is None, f"the daemon died: {log.read_text()[-3000:]}"
            assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
        finally:
            jobs = _children(server.pid)
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            for group in jobs:
                with contextlib.suppress(OSError):
                    os.killpg(group, signal.SIGKILL)


@pytest.mark.parametrize("face", list(corpus.TEMPLATES))
def test_hostile_corpus_against_each_api(
    face: str, daemon: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    sock, state = daemon
    tally = Tally()
    driver = Driver(sock, state, tally)
    method, url, template = corpus.TEMPLATES[face]
    ok = driver.send(method, url, json.dumps(template).encode())
    assert ok.status_code in (200, 201, 204), f"the template itself is refused: {ok.text}"
    driver.accepted(face, ok, template)
    for where in corpus.FIELDS[face]:
        for value in corpus.VALUES:
            doc = put(template, where, value)
            r = driver.send(method, url, json.dumps(doc).encode())
            if r.status_code < 300:
                if os.environ.get("CORRAL_HOSTILE_SHOW"):
                    print("ACCEPTED", face, where, repr(value)[:60])
                driver.accepted(face, r, doc)
    for raw in corpus.RAW_BODIES:
        r = driver.send(method, url, raw)
        if r.status_code < 300:
            driver.accepted(face, r, raw)
    if face in corpus.UPDATES:
        created = driver.send(method, url, json.dumps(template).encode())
        assert created.status_code in (200, 201), created.text
        put_method, put_url, partial, places = corpus.UPDATES[face]
        for where in places:
            for value in corpus.VALUES:
                r = driver.send(put_method, put_url, json.dumps(put(partial, where, value)).encode())
                if r.status_code < 300:
                    tally.accepted += 1
                    got = driver.send("GET", put_url)
                    tally.garbage += [f"{put_url}: {g}" for g in garbage_in(got.json())]
                    if face == "marathon" and got.json()["app"]["instances"] > 1000:
                        tally.garbage.append(f"{put_url}: instances {got.json()['app']['instances']}")
        driver.accepted(face, created, template)  # read back and delete
    for listing in LISTINGS[face]:  # every object each API lists, read back once more (besides the one read after each)
        got = driver.send("GET", listing)
        tally.garbage += [f"{listing}: {g}" for g in garbage_in(got.json())] if got.status_code == 200 else []
    tally.garbage += driver.stored_garbage()
    alive = driver.alive()
    with capsys.disabled():
        print(f"\n[{face}] {tally.line()}; {'still serving' if alive else 'NOT SERVING'}")
    assert alive, "the daemon stopped serving"
    assert not tally.server_errors, "\n".join(tally.server_errors[:20])
    assert not tally.wrong_shape, "\n".join(tally.wrong_shape[:20])
    assert not tally.garbage, "\n".join(tally.garbage[:20])


def test_hostile_paths_methods_and_raw_requests(daemon: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    sock, state = daemon
    tally = Tally()
    driver = Driver(sock, state, tally)
    for path in corpus.PATHS:
        driver.send("GET", path)
        driver.send("PATCH", path, b"{}")
    statuses = []
    for data in corpus.RAW_REQUESTS:
        tally.attempts += 1
        answer = raw_exchange(sock, data)
        status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
        statuses.append(status)
        if status >= 500:
            tally.server_errors.append(f"raw {data[:60]!r} -> {answer[:200]!r}")
    alive = driver.alive()
    tally.garbage += driver.stored_garbage()
    with capsys.disabled():
        print(f"\n[paths and raw requests] {tally.line()}; raw answers {statuses} (0: closed without an answer)")
    assert alive, "the daemon stopped serving"
    assert not tally.server_errors, "\n".join(tally.server_errors[:20])
    assert not tally.wrong_shape, "\n".join(tally.wrong_shape[:20])
    assert not tally.garbage, "\n".join(tally.garbage[:20])


def test_hostile_queues_files_are_refused_naming_the_bound(
    daemon: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    sock, state = daemon
    tally = Tally()
    driver = Driver(sock, state, tally)
    path = state / "queues.toml"  # the daemon's default location (started without --queues)
    try:
        for text in corpus.QUEUE_FILES:
            path.write_text(text, encoding="utf-8", errors="surrogatepass")
            r = driver.send("POST", "/v1/queues/reload")
            assert 400 <= r.status_code < 500, r.text[:300]
            assert r.json()["detail"]["field"] == "queues"
            assert r.json()["detail"]["message"].endswith("; the old configuration stays")
    finally:
        path.unlink(missing_ok=True)
    alive = driver.alive()
    with capsys.disabled():
        print(f"\n[queues files] {tally.line()}; {'still serving' if alive else 'NOT SERVING'}")
    assert alive and not tally.server_errors and not tally.wrong_shape, tally.server_errors + tally.wrong_shape
    assert not driver.client.get("/v1/queues").json()["fair_share"]  # none of them took
