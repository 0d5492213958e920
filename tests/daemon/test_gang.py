"""Gangs: all instances or none (placement, pure), and real processes: each instance its own process and GPUs, one
failing stops the others and the gang retries as one; a restart reads every instance's record."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.cli.views import show_lines
from corral.daemon.core import Daemon
from corral.daemon.gang import GangExecutor, place_gang
from corral.daemon.queues import Queues
from corral.executor.fake import FakeExecutor
from corral.executor.local import LocalExecutor
from corral.gpu.simulated import parse_simulated_inventory
from corral.jobs.model import JobSpec, JobState
from corral.model.errors import InvalidRequest
from corral.model.resources import GpuBehavior, Request
from corral.placement import PlacementConfig
from corral.store import MemoryStore, SqliteStore
from corral.store.base import Store
from tests.api.test_api import ALICE, AsPeer
from tests.builders import cluster, node
from tests.daemon.test_preemption import wait_for

CONFIG = PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)


def one_gpu(milli: int = 1000) -> Request:
    return Request(cpu_milli=100, memory_mib=64, gpu_count=1, gpu_milli=milli)


# ------------------------------------------------------------------------------------------------ placement (pure)
def test_a_gang_is_placed_whole_or_not_at_all_and_says_how_many_fit() -> None:
    s = cluster(node("box").gpus(4).cpu(32).mem(128))
    r = Request(cpu_milli=100, memory_mib=64, gpu_count=1, gpu_milli=1000, id="7")
    three = place_gang(s, r, 3, CONFIG, 0)
    assert three.allocation is not None and len(set(three.allocation.gpu_indices)) == 3
    assert three.allocation.cpu_milli == 300 and s.allocations == {}  # the snapshot is not touched
    hog = place_gang(s, Request(cpu_milli=100, memory_mib=64, gpu_count=2, gpu_milli=1000, id="1"), 1, CONFIG, 0)
    assert hog.allocation is not None
    s.allocate(hog.allocation)
    two_left = place_gang(s, r, 3, CONFIG, 0)
    assert two_left.allocation is None and two_left.fitted == 2
    assert two_left.reason().startswith("2 of 3 instances fit (a gang starts all or none); instance 3: 0/1 nodes fit")


def test_the_instances_of_a_gang_of_shares_get_gpus_of_their_own() -> None:
    s = cluster(node("box").gpus(2).cpu(32).mem(128))
    r = Request(cpu_milli=100, memory_mib=64, gpu_count=1, gpu_milli=300, id="5")
    both = place_gang(s, r, 2, CONFIG, 0)
    assert both.allocation is not None and sorted(both.allocation.gpu_indices) == [0, 1]
    assert place_gang(s, r, 3, CONFIG, 0).fitted == 2  # a third would share a GPU with another instance


# ------------------------------------------------------------------------------------------------ real processes
@pytest.fixture
def gang_daemon(tmp_path: Path) -> Iterator[tuple[Daemon, Store, GangExecutor]]:
    store = MemoryStore()
    inner = LocalExecutor(run_dir=tmp_path / "run", grace_s=1.0)
    ex = GangExecutor(inner, lambda jid: j.spec.instances if (j := store.get(jid)) is not None else 1, stop_grace_s=1)
    box4 = parse_simulated_inventory("4xA100-80GB")[0]
    d = Daemon(store, ex, box4, CONFIG, tmp_path)
    yield d, store, ex
    for job_id in ex.running():
        ex.cancel(job_id, grace_s=0)
    deadline = time.monotonic() + 10
    while ex.running() and time.monotonic() < deadline:
        ex.poll()
        time.sleep(0.05)
    inner.close()


def sh(tmp_path: Path, script: str, instances: int = 1, gpus: int = 1, retries: int = 0) -> JobSpec:
    req = Request(cpu_milli=100, memory_mib=64, gpu_count=gpus, gpu_milli=1000)
    uid, gid = os.getuid(), os.getgid()
    gang = instances > 1
    return JobSpec(
        ("sh", "-c", script), req, "me", uid, gid, cwd=str(tmp_path), instances=instances, gang=gang, retries=retries
    )


def until(d: Daemon, what: Callable[[], bool], timeout: float = 20.0) -> None:
    wait_for(what, d, timeout)


def test_three_instances_on_four_gpus_all_start_each_with_its_own_gpu(
    gang_daemon: tuple[Daemon, Store, GangExecutor], tmp_path: Path
) -> None:
    d, store, _ = gang_daemon
    out = tmp_path / "inst"
    job = d.submit(
        sh(tmp_path, f'echo "$CORRAL_JOB_ID $CORRAL_INSTANCES $CUDA_VISIBLE_DEVICES" > {out}.$CORRAL_INSTANCE', 3)
    )
    until(d, lambda: store.get(job.id).state is JobState.SUCCEEDED)  # type: ignore[union-attr]
    lines = {i: (out.parent / f"inst.{i}").read_text().split() for i in range(3)}
    assert all(v[:2] == [job.id, "3"] for v in lines.values())
    assert len({v[2] for v in lines.values()}) == 3  # three GPUs, one each
    done = store.get(job.id)
    assert done is not None and done.attempts == 1 and len(done.gpus) == 3 and done.exit_code == 0


def test_a_gang_that_only_partly_fits_starts_none_and_says_how_many_fit(
    gang_daemon: tuple[Daemon, Store, GangExecutor], tmp_path: Path
) -> None:
    d, store, _ = gang_daemon
    hog = d.submit(sh(tmp_path, "exec sleep 30", gpus=2))
    until(d, lambda: store.get(hog.id).state is JobState.RUNNING)  # type: ignore[union-attr]
    out = tmp_path / "ran"
    job = d.submit(sh(tmp_path, f"touch {out}.$CORRAL_INSTANCE", 3))
    for _ in range(3):
        d.tick()
    waits = store.get(job.id)
    assert waits is not None and waits.state is JobState.QUEUED and waits.attempts == 0
    assert waits.reason.startswith("2 of 3 instances fit (a gang starts all or none); instance 3: 0/1 nodes fit")
    assert not list(tmp_path.glob("ran.*"))  # no instance ran
    with pytest.raises(InvalidRequest, match="instances: can never run on this machine, even idle: 4 of 5 instances"):
        d.submit(sh(tmp_path, "true", 5))
    d.cancel(hog.id)
    until(d, lambda: store.get(job.id).state is JobState.SUCCEEDED)  # type: ignore[union-attr]
    assert sorted(p.name for p in tmp_path.glob("ran.*")) == ["ran.0", "ran.1", "ran.2"]


def test_one_instance_failing_stops_the_others_and_the_gang_retries_as_one(
    gang_daemon: tuple[Daemon, Store, GangExecutor], tmp_path: Path
) -> None:
    d, store, _ = gang_daemon
    runs, stopped = tmp_path / "runs", tmp_path / "stopped"
    script = (
        f"echo $CORRAL_INSTANCE >> {runs}; "
        f'if [ "$CORRAL_INSTANCE" = 1 ]; then sleep 0.3; exit 3; fi; '
        f"trap 'echo $CORRAL_INSTANCE >> {stopped}; exit 0' TERM; while :; do sleep 0.05; done"
    )
    job = d.submit(sh(tmp_path, script, 3, retries=1))
    until(d, lambda: store.get(job.id).attempts == 2 and store.get(job.id).state is JobState.RUNNING, timeout=30)  # type: ignore[union-attr]
    assert sorted(stopped.read_text().split()) == ["0", "2"]  # the others got SIGTERM when instance 1 failed
    until(d, lambda: store.get(job.id).state is JobState.FAILED, timeout=30)  # type: ignore[union-attr]
    done = store.get(job.id)
    assert done is not None and done.attempts == 2 and done.exit_code == 3 and done.reason == "exit code 3"
    assert sorted(runs.read_text().split()) == ["0", "0", "1", "1", "2", "2"]  # each attempt ran all three, once
    # each attempt's other two instances got SIGTERM when instance 1 failed (a shell may run its trap twice: a second
    # TERM that arrives while the first trap runs, seen once in a loaded CI run; noted, not asserted here)
    stops = stopped.read_text().split()
    assert set(stops) == {"0", "2"} and stops.count("0") >= 2 and stops.count("2") >= 2


# ------------------------------------------------------------------------------------------------ restart (fake)
def test_a_restart_reads_every_instance_and_ends_the_gang_as_one(tmp_path: Path) -> None:
    store = MemoryStore()
    fake = FakeExecutor(cancel_ends=False)

    def count(jid: str) -> int:
        j = store.get(jid)
        return j.spec.instances if j is not None else 1

    box4 = parse_simulated_inventory("4xA100-80GB")[0]
    d = Daemon(store, GangExecutor(fake, count), box4, CONFIG, tmp_path)
    job = d.submit(JobSpec(("x",), one_gpu(), "me", 0, 0, instances=2, gang=True))
    assert d.tick() == [job.id]
    assert sorted(s.job_id for s in fake.launched) == [f"{job.id}_0", f"{job.id}_1"]
    fake2 = fake.restarted()
    fake2.finish(f"{job.id}_0", 0)  # one instance ends while no daemon runs; the other still runs
    d2 = Daemon(store, GangExecutor(fake2, count), box4, CONFIG, tmp_path)
    d2.recover()
    assert store.get(job.id).state is JobState.RUNNING  # type: ignore[union-attr]
    fake2.finish(f"{job.id}_1", 0)
    d2.tick()
    done = store.get(job.id)
    assert done is not None and done.state is JobState.SUCCEEDED and done.attempts == 1
    assert sorted(fake2.forgotten) == [(f"{job.id}_0", 1), (f"{job.id}_1", 1)]


# ------------------------------------------------------------------------------------------------ API and store
def test_the_api_takes_instances_with_gang_and_names_the_field_otherwise(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    ex = GangExecutor(FakeExecutor(), lambda jid: j.spec.instances if (j := store.get(jid)) is not None else 1)
    box4 = parse_simulated_inventory("4xA100-80GB")[0]
    d = Daemon(store, ex, box4, CONFIG, tmp_path)
    alice = TestClient(AsPeer(create_app(d, threading.Lock(), lambda: None), ALICE, "unix"))
    bad = alice.post("/v1/jobs", json={"command": ["x"], "gpus": 1, "instances": 2})
    assert bad.status_code == 422 and bad.json()["detail"]["field"] == "instances"
    assert "ask for gang too" in bad.json()["detail"]["message"]
    huge = alice.post("/v1/jobs", json={"command": ["x"], "gpus": 1, "instances": 65, "gang": True})
    assert huge.status_code == 422 and huge.json()["detail"]["field"] == "instances"
    ok = alice.post("/v1/jobs", json={"command": ["x"], "gpus": 2, "instances": 2, "gang": True})
    assert ok.status_code == 201, ok.text
    assert (ok.json()["instances"], ok.json()["gang"]) == (2, True)
    assert ("instances", "2 (a gang: all or none)") in show_lines(ok.json(), 0)
    assert d.tick() == [ok.json()["id"]]
    shown = alice.get(f"/v1/jobs/{ok.json()['id']}").json()
    assert len(shown["gpus"]) == 4 and shown["state"] == "running"  # two instances of two GPUs each
    store.close()
    again = SqliteStore(tmp_path / "jobs.db").get(ok.json()["id"])  # what the store keeps of it
    assert again is not None and (again.spec.instances, again.spec.gang, again.spec.preemptible) == (2, True, True)


def test_a_daemon_whose_executor_runs_one_process_per_job_refuses_gangs(tmp_path: Path) -> None:
    box4 = parse_simulated_inventory("4xA100-80GB")[0]
    d = Daemon(MemoryStore(), FakeExecutor(), box4, CONFIG, tmp_path)
    with pytest.raises(InvalidRequest, match="instances: this daemon's executor runs one process per job"):
        d.submit(JobSpec(("x",), one_gpu(), "me", 0, 0, instances=2, gang=True))


def test_a_gang_is_preempted_as_one_and_queued_again(tmp_path: Path) -> None:
    store = MemoryStore()
    fake = FakeExecutor()  # a cancel ends the process at once
    ex = GangExecutor(fake, lambda jid: j.spec.instances if (j := store.get(jid)) is not None else 1)
    box4 = parse_simulated_inventory("4xA100-80GB")[0]
    d = Daemon(store, ex, box4, CONFIG, tmp_path, preempt_grace_s=5, queues=Queues(box4, min_runtime_s=0))
    two_by_two = Request(cpu_milli=100, memory_mib=64, gpu_count=2, gpu_milli=1000)
    gang = d.submit(JobSpec(("x",), two_by_two, "me", 0, 0, instances=2, gang=True))
    assert d.tick() == [gang.id]
    high = d.submit(
        JobSpec(("y",), Request(cpu_milli=100, memory_mib=64, gpu_count=1, gpu_milli=1000, priority=5), "me", 0, 0)
    )
    d.tick()
    assert sorted(fake.cancelled) == [(f"{gang.id}_0", 5.0), (f"{gang.id}_1", 5.0)]  # every instance, one grace
    assert d.tick() == [high.id]  # the gang went back as one; the preemptor took one of its GPUs
    back = store.get(gang.id)
    assert back is not None and back.state is JobState.QUEUED and back.attempts == 1 and back.preempted is not None
    assert back.reason.startswith("1 of 2 instances fit (a gang starts all or none)")  # it waits for both
