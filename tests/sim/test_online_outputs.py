"""`corral sim run --online` writes events.csv and curves.csv that agree with its summary; invalid options are
refused before any work (no file read, no progress bar)."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import corral.cli.sim as sim_cli
from corral.cli.main import app
from corral.sim.online import CURVE_COLUMNS, EVENT_COLUMNS, OnlineEvent, run_online
from tests.builders import gpus
from tests.sim.test_online import CONFIG, gpu_node, pod
from tests.sim.test_report import assert_self_contained

runner = CliRunner()

NODES = "sn,cpu_milli,memory_mib,gpu,model\nnode-0,32000,131072,2,T4\nnode-1,32000,131072,2,T4\nnode-2,16000,65536,0,\n"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)


def trace_pods() -> str:
    """4 GPUs in all; more work than fits, so pods wait; one pod never fits, one is still waiting at the end."""
    shapes = [(4000, 1, 1000), (2000, 1, 500), (8000, 2, 1000), (1000, 0, 0), (2000, 1, 300)]
    rows = []
    for i in range(24):
        cpu, k, milli = shapes[i % len(shapes)]
        rows.append(f"pod-{i:02d},{cpu},4096,{k},{milli},,LS,Running,{i * 10},{i * 10 + 45},{i * 10}\n")
    rows.append("huge,4000,4096,8,1000,,LS,Running,5,50,5\n")  # 8 GPUs on no node: rejected at arrival
    rows.append("forever,1000,4096,2,1000,,LS,Running,300,,300\n")  # these two hold all 4 GPUs to the end,
    rows.append("forever2,1000,4096,2,1000,,LS,Running,301,,301\n")
    rows.append("tail,1000,4096,1,1000,,LS,Running,2000,2100,2000\n")  # so this one never starts
    return POD_HEADER + "".join(rows)


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES)
    pods = tmp_path / "pods.csv"
    pods.write_text(trace_pods())
    return nodes, pods


def forbid_work(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make `corral sim`'s named steps (e.g. its progress bar, its trace loading) fail the test if they run: an
    invalid option must be refused before any work."""

    def no_work(*_: object) -> Any:
        raise AssertionError("work started before the options were checked")

    for name in names:
        monkeypatch.setattr(sim_cli, name, no_work)


def sim(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["sim", *args])
    return result.exit_code, " ".join(result.output.split())


def by_policy(path: Path) -> dict[str, list[dict[str, str]]]:
    rows: dict[str, list[dict[str, str]]] = defaultdict(list)
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) in (EVENT_COLUMNS, CURVE_COLUMNS)
        for row in reader:
            rows[row["policy"]].append(row)
    return rows


def time_weighted_mean(curve: list[tuple[float, float]], end: float) -> float:
    span = end - curve[0][0]
    if span <= 0:
        return curve[-1][1]
    total = 0.0
    for (t, pct), (t_next, _) in zip(curve, [*curve[1:], (end, 0.0)], strict=True):
        total += pct * max(0.0, min(t_next, end) - min(t, end))
    return total / span


def test_online_run_writes_events_and_curves_that_agree_with_its_summary(
    trace: tuple[Path, Path], tmp_path: Path
) -> None:
    nodes, pods = trace
    out = tmp_path / "out"
    code, text = sim(
        "run", "--online", "--nodes", str(nodes), "--pods", str(pods), "--policy", "bestfit,spread",
        "--time-compression", "2", "--out", str(out),
    )  # fmt: skip
    assert code == 0, text
    assert {"events.csv", "curves.csv", "summary.json", "online.png", "online.html"} <= {p.name for p in out.iterdir()}
    assert_self_contained(out / "online.html", images=1)
    summaries: dict[str, dict[str, Any]] = json.loads((out / "summary.json").read_text())
    events = by_policy(out / "events.csv")
    curves = by_policy(out / "curves.csv")
    assert set(events) == set(curves) == set(summaries) == {"bestfit", "spread"}
    saw_waiting = False
    for policy, s in summaries.items():
        ev = events[policy]
        kinds: dict[str, list[dict[str, str]]] = defaultdict(list)
        for e in ev:
            kinds[e["event"]].append(e)
        assert set(kinds) <= {"arrival", "start", "end", "rejected", "unplaced"}
        assert len(kinds["arrival"]) == s["pods"] == 28
        assert len(kinds["start"]) == s["placed"]
        assert [e["pod"] for e in kinds["rejected"]] == ["huge"] and s["rejected"] == 1
        assert [e["pod"] for e in kinds["unplaced"]] == ["tail"] and s["never_placed"] == 1
        assert s["placed"] + s["rejected"] + s["never_placed"] == s["pods"]
        # every pod that started and has a deletion time ends, on the node and GPUs it started on
        starts = {e["pod"]: e for e in kinds["start"]}
        assert {e["pod"] for e in kinds["end"]} == set(starts) - {"forever", "forever2"}
        for e in kinds["end"]:
            assert (e["node"], e["gpus"], e["gpu_milli"]) == tuple(
                starts[e["pod"]][c] for c in ("node", "gpus", "gpu_milli")
            )
        waits = [float(e["wait_s"]) for e in kinds["start"]]
        assert sum(waits) / len(waits) == pytest.approx(s["delay_mean_s"])
        assert max(waits) == pytest.approx(s["delay_max_s"])
        assert sum(w > 0 for w in waits) == s["delayed_pods"]
        saw_waiting |= s["delayed_pods"] > 0
        times = [int(e["time_s"]) for e in ev]
        assert times == sorted(times)

        # curves.csv: the plotted step function; its mean and peak are the summary's, and it matches the events
        curve = [(float(r["time_s"]), float(r["allocated_pct"])) for r in curves[policy]]
        assert len(curve) == len(kinds["arrival"]) + len(kinds["end"])  # one point per arrival or departure
        assert max(p for _, p in curve) == pytest.approx(s["alloc_peak_pct"], abs=1e-3)
        assert time_weighted_mean(curve, curve[-1][0]) == pytest.approx(s["alloc_mean_pct"], abs=1e-3)
        held = 0
        replayed: dict[int, int] = {}
        for e in ev:
            held += {"start": 1, "end": -1}.get(e["event"], 0) * int(e["gpu_milli"])
            replayed[int(e["time_s"])] = held
        assert all(int(r["capacity_gpu_milli"]) == 4000 for r in curves[policy])
        assert {int(r["time_s"]): int(r["allocated_gpu_milli"]) for r in curves[policy]} == replayed
    assert saw_waiting  # the trace is busy enough that pods queue


def test_online_events_of_a_small_replay() -> None:
    pods = [pod("a", gpus(1), 0, 10), pod("b", gpus(1), 2, 7), pod("c", gpus(4), 3, 9)]
    r = run_online([gpu_node()], pods, CONFIG)
    assert list(r.events) == [
        OnlineEvent(0, "arrival", "a"),
        OnlineEvent(0, "start", "a", "n1", "0", 1000, 0),
        OnlineEvent(2, "arrival", "b"),
        OnlineEvent(3, "arrival", "c"),
        OnlineEvent(3, "rejected", "c"),
        OnlineEvent(10, "end", "a", "n1", "0", 1000),
        OnlineEvent(10, "start", "b", "n1", "0", 1000, 8),
        OnlineEvent(15, "end", "b", "n1", "0", 1000),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tune", "-1"], "--tune: must be a positive ratio of GPU capacity, got -1.0"),
        (["--tune", "nan"], "--tune: must be a positive ratio of GPU capacity, got nan"),
        (["--online", "--time-compression", "0"], "--time-compression: must be a positive factor"),
        (["--seed", "-1"], "--seed: must be 0 or more, got -1"),
        (["--online", "--order", "x.order"], "--order: an arrival order replays the offline study"),
        (["--out", "{file}"], "exists and is not a folder"),
    ],
)
def test_invalid_run_options_fail_before_any_work(
    trace: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    forbid_work(monkeypatch, "progress_bar", "load_inputs")
    nodes, pods = trace
    out = tmp_path / "o"
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    args = [a.replace("{file}", str(a_file)) for a in args]
    code, text = sim("run", "--nodes", str(nodes), "--pods", str(pods), "--out", str(out), *args)
    assert code == 2 and message in text, text
    assert not out.exists() and a_file.read_text() == "not a folder"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tune", "-1"], "--tune: must be a positive ratio of GPU capacity, got -1.0"),
        (["--jobs", "-2"], "--jobs: must be 0 (all cores) or more, got -2"),
        (["--seeds", "3,-1"], "--seeds: expected e.g. 42-51 or 42,43, got '3,-1'"),
    ],
)
def test_invalid_matrix_options_fail_before_any_work(
    trace: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    forbid_work(monkeypatch, "progress_bar")
    nodes, pods = trace
    code, text = sim("matrix", "--nodes", str(nodes), "--pods", str(pods), "--out", str(tmp_path / "m"), *args)
    assert code == 2 and message in text, text
