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

    def counted(p: Any, min_cpu_milli: int, gpu_memory: Any) -> Any:
        reads.append(p["metadata"]["name"])
        return read_in_full(p, min_cpu_milli, gpu_memory)

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
    # what the cluster's GPUs are, and whether the pod is bound, are read too (HAMi's forms depend on them)
    hami = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}
    reads.clear()
    small, large = (
        pod_request(shaped("l", hami), gpu_memory={"A100": 40960}),
        pod_request(shaped("m", hami), gpu_memory={"A100": 81920}),
    )
    on_node = shaped("n", hami)
    on_node["spec"]["nodeName"] = "n1"
    pod_request(on_node, gpu_memory={"A100": 81920})
    assert reads == ["l", "m", "n"]
    assert (small.request.gpu_memory_mib, large.request.gpu_memory_mib) == (20480, 40960)
    for _ in range(2):  # a refusal is never kept as an answer
        with pytest.raises(InvalidRequest, match=r"corral\.dev/gpu"):
            pod_request(shaped("k", {"corral.dev/gpu": "-1"}))


# ---------------------------------------------------------------------------------------------------- HAMi's style
#: The cluster's GPUs as ClusterState.gpu_memory gives them (model -> the largest memory of one, MiB).
CLUSTER = {"A100": 81920, "T4": 15360, "A10": 24576}
HAMI = "spec.containers[0].resources"


@pytest.mark.parametrize(
    ("limits", "annotations", "expect"),
    [
        # nvidia.com/gpu alone: HAMi's default is 100 % of the memory, so the GPU alone, as NVIDIA's plugin has it
        ({"nvidia.com/gpu": "2"}, {}, (2, 1000, 0)),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}, {}, (1, 0, 3000)),
        ({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "30"}, {}, (2, 300, 10240)),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4Gi"}, {}, (1, 0, 4096)),  # a byte quantity read as bytes
        ({"nvidia.com/gpumem": "2048"}, {}, (1, 0, 2048)),  # no count: HAMi's webhook adds nvidia.com/gpu 1
        # a percentage of each GPU's memory: of the largest GPU the pod may use
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}, {}, (1, 0, 40960)),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25", "nvidia.com/gpucores": "25"},
         {"nvidia.com/use-gputype": "t4"}, (1, 250, 3840)),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100", "nvidia.com/gpucores": "20"}, {},
         (1, 1000, 0)),  # all the memory: nothing else fits beside it
        ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "40"}, {}, (1, 1000, 0)),  # memory defaults to 100 %
        # gpumem wins over a percentage, as in HAMi
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpumem-percentage": "50"}, {},
         (1, 0, 1000)),
        # 100 % of the compute: HAMi's exclusive GPU, nothing else shares it
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "100"}, {}, (1, 1000, 0)),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "0"}, {}, (1, 0, 1000)),
    ],
)  # fmt: skip
def test_hami_resources(limits: dict[str, Any], annotations: dict[str, str], expect: tuple[int, int, int]) -> None:
    ask = pod_request(pod(limits, annotations=annotations), gpu_memory=CLUSTER)
    r = ask.request
    assert (r.gpu_count, r.gpu_milli, r.gpu_memory_mib) == expect
    assert ask.style == ("hami" if set(limits) - {"nvidia.com/gpu"} else "nvidia")
    assert ask.containers[0].count == expect[0]


def test_hami_gpu_types_match_part_of_the_model_name_and_policies_map_to_corrals() -> None:
    def ask(annotations: dict[str, str], known: dict[str, int] | None = CLUSTER) -> Any:
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"}
        return pod_request(pod(limits, annotations=annotations), gpu_memory=known).request

    # HAMi matches a part of the GPU's type; corral's models are NVML's short names, which also match as a part of
    # HAMi's long type names
    assert ask({"nvidia.com/use-gputype": "A100,H100"}).gpu_models == {"A100"}
    assert ask({"nvidia.com/use-gputype": "A10"}).gpu_models == {"A100", "A10"}  # as HAMi: "A10" is in "A100"
    assert ask({"nvidia.com/use-gputype": "NVIDIA-A100-SXM4-80GB"}).gpu_models == {"A100"}
    assert ask({"nvidia.com/use-gputype": "Tesla T4"}).gpu_models == {"T4"}
    assert ask({"nvidia.com/nouse-gputype": "a100"}).gpu_models == {"T4", "A10"}
    # narrowed by corral's own annotation; a type no GPU here has stays as written (the engine names it)
    both = {"nvidia.com/use-gputype": "T4,A100", "corral.dev/gpu-model": "T4"}
    assert ask(both).gpu_models == {"T4"}
    assert ask({"nvidia.com/use-gputype": "MI300"}).gpu_models == {"MI300"}
    assert ask({"nvidia.com/use-gputype": "A100"}, known=None).gpu_models == {"A100"}
    assert ask({"hami.io/node-scheduler-policy": "spread"}).policy == "spread"
    assert ask({"hami.io/gpu-scheduler-policy": "topology-aware"}).policy == "topology"
    assert ask({"hami.io/gpu-scheduler-policy": "binpack", "corral.dev/policy": "fgd"}).policy == "fgd"


@pytest.mark.parametrize(
    ("limits", "annotations", "field", "words"),
    [
        ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}, {}, f"{HAMI}[nvidia.com/gpucores]",
         "must be 0..100 (percent of a GPU's compute), got '150'"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "101"}, {}, f"{HAMI}[nvidia.com/gpumem-percentage]",
         "must be 1..100 (percent of a GPU's memory), got '101'"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpumem-percentage": "200"}, {},
         f"{HAMI}[nvidia.com/gpumem-percentage]", "must be 1..100"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "-5"}, {}, f"{HAMI}.limits[nvidia.com/gpucores]",
         "must not be negative, got '-5'"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "-1024"}, {}, f"{HAMI}.limits[nvidia.com/gpumem]",
         "must not be negative"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "NaN"}, {}, f"{HAMI}.limits[nvidia.com/gpumem]",
         "not a Kubernetes quantity: 'NaN'"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "Inf"}, {}, f"{HAMI}.limits[nvidia.com/gpucores]",
         "not a Kubernetes quantity: 'Inf'"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "12.5"}, {}, f"{HAMI}[nvidia.com/gpucores]",
         "must be a whole number, got '12.5'"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "200000"}, {}, f"{HAMI}[nvidia.com/gpumem]",
         "200000 MiB is more than any GPU here has (the largest: 81920 MiB)"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}, {"nvidia.com/use-gputype": "T4"},
         f"{HAMI}[nvidia.com/gpumem]", "20000 MiB is more than any GPU here has (the largest of T4: 15360 MiB)"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1e30"}, {}, f"{HAMI}.limits[nvidia.com/gpumem]", "too large"),
        ({"nvidia.com/gpu": "0", "nvidia.com/gpumem": "1000"}, {}, f"{HAMI}[nvidia.com/gpu]",
         "is 0 but nvidia.com/gpumem asks for a GPU share"),
        ({"nvidia.com/gpumem": "1000", "corral.dev/gpu-milli": "100"}, {}, HAMI,
         "mixes GPU resource styles (corral.dev/gpu-milli, nvidia.com/gpumem)"),
        ({"nvidia.com/gpu": "1"}, {"nvidia.com/use-gpuuuid": "GPU-1"}, "metadata.annotations[nvidia.com/use-gpuuuid]",
         "corral does not choose GPUs by UUID"),
        ({"nvidia.com/gpu": "1"}, {"nvidia.com/nouse-gputype": "A10,T4"},
         "metadata.annotations[nvidia.com/nouse-gputype]", "excludes every GPU model here (A10, A100, T4)"),
        ({"nvidia.com/gpu": "1"}, {"nvidia.com/use-gputype": " , "}, "metadata.annotations[nvidia.com/use-gputype]",
         "names no GPU type"),
        ({"nvidia.com/gpu": "1"}, {"hami.io/gpu-scheduler-policy": "mutex"},
         "metadata.annotations[hami.io/gpu-scheduler-policy]",
         "'mutex' is not one corral follows; use one of binpack, spread, topology-aware"),
    ],
)  # fmt: skip
def test_hostile_hami_requests_are_refused_naming_the_field(
    limits: dict[str, Any], annotations: dict[str, str], field: str, words: str
) -> None:
    with pytest.raises(InvalidRequest) as exc:
        pod_request(pod(limits, annotations=annotations), gpu_memory=CLUSTER)
    assert field in exc.value.field
    assert words in exc.value.message


def test_hami_forms_that_need_the_clusters_gpus_say_so_without_them() -> None:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "30"}
    known: dict[str, int] | None
    for known in (None, {}):
        with pytest.raises(InvalidRequest) as exc:
            pod_request(pod(limits), gpu_memory=known)
        assert exc.value.message == (
            "a percentage of GPU memory needs the cluster's GPUs, and no GPU is known here; "
            "give nvidia.com/gpumem in MiB"
        )
    with pytest.raises(InvalidRequest, match="excluding GPU types needs the cluster's GPUs, and none are known here"):
        pod_request(pod({"nvidia.com/gpu": "1"}, annotations={"nvidia.com/nouse-gputype": "T4"}))


def test_a_bound_hami_pod_is_counted_not_refused_for_how_it_wished_to_be_placed() -> None:
    """A HAMi pod already on a node (bound by HAMi's scheduler during a move) is read for its share only: its GPU
    UUIDs or a policy corral does not follow never drop it from the books."""
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50", "nvidia.com/gpucores": "30"}
    annotations = {"nvidia.com/use-gpuuuid": "GPU-1", "hami.io/gpu-scheduler-policy": "mutex"}
    p = pod(limits, annotations=annotations)
    p["spec"]["nodeName"] = "n1"
    r = pod_request(p, min_cpu_milli=0, gpu_memory=CLUSTER).request
    assert (r.gpu_count, r.gpu_milli, r.gpu_memory_mib, r.gpu_models, r.policy) == (1, 300, 40960, None, None)
    # with no GPU known, counted as the whole GPU rather than not at all
    assert pod_request(p, min_cpu_milli=0).request.gpu_milli == 1000


def test_hami_assignment_annotations_carry_hamis_record() -> None:
    slots = (convert.GpuSlot(0, "GPU-a", 300, 10240), convert.GpuSlot(2, "GPU-c", 300, 10240))
    out = convert.assignment_annotations(convert.Assignment("n1", {"main": slots}), "hami")
    assert out["hami.io/vgpu-devices-allocated"] == "GPU-a,NVIDIA,10240,30:GPU-c,NVIDIA,10240,30:;"
    assert parse_assignment(out) == convert.Assignment("n1", {"main": slots})
    whole = (convert.GpuSlot(1, "GPU-b", 1000, 81920),)
    out = convert.assignment_annotations(convert.Assignment("n1", {"main": whole}), "nvidia")
    assert out["hami.io/vgpu-devices-allocated"] == "GPU-b,NVIDIA,81920,100:;"  # nvidia.com/gpu alone: HAMi's too
    assert "hami.io/vgpu-devices-allocated" not in convert.assignment_annotations(
        convert.Assignment("n1", {"main": whole}), "corral"
    )


def test_hami_pods_are_placed_and_bound_by_the_extender() -> None:
    """Through the extender (filter, then bind) on gpu-a/gpu-b (A100 80 GiB) and gpu-t4 (T4 16 GiB): the percentage
    is of the T4's memory where the pod asks for T4s, two halves share the T4 and a third is refused with the
    engine's reason; gpumem beyond any GPU is refused naming the field."""
    from tests.k8s.conftest import small

    c = small()
    assert c.state.gpu_memory == {"A100": 81920, "T4": 16384}  # what the extender passes to pod_request
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50", "nvidia.com/gpucores": "50"}
    names = ["gpu-a", "gpu-b", "gpu-t4", "cpu-1"]
    bound = []
    for i in range(3):
        p = pod_object(f"half-{i}", [{"name": "main", "resources": {"limits": limits}}],
                       annotations={"nvidia.com/use-gputype": "t4"})  # fmt: skip
        c.api.put_pod(p)
        answer = c.extender.filter({"Pod": p, "NodeNames": names})
        if i == 2:
            assert answer["NodeNames"] == []
            assert answer["FailedNodes"]["gpu-t4"] == "insufficient GPU (need 1 GPU at 50 % and with 8192 MiB)"
            break
        assert answer["NodeNames"] == ["gpu-t4"]
        m = p["metadata"]
        bind = {"PodName": m["name"], "PodNamespace": "default", "PodUID": m["uid"], "Node": "gpu-t4"}
        assert c.extender.bind(bind) == {"Error": ""}
        bound.append(c.api.pods[("default", m["name"])]["metadata"]["annotations"])
    c.sync()  # the books read again from the API server (a restart): the same shares, the T4 full
    assert c.state.snapshot is not None and int(c.state.snapshot.gpu_mem_free[c.state.snapshot.index["gpu-t4"], 0]) == 0
    slots = [parse_assignment(a).containers["main"] for a in bound]  # type: ignore[union-attr]
    assert [(s.uuid, s.milli, s.memory_mib) for [s] in slots] == [("GPU-gpu-t4-0", 500, 8192)] * 2
    assert bound[0]["hami.io/vgpu-devices-allocated"] == "GPU-gpu-t4-0,NVIDIA,8192,50:;"
    big = pod_object("big", [{"name": "main", "resources": {"limits": {"nvidia.com/gpumem": "100000"}}}])
    with pytest.raises(InvalidRequest, match=r"100000 MiB is more than any GPU here has \(the largest: 81920 MiB\)"):
        c.extender.filter({"Pod": big, "NodeNames": names})  # over HTTP: a 400 whose Error is this message


def test_hami_pods_are_placed_and_bound_by_the_standalone_scheduler() -> None:
    """`corral k8s scheduler`'s loop on the fake API server: the percentage is of the GPUs the scheduler's books know
    (ClusterState.gpu_memory), the Binding carries corral's assignment and HAMi's record, and a hostile HAMi pod
    waits with the message naming its field while the others are bound."""
    import time

    from corral.k8s.fake import FakeKubeApi
    from corral.k8s.scheduler.core import Scheduler
    from corral.placement import PlacementConfig
    from tests.k8s.conftest import gpu_node

    api = FakeKubeApi()
    api.put_node(gpu_node("a100", 2))
    api.put_node(gpu_node("t4", 1, model="T4", memory_mib=16384))

    def hami(name: str, limits: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
        p = pod_object(name, [{"name": "main", "resources": {"limits": limits}}], annotations=annotations or {})
        p["spec"]["schedulerName"] = "corral"
        return p

    quarter = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25", "nvidia.com/gpucores": "25"}
    api.put_pod(hami("on-t4", quarter, {"nvidia.com/use-gputype": "Tesla-T4"}))
    api.put_pod(hami("on-a100", {**quarter, "nvidia.com/gpu": "2"}, {"nvidia.com/nouse-gputype": "T4"}))
    api.put_pod(hami("hostile", {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "250"}))
    s = Scheduler(api, PlacementConfig(policy="binpack"), batch_window=0.001)
    s.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
            api.pods[("default", n)]["spec"].get("nodeName") for n in ("on-t4", "on-a100")
        ):
            time.sleep(0.01)
        got = {n: api.pods[("default", n)] for n in ("on-t4", "on-a100", "hostile")}
        assert [got[n]["spec"].get("nodeName") for n in got] == ["t4", "a100", None]
        t4 = parse_assignment(got["on-t4"]["metadata"]["annotations"])
        a100 = parse_assignment(got["on-a100"]["metadata"]["annotations"])
        assert t4 is not None and a100 is not None
        assert [(x.milli, x.memory_mib) for x in t4.slots] == [(250, 4096)]
        assert [(x.milli, x.memory_mib) for x in a100.slots] == [(250, 20480)] * 2
        assert got["on-t4"]["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] == "GPU-t4-0,NVIDIA,4096,25:;"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "hostile" not in str(api.pods[("default", "hostile")].get("status")):
            time.sleep(0.01)
        [condition] = api.pods[("default", "hostile")]["status"]["conditions"]
        assert "nvidia.com/gpucores]: must be 0..100 (percent of a GPU's compute), got '250'" in condition["message"]
    finally:
        s.close()


def test_a_percentage_pod_waiting_for_its_gpu_type_is_read_again_when_such_a_node_comes() -> None:
    """A HAMi pod asking for a percentage of a T4's memory, created while the cluster has no T4: it waits, saying why;
    once a T4 node is added the scheduler reads it again (the GPU sizes it was read against changed) and binds it."""
    import time

    from corral.k8s.fake import FakeKubeApi
    from corral.k8s.scheduler.core import Scheduler
    from corral.placement import PlacementConfig
    from tests.k8s.conftest import gpu_node

    api = FakeKubeApi()
    api.put_node(gpu_node("a100", 1))
    pod = pod_object("wants-t4", [{"name": "main", "resources": {"limits": {
        "nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}}}],
        annotations={"nvidia.com/use-gputype": "T4"})  # fmt: skip
    pod["spec"]["schedulerName"] = "corral"
    api.put_pod(pod)
    s = Scheduler(api, PlacementConfig(policy="binpack"), batch_window=0.001)
    s.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (api.pods[("default", "wants-t4")].get("status") or {}).get(
            "conditions"
        ):
            time.sleep(0.01)
        [condition] = api.pods[("default", "wants-t4")]["status"]["conditions"]
        assert "a percentage of GPU memory needs the cluster's GPUs" in condition["message"]
        api.put_node(gpu_node("t4", 1, model="T4", memory_mib=16384))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not api.pods[("default", "wants-t4")]["spec"].get("nodeName"):
            time.sleep(0.01)
        got = api.pods[("default", "wants-t4")]
        assert got["spec"].get("nodeName") == "t4"
        assignment = parse_assignment(got["metadata"]["annotations"])
        assert assignment is not None and [x.memory_mib for x in assignment.slots] == [8192]
    finally:
        s.close()


def test_a_pod_hamis_scheduler_bound_is_charged_the_gpus_hamis_record_names() -> None:
    """While pods move over, HAMi's scheduler binds some: they carry HAMi's record (hami.io/vgpu-devices-allocated)
    and no corral assignment. corral charges the GPUs the record names (without it, the lowest free index: GPU 0,
    and corral would then give GPU 1, which HAMi's pod uses, to a pod of its own)."""
    from tests.k8s.conftest import Cluster, gpu_node

    assert convert.hami_uuids({"hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,1000,30:GPU-b,NVIDIA,1000,30:;;"}) == (
        "GPU-a", "GPU-b")  # fmt: skip
    assert convert.hami_uuids({"hami.io/vgpu-devices-allocated": "garbage"}) == ()
    c = Cluster()
    c.api.put_node(gpu_node("n1", 2))
    theirs = pod_object("hami-bound", [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                        annotations={"hami.io/vgpu-devices-allocated": "GPU-n1-1,NVIDIA,81920,0:;"})  # fmt: skip
    theirs["spec"]["nodeName"] = "n1"
    c.api.put_pod(theirs)
    c.sync()
    s = c.state.snapshot
    assert s is not None and [int(m) for m in s.gpu_milli_free[s.index["n1"]][:2]] == [1000, 0]
    ours = pod_object("ours", [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}])
    c.api.put_pod(ours)
    m = ours["metadata"]
    assert c.extender.bind({"PodName": "ours", "PodNamespace": "default", "PodUID": m["uid"], "Node": "n1"}) == {
        "Error": ""}  # fmt: skip
    a = parse_assignment(c.api.pods[("default", "ours")]["metadata"]["annotations"])
    assert a is not None and [x.uuid for x in a.slots] == ["GPU-n1-0"]
