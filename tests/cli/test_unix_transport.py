"""The thin client's own HTTP/1.1 over the daemon's Unix socket (corral.cli.transport): what it sends, the answers
it reads whole (a length, chunks, or the end of the connection), the ones it reports as lost, and that a submission
imports no http.client, ssl or email (issue 26, item 7: Python's start is most of what `corral submit` costs)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.cli.transport import AnswerLost, Endpoint, request
from tests.cli.test_startup import loaded_after


class OneAnswer:
    """A Unix socket that reads one request (its head and its Content-Length body) and writes `raw` back."""

    def __init__(self, path: Path, raw: bytes) -> None:
        self.path, self.raw = path, raw
        self.seen = b""
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(1)
        self.thread = threading.Thread(target=self.answer, daemon=True)
        self.thread.start()

    def answer(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            while b"\r\n\r\n" not in self.seen:
                self.seen += conn.recv(65536)
            head, _, body = self.seen.partition(b"\r\n\r\n")
            length = next((int(v) for k, _, v in (ln.partition(b": ") for ln in head.split(b"\r\n"))
                           if k.lower() == b"content-length"), 0)  # fmt: skip
            while len(body) < length:
                body += conn.recv(65536)
            self.seen = head + b"\r\n\r\n" + body
            conn.sendall(self.raw)

    def close(self) -> None:
        self.thread.join(5)
        self.server.close()


Answering = Callable[[bytes], OneAnswer]


@pytest.fixture
def answering(tmp_path: Path) -> Iterator[Answering]:
    made: list[OneAnswer] = []

    def make(raw: bytes) -> OneAnswer:
        made.append(OneAnswer(tmp_path / f"d{len(made)}.sock", raw))
        return made[-1]

    yield make
    for server in made:
        server.close()


def test_a_submission_goes_out_as_http_1_1_with_its_json_and_headers(answering: Answering) -> None:
    daemon = answering(b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 11\r\n"
                       b"X-Corral-Next-After: 7\r\n\r\n{\"id\": \"3\"}")  # fmt: skip
    answer = request(Endpoint.unix(str(daemon.path)), "POST", "/v1/jobs", json={"command": ["true", "é"]},
                     headers={"Idempotency-Key": "k1"})  # fmt: skip
    assert answer.status_code == 201 and answer.json() == {"id": "3"}
    assert answer.headers["x-corral-next-after"] == "7" and answer.headers.get("X-CORRAL-NEXT-AFTER") == "7"
    head, _, body = daemon.seen.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/jobs HTTP/1.1"
    assert {"Host: corral", "Connection: close", "Idempotency-Key: k1", "Content-Type: application/json",
            f"Content-Length: {len(body)}"} <= set(lines)  # fmt: skip
    assert body.decode() == '{"command":["true","é"]}'


def test_chunks_and_an_answer_that_ends_with_the_connection_are_read_whole(answering: Answering) -> None:
    chunked = answering(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b"4\r\nbefo\r\n6;x=1\r\nre\nend\r\n0\r\n\r\n")  # fmt: skip
    assert request(Endpoint.unix(str(chunked.path)), "GET", "/v1/jobs/1/log").content == b"before\nend"
    to_the_end = answering(b"HTTP/1.1 404 Not Found\r\n\r\nno job 9")
    answer = request(Endpoint.unix(str(to_the_end.path)), "GET", "/v1/jobs/9")
    assert answer.status_code == 404 and answer.text == "no job 9"


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n[1, 2",  # fewer bytes than it said
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",  # a chunk cut short
        b"HTTP/1.1 200 OK\r\nContent-Le",  # the head cut short
    ],
)
def test_an_answer_cut_short_is_lost(answering: Answering, raw: bytes) -> None:
    daemon = answering(raw)
    with pytest.raises(AnswerLost, match="the connection closed before the whole answer came"):
        request(Endpoint.unix(str(daemon.path)), "GET", "/v1/jobs")


def test_a_header_that_would_end_early_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="invalid HTTP header 'Idempotency-Key'"):
        request(Endpoint.unix(str(tmp_path / "none.sock")), "POST", "/v1/jobs", json={},
                headers={"Idempotency-Key": "k\r\nX-Evil: 1"})  # fmt: skip


def test_a_submission_over_the_socket_imports_no_http_client(tmp_path: Path) -> None:
    """`corral submit` against a socket where nothing listens: the whole submit path runs, up to its connection."""
    modules = loaded_after(
        "from corral.cli.main import main\nmain()", "submit", "--", "true",
        env={"CORRAL_SOCKET": str(tmp_path / "none.sock"), "CORRAL_URL": ""},
    )  # fmt: skip
    assert "corral.cli.transport" in modules
    assert [m for m in modules if m.split(".")[0] in ("http", "ssl", "email")] == []
