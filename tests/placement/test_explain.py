"""The text users read: one sentence per decision, every rejected dimension, shortfalls."""

from __future__ import annotations

import json
import re

import pytest

from corral.model.errors import InvalidRequest
from corral.model.resources import Constraint, GpuBehavior, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, Reason, place, render
from corral.placement.explain import node_reason_text, render_long
from tests.builders import cluster, commit, gpus, node


def mixed() -> ClusterSnapshot:
    s = cluster(
        node("t4-a").gpus(2, model="T4", memory_gib=16),
        node("t4-b").gpus(2, model="T4", memory_gib=16),
        node("t4-c").gpus(4, model="T4", memory_gib=16).cpu(8),
        node("a100-a").gpus(8, model="A100"),
        node("a100-b").gpus(8, model="A100"),
        node("cpu").cpu(96),
    )
    for i, name in enumerate(["t4-a", "t4-b"]):
        pin = (Constraint.parse("hostname", "IS", name),)
        d = place(s, gpus(1, id=f"w{i}", constraints=pin), PlacementConfig())
        assert d.allocation is not None and d.allocation.node == name
        s.allocate(d.allocation)
    return s


def test_the_sentence_for_a_request_that_fits_nowhere() -> None:
    s = mixed()
    d = place(s, gpus(2, cpu=16_000, gpu_models=frozenset({"T4"})), PlacementConfig())
    assert not d.placed
    e = d.explanation
    assert render(e) == (
        "0/6 nodes fit: 2 GPU model not in [T4], 2 insufficient GPU (need 2 whole GPUs), 1 no GPUs, "
        "1 CPU capacity below 16000m"
    )
    assert sum(n for _, n in e.rejected) + e.nodes_feasible == e.nodes_evaluated == 6
    assert e.unresolvable_nodes == 4
    assert [d.unresolvable(i) for i in range(6)] == [False, False, True, True, True, True]
    # every failing dimension is kept, not only the first
    assert node_reason_text(int(d.node_reasons[2]), e.labels) == "CPU capacity below 16000m"
    assert dict(e.failing)[Reason.INSUFFICIENT_GPU] == 2


def test_long_form_says_by_how_much() -> None:
    s = cluster(node("a").gpus(2).cpu(8), node("b").gpus(1).cpu(64))
    commit(s, place(s, Request(cpu_milli=4000, id="cpu-hog"), PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)))
    d = place(s, gpus(2, cpu=6_000), PlacementConfig())
    assert render_long(d.explanation) == (
        "0/2 nodes fit: 1 fewer than 2 eligible GPUs, 1 insufficient CPU (need 6000m)\n"
        "short: CPU: need 6000m, at most 4000m free\n"
        "1 nodes can never fit this request"
    )
    commit(s, place(s, gpus(1, 700, id="x"), PlacementConfig()))
    d2 = place(s, gpus(1, 500, cpu=1000), PlacementConfig(policy="binpack"))
    assert d2.placed  # GPU 1 of a is still whole
    commit(s, place(s, gpus(1, 800, id="y"), PlacementConfig()))
    commit(s, place(s, gpus(1, 900, id="z"), PlacementConfig()))
    d3 = place(s, gpus(1, 500, cpu=1000), PlacementConfig())
    assert render_long(d3.explanation).splitlines()[:2] == [
        "0/2 nodes fit: 2 insufficient GPU (need 1 GPU at 50 %)",
        "short: GPU: need 500 GPU milli, at most 300 GPU milli free",
    ]


def test_multiple_dimensions_on_one_node() -> None:
    s = cluster(node("a").gpus(1).cpu(4).mem(4))
    commit(s, place(s, gpus(1, id="w", cpu=3000, mem=3072), PlacementConfig()))
    d = place(s, gpus(1, cpu=2000, mem=2048), PlacementConfig())
    assert node_reason_text(int(d.node_reasons[0]), d.explanation.labels) == (
        "insufficient CPU (need 2000m), insufficient memory (need 2048 MiB), insufficient GPU (need 1 whole GPU)"
    )
    assert render(d.explanation) == "0/1 nodes fit: 1 insufficient CPU (need 2000m)"
    assert len(d.explanation.failing) == 3


def test_success_sentence_and_top_scores() -> None:
    s = cluster(node("a").gpus(4), node("b").gpus(4), node("cpu"))
    d = place(s, gpus(2), PlacementConfig(policy="bestfit"))
    # 1/2 x 63000/128000 + 1/2 x 2000/8000 = 0.37109 -> floor(62.89) = 62 on both; a has the smaller rank
    assert render(d.explanation) == "2/3 nodes fit; chose a GPU 0,1 (bestfit score 62); rejected: 1 no GPUs"
    assert d.explanation.top == (("a", 62.0), ("b", 62.0))


def test_constraint_and_memory_reasons() -> None:
    s = cluster(
        node("a").gpus(2, memory_gib=16).label("rack", "r1"),
        node("b").gpus(2, memory_gib=80).label("rack", "r2"),
    )
    req = Request(gpu_count=1, gpu_memory_mib=20 * 1024, constraints=(Constraint.parse("rack", "IS", "r1"),))
    d = place(s, req, PlacementConfig())
    assert render(d.explanation) == "0/2 nodes fit: 1 constraint not met (rack IS r1), 1 no GPU with 20480 MiB"
    assert d.unresolvable(0) and d.unresolvable(1)


def test_explanation_is_json() -> None:
    s = mixed()
    d = place(s, gpus(1, 250), PlacementConfig(policy="fgd"))
    data = json.loads(json.dumps(d.explanation.to_dict()))
    assert data["chosen"] == d.explanation.chosen
    assert data["summary"] == render(d.explanation)
    assert data["nodes_feasible"] + sum(r["nodes"] for r in data["rejected"]) == 6


@pytest.mark.parametrize(
    ("req", "config", "message"),
    [
        (
            gpus(1, gpu_models=frozenset({"T5"})),
            PlacementConfig(),
            "gpu_models: unknown GPU model T5; this cluster has: A100, T4",
        ),
        (
            Request(gpu_count=1, gpu_memory_mib=100 * 1024),
            PlacementConfig(),
            "gpu_memory_mib: 102400 MiB is more than any GPU of this cluster has (largest: 81920 MiB)",
        ),
        (
            gpus(1, min_gpu_memory_mib=90 * 1024),
            PlacementConfig(),
            "min_gpu_memory_mib: 92160 MiB is more than any GPU",
        ),
        (
            Request(cpu_milli=1, policy="fastest"),
            PlacementConfig(),
            "policy: unknown policy 'fastest'; use one of bestfit, ",
        ),
    ],
)
def test_bad_input_names_the_field(req: Request, config: PlacementConfig, message: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        place(mixed(), req, config)
    assert str(err.value).startswith(message)


def test_bad_config() -> None:
    with pytest.raises(InvalidRequest, match="policy: unknown policy 'tetris'"):
        PlacementConfig(policy="tetris")
    with pytest.raises(InvalidRequest, match=re.escape("load_weight: must be in 0..1, got 2")):
        PlacementConfig(load_weight=2)
    with pytest.raises(InvalidRequest, match="reserve: per-GPU reserve must be >= 0"):
        from corral.placement import GpuReserve

        GpuReserve(cpu_milli_per_gpu=-1)


def test_behaviour_is_reported() -> None:
    s = cluster(node("a").gpus(1))
    d = place(s, Request(cpu_milli=1), PlacementConfig(gpu_behavior=GpuBehavior.RESTRICTED))
    assert d.explanation.behavior == "restricted"
