"""A Marathon app's instances as a gang (label corral.gang "true"): all start together or none does; an instance
that ends while the app wants it takes its gang down and the whole gang starts again (docs/preemption.md "Gangs")."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.jobs.model import JobSpec, JobState
from corral.mesos.errors import ObjectNotValid
from corral.model.resources import Request
from corral.services.controller import LAUNCHES_PER_ROUND
from corral.store import SqliteStore
from tests.services.helpers import ALICE, World, machine

GANG = {"corral.gang": "true"}


def four_gpus(tmp_path: Path) -> World:
    return World(tmp_path, box=machine("A100", "A100", "A100", "A100"))


def hog(world: World, gpus: int) -> str:
    """A plain corral job that holds `gpus` GPUs until the test ends it."""
    spec = JobSpec(
        ("sleep", "1000"), Request(cpu_milli=100, memory_mib=64, gpu_count=gpus, gpu_milli=1000), "bob", 1001, 1001
    )
    job = world.daemon.submit(spec)
    world.tick()
    assert world.store.get(job.id).state is JobState.RUNNING  # type: ignore[union-attr]
    return job.id


def test_a_gang_app_starts_all_its_instances_together(tmp_path: Path) -> None:
    world = four_gpus(tmp_path)
    world.create(instances=3, gpus=1, labels=GANG)
    world.tick()
    running = world.running()
    assert len(running) == 3
    assert len({j.spec.gang_group for j in running}) == 1 and running[0].spec.gang_size == 3
    assert len({g.index for j in running for g in j.gpus}) == 3  # each its own GPU


def test_a_gang_app_that_does_not_fit_whole_starts_none_and_says_why(tmp_path: Path) -> None:
    world = four_gpus(tmp_path)
    other = hog(world, 2)  # 2 of 4 GPUs taken: 2 of the 3 instances would fit
    world.create(instances=3, gpus=1, labels=GANG)
    for _ in range(3):
        world.tick()
    live = world.live()
    assert len(live) == 3 and all(j.state is JobState.QUEUED for j in live), "part of the gang started"
    assert all(not j.gpus for j in live)  # none holds a GPU while it waits
    for job in live:
        assert job.reason.startswith("gang: 2 of 3 instances fit"), job.reason
    assert world.controller.apps["/web"].waiting.startswith("gang: 2 of 3 instances fit")  # the app says it too
    world.executor.finish(other, 0)  # the GPUs come free: the whole gang starts
    world.tick()
    assert len(world.running()) == 3
    world.tick()
    assert world.controller.apps["/web"].waiting == ""


def test_without_the_label_instances_start_one_by_one_as_before(tmp_path: Path) -> None:
    world = four_gpus(tmp_path)
    hog(world, 2)
    world.create(instances=3, gpus=1)
    world.tick()
    assert sorted(j.state.value for j in world.live()) == ["queued", "running", "running"]
    assert all(not j.spec.gang_group for j in world.live())


def test_a_failed_instance_stops_its_gang_and_the_whole_gang_starts_again(tmp_path: Path) -> None:
    world = four_gpus(tmp_path)
    world.create(instances=3, gpus=1, labels=GANG)
    world.tick()
    first = world.running()
    world.fail(first[1])
    world.tick()  # the failure is seen: the other two are stopped (SIGTERM, the app's grace)
    assert sorted(job_id for job_id, _ in world.executor.cancelled) == sorted([first[0].id, first[2].id])
    assert all(j.state is not JobState.RUNNING or j.reason for j in world.live())
    for _ in range(3):
        world.tick(1.0)  # the stopped ones end; after the launch delay (1 s) the gang comes back whole
    again = world.running()
    assert len(again) == 3 and not {j.id for j in again} & {j.id for j in first}
    assert len({j.spec.gang_group for j in again}) == 1 and again[0].spec.gang_group != first[0].spec.gang_group
    app = world.controller.apps["/web"]
    assert app.state["lastTaskFailure"]["state"] == "TASK_FAILED"


def test_scaling_down_is_not_a_failure_but_a_killed_instance_restarts_its_gang(tmp_path: Path) -> None:
    world = four_gpus(tmp_path)
    world.create(instances=3, gpus=1, labels=GANG)
    world.tick()
    world.controller.update(world.daemon, "/web", {"instances": 2}, ALICE)
    world.tick()
    world.tick()
    assert len(world.executor.cancelled) == 1 and len(world.running()) == 2  # the other two keep running
    survivors = world.running()
    world.controller.kill_instances(world.daemon, "/web", [survivors[0].id], scale=False)
    world.tick()
    assert {job_id for job_id, _ in world.executor.cancelled} >= {survivors[1].id}
    world.tick()
    world.tick()
    assert len(world.running()) == 2 and not {j.id for j in world.running()} & {j.id for j in survivors}


def test_scaling_up_adds_a_gang_of_the_added_count_and_a_big_gang_is_submitted_in_one_round(tmp_path: Path) -> None:
    world = World(tmp_path, box=machine(*["A100"] * 8))
    world.create(instances=2, gpus=1, labels=GANG)
    world.tick()
    world.controller.update(world.daemon, "/web", {"instances": 2 + LAUNCHES_PER_ROUND + 1}, ALICE)
    world.tick()  # more than a round's launch budget, all at once: a group never waits for its last members
    running = world.running()
    assert len(running) == 2 + LAUNCHES_PER_ROUND + 1
    sizes = sorted({(j.spec.gang_group, j.spec.gang_size) for j in running}, key=lambda g: g[1])
    assert [s for _, s in sizes] == [2, LAUNCHES_PER_ROUND + 1]


def test_a_queued_gang_that_loses_a_member_is_launched_again_whole(tmp_path: Path) -> None:
    world = four_gpus(tmp_path)
    other = hog(world, 2)
    world.create(instances=3, gpus=1, labels=GANG)
    world.tick()
    world.controller.update(world.daemon, "/web", {"instances": 2}, ALICE)
    for _ in range(3):
        world.tick()  # one queued instance goes; the other two, short of their group, go too; 2 come back as one
    live = world.live()
    assert len(live) == 2 and all(j.state is JobState.RUNNING for j in live), [(j.state, j.reason) for j in live]
    assert live[0].spec.gang_size == 2 and live[0].spec.gang_group == live[1].spec.gang_group
    world.executor.finish(other, 0)


def test_the_gang_label_takes_true_or_false_and_a_gang_must_fit_the_idle_machine(tmp_path: Path) -> None:
    world = four_gpus(tmp_path)
    with pytest.raises(ObjectNotValid) as caught:
        world.create(labels={"corral.gang": "yes"})
    assert "/labels/corral.gang" in str(caught.value.details)
    with pytest.raises(ObjectNotValid) as caught:  # 5 instances x 1 GPU never fit on 4 GPUs all at once
        world.create(instances=5, gpus=1, labels=GANG)
    assert "a gang of 5 can never start on this machine, even idle: only 4 fit" in str(caught.value.details)
    world.create(instances=4, gpus=1, labels=GANG)
    with pytest.raises(ObjectNotValid):
        world.controller.update(world.daemon, "/web", {"instances": 5}, ALICE)
    world.create(id="/off", instances=3, gpus=1, labels={"corral.gang": "false"})
    world.tick()
    assert all(not j.spec.gang_group for j in world.live("/off"))


def test_a_gang_survives_a_daemon_restart_waiting_and_running(tmp_path: Path) -> None:
    """The group lives in the stored jobs: after a restart a waiting gang still starts whole, and a running one still
    restarts together when an instance fails."""
    world = World(tmp_path, store=SqliteStore(tmp_path / "jobs.db"), box=machine("A100", "A100", "A100", "A100"))
    other = hog(world, 2)
    world.create(instances=3, gpus=1, labels=GANG)
    world.tick()
    world.tick()
    assert all(j.state is JobState.QUEUED and j.reason.startswith("gang: 2 of 3") for j in world.live())
    world.restart()
    world.tick()
    assert all(j.state is JobState.QUEUED for j in world.live()) and len(world.live()) == 3
    world.executor.finish(other, 0)
    world.tick()
    first = world.running()
    assert len(first) == 3
    world.restart()
    world.tick()
    world.fail(world.running()[0])
    world.tick()
    assert len(world.executor.cancelled) == 2  # the other two of its gang
    for _ in range(3):
        world.tick(1.0)
    assert len(world.running()) == 3 and not {j.id for j in world.running()} & {j.id for j in first}


def test_a_started_gang_with_a_member_back_in_the_queue_restarts_whole(tmp_path: Path) -> None:
    """A preempted instance goes back to the queue while the others run: that group could never start whole again
    (it waits for all its members queued), so the controller stops it and launches the gang anew."""
    world = four_gpus(tmp_path)
    world.create(instances=3, gpus=1, labels=GANG)
    world.tick()
    first = world.running()
    back = first[0]
    # As the daemon requeues a preempted job once it has stopped (Daemon._requeue_preempted).
    world.store.transition(back.id, JobState.QUEUED, expect=[JobState.RUNNING], gpus=(), gpu_uuids=(), pid=None)
    world.tick()
    assert sorted(job_id for job_id, _ in world.executor.cancelled) == sorted(j.id for j in first[1:])
    for _ in range(3):
        world.tick()
    again = world.running()
    assert len(again) == 3 and not {j.id for j in again} & {j.id for j in first}, [
        (j.id, j.state) for j in world.live()
    ]
