"""A live `corral serve` for the peers' real client packages: simulated GPUs, a TCP listener on a free localhost port,
and a token the clients send the way DC/OS clients do (`Authorization: token=<t>`).

Each contract suite starts one daemon per module (`live_corral` fixture in tests/mesos/conftest.py); its jobs are
killed when the daemon stops (see tests.api.test_serve.serving).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.api.test_serve import Corral, serving


@dataclass(frozen=True)
class Live:
    """A running daemon: `url` is http://127.0.0.1:PORT; `token` authorises as the test's own user."""

    url: str
    token: str
    local: Corral  # the CLI over the Unix socket, for corral's own view of what the peer's client did

    def http(self) -> httpx.Client:
        """A plain HTTP client carrying the token, for what no peer client can ask (raw shapes, error bodies)."""
        return httpx.Client(base_url=self.url, headers={"Authorization": f"token={self.token}"}, timeout=30)


@contextlib.contextmanager
def live_corral(root: Path, *extra: str) -> Iterator[Live]:
    """`corral serve` with 2 simulated A100-80GB GPUs unless `extra` says otherwise, listening on TCP."""
    with serving(root / "corral.sock", root / "state", "--listen", "127.0.0.1:0", *extra) as (local, first):
        found = re.search(r"and (http://127\.0\.0\.1:\d+) \(bearer tokens\)", first)
        assert found, first
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(root / "corral.sock")), timeout=30) as unix:
            made = unix.post("http://corral/v1/tokens", json={"name": "peer-client"})
            assert made.status_code == 201, made.text
        yield Live(url=found.group(1), token=made.json()["token"], local=local)
