"""fgd-priced's two issue-16 mechanisms on small hand-built clusters: where each must change the choice, and where it
must not (FGD's points before the tightest GPU; the kept hosts' margin for pods with GPUs)."""

from __future__ import annotations

import numpy as np

from corral.model.resources import MILLI_PER_GPU, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.placement.registry import policy_names, register_policy
from corral.placement.reserve import GPU_POD_MARGIN, kept_hosts
from corral.placement.scores.fgd_priced import FgdPriced
from corral.placement.workload import TargetType, TargetWorkload
from tests.builders import cluster, cpu_only, gpus, node
from tests.placement.test_fgd_priced import occupy, shares


class _TightFirst(FgdPriced):
    name = "test-priced-tight-first"
    fgd_first = False


class _NoMargin(FgdPriced):
    name = "test-priced-no-margin"
    gpu_margin = 1.0


for _cls in (_TightFirst, _NoMargin):
    if _cls.name not in policy_names():
        register_policy(_cls.name, _cls)

PAIRS = shares((470, 2.0), (320, 1.0), (650, 1.0))


def chosen(s: ClusterSnapshot, request: Request, policy: str, workload: TargetWorkload) -> tuple[str, int | None]:
    d = place(s, request, PlacementConfig(policy=policy, workload=workload), rng=0)
    assert d.allocation is not None, d.explanation
    return d.allocation.node, (d.allocation.gpu_indices[0] if d.allocation.gpu_indices else None)


def half_used(a_cores: int) -> ClusterSnapshot:
    # a: GPU 0 holds a 470 (530 free beside it), GPU 1 empty, `a_cores` cores; b: two empty GPUs, 64 cores.
    s = cluster(node("a").gpus(2).cpu(a_cores), node("b").gpus(2).cpu(64))
    occupy(s, "a", 0, 470, "x")
    return s


def test_fgd_points_come_before_the_tightest_gpu_where_the_share_would_take_the_nodes_cpu() -> None:
    # A 470 loses nothing on a's 530 (completes the pair) and nothing on an empty GPU: equal loss. On a 6-core `a`
    # its 4 cores leave 1, and a's empty GPU 1 is stranded for every typical pod: FGD scores a 28 against b's 46.
    s = half_used(6)
    share = gpus(1, 470, cpu=4000)
    assert chosen(s, share, "fgd", PAIRS)[0] == "b"
    assert chosen(s, share, "test-priced-tight-first", PAIRS) == ("a", 0)  # tightest first: strands a's GPU 1
    assert chosen(s, share, "fgd-priced", PAIRS)[0] == "b"


def test_the_tightest_gpu_still_completes_a_pair_where_the_node_has_cpu_to_spare() -> None:
    # With 16 cores on `a` the share strands nothing there: FGD's points agree, and the pair is completed.
    s = half_used(16)
    share = gpus(1, 470, cpu=4000)
    assert chosen(s, share, "fgd-priced", PAIRS) == ("a", 0)
    assert chosen(s, share, "test-priced-tight-first", PAIRS) == ("a", 0)


def test_the_loss_still_comes_before_fgd_points() -> None:
    # A 320 on a's 530 spoils the room a 470 would fill (loss 167); on b's empty GPUs it loses nothing. b has 4.5
    # cores: the 320's core leaves 3.5, too few for any typical pod (4 cores), so FGD prefers a's 530. The loss
    # decides first.
    s = cluster(node("a").gpus(2).cpu(64), node("b").gpus(2).cpu(4.5))
    occupy(s, "a", 0, 470, "x")
    occupy(s, "a", 1, 470, "y")
    share = gpus(1, 320, cpu=1000)
    assert chosen(s, share, "fgd", PAIRS)[0] == "a"
    assert chosen(s, share, "fgd-priced", PAIRS)[0] == "b"


def g3_and_g2() -> ClusterSnapshot:
    # Two nodes that can take an 8-GPU, 120-core pod, two that cannot (96 cores).
    return cluster(node("g3a").gpus(8).cpu(128), node("g3b").gpus(8).cpu(128), node("g2a").gpus(8).cpu(96),
                   node("g2b").gpus(8).cpu(96))  # fmt: skip


def with_big_tail(probability: float) -> TargetWorkload:
    typical = (TargetType(16_000, MILLI_PER_GPU, 1, None, 0.5), TargetType(12_000, MILLI_PER_GPU, 1, None, 0.5))
    return TargetWorkload(typical, (TargetType(120_000, MILLI_PER_GPU, 8, None, probability),))


def test_the_margin_keeps_hosts_earlier_for_pods_with_gpus_only() -> None:
    # 32 GPUs and 448 cores free, a typical pod takes 1 GPU and 14 cores: 32 pods to come, 3 % of them 8-GPU
    # 120-core ones: demand 0.96, a reserve of 1 < 2 hosts (nothing kept); with the margin, ceil(1.44) = 2 hosts.
    s, workload = g3_and_g2(), with_big_tail(0.03)
    everything = np.arange(len(s), dtype=np.int64)
    one_gpu, cpu_pod = gpus(1, cpu=16_000), cpu_only(16_000)  # each would leave a host 112 cores: too few
    assert not kept_hosts(s, workload, one_gpu, everything, cpu=True).any()
    assert kept_hosts(s, workload, one_gpu, everything, cpu=True, margin=GPU_POD_MARGIN).tolist() == [
        True, True, False, False
    ]  # fmt: skip
    # The policy: the 1-GPU pod goes to a 96-core node; without the margin it takes a host (fgd-scarcity's choice).
    assert chosen(s, one_gpu, "test-priced-no-margin", workload)[0] == "g3a"
    assert chosen(s, one_gpu, "fgd-priced", workload)[0].startswith("g2")
    # A pod without GPUs keeps the margin of 1: it is placed as without the margin.
    assert chosen(s, cpu_pod, "fgd-priced", workload) == chosen(s, cpu_pod, "test-priced-no-margin", workload)
    assert not kept_hosts(s, workload, cpu_pod, everything, cpu=True).any()


def test_the_margin_keeps_nothing_while_hosts_are_plentiful() -> None:
    # 1 %: demand 0.32, with the margin 0.48, a reserve of 1 < 2 hosts: nothing kept, the margin changes nothing.
    s, workload = g3_and_g2(), with_big_tail(0.01)
    everything = np.arange(len(s), dtype=np.int64)
    assert not kept_hosts(s, workload, gpus(1, cpu=16_000), everything, cpu=True, margin=GPU_POD_MARGIN).any()
    one_gpu = gpus(1, cpu=16_000)
    assert chosen(s, one_gpu, "fgd-priced", workload) == chosen(s, one_gpu, "test-priced-no-margin", workload)
