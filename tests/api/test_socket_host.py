"""Host on the Unix socket (issue 23, finding 8): DNS rebinding through `ssh -L PORT:SOCKET`. A page on evil.example
rebinds its name to 127.0.0.1 and reads the forwarded port as its own origin; the socket needs no token. A foreign
Host was refused only when the request also carried Sec-Fetch-* or Origin; now every request on the socket must name
this machine (corral.api.hosts), on every face, while corral's CLI and local tools keep working."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.api.hosts import HOST_RULE, foreign_host
from tests.mesos.live import Live, live_corral


@pytest.mark.parametrize(
    "host",
    ["corral", "localhost", "localhost:8470", "LOCALHOST:8470", "dash.localhost:8470", "127.0.0.1", "127.0.0.1:8470",
     "127.1.2.3:80", "[::1]", "[::1]:8470", "%2Frun%2Fcorral%2Fcorral.sock", ""],
)  # fmt: skip
def test_names_of_this_machine_pass(host: str) -> None:
    assert foreign_host([(b"host", host.encode())]) is None
    assert foreign_host([(b"user-agent", b"curl")]) is None  # no Host at all (HTTP/1.0)


@pytest.mark.parametrize(
    "host",
    ["evil.example", "evil.example:8470", "127.0.0.1.evil.example", "localhost.evil.example", "corral.example",
     "corral.", "10.0.0.1:8470", "[::2]", "localhost:port", "%2F..%2Fx/y", "0x7f000001"],
)  # fmt: skip
def test_other_names_are_foreign(host: str) -> None:
    assert foreign_host([(b"host", host.encode())]) == host
    assert foreign_host([(b"Host", b"localhost"), (b"host", host.encode())]) == "localhost"  # two: never


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with live_corral(tmp_path_factory.mktemp("hosts")) as running:
        yield running


@pytest.fixture
def unix(live: Live) -> Iterator[httpx.Client]:
    sock = live.local.env["CORRAL_SOCKET"]
    with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://corral", timeout=30) as client:
        yield client


def raw(live: Live, request: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(live.local.env["CORRAL_SOCKET"])
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


READS = {
    "corral": "/v1/jobs",
    "definitions": "/v1/definitions",
    "marathon": "/marathon/v2/apps",
    "metronome": "/metronome/v1/jobs",
    "chronos": "/chronos/v1/scheduler/jobs",
    "dashboard": "/ui/api/me",
}


@pytest.mark.parametrize("face", sorted(READS))
def test_a_rebinding_page_reads_nothing_on_any_face_with_or_without_browser_headers(
    unix: httpx.Client, face: str
) -> None:
    path = READS[face]
    assert unix.get(path).status_code == 200
    for extra in ({}, {"Origin": "http://evil.example:8470"}, {"Sec-Fetch-Site": "same-origin"}):
        answer = unix.get(path, headers={"Host": "evil.example:8470", **extra})
        assert answer.status_code == 421, (path, extra)
        body = answer.json()
        # in the shape of the face asked: corral's detail, the peers' message
        message = body["detail"]["message"] if face in ("corral", "definitions", "dashboard") else body["message"]
        assert message == f"Host 'evil.example:8470' is not this machine: {HOST_RULE}"


def test_a_rebinding_page_writes_nothing(live: Live, unix: httpx.Client) -> None:
    before = live.local.jobs()
    posted = unix.post("/v1/jobs", json={"command": ["true"]}, headers={"Host": "evil.example"})
    assert posted.status_code == 421
    app = {"id": "/rebound", "cmd": "sleep 1", "cpus": 0.1, "mem": 16}
    assert unix.post("/marathon/v2/apps", json=app, headers={"Host": "evil.example"}).status_code == 421
    assert live.local.jobs() == before
    assert unix.get("/marathon/v2/apps").json() == {"apps": []}


def test_the_cli_and_local_tools_still_reach_the_socket(live: Live, unix: httpx.Client, tmp_path: Path) -> None:
    assert live.local.run("ps").returncode == 0  # the CLI says Host: corral
    assert live.local.run("app", "list").returncode == 0
    for host in ("localhost", "localhost:8470", "127.0.0.1:8470", "[::1]:8470", "%2Frun%2Fcorral%2Fcorral.sock"):
        assert unix.get("/v1/jobs", headers={"Host": host}).status_code == 200, host
    # curl --unix-socket S http://localhost/..., and an HTTP/1.0 client with no Host at all
    assert raw(live, b"GET /v1/jobs HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").startswith(
        b"HTTP/1.1 200 "
    )
    assert raw(live, b"GET /v1/jobs HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200 ")
    assert raw(live, b"GET /v1/jobs HTTP/1.0\r\nHost: evil.example\r\n\r\n").startswith(b"HTTP/1.1 421 ")


def test_tcp_is_unchanged_its_token_is_what_counts(live: Live) -> None:
    with live.http() as client:  # the peers' clients come this way (tests/mesos drives them)
        assert client.get("/marathon/v2/apps").status_code == 200
        assert client.get("/v1/jobs", headers={"Host": "gpu-box.example:8470"}).status_code == 200
    with httpx.Client(base_url=live.url, timeout=30) as anonymous:
        assert anonymous.get("/v1/jobs", headers={"Host": "localhost"}).status_code == 401
