"""Marathon constraints on one machine: machine fields count the instances here, GPU fields narrow the request or
hold an instance back with its reason (checklist item 8 among them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.mesos.errors import ObjectNotValid
from corral.services.placement import admit
from tests.services.helpers import World, machine


def run(tmp_path: Path, box: Any, **app: Any) -> World:
    world = World(tmp_path, box=box)
    world.create(**app)
    world.tick()
    return world


def test_hostname_unique_allows_one_instance_on_this_machine(tmp_path: Path) -> None:
    world = run(tmp_path, machine(), instances=2, constraints=[["hostname", "UNIQUE"]])
    assert len(world.live()) == 1
    assert world.controller.apps["/web"].waiting == (
        "instance held back: constraint hostname UNIQUE: an instance already runs where hostname is box"
    )


def test_max_per_never_puts_a_third_instance_on_one_rack(tmp_path: Path) -> None:
    """Checklist 8: ["rack","MAX_PER","2"] never puts a 3rd instance on one rack."""
    world = run(tmp_path, machine(rack="r1"), instances=3, constraints=[["rack", "MAX_PER", "2"]])
    assert len(world.live()) == 2
    assert "rack r1 already has 2 instances (at most 2)" in world.controller.apps["/web"].waiting
    world.fail(world.running()[0])
    world.tick()
    world.tick(1.0)  # after the launch delay
    assert len(world.live()) == 2, "the replacement did not come, or a third instance did"


def test_a_machine_lacking_the_attribute_is_refused_except_by_unlike(tmp_path: Path) -> None:
    """Checklist 8: agents lacking `rack` refused except by UNLIKE."""
    for op, value in [("MAX_PER", "2"), ("UNIQUE", None), ("GROUP_BY", None), ("CLUSTER", None)]:
        rule = ["rack", op] + ([value] if value else [])
        world = run(tmp_path, machine(), constraints=[rule])
        assert not world.live(), op
        assert "rack is not set here" in world.controller.apps["/web"].waiting
    # LIKE and IS can never be met by this machine: refused when the app is created rather than waiting for ever.
    with pytest.raises(ObjectNotValid) as refused:
        run(tmp_path, machine(), constraints=[["rack", "LIKE", "r.*"]])
    assert refused.value.errors_at("/") == ("can never run on this machine: 0/1 nodes fit: 1 constraint not met "
                                            "(rack LIKE r.*)",)  # fmt: skip
    assert run(tmp_path, machine(), constraints=[["rack", "UNLIKE", "r1"]]).live()


def test_gpu_model_becomes_the_requests_model_choice(tmp_path: Path) -> None:
    box = machine("A100", "H100", "A100", "H100")
    world = run(tmp_path, box, instances=3, gpus=1, constraints=[["gpu_model", "LIKE", "H1.*"]])
    live = world.live()
    assert [g.index for j in world.running() for g in j.gpus] == [1, 3]
    assert all(j.spec.request.gpu_models == frozenset({"H100"}) for j in live)
    # The third waits for an H100 (the engine's reason), though two A100s are free.
    (waiting,) = [j for j in live if j.state.value == "queued"]
    assert "GPU model" in waiting.reason or "insufficient GPU" in waiting.reason


def test_cluster_and_is_over_gpu_model(tmp_path: Path) -> None:
    box = machine("A100", "H100")
    world = run(tmp_path, box, gpus=1, constraints=[["gpu_model", "CLUSTER", "A100"]])
    assert [g.index for j in world.running() for g in j.gpus] == [0]
    world = run(tmp_path, box, id="/b", gpus=1, constraints=[["gpu", "IS", "1"]])
    # GPU 1 is the only H100: pinning to it is the same as asking for an H100.
    assert [g.index for j in world.running("/b") for g in j.gpus] == [1]


def test_a_gpu_index_rule_that_needs_pinning_holds_the_instance_back(tmp_path: Path) -> None:
    world = run(tmp_path, machine("A100", "A100", "A100"), gpus=1, constraints=[["gpu", "IS", "2"]])
    assert not world.live()
    assert world.controller.apps["/web"].waiting == (
        "instance held back: constraint gpu IS 2 can only be met by pinning the instance to GPU 2, which corral's "
        "engine cannot do (it narrows GPUs by model or memory only): use gpu_model or gpu_memory_mib, or spread "
        "with UNIQUE/MAX_PER/GROUP_BY over gpu"
    )


def test_gpu_memory_becomes_a_memory_minimum(tmp_path: Path) -> None:
    box = machine("A100", "A100", "A100", memory_gib=(40, 80, 80))
    world = run(tmp_path, box, instances=2, gpus=1, constraints=[["gpu_memory_mib", "IS", str(80 * 1024)]])
    assert sorted(g.index for j in world.running() for g in j.gpus) == [1, 2]
    assert all(j.spec.request.min_gpu_memory_mib == 80 * 1024 for j in world.live())


def test_unique_and_group_by_over_gpus_spread_whole_gpu_instances(tmp_path: Path) -> None:
    for rule in (["gpu", "UNIQUE"], ["gpu", "GROUP_BY"], ["gpu", "MAX_PER", "1"]):
        world = run(tmp_path, machine("A100", "A100"), instances=3, gpus=1, constraints=[rule])
        assert sorted(g.index for j in world.running() for g in j.gpus) == [0, 1], rule
        # Whole GPUs are never shared, so the third instance simply waits for a GPU, as the engine says.
        (third,) = [j for j in world.live() if not j.gpus]
        assert "insufficient GPU" in third.reason, rule


def test_gpu_rules_on_an_app_without_gpus_are_explained(tmp_path: Path) -> None:
    world = run(tmp_path, machine(), constraints=[["gpu_model", "LIKE", "A100"]])
    assert not world.live()
    assert world.controller.apps["/web"].waiting == (
        "instance held back: constraint gpu_model LIKE A100: gpu_model is not set here (the app asks for no GPUs)"
    )


def test_admit_counts_instances_on_each_gpu_they_hold() -> None:
    from corral.mesos.model import ConstraintOperator, ServiceConstraint

    box = machine("A100", "A100", "A100", "A100")
    rule = [ServiceConstraint("gpu", ConstraintOperator.UNIQUE)]
    assert admit(rule, box, 2, 1, [0, 1]).ok
    assert not admit(rule, box, 3, 1, [0, 1]).ok
