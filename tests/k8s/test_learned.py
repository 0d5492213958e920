"""The workload learner (corral.placement.learned): what the extender feeds fgd and fgd-priced as its workload."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import pytest

from corral.model.errors import InvalidRequest
from corral.model.resources import Request
from corral.placement.learned import LearnerConfig, WorkloadLearner, distance, shape_of
from corral.placement.workload import TargetWorkload
from corral.sim.openb import TracePod, load_pods, target_workload

TRACES = Path(os.environ.get("CORRAL_TRACES", Path(__file__).resolve().parents[3] / "shared" / "traces" / "openb"))
SHARED_LIST = TRACES / "openb_pod_list_default.csv"

#: Every pod counts at once: no decay, the smallest sample, a check after every pod, any change adopted.
EAGER = LearnerConfig(half_life_pods=math.inf, min_pods=1, check_pods=1, min_change=0.0)


def req(cpu: int = 4000, gpus: int = 1, milli: int = 1000, models: frozenset[str] | None = None) -> Request:
    return Request(cpu_milli=cpu, memory_mib=1024, gpu_count=gpus, gpu_milli=milli if gpus else 0,
                   gpu_models=models if gpus else None)  # fmt: skip


def random_pods(n: int, seed: int) -> list[TracePod]:
    """Pods of a few dozen shapes with skewed frequencies (typical ones and a rare tail), model specs sorted as
    `from_requests` writes them."""
    rng = random.Random(seed)
    shapes = []
    for _ in range(40):
        gpus = rng.choice([0, 1, 1, 1, 2, 4, 8])
        milli = rng.choice([1000, 500, 250, 100]) if gpus == 1 else 1000
        models = rng.choice([None, None, frozenset({"V100M16"}), frozenset({"V100M16", "V100M32"})]) if gpus else None
        shapes.append((rng.choice([1000, 4000, 8000, 32000]), gpus, milli, models))
    weights = [1 / (i + 1) ** 1.5 for i in range(len(shapes))]
    pods = []
    for i in range(n):
        cpu, gpus, milli, models = rng.choices(shapes, weights)[0]
        r = Request(cpu_milli=cpu, memory_mib=1024, gpu_count=gpus, gpu_milli=milli if gpus else 0,
                    gpu_models=models, id=f"p{i}")  # fmt: skip
        pods.append(TracePod(f"p{i}", r, "|".join(sorted(models)) if models else ""))
    return pods


def test_learned_workload_is_the_simulators_target_workload_for_the_same_pods() -> None:
    pods = random_pods(3000, seed=7)
    learner = WorkloadLearner(EAGER)
    for p in pods:
        learner.observe(p.name, p.request, 0.0)
    expected = target_workload(pods)
    assert learner.workload == expected
    assert learner.workload.key == expected.key  # the engine's caches see the same workload
    assert expected.tail, "the pods were meant to have a rare tail"
    assert learner.candidate() == TargetWorkload.from_requests(p.request for p in pods)


@pytest.mark.skipif(not SHARED_LIST.is_file(), reason="the shared openb pod lists are not here")
def test_learned_workload_of_a_shared_list_is_its_own() -> None:
    pods = load_pods(SHARED_LIST)
    learner = WorkloadLearner(LearnerConfig(half_life_pods=math.inf))
    for p in pods:
        learner.observe(p.name, p.request, 0.0)
    assert learner.candidate() == target_workload(pods)


def test_each_pod_counts_once_by_uid() -> None:
    learner = WorkloadLearner(EAGER)
    learner.observe("a", req(gpus=8), 0.0)
    for _ in range(50):  # an unschedulable pod filtered again and again
        learner.observe("a", req(gpus=8), 0.0)
    learner.observe("b", req(gpus=1), 0.0)
    assert learner.pods == 2
    w = learner.workload
    assert w is not None
    assert sorted(t.probability for t in w.types) == [0.5, 0.5]


def test_default_until_the_minimum_sample_then_at_most_every_check_pods() -> None:
    learner = WorkloadLearner(LearnerConfig(min_pods=100, check_pods=50, min_change=0.0, half_life_pods=math.inf))
    changed = [learner.observe(f"p{i}", req(milli=500 if i % 2 else 1000), 0.0) for i in range(400)]
    # nothing before 100 pods; then one adoption per 50 pods at most
    assert [i for i, c in enumerate(changed) if c] == [99, 149, 199, 249, 299, 349, 399]
    assert learner.rebuilds == 7


def test_an_unchanged_distribution_is_not_adopted_again() -> None:
    """The engine's caches are keyed by the workload: a candidate that barely moved keeps the one in use."""
    learner = WorkloadLearner(LearnerConfig(min_pods=100, check_pods=100, half_life_pods=math.inf))
    for i in range(2000):
        learner.observe(f"p{i}", req(milli=500 if i % 2 else 1000), 0.0)
    assert learner.rebuilds == 1
    first = learner.workload
    for i in range(2000, 4000):  # now only 8-GPU pods: the distribution moves, so a new workload is adopted
        learner.observe(f"p{i}", req(gpus=8, cpu=64000), 0.0)
    assert learner.rebuilds > 1 and learner.workload != first


def test_time_rule_checks_a_slow_stream() -> None:
    learner = WorkloadLearner(LearnerConfig(min_pods=3, check_pods=1000, check_seconds=60, half_life_pods=math.inf))
    assert not any(learner.observe(f"p{i}", req(), float(i)) for i in range(3))
    assert learner.workload is None
    assert learner.observe("late", req(), 61.0)  # 61 s after the first pod: checked though 1000 pods did not come
    assert learner.workload is not None


def test_decay_follows_a_changed_workload() -> None:
    config = LearnerConfig(half_life_pods=200, min_pods=1, check_pods=1, min_change=0.0)
    learner = WorkloadLearner(config)
    never = WorkloadLearner(EAGER)
    for i in range(1000):
        learner.observe(f"a{i}", req(gpus=1), 0.0)
        never.observe(f"a{i}", req(gpus=1), 0.0)
    for i in range(1000):
        learner.observe(f"b{i}", req(gpus=4, cpu=32000), 0.0)
        never.observe(f"b{i}", req(gpus=4, cpu=32000), 0.0)

    def p_four(learner: WorkloadLearner) -> float:
        w = learner.workload
        assert w is not None
        return sum(t.probability for t in (*w.types, *w.tail) if t.gpu_count == 4) / sum(
            t.probability for t in (*w.types, *w.tail)
        )

    # 1000 pods = 5 half-lives: the old shape weighs 2^-5 of the new one's share
    assert p_four(learner) == pytest.approx(1 - 1 / 32, abs=0.01)
    assert p_four(never) == pytest.approx(0.5)
    assert learner.sample == pytest.approx(200 / math.log(2), rel=0.01)  # the decayed sample: ~289 pods


def test_weights_are_rescaled_before_they_overflow() -> None:
    learner = WorkloadLearner(LearnerConfig(half_life_pods=1, min_pods=1, check_pods=1, min_change=0.0))
    for i in range(3000):  # 2^3000 would overflow a float
        learner.observe(f"p{i}", req(milli=1000 if i % 2 else 500), 0.0)
    w = learner.workload
    assert w is not None
    assert all(math.isfinite(t.probability) and t.probability > 0 for t in w.types)
    assert sum(t.probability for t in w.types) == pytest.approx(1.0)


def test_distinct_shapes_are_capped_and_the_frequent_ones_stay() -> None:
    learner = WorkloadLearner(LearnerConfig(max_shapes=8, min_pods=1, check_pods=1, min_change=0.0))
    for i in range(3000):
        if i % 2:
            learner.observe(f"p{i}", req(gpus=1), 0.0)
        else:  # every other pod of a shape never seen before
            learner.observe(f"p{i}", req(gpus=1, cpu=1000 + i, milli=300), 0.0)
    assert learner.describe()["shapes"] == 8
    w = learner.workload
    assert w is not None
    assert w.types[0].cpu_milli == 4000 and w.types[0].probability > 0.5


def test_hostile_requests_are_not_counted_and_memory_stays_bounded() -> None:
    learner = WorkloadLearner(LearnerConfig(max_uids=100, min_pods=1, check_pods=1, min_change=0.0))
    learner.observe("ok", req(), 0.0)
    learner.observe("huge", req(gpus=1024), 0.0)  # no node has 1024 GPUs
    learner.observe("models", req(models=frozenset(f"m{i}" for i in range(1000))), 0.0)
    learner.observe("long", req(models=frozenset({"x" * 10_000})), 0.0)
    assert learner.pods == 1 and learner.ignored == 3
    w = learner.workload
    assert w is not None and len(w.types) == 1 and not w.tail
    for i in range(5000):  # a flood of new UIDs: only the last max_uids are kept
        learner.observe(f"flood-{i}", req(cpu=10**9), 0.0)  # the most CPU a request may ask for: counted
    assert len(learner._uids) == 100


def test_shape_key_matches_from_requests() -> None:
    r = req(gpus=2, models=frozenset({"B", "A"}))
    assert shape_of(r) == (4000, 1000, 2, "A|B")
    assert shape_of(req(gpus=0, cpu=500)) == (500, 0, 0, "")
    assert distance({shape_of(r): 1.0}, {shape_of(r): 3.0}) == 0.0
    assert distance({shape_of(r): 1.0}, {shape_of(req()): 1.0}) == 1.0


def test_bad_settings_are_refused_by_name() -> None:
    with pytest.raises(InvalidRequest, match=r"workload\.min_pods"):
        LearnerConfig(min_pods=0)
    with pytest.raises(InvalidRequest, match=r"workload\.half_life_pods"):
        LearnerConfig(half_life_pods=0)
    with pytest.raises(InvalidRequest, match="no pods seen yet"):
        WorkloadLearner().candidate()


def test_types_in_words() -> None:
    learner = WorkloadLearner(EAGER)
    learner.observe("a", req(gpus=2, models=frozenset({"V100"}), cpu=8000), 0.0)
    learner.observe("b", Request(cpu_milli=1000, gpu_count=1, gpu_memory_mib=4096), 0.0)
    learner.observe("c", req(gpus=0, cpu=500), 0.0)
    assert learner.describe()["top"] == [
        "2x1000m GPU [V100] + 8000m CPU: 33.3 %",
        "1x GPU memory share + 1000m CPU: 33.3 %",
        "no GPU + 500m CPU: 33.3 %",
    ]
