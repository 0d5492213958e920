"""GPU scheduling behaviour for work that asks for no GPU (seed 000, mesos-frameworks.md section 2)."""

from __future__ import annotations

import pytest

from corral.model.resources import GpuBehavior, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import Decision, GpuReserve, PlacementConfig, Reason, place, render
from tests.builders import cluster, cpu_only, gpus, node

R, U, P, UNDEF = (
    GpuBehavior.RESTRICTED,
    GpuBehavior.UNRESTRICTED,
    GpuBehavior.PREFERENTIAL,
    GpuBehavior.UNDEFINED,
)


def run(s: ClusterSnapshot, req: Request, behavior: GpuBehavior, policy: str = "binpack", **kw: object) -> Decision:
    return place(s, req, PlacementConfig(policy=policy, gpu_behavior=behavior, **kw))  # type: ignore[arg-type]


def take(s: ClusterSnapshot, req: Request) -> None:
    d = place(s, req, PlacementConfig(gpu_behavior=U))
    assert d.allocation is not None
    s.allocate(d.allocation)


def gpu_and_cpu_nodes() -> ClusterSnapshot:
    # The GPU node is listed first and binpack prefers it (it is the smaller node), so any move away is the rule.
    return cluster(node("gpu").gpus(4).cpu(16).mem(64), node("cpu").cpu(64).mem(256))


@pytest.mark.parametrize(
    ("flag", "label", "fits"),
    [
        # Marathon's ResourceMatcherTest matrix, on a node that has free GPUs.
        (U, "restricted", False),
        (U, None, True),
        (R, "unrestricted", True),
        (R, None, False),
    ],
)
def test_marathon_four_case_matrix(flag: GpuBehavior, label: str | None, fits: bool) -> None:
    s = cluster(node("gpu").gpus(4))
    labels = {"GPU_SCHEDULING_BEHAVIOR": label} if label else {}
    d = run(s, Request(cpu_milli=1000, labels=labels), flag)
    assert d.placed is fits
    if not fits:
        assert render(d.explanation) == "0/1 nodes fit: 1 DeclinedScarceResources"
        assert d.explanation.rejected == ((Reason.DECLINED_SCARCE, 1),)


def test_restricted_sends_non_gpu_work_to_non_gpu_nodes() -> None:
    s = gpu_and_cpu_nodes()
    assert run(s, cpu_only(), U).explanation.chosen == "gpu"
    assert run(s, cpu_only(), R).explanation.chosen == "cpu"
    assert run(s, gpus(1), R).explanation.chosen == "gpu"  # GPU work is never declined


def test_declined_only_when_everything_else_fit() -> None:
    s = gpu_and_cpu_nodes()
    d = run(s, cpu_only(cpu=32_000), R)
    # the GPU node is short of CPU: that is its reason, not the decline
    assert (
        render(d.explanation)
        == "1/2 nodes fit; chose cpu (binpack score 25.1953); rejected: 1 CPU capacity below 32000m"
    )
    d2 = run(cluster(node("gpu").gpus(4).cpu(16), node("cpu").cpu(8)), cpu_only(cpu=12_000), R)
    assert render(d2.explanation) == "0/2 nodes fit: 1 CPU capacity below 12000m, 1 DeclinedScarceResources"


def test_restricted_treats_a_node_with_all_gpus_taken_as_non_gpu() -> None:
    s = cluster(node("gpu").gpus(2).cpu(32))
    take(s, gpus(1, id="a"))
    assert not run(s, cpu_only(), R).placed
    take(s, gpus(1, id="b"))
    assert run(s, cpu_only(), R).placed
    # Marathon's rule counts whole GPUs: a GPU that is only partly shared is not "free" to it.
    s2 = cluster(node("gpu").gpus(1).cpu(32))
    take(s2, gpus(1, 100, id="share"))
    assert run(s2, cpu_only(), R).placed


def test_undefined_places_anywhere_but_warns() -> None:
    s = cluster(node("gpu").gpus(2))
    d = run(s, cpu_only(), UNDEF)
    assert d.placed
    assert d.explanation.notes == (
        "GPU scheduling behaviour is undefined: work without GPUs was placed on a node with free GPUs "
        "(set restricted, unrestricted or preferential)",
    )
    assert run(s, cpu_only(), U).explanation.notes == ()


def test_preferential_prefers_nodes_without_free_gpus() -> None:
    s = gpu_and_cpu_nodes()
    assert run(s, cpu_only(), P).explanation.chosen == "cpu"
    # even against the policy's score (binpack would pick the smaller GPU node)
    assert run(s, cpu_only(), P).explanation.top[0][0] == "cpu"
    # a GPU node whose GPUs are all taken is as good as a CPU node
    s2 = cluster(node("gpu").gpus(1).cpu(16), node("cpu").cpu(64))
    take(s2, gpus(1, id="g"))
    assert run(s2, cpu_only(), P).explanation.chosen == "gpu"


def test_preferential_uses_a_gpu_node_when_nothing_else_fits_but_keeps_the_reserve() -> None:
    s = cluster(node("gpu").gpus(2).cpu(16).mem(64), node("cpu").cpu(2).mem(8))
    reserve = GpuReserve(cpu_milli_per_gpu=4000, memory_mib_per_gpu=8192)
    d = run(s, cpu_only(cpu=8000), P, reserve=reserve)
    assert d.explanation.chosen == "gpu"
    assert d.explanation.notes == (
        "no node without free GPUs fit; placed on a GPU node, keeping the per-GPU reserve free",
    )
    # 16 cores - 2 free GPUs x 4 cores reserve = 8 cores usable: 9 would strand a GPU
    d2 = run(s, cpu_only(cpu=9000), P, reserve=reserve)
    assert not d2.placed
    assert render(d2.explanation) == (
        "0/2 nodes fit: 1 CPU capacity below 9000m, 1 GPU reserve (CPU/memory kept for free GPUs)"
    )
    assert not d2.unresolvable(0)  # waiting for the GPUs to be taken would help
    # memory reserve too: 64 GiB - 2 x 8 GiB = 48 GiB usable
    assert run(s, cpu_only(cpu=1000, mem=48 * 1024), P, reserve=reserve).placed
    assert not run(s, cpu_only(cpu=1000, mem=49 * 1024), P, reserve=reserve).placed


def test_preferential_reserve_shrinks_as_gpus_are_taken() -> None:
    s = cluster(node("gpu").gpus(2).cpu(16))
    reserve = GpuReserve(cpu_milli_per_gpu=4000, memory_mib_per_gpu=0)
    take(s, gpus(1, 500, cpu=0, id="half"))  # 1.5 GPUs free -> 6 cores reserved
    assert run(s, cpu_only(cpu=10_000), P, reserve=reserve).placed
    assert not run(s, cpu_only(cpu=10_001), P, reserve=reserve).placed


def test_gpu_requests_ignore_the_behaviour() -> None:
    s = gpu_and_cpu_nodes()
    for b in GpuBehavior:
        assert run(s, gpus(2), b).explanation.chosen == "gpu"


def test_preferential_label_per_request() -> None:
    s = gpu_and_cpu_nodes()
    req = Request(cpu_milli=1000, labels={"GPU_SCHEDULING_BEHAVIOR": "preferential"})
    d = run(s, req, U)
    assert d.behavior is P and d.explanation.chosen == "cpu"
