"""Pod and Node objects -> corral's model: every resource style, Kubernetes quantities, and clear errors."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

import pytest

from corral.k8s import convert
from corral.k8s.convert import (
    ANN_ASSIGNMENT,
    ANN_GPU_COUNT,
    ANN_NODE_GPUS,
    ANN_POLICY,
    cpu_milli,
    memory_mib,
    node_from_k8s,
    node_gpus_annotation,
    parse_assignment,
    pod_request,
)
from corral.k8s.fake import node_object, pod_object
from corral.model.errors import InvalidRequest
from corral.model.resources import GpuDevice


def pod(limits: dict[str, Any], requests: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    res: dict[str, Any] = {"limits": limits}
    if requests is not None:
        res["requests"] = requests
    return pod_object("p", [{"name": "c", "image": "x", "resources": res}], **kw)


@pytest.mark.parametrize(
    ("text", "milli"), [("1", 1000), ("250m", 250), ("0.1", 100), ("2.5", 2500), ("1e3", 1_000_000), (3, 3000)]
)
def test_cpu_quantities(text: object, milli: int) -> None:
    assert cpu_milli(text, "cpu") == milli


@pytest.mark.parametrize(
    ("text", "mib"), [("4Gi", 4096), ("512Mi", 512), ("1G", 954), ("128974848", 123), ("1Ti", 1 << 20), ("0", 0)]
)
def test_memory_quantities(text: str, mib: int) -> None:
    assert memory_mib(text, "memory") == mib


@pytest.mark.parametrize("bad", ["", "4GB", "-1", "1.2.3", "abc", "Gi"])
def test_bad_quantities_name_the_field(bad: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        memory_mib(bad, "spec.containers[0].resources.requests.memory")
    assert exc.value.field == "spec.containers[0].resources.requests.memory"


def test_cpu_and_memory_sum_containers_and_take_the_largest_init_container() -> None:
    p = pod_object(
        "p",
        [
            {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
            {"name": "b", "resources": {"limits": {"cpu": "1", "memory": "512Mi"}}},  # request defaults to limit
        ],
    )
    p["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "4", "memory": "100Mi"}}}]
    p["spec"]["overhead"] = {"cpu": "100m"}
    r = pod_request(p).request
    assert (r.cpu_milli, r.memory_mib, r.gpu_count) == (4100, 1536, 0)


@pytest.mark.parametrize(
    ("limits", "annotations", "expect"),
    [
        ({"corral.dev/gpu": "2"}, {}, (2, 1000, 0)),
        ({"corral.dev/gpu-milli": "300"}, {}, (1, 300, 0)),
        ({"corral.dev/gpu-memory": "10240"}, {}, (1, 0, 10240)),
        ({"corral.dev/gpu-memory": "10Gi"}, {}, (1, 0, 10240)),
        ({"corral.dev/gpu-milli": "250", "corral.dev/gpu-memory": "4096"}, {ANN_GPU_COUNT: "2"}, (2, 250, 4096)),
        ({"elasticgpu.io/gpu-core": "100"}, {}, (1, 1000, 0)),
        ({"elasticgpu.io/gpu-core": "200"}, {}, (2, 1000, 0)),
        ({"elasticgpu.io/gpu-core": "30", "elasticgpu.io/gpu-memory": "1024"}, {}, (1, 300, 1024)),
        ({"elasticgpu.io/gpu-memory": "256"}, {}, (1, 0, 256)),
        # kube-apiserver's canonical form of the counts 30000 and 2048000: still MiB, not bytes
        ({"corral.dev/gpu-memory": "30k"}, {}, (1, 0, 30000)),
        ({"corral.dev/gpu-milli": "400", "corral.dev/gpu-memory": "2048k"}, {}, (1, 400, 2048000)),
        ({"elasticgpu.io/gpu-core": "40", "elasticgpu.io/gpu-memory": "20k"}, {}, (1, 400, 20000)),
        ({"elasticgpu.io/gpu-memory": "1e3"}, {}, (1, 0, 1000)),
        ({"nvidia.com/gpu": 4}, {}, (4, 1000, 0)),
        ({"keti.com/mpsgpu": "1"}, {"GPUrequest": "2048"}, (1, 0, 2048)),
        ({"keti.com/mpsgpu": "2"}, {}, (2, 1000, 0)),
    ],
)
def test_every_resource_style(
    limits: dict[str, Any], annotations: dict[str, str], expect: tuple[int, int, int]
) -> None:
    r = pod_request(pod(limits, {"cpu": "1", "memory": "1Gi"}, annotations=annotations)).request
    assert (r.gpu_count, r.gpu_milli, r.gpu_memory_mib) == expect
    assert (r.cpu_milli, r.memory_mib) == (1000, 1024)


def test_request_only_extended_resource_is_read_too() -> None:
    assert pod_request(pod({}, {"corral.dev/gpu": "1"})).request.gpu_count == 1


def test_pod_annotations_set_policy_model_and_behaviour() -> None:
    ann = {ANN_POLICY: "spread", "corral.dev/gpu-model": "H100, A100", "corral.dev/gpu-behavior": "restricted"}
    r = pod_request(pod({"corral.dev/gpu": "1"}, annotations=ann)).request
    assert r.policy == "spread"
    assert r.gpu_models == frozenset({"H100", "A100"})
    assert r.gpu_behavior is not None and r.gpu_behavior.value == "restricted"
    assert r.id == "uid-default-p"


@pytest.mark.parametrize(
    ("limits", "requests", "field", "words"),
    [
        ({"corral.dev/gpu": "1", "corral.dev/gpu-milli": "300"}, None, "spec.containers[0].resources",
         "cannot be combined"),
        ({"corral.dev/gpu": "1", "nvidia.com/gpu": "1"}, None, "spec.containers[0].resources", "mixes GPU resource"),
        ({"corral.dev/gpu": "500m"}, None, "spec.containers[0].resources[corral.dev/gpu]", "whole number"),
        ({"corral.dev/gpu-milli": "1500"}, None, "spec.containers[0].resources[corral.dev/gpu-milli]", "1..1000"),
        ({"elasticgpu.io/gpu-core": "150"}, None, "spec.containers[0].resources[elasticgpu.io/gpu-core]",
         "whole number of cards"),
        ({"elasticgpu.io/gpu-core": "200", "elasticgpu.io/gpu-memory": "100"}, None,
         "spec.containers[0].resources[elasticgpu.io/gpu-memory]", "take all their memory"),
        ({"corral.dev/gpu": "2"}, {"corral.dev/gpu": "1"}, "spec.containers[0].resources[corral.dev/gpu]",
         "cannot be over-committed"),
        ({"corral.dev/gpu": "two"}, None, "spec.containers[0].resources.limits[corral.dev/gpu]",
         "not a Kubernetes quantity"),
    ],
)  # fmt: skip
def test_conflicting_or_invalid_requests_get_clear_errors(
    limits: dict[str, Any], requests: dict[str, Any] | None, field: str, words: str
) -> None:
    with pytest.raises(InvalidRequest) as exc:
        pod_request(pod(limits, requests))
    assert exc.value.field == field
    assert words in exc.value.message


def test_two_containers_whole_gpus_add_up_but_shares_do_not() -> None:
    two = pod_object(
        "p",
        [{"name": "a", "resources": {"limits": {"corral.dev/gpu": "1"}}},
         {"name": "b", "resources": {"limits": {"corral.dev/gpu": "2"}}}],
    )  # fmt: skip
    ask = pod_request(two)
    assert ask.request.gpu_count == 3
    assert [(c.container, c.count) for c in ask.containers] == [("a", 1), ("b", 2)]
    shares = pod_object(
        "p",
        [{"name": "a", "resources": {"limits": {"corral.dev/gpu-milli": "100"}}},
         {"name": "b", "resources": {"limits": {"corral.dev/gpu": "1"}}}],
    )  # fmt: skip
    with pytest.raises(InvalidRequest, match="one container of a pod only"):
        pod_request(shares)


def test_node_inventory_from_the_device_plugin_annotation() -> None:
    gpus = (
        GpuDevice(0, "H100", 81559, "GPU-a", numa_node=0, pcie_switch=0, nvlink_peers=frozenset({1})),
        GpuDevice(1, "H100", 81559, "GPU-b", numa_node=1, nvlink_peers=frozenset({0})),
    )
    obj = node_object("n1", "64", "503Gi", {ANN_NODE_GPUS: node_gpus_annotation(gpus)}, {"zone": "a"})
    node = node_from_k8s(obj)
    assert (node.name, node.cpu_milli, node.memory_mib) == ("n1", 64000, 503 * 1024)
    assert node.gpus == gpus
    assert node.labels == {"zone": "a"}


def test_damaged_node_annotation_is_an_error_naming_the_node() -> None:
    obj = node_object("n1", "8", "8Gi", {ANN_NODE_GPUS: "[{'index': 0}]"})
    with pytest.raises(InvalidRequest, match="node n1") as exc:
        node_from_k8s(obj)
    assert "not JSON" in exc.value.message


def test_damaged_assignment_annotation() -> None:
    assert parse_assignment({}) is None
    with pytest.raises(InvalidRequest, match="unreadable assignment"):
        parse_assignment({ANN_ASSIGNMENT: '{"node": "n1"}'})


ONCE = {"test": "a shape no other test reads"}


def test_pods_of_one_shape_are_read_once_and_any_difference_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """pod_request keeps what it read per pod shape (everything it reads but the name and UID): the next pod of that
    shape gets the same request under its own id, and a pod that differs in anything read is read in full."""

    def shaped(name: str, limits: dict[str, Any], annotations: dict[str, str] = ONCE) -> dict[str, Any]:
        resources = {"limits": limits, "requests": {"cpu": "1", "memory": "1Gi"}}
        p = pod_object(name, [{"name": "c", "image": "x", "resources": resources}], annotations=dict(annotations))
        p["metadata"]["uid"] = f"uid-{name}"
        return p

    reads: list[str] = []
    read_in_full = convert._pod_request

    def counted(p: Any, min_cpu_milli: int) -> Any:
        reads.append(p["metadata"]["name"])
        return read_in_full(p, min_cpu_milli)

    monkeypatch.setattr(convert, "_pod_request", counted)
    monkeypatch.setattr(convert, "_shapes", OrderedDict())  # nothing kept from other tests
    base = {"corral.dev/gpu": "1"}
    first, second = pod_request(shaped("a", base)), pod_request(shaped("b", base))
    assert reads == ["a"]
    assert (first.request.id, second.request.id) == ("uid-a", "uid-b")
    assert dataclasses.replace(second.request, id="uid-a") == first.request
    assert second.containers == first.containers and second.style == first.style == "corral"
    variants = [
        shaped("c", {"corral.dev/gpu": "2"}),
        shaped("d", {"corral.dev/gpu-milli": "300"}),
        shaped("e", base, annotations={**ONCE, ANN_POLICY: "spread"}),
    ]
    renamed = shaped("f", base)
    renamed["spec"]["containers"][0]["name"] = "other"
    with_init = shaped("g", base)
    with_init["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "8"}}}]
    overhead = shaped("h", base)
    overhead["spec"]["overhead"] = {"cpu": "250m"}
    urgent = shaped("i", base)
    urgent["spec"]["priority"] = 1000
    read = [pod_request(p) for p in [*variants, renamed, with_init, overhead, urgent]]
    assert reads == ["a", "c", "d", "e", "f", "g", "h", "i"]
    plain = dataclasses.replace(first.request, id="")
    seen = [dataclasses.replace(a.request, id="") for a in read]
    assert all(r != plain for i, r in enumerate(seen) if i != 3)  # each differs from the shape read first
    assert seen[3] == plain and read[3].containers[0].container == "other"  # renamed: same request, its own container
    assert [a.request.gpu_count for a in read[:2]] == [2, 1] and read[1].request.gpu_milli == 300
    assert read[2].request.policy == "spread"
    assert read[4].request.cpu_milli == 8000 and read[5].request.cpu_milli == 1250 and read[6].request.priority == 1000
    assert pod_request(shaped("j", {}), min_cpu_milli=0).request.cpu_milli == 1000
    for _ in range(2):  # a refusal is never kept as an answer
        with pytest.raises(InvalidRequest, match=r"corral\.dev/gpu"):
            pod_request(shaped("k", {"corral.dev/gpu": "-1"}))
