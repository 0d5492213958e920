"""The services controller over a daemon with a fake executor and an injected clock: instances kept running, the
launch back-off, scaling with killSelection, new versions, ports, restart safety."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.jobs.model import JobState
from corral.services.controller import KILLS_PER_ROUND, KIND, LAUNCHES_PER_ROUND
from corral.store import SqliteStore
from tests.services.helpers import ALICE, World


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def test_instances_run_with_ports_and_marathon_variables(world: World) -> None:
    world.create(instances=2, portDefinitions=[{"port": 0, "name": "http"}, {"port": 0}], env={"MODE": "prod"})
    assert len(world.tick()) == 2
    first, second = world.live()
    assert first.spec.origin == "marathon:/web:web.1" and second.spec.origin == "marathon:/web:web.2"
    env = world.executor.spec(first.id).env
    assert (env["PORT0"], env["PORT1"], env["PORTS"], env["PORT"], env["PORT_HTTP"]) == (
        "40000", "40001", "40000,40001", "40000", "40000",
    )  # fmt: skip
    assert env["HOST"] == "box" and env["MARATHON_APP_ID"] == "/web" and env["MESOS_TASK_ID"] == "web.1"
    assert env["MODE"] == "prod" and env["PATH"]
    assert world.executor.spec(second.id).env["PORTS"] == "40002,40003"  # never a port a live instance holds
    assert world.executor.spec(first.id).command == ("/bin/sh", "-c", "serve --port $PORT0")
    assert first.spec.user == "alice" and first.spec.uid == 1000


def test_an_app_without_port_definitions_gets_one_port_and_required_ports_are_used_as_given(world: World) -> None:
    world.create()
    world.create(id="/fixed", requirePorts=True, portDefinitions=[{"port": 8080}])
    world.tick()
    assert world.live()[0].spec.env["PORTS"] == "40000"
    assert world.live("/fixed")[0].spec.env["PORTS"] == "8080"


def test_backoff_sequence_when_instances_keep_failing_and_the_count_comes_back(world: World) -> None:
    """Checklist 14: Marathon backoff 1, 1.15, 1.3225 ... s capped at max; kills do not grow it; new version resets."""
    world.create(instances=2, maxLaunchDelaySeconds=1.4)
    world.tick()
    assert len(world.running()) == 2
    waits = []
    for _ in range(4):
        victim = world.running()[0]
        world.fail(victim)
        world.tick()  # the exit is seen; the replacement waits
        assert len(world.live()) == 1
        app = world.controller.apps["/web"]
        delay = app.backoff().delay_s
        waits.append(delay)
        assert "launch delay" in app.waiting
        world.tick(delay - 0.01)
        assert len(world.live()) == 1, "launched before the delay ran out"
        world.tick(0.01)
        assert len(world.running()) == 2, "the instance count did not come back after the delay"
        assert world.controller.apps["/web"].waiting == ""
    assert waits == pytest.approx([1.0, 1.15, 1.3225, 1.4])

    # A kill (corral cancel, a user's kill) does not grow the delay and is replaced at once.
    world.daemon.cancel(world.running()[0].id)
    world.tick()
    assert world.controller.apps["/web"].backoff().delay_s == pytest.approx(1.4)
    world.tick()
    assert len(world.running()) == 2

    # A new version resets it: the next failure waits backoffSeconds again.
    world.controller.update(world.daemon, "/web", {"cmd": "serve --port $PORT0 --v2"}, ALICE)
    for _ in range(3):
        world.tick(0.5)
    assert all(j.spec.command[-1].endswith("--v2") for j in world.running()) and len(world.running()) == 2
    world.fail(world.running()[0])
    world.tick()
    assert world.controller.apps["/web"].backoff().delay_s == 1.0


def test_an_instance_that_exits_0_counts_as_a_failure_for_the_delay(world: World) -> None:
    world.create()
    world.tick()
    world.fail(world.running()[0], code=0)
    world.tick()
    app = world.controller.apps["/web"]
    assert app.backoff().delay_s == 1.0 and app.state["lastTaskFailure"]["state"] == "TASK_FINISHED"


@pytest.mark.parametrize(("selection", "survivor"), [("YOUNGEST_FIRST", 0), ("OLDEST_FIRST", 2)])
def test_scaling_down_kills_by_kill_selection(world: World, selection: str, survivor: int) -> None:
    world.create(instances=1, killSelection=selection)
    ids = []
    for n in (1, 2, 3):  # one instance at a time, a second apart: started 0 s, 1 s, 2 s
        world.controller.update(world.daemon, "/web", {"instances": n}, ALICE)
        world.tick(1.0)
        ids.append(next(j.id for j in world.running() if j.id not in ids))
    world.controller.update(world.daemon, "/web", {"instances": 1}, ALICE)
    world.tick()
    killed = [job_id for job_id, _ in world.executor.cancelled]
    assert sorted(killed) == sorted(i for k, i in enumerate(ids) if k != survivor)
    world.tick()
    assert [j.id for j in world.live()] == [ids[survivor]]
    assert world.controller.apps["/web"].backoff().delay_s == 0, "a scale-down kill grew the launch delay"


def test_scaling_up_and_down_keeps_the_config_version_and_queued_instances_go_first(world: World) -> None:
    world.create(instances=1, gpus=1)
    world.tick()
    version = world.controller.apps["/web"].config_version
    world.controller.update(world.daemon, "/web", {"instances": 3}, ALICE)
    world.tick(1.0)
    states = sorted(j.state.value for j in world.live())
    assert states == ["queued", "running", "running"]  # two GPUs: the third waits for one
    assert world.controller.apps["/web"].config_version == version
    world.controller.update(world.daemon, "/web", {"instances": 2}, ALICE)
    world.tick()
    assert sorted(j.state.value for j in world.live()) == ["running", "running"]


def test_a_new_version_replaces_instances_within_the_upgrade_bounds(world: World) -> None:
    world.create(instances=2, upgradeStrategy={"minimumHealthCapacity": 1, "maximumOverCapacity": 1})
    world.tick()
    old = {j.id for j in world.running()}
    world.controller.update(world.daemon, "/web", {"cmd": "serve --v2"}, ALICE)
    world.tick()
    # Over capacity by up to 100 %: the new instances start before any old one stops.
    assert len(world.live()) == 4 and not world.executor.cancelled
    world.tick()
    assert {job_id for job_id, _ in world.executor.cancelled} == old
    world.tick()
    assert {j.spec.command[-1] for j in world.live()} == {"serve --v2"} and len(world.live()) == 2


def test_a_single_instance_app_stops_the_old_instance_before_the_new_one(world: World) -> None:
    world.create(instances=1, upgradeStrategy={"minimumHealthCapacity": 0, "maximumOverCapacity": 0})
    world.tick()
    world.controller.restart(world.daemon, "/web")
    world.tick()
    assert len(world.executor.cancelled) == 1 and len(world.live()) == 1  # the old one, dying; nothing new yet
    world.tick()
    assert len(world.running()) == 1 and world.running()[0].spec.origin.endswith("web.2")


def test_restart_safe_instances_are_refound_and_not_doubled(tmp_path: Path) -> None:
    world = World(tmp_path, store=SqliteStore(tmp_path / "jobs.db"))
    world.create(instances=2)
    world.tick()
    before = {j.id for j in world.running()}
    world.fail(world.running()[0])
    world.tick()  # one failed: its replacement waits 1 s
    world.restart()
    world.tick()
    assert {j.id for j in world.live()} < before and len(world.live()) == 1, "relaunched before the delay"
    assert world.executor.adopted, "the surviving instance was not re-adopted"
    world.tick(1.0)
    assert len(world.running()) == 2
    world.restart()
    world.tick()
    world.tick()
    assert len(world.live()) == 2 and world.store.get_doc(KIND, "/web") is not None
    assert world.running()[1].spec.origin == "marathon:/web:web.3"  # numbering carried over the restart


def test_deleting_an_app_kills_its_instances_even_across_a_restart(tmp_path: Path) -> None:
    world = World(tmp_path, store=SqliteStore(tmp_path / "jobs.db"))
    world.create(instances=2)
    world.tick()
    world.controller.delete(world.daemon, "/web")
    world.tick()
    assert all(j.state is JobState.CANCELLED for j in world.store.list()) or not world.live()
    assert world.store.get_doc(KIND, "/web") is None

    # An instance whose app vanished while the daemon was down is stopped on the next round.
    world.create(id="/other", instances=1)
    world.tick()
    world.store.delete_doc(KIND, "/other")
    world.restart()
    world.tick()
    world.tick()
    assert not world.live("/other")


def test_an_instance_lost_while_the_daemon_was_down_grows_the_launch_delay(tmp_path: Path) -> None:
    world = World(tmp_path, store=SqliteStore(tmp_path / "jobs.db"))
    world.create(instances=1)
    world.tick()
    (lost,) = world.running()
    assert lost.pid is not None
    world.executor.kill_process(lost.pid)  # its process dies while the daemon is away
    world.restart()
    done = world.store.get(lost.id)
    assert done is not None and done.state is JobState.LOST
    assert world.controller.apps["/web"].backoff().delay_s == 1.0  # heard of at recovery, before any round
    world.tick()
    assert world.live() == [], "replaced before the launch delay"
    world.tick(1.0)
    assert len(world.running()) == 1


def test_a_round_launches_and_kills_a_bounded_number_of_instances(world: World) -> None:
    # Issue 12: an app of 998 instances was launched in one round that held the daemon's lock for 35 s.
    world.create(instances=1000, cpus=0.01, mem=1)
    world.tick()
    assert len(world.live()) == LAUNCHES_PER_ROUND
    assert world.controller.apps["/web"].waiting == (
        f"{1000 - LAUNCHES_PER_ROUND} instance(s) to launch in the next rounds (at most {LAUNCHES_PER_ROUND} a round)"
    )
    world.tick()
    assert len(world.live()) == 2 * LAUNCHES_PER_ROUND

    # Scaling to 0 and deleting kill at most KILLS_PER_ROUND a round too; the rounds finish the job.
    world.controller.update(world.daemon, "/web", {"instances": 40}, ALICE)
    for _ in range(-(-40 // LAUNCHES_PER_ROUND)):
        world.tick()
    assert len(world.running()) == 40 and world.controller.apps["/web"].waiting == ""
    world.controller.update(world.daemon, "/web", {"instances": 0}, ALICE)
    killed = []
    while len(world.executor.cancelled) < 40:
        before = len(world.executor.cancelled)
        world.tick()
        killed.append(len(world.executor.cancelled) - before)
    assert killed == [KILLS_PER_ROUND] * (40 // KILLS_PER_ROUND) + (
        [40 % KILLS_PER_ROUND] if 40 % KILLS_PER_ROUND else []
    )
    world.tick()
    assert world.live() == []


def test_deleting_a_large_app_kills_a_bounded_number_at_once_and_the_rest_in_rounds(world: World) -> None:
    size = 2 * KILLS_PER_ROUND + 5
    world.create(instances=size, cpus=0.01, mem=1)
    for _ in range(-(-size // LAUNCHES_PER_ROUND)):
        world.tick()
    assert len(world.running()) == size
    world.controller.delete(world.daemon, "/web")
    assert len(world.executor.cancelled) == KILLS_PER_ROUND
    world.tick()
    assert len(world.executor.cancelled) == 2 * KILLS_PER_ROUND
    world.tick()
    world.tick()
    assert len(world.executor.cancelled) == size and world.live() == []
