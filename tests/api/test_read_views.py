"""Read views on a new user's first day (issue 23, items 11 and 12), in-process: the API's answers for a running job,
a gang's logs and a preempted job, and the words the CLI makes of them (corral.cli.views), each text checked.

A daemon on the README's default machine (4 simulated H100-80GB, UUIDs SIM-GPU-0-K) with the fake executor under
the gang executor and a clock the test moves (so a minimum runtime before preemption, if one is set, has passed).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.cli.views import explain_text, held_text, short_reason, show_lines
from corral.daemon.core import Daemon
from corral.daemon.gang import GangExecutor, instance_log
from corral.daemon.queues import Queues
from corral.daemon.scheduler import clock_text
from corral.executor.fake import FakeExecutor
from corral.gpu.simulated import parse_simulated_inventory
from corral.placement import PlacementConfig
from corral.store import MemoryStore
from tests.api.test_api import ALICE, BOB, AsPeer

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


class Box:
    def __init__(self, tmp_path: Path, queues_file: Path | None = None) -> None:
        self.clock = Clock()
        self.store = MemoryStore()
        self.fake = FakeExecutor()
        executor = GangExecutor(self.fake, lambda jid: j.spec.instances if (j := self.store.get(jid)) else 1)
        node = parse_simulated_inventory("4xH100-80GB")[0]
        # a minimum runtime of 0: these tests read who may preempt a job that has just started
        queues = Queues.open(queues_file, node) if queues_file is not None else Queues(node, min_runtime_s=0)
        self.daemon = Daemon(
            self.store, executor, node, PlacementConfig(), tmp_path, clock=self.clock, preempt_grace_s=1, queues=queues
        )
        self.lock = threading.Lock()
        self.app = create_app(self.daemon, self.lock, lambda: None, clock=self.clock)

    def client(self, peer: tuple[int, int, str] = ALICE) -> TestClient:
        return TestClient(AsPeer(self.app, peer, "unix"), raise_server_exceptions=False)

    def submit(self, peer: tuple[int, int, str] = ALICE, **body: Any) -> str:
        r = self.client(peer).post("/v1/jobs", json={"command": ["sleep", "300"], "cpus": "1", **body})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def tick(self) -> None:
        with self.lock:
            self.daemon.tick()

    def explain(self, job_id: str, peer: tuple[int, int, str] = ALICE) -> dict[str, Any]:
        r = self.client(peer).get(f"/v1/jobs/{job_id}/explain")
        assert r.status_code == 200, r.text
        return dict(r.json())


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


# ------------------------------------------------------------------------------------------------ item 12: explain
def test_explain_a_running_job_says_its_gpus_start_time_left_and_who_may_preempt_it(box: Box) -> None:
    whole = box.submit(gpus=1, time_limit="1h")
    share = box.submit(gpus=1, gpu_fraction=0.3, gpu_memory="10GiB", preemptible=False)
    box.tick()
    box.clock.t += 125
    data = box.explain(whole)
    assert data["state"] == "running"
    assert data["gpus"] == [{"index": 0, "uuid": "SIM-GPU-0-0", "milli": 1000, "memory_mib": 81920}]
    assert data["started_at"] == T0 and data["time_limit_s"] == 3600 and data["ends_at"] == T0 + 3600
    assert data["preemptible_now"] is True and data["may_be_preempted_by"] == []
    assert explain_text(whole, data) == [
        f"job {whole} is running",
        "It holds GPU 0 (SIM-GPU-0-0).",
        f"Started at {clock_text(T0)} (2m 5s ago).",
        f"Time left: 57m 55s of its 1h limit (stopped at {clock_text(T0 + 3600)}).",
        "It may be preempted by a waiting job of a priority above its 0; no job waiting now may.",
    ]
    said = explain_text(share, box.explain(share))
    assert said[1:] == [
        "It holds GPU 1 (SIM-GPU-0-1): 300 milli of compute and 10 GiB of memory.",
        f"Started at {clock_text(T0)} (2m 5s ago).",
        "No time limit.",
        "It cannot be preempted: it was submitted with --no-preempt.",
    ]
    # A waiting job of a higher priority (needing three whole GPUs: two free, so one must be freed) may preempt it.
    big = box.submit(peer=BOB, gpus=3, priority=5)  # no round yet: nothing is signalled, the view is read
    data = box.explain(whole)
    assert data["may_be_preempted_by"] == [big] and data["preemptible_now"] is True
    # ... and the waiting job's explain says what it may preempt (not the --no-preempt share)
    waits = box.explain(big, BOB)
    assert waits["may_preempt"] == [whole]
    assert (
        f"It may preempt job {whole} (a lower priority), once it is first in the queue and does not fit otherwise."
        in explain_text(big, waits)
    )
    assert (
        f"It may be preempted by a waiting job of a priority above its 0: job {big} may, if they do not fit "
        "otherwise." in explain_text(whole, data)
    )


def test_explain_with_queues_says_a_job_within_its_guarantee_cannot_be_preempted(tmp_path: Path) -> None:
    queues = tmp_path / "queues.toml"
    text = "min_runtime = 0\n[queues.dev]\nguarantee = { gpus = 1 }\n[queues.train]\nguarantee = { gpus = 1 }\n"
    queues.write_text(text)
    box = Box(tmp_path / "state", queues)
    within = box.submit(gpus=1, queue="dev")
    box.tick()
    beyond = box.submit(gpus=2, queue="dev")  # dev borrows: this one holds more than dev's guarantee
    box.tick()
    box.tick()  # the rules read the last round's holdings
    assert explain_text(within, box.explain(within))[-1] == (
        "It cannot be preempted now: it runs within its queue 'dev''s guarantee."
    )
    said = explain_text(beyond, box.explain(beyond))[-1]
    assert said == (
        "It may be preempted by a waiting job of a priority above its 0 or of a queue below its guarantee (it "
        "borrows above its own queue's); no job waiting now may."
    )
    reclaim = box.submit(gpus=2, queue="train")  # train is below its guarantee: it may reclaim from dev's borrower
    data = box.explain(beyond)
    assert data["may_be_preempted_by"] == [reclaim] and data["preemptible_now"] is True


def test_explain_a_running_gang_says_each_instances_gpus(box: Box) -> None:
    gang = box.submit(gpus=1, instances=2, gang=True)
    box.tick()
    said = explain_text(gang, box.explain(gang))
    assert said[1] == "It holds instance 0: GPU 0 (SIM-GPU-0-0); instance 1: GPU 1 (SIM-GPU-0-1)."


# ------------------------------------------------------------------------------------------------ item 12: show
def test_show_says_the_index_and_uuid_of_each_gpu_held(box: Box) -> None:
    whole = box.submit(gpus=1)
    share = box.submit(gpus=1, gpu_fraction=0.3, gpu_memory="10GiB")
    by_memory = box.submit(gpus=1, gpu_memory="10GiB")
    gang = box.submit(gpus=1, instances=2, gang=True)
    none = box.submit()
    box.tick()
    shown = {j: dict(show_lines(box.client().get(f"/v1/jobs/{j}").json())) for j in (whole, share, by_memory, gang)}
    assert shown[whole]["gpus held"] == "0 (SIM-GPU-0-0)"  # was "0": an index alone, read as "none" by some
    assert shown[share]["gpus held"] == "1 (SIM-GPU-0-1): 300m of compute, 10GiB"
    assert shown[by_memory]["gpus held"] == "1 (SIM-GPU-0-1): 10GiB"
    assert shown[gang]["gpus held"] == "instance 0: 2 (SIM-GPU-0-2); instance 1: 3 (SIM-GPU-0-3)"
    assert dict(show_lines(box.client().get(f"/v1/jobs/{none}").json()))["gpus held"] == "-"
    assert held_text({"gpus": [{"index": 0, "milli": 1000, "memory_mib": 0}]}) == "0"  # an older daemon: no uuid


# ------------------------------------------------------------------------------------------------ item 12: ps
def test_ps_reason_of_a_preempted_job_says_by_whom_when_and_why_it_waits_now(box: Box) -> None:
    low = box.submit(gpus=4)
    box.tick()
    box.clock.t += 3600  # past any minimum runtime before a preemption
    high = box.submit(peer=BOB, gpus=1, priority=5)
    box.tick()  # plans the preemption: SIGTERM to the victim (the fake ends it at once)
    running = box.client().get(f"/v1/jobs/{low}").json()
    if running["state"] == "running":
        assert short_reason(running, box.clock.t) == f"being preempted by job {high}"
        box.tick()  # its exit: back to the queue
    queued = box.client().get(f"/v1/jobs/{low}").json()
    assert queued["state"] == "queued"
    # Between its exit and the next round its reason is the preemption's own words: said once, not twice.
    just_stopped = dict(queued, reason=queued["preempted"]["reason"] + " and is queued again")
    assert short_reason(just_stopped, box.clock.t) == f"preempted by job {high} (now); queued again"
    box.tick()
    box.clock.t += 180
    rows = {j["id"]: j for j in box.client().get("/v1/jobs").json()}
    assert rows[low]["state"] == "queued"
    assert short_reason(rows[low], box.clock.t) == (
        f"preempted by job {high} (3m ago); insufficient GPU (need 4 whole GPUs)"
    )  # was "insufficient GPU (need 4 whole GPUs)": the preemption was not said
    again = dict(rows[low], preempted={**rows[low]["preempted"], "count": 2})
    assert short_reason(again, box.clock.t).startswith(f"preempted 2x, last by job {high} (3m ago); ")
    assert short_reason(dict(rows[low], preempted=None), box.clock.t) == "insufficient GPU (need 4 whole GPUs)"


# ------------------------------------------------------------------------------------------------ item 11: logs
def test_logs_of_a_gangs_instances_by_query_parameter(box: Box, tmp_path: Path) -> None:
    gang = box.submit(gpus=1, instances=3, gang=True)
    alone = box.submit()
    box.tick()
    log = box.daemon.log_path(gang)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"zero\n")
    for k in (1, 2):
        instance_log(log, k).write_bytes(f"instance {k}\n".encode())
    c = box.client()
    r = c.get(f"/v1/jobs/{gang}/logs")
    assert r.text == "zero\n" and r.headers["X-Corral-Instances"] == "3"
    r = c.get(f"/v1/jobs/{gang}/logs", params={"instance": 2, "offset": 2})
    assert r.text == "stance 2\n" and r.headers["X-Corral-Next-Offset"] == "11"
    r = c.get(f"/v1/jobs/{gang}/logs", params={"instance": 3})
    assert r.status_code == 422
    assert r.json()["detail"] == {"field": "instance", "message": f"job {gang} has instances 0..2, not instance 3"}
    r = c.get(f"/v1/jobs/{alone}/logs", params={"instance": 1})
    assert r.json()["detail"]["message"] == f"job {alone} has instance 0 only, not instance 1"
    assert c.get(f"/v1/jobs/{alone}/logs").headers["X-Corral-Instances"] == "1"
    assert box.client(BOB).get(f"/v1/jobs/{gang}/logs", params={"instance": 1}).status_code == 404


def test_a_log_replaced_by_a_link_or_a_fifo_is_never_read_through(box: Box, tmp_path: Path) -> None:
    # The daemon alone writes in its logs folder, but the log route still opens without following a link and reads
    # only a regular file (a FIFO would hang the request's thread).
    linked = box.submit()
    piped = box.submit()
    box.tick()
    secret = tmp_path / "secret"
    secret.write_text("not for the job's owner")
    log = box.daemon.log_path(linked)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    log.symlink_to(secret)
    r = box.client().get(f"/v1/jobs/{linked}/logs")
    assert r.status_code == 422 and "not for" not in r.text
    assert r.json()["detail"]["field"] == "logs"
    fifo = box.daemon.log_path(piped)
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    r = box.client().get(f"/v1/jobs/{piped}/logs")
    assert r.status_code == 422
    assert r.json()["detail"] == {"field": "logs", "message": f"the log of job {piped} is not a regular file"}


def test_a_job_past_its_time_limit_is_shown_ending_until_it_has_stopped(box: Box) -> None:
    # Issue 23, item 1: the grant is released only once nothing of the job runs; until then it says why it is held.
    job = box.submit(gpus=1, time_limit="1m")
    box.tick()
    box.clock.t += 59
    box.tick()
    running = box.store.get(job)
    assert running is not None and not running.reason.startswith("ending")
    box.clock.t += 2
    box.tick()
    said = box.explain(job)
    assert said["state"] == "running" and said["reason"] == (
        "ending: past its time limit (1m): its processes are being stopped; its GPUs go to the next job once none of "
        "them runs"
    )
    assert short_reason({"state": "running", "reason": said["reason"]}) == "ending: past its time limit (1m)"
    assert short_reason({"state": "running", "reason": "cancel requested"}) == "cancel requested"
    assert short_reason({"state": "running", "reason": "placed on GPU 0"}) == "-"
