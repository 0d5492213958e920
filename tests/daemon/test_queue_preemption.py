"""Preemption wired to the queues (docs/preemption.md, docs/queues.md): a queue below its guarantee reclaims what
another borrows, at equal priority; only the borrowed excess is taken; a job that may not be preempted starts only
within its queue's guarantee, and one that never could is refused at submission."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.jobs.model import JobSpec, JobState
from corral.model.errors import InvalidRequest
from corral.model.resources import Request
from tests.daemon.test_queues import USERS, World

GUARANTEED = """
min_runtime = "0s"  # these tests are about who may reclaim what (the minimum runtime: test_preemption.py)
[queues.a]
guarantee = { gpus = 2 }
[queues.b]
guarantee = { gpus = 2 }
[queues.scratch]
"""


def submit(w: World, queue: str, gpus: int = 1, preemptible: bool = True, user: str = "alice") -> str:
    uid, gid = USERS[user]
    request = Request(cpu_milli=1000, memory_mib=1024, gpu_count=gpus, gpu_milli=1000)
    spec = JobSpec(("x",), request, user, uid, gid, queue=queue, preemptible=preemptible, time_limit_s=3600)
    return w.daemon.submit(spec).id


def test_a_queue_below_its_guarantee_reclaims_only_the_borrowed_excess(tmp_path: Path) -> None:
    w = World(tmp_path, GUARANTEED)
    held = []
    for _ in range(4):  # b is idle: a borrows two GPUs above its guarantee of 2
        held.append(submit(w, "a"))
        w.daemon.tick()
        w.clock.t += 10
    assert all(w.state(i) is JobState.RUNNING for i in held)
    wants = submit(w, "b", gpus=2, user="bob")  # same priority: b is below its guarantee
    w.daemon.tick()  # the victims get SIGTERM (the fake executor ends them at once)
    victims = [i for i in held if w.executor.cancelled and i in {c[0] for c in w.executor.cancelled}]
    assert victims == held[2:]  # the latest started are a's excess; its guaranteed two are left alone
    for _ in range(3):
        w.daemon.tick()
    assert w.state(wants) is JobState.RUNNING
    assert [w.state(i) for i in held] == [JobState.RUNNING] * 2 + [JobState.QUEUED] * 2
    back = w.store.get(held[3])
    assert back is not None and back.preempted is not None and "guarantee" in back.preempted.reason


def test_within_its_guarantee_a_queue_is_not_preempted_at_equal_priority(tmp_path: Path) -> None:
    w = World(tmp_path, GUARANTEED)
    mine = [submit(w, "a"), submit(w, "a")]
    theirs = [submit(w, "b", user="bob"), submit(w, "b", user="bob")]
    w.daemon.tick()
    late = submit(w, "scratch", gpus=1)  # guaranteed nothing, equal priority: it waits
    w.daemon.tick()
    w.daemon.tick()
    assert w.executor.cancelled == []
    assert all(w.state(i) is JobState.RUNNING for i in mine + theirs) and w.state(late) is JobState.QUEUED


def test_a_job_that_may_not_be_preempted_starts_only_within_its_guarantee(tmp_path: Path) -> None:
    w = World(tmp_path, GUARANTEED)
    firm = [submit(w, "a", preemptible=False), submit(w, "a", preemptible=False)]
    third = submit(w, "a", preemptible=False)  # would borrow: it waits, though two GPUs are idle
    w.daemon.tick()
    assert [w.state(i) for i in firm] == [JobState.RUNNING] * 2
    assert w.state(third) is JobState.QUEUED
    assert w.reason(third) == "not preemptible: it starts only within its queue's guarantee"
    loose = submit(w, "a")  # a preemptible job of the same queue may borrow them
    w.daemon.tick()
    assert w.state(loose) is JobState.RUNNING
    # and the guaranteed ones are never victims, even of a higher priority
    uid, gid = USERS["bob"]
    urgent = Request(cpu_milli=1000, memory_mib=1024, gpu_count=4, gpu_milli=1000, priority=50)
    w.daemon.submit(JobSpec(("x",), urgent, "bob", uid, gid, queue="b"))
    w.daemon.tick()
    assert not {c[0] for c in w.executor.cancelled} & set(firm)


def test_a_job_that_may_not_be_preempted_and_never_fits_its_guarantee_is_refused(tmp_path: Path) -> None:
    w = World(tmp_path, GUARANTEED)
    with pytest.raises(InvalidRequest, match="queue 'scratch' guarantees none") as nothing:
        submit(w, "scratch", preemptible=False)
    assert nothing.value.field == "preemptible"
    with pytest.raises(InvalidRequest, match="queue 'a' guarantees 2 GPUs of what it asks \\(3 GPUs\\)"):
        submit(w, "a", gpus=3, preemptible=False)
    assert submit(w, "a", gpus=2, preemptible=False)  # exactly its guarantee: accepted
