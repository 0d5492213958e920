"""Queues in `corral serve`: limits per queue, user and group, borrowing, fair-share order over decayed usage,
priority bounds, reload, restart, explain, and the no-starvation check with queues on (docs/queues.md)."""

from __future__ import annotations

import grp
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.api.queues import queues_router
from corral.cli.queues import list_lines, priority_lines, share_lines
from corral.daemon.core import Daemon
from corral.daemon.extensions import install_extensions
from corral.daemon.queues import Forbidden, Queues
from corral.executor.fake import FakeExecutor
from corral.gpu.simulated import parse_simulated_inventory
from corral.jobs.model import JobSpec, JobState
from corral.model.errors import InvalidRequest
from corral.model.resources import GpuBehavior, Request
from corral.placement import PlacementConfig
from corral.store import MemoryStore
from corral.tenancy.quota import below_guarantee, borrowing
from tests.api.test_api import ALICE, BOB, ROOT, AsPeer

CONFIG = PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)
USERS = {"alice": (1000, 1000), "bob": (1001, 1001), "root": (0, 0)}


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


class World:
    def __init__(self, tmp_path: Path, toml: str | None, gpus: int = 4, store: MemoryStore | None = None) -> None:
        self.path = tmp_path / "queues.toml"
        if toml is not None:
            self.path.write_text(toml)
        self.node = parse_simulated_inventory(f"{gpus}xA100-80GB")[0]
        self.clock = Clock()
        self.executor = FakeExecutor()
        self.store = store if store is not None else MemoryStore()
        self.queues = Queues.open(self.path if toml is not None else None, self.node)
        self.queues.rebuild(self.store, self.clock())
        self.daemon = Daemon(self.store, self.executor, self.node, CONFIG, tmp_path, clock=self.clock,
                             queues=self.queues)  # fmt: skip
        lock = threading.Lock()
        self.app = create_app(self.daemon, lock, lambda: None, clock=self.clock,
                              routers=[queues_router(self.daemon, lock, lambda: None)])  # fmt: skip

    def client(self, peer: tuple[int, int, str]) -> TestClient:
        return TestClient(AsPeer(self.app, peer, "unix"))

    def submit(self, user: str = "alice", gpus: int = 1, queue: str = "", priority: int = 0,
               limit: float | None = None, milli: int = 1000) -> str:  # fmt: skip
        uid, gid = USERS[user]
        request = Request(cpu_milli=1000, memory_mib=1024, gpu_count=gpus, gpu_milli=milli, priority=priority)
        spec = JobSpec(("x",), request, user, uid, gid, time_limit_s=limit, queue=queue)
        return self.daemon.submit(spec).id

    def reason(self, job_id: str) -> str:
        job = self.store.get(job_id)
        assert job is not None
        return job.reason

    def state(self, job_id: str) -> JobState:
        job = self.store.get(job_id)
        assert job is not None
        return job.state


TWO_QUEUES = """
[queues.train]
guarantee = { gpus = 2 }
limit = { gpus = 3 }
[queues.dev]
guarantee = { gpus = 2 }
[queues.dev.users.bob]
limit = { gpus = 1 }
"""


def test_a_queue_at_its_limit_holds_the_job_back_with_its_words(tmp_path: Path) -> None:
    w = World(tmp_path, TWO_QUEUES)
    ids = [w.submit(queue="train") for _ in range(4)]
    w.daemon.tick()
    assert [w.state(i) for i in ids] == [JobState.RUNNING] * 3 + [JobState.QUEUED]
    assert w.reason(ids[3]) == "queue 'train' is at its limit of 3 GPUs (3 GPUs in use, the job asks for 1 GPU)"
    w.submit("bob", queue="train")  # bob only waits: sshare lists him (no usage), counted in train's split
    w.daemon.tick()
    rows = [a for a in w.client(ROOT).get("/v1/shares").json()["accounts"] if a["queue"] == "train"]
    assert [(a["user"], a["norm_shares"], a["usage"]["gpu_milli"]) for a in rows][1:] == [
        ("alice", 0.5, pytest.approx(0.0)), ("bob", 0.5, 0.0)]  # fmt: skip


def test_a_users_limit_in_a_queue_and_a_groups_limit(tmp_path: Path) -> None:
    group = grp.getgrgid(os.getgid()).gr_name  # the primary group of the test's users below
    w = World(tmp_path, TWO_QUEUES + f"[groups.{group}]\nlimit = {{ gpu_milli = 1500 }}\n")
    uid = os.getuid()
    USERS["carol"] = (uid + 7000, os.getgid())
    try:
        b1, b2 = w.submit("bob", queue="dev"), w.submit("bob", queue="dev")
        c1, c2 = w.submit("carol", queue="dev", milli=600), w.submit("carol", queue="dev", milli=1000)
        w.daemon.tick()
    finally:
        del USERS["carol"]
    assert w.state(b1) is JobState.RUNNING and w.state(b2) is JobState.QUEUED
    assert w.reason(b2) == (
        "user bob's limit in queue 'dev' of 1 GPU is reached (1 GPU in use, the job asks for 1 GPU)"
    )
    # carol's first share fits in her group's 1.5 GPUs of compute, the second (a whole GPU) does not
    assert w.state(c1) is JobState.RUNNING and w.state(c2) is JobState.QUEUED
    assert w.reason(c2) == (
        f"group {group}'s limit of 1.5 GPUs of compute (1500 milli) is reached (0.6 GPUs of compute (600 milli) in "
        "use, the job asks for 1 GPUs of compute (1000 milli))"
    )


def test_a_queue_borrows_idle_gpus_and_its_latest_started_jobs_are_the_excess(tmp_path: Path) -> None:
    w = World(tmp_path, TWO_QUEUES)
    first = []
    for _ in range(3):  # dev is idle: train borrows one GPU above its guarantee of 2
        first.append(w.submit(queue="train", limit=100))
        w.daemon.tick()
        w.clock.t += 1
    assert all(w.state(i) is JobState.RUNNING for i in first)
    w.daemon.tick()
    usage = w.queues.usage
    assert [borrowing(i, usage) for i in first] == [False, False, True]  # the latest-started is the excess
    train, dev = w.queues.config.queues["train"], w.queues.config.queues["dev"]
    assert not below_guarantee(train, usage) and below_guarantee(dev, usage)


def test_borrowing_is_refused_while_another_queue_waits_for_its_guarantee(tmp_path: Path) -> None:
    toml = "[queues.a]\nguarantee = { gpus = 2 }\n[queues.b]\nguarantee = { gpus = 2 }\n"
    w = World(tmp_path, toml)
    held = [w.submit(queue="a") for _ in range(3)]  # b idle: a holds 3 (one borrowed)
    w.daemon.tick()
    assert all(w.state(i) is JobState.RUNNING for i in held)
    waits = w.submit(gpus=2, queue="b")  # one GPU free: does not fit yet; b is below its guarantee
    extra = w.submit(queue="a")
    w.daemon.tick()
    assert w.state(extra) is JobState.QUEUED
    assert w.reason(extra) == (
        "borrowing: queue 'a' is above its guarantee and the machine has no idle capacity it may borrow (0 GPUs "
        "lendable of 1 GPU free: the rest is guaranteed to other queues with waiting jobs)"
    )
    rows = {r["name"]: r for r in w.client(ALICE).get("/v1/queues").json()["queues"]}
    assert rows["a"]["borrowing"]["gpus"] == 1 and rows["a"]["running"] == 3 and rows["a"]["pending"] == 1
    assert rows["a"]["borrowing_jobs"] == [held[2]] and rows["b"]["borrowing_jobs"] == []
    assert rows["b"]["below_guarantee"] and rows["b"]["pending"] == 1
    assert w.state(waits) is JobState.QUEUED


def test_the_light_users_job_goes_first(tmp_path: Path) -> None:
    """Two users, one with heavy decayed usage: the light user's job starts first though submitted later."""
    w = World(tmp_path, 'half_life = "1d"\n[queues.default]\n', gpus=1)
    for _ in range(3):  # alice uses the only GPU for three hours
        j = w.submit("alice")
        w.daemon.tick()
        w.clock.t += 3600
        w.executor.finish(j)
        w.daemon.tick()
    heavy = w.submit("alice")
    w.clock.t += 1
    light = w.submit("bob")
    w.daemon.tick()
    assert w.state(light) is JobState.RUNNING and w.state(heavy) is JobState.QUEUED
    assert w.daemon.queue_order[:2] == [light, heavy]
    shares = w.client(ROOT).get("/v1/shares").json()
    users = {a["user"]: a for a in shares["accounts"] if a["user"] is not None}
    assert users["alice"]["usage"]["gpu_milli"] > 3 * 3600 * 1000 * 0.9  # decayed a little
    assert users["alice"]["fairshare_factor"] < 0.5 < users["bob"]["fairshare_factor"]
    # bob sees his own name and alice's figures, not her name (as explain's holders and the GPU view)
    seen = {a["user"]: a for a in w.client(BOB).get("/v1/shares").json()["accounts"] if a["user"] is not None}
    assert set(seen) == {"bob", "another user"} and seen["another user"] == {**users["alice"], "user": "another user"}
    # without a queues file the order stays first come, first served (corral before queues)
    (tmp_path / "fifo").mkdir()
    fifo = World(tmp_path / "fifo", None, gpus=1)
    fifo.submit("alice")
    fifo.submit("bob")
    fifo.daemon.tick()
    assert not fifo.queues.active and fifo.state("1") is JobState.RUNNING and fifo.state("2") is JobState.QUEUED


def test_a_groups_weight_gives_its_members_a_larger_part(tmp_path: Path) -> None:
    """carol (in a group of weight 3) used twice what alice used; her job still goes first: 2/(3/4) < 1/(1/4)."""
    group = grp.getgrgid(os.getgid()).gr_name
    w = World(tmp_path, f"[queues.default.groups.{group}]\nweight = 3\n", gpus=1)
    USERS["carol"] = (os.getuid() + 7000, os.getgid())
    try:
        for user, hours in (("alice", 1), ("carol", 2)):
            j = w.submit(user)
            w.daemon.tick()
            w.clock.t += 3600 * hours
            w.executor.finish(j)
            w.daemon.tick()
        first = w.submit("alice")
        second = w.submit("carol")
        w.daemon.tick()
    finally:
        del USERS["carol"]
    assert w.state(second) is JobState.RUNNING and w.state(first) is JobState.QUEUED
    shares = {a["user"]: a for a in w.client(ROOT).get("/v1/shares").json()["accounts"] if a["user"]}
    assert shares["carol"]["weight"] == 3 and shares["alice"]["weight"] == 1
    assert shares["alice"]["norm_shares"] == 0.25


def test_restart_keeps_usage_rebuilt_from_history(tmp_path: Path) -> None:
    w = World(tmp_path, "[queues.default]\n", gpus=1)
    j = w.submit("alice")
    w.daemon.tick()
    w.clock.t += 7200
    w.executor.finish(j)
    w.daemon.tick()
    before = w.client(ROOT).get("/v1/shares").json()
    again = World(tmp_path, "[queues.default]\n", gpus=1, store=w.store)  # a new daemon over the same store
    again.clock.t = w.clock.t
    again.queues.rebuild(again.store, again.clock())
    after = again.client(ROOT).get("/v1/shares").json()
    alice = [a for a in after["accounts"] if a["user"] == "alice"]
    assert alice and alice == [a for a in before["accounts"] if a["user"] == "alice"]
    assert alice[0]["usage"]["gpu_milli"] == pytest.approx(7200 * 1000, rel=0.01)


def test_priority_bounds_and_who_may_exceed_them(tmp_path: Path) -> None:
    toml = 'admins = ["bob"]\n[queues.default]\nmax_priority = 10\n[users.alice]\nmax_priority = 5\n'
    w = World(tmp_path, toml)
    with pytest.raises(Forbidden, match=r"priority: 7 is above the bound of user alice, 5 \(only root or an admin"):
        w.submit("alice", priority=7)
    w.submit("alice", priority=5)
    group = grp.getgrgid(os.getgid()).gr_name
    w.path.write_text(toml + f"[groups.{group}]\nmax_priority = 2\n")
    w.queues.reload(w.store, w.clock())
    USERS["carol"] = (os.getuid() + 7000, os.getgid())
    try:
        with pytest.raises(Forbidden, match=f"priority: 3 is above the bound of group {group}, 2"):
            w.submit("carol", priority=3)
    finally:
        del USERS["carol"]
    w.submit("bob", priority=50)  # an admin
    w.submit("root", priority=5000)
    r = w.client(ALICE).post("/v1/jobs", json={"command": ["x"], "priority": 11})
    assert r.status_code == 403
    assert r.json() == {"detail": {"field": "priority", "message": "11 is above the bound of queue 'default', 10 "
                                   "(only root or an admin may exceed it)"}}  # fmt: skip
    assert w.client(ROOT).post("/v1/jobs", json={"command": ["x"], "priority": 11}).status_code == 201
    # the API's own bound for users (-100..100) does not hold an admin of the queues file either
    assert w.client(BOB).post("/v1/jobs", json={"command": ["x"], "priority": 500}).status_code == 201
    r = w.client(ALICE).post("/v1/jobs", json={"command": ["x"], "priority": 101})
    assert r.status_code == 403 and r.json()["detail"]["message"] == (
        "must be in -100..100 (only root or an admin of the queues file may go beyond), got 101"
    )
    # and the README and docs say so, as the code does (issue 23: the README said root only)
    root_dir = Path(__file__).resolve().parents[2]
    readme = " ".join((root_dir / "README.md").read_text().split())
    assert "priorities -100..100 for users (root and the queues file's admins may go beyond" in readme
    queues_doc = " ".join((root_dir / "docs" / "queues.md").read_text().split())
    assert "Root (uid 0) and the file's `admins` / `admin_groups` may exceed every bound: the file's and the API's" \
        in queues_doc  # fmt: skip


def test_a_queue_names_who_may_submit_and_an_unknown_queue_is_refused(tmp_path: Path) -> None:
    w = World(tmp_path, '[queues.train]\nsubmitters = ["bob"]\nlimit = { gpus = 2 }\n')
    r = w.client(ALICE).post("/v1/jobs", json={"command": ["x"], "queue": "train"})
    assert r.status_code == 403 and r.json()["detail"] == {
        "field": "queue", "message": "user alice may not submit to queue 'train'"}  # fmt: skip
    r = w.client(ALICE).post("/v1/jobs", json={"command": ["x"], "queue": "nope"})
    assert r.status_code == 422 and r.json()["detail"] == {
        "field": "queue", "message": "no queue 'nope' (queues: default, train)"}  # fmt: skip
    r = w.client(BOB).post("/v1/jobs", json={"command": ["x"], "queue": "train"})
    assert r.status_code == 201 and r.json()["queue"] == "train"
    r = w.client(BOB).post("/v1/jobs", json={"command": ["x"], "queue": "train", "gpus": 3})  # over its limit
    assert r.status_code == 422 and r.json()["detail"] == {"field": "queue", "message": "the job asks for 3 GPUs, "
                                                           "more than queue 'train''s limit of 2 GPUs: it could never "
                                                           "start"}  # fmt: skip
    assert w.client(ALICE).post("/v1/jobs", json={"command": ["x"]}).json()["queue"] == "default"


def test_a_marathon_app_names_its_queue_by_a_label(tmp_path: Path) -> None:
    w = World(tmp_path, "[queues.train]\n")
    lock = threading.Lock()
    routers = install_extensions(w.daemon, lock, lambda: None)  # Marathon's face among them
    app = create_app(w.daemon, lock, lambda: None, clock=w.clock, routers=routers)
    c = TestClient(AsPeer(app, ALICE, "unix"))
    r = c.post("/marathon/v2/apps", json={"id": "/web", "cmd": "sleep 100", "cpus": 0.1, "mem": 32, "instances": 1,
                                          "labels": {"corral.queue": "train"}})  # fmt: skip
    assert r.status_code == 201, r.text
    assert "labels" in r.json() and r.json()["labels"] == {"corral.queue": "train"}  # the peer's shape, unchanged
    w.daemon.tick()
    jobs = w.store.list()
    assert [j.spec.queue for j in jobs] == ["train"]


def test_reload_takes_a_good_file_and_keeps_the_old_for_a_bad_one(tmp_path: Path) -> None:
    w = World(tmp_path, "[queues.train]\nlimit = { gpus = 1 }\n")
    a, b = w.submit(queue="train"), w.submit(queue="train")
    w.daemon.tick()
    assert w.state(b) is JobState.QUEUED
    w.path.write_text("[queues.train]\nlimit = { gpus = -2 }\n")
    assert w.client(ALICE).post("/v1/queues/reload").status_code == 403  # not an admin
    r = w.client(ROOT).post("/v1/queues/reload")
    assert r.status_code == 422
    assert r.json()["detail"]["field"] == "queues"
    assert r.json()["detail"]["message"] == (
        f"{w.path}: queues.train.limit.gpus: must not be negative, got -2; the old configuration stays"
    )
    assert w.queues.config.queues["train"].limit.gpus == 1000  # milli
    w.path.write_text("[queues.train]\nlimit = { gpus = 2 }\n[queues.new]\n")
    r = w.client(ROOT).post("/v1/queues/reload")
    assert r.status_code == 200 and r.json()["queues"] == ["default", "new", "train"]
    w.daemon.tick()
    assert w.state(a) is JobState.RUNNING and w.state(b) is JobState.RUNNING
    # a queue that disappears: its jobs wait, said why, and are not lost
    c = w.submit(queue="new")
    w.path.write_text("[queues.train]\n")
    assert w.client(ROOT).post("/v1/queues/reload").status_code == 200
    w.daemon.tick()
    assert w.state(c) is JobState.QUEUED
    assert w.reason(c).startswith("queue 'new' does not exist (any more): the job waits until the queues file")
    rows = w.client(ALICE).get("/v1/queues").json()["queues"]
    assert {"name": "new", "missing": True, "pending": 1, "running": 0} in rows
    with pytest.raises(InvalidRequest, match="no queue 'new'"):
        w.submit(queue="new")


def test_explain_tells_the_queue_position_and_the_limit(tmp_path: Path) -> None:
    w = World(tmp_path, "[queues.train]\nlimit = { gpus = 1 }\n[queues.dev]\n", gpus=2)
    w.submit(queue="train")
    held = w.submit(queue="train")
    w.submit(queue="dev", gpus=2)
    third = w.submit(queue="train")
    w.daemon.tick()
    data = w.client(ALICE).get(f"/v1/jobs/{third}/explain").json()
    limit = "queue 'train' is at its limit of 1 GPU (1 GPU in use, the job asks for 1 GPU)"
    assert (data["queue"], data["queue_position"], data["queue_queued"], data["ahead"]) == ("train", 2, 2, 2)
    assert data["limit"] == limit and data["reason"] == limit
    assert data["story"].startswith(f"2nd of 2 in queue 'train'; 2 jobs ahead across the machine. Held back by a "
                                    f"limit: {limit}.")  # fmt: skip
    assert w.client(ALICE).get(f"/v1/jobs/{held}/explain").json()["story"].startswith("1st of 2 in queue 'train'")


def test_no_starvation_with_queues_and_fair_share_on(tmp_path: Path) -> None:
    """The issue's check with queues on: bob's 4-GPU job in 'train' starts when its reservation said, while alice
    streams 1-GPU jobs into 'dev'."""
    w = World(tmp_path, "[queues.train]\nweight = 1\n[queues.dev]\nweight = 1\n")
    for _ in range(4):
        w.submit("alice", queue="dev", limit=100)
        assert len(w.daemon.tick()) == 1
        w.clock.t += 25
    big = w.submit("bob", gpus=4, queue="train")
    predicted: float | None = None
    started_at: float | None = None
    for i in range(200):
        if i % 2 == 0:
            w.submit("alice", queue="dev", limit=100)
        for j in w.store.list([JobState.RUNNING]):
            if j.spec.time_limit_s is not None and j.started_at is not None and w.clock.t >= j.started_at + 100:
                w.executor.expire(j.id)
        if big in w.daemon.tick():
            started_at = w.clock.t
            break
        if predicted is None:
            assert w.daemon.reservation is not None and w.daemon.reservation.job_id == big
            predicted = w.daemon.reservation.start
        w.clock.t += 5
    assert predicted is not None and started_at is not None, "the 4-GPU job never started"
    assert started_at <= predicted + 5


def test_queue_list_and_show_print_what_the_daemon_returns(tmp_path: Path) -> None:
    w = World(
        tmp_path, '[queues.train]\nweight = 2\nguarantee = { gpus = 1 }\nlimit = { gpus = 2, memory = "64GiB" }\n'
    )
    j = w.submit("alice", queue="train")
    w.daemon.tick()
    w.clock.t += 3600
    w.executor.finish(j)
    w.daemon.tick()
    w.submit("bob", queue="train")
    waiting = w.submit("bob", queue="train", gpus=2)  # over the queue's limit of 2 GPUs with the first
    w.daemon.tick()
    listed = w.client(BOB).get("/v1/queues").json()
    assert list_lines(listed) == [
        ["default (default)", "1", "-", "-", "-", "-", "0", "0"],
        ["train", "2", "gpus=1", "gpus=2 memory=64GiB", "gpus=1 gpu_milli=1000 gpu_memory=80GiB cpus=1 memory=1GiB",
         "-", "1", "1"],
    ]  # fmt: skip
    shares = w.client(ROOT).get("/v1/shares").json()
    lines = share_lines(shares, "train")
    assert [line[0] for line in lines] == ["train", "  alice", "  bob"]
    assert [line[0] for line in share_lines(w.client(BOB).get("/v1/shares").json(), "train")] == [
        "train", "  another user", "  bob"]  # fmt: skip
    assert lines[1][3] == "1.00"  # alice: one decayed GPU-hour (half-life 7 d: a second's decay is not seen)
    jobs = w.client(BOB).get("/v1/jobs", params={"state": "queued"}).json()
    assert [p[:4] for p in priority_lines(jobs, shares, w.clock.t)] == [[waiting, "train", "bob", "0"]]
    one: dict[str, Any] = w.client(BOB).get("/v1/queues/train").json()
    assert one["name"] == "train" and one["guarantee"] == {"gpus": 1}
    assert w.client(BOB).get("/v1/queues/nope").json() == {"detail": {"field": "queue", "message": "no queue 'nope'"}}


# ------------------------------------------------------------------------------------------------ corral serve
CLI = [sys.executable, "-m", "corral.cli.main"]


def run_cli(sock: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORRAL_SOCKET": str(sock), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("CORRAL_URL", None)
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, env=env)


def test_serve_reads_the_default_file_reloads_on_sighup_and_refuses_a_bad_one(tmp_path: Path) -> None:
    state, sock = tmp_path / "state", tmp_path / "s.sock"
    state.mkdir(mode=0o700)
    (state / "queues.toml").write_text("[queues.train]\nlimit = { gpus = 1 }\n")  # the default location
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    serve = [*CLI, "serve", "--simulate-gpus", "2xA100-80GB", "--state-dir", str(state), "--socket", str(sock)]
    server = subprocess.Popen(serve, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sock.exists(), server.communicate(timeout=5)[0] if server.poll() is not None else "no socket"
        listed = json.loads(run_cli(sock, "queue", "list", "--json").stdout)
        assert listed["fair_share"] and [q["name"] for q in listed["queues"]] == ["default", "train"]
        assert run_cli(sock, "submit", "--queue", "train", "--", "true").returncode == 0
        refused = run_cli(sock, "submit", "--queue", "nope", "--", "true")
        assert refused.returncode == 2
        assert refused.stderr.strip() == "error: --queue: no queue 'nope' (queues: default, train)"
        (state / "queues.toml").write_text("[queues.train]\nlimit = { gpus = 1 }\nguarantee = { gpus = 3 }\n")
        bad = run_cli(sock, "queue", "reload")
        assert bad.returncode == 2 and "queues.train.guarantee.gpus: is 3, above the queue's limit of 1; the old " \
            "configuration stays" in bad.stderr  # fmt: skip
        (state / "queues.toml").write_text("[queues.train]\n[queues.dev]\n")
        server.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        names: list[str] = []
        while "dev" not in names and time.monotonic() < deadline:
            names = [q["name"] for q in json.loads(run_cli(sock, "queue", "list", "--json").stdout)["queues"]]
            time.sleep(0.1)
        assert names == ["default", "dev", "train"]
        shown = run_cli(sock, "queue", "show")
        assert shown.returncode == 0 and shown.stdout.split()[:2] == ["ACCOUNT", "WEIGHT"], shown.stdout
    finally:
        server.send_signal(signal.SIGTERM)
        output = server.communicate(timeout=20)[0]
    assert server.returncode == 0, output
    # a bad file stops the start, naming the file, the key and the rule
    (state / "queues.toml").write_text("[queues.train]\nweight = -1\n")
    done = subprocess.run(serve, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    file = state / "queues.toml"
    assert done.stderr.strip() == f"error: --queues: {file}: queues.train.weight: must be > 0 and at most 1e+06, got -1"
    # a hostile one too, at once and naming the bound (issue 23)
    (state / "queues.toml").write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    done = subprocess.run(serve, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"error: --queues: {file}: line 1: arrays and inline tables nested more than 16 deep (the most a queues file "
        "may nest)"
    )


def test_a_hostile_file_on_reload_is_a_422_naming_the_bound_and_the_old_stays(tmp_path: Path) -> None:
    """Issue 23: 100,000 nested arrays answered 500 (RecursionError); 200,000 tables took over 15 s to reload."""
    w = World(tmp_path, "[queues.train]\nlimit = { gpus = 1 }\n")
    root = w.client(ROOT)
    for text, words in (
        ("a = " + "[" * 100_000 + "]" * 100_000 + "\n", "line 1: arrays and inline tables nested more than 16 deep"),
        ("".join(f"[queues.q{i}]\n" for i in range(200_000)), "the file is more than 1048576 bytes"),
        ("".join(f"[queues.q{i}]\n" for i in range(1001)), "queues: 1001 queues, more than the 1000 a file may have"),
    ):
        w.path.write_text(text)
        r = root.post("/v1/queues/reload")
        assert r.status_code == 422, r.text
        assert r.json()["detail"]["field"] == "queues"
        assert r.json()["detail"]["message"].startswith(f"{w.path}: {words}")
        assert r.json()["detail"]["message"].endswith("; the old configuration stays")
        assert set(w.queues.config.queues) == {"default", "train"}


def test_a_daemon_started_without_a_file_takes_one_on_reload(tmp_path: Path) -> None:
    w = World(tmp_path, None)
    w.queues.path = w.path  # what corral serve does: the default location, read once it exists
    r = w.client(ROOT).post("/v1/queues/reload")
    assert r.status_code == 422 and r.json()["detail"]["message"] == (
        f"no queues file at {w.path} (or start corral serve with --queues FILE); the old configuration stays"
    )
    assert not w.client(ROOT).get("/v1/queues").json()["fair_share"]
    w.path.write_text('half_life = "1d"\n[queues.train]\n')
    assert w.client(ROOT).post("/v1/queues/reload").status_code == 200
    listed = w.client(ROOT).get("/v1/queues").json()
    assert listed["fair_share"] and listed["half_life_s"] == 86400 and listed["source"] == str(w.path)


def test_a_new_half_life_on_reload_rebuilds_usage_from_history(tmp_path: Path) -> None:
    w = World(tmp_path, 'half_life = "7d"\n[queues.default]\n', gpus=1)
    j = w.submit("alice")
    w.daemon.tick()
    w.clock.t += 3600
    w.executor.finish(j)
    w.daemon.tick()
    w.clock.t += 86400  # a day later
    week = next(a for a in w.client(ROOT).get("/v1/shares").json()["accounts"] if a["user"] == "alice")
    w.path.write_text('half_life = "1d"\n[queues.default]\n')
    assert w.client(ROOT).post("/v1/queues/reload").status_code == 200
    day = next(a for a in w.client(ROOT).get("/v1/shares").json()["accounts"] if a["user"] == "alice")
    # one GPU-hour a day ago: 2^(-1/7) of it with a week's half-life, about half of it with a day's
    assert week["usage"]["gpu_milli"] / 3.6e6 == pytest.approx(2 ** (-1 / 7), rel=0.01)
    assert day["usage"]["gpu_milli"] / 3.6e6 == pytest.approx(0.5, rel=0.02)
