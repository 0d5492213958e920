"""Online replay: real creation/deletion times, departures, a FIFO pending queue with backfill."""

from __future__ import annotations

import dataclasses
import heapq
import os
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from corral.model.errors import InvalidRequest
from corral.model.resources import GpuBehavior, Node, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.placement.reasons import UNRESOLVABLE_BITS
from corral.sim.online import OnlineResult, run_online
from corral.sim.openb import TracePod, load_nodes, load_pods, target_workload
from tests.builders import cpu_only, gpus, node

TRACES = Path(os.environ.get("CORRAL_TRACES", Path(__file__).resolve().parents[3] / "shared" / "traces" / "openb"))

CONFIG = PlacementConfig(policy="bestfit", gpu_behavior=GpuBehavior.UNRESTRICTED)


def pod(name: str, request: Request, created: int | None, deleted: int | None) -> TracePod:
    return TracePod(name, request, creation_time=created, deletion_time=deleted)


def gpu_node(name: str = "n1", count: int = 1, cores: float = 64) -> Node:
    return node(name).gpus(count).cpu(cores).build()


def delays_by_name(result: OnlineResult, pods: Sequence[TracePod]) -> dict[str, float]:
    """Delays keyed by pod name (the test pods are given in arrival order and all placed)."""
    assert result.placed == len(pods)
    return {p.name: float(d) for p, d in zip(pods, result.delays, strict=True)}


def test_a_pod_that_does_not_fit_waits_until_a_departure_frees_room() -> None:
    pods = [pod("a", gpus(1), 0, 10), pod("b", gpus(1), 2, 7)]  # b runs 5 s once it starts
    r = run_online([gpu_node()], pods, CONFIG)
    assert delays_by_name(r, pods) == {"a": 0.0, "b": 8.0}
    assert r.times.tolist() == [0.0, 2.0, 10.0, 15.0]
    assert r.allocated_milli.tolist() == [1000, 1000, 1000, 0]
    assert (r.rejected, r.never_placed, r.pods) == (0, 0, 2)


def test_backfill_a_later_pod_starts_when_an_earlier_one_still_does_not_fit() -> None:
    pods = [
        pod("long", gpus(1), 0, 100),
        pod("short", gpus(1), 0, 10),
        pod("big", gpus(2), 1, 6),  # needs both GPUs: waits for long and small
        pod("small", gpus(1), 2, 7),  # fits when short departs at 10, ahead of big
    ]
    r = run_online([gpu_node(count=2)], pods, CONFIG)
    assert delays_by_name(r, pods) == {"long": 0.0, "short": 0.0, "big": 99.0, "small": 8.0}
    assert r.summary()["delayed_pods"] == 2


def test_pods_of_one_shape_start_in_arrival_order() -> None:
    # Names sort against arrival order; equal creation times are broken by name ("a" before "b").
    pods = [pod("z", gpus(1), 0, 10), pod("y", gpus(1), 1, 11), pod("x", gpus(1), 2, 12)]
    pods += [pod("b", gpus(1), 3, 13), pod("a", gpus(1), 3, 8)]  # b runs 10 s, a 5 s
    r = run_online([gpu_node()], pods, CONFIG)
    # One at a time: z 0-10, y 10-20, x 20-30, a 30-35, b 35-45 (delays in arrival order z, y, x, a, b).
    assert r.delays.tolist() == [0.0, 9.0, 18.0, 27.0, 32.0]
    assert r.times.tolist() == [0.0, 1.0, 2.0, 3.0, 3.0, 10.0, 20.0, 30.0, 35.0, 45.0]


def test_departures_free_resources_before_arrivals_at_the_same_instant() -> None:
    pods = [pod("a", gpus(1), 0, 5), pod("b", gpus(1), 5, 8)]
    r = run_online([gpu_node()], pods, CONFIG)
    assert r.delays.tolist() == [0.0, 0.0]
    assert r.times.tolist() == [0.0, 5.0, 5.0, 8.0]
    assert r.allocated_milli.tolist() == [1000, 0, 1000, 0]


def test_pods_that_can_never_fit_are_rejected_not_queued() -> None:
    pods = [
        pod("too-many-gpus", gpus(4), 0, 10),  # the node has 2
        pod("too-much-cpu", cpu_only(cpu=128_000), 1, 10),  # the node has 64 cores
        pod("unknown-model", gpus(1, gpu_models=frozenset({"V100"})), 2, 10),
        pod("fits", gpus(2), 3, 10),
        pod("waits", gpus(1), 4, 10),
    ]
    r = run_online([gpu_node(count=2)], pods, CONFIG)
    assert (r.rejected, r.never_placed, r.placed) == (3, 0, 2)
    assert r.delays.tolist() == [0.0, 6.0]  # "waits" starts when "fits" departs at 10
    assert len(r.times) == 5 + 2


def test_a_pod_without_deletion_time_holds_its_resources_to_the_end() -> None:
    pods = [pod("forever", gpus(1), 0, None), pod("short", cpu_only(), 1, 3), pod("blocked", gpus(1), 2, 4)]
    r = run_online([gpu_node()], pods, CONFIG)
    assert (r.placed, r.never_placed, r.rejected) == (2, 1, 0)
    assert r.allocated_milli.tolist()[-1] == 1000
    assert r.summary()["never_placed"] == 1


def test_time_weighted_mean_and_peak_of_allocation() -> None:
    # 4 GPUs: 2 held over [0, 10), 3 over [5, 10), 1 over [10, 20) -> (2*5 + 3*5 + 1*10) / 20 = 1.75 GPUs = 43.75 %.
    pods = [pod("a", gpus(2), 0, 10), pod("b", gpus(1), 5, 20)]
    r = run_online([gpu_node(count=4)], pods, CONFIG)
    assert r.capacity_milli == 4000
    assert r.allocated_milli.tolist() == [2000, 3000, 1000, 0]
    s = r.summary()
    assert s["alloc_mean_pct"] == pytest.approx(43.75)
    assert s["alloc_peak_pct"] == pytest.approx(75.0)
    # while work arrives ([0, 5]: the last arrival is at 5) 2 of 4 GPUs are held
    assert s["alloc_mean_arrivals_pct"] == pytest.approx(50.0)


def test_summary_delay_statistics() -> None:
    pods = [pod(f"p{i}", gpus(1), i, i + 10) for i in range(4)]  # each runs 10 s on one GPU: delays 0, 9, 18, 27
    r = run_online([gpu_node()], pods, CONFIG)
    s = r.summary()
    assert r.delays.tolist() == [0.0, 9.0, 18.0, 27.0]
    assert (s["pods"], s["placed"], s["rejected"], s["never_placed"], s["delayed_pods"]) == (4, 4, 0, 0, 3)
    assert s["delay_mean_s"] == pytest.approx(13.5)
    assert s["delay_p50_s"] == pytest.approx(13.5)
    assert s["delay_p90_s"] == pytest.approx(24.3)  # linear interpolation: 18 + 0.7 * 9
    assert s["delay_p99_s"] == pytest.approx(26.73)
    assert s["delay_max_s"] == 27.0
    assert s["wall_seconds"] >= 0


def test_an_empty_result_summarises_to_zeros() -> None:
    r = run_online([gpu_node()], [pod("never", gpus(2), 0, 1)], CONFIG)
    s = r.summary()
    assert (s["rejected"], s["placed"], s["delay_max_s"], s["alloc_peak_pct"]) == (1, 0, 0.0, 0.0)


def test_pods_without_times_are_refused_naming_the_pod() -> None:
    pods = [pod("with-times", gpus(1), 0, 5), TracePod("multigpu-pod-7", gpus(1), line=9)]
    with pytest.raises(InvalidRequest, match="online mode needs creation_time and deletion_time") as info:
        run_online([gpu_node()], pods, CONFIG)
    assert info.value.field == "multigpu-pod-7"
    assert "line 9" in info.value.message


def test_a_deletion_before_creation_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="before creation_time"):
        run_online([gpu_node()], [pod("p", gpus(1), 5, 4)], CONFIG)


def test_repeated_pod_names_get_distinct_allocation_ids() -> None:
    pods = [pod("same", gpus(1), 0, 5), pod("same", gpus(1), 1, 6), pod("same#2", gpus(1), 2, 3)]
    r = run_online([gpu_node(count=3)], pods, CONFIG)
    assert r.placed == 3
    assert r.allocated_milli.tolist() == [1000, 2000, 3000, 2000, 1000, 0]


def test_progress_reaches_the_number_of_events() -> None:
    calls: list[tuple[int, int]] = []
    pods = [pod(f"p{i}", gpus(1), i, i + 3) for i in range(5)] + [pod("no", gpus(9), 0, 1)]
    r = run_online([gpu_node()], pods, CONFIG, progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (len(r.times), len(r.times)) == (11, 11)


def test_restricted_cpu_work_starts_once_a_gpu_pod_takes_the_free_gpu_in_the_same_round() -> None:
    # restricted: work without GPUs is declined on nodes with a fully free GPU. c1 and c2 have one shape; c1 is
    # declined at 10 (both GPUs are free), then g takes them and c2 fits in the same round; c1 starts when c2 leaves.
    config = PlacementConfig(policy="bestfit", gpu_behavior=GpuBehavior.RESTRICTED)
    pods = [
        pod("hog", gpus(1, cpu=8000), 0, 10),  # all the CPU: everything else waits for it
        pod("c1", cpu_only(), 1, 100),
        pod("g", gpus(2), 2, 7),
        pod("c2", cpu_only(), 3, 5),
    ]
    r = run_online([gpu_node(count=2, cores=8)], pods, config)
    assert delays_by_name(r, pods) == {"hog": 0.0, "c1": 11.0, "g": 8.0, "c2": 7.0}


def test_restricted_work_declined_on_one_node_is_retried_when_another_node_frees_room() -> None:
    # c is declined on n1 at 5 (its GPU is free again), then g takes that GPU. At 10 a departure on n2 frees too
    # little for c there, but c now fits n1: a declined pod must be retried on every node, not only the freed one.
    config = PlacementConfig(policy="bestfit", gpu_behavior=GpuBehavior.RESTRICTED)
    nodes = [gpu_node("n1", count=1, cores=8), node("n2").cpu(4).build()]
    pods = [
        pod("hog1", gpus(1, cpu=8000), 0, 5),
        pod("hog2", cpu_only(cpu=3500), 0, 100),
        pod("small", cpu_only(cpu=500), 0, 10),
        pod("c", cpu_only(cpu=2000), 1, 51),
        pod("g", gpus(1), 2, 102),
    ]
    r = run_online(nodes, pods, config)
    assert delays_by_name(r, pods) == {"hog1": 0.0, "hog2": 0.0, "small": 0.0, "c": 9.0, "g": 3.0}


# ---------------------------------------------------------------- the shortcuts change nothing


def naive(nodes: Sequence[Node], pods: Sequence[TracePod], config: PlacementConfig, seed: int) -> OnlineResult:
    """The definition, without shortcuts: every departure retries every pending pod in arrival order."""
    snap = ClusterSnapshot(nodes)
    rng = np.random.default_rng(seed)
    order = sorted(pods, key=lambda p: (p.creation_time or 0, p.name))
    heap: list[tuple[int, int, str]] = []
    pending: list[int] = []
    delays: dict[int, float] = {}
    times: list[int] = []
    alloc: list[int] = []
    rejected = started = 0

    def attempt(k: int, now: int) -> bool | None:
        nonlocal started
        p = order[k]
        d = place(snap, p.request, config, rng)
        if d.allocation is None:
            return None if bool(np.all(d.node_reasons & UNRESOLVABLE_BITS)) else False
        snap.allocate(d.allocation)
        delays[k] = now - (p.creation_time or 0)
        if p.deletion_time is not None:
            heapq.heappush(heap, (now + p.deletion_time - (p.creation_time or 0), started, p.request.id))
        started += 1
        return True

    a = 0
    while a < len(order) or heap:
        if heap and (a >= len(order) or heap[0][0] <= (order[a].creation_time or 0)):
            now, _, rid = heapq.heappop(heap)
            snap.release(rid)
            pending = [k for k in pending if not attempt(k, now)]
        else:
            now = order[a].creation_time or 0
            outcome = attempt(a, now)
            if outcome is None:
                rejected += 1
            elif not outcome:
                pending.append(a)
            a += 1
        times.append(now)
        alloc.append(snap.gpu_allocated_milli)
    return OnlineResult(
        config.policy,
        np.array(times, dtype=np.float64),
        np.array(alloc, dtype=np.int64),
        snap.total_gpus * 1000,
        np.array([delays[k] for k in sorted(delays)], dtype=np.float64),
        rejected,
        len(pending),
        len(pods),
        0.0,
    )


def random_workload(rng: random.Random, n: int) -> list[TracePod]:
    pods = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.3:
            req = cpu_only(cpu=rng.choice([1000, 4000, 16_000]), mem=rng.choice([1024, 8192]))
        elif kind < 0.6:
            req = gpus(1, rng.choice([100, 250, 500, 700]), cpu=rng.choice([1000, 8000]))
        elif kind < 0.95:
            req = gpus(
                rng.choice([1, 2, 4]), cpu=rng.choice([1000, 8000]), gpu_models=rng.choice([None, frozenset({"B"})])
            )
        else:
            req = gpus(16)  # never fits
        created = rng.randrange(0, 200)
        pods.append(
            pod(
                f"p{i:03d}",
                dataclasses.replace(req, id=f"p{i:03d}"),
                created,
                created + rng.choice([0, 1, 5, 20, 60, 150]),
            )
        )
    return pods


@pytest.mark.parametrize(
    ("policy", "behavior", "seed"),
    [
        ("bestfit", GpuBehavior.UNRESTRICTED, 1),
        ("random", GpuBehavior.UNRESTRICTED, 2),
        ("fgd", GpuBehavior.UNRESTRICTED, 3),
        ("binpack", GpuBehavior.RESTRICTED, 4),
        ("spread", GpuBehavior.PREFERENTIAL, 5),
    ],
)
def test_matches_the_definition_without_shortcuts(policy: str, behavior: GpuBehavior, seed: int) -> None:
    nodes = [
        node("a").gpus(4, model="A").cpu(32).build(),
        node("b").gpus(2, model="B").cpu(16).build(),
        node("c").cpu(16).build(),
    ]
    pods = random_workload(random.Random(seed), 120)
    config = PlacementConfig(policy=policy, gpu_behavior=behavior)
    got = run_online(nodes, pods, config, seed=seed)
    want = naive(nodes, pods, config, seed)
    assert got.times.tolist() == want.times.tolist()
    assert got.allocated_milli.tolist() == want.allocated_milli.tolist()
    assert got.delays.tolist() == want.delays.tolist()
    assert (got.rejected, got.never_placed) == (want.rejected, want.never_placed)
    assert got.placed > 0 and int(np.count_nonzero(got.delays)) > 0  # the queue was exercised
    # Allocation stays within capacity, times never go back, and everything placed has left at the end.
    assert got.allocated_milli.max() <= got.capacity_milli
    assert (np.diff(got.times) >= 0).all()
    assert got.allocated_milli[-1] == 0 and got.never_placed == 0
    assert got.placed + got.rejected + got.never_placed == got.pods


# ---------------------------------------------------------------- the real trace

needs_trace = pytest.mark.skipif(
    not TRACES.is_dir() and not os.environ.get("CI"), reason=f"openb trace not found at {TRACES}"
)


@needs_trace
def test_default_pod_list_online() -> None:
    nodes = load_nodes(TRACES / "openb_node_list_gpu_node.csv")
    pods = load_pods(TRACES / "openb_pod_list_default.csv")
    config = PlacementConfig(policy="bestfit", gpu_behavior=GpuBehavior.UNRESTRICTED, workload=target_workload(pods))
    r = run_online(nodes, pods, config)
    # With its real times the list never loads the 6,212 GPUs much: no pod waits, so the allocation curve is the
    # demand of the pods alive at each instant (departures first), worked out here without the engine.
    sweep = sorted(
        [(p.creation_time or 0, 1, p.request.gpu_demand_milli) for p in pods]
        + [(p.deletion_time or 0, 0, -p.request.gpu_demand_milli) for p in pods]
    )
    assert r.times.tolist() == [float(t) for t, _, _ in sweep]
    # Departures at one instant may go in another order than here: compare after the last event of each instant.
    last = np.r_[np.diff(r.times) > 0, True]
    assert r.allocated_milli[last].tolist() == np.cumsum([d for _, _, d in sweep])[last].tolist()
    assert (r.placed, r.rejected, r.never_placed, r.capacity_milli) == (8152, 0, 0, 6_212_000)
    assert r.summary()["delayed_pods"] == 0
