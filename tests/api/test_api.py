"""The HTTP API over a daemon with an in-memory store and a fake executor."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from corral.api.app import PEER_KEY, VIA_KEY, create_app
from corral.daemon.core import Daemon
from corral.daemon.tokens import TokenStore
from corral.executor.fake import FakeExecutor
from corral.gpu.simulated import parse_simulated_inventory
from corral.placement import PlacementConfig
from corral.store import MemoryStore

Scope = MutableMapping[str, Any]
App = Callable[[Scope, Any, Any], Awaitable[None]]

ALICE = (1000, 1000, "alice")
BOB = (1001, 1001, "bob")
ROOT = (0, 0, "root")


class AsPeer:
    """Every request through this app comes from `peer` (what the server reads from SO_PEERCRED)."""

    def __init__(self, app: App, peer: tuple[int, int, str] | None, via: str) -> None:
        self.app = app
        self.peer = peer
        self.via = via

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if self.peer is not None:
            scope = {**scope, PEER_KEY: self.peer, VIA_KEY: self.via}
        await self.app(scope, receive, send)


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.executor = FakeExecutor()
        node = parse_simulated_inventory("2xA100-80GB")[0]
        self.daemon = Daemon(MemoryStore(), self.executor, node, PlacementConfig(), tmp_path)
        self.lock = threading.Lock()
        self.wakes = 0
        self.tokens = TokenStore(tmp_path / "tokens.json")
        self.app = create_app(self.daemon, self.lock, self.wake, tokens=self.tokens, clock=lambda: 1234.0)

    def wake(self) -> None:
        self.wakes += 1

    def client(self, peer: tuple[int, int, str] | None, via: str = "unix") -> TestClient:
        return TestClient(AsPeer(self.app, peer, via), raise_server_exceptions=False)

    def tick(self) -> None:
        with self.lock:
            self.daemon.tick()


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def submit(c: TestClient, **body: Any) -> Any:
    r = c.post("/v1/jobs", json={"command": ["train.py"], **body})
    assert r.status_code == 201, r.text
    return r.json()


def test_submit_list_show(world: World) -> None:
    alice = world.client(ALICE)
    job = submit(alice, gpus=1, name="t", priority=3, time_limit="2h")
    assert job["id"] == "1" and job["state"] == "queued" and job["user"] == "alice" and job["priority"] == 3
    assert world.wakes == 1
    world.tick()
    shown = alice.get("/v1/jobs/1").json()
    assert shown["state"] == "running" and shown["attempts"] == 1
    assert shown["gpus"] == [{"index": 0, "uuid": "SIM-GPU-0-0", "milli": 1000, "memory_mib": 81920}]
    assert [j["id"] for j in alice.get("/v1/jobs").json()] == ["1"]
    assert world.executor.launched[0].time_limit_s == 7200


def test_other_users_jobs_are_hidden(world: World) -> None:
    alice, bob, root = world.client(ALICE), world.client(BOB), world.client(ROOT)
    submit(alice)
    submit(bob)
    assert [j["id"] for j in bob.get("/v1/jobs").json()] == ["2"]
    assert [j["id"] for j in bob.get("/v1/jobs?all=true").json()] == ["2"]
    assert [j["id"] for j in root.get("/v1/jobs?all=true").json()] == ["1", "2"]
    for url in ("/v1/jobs/1", "/v1/jobs/1/explain", "/v1/jobs/1/logs"):
        r = bob.get(url)
        assert r.status_code == 404 and r.json() == {"detail": {"field": "job", "message": "no job 1"}}
    r = bob.post("/v1/jobs/1/cancel")
    assert r.status_code == 404
    assert alice.get("/v1/jobs/1").json()["state"] == "queued"
    assert root.get("/v1/jobs/1").status_code == 200
    assert alice.get("/v1/jobs/99").status_code == 404
    assert alice.get("/v1/jobs/abc").status_code == 404


def test_no_identity_is_401(world: World) -> None:
    assert world.client(None).get("/v1/jobs").status_code == 401


def test_cancel(world: World) -> None:
    alice = world.client(ALICE)
    submit(alice)
    r = alice.post("/v1/jobs/1/cancel")
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    again = alice.post("/v1/jobs/1/cancel")
    assert again.status_code == 422 and "already ended" in again.json()["detail"]["message"]
    submit(alice, gpus=1)
    world.tick()
    assert alice.post("/v1/jobs/2/cancel").json()["reason"] == "cancel requested"
    world.tick()
    assert alice.get("/v1/jobs/2").json()["state"] == "cancelled"


def test_explain_a_waiting_job(world: World) -> None:
    alice = world.client(ALICE)
    submit(alice, gpus=2)
    submit(alice, gpus=1)
    world.tick()
    r = alice.get("/v1/jobs/2/explain")
    assert r.json() == {"state": "queued", "reason": "0/1 nodes fit: 1 insufficient GPU (need 1 whole GPU)"}


def test_gpus_show_who_holds_which_share(world: World) -> None:
    alice, bob = world.client(ALICE), world.client(BOB)
    submit(alice, gpu_fraction=0.5)
    submit(bob, gpu_fraction=0.25)
    world.tick()
    rows = alice.get("/v1/gpus").json()
    assert [r["uuid"] for r in rows] == ["SIM-GPU-0-0", "SIM-GPU-0-1"]
    assert rows[0]["granted_milli"] == 750 and rows[1]["granted_milli"] == 0
    # alice sees her own job's user; bob's job only by number
    assert rows[0]["held"] == [
        {"job": "1", "user": "alice", "milli": 500, "memory_mib": 0},
        {"job": "2", "user": None, "milli": 250, "memory_mib": 0},
    ]
    assert rows[0]["used_memory_mib"] is None and rows[0]["utilization_pct"] is None  # simulated: no live use
    assert rows[0]["foreign_memory_mib"] is None
    root = world.client(ROOT).get("/v1/gpus").json()
    assert [h["user"] for h in root[0]["held"]] == ["alice", "bob"]


def test_logs(world: World, tmp_path: Path) -> None:
    alice = world.client(ALICE)
    submit(alice)
    assert alice.get("/v1/jobs/1/logs").text == ""
    path = world.daemon.log_path("1")
    path.parent.mkdir(parents=True)
    path.write_text("hello\nworld\n")
    r = alice.get("/v1/jobs/1/logs?offset=6")
    assert r.status_code == 200 and r.text == "world\n" and r.headers["content-type"].startswith("text/plain")
    assert r.headers["x-corral-next-offset"] == "12" and r.headers["x-corral-job-state"] == "queued"
    assert alice.get("/v1/jobs/1/logs?offset=-1").status_code == 422


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"gpu_fraction": 2}, "gpu_fraction"),
        ({"memory": "lots"}, "memory"),
        ({"cpus": "many"}, "cpus"),
        ({"gpus": 1, "gpu_model": ["T4"]}, "gpu"),
        ({"command": []}, "command"),
        ({"command": [""]}, "command"),
        ({"time_limit": "soon"}, "time_limit"),
        ({"retries": -1}, "retries"),
        ({"gpus": -1}, "gpu"),
        ({"gpu_memory": "1PiB"}, "gpu"),
        ({"command": "ls"}, "command"),
        ({"gpus": 64}, "request"),  # more GPUs than the machine has: it could never run
    ],
)
def test_bad_input_is_422_naming_the_field(world: World, body: dict[str, Any], field: str) -> None:
    r = world.client(ALICE).post("/v1/jobs", json={"command": ["train.py"], **body})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    named = detail["field"] if isinstance(detail, dict) else " ".join(str(p) for p in detail[0]["loc"])
    assert field in named, detail
    assert world.daemon.store.list() == []


def test_store_failure_is_503(world: World) -> None:
    world.daemon.store.close()
    r = world.client(ALICE).get("/v1/jobs")
    assert r.status_code == 503 and r.json()["detail"]["field"] == "store"


def test_tokens_over_the_unix_socket(world: World) -> None:
    alice, bob, root = world.client(ALICE), world.client(BOB), world.client(ROOT)
    r = alice.post("/v1/tokens", json={"name": "laptop"})
    assert r.status_code == 201
    made = r.json()
    assert made["name"] == "laptop" and made["user"] == "alice" and made["created_at"] == 1234.0
    assert world.tokens.verify(made["token"]) is not None
    listed = alice.get("/v1/tokens").json()
    assert listed == [{**made, "token": None}]  # the secret is shown only once
    assert bob.get("/v1/tokens").json() == []
    assert [t["user"] for t in root.get("/v1/tokens").json()] == ["alice"]
    assert bob.delete(f"/v1/tokens/{made['id']}").json() == {
        "detail": {"field": "token", "message": f"no token {made['id']}"}
    }
    assert alice.delete(f"/v1/tokens/{made['id']}").status_code == 204
    assert world.tokens.verify(made["token"]) is None
    assert alice.delete(f"/v1/tokens/{made['id']}").status_code == 404


def test_tokens_for_other_users_are_roots_and_never_over_tcp(world: World) -> None:
    alice, root = world.client(ALICE), world.client(ROOT)
    r = alice.post("/v1/tokens", json={"name": "x", "user": "root"})
    assert r.status_code == 403 and r.json()["detail"]["message"] == "only root can create tokens for other users"
    r = root.post("/v1/tokens", json={"name": "x", "user": "nobody"})
    assert r.status_code == 201 and r.json()["user"] == "nobody"
    r = root.post("/v1/tokens", json={"name": "y", "user": "no-such-user-here"})
    assert r.status_code == 422 and r.json()["detail"] == {
        "field": "user",
        "message": "no user 'no-such-user-here' on this machine",
    }
    over_tcp = world.client(ALICE, via="token")
    for method, url in (("post", "/v1/tokens"), ("get", "/v1/tokens"), ("delete", "/v1/tokens/abc")):
        r = getattr(over_tcp, method)(url, **({"json": {"name": "z"}} if method == "post" else {}))
        assert r.status_code == 403, (method, r.text)
        assert r.json()["detail"]["message"] == "tokens are created, listed and revoked over the Unix socket only"
    assert alice.post("/v1/tokens", json={"name": ""}).status_code == 422
