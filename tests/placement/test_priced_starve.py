"""fgd-priced keeps the few hosts of its largest pods (issue 16: `corral sim fair` starved the 8-GPU jobs).

A cluster where only a handful of nodes can take the workload's 8-GPU, 120-core pods: the reserve's expectation
(ceil(1.5 x H x p), under one pod on the empty cluster) keeps one host, and fgd-scarcity's look-ahead likes those
CPU-rich nodes for 1-GPU pods, which in a running cluster may hold them for months.
"""

from __future__ import annotations

import numpy as np

from corral.model.resources import MILLI_PER_GPU, Allocation, GpuGrant, Node
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.placement.reserve import kept_hosts
from corral.placement.scarce_hosts import SCARCE_HOSTS, scarce_hosts
from corral.placement.workload import TargetType, TargetWorkload
from corral.sim.fair.replay import run_fair
from corral.sim.fair.workload import FairJob
from tests.builders import cpu_only, gpus, node

BIG = TargetType(120_000, MILLI_PER_GPU, 8, None, 0.001)  # rare: under one pod to come on the empty cluster


def workload(big: float = BIG.probability) -> TargetWorkload:
    typical = (TargetType(16_000, MILLI_PER_GPU, 1, None, 0.5), TargetType(12_000, MILLI_PER_GPU, 1, None, 0.5))
    return TargetWorkload(typical, (TargetType(120_000, MILLI_PER_GPU, 8, None, big),))


def nodes(big_hosts: int, others: int) -> list[Node]:
    """`big_hosts` nodes of 8 GPUs and 128 cores (hosts of BIG), `others` of 8 GPUs and 96 cores (not)."""
    return [node(f"g3-{i}").gpus(8).cpu(128).mem(1024).build() for i in range(big_hosts)] + [
        node(f"g2-{i}").gpus(8).cpu(96).mem(1024).build() for i in range(others)
    ]


def priced(w: TargetWorkload) -> PlacementConfig:
    return PlacementConfig(policy="fgd-priced", workload=w)


def everything(s: ClusterSnapshot) -> np.ndarray:
    return np.arange(len(s), dtype=np.int64)


def take_gpu(s: ClusterSnapshot, name: str, job: str) -> None:
    s.allocate(Allocation(job, name, s.node_index(name), 8_000, 1024, (GpuGrant(0, MILLI_PER_GPU, 80 * 1024),)))


def test_the_few_hosts_of_the_largest_pods_are_all_kept_from_the_start() -> None:
    s = ClusterSnapshot(nodes(2, 20))
    small = gpus(1, cpu=16_000)
    # 176 GPUs free, one per pod: 176 x 0.001 x 1.5 = 0.26 pods of BIG to come, a reserve of 1 of the 2 hosts, yet
    # both are kept: two hosts are scarce (<= SCARCE_HOSTS and under a tenth of the 22 GPU nodes).
    assert scarce_hosts(s, workload(), (BIG,)).floors.tolist() == [2]
    assert kept_hosts(s, workload(), small, everything(s), True, 1.5).tolist() == [True, True] + [False] * 20
    # fgd-scarcity alone sends the 1-GPU pod to a CPU-rich host (it strands nothing there); fgd-priced does not.
    scarcity = place(s, small, PlacementConfig(policy="fgd-scarcity", workload=workload()), rng=0)
    assert scarcity.allocation is not None and scarcity.allocation.node.startswith("g3")
    d = place(s, small, priced(workload()), rng=0)
    assert d.allocation is not None and d.allocation.node.startswith("g2"), d.allocation
    assert "fgd-priced: 2 nodes kept free for multi-GPU pods came last" in d.explanation.notes
    big = place(s, gpus(8, cpu=120_000), priced(workload()), rng=0)
    assert big.allocation is not None and big.allocation.node.startswith("g3")


def test_a_broken_scarce_host_is_left_to_drain() -> None:
    s = ClusterSnapshot(nodes(2, 20))
    take_gpu(s, "g3-0", "long-1gpu")  # g3-0 can no longer take an 8-GPU pod until this one ends
    d = place(s, gpus(1, cpu=16_000), priced(workload()), rng=0)
    assert d.allocation is not None and d.allocation.node.startswith("g2"), d.allocation
    # Pods that fit nowhere else still land on the scarce hosts: nothing is held idle for a pod that may not come.
    for i in range(20):
        s.allocate(Allocation(f"cpu-{i}", f"g2-{i}", s.node_index(f"g2-{i}"), 90_000, 1024))
    d = place(s, gpus(1, cpu=16_000), priced(workload()), rng=0)
    assert d.allocation is not None and d.allocation.node.startswith("g3")


def test_nothing_is_kept_where_hosts_are_many_or_the_type_never_comes() -> None:
    small = gpus(1, cpu=16_000)
    # Hosts many in absolute terms: SCARCE_HOSTS + 1 of 105 nodes, a reserve of 1: the look-ahead may use them.
    s = ClusterSnapshot(nodes(SCARCE_HOSTS + 1, 100))
    assert not kept_hosts(s, workload(), small, everything(s), True, 1.5).any()
    # A large part of the cluster: 2 of 4 nodes (keeping them all would cost other pods half the cluster).
    s = ClusterSnapshot(nodes(2, 2))
    assert scarce_hosts(s, workload(), (BIG,)).floors.tolist() == [0]
    assert not kept_hosts(s, workload(), small, everything(s), True, 1.5).any()
    # A type of probability 0 is not kept for, the big pod itself is not kept off, nor is a pod that leaves a host
    # able to take one.
    s = ClusterSnapshot(nodes(2, 20))
    assert not kept_hosts(s, workload(0.0), small, everything(s), True, 1.5).any()
    assert not kept_hosts(s, workload(), gpus(8, cpu=120_000), everything(s), True, 1.5).any()
    assert not kept_hosts(s, workload(), cpu_only(4000), everything(s), True, 1.5).any()


def job(i: int, count: int, cpu: int, arrival: int, duration: int) -> FairJob:
    return FairJob(f"j{i}", "u1", gpus(count, cpu=cpu, id=f"j{i}"), arrival, duration, duration)


def test_sim_fair_starts_both_8_gpu_jobs_at_once_instead_of_one_after_the_other() -> None:
    """`corral sim fair` in small: two 1-GPU jobs that run 100 days arrive first, then two 8-GPU, 120-core jobs of
    14 hours. With a reserve of one host the first 1-GPU job takes one of the two hosts for 100 days and the second
    8-GPU job waits for the first to end."""
    cluster = nodes(2, 20)
    jobs = [job(0, 1, 16_000, 0, 8_640_000), job(1, 1, 12_000, 10, 8_640_000)]
    jobs += [job(2, 8, 120_000, 100, 50_000), job(3, 8, 120_000, 110, 50_000)]
    r = run_fair(cluster, jobs, "fifo-backfill", priced(workload()), round_s=30.0)
    waits = [r.first_start[k] - jobs[k].arrival for k in (2, 3)]
    assert max(waits) < 60, f"the 8-GPU jobs waited {waits} s"
    assert not np.isnan(r.completion).any()  # every job ran to the end
