"""The CLI against a real `corral serve`: user-supplied text is printed literally, and a submission whose answer is
lost is sent again under the same Idempotency-Key (one job, not two)."""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from corral.cli.render import escaped, literal, say
from tests.api.test_serve import Corral, serving, wait_for


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Corral, Path]]:
    tmp = tmp_path_factory.mktemp("literal")
    with serving(tmp / "corral.sock", tmp / "state") as (client, _):
        client.env["COLUMNS"] = "400"  # wide enough that no cell is cut
        yield client, tmp


@pytest.fixture
def corral(daemon: tuple[Corral, Path]) -> Corral:
    return daemon[0]


def api(corral: Corral) -> httpx.Client:
    """The daemon's API without a CLI process per call (each costs a Python start-up)."""
    sock = corral.env["CORRAL_SOCKET"]
    return httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://corral", timeout=30)


def submit_and_finish(corral: Corral, **body: object) -> str:
    with api(corral) as client:
        job = client.post("/v1/jobs", json={"cpus": "100m", "memory": "16MiB", **body}).json()["id"]
        wait_for("the job to end", lambda: client.get(f"/v1/jobs/{job}").json()["state"] == "succeeded")
    return str(job)


def test_escaped() -> None:
    assert escaped("[/bold] ok") == "[/bold] ok"
    assert escaped("a\x1b[31mb\x07\n\t\x7f\x9b") == "a\\x1b[31mb\\x07\\n\\t\\x7f\\x9b"
    assert escaped("x\ud800") == "x\\ud800"
    assert escaped("\u202eevil") == "\\u202eevil"
    assert escaped("two\nlines", lines=True) == "two\nlines"
    assert escaped(None) == "" and escaped(3) == "3" and escaped("😀 é") == "😀 é"


def test_say_never_reads_markup_or_emoji() -> None:
    console = Console(record=True, width=200, color_system="truecolor", force_terminal=True)
    say(console, "name: ", "[/bold] [bold red]x[/bold red] :skull:")
    console.print(literal("[red]y[/red]"))
    text = console.export_text(styles=True)
    assert "[/bold] [bold red]x[/bold red] :skull:" in text and "[red]y[/red]" in text
    assert "\x1b[1;31m" not in text and "💀" not in text


def test_ps_show_and_explain_print_markup_and_escapes_literally(corral: Corral) -> None:
    name, command = "[/bold][bold red]owned[/bold red]", ["echo", "\x1b[2J\x1b[31mred", "\u202e"]
    job = submit_and_finish(corral, name=name, command=command)
    for args in (("ps", "--all"), ("show", job)):
        done = corral.run(*args)
        assert "[/bold][bold red]owned[/bold red]" in done.stdout, done.stdout
        assert "echo '\\x1b[2J\\x1b[31mred' '\\u202e'" in done.stdout, done.stdout  # quoted as a shell would
        assert "\x1b" not in done.stdout and "\u202e" not in done.stdout
    assert "succeeded" in corral.run("explain", job).stdout


def test_a_lone_surrogate_stored_by_an_older_corral_lists_and_shows(daemon: tuple[Corral, Path]) -> None:
    corral, tmp = daemon
    job = submit_and_finish(corral, name="fine", command=["true"])
    db = sqlite3.connect(tmp / "state" / "jobs.db")
    try:
        (text,) = db.execute("SELECT spec FROM jobs WHERE id = ?", (int(job),)).fetchone()
        spec = json.loads(text)
        spec["name"], spec["command"] = "x\ud800", ["echo", "\udfff"]
        db.execute("UPDATE jobs SET spec = ? WHERE id = ?", (json.dumps(spec), int(job)))
        db.commit()
    finally:
        db.close()
    for args in (("ps", "--all"), ("show", job)):
        done = corral.run(*args)
        assert "x\\ud800" in done.stdout and "echo '\\udfff'" in done.stdout, done.stdout
    with api(corral) as client:
        assert client.get(f"/v1/jobs/{job}").json()["name"] == "x\\ud800"


def _read_message(conn: socket.socket) -> bytes:
    """One HTTP/1.1 message (headers and a Content-Length body) from `conn`."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class LosingProxy:
    """A Unix socket in front of the daemon's: the first request reaches the daemon, but its answer is dropped."""

    def __init__(self, path: Path, daemon: Path) -> None:
        self.daemon = daemon
        self.requests = 0
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                request = _read_message(conn)
                if not request:
                    continue
                self.requests += 1
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as up:
                    up.connect(str(self.daemon))
                    up.sendall(request)
                    answer = _read_message(up)
                if self.requests > 1:
                    conn.sendall(answer)
                # the first answer is lost: the connection closes without it

    def close(self) -> None:
        self.server.close()


def test_submit_resends_after_a_lost_answer_and_makes_one_job(corral: Corral, tmp_path: Path) -> None:
    proxy = LosingProxy(tmp_path / "lossy.sock", Path(corral.env["CORRAL_SOCKET"]))
    try:
        done = corral.run("submit", "--socket", str(tmp_path / "lossy.sock"), "--name", "once", "--", "true", ok=False)
    finally:
        proxy.close()
    assert done.returncode == 0, done.stderr
    assert proxy.requests == 2  # the request went out twice ...
    with api(corral) as client:
        jobs = [j for j in client.get("/v1/jobs").json() if j["name"] == "once"]
    assert len(jobs) == 1 and done.stdout.strip() == jobs[0]["id"]  # ... and made one job
