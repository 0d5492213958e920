"""Bad input is refused at construction with an error naming the field and the allowed range."""

from __future__ import annotations

import re

import pytest

from corral.model.errors import InvalidRequest
from corral.model.resources import (
    Constraint,
    ConstraintOp,
    GpuBehavior,
    GpuDevice,
    Node,
    Request,
    affinity_tag,
)


@pytest.mark.parametrize(
    ("kwargs", "field", "text"),
    [
        ({"cpu_milli": -1}, "cpu_milli", "must be >= 0, got -1"),
        ({"memory_mib": -5, "cpu_milli": 1}, "memory_mib", "must be >= 0, got -5"),
        (
            {"gpu_count": 1, "gpu_milli": 1001},
            "gpu_milli",
            "must be in 0..1000 per GPU (1000 = a whole GPU), got 1001",
        ),
        (
            {"gpu_count": 0, "gpu_milli": 300, "cpu_milli": 1},
            "gpu_count",
            "is 0 but a GPU share was asked for",
        ),
        ({"gpu_count": 0, "gpu_memory_mib": 1024, "cpu_milli": 1}, "gpu_count", "is 0 but a GPU share"),
        ({"gpu_count": 1}, "gpu_milli", "a GPU request needs gpu_milli in 1..1000 and/or gpu_memory_mib > 0"),
        ({"gpu_count": 1, "gpu_milli": 1000, "gpu_memory_mib": 5}, "gpu_memory_mib", "a whole GPU takes all"),
        ({"gpu_count": -2, "gpu_milli": 1000}, "gpu_count", "must be >= 0, got -2"),
        (
            {"gpu_count": 1, "gpu_milli": 1000, "gpu_models": frozenset()},
            "gpu_models",
            "must name at least one",
        ),
        ({"cpu_milli": 1, "gpu_models": frozenset({"T4"})}, "gpu_count", "is 0 but a GPU model"),
        ({}, "request", "asks for nothing"),
        ({"cpu_milli": 1.5}, "cpu_milli", "must be a whole number, got 1.5"),
    ],
)
def test_bad_requests_name_the_field(kwargs: dict[str, object], field: str, text: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        Request(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field
    assert text in err.value.message
    assert str(err.value).startswith(f"{field}: ")


def test_valid_shapes_and_their_words() -> None:
    assert Request(cpu_milli=1000, gpu_count=2, gpu_milli=1000).describe_gpus() == "2 whole GPUs"
    assert Request(gpu_count=2, gpu_milli=300).describe_gpus() == "2 GPUs at 30 %"
    assert Request(gpu_count=1, gpu_memory_mib=10240).describe_gpus() == "1 GPU with 10240 MiB"
    assert Request(gpu_count=1, gpu_milli=250, gpu_memory_mib=4096).describe_gpus() == "1 GPU at 25 % and with 4096 MiB"
    assert Request(cpu_milli=1).describe_gpus() == "no GPU"
    assert Request(gpu_count=2, gpu_milli=1000).gpu_demand_milli == 2000


def test_affinity_tags() -> None:
    assert affinity_tag(Request(cpu_milli=1)) == 0
    assert affinity_tag(Request(gpu_count=1, gpu_milli=500)) == -1
    assert affinity_tag(Request(gpu_count=1, gpu_milli=1000)) == 1
    assert affinity_tag(Request(gpu_count=4, gpu_milli=1000)) == 4


def test_behaviour_label_overrides_like_marathon() -> None:
    plain = Request(cpu_milli=1)
    assert plain.effective_behavior(GpuBehavior.RESTRICTED) is GpuBehavior.RESTRICTED
    label = Request(cpu_milli=1, labels={"GPU_SCHEDULING_BEHAVIOR": "unrestricted"})
    assert label.effective_behavior(GpuBehavior.RESTRICTED) is GpuBehavior.UNRESTRICTED
    # Unknown label values are ignored, as Marathon does; `undefined` cannot be asked for per request.
    for ignored in ("bogus", "undefined"):
        req = Request(cpu_milli=1, labels={"GPU_SCHEDULING_BEHAVIOR": ignored})
        assert req.effective_behavior(GpuBehavior.RESTRICTED) is GpuBehavior.RESTRICTED
    explicit = Request(cpu_milli=1, gpu_behavior=GpuBehavior.PREFERENTIAL, labels=label.labels)
    assert explicit.effective_behavior(GpuBehavior.RESTRICTED) is GpuBehavior.PREFERENTIAL


def test_behaviour_parse_error_lists_values() -> None:
    with pytest.raises(InvalidRequest, match="use one of undefined, unrestricted, restricted, preferential"):
        GpuBehavior.parse("sometimes")
    assert GpuBehavior.parse(" Restricted ") is GpuBehavior.RESTRICTED


def test_constraints() -> None:
    labels = {"rack": "r1", "zone": "eu-west-1a"}
    assert Constraint.parse("rack", "EQ", "r1").op is ConstraintOp.IS
    assert Constraint.parse("rack", "is", "r1").matches(labels, "n1")
    assert not Constraint.parse("rack", "IS", "r2").matches(labels, "n1")
    assert Constraint.parse("zone", "LIKE", "eu-.*").matches(labels, "n1")
    assert not Constraint.parse("zone", "LIKE", "eu").matches(labels, "n1")  # whole-string match
    assert Constraint.parse("zone", "UNLIKE", "us-.*").matches(labels, "n1")
    assert Constraint.parse("missing", "UNLIKE", "x").matches(labels, "n1")
    assert not Constraint.parse("missing", "LIKE", ".*").matches(labels, "n1")
    assert Constraint.parse("hostname", "LIKE", "gpu-[0-9]+").matches({}, "gpu-12")
    with pytest.raises(InvalidRequest, match="unknown operator 'CLUSTER'; use one of IS, EQ, LIKE, UNLIKE"):
        Constraint.parse("rack", "CLUSTER", "r1")
    with pytest.raises(InvalidRequest, match="not a regular expression"):
        Constraint.parse("rack", "LIKE", "([")


def test_bad_nodes() -> None:
    with pytest.raises(InvalidRequest, match=re.escape("node.cpu_milli: must be >= 0, got -1 (node n1)")):
        Node("n1", -1, 0)
    with pytest.raises(InvalidRequest, match=re.escape("GPU indices must be 0..1 in order")):
        Node("n1", 1, 1, (GpuDevice(0, "T4"), GpuDevice(2, "T4")))
    with pytest.raises(InvalidRequest, match=re.escape("gpu.memory_mib: must be >= 0")):
        GpuDevice(0, "T4", memory_mib=-1)
