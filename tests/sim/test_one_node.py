"""benchmarks/one_node.py: the draw makes the offered load it promises, and what it reports is what `corral sim run
--online` reports for the same files (the benchmark measures the simulator, not a copy of it)."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks import one_node
from corral.cli.main import app

NODES = "sn,cpu_milli,memory_mib,gpu,model\nsmall,64000,262144,2,P100\nbig,96000,393216,8,G2\nother,96000,393216,8,T4\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time\n"


def source(n: int, seed: int = 0) -> str:
    """A pod list with every kind of pod: shares, 1, 2 and 8 whole GPUs, pods without GPUs, too big, no times."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        count, milli = rng.choice([(1, 1000), (1, 470), (1, 250), (1, 810), (2, 1000), (8, 1000), (0, 0)])
        cpu = rng.choice([4000, 8000, 12000, 200000 if i % 50 == 0 else 6000])
        start = rng.randrange(1000)
        end = "" if i % 40 == 1 else str(start + rng.choice([30, 600, 5000, 10**6]))
        rows.append(f"pod-{i:04d},{cpu},16384,{count},{milli},,LS,Running,{start},{end}\n")
    return POD_HEADER + "".join(rows)


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "openb_node_list_gpu_node.csv").write_text(NODES)
    (folder / "openb_pod_list_default.csv").write_text(source(600))
    return folder


def test_eligible_pods_fit_the_node_and_ask_for_shares_or_one_or_two_gpus(traces: Path) -> None:
    node = one_node.node_row(traces / "openb_node_list_gpu_node.csv", "G2")
    assert node["sn"] == "big"
    rows = one_node.eligible(traces / "openb_pod_list_default.csv", node)
    assert rows
    for r in rows:
        assert (r["num_gpu"], r["gpu_milli"]) in {
            ("1", "1000"),
            ("1", "470"),
            ("1", "250"),
            ("1", "810"),
            ("2", "1000"),
        }
        assert int(r["cpu_milli"]) <= 96000 and r["deletion_time"]


def test_draw_offers_the_load_it_is_asked_for(traces: Path) -> None:
    node = one_node.node_row(traces / "openb_node_list_gpu_node.csv", "G2")
    rows = one_node.eligible(traces / "openb_pod_list_default.csv", node) * 10  # enough pods for the mean to settle
    pods = one_node.draw(rows, 2000, 1.2, 3600, seed=5)
    assert len({p["name"] for p in pods}) == 2000
    arrivals = [int(p["creation_time"]) for p in pods]
    assert arrivals == sorted(arrivals)
    runtimes = [int(p["deletion_time"]) - int(p["creation_time"]) for p in pods]
    assert max(runtimes) == 3600  # the trace's 10**6 s runs are clipped at --max-runtime
    work = sum(int(p["num_gpu"]) * int(p["gpu_milli"]) * t for p, t in zip(pods, runtimes, strict=True))
    offered = work / (8000 * (arrivals[-1] - arrivals[0]))
    assert offered == pytest.approx(1.2, rel=0.1)
    assert one_node.draw(rows, 2000, 1.2, 3600, seed=5) == pods  # seeded


def test_the_table_is_what_corral_sim_online_reports(
    traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keep, table = tmp_path / "keep", tmp_path / "runs.csv"
    argv = ["--traces", str(traces), "--seeds", "3,4", "--pods", "60", "--load", "1.5", "--keep", str(keep)]
    assert one_node.main([*argv, "--policies", "binpack,spread,fgd-priced@default", "--csv", str(table)]) == 0
    printed = capsys.readouterr().out
    for label in ("binpack", "spread", "fgd-priced@default"):
        assert f"| {label} | 60 / 60 |" in printed
    runs = {(r["policy"], r["seed"]): r for r in csv.DictReader(table.open())}
    assert len(runs) == 6
    assert sum(int(runs[(p, s)]["delayed_pods"]) for p in ("binpack", "spread") for s in "34") > 0  # it contends
    out = tmp_path / "cli"
    r = CliRunner().invoke(
        app,
        ["sim", "run", "--online", "--nodes", str(keep / "node.csv"), "--pods", str(keep / "pods-4.csv"),
         "--policy", "binpack,spread", "--seed", "4", "--out", str(out)],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    for policy in ("binpack", "spread"):
        for key in ("placed", "delayed_pods", "delay_mean_s", "delay_max_s", "alloc_peak_pct"):
            assert float(runs[(policy, "4")][key]) == pytest.approx(summary[policy][key]), (policy, key)


def test_bad_flags_are_named(traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in (
        (["--policies", "tetris"], "unknown policy 'tetris'"),
        (["--policies", "fgd@tomorrow"], "the only suffix is @default"),
        (["--load", "0"], "--load: must be > 0, got 0"),
        (["--seeds", "x"], "argument --seeds: expected e.g. 42-51 or 42,43, got 'x'"),
    ):
        with pytest.raises(SystemExit):
            one_node.main(["--traces", str(traces), *argv])
        assert message in capsys.readouterr().err
