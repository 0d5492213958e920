"""fgd-priced's issue-27 rules: while free CPU runs out before free GPU milli (the CPU-aware horizon is the smaller),
the GPU pods' fill gain counts every target type fully (no scarcity weights; otherwise fgd-scarcity's weights), and
(measured, not adopted: the `gpu_pods_free_cpu_bound` switch) pods with GPUs are not kept off the hosts kept for
multi-GPU pods (pods without GPUs still are)."""

from __future__ import annotations

import numpy as np
import pytest

from corral.model.resources import Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place, registry
from corral.placement.context import Context
from corral.placement.filters import evaluate
from corral.placement.reserve import kept_hosts
from corral.placement.scarcity import horizons, scarcity_weights
from corral.placement.scores.fgd_priced import KEPT_OFF, FgdPriced
from corral.placement.workload import TargetType, TargetWorkload
from tests.builders import cluster, commit, cpu_only, gpus, node
from tests.placement.test_properties import normalised


class _Issue27(FgdPriced):
    name = "test-priced-issue27"
    unweighted_cpu_bound = False


def context(s: ClusterSnapshot, request: Request, workload: TargetWorkload) -> Context:
    config = PlacementConfig(policy="fgd-priced", workload=workload)
    fit = evaluate(s, request, request.effective_behavior(config.gpu_behavior), config.reserve)
    return Context(s, request, fit, workload, np.random.default_rng(0))


def workload(cpu_only_cores: int) -> TargetWorkload:
    # Mostly small shares and whole GPUs with few cores, plus pods without GPUs of `cpu_only_cores` cores.
    return normalised([
        TargetType(1000, 100, 1, None, 0.45),
        TargetType(2000, 1000, 1, None, 0.05),
        TargetType(cpu_only_cores * 1000, 0, 0, None, 0.5),
    ])  # fmt: skip


def test_no_scarcity_weights_while_cpu_runs_out_first() -> None:
    s = cluster(*(node(f"n{i}").gpus(8).cpu(64) for i in range(4)))
    wl = workload(32)  # 0.5 x 32 cores per pod: the 256 cores go long before the 32 GPUs
    h_gpu, h_cpu = horizons(s, wl)
    assert h_cpu < h_gpu
    ctx = context(s, gpus(1, 100, cpu=1000), wl)
    assert not np.all(scarcity_weights(s, wl, h_gpu) == 1.0)  # the weights would discount some type
    assert np.all(FgdPriced()._weights(ctx) == 1.0)
    assert np.array_equal(_Issue27()._weights(context(s, gpus(1, 100, cpu=1000), wl)), scarcity_weights(s, wl, h_gpu))


def test_scarcity_weights_kept_while_gpu_milli_runs_out_first() -> None:
    s = cluster(*(node(f"n{i}").gpus(8).cpu(256) for i in range(4)))
    wl = workload(2)
    h_gpu, h_cpu = horizons(s, wl)
    assert h_cpu == h_gpu
    ctx = context(s, gpus(1, 100, cpu=1000), wl)
    weights = scarcity_weights(s, wl, h_gpu)
    assert not np.all(weights == 1.0)
    assert np.array_equal(FgdPriced()._weights(ctx), weights)


class _GpuPodsFree(FgdPriced):
    name = "test-priced-gpu-pods-free"
    gpu_pods_free_cpu_bound = True


def big_tail_cpu_bound() -> TargetWorkload:
    # 1-GPU 16-core pods and 32-core pods without GPUs: the 448 cores of `g3_and_g2` go after ~19 pods, its 32 GPUs
    # after 64; 15 % 8-GPU 120-core pods keep ceil(0.15 x 18.7) = 3 >= 2 hosts: both 128-core nodes are at reserve.
    typical = (TargetType(16_000, 1000, 1, None, 0.5), TargetType(32_000, 0, 0, None, 0.5))
    return TargetWorkload(typical, (TargetType(120_000, 1000, 8, None, 0.15),))


def g3_and_g2() -> ClusterSnapshot:
    return cluster(node("g3a").gpus(8).cpu(128), node("g3b").gpus(8).cpu(128), node("g2a").gpus(8).cpu(96),
                   node("g2b").gpus(8).cpu(96))  # fmt: skip


def test_the_switch_frees_pods_with_gpus_from_the_kept_hosts_only_while_cpu_runs_out_first() -> None:
    s, wl = g3_and_g2(), big_tail_cpu_bound()
    h_gpu, h_cpu = horizons(s, wl)
    assert h_cpu < h_gpu
    everything = np.arange(len(s), dtype=np.int64)
    small = gpus(1, cpu=16_000)
    assert kept_hosts(s, wl, small, everything, cpu=True, h=h_cpu).tolist() == [True, True, False, False]
    # A pod with GPUs: not kept off under the switch (`fgd-priced-gpu-pods-free`); fgd-priced keeps it off.
    assert not _GpuPodsFree().keeps_off(context(s, small, wl))
    assert FgdPriced().keeps_off(context(s, small, wl))
    d = place(s, small, PlacementConfig(policy="fgd-priced", workload=wl), rng=0)
    assert d.allocation is not None and d.allocation.node.startswith("g2")
    # A pod without GPUs keeps off them under both, and says so.
    assert _GpuPodsFree().keeps_off(context(s, cpu_only(32_000), wl))
    d = place(s, cpu_only(32_000), PlacementConfig(policy="fgd-priced", workload=wl), rng=0)
    assert d.allocation is not None and d.allocation.node.startswith("g2")
    assert "fgd-priced: 2 nodes kept free for multi-GPU pods came last" in d.explanation.notes


def test_pods_with_gpus_keep_off_the_multi_gpu_hosts_while_gpu_milli_runs_out_first() -> None:
    # Few pods without GPUs, of 2 cores: the GPUs go first (after 36 pods, the cores after 41), and a 1-GPU pod
    # keeps off the last hosts.
    typical = (TargetType(12_000, 1000, 1, None, 0.9), TargetType(2_000, 0, 0, None, 0.1))
    wl = TargetWorkload(typical, (TargetType(120_000, 1000, 8, None, 0.05),))
    s = g3_and_g2()
    h_gpu, h_cpu = horizons(s, wl)
    assert not h_cpu < h_gpu
    assert FgdPriced().keeps_off(context(s, gpus(1, cpu=16_000), wl))
    assert _GpuPodsFree().keeps_off(context(s, gpus(1, cpu=16_000), wl))
    d = place(s, gpus(1, cpu=16_000), PlacementConfig(policy="fgd-priced", workload=wl), rng=0)
    assert d.allocation is not None and d.allocation.node.startswith("g2")
    assert "fgd-priced: 2 nodes kept free for multi-GPU pods came last" in d.explanation.notes


class _KeptPrice(FgdPriced):
    name = "test-priced-kept-price"
    kept_price_cpu_bound = 20.0


def test_the_kept_price_charges_pods_with_gpus_on_kept_hosts_only_while_cpu_runs_out_first() -> None:
    s, wl = g3_and_g2(), big_tail_cpu_bound()
    everything = np.arange(len(s), dtype=np.int64)
    small = gpus(1, cpu=16_000)
    free, priced = _GpuPodsFree(), _KeptPrice()
    ctx = context(s, small, wl)
    # 20 milli on fgd-scarcity's fill gain, at its sigmoid's steepest slope: 20 x 0.999 / 4 / 1000 of a point.
    assert priced.kept_price(ctx) == 20 * 0.999 * 0.25 / 1000
    base, got = free.score(ctx, everything), priced.score(ctx, everything)
    assert (base - got).tolist() == pytest.approx([priced.kept_price(ctx)] * 2 + [0.0, 0.0])  # g3a, g3b: kept
    # All four nodes tie here: the switch alone takes the first kept host, the price sends the pod to a G2 node.
    d = place(s, small, PlacementConfig(policy=_GpuPodsFree.name, workload=wl), rng=0)
    assert d.allocation is not None and d.allocation.node == "g3a"
    d = place(s, small, PlacementConfig(policy=_KeptPrice.name, workload=wl), rng=0)
    assert d.allocation is not None and d.allocation.node.startswith("g2")
    assert (
        "fgd-priced: 2 nodes kept free for multi-GPU pods cost 20 milli of a GPU's worth more (free CPU runs out first)"
        in d.explanation.notes
    )
    # A pod without GPUs still keeps off them (ranked last, not priced).
    d = place(s, cpu_only(32_000), PlacementConfig(policy=_KeptPrice.name, workload=wl), rng=0)
    assert "fgd-priced: 2 nodes kept free for multi-GPU pods came last" in d.explanation.notes


def test_the_kept_price_on_a_share_is_milli_of_priced_loss() -> None:
    shares = normalised([TargetType(1000, 500, 1, None, 0.5), TargetType(32_000, 0, 0, None, 0.5)])
    s = g3_and_g2()
    ctx = context(s, gpus(1, 500, cpu=1000), shares)
    assert _KeptPrice().kept_price(ctx) == 20 * 101 * 1001  # a milli of loss is key 1's step (`priced_order`)


def test_the_kept_price_leaves_the_hard_rule_while_gpu_milli_runs_out_first() -> None:
    typical = (TargetType(12_000, 1000, 1, None, 0.9), TargetType(2_000, 0, 0, None, 0.1))
    wl = TargetWorkload(typical, (TargetType(120_000, 1000, 8, None, 0.05),))
    s = g3_and_g2()
    assert _KeptPrice().keeps_off(context(s, gpus(1, cpu=16_000), wl))


class _CpuRich(FgdPriced):
    name = "test-priced-cpu-rich"
    cpu_rich_cpu_bound = 4.0


@pytest.fixture(autouse=True)
def _variants(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variants are registered for each test only (the registry's list of policies is itself tested)."""
    for cls in (_GpuPodsFree, _KeptPrice, _CpuRich):
        monkeypatch.setitem(registry._REGISTRY, cls.name, cls)


def test_pods_with_gpus_keep_off_the_kept_hosts_while_cpu_binds_only_while_a_cpu_rich_node_is_left() -> None:
    wl, small = big_tail_cpu_bound(), gpus(1, cpu=16_000)
    # The workload's pods with GPUs take 16 milli of CPU per GPU milli: rich = 4 x 16 x free GPU milli after the pod.
    # g2a / g2b keep 80 cores for 7 GPUs (needs 448): not rich, so the kept hosts g3a / g3b compete on score.
    s = g3_and_g2()
    everything = np.arange(len(s), dtype=np.int64)
    assert not _CpuRich().cpu_rich_elsewhere(context(s, small, wl), everything[2:])
    d = place(s, small, PlacementConfig(policy=_CpuRich.name, workload=wl), rng=0)
    assert d.allocation is not None and d.allocation.node == "g3a"  # all tie; fgd-priced would take a G2 node
    assert d.explanation.notes == (
        "fgd-priced: 2 nodes kept free for multi-GPU pods competed on score: free CPU runs out first and every other "
        "node would be left short of CPU for its GPUs",
    )
    # A 96-core node with 2 GPUs keeps 80 cores for 1 GPU (needs 64): rich, so the kept hosts come last again.
    s = cluster(node("g3a").gpus(8).cpu(128), node("g3b").gpus(8).cpu(128), node("g2a").gpus(8).cpu(96),
                node("g2b").gpus(8).cpu(96), node("r").gpus(2).cpu(96))  # fmt: skip
    assert _CpuRich().cpu_rich_elsewhere(context(s, small, wl), np.arange(2, 5, dtype=np.int64))
    d = place(s, small, PlacementConfig(policy=_CpuRich.name, workload=wl), rng=0)
    assert d.allocation is not None and not d.allocation.node.startswith("g3")
    assert d.explanation.notes == ("fgd-priced: 2 nodes kept free for multi-GPU pods came last",)


def test_the_cpu_rich_test_leaves_the_hard_rule_while_gpu_milli_runs_out_first() -> None:
    typical = (TargetType(12_000, 1000, 1, None, 0.9), TargetType(2_000, 0, 0, None, 0.1))
    wl = TargetWorkload(typical, (TargetType(120_000, 1000, 8, None, 0.05),))
    d = place(g3_and_g2(), gpus(1, cpu=16_000), PlacementConfig(policy=_CpuRich.name, workload=wl), rng=0)
    assert d.allocation is not None and d.allocation.node.startswith("g2")
    assert d.explanation.notes == ("fgd-priced: 2 nodes kept free for multi-GPU pods came last",)


class _PackFirst(FgdPriced):
    name = "test-priced-pack-first"
    pack_first_always = True  # whenever free CPU runs out first (the GPU milli test is tested below)


class _NoPack(FgdPriced):
    name = "test-priced-no-pack"
    pack_first_cpu_bound = False


def test_pack_first_breaks_no_whole_node_while_a_broken_one_of_its_shape_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry._REGISTRY, _PackFirst.name, _PackFirst)
    # Four 8-GPU 96-core nodes and a 4-GPU node; the pods without GPUs take 32 cores: free CPU runs out first.
    s = cluster(*(node(f"n{i}").gpus(8).cpu(96) for i in range(4)), node("q").gpus(4).cpu(96))
    wl = workload(32)
    h_gpu, h_cpu = horizons(s, wl)
    assert h_cpu < h_gpu
    everything = np.arange(len(s), dtype=np.int64)
    small = gpus(1, cpu=2000)
    assert not _PackFirst().breaks_intact(context(s, small, wl), everything).any()  # nothing broken yet
    first = commit(s, place(s, small, PlacementConfig(policy=_PackFirst.name, workload=wl), rng=0))
    assert first.allocation is not None and first.allocation.node == "n0"
    # n1-n3 (whole, the shape of the broken n0) are ranked after every node that breaks nothing; q (another
    # shape, no broken node of its own) is not.
    ctx = context(s, small, wl)
    assert _PackFirst().breaks_intact(ctx, everything).tolist() == [False, True, True, True, False]
    packed, plain = _PackFirst().score(ctx, everything), _NoPack().score(context(s, small, wl), everything)
    assert np.array_equal(packed, plain - np.array([0, 1, 1, 1, 0]) * KEPT_OFF / 2)
    d = place(s, gpus(1, cpu=2000, id="second"), PlacementConfig(policy=_PackFirst.name, workload=wl), rng=0)
    assert d.allocation is not None and d.allocation.node == "n0"
    assert d.explanation.notes == (
        "fgd-priced: 3 nodes with every GPU free came after the broken nodes of their shape (free CPU runs out first)",
    )


def test_pack_first_leaves_fgd_priced_while_gpu_milli_runs_out_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry._REGISTRY, _PackFirst.name, _PackFirst)
    s = cluster(*(node(f"n{i}").gpus(8).cpu(256) for i in range(4)))
    wl = workload(2)
    h_gpu, h_cpu = horizons(s, wl)
    assert not h_cpu < h_gpu
    for i in range(6):
        pod = gpus(1, cpu=2000, id=f"p{i}")
        a = place(s, pod, PlacementConfig(policy=_PackFirst.name, workload=wl), rng=0)
        b = place(s, pod, PlacementConfig(policy="fgd-priced", workload=wl), rng=0)
        assert a.allocation == b.allocation and a.explanation.notes == b.explanation.notes
        commit(s, a)


def test_fgd_priced_packs_first_only_while_cpu_strands_less_gpu_milli_than_the_multi_gpu_pods_need() -> None:
    # 8-GPU nodes of 96 cores; 1-GPU pods of 2 cores and pods without GPUs of `cores`, and 8-GPU pods in the tail.
    def wl(cores: int) -> TargetWorkload:
        typical = (TargetType(2_000, 1000, 1, None, 0.5), TargetType(cores * 1000, 0, 0, None, 0.5))
        return TargetWorkload(typical, (TargetType(16_000, 1000, 8, None, 0.05),))

    s = cluster(*(node(f"n{i}").gpus(8).cpu(96) for i in range(4)))
    pod = gpus(1, cpu=2000)
    # 16 cores: the 384 cores go after 42.7 pods, the 32 GPUs (0.5 GPU per typical pod) after 64: 10.7 GPUs idle,
    # less than the 8-GPU pods' 0.4 GPU per pod x 42.7 (17.1 GPUs): keep whole nodes whole.
    h_gpu, h_cpu = horizons(s, wl(16))
    assert h_cpu < h_gpu and (h_gpu - h_cpu) * 500 < h_cpu * 400
    assert FgdPriced().packs_first(context(s, pod, wl(16)))
    # 64 cores: the cores go after 11.6 pods, 26.2 GPUs idle then, more than the 8-GPU pods' 4.7: the fill gain decides.
    h_gpu, h_cpu = horizons(s, wl(64))
    assert h_cpu < h_gpu and (h_gpu - h_cpu) * 500 > h_cpu * 400
    assert not FgdPriced().packs_first(context(s, pod, wl(64)))
    assert _PackFirst().packs_first(context(s, pod, wl(64)))
