"""The thin client's own pieces without a daemon: its tables and lines (corral.cli.render) and its HTTP over a Unix
socket or TCP (corral.cli.transport), against small local servers that record what arrives."""

from __future__ import annotations

import io
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from corral.cli.client import call, read_document
from corral.cli.render import Columns, Styled, Terminal, cut, say, width
from corral.cli.transport import AnswerLost, Endpoint, NotConnected, request, target


def test_columns_align_and_escape() -> None:
    view = Columns("ID", "NAME", "STATE")
    view.add_row("1", "[bold]x\x1b[2J", Styled("running", "green"))
    view.add_row("10", "日本", "queued")
    assert view.lines(color=False, cells=None) == [
        "ID   NAME             STATE",
        "1    [bold]x\\x1b[2J   running",
        "10   日本             queued",  # two wide characters take four cells
    ]


def test_columns_cut_to_the_terminal_and_colour_only_when_asked() -> None:
    view = Columns("ID", "COMMAND")
    view.add_row("1", Styled("a-rather-long-command", "red"))
    assert view.lines(color=False, cells=12) == ["ID   COMMAND", "1    a-rath…"]  # 12 cells
    coloured = view.lines(color=True, cells=None)
    assert coloured[0] == "\x1b[1mID\x1b[0m   \x1b[1mCOMMAND\x1b[0m"
    assert coloured[1] == "1    \x1b[31ma-rather-long-command\x1b[0m"
    assert width("日本x") == 5 and cut("日本xyz", 5) == "日本…"


class FakeStream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize(
    ("tty", "env", "coloured"),
    [
        (True, {}, True),
        (False, {}, False),
        (True, {"NO_COLOR": "1"}, False),
        (True, {"TERM": "dumb"}, False),
        (False, {"FORCE_COLOR": "1"}, True),
    ],
)
def test_lines_are_coloured_on_a_colour_terminal_only(
    monkeypatch: pytest.MonkeyPatch, tty: bool, env: dict[str, str], coloured: bool
) -> None:
    for name in ("NO_COLOR", "FORCE_COLOR", "TERM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    stream = FakeStream(tty)
    monkeypatch.setattr("sys.stderr", stream)
    say(Terminal(stderr=True), Styled("error:", "bold red"), " ", "[x] \x07")
    plain = "error: [x] \\x07\n"
    assert stream.getvalue() == ("\x1b[1;31merror:\x1b[0m [x] \\x07\n" if coloured else plain)


def test_request_targets_are_escaped() -> None:
    assert target("", "/v1/jobs/a b") == "/v1/jobs/a%20b"
    assert target("", "/v1/jobs/x\x1b") == "/v1/jobs/x%1B"
    assert target("/corral", "/marathon/v2/apps/a%2Fb") == "/corral/marathon/v2/apps/a%2Fb"
    assert target("", "/v1/jobs", [("state", "queued"), ("state", "running"), ("since", 1.5)]) == (
        "/v1/jobs?state=queued&state=running&since=1.5"
    )
    assert target("", "/v1/jobs", {"name": "a b&c"}) == "/v1/jobs?name=a%20b%26c"


def test_corral_url_is_checked() -> None:
    assert Endpoint.url("http://h:8470/p/", "t") == Endpoint(host="h", port=8470, prefix="/p", token="t")
    for bad in ("h:8470", "ftp://h:1", "http://:1", "http://h:port"):
        with pytest.raises(ValueError, match=r"http://HOST:PORT|not a port"):
            Endpoint.url(bad, "t")


@pytest.mark.parametrize(
    ("url", "token", "message"),
    [
        (
            "http://127.0.0.1:9",
            "",
            "CORRAL_URL is set but CORRAL_TOKEN is not: create one with `corral token create NAME`",
        ),
        (
            "http://127.0.0.1:9",
            "corral_\u2603",
            "CORRAL_TOKEN: not a token (corral's are printable ASCII, e.g. corral_...)",
        ),
        ("127.0.0.1:9", "corral_x", "CORRAL_URL: expected http://HOST:PORT or https://HOST:PORT, got '127.0.0.1:9'"),
    ],
)
def test_bad_settings_are_one_line_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str, token: str, message: str
) -> None:
    monkeypatch.setenv("CORRAL_URL", url)
    monkeypatch.setenv("CORRAL_TOKEN", token)
    with pytest.raises(SystemExit) as done:
        call(None, "GET", "/v1/jobs")
    assert done.value.code == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_a_files_document_or_one_line_naming_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "app.json"
    good.write_text('{"id": "/web", "cmd": "caf\u00e9"}', encoding="utf-8")
    assert read_document(good) == {"id": "/web", "cmd": "caf\u00e9"}
    latin = tmp_path / "latin1.json"
    latin.write_bytes(b'{"cmd": "caf\xe9"}')  # `corral job create -f` used to end in a UnicodeDecodeError traceback
    cases = {
        tmp_path / "missing.json": f"--file: cannot read {tmp_path / 'missing.json'}: No such file or directory",
        latin: f"--file: {latin} is not UTF-8 text (byte 12), so not JSON",
        good.with_name(
            "bad.json"
        ): f"--file: {good.with_name('bad.json')} is not JSON: Expecting value: line 1 column 2",
    }
    good.with_name("bad.json").write_text("[/infer]")
    for path, message in cases.items():
        with pytest.raises(SystemExit) as done:
            read_document(path)
        assert done.value.code == 2
        assert capsys.readouterr().err.startswith(f"error: {message}"), path


class Recorder(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body})
        payload = json.dumps({"detail": {"field": "job", "message": "no job 7"}}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Corral-Next-Offset", "12")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def tcp_server() -> Iterator[ThreadingHTTPServer]:
    Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_tcp_requests_carry_the_token_json_and_headers(tcp_server: ThreadingHTTPServer) -> None:
    port = tcp_server.server_address[1]
    endpoint = Endpoint.url(f"http://127.0.0.1:{port}", "corral_secret")
    answer = request(
        endpoint, "POST", "/v1/jobs", params={"a": 1}, json={"command": ["true"]}, headers={"Idempotency-Key": "k1"}
    )
    assert answer.status_code == 404 and answer.headers["x-corral-next-offset"] == "12"
    assert answer.json() == {"detail": {"field": "job", "message": "no job 7"}}
    (seen,) = Recorder.seen
    assert seen["method"] == "POST" and seen["path"] == "/v1/jobs?a=1"
    assert seen["headers"]["Authorization"] == "Bearer corral_secret"
    assert seen["headers"]["Idempotency-Key"] == "k1"
    assert seen["headers"]["Content-Type"] == "application/json"
    assert json.loads(seen["body"]) == {"command": ["true"]}


def test_no_daemon_is_not_connected_and_a_dropped_answer_is_lost(tmp_path: Path) -> None:
    with pytest.raises(NotConnected):
        request(Endpoint.unix(str(tmp_path / "none.sock")), "GET", "/v1/jobs")
    path = tmp_path / "drops.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def drop() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.close()  # read the request, never answer

    thread = threading.Thread(target=drop, daemon=True)
    thread.start()
    try:
        with pytest.raises(AnswerLost, match="closed before the whole answer"):
            request(Endpoint.unix(str(path)), "GET", "/v1/jobs")
    finally:
        thread.join(5)
        server.close()
