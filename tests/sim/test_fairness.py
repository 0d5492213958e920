"""`corral sim fair`: FIFO blocks, backfill honours the head's reservation, fair share lets a light user ahead,
preemption frees exactly what is needed (and nothing when that would not help), the metrics add up, the report is
self-contained, and bad options are refused before any work."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from corral.cli.main import app
from corral.model.resources import GpuBehavior, Node, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.sim.fair.metrics import allocated_area, bucket, fairness, jain, summarize, waterfill
from corral.sim.fair.replay import POLICIES, FairResult, run_fair
from corral.sim.fair.report import write_report
from corral.sim.fair.workload import FairJob, make_jobs, offered_load
from corral.sim.openb import TracePod
from corral.tenancy.reservation import book, book_fast
from tests.builders import cpu_only, gpus, node
from tests.sim.test_online_outputs import forbid_work
from tests.sim.test_report import assert_self_contained, parse_page

CONFIG = PlacementConfig(policy="binpack", gpu_behavior=GpuBehavior.UNRESTRICTED)


def job(name: str, user: str, request: Request, arrival: int, duration: int, estimate: int | None = None) -> FairJob:
    """A job whose time limit is its real run time unless `estimate` is given."""
    return FairJob(name, user, _with_id(request, name), arrival, duration, duration if estimate is None else estimate)


def _with_id(request: Request, name: str) -> Request:
    return dataclasses.replace(request, id=name)


def gpu_nodes(count: int, per_node: int, model: str = "A100") -> list[Node]:
    return [node(f"n{i}").gpus(per_node, model=model).cpu(64).build() for i in range(count)]


def run(policy: str, nodes: Sequence[Node], jobs: Sequence[FairJob], **kw: Any) -> FairResult:
    return run_fair(nodes, jobs, policy, CONFIG, **kw)


def starts(r: FairResult) -> dict[str, float]:
    return {j.id: float(r.first_start[k]) for k, j in enumerate(r.jobs)}


# ------------------------------------------------------------------------------------------ FIFO and backfill


def big_head() -> list[FairJob]:
    return [
        job("a", "u1", gpus(1), 0, 100),  # holds one of the 4 GPUs until 100
        job("big", "u1", gpus(4), 1, 10),  # the head: needs all 4, so waits for a
        job("small", "u1", gpus(1), 2, 10),  # ends (2 + 10) long before big's reservation at 100
    ]


def test_fifo_blocks_behind_a_big_head_and_backfill_does_not() -> None:
    nodes = gpu_nodes(1, 4)
    fifo = starts(run("fifo", nodes, big_head()))
    assert fifo == {"a": 0.0, "big": 100.0, "small": 110.0}  # small waits although 3 GPUs are free
    for policy in ("fifo-backfill", "fair-backfill", "fair-backfill-preempt"):
        got = starts(run(policy, nodes, big_head()))
        assert got == {"a": 0.0, "big": 100.0, "small": 2.0}, policy  # small backfills; big is not delayed


def test_a_job_no_node_can_hold_is_rejected_at_arrival_and_blocks_nothing() -> None:
    nodes = gpu_nodes(2, 4)
    jobs = [job("huge", "u1", gpus(8), 0, 10), job("after", "u2", gpus(1), 1, 10)]
    for policy in POLICIES:
        r = run(policy, nodes, jobs)
        assert starts(r)["after"] == 1.0, policy  # even strict FIFO: the 8-GPU job never queued
        row = summarize(r)
        assert (row["rejected"], row["finished"], row["unfinished"]) == (1, 1, 0), policy


def test_backfill_does_not_delay_the_heads_reservation_under_a_stream_of_small_jobs() -> None:
    nodes = gpu_nodes(1, 4)
    jobs = [job(f"first{i}", "u1", gpus(1), i, 40) for i in range(4)]  # all 4 GPUs, ending at 40..43
    jobs.append(job("big", "u2", gpus(4), 5, 10))  # its reservation: 43, when the last of them ends
    # 1-GPU jobs every 2 s for 200 s, each 30 s: there is always one waiting for a GPU that frees up
    jobs += [job(f"s{t}", "u3", gpus(1), t, 30) for t in range(6, 206, 2)]
    for policy in ("fifo-backfill", "fair-backfill", "fair-backfill-preempt"):
        r = run(policy, nodes, jobs)
        assert starts(r)["big"] == 43.0, policy  # exactly when its reservation said
        assert not np.isnan(r.completion).any(), policy
    # over-asked time limits: the reservation is planned on them (first ones ask 80 s), the start is a bound
    asked = [job(j.id, j.user, j.request, j.arrival, j.duration, j.duration * 2) for j in jobs]
    r = run("fifo-backfill", nodes, asked)
    assert starts(r)["big"] <= 5 + 80.0


@pytest.mark.parametrize("seed", range(6))
def test_with_true_time_limits_no_head_starts_after_its_first_reservation(seed: int) -> None:
    rng = random.Random(seed)
    shapes = [gpus(1), gpus(1, 500), gpus(2), gpus(4), gpus(8)]
    jobs = [
        job(f"j{i:03d}", f"u{rng.randint(1, 4)}", rng.choice(shapes), rng.randint(0, 300), rng.randint(1, 90))
        for i in range(150)
    ]
    r = run("fifo-backfill", gpu_nodes(2, 8), jobs)
    heads = ~np.isnan(r.first_reservation)
    assert heads.sum() >= 5  # big jobs did wait at the head
    late = [(j.id, r.first_start[k], r.first_reservation[k]) for k, j in enumerate(r.jobs) if heads[k]]
    assert all(start <= reserved for _, start, reserved in late), [x for x in late if x[1] > x[2]]


def test_book_fast_books_what_book_books() -> None:
    rng = random.Random(7)
    for trial in range(30):
        nodes = gpu_nodes(rng.randint(1, 4), rng.choice([2, 4, 8]))
        sn = ClusterSnapshot(nodes)
        ends: dict[str, float] = {}
        for i in range(rng.randint(3, 30)):
            req = _with_id(gpus(rng.choice([1, 1, 2]), rng.choice([300, 1000])), f"r{i}")
            d = place(sn, req, CONFIG, np.random.default_rng(0))
            if d.allocation is not None:
                sn.allocate(d.allocation)
                ends[req.id] = float(rng.randint(1, 20))
        head = _with_id(gpus(rng.choice([2, 4, 8])), "head")
        slow = book(sn, head, ends, CONFIG)
        fast = book_fast(sn, head, ends, CONFIG)
        assert (slow is None) == (fast is None), trial
        if slow is not None and fast is not None:
            assert fast.start == slow.start, trial
            assert fast.reservation.allocation.node == slow.reservation.allocation.node, trial


# ------------------------------------------------------------------------------------------ fair share


def test_fair_share_lets_a_light_users_job_ahead_of_a_heavy_users_backlog() -> None:
    nodes = gpu_nodes(1, 1)
    jobs = [job(f"h{i}", "heavy", gpus(1), 0, 10) for i in range(10)]
    jobs.append(job("light", "light", gpus(1), 1, 10))
    assert starts(run("fifo-backfill", nodes, jobs))["light"] == 100.0  # behind the whole backlog
    fair = run("fair-backfill", nodes, jobs)
    assert starts(fair)["light"] == 10.0  # at the first GPU that frees up
    assert fairness(fair)[0] > fairness(run("fifo-backfill", nodes, jobs))[0]


# ------------------------------------------------------------------------------------------ preemption


def test_preemption_frees_exactly_what_the_preemptor_needs_and_the_cheapest() -> None:
    nodes = gpu_nodes(4, 2)  # 8 GPUs
    jobs = [job(f"h{i}", "heavy", gpus(1), i, 1000) for i in range(8)]  # heavy holds all 8
    jobs.append(job("light", "light", gpus(2), 10, 5))  # fair share 1/2 = 4 GPUs: light may take 2
    r = run("fair-backfill-preempt", nodes, jobs)
    s = starts(r)
    assert s["light"] == 10.0
    victims = {j.id for k, j in enumerate(r.jobs) if r.runs[k] == 2}
    assert victims == {"h6", "h7"}  # one node's two GPUs, the two that ran least (binpack filled n3 last)
    assert r.preemptions == 2
    lost = {j.id: r.lost_gpu_milli_s[k] for k, j in enumerate(r.jobs)}
    assert lost["h6"] == 4 * 1000 and lost["h7"] == 3 * 1000  # GPU milli x seconds thrown away
    assert sum(lost.values()) == 7000
    assert summarize(r)["wasted_gpu_h"] == pytest.approx(7 / 3600)
    # they restart from scratch once light is done: end = 15 + 1000
    assert {r.completion[k] for k, j in enumerate(r.jobs) if j.id in victims} == {1015.0}
    # without preemption light waits for heavy's jobs to end
    assert starts(run("fair-backfill", nodes, jobs))["light"] == 1001.0  # h0 and h1 free n0 at 1000, 1001


def test_preemption_on_one_node_takes_the_job_that_ran_least_and_no_more() -> None:
    nodes = gpu_nodes(1, 4)
    jobs = [job(f"h{i}", "heavy", gpus(1), t, 1000) for i, t in enumerate((3, 0, 2, 1))]  # h0 started last
    jobs.append(job("light", "light", gpus(1), 10, 5))
    r = run("fair-backfill-preempt", nodes, jobs)
    assert starts(r)["light"] == 10.0
    assert {j.id: int(r.runs[k]) for k, j in enumerate(r.jobs)} == {"h0": 2, "h1": 1, "h2": 1, "h3": 1, "light": 1}
    assert float(r.lost_gpu_milli_s.sum()) == (10 - 3) * 1000


def test_no_preemption_when_the_preemptor_would_still_not_fit() -> None:
    nodes = [node("a").gpus(2, model="A100").build(), node("b").gpus(2, model="A100").build()]
    nodes.append(node("c").gpus(8, model="T4").build())
    a100, t4 = frozenset({"A100"}), frozenset({"T4"})
    jobs = [
        job("h-a", "heavy", gpus(1, gpu_models=a100), 0, 1000),  # binpack: a's GPU 0
        job("o1", "o1", gpus(1, gpu_models=a100), 1, 1000),  # a's GPU 1
        job("h-b", "heavy", gpus(1, gpu_models=a100), 2, 1000),  # b's GPU 0
        job("o2", "o2", gpus(1, gpu_models=a100), 3, 1000),  # b's GPU 1
        job("h-t4", "heavy", gpus(4, gpu_models=t4), 4, 1000),  # heavy: 6 of 12 GPUs, above 1/4
        job("light", "light", gpus(2, gpu_models=a100), 10, 5),  # 2 A100 on one node: needs o1's or o2's GPU
    ]
    r = run("fair-backfill-preempt", nodes, jobs)
    assert r.preemptions == 0  # preempting all of heavy's jobs would still leave one A100 per node
    assert starts(r)["light"] == 1001.0  # when node a's two jobs have ended
    assert summarize(r)["wasted_gpu_h"] == 0.0
    # the same, but o1's job is heavy's: now emptying node a of heavy's jobs lets light start, and it does
    mine = [job(j.id, "heavy" if j.id == "o1" else j.user, j.request, j.arrival, j.duration) for j in jobs]
    r = run("fair-backfill-preempt", nodes, mine)
    assert (r.preemptions, starts(r)["light"]) == (2, 10.0)


# ------------------------------------------------------------------------------------------ metrics


def test_jain_and_waterfill_on_hand_computed_cases() -> None:
    assert jain([1.0, 1.0, 1.0, 1.0]) == 1.0
    assert jain([1.0, 0.0, 0.0, 0.0]) == 0.25
    assert jain([1.0, 2.0]) == pytest.approx(9 / 10)  # (1+2)^2 / (2 (1+4))
    assert math.isnan(jain([]))
    assert waterfill(np.array([0.1, 0.5, 0.5]), 0.7).tolist() == pytest.approx([0.1, 0.3, 0.3])
    assert waterfill(np.array([0.1, 0.2]), 0.9).tolist() == pytest.approx([0.1, 0.2])  # all demand met
    assert waterfill(np.array([0.6, 0.6, 0.0]), 0.6).tolist() == pytest.approx([0.3, 0.3, 0.0])


def test_fairness_of_a_hand_computed_replay() -> None:
    # one GPU; heavy's two 10 s jobs at 0, light's one 10 s job at 0. FIFO (by name within an instant:
    # h0, h1, l): heavy holds the GPU 0-20, light 20-30; queue non-empty until 20, so the window is [0, 20].
    nodes = gpu_nodes(1, 1)
    jobs = [job("h0", "heavy", gpus(1), 0, 10), job("h1", "heavy", gpus(1), 0, 10), job("l", "light", gpus(1), 0, 10)]
    r = run("fifo", nodes, jobs)
    # each instant both demand > 1/2 of the 1 allocated: entitlement 1/2 each. heavy got 1 x 20, light 0.
    index, x = fairness(r)
    users = list(r.users)
    assert x[users.index("heavy")] == pytest.approx(2.0) and x[users.index("light")] == pytest.approx(0.0)
    assert index == pytest.approx(0.5)
    fair = run("fair-backfill", nodes, jobs)  # h0 0-10, then light (no usage yet) 10-20, then h1
    assert starts(fair)["l"] == 10.0
    assert fairness(fair)[0] == pytest.approx(1.0)


def random_jobs(seed: int, n: int = 120) -> list[FairJob]:
    rng = random.Random(seed)
    shapes = [gpus(1), gpus(1, 500), gpus(2), gpus(4), cpu_only(4000), gpus(8)]
    out = []
    for i in range(n):
        d = rng.randint(0, 60)
        out.append(job(f"j{i:03d}", f"u{min(rng.randint(1, 8), rng.randint(1, 8))}", rng.choice(shapes),
                       rng.randint(0, 200), d, d + rng.randint(0, 30)))  # fmt: skip
    return out


@pytest.mark.parametrize("policy", POLICIES)
def test_per_job_gpu_time_is_the_area_under_the_allocation_curve(policy: str) -> None:
    nodes = gpu_nodes(2, 8)
    r = run(policy, nodes, random_jobs(3), round_s=5.0 if policy.startswith("fair") else 0.0)
    assert not np.isnan(r.completion).any()
    assert float(r.used_gpu_milli_s.sum()) == pytest.approx(allocated_area(r))
    useful = sum(j.request.gpu_demand_milli * j.duration for j in r.jobs)
    assert float(r.used_gpu_milli_s.sum() - r.lost_gpu_milli_s.sum()) == pytest.approx(useful)
    assert int(r.allocated_milli.max()) <= r.capacity_milli
    row = summarize(r)
    assert row["finished"] == len(r.jobs) and row["unfinished"] == 0
    assert row["preemptions"] == r.preemptions == int((r.runs - 1).sum())


def test_buckets_and_offered_load() -> None:
    assert [bucket(r) for r in (cpu_only(), gpus(1, 300), gpus(1), gpus(2), gpus(4), gpus(8))] == [
        "cpu", "<1 GPU", "1 GPU", "2-4 GPUs", "2-4 GPUs", "8 GPUs",
    ]  # fmt: skip
    jobs = [job("a", "u", gpus(2), 0, 50), job("b", "u", gpus(1), 100, 10)]
    # a: 2 GPUs x 50 s; b arrives last: none of its run falls in the window [0, 100]. 4 GPUs x 100 s.
    assert offered_load(jobs, 4000) == pytest.approx(100 / 400)


def test_users_are_drawn_heavy_tailed_and_seeded() -> None:
    pods = [TracePod(f"p{i}", gpus(1), creation_time=i, deletion_time=i + 10) for i in range(2000)]
    jobs = make_jobs(pods, users=50, zipf=1.1, overestimate=3.0, seed=1)
    assert [j.user for j in jobs] == [j.user for j in make_jobs(pods, 50, 1.1, 3.0, seed=1)]
    counts = sorted((sum(j.user == u for j in jobs) for u in {j.user for j in jobs}), reverse=True)
    assert sum(counts[:5]) > 0.4 * len(jobs)  # a few users submit most pods
    assert all(j.duration <= j.estimate <= 3 * j.duration for j in jobs)


# ------------------------------------------------------------------------------------------ report and CLI


def test_report_is_self_contained_and_its_table_matches(tmp_path: Path) -> None:
    nodes = gpu_nodes(2, 4)
    jobs = random_jobs(5, 60)
    results = {p: run(p, nodes, jobs) for p in POLICIES}
    rows = write_report(tmp_path, results, {"seed": 5, "evil": "<script>x</script>"}, "fair <test>")
    page = assert_self_contained(tmp_path / "fairness.html", images=3)
    assert "<script>" not in (tmp_path / "fairness.html").read_text()
    table_rows = [r for r in page.rows if r and r[0] in POLICIES]
    assert [r[0] for r in table_rows] == list(POLICIES)
    with (tmp_path / "fairness.csv").open() as fh:
        got = list(csv.DictReader(fh))
    assert [g["policy"] for g in got] == list(POLICIES)
    assert [float(g["preemptions"]) for g in got] == [r["preemptions"] for r in rows]
    doc = json.loads((tmp_path / "fairness.json").read_text())
    assert doc["table"][0]["policy"] == "fifo" and set(doc["user_service"]) == set(POLICIES)
    with (tmp_path / "jobs.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == len(POLICIES) * len(jobs)
    assert parse_page(tmp_path / "fairness.html").rows


NODES = "sn,cpu_milli,memory_mib,gpu,model\nnode-0,32000,131072,4,T4\nnode-1,32000,131072,4,T4\n"
HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES)
    shapes = [(1, 1000), (1, 500), (4, 1000), (2, 1000), (0, 0)]
    rows = []
    for i in range(40):
        k, milli = shapes[i % len(shapes)]
        rows.append(f"pod-{i:02d},2000,4096,{k},{milli},,LS,Running,{i * 20},{i * 20 + 30 + 7 * (i % 9)},{i * 20}\n")
    pods = tmp_path / "pods.csv"
    pods.write_text(HEADER + "".join(rows))
    return nodes, pods


def sim(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["sim", *args])
    return result.exit_code, " ".join(result.output.split())


def test_cli_writes_the_report(trace: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = trace
    out = tmp_path / "out"
    code, text = sim("fair", "--nodes", str(nodes), "--pods", str(pods), "--out", str(out), "--users", "5",
                     "--time-compression", "4", "--round", "0", "--placement", "binpack")  # fmt: skip
    assert code == 0, text
    assert "| fifo |" in text and "| fair-backfill-preempt |" in text
    for name in ("fairness.html", "fairness.csv", "fairness.json", "fairness.md", "jobs.csv"):
        assert (out / name).is_file(), name
    settings = json.loads((out / "fairness.json").read_text())["settings"]
    assert settings["placement"] == "binpack" and settings["round every (s)"] == 0.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "fifo,lifo"], "--policies: unknown queue policy 'lifo'; known: fifo, fifo-backfill"),
        (["--policies", "fifo,fifo"], "--policies: names a policy twice"),
        (["--placement", "nope"], "nope"),
        (["--users", "0"], "--users: must be 1 or more, got 0"),
        (["--zipf", "-1"], "--zipf: must be a finite exponent >= 0"),
        (["--overestimate", "0.5"], "--overestimate: must be >= 1"),
        (["--half-life", "0"], "--half-life: must be a positive number of seconds, got 0.0"),
        (["--round", "-5"], "--round: must be 0 (a round after every event) or a positive number of s"),
        (["--time-compression", "0"], "--time-compression: must be a positive factor"),
        (["--limit", "-1"], "--limit: must be 0 (all pods) or more, got -1"),
        (["--node-stride", "0"], "--node-stride: must be 1 (every node) or more, got 0"),
        (["--seed", "-1"], "--seed: must be 0 or more, got -1"),
        (["--out", "{file}"], "exists and is not a folder"),
    ],
)
def test_invalid_fair_options_fail_before_any_work(
    trace: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    forbid_work(monkeypatch, "progress_bar", "load_inputs")
    nodes, pods = trace
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    args = [a.replace("{file}", str(a_file)) for a in args]
    out = ["--out", str(tmp_path / "o")] if "--out" not in args else []
    code, text = sim("fair", "--nodes", str(nodes), "--pods", str(pods), *out, *args)
    assert code == 2 and message in text, text
    assert not (tmp_path / "o").exists()


def test_pods_without_times_are_refused_with_their_line(tmp_path: Path) -> None:
    nodes = tmp_path / "n.csv"
    nodes.write_text(NODES)
    pods = tmp_path / "p.csv"
    pods.write_text(HEADER + "a,1000,1024,1,1000,,LS,Running,0,10,0\nb,1000,1024,1,1000,,LS,Running,5,,5\n")
    code, text = sim("fair", "--nodes", str(nodes), "--pods", str(pods), "--out", str(tmp_path / "o"))
    assert code == 2 and "b: a fairness replay needs creation_time and deletion_time (line 3)" in text, text
