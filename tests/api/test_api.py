"""The HTTP API over a daemon with an in-memory store and a fake executor."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from corral.api.app import PEER_KEY, VIA_KEY, create_app
from corral.api.limits import SafeJSONResponse, clean
from corral.daemon.core import Daemon
from corral.daemon.extensions import install_extensions
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


def test_no_pages_that_load_from_a_cdn_and_the_schema_is_served(world: World) -> None:
    alice = world.client(ALICE)
    for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert alice.get(page).status_code == 404, page  # FastAPI's pages fetch Swagger UI / ReDoc from a CDN
    schema = alice.get("/openapi.json")
    assert schema.status_code == 200 and "/v1/jobs" in schema.json()["paths"]
    assert "cdn" not in schema.text.lower()


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
    data = r.json()
    assert data["state"] == "queued"
    assert data["reason"] == "0/1 nodes fit: 1 insufficient GPU (need 1 whole GPU)"
    assert data["story"].startswith("Position 2 of 2 in")
    assert (data["position"], data["queued"]) == (2, 2)  # the reservation and the rest: tests/daemon/test_backfill.py


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


# ------------------------------------------------------------------------------------------ hostile input (issue 12)
HUGE = "99999999999999999999999999"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cpus": HUGE}, "cpus"),
        ({"memory": HUGE}, "memory"),
        ({"gpus": 1, "gpu_memory": HUGE}, "gpu_memory"),
        ({"memory": "9" * 400}, "memory"),
        ({"time_limit": "9" * 400}, "time_limit"),
        ({"time_limit": "99999999999999d"}, "time_limit"),
        ({"gpus": 2**40}, "gpus"),
        ({"name": "x\ud800"}, "name"),
        ({"command": ["echo", "a\ud800"]}, "command.1"),
        ({"command": ["echo", "a\x00b"]}, "command.1"),
        ({"command": ["echo", "x" * (129 * 1024)]}, "command.1"),
        ({"command": ["echo"] + ["x" * 100_000] * 3}, "command"),
        ({"command": ["echo"] * 5000}, "command"),
        ({"cwd": "/tmp\x00"}, "cwd"),
        ({"cwd": "../../etc/passwd"}, "cwd"),
        ({"env": {"A=B": "1"}}, "env"),
        ({"env": {"": "1"}}, "env"),
        ({"env": {"K\x00": "1"}}, "env"),
        ({"env": {"K": "v\x00"}}, "env.K"),
        ({"env": {"K": "v" * (128 * 1024)}}, "env.K"),
        ({"env": {"K" * 300: "1"}}, "env"),
        ({"env": {f"K{i}": "1" for i in range(1100)}}, "env"),
        ({"name": "bell\x07"}, "name"),
        ({"name": "n" * 201}, "name"),
        ({"idempotency_key": "with space"}, "idempotency_key"),
    ],
    ids=lambda v: repr(v)[:60],
)
def test_hostile_fields_are_4xx_naming_the_field_and_never_stored(
    world: World, body: dict[str, Any], field: str
) -> None:
    raw = json.dumps({"command": ["train.py"], **body})  # ASCII: a lone surrogate travels as its JSON escape
    r = world.client(ALICE).post("/v1/jobs", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"]["field"] == field, r.json()
    assert world.daemon.store.list() == []


@pytest.mark.parametrize(
    ("raw", "status", "field"),
    [
        (b'{"command": ["x"], "cpus": NaN}', 400, "body"),
        (b'{"command": ["x"], "gpu_fraction": Infinity}', 400, "body"),
        (b'{"command": ["x"], "gpu_fraction": 1e999}', 422, "gpu_fraction"),
        (b'{"command": ["x"], "priority": 1e29}', 422, "priority"),
        (b'{"command": ["x"], "retries": 99999999999999999999999999}', 422, "retries"),
        (b'{"command": ["x\\ud800"]}', 422, "command.0"),
        (b'{"command": ["\xff\xfe"]}', 400, "body"),
        (b'{"command": ["\xed\xa0\x80"]}', 400, "body"),  # a surrogate encoded as UTF-8 bytes: not UTF-8
        (b"[" * 10_000 + b"]" * 10_000, 422, "body"),
        (b'{"a":' * 40 + b"1" + b"}" * 40, 422, "body"),
        (b"{bad", 400, "body"),
    ],
    ids=lambda v: repr(v)[:50],
)
def test_hostile_bodies_are_4xx_in_corrals_shape(world: World, raw: bytes, status: int, field: str) -> None:
    r = world.client(ALICE).post("/v1/jobs", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert r.json()["detail"]["field"] == field, r.json()
    assert world.daemon.store.list() == []


def test_body_over_one_mib_is_413(world: World) -> None:
    alice = world.client(ALICE)
    big = {"command": ["echo"], "env": {f"K{i}": "v" * 1000 for i in range(1100)}}
    r = alice.post("/v1/jobs", json=big)
    assert r.status_code == 413 and r.json()["detail"]["field"] == "body", r.text
    chunked = alice.post(
        "/v1/jobs", content=iter([b" " * (600 * 1024)] * 2), headers={"content-type": "application/json"}
    )
    assert chunked.status_code == 413, chunked.text
    r = alice.post("/metronome/v1/jobs", json=big)
    assert r.status_code == 413 and set(r.json()) == {"message"}


def test_framework_errors_use_the_documented_shape(world: World) -> None:
    alice = world.client(ALICE)
    r = alice.get("/v1/nope")
    assert r.status_code == 404 and r.json() == {"detail": {"field": "path", "message": "no route GET /v1/nope"}}
    r = alice.patch("/v1/jobs")
    assert r.status_code == 405 and r.json()["detail"]["field"] == "method"
    r = alice.post("/v1/jobs", content=b"command=x", headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415 and r.json()["detail"]["field"] == "content-type"
    r = alice.get("/v1/jobs/1/logs", params={"offset": 2**63})
    assert r.status_code == 422 and r.json()["detail"]["field"] == "offset"
    r = alice.get("/v1/jobs/1/logs", params={"offset": "x"})
    assert r.status_code == 422 and r.json()["detail"]["field"] == "offset"


def test_offset_at_the_limit_is_no_500(world: World) -> None:
    alice = world.client(ALICE)
    submit(alice)
    path = world.daemon.log_path("1")
    path.parent.mkdir(parents=True)
    path.write_text("hello\n")
    r = alice.get("/v1/jobs/1/logs", params={"offset": 2**63 - 1})
    assert r.status_code in (200, 422), r.text


def test_token_for_a_user_with_nul_is_4xx(world: World) -> None:
    r = world.client(ROOT).post("/v1/tokens", json={"name": "x", "user": "ro\x00ot"})
    assert r.status_code == 422 and r.json()["detail"]["field"] == "user", r.text


def test_users_priority_is_bounded_root_may_exceed(world: World) -> None:
    alice, root = world.client(ALICE), world.client(ROOT)
    assert submit(alice, priority=100)["priority"] == 100
    assert submit(alice, priority=-100)["priority"] == -100
    r = alice.post("/v1/jobs", json={"command": ["x"], "priority": 101})
    assert r.status_code == 403 and r.json()["detail"] == {
        "field": "priority",
        "message": "must be in -100..100 (only root or an admin of the queues file may go beyond), got 101",
    }
    assert submit(root, priority=10**6)["priority"] == 10**6
    r = root.post("/v1/jobs", json={"command": ["x"], "priority": 2**31})
    assert r.status_code == 422 and r.json()["detail"]["field"] == "priority"


def test_a_stored_lone_surrogate_does_not_break_reads(world: World) -> None:
    """A job an older corral stored with a lone surrogate in its name, command and reason still lists and shows."""
    alice, root = world.client(ALICE), world.client(ROOT)
    submit(alice)
    job = world.daemon.store.get("1")
    assert job is not None
    bad = dataclasses.replace(job.spec, name="x\ud800", command=("echo", "\udfff"))
    world.daemon.store._jobs["1"] = job.evolve(spec=bad, reason="why \ud800")  # type: ignore[attr-defined]
    for client, url in ((alice, "/v1/jobs"), (root, "/v1/jobs?all=true")):
        r = client.get(url)
        assert r.status_code == 200, r.text
        assert r.json()[0]["name"] == "x\\ud800" and r.json()[0]["command"] == ["echo", "\\udfff"]
    assert alice.get("/v1/jobs/1").json()["name"] == "x\\ud800"
    assert alice.get("/v1/jobs/1/explain").json()["reason"] == "why \\ud800"


def test_idempotency_key_returns_the_same_job(world: World) -> None:
    alice, bob = world.client(ALICE), world.client(BOB)
    key = {"Idempotency-Key": "3f1c7a0e-5d2b-4c7e-9a1f-2b8d6e4c0a9f"}
    first = alice.post("/v1/jobs", json={"command": ["train.py"], "name": "a"}, headers=key)
    assert first.status_code == 201
    again = alice.post("/v1/jobs", json={"command": ["train.py"], "name": "a"}, headers=key)
    assert again.status_code == 200 and again.json() == first.json()
    other = alice.post("/v1/jobs", json={"command": ["train.py"], "name": "b"}, headers=key)
    assert other.status_code == 409 and other.json()["detail"] == {
        "field": "idempotency_key",
        "message": f"the key {key['Idempotency-Key']!r} was used for job 1, a different request; use a new key",
    }
    # the field works like the header, and keys are per user
    by_field = alice.post("/v1/jobs", json={"command": ["x"], "idempotency_key": "k2"})
    assert alice.post("/v1/jobs", json={"command": ["x"], "idempotency_key": "k2"}).json() == by_field.json()
    assert bob.post("/v1/jobs", json={"command": ["train.py"], "name": "a"}, headers=key).status_code == 201
    assert [j.id for j in world.daemon.store.list()] == ["1", "2", "3"]
    bad = alice.post("/v1/jobs", json={"command": ["x"]}, headers={"Idempotency-Key": "x" * 200})
    assert bad.status_code == 422 and bad.json()["detail"]["field"] == "Idempotency-Key"


def test_answers_encode_stored_lone_surrogates() -> None:
    """What the peers' routes answer from stored documents: JSONResponse would raise UnicodeEncodeError (a 500)."""
    content = {"cmd": "echo \ud800", "ok": "é 😀"}
    with pytest.raises(UnicodeEncodeError):
        JSONResponse(content)
    body = bytes(SafeJSONResponse(content).body)
    assert json.loads(body) == content and b"\\ud800" in body
    assert SafeJSONResponse({"ok": "é 😀"}).body == JSONResponse({"ok": "é 😀"}).body  # unchanged otherwise
    assert clean("x\ud800y") == "x\\ud800y" and clean("é") == "é"


def test_the_texts_of_the_input_limits(world: World) -> None:
    routers = install_extensions(world.daemon, world.lock, world.wake)
    app = create_app(world.daemon, world.lock, world.wake, tokens=world.tokens, routers=routers)
    alice = TestClient(AsPeer(app, ALICE, "unix"), raise_server_exceptions=False)

    def post(url: str, raw: bytes) -> Any:
        return alice.post(url, content=raw, headers={"content-type": "application/json"}).json()

    assert post("/v1/jobs", b'{"command": ["a\\u0000"]}') == {
        "detail": {"field": "command.0", "message": "must not contain a NUL character"}
    }
    assert post("/v1/jobs", b'{"command": ["x\\ud800"]}')["detail"]["message"] == (
        "is not valid Unicode: it has a lone surrogate \\ud800 at character 1"
    )
    assert post("/v1/jobs", b'{"command": ["x"], "env": {"A=B": "1"}}')["detail"] == {
        "field": "env",
        "message": "the name must not contain '=', got 'A=B'",
    }
    assert post("/v1/jobs", b"[" * 50 + b"]" * 50)["detail"] == {
        "field": "body",
        "message": "the JSON is nested deeper than 32 levels",
    }
    assert (
        post("/v1/jobs", b'{"cpus": NaN}')["detail"]["message"]
        == "the body is not valid JSON: NaN is not a JSON number"
    )
    assert post("/metronome/v1/jobs", b'{"id": "j", "run": {"cmd": "a\\u0000"}}') == {
        "message": "Object is not valid",
        "details": [{"path": "/run/cmd", "errors": ["must not contain a NUL character"]}],
    }
    app_doc = b'{"id": "/a", "cmd": "x", "instances": 1000000000}'
    assert post("/marathon/v2/apps", app_doc) == {
        "message": "Object is not valid",
        "details": [{"path": "/instances", "errors": ["must be <= 1000, got 1000000000"]}],
    }
    r = alice.post("/chronos/v1/scheduler/iso8601", content=b'{"name": "c", "command": "\\ud800"}')
    assert r.status_code == 400 and r.json()["details"] == [
        {"path": "/command", "errors": ["is not valid Unicode: it has a lone surrogate \\ud800 at character 0"]}
    ]
    r = alice.post("/v1/jobs", content=b" " * (1024 * 1024 + 1), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json() == {
        "detail": {"field": "body", "message": "the request body is larger than 1048576 bytes (1 MiB), the limit"}
    }
    r = alice.get("/marathon/v2/nope")
    assert r.status_code == 404 and r.json() == {"message": "no route GET /marathon/v2/nope"}
    r = alice.delete("/metronome/v1/queue")
    assert r.status_code == 405 and r.json() == {"message": "/metronome/v1/queue does not take DELETE"}
