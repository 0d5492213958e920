"""Each policy's choice on small hand-built clusters, with the scores worked out by hand."""

from __future__ import annotations

import math

import pytest

from corral.model.resources import GpuBehavior, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import Decision, PlacementConfig, TargetWorkload, place, policy_names
from corral.placement.workload import TargetType
from tests.builders import cluster, cpu_only, gpus, node

UNRESTRICTED = GpuBehavior.UNRESTRICTED


def run(s: ClusterSnapshot, req: Request, policy: str, **kw: object) -> Decision:
    cfg = PlacementConfig(policy=policy, gpu_behavior=UNRESTRICTED, **kw)  # type: ignore[arg-type]
    return place(s, req, cfg, rng=7)


def grant(s: ClusterSnapshot, req: Request, policy: str = "binpack", **kw: object) -> Decision:
    d = run(s, req, policy, **kw)
    assert d.allocation is not None, d.explanation
    s.allocate(d.allocation)
    return d


def chosen(d: Decision) -> tuple[str, tuple[int, ...]]:
    assert d.allocation is not None, d.explanation
    return d.allocation.node, d.allocation.gpu_indices


def test_registry_has_every_policy() -> None:
    assert policy_names() == [
        "bestfit",
        "binpack",
        "dotprod",
        "fgd",
        "fgd-priced",
        "fgd-scarcity",
        "gpu-clustering",
        "gpu-packing",
        "load",
        "random",
        "spread",
        "topology",
    ]


def two_nodes() -> ClusterSnapshot:
    return cluster(node("a").gpus(4), node("b").gpus(4))


def test_binpack_fills_the_fullest_node_and_gpu() -> None:
    s = two_nodes()
    grant(s, gpus(1, 400, id="first"))  # goes to a (tie -> smallest rank), GPU 0
    d = run(s, gpus(1, 500), "binpack")
    assert chosen(d) == ("a", (0,))  # the GPU with 600 free is the tightest fit
    assert chosen(run(s, gpus(1, 700), "binpack")) == ("a", (1,))  # GPU 0 cannot take 700
    assert chosen(run(s, gpus(2), "binpack")) == ("a", (1, 2))


def test_spread_uses_the_emptiest_node_and_gpu() -> None:
    s = two_nodes()
    grant(s, gpus(1, 400, id="first"), "spread")
    assert chosen(run(s, gpus(1, 500), "spread")) == ("b", (0,))
    s2 = cluster(node("a").gpus(2))
    grant(s2, gpus(1, 400, id="x"), "spread")
    assert chosen(run(s2, gpus(1, 100), "spread")) == ("a", (1,))


def test_random_is_seeded() -> None:
    s = cluster(*(node(f"n{i}").gpus(2) for i in range(8)))
    cfg = PlacementConfig(policy="random")
    picks = {place(s, gpus(1, 300), cfg, rng=seed).explanation.chosen for seed in range(40)}
    assert len(picks) >= 5  # spreads over the cluster
    assert place(s, gpus(1, 300), cfg, rng=3).allocation == place(s, gpus(1, 300), cfg, rng=3).allocation


def test_tie_break_is_the_smallest_rank() -> None:
    s = cluster(node("a").gpus(2), node("b").gpus(2), node("c").gpus(2), ranks=[5, 1, 3])
    assert chosen(run(s, gpus(1), "bestfit"))[0] == "b"


def test_bestfit_score_by_hand() -> None:
    s = cluster(node("a").gpus(8).cpu(64), node("b").gpus(8).cpu(32))
    d = run(s, gpus(1, cpu=4000), "bestfit")
    # a: 1/2 * 60000/128000 + 1/2 * 7000/8000 = 0.671875 -> floor(32.8125) = 32
    # b: 1/2 * 28000/128000 + 1/2 * 7000/8000 = 0.546875 -> floor(45.3125) = 45
    assert d.explanation.top == (("b", 45.0), ("a", 32.0))


def test_dotprod_prefers_the_smallest_dot_product() -> None:
    s = cluster(node("a").gpus(8).cpu(96), node("b").gpus(2).cpu(16))
    d = run(s, gpus(1, 500, cpu=8000), "dotprod")
    # a: x.y = (96000*8000)/128000^2 + (8000*500)/8000^2 = 0.046875 + 0.0625 -> floor(94.53) = 94
    # b: (16000*8000)/128000^2 + (2000*500)/8000^2 = 0.0078125 + 0.015625 -> floor(98.83) = 98
    assert d.explanation.top == (("b", 98.0), ("a", 94.0))


def test_gpu_packing_order_of_preference() -> None:
    s = cluster(node("empty8").gpus(8), node("empty2").gpus(2), node("used").gpus(4))
    grant(s, gpus(1, 600, id="u"), "gpu-packing")  # empty nodes score 33 - G: the 2-GPU node wins
    assert s.allocations["u"].node == "empty2"
    d = run(s, gpus(1, 300), "gpu-packing")
    # empty2 GPU 0 has 400 free: 100 - floor(400/100) = 96 beats opening a free GPU (max(50-1,33) = 49)
    assert chosen(d) == ("empty2", (0,))
    assert dict(d.explanation.top) == {"empty2": 96.0, "used": 29.0, "empty8": 25.0}
    d2 = run(s, gpus(1, 500), "gpu-packing")  # does not fit GPU 0: open GPU 1 of the used node (49)
    assert chosen(d2) == ("empty2", (1,)) and d2.explanation.top[0][1] == 49.0


def test_gpu_clustering_keeps_kinds_together() -> None:
    s = cluster(node("a").gpus(8), node("b").gpus(8), node("c").gpus(8))
    grant(s, gpus(1, 500, id="share"), "gpu-clustering")  # a
    grant(s, gpus(2, id="two"), "gpu-clustering")  # a scores b = floor(25*500/8000) = 1 (other tag); b/c 25 -> b
    assert s.allocations["two"].node == "b"
    d = run(s, gpus(1, 300), "gpu-clustering")
    # a holds only shares: 75 + floor(25*500/8000) = 76; b holds only 2-GPU pods: 0 + floor(25*2000/8000) = 6
    assert dict(d.explanation.top) == {"a": 76.0, "c": 25.0, "b": 6.0}
    assert run(s, cpu_only(), "gpu-clustering").explanation.top[0] == ("a", 0.0)


def test_fgd_keeps_whole_gpus_whole() -> None:
    s = cluster(node("a").gpus(2).cpu(8))
    grant(s, gpus(1, 500, cpu=0, id="half"))
    workload = TargetWorkload((TargetType(0, 1000, 1, None, 1.0),))
    d = run(s, gpus(1, 300, cpu=0), "fgd", workload=workload)
    # Before: GPU 1 serves the whole-GPU type, GPU 0's 500 is fragment (F = 500). Share on GPU 0: F' = 200,
    # score floor(100 sigmoid(0.3)) = 57. On GPU 1: no whole GPU left, F' = 1200, score floor(100 sigmoid(-0.7)) = 33.
    assert chosen(d) == ("a", (0,))
    assert d.explanation.top == (("a", 57.0),)
    assert math.floor(100 / (1 + math.exp(-0.3))) == 57


def test_fgd_whole_gpus_and_cpu_only_score_fifty_when_nothing_changes() -> None:
    s = cluster(node("a").gpus(2).cpu(8), node("b").gpus(2).cpu(8))
    workload = TargetWorkload((TargetType(0, 500, 1, None, 1.0),))
    d = run(s, cpu_only(cpu=1000), "fgd", workload=workload)
    assert [score for _, score in d.explanation.top] == [50.0, 50.0]


def test_topology_picks_the_nvlinked_pair() -> None:
    linked = node("x").gpus(4, nvlink=[(1, 3)], numa=[0, 0, 1, 1], switch=[0, 1, 2, 3])
    s = cluster(node("plain").gpus(4), linked)
    d = run(s, gpus(2), "topology")
    assert chosen(d) == ("x", (1, 3))  # NVLink beats the same NUMA node (0, 1)
    # 100 x affinity 3 / best possible 3, plus binpack's used fraction / 1000: (3 x 2/4 + 1/64 + 1/256) / 5
    assert d.explanation.top[0][1] == pytest.approx(100.0 + 100.0 * (3 * 0.5 + 1 / 64 + 1 / 256) / 5 / 1000)
    # Any policy's whole-GPU choice uses a node's known topology.
    s2 = cluster(node("x").gpus(4, numa=[0, 1, 0, 1]))
    assert chosen(run(s2, gpus(2), "binpack")) == ("x", (0, 2))
    # Without topology: the lowest-index free GPUs.
    assert chosen(run(cluster(node("p").gpus(4)), gpus(2), "binpack")) == ("p", (0, 1))


def test_load_prefers_idle_gpus_and_the_load_term_lowers_busy_nodes() -> None:
    s = cluster(node("busy").gpus(2), node("idle").gpus(2))
    s.set_gpu_utilization(0, 0, 0.9)
    s.set_gpu_utilization(0, 1, 0.8)
    s.set_gpu_utilization(1, 0, 0.7)
    s.set_gpu_utilization(1, 1, 0.1)
    d = run(s, gpus(1, 200), "load")
    assert chosen(d) == ("idle", (1,))
    assert [n for n, _ in d.explanation.top] == ["idle", "busy"]
    assert [score for _, score in d.explanation.top] == pytest.approx([90.0, 20.0])
    assert chosen(run(s, gpus(1, 200), "binpack"))[0] == "busy"  # tie -> rank
    assert chosen(run(s, gpus(1, 200), "binpack", load_weight=0.5))[0] == "idle"


def test_per_request_policy_override() -> None:
    s = two_nodes()
    grant(s, gpus(1, 400, id="first"))
    req = Request(cpu_milli=1000, gpu_count=1, gpu_milli=500, policy="spread")
    assert chosen(run(s, req, "binpack"))[0] == "b"


def test_memory_share_fits_by_memory() -> None:
    s = cluster(node("a").gpus(2, memory_gib=16))
    first = grant(s, Request(gpu_count=1, gpu_memory_mib=10 * 1024, id="m1"))
    assert chosen(first) == ("a", (0,))
    second = grant(s, Request(gpu_count=1, gpu_memory_mib=6 * 1024, id="m2"))
    assert chosen(second) == ("a", (0,))  # best fit by memory: GPU 0 has exactly 6 GiB left
    d = run(s, gpus(2), "binpack")
    assert not d.placed
    assert d.explanation.rejected[0][1] == 1


def test_shares_with_an_owner_keep_to_gpus_of_that_owner() -> None:
    s = cluster(node("a").gpus(2), node("b").gpus(2))
    alice = grant(s, Request(cpu_milli=1000, gpu_count=1, gpu_milli=300, share_owner="alice", id="a1"))
    assert chosen(alice) == ("a", (0,))
    # bob's share may not join alice's GPU even though it fits best there: it opens GPU 1
    bob = grant(s, Request(cpu_milli=1000, gpu_count=1, gpu_milli=300, share_owner="bob", id="b1"))
    assert chosen(bob) == ("a", (1,))
    # alice again: back on her own GPU 0
    assert chosen(grant(s, Request(cpu_milli=1000, gpu_count=1, gpu_milli=300, share_owner="alice", id="a2")))[1] == (
        0,
    )
    # carol: node a's GPUs both hold other owners' shares, so node b
    assert chosen(run(s, Request(cpu_milli=1000, gpu_count=1, gpu_milli=100, share_owner="carol"), "binpack")) == (
        "b",
        (0,),
    )
    # shares without an owner are not restricted; once alice's shares are gone her GPU is anyone's
    assert chosen(run(s, Request(cpu_milli=1000, gpu_count=1, gpu_milli=100), "binpack"))[0] == "a"
    s.release("a1")
    s.release("a2")
    assert int(s.gpu_owner[0, 0]) == -1
    assert chosen(run(s, Request(cpu_milli=1000, gpu_count=1, gpu_milli=300, share_owner="carol"), "binpack")) == (
        "a",
        (0,),
    )
