"""Gangs against queue and user limits (issue 23, item 3): admission and every round count all of a gang's
instances, through corral's /v1 (a job of N instances) and Marathon's face (an app labelled corral.gang, one job per
instance), and the refusal states the gang's whole ask; GPU shares count by their part (item 13)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.api.marathon import router as marathon_router
from corral.api.queues import queues_router
from corral.cli.queues import list_lines
from corral.daemon.core import Daemon
from corral.daemon.gang import GangExecutor
from corral.daemon.queues import Queues
from corral.executor.fake import FakeExecutor
from corral.jobs.model import JobState
from corral.model.resources import GpuBehavior
from corral.placement import PlacementConfig
from corral.services.controller import ServicesController
from corral.services.ports import PortAllocator
from corral.store import MemoryStore
from tests.api.test_api import ALICE, AsPeer
from tests.services.helpers import Clock, ScriptedChecker, machine

CONFIG = PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)

#: The issue's setup: queue dev limited to 2 GPUs, each user in it to 1.
DEV = """
default_queue = "dev"
[queues.dev]
limit = { gpus = 2 }
[queues.dev.users."*"]
limit = { gpus = 1 }
"""
#: Only the queue's limit: a gang of 2 fits admission, and waits beside running work.
DEV_ONLY = "[queues.dev]\nlimit = { gpus = 2 }\n[queues.other]\n"


class World:
    """A daemon over a fake executor that runs gangs, with /v1, /v1/queues and Marathon's /v2/apps."""

    def __init__(self, tmp_path: Path, toml: str, gpus: int = 4) -> None:
        path = tmp_path / "queues.toml"
        path.write_text(toml)
        self.node = machine(*(["A100"] * gpus))
        self.store = MemoryStore()
        self.clock = Clock()
        self.fake = FakeExecutor()
        store = self.store
        executor = GangExecutor(self.fake, lambda jid: j.spec.instances if (j := store.get(jid)) is not None else 1)
        self.daemon = Daemon(self.store, executor, self.node, CONFIG, tmp_path, clock=self.clock,
                             queues=Queues.open(path, self.node), find_process=lambda _: None)  # fmt: skip
        self.controller = ServicesController(PortAllocator(40000, 40099, free=lambda _: True), ScriptedChecker())
        self.daemon.controllers.append(self.controller)
        self.lock = threading.Lock()
        d, lock = self.daemon, self.lock
        routers = [queues_router(d, lock, lambda: None), marathon_router(d, lock, lambda: None, self.controller)]
        self.app = create_app(d, lock, lambda: None, clock=self.clock, routers=routers)

    def client(self) -> TestClient:
        return TestClient(AsPeer(self.app, ALICE, "unix"), raise_server_exceptions=False)

    def tick(self) -> None:
        with self.lock:
            self.daemon.tick()

    def in_use(self, queue: str = "dev") -> Any:
        return self.client().get(f"/v1/queues/{queue}").json()["in_use"]["gpus"]


def gang(instances: int, gpus: int = 1, queue: str = "dev") -> dict[str, Any]:
    return {"command": ["sleep", "100"], "gpus": gpus, "instances": instances, "gang": True, "queue": queue}


def test_a_v1_gang_is_refused_with_its_whole_ask_as_a_plain_job_is(tmp_path: Path) -> None:
    w = World(tmp_path, DEV)
    c = w.client()
    plain = c.post("/v1/jobs", json={"command": ["sleep", "1"], "gpus": 2})
    assert plain.status_code == 422
    assert plain.json()["detail"]["message"] == (
        "the job asks for 2 GPUs, more than user alice's limit in 'dev' of 1 GPU: it could never start"
    )
    three = c.post("/v1/jobs", json=gang(3))
    assert three.status_code == 422
    assert three.json()["detail"] == {
        "field": "queue",
        "message": "the job asks for 3 instances x 1 GPU = 3 GPUs, more than queue 'dev''s limit of 2 GPUs: it could "
        "never start",
    }
    two = c.post("/v1/jobs", json=gang(2))  # within the queue's 2, above each user's 1
    assert two.status_code == 422
    assert two.json()["detail"]["message"] == (
        "the job asks for 2 instances x 1 GPU = 2 GPUs, more than user alice's limit in 'dev' of 1 GPU: it could "
        "never start"
    )
    w.tick()
    assert w.store.list() == [] and w.in_use() == 0  # nothing ran


def test_a_marathon_gang_app_is_refused_with_its_whole_ask(tmp_path: Path) -> None:
    w = World(tmp_path, DEV)
    c = w.client()
    app = {"id": "/web", "cmd": "sleep 100", "cpus": 0.5, "mem": 64, "gpus": 1, "instances": 3,
           "labels": {"corral.gang": "true", "corral.queue": "dev"}}  # fmt: skip
    r = c.post("/marathon/v2/apps", json=app)
    assert r.status_code == 422, r.text
    assert r.json()["details"] == [
        {
            "path": "/instances",
            "errors": [
                "the job asks for 3 instances x 1 GPU = 3 GPUs, more than queue 'dev''s limit of 2 GPUs: it could "
                "never start"
            ],
        }
    ]
    for _ in range(3):
        w.tick()
    assert w.store.list() == [] and w.in_use() == 0
    # without the label, instances are jobs of their own: each within the limits, started one by one up to them
    del app["labels"]["corral.gang"]  # type: ignore[attr-defined]
    assert c.post("/marathon/v2/apps", json=app).status_code == 201
    w.tick()
    assert sorted(j.state.value for j in w.store.list()) == ["queued", "queued", "running"]
    assert w.in_use() == 1


def test_a_v1_gang_that_fits_alone_waits_beside_running_work_and_never_overruns(tmp_path: Path) -> None:
    w = World(tmp_path, DEV_ONLY)
    c = w.client()
    first = c.post("/v1/jobs", json={"command": ["sleep", "1"], "gpus": 1, "queue": "dev"}).json()["id"]
    w.tick()
    g = c.post("/v1/jobs", json=gang(2))
    assert g.status_code == 201, g.text  # 2 of 2: it could start, once the queue is empty
    w.tick()
    job = w.store.get(g.json()["id"])
    assert job is not None and job.state is JobState.QUEUED
    assert job.reason == (
        "queue 'dev' is at its limit of 2 GPUs (1 GPU in use, the job asks for 2 instances x 1 GPU = 2 GPUs)"
    )
    assert w.in_use() == 1
    w.fake.finish(first, 0)
    w.tick()
    job = w.store.get(g.json()["id"])
    assert job is not None and job.state is JobState.RUNNING and len(job.gpus) == 2
    assert w.in_use() == 2
    # the gang holds the queue's 2: nothing more of dev starts, though the machine has 2 GPUs free
    more = c.post("/v1/jobs", json={"command": ["sleep", "1"], "gpus": 1, "queue": "dev"}).json()["id"]
    w.tick()
    assert w.store.get(more).state is JobState.QUEUED  # type: ignore[union-attr]
    assert w.in_use() == 2


def test_a_marathon_gang_group_is_checked_whole_in_the_round(tmp_path: Path) -> None:
    w = World(tmp_path, DEV_ONLY)
    c = w.client()
    first = c.post("/v1/jobs", json={"command": ["sleep", "1"], "gpus": 1, "queue": "dev"}).json()["id"]
    w.tick()
    app = {"id": "/web", "cmd": "sleep 100", "cpus": 0.5, "mem": 64, "gpus": 1, "instances": 2,
           "labels": {"corral.gang": "true", "corral.queue": "dev"}}  # fmt: skip
    assert c.post("/marathon/v2/apps", json=app).status_code == 201
    for _ in range(3):
        w.tick()
    members = [j for j in w.store.list() if j.spec.gang_group]
    assert len(members) == 2 and all(j.state is JobState.QUEUED for j in members)  # before: one started, 3 of 2
    assert {j.reason for j in members} == {
        "gang: queue 'dev' is at its limit of 2 GPUs (1 GPU in use, the job asks for 2 instances x 1 GPU = 2 GPUs)"
    }
    assert w.in_use() == 1
    w.fake.finish(first, 0)
    w.tick()
    assert all(w.store.get(j.id).state is JobState.RUNNING for j in members)  # type: ignore[union-attr]
    assert w.in_use() == 2


# ------------------------------------------------------------------------------------------------ shares (item 13)
def test_shares_count_by_their_part_against_a_gpus_limit(tmp_path: Path) -> None:
    w = World(tmp_path, "[queues.dev]\nlimit = { gpus = 2 }\n")
    c = w.client()

    def share(fraction: float | None, gpus: int = 1) -> str:
        body: dict[str, Any] = {"command": ["sleep", "1"], "gpus": gpus, "queue": "dev"}
        if fraction is not None:
            body["gpu_fraction"] = fraction
        r = c.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    ids = [share(0.5), share(0.3), share(None)]
    w.tick()
    assert all(w.store.get(i).state is JobState.RUNNING for i in ids)  # type: ignore[union-attr]
    assert w.in_use() == pytest.approx(1.8)  # before: 3 ("3 GPUs in use")
    row = c.get("/v1/queues/dev").json()
    assert row["limit"] == {"gpus": 2} and row["in_use"]["gpu_milli"] == 1800
    shown = list_lines({"queues": [row]})[0][2:5]  # corral queue list
    assert shown == ["-", "gpus=2", "gpus=1.8 gpu_milli=1800 gpu_memory=80GiB cpus=3 memory=3GiB"]
    fits = share(0.2)  # 1.8 + 0.2 = 2: within the limit
    w.tick()
    assert w.store.get(fits).state is JobState.RUNNING  # type: ignore[union-attr]
    assert w.in_use() == 2
    over = share(0.1)
    w.tick()
    job = w.store.get(over)
    assert job is not None and job.state is JobState.QUEUED
    assert job.reason == "queue 'dev' is at its limit of 2 GPUs (2 GPUs in use, the job asks for 0.1 GPUs)"
