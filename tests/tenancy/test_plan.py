"""plan_round over tenancy's own records, as a batch scheduler (the k8s scheduler next) calls it: gangs all or none
across nodes, the quota gate counting a gang whole, preemption on a cluster choosing the node with the fewest
victims, the necessary fit test never refusing what the engine places, and the package's purity."""

from __future__ import annotations

import ast
import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.model.resources import GpuBehavior, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.tenancy import ClusterView, RoundConfig, Running, Work, plan_round
from corral.tenancy.config import parse_queues
from corral.tenancy.preemption import Rules, candidates, choose, protected
from corral.tenancy.round import may_fit
from tests.builders import cluster, gpus, node

CONFIG = PlacementConfig(policy="binpack", gpu_behavior=GpuBehavior.UNRESTRICTED)
NOW = 1000.0


def work(wid: str, request: Request, **kw: object) -> Work:
    return Work(wid, dataclasses.replace(request, id=wid), **kw)  # type: ignore[arg-type]


def two_nodes(per_node: int = 2) -> ClusterSnapshot:
    return cluster(node("a").gpus(per_node).cpu(32), node("b").gpus(per_node).cpu(32))


def run_on(s: ClusterSnapshot, rid: str, request: Request, started: float, **kw: object) -> Running:
    """A running record, its grant allocated on `s`."""
    d = place(s, dataclasses.replace(request, id=rid), CONFIG, np.random.default_rng(0))
    assert d.allocation is not None
    s.allocate(d.allocation)
    return Running(rid, request, started, d.allocation.gpus, **kw)  # type: ignore[arg-type]


def test_a_gang_across_nodes_starts_whole_or_not_at_all() -> None:
    pods = [work(f"p{i}", gpus(1), gang="pg", gang_size=3, submitted_at=i) for i in range(3)]
    plan = plan_round(RoundConfig(CONFIG), pods, [], ClusterView(two_nodes()), None, NOW)
    assert sorted(s.job_id for s in plan.starts) == ["p0", "p1", "p2"]
    assert len({s.allocation.node for s in plan.starts}) == 2  # members are separate pods: any node
    five = [work(f"p{i}", gpus(1), gang="pg", gang_size=5, submitted_at=i) for i in range(5)]
    plan = plan_round(RoundConfig(CONFIG), five, [], ClusterView(two_nodes()), None, NOW)
    assert plan.starts == ()  # 4 GPUs for 5 members: none bound
    assert plan.reasons["p0"].startswith("gang: 4 of 5 instances fit")
    partial = plan_round(RoundConfig(CONFIG), five[:4], [], ClusterView(two_nodes()), None, NOW)
    assert partial.starts == () and partial.reasons["p3"] == (
        "gang: 4 of 5 instances queued; they start together once all are"
    )


def test_the_quota_gate_counts_a_gang_whole() -> None:
    queues = parse_queues("[queues.team]\nlimit = { gpus = 2 }\n", "q.toml")
    pods = [work(f"p{i}", gpus(1), queue="team", gang="pg", gang_size=3) for i in range(3)]
    plan = plan_round(RoundConfig(CONFIG, queues), pods, [], ClusterView(two_nodes()), None, NOW)
    assert plan.starts == ()
    assert "queue 'team' is at its limit of 2 GPUs" in plan.reasons["p0"]


def test_preemption_on_a_cluster_takes_the_node_with_the_fewest_victims() -> None:
    s = two_nodes()
    running = [
        run_on(s, "a1", gpus(1), 0.0),  # node a: two 1-GPU jobs
        run_on(s, "a2", gpus(1), 10.0),
        run_on(s, "b1", gpus(2), 20.0),  # node b: one 2-GPU job, the most GPU time of any
    ]
    assert {s.allocations[r.id].node for r in running} == {"a", "b"}
    head = work("hi", gpus(2, priority=5))
    plan = plan_round(RoundConfig(CONFIG), [head], running, ClusterView(s), None, NOW)
    [p] = plan.preemptions
    assert (p.preemptor, p.victims) == ("hi", ("b1",))  # one victim beats two cheaper ones
    assert p.allocation.node == "b" and p.why == {"b1": "priority"}


def test_the_search_places_no_set_that_could_not_make_room() -> None:
    """Ten nodes each hold one low-priority 1-GPU job beside three GPUs of higher priority; one node holds four
    low-priority 1-GPU jobs. The fewest-victims-first order would try the ten first, each a placement that cannot
    fit a 4-GPU preemptor, until the budget ran out; they are not tried, and the four jobs are found at once."""
    s = cluster(*(node(f"n{i:02d}").gpus(4).cpu(64) for i in range(11)))
    running = []
    for i in range(10):
        running.append(run_on(s, f"low{i}", gpus(1), float(i)))
        running.append(run_on(s, f"high{i}", gpus(3, priority=9), 0.0))
    running += [run_on(s, f"four{k}", gpus(1), 100.0 + k) for k in range(4)]
    assert {s.allocations[f"four{k}"].node for k in range(4)} == {"n10"}
    choice = choose(s, work("hi", gpus(4, priority=5)), running, CONFIG, NOW, budget=8)
    assert choice is not None
    assert sorted(v.job.id for v in choice.victims) == ["four0", "four1", "four2", "four3"]
    assert choice.allocation.node == "n10"
    assert choice.placements <= 4  # every candidate gone, none gone, the one set of four (the rest not placed)


def test_a_victim_in_its_minimum_runtime_is_named_with_the_time_it_may_go() -> None:
    queues = parse_queues('min_runtime = "10m"\n[queues.default]\n', "q.toml")
    s = cluster(node("a").gpus(1).cpu(32))
    running = [run_on(s, "old", gpus(1), NOW - 60)]
    plan = plan_round(
        RoundConfig(CONFIG, queues), [work("hi", gpus(1, priority=5))], running, ClusterView(s), None, NOW
    )
    assert plan.preemptions == ()
    assert "it may preempt job old from" in plan.reasons["hi"] and "minimum runtime of 10m" in plan.reasons["hi"]


@settings(max_examples=120, deadline=None)
@given(
    held=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 60), st.sampled_from([0, 250, 500, 1000])), max_size=10),
    count=st.integers(0, 4),
    milli=st.sampled_from([0, 250, 500, 1000]),
    gpu_mib=st.sampled_from([0, 4096, 20480, 40960]),
    min_mib=st.sampled_from([0, 40960, 81920]),
    cpu=st.integers(1, 64),
)
def test_may_fit_never_refuses_what_the_engine_places(
    held: list[tuple[int, int, int]], count: int, milli: int, gpu_mib: int, min_mib: int, cpu: int
) -> None:
    """may_fit (the prefilter, and what decides whether a job is placed beside a reservation first) is a necessary
    condition: nothing it refuses is placed by the engine: whole GPUs, shares by milli and by memory (the books
    holding whole GPUs and shares of both kinds), a minimum GPU memory."""
    s = cluster(*(node(f"n{i}").gpus(4, memory_gib=40 if i % 2 else 80).cpu(64) for i in range(4)))
    for k, (g, c, m) in enumerate(held):
        r = gpus(g, cpu=c * 1000) if m == 1000 else gpus(1, milli=m, cpu=c * 1000, gpu_memory_mib=8192)
        d = place(s, dataclasses.replace(r, id=f"h{k}"), CONFIG, np.random.default_rng(0))
        if d.allocation is not None:
            s.allocate(d.allocation)
    share = count and milli < 1000
    if count and not milli and not gpu_mib:
        return  # (not a request: a GPU asked for with neither compute nor memory)
    request = Request(id="x", cpu_milli=cpu * 1000, memory_mib=1024, gpu_count=count,
                      gpu_milli=milli if count else 0, gpu_memory_mib=gpu_mib if share else 0,
                      min_gpu_memory_mib=min_mib if count else 0)  # fmt: skip
    placed = place(s, request, CONFIG, np.random.default_rng(0)).placed
    assert may_fit(s, request) or not placed


def test_the_package_imports_no_face_no_clock_and_no_io() -> None:
    root = Path(__file__).resolve().parents[2] / "corral" / "tenancy"
    allowed = ("corral.tenancy", "corral.model", "corral.placement", "__future__", "bisect", "collections",
               "dataclasses", "typing", "itertools", "math", "heapq", "numpy", "operator", "re", "tomllib",
               "time")  # fmt: skip
    for path in sorted(root.glob("*.py")):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert [m for m in names if not m.startswith(allowed)] == [], path.name
        calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
        assert not calls & {"time", "monotonic", "now", "sleep", "open", "read_text", "Thread"}, path.name


@pytest.mark.parametrize("seed", range(6))
def test_the_time_a_protected_preemption_helps_is_the_scans_and_names_one_nodes_pods(seed: int) -> None:
    """Every borrower is within its minimum runtime: `protected` says when preemption first helps. On a cluster it
    looks node by node; the time must be the one a scan of all the candidates in the order they come out finds
    (release the first k everywhere, place), and the pods it names lie on one node and make room there."""
    rng = np.random.default_rng(seed)
    s = cluster(*(node(f"n{i}").gpus(4).cpu(64) for i in range(6)))
    running = [
        run_on(s, f"j{k}", gpus(int(rng.choice([1, 1, 2]))), NOW - float(rng.integers(0, 250))) for k in range(9)
    ]
    while s.gpu_full_free.sum():  # the rest held by jobs of a higher priority than the head's: never victims
        running.append(run_on(s, f"hp{len(running)}", gpus(1, priority=9), NOW - 1000.0))
    assert place(s, gpus(4, id="hi", priority=5), CONFIG, np.random.default_rng(0)).allocation is None
    rules = Rules(min_runtime=lambda job: 300.0)
    head = work("hi", gpus(4, priority=5))
    got = protected(s, head, running, CONFIG, NOW, rules)
    # the scan, as protected did it before it went node by node
    victims = sorted((v for v in candidates(s, head, running, NOW, rules)), key=lambda v: v.free_from)
    want = None
    for k in range(1, len(victims) + 1):
        left = s.copy()
        left.release_many([v.job.id for v in victims[:k]])
        if place(left, head.placing, CONFIG, np.random.default_rng(0)).allocation is not None:
            want = victims[k - 1].free_from
            break
    assert (got is None) == (want is None)
    if got is not None:
        assert got.at == want
        assert len({s.allocations[j].node for j in got.job_ids}) == 1
        left = s.copy()
        left.release_many(list(got.job_ids))
        assert place(left, head.placing, CONFIG, np.random.default_rng(0)).allocation is not None


@pytest.mark.parametrize("seed", range(8))
def test_the_search_finds_the_cheapest_set_it_could(seed: int) -> None:
    """On a small full cluster, with a budget that lets it look everywhere, the victims `choose` picks cost what the
    cheapest set that makes room costs (fewest jobs, then least GPU time, then least time), found by trying every
    set of victims on every node: sets it skips without a placement (could not make room, could not be cheaper)
    never hide a cheaper one."""
    rng = np.random.default_rng(100 + seed)
    s = cluster(*(node(f"n{i}").gpus(4).cpu(64) for i in range(4)))
    running: list[Running] = []
    while s.gpu_full_free.sum():
        size = int(rng.choice([1, 1, 2]))
        prio = int(rng.choice([0, 0, 9]))  # some of a higher priority than the preemptor's: never victims
        if size > int(s.gpu_full_free.max()):
            size = 1
        running.append(run_on(s, f"j{len(running)}", gpus(size, priority=prio), NOW - float(rng.integers(400, 4000))))
    head = work("hi", gpus(int(rng.choice([2, 3, 4])), priority=5))
    rules = Rules()
    choice = choose(s, head, running, CONFIG, NOW, rules, budget=10**6)
    found = candidates(s, head, running, NOW, rules)
    best = None
    for i in range(len(s)):
        mine = sorted((v for v in found if s.allocations[v.job.id].node_index == i),
                      key=lambda v: (v.gpu_seconds, v.seconds))  # fmt: skip
        for k in range(1, len(mine) + 1):
            for chosen in itertools.combinations(mine, k):
                left = s.copy()
                left.release_many([v.job.id for v in chosen])
                if place(left, head.placing, CONFIG, np.random.default_rng(0)).allocation is not None:
                    price = (k, sum(v.gpu_seconds for v in chosen), sum(v.seconds for v in chosen))
                    best = price if best is None or price < best else best
    assert (choice is None) == (best is None)
    if choice is not None and best is not None:
        got = (len(choice.victims), sum(v.gpu_seconds for v in choice.victims), sum(v.seconds for v in choice.victims))
        assert got[0] == best[0] and got[1:] == pytest.approx(best[1:])
