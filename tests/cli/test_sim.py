"""`corral sim run` and `corral sim matrix` on small traces: outputs, and errors that name file, line and column."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app
from corral.sim.experiment import study_arrivals
from corral.sim.openb import load_nodes, load_pods

runner = CliRunner()

# 86 GPUs, so one whole-GPU pod moves arrived demand by about 1 % and the columns near 100 % have events.
NODE_SPECS = [(2, "T4"), (4, "V100"), (0, "")] + [(8, "A100")] * 10
NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"node-{i:02d},64000,262144,{g},{m}\n" for i, (g, m) in enumerate(NODE_SPECS)
)
CAPACITY = 1000 * sum(g for g, _ in NODE_SPECS)
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)


def pods_csv(n: int = 60) -> str:
    shapes = [(4000, 1, 1000, ""), (2000, 1, 500, ""), (8000, 2, 1000, ""), (1000, 0, 0, ""), (2000, 1, 300, "T4")]
    rows = []
    for i in range(n):
        cpu, k, milli, spec = shapes[i % len(shapes)]
        rows.append(f"pod-{i:03d},{cpu},4096,{k},{milli},{spec},LS,Running,{i * 10},{i * 10 + 25},{i * 10}\n")
    return POD_HEADER + "".join(rows)


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES)
    pods = tmp_path / "pods.csv"
    pods.write_text(pods_csv())
    return nodes, pods


def sim(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["sim", *args])
    return result.exit_code, " ".join(result.output.split())


def test_run_writes_every_output(trace: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = trace
    out = tmp_path / "out"
    code, text = sim(
        "run", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd", "--seed", "3", "--out", str(out)
    )
    assert code == 0, text
    assert sorted(p.name for p in out.iterdir()) == [
        "allocation.png", "curves.csv", "events.csv", "fragmentation.png", "report.html", "summary.json",
    ]  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    for key in ("alloc_at_100", "alloc_at_130", "frag_at_100", "pods", "failed_pods", "wall_seconds"):
        assert key in summary
    # tuned to 1.3 x capacity: the pod list is extended with -tuned- copies
    events = list(csv.DictReader((out / "events.csv").open()))
    assert len(events) == summary["pods"] > 60
    assert any("-tuned-" in e["pod"] for e in events)
    # The study stops at the first draw whose *per-GPU* milli would overshoot but adds the pod's total, so a 2-GPU
    # pod can overshoot by one GPU.
    assert 1.3 * CAPACITY - 1000 < int(events[-1]["arrived_milli"]) <= 1.3 * CAPACITY + 1000
    assert sum(e["outcome"].startswith("failed: ") for e in events) == summary["failed_pods"]
    curves = list(csv.reader((out / "curves.csv").open()))
    assert curves[0][:6] == ["metric", "workload", "sc_policy", "tune", "seed", "total_gpus"]
    assert curves[0][6:] == [str(j) for j in range(131)]
    assert [row[0] for row in curves[1:]] == ["allocation", "fragmentation"]
    assert float(curves[1][6 + 100]) == summary["alloc_at_100"]
    assert '<img src="data:image/png;base64,' in (out / "report.html").read_text()  # self-contained


def test_tuning_follows_the_study(trace: tuple[Path, Path]) -> None:
    nodes, pods = (load_nodes(trace[0]), load_pods(trace[1]))
    a = study_arrivals(nodes, pods, seed=7, tune=1.3)
    b = study_arrivals(nodes, pods, seed=7, tune=1.3)
    assert [r.id for r in a.requests] == [r.id for r in b.requests] and a.ranks == b.ranks
    assert sorted(r.id for r in a.requests[:60]) == sorted(p.name for p in pods)  # all originals, shuffled, first
    total = sum(r.gpu_demand_milli for r in a.requests)
    assert total <= 1.3 * CAPACITY + 1000  # the per-GPU stop test (see test_run_writes_every_output)
    assert sorted(a.ranks) == list(range(len(NODE_SPECS)))
    down = study_arrivals(nodes, pods, seed=7, tune=0.2)  # tuned down: random pods removed until it fits
    assert sum(r.gpu_demand_milli for r in down.requests) <= 0.2 * CAPACITY < total
    assert study_arrivals(nodes, pods, seed=8, tune=1.3).requests != a.requests


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "pods.csv:1:header: empty file"),
        ("name,cpu_milli,memory_mib\npod-1,1,1\n", "pods.csv:1:header: missing column(s) num_gpu, gpu_milli"),
        (POD_HEADER + "pod-1,-4,8,0,0,,LS,R,0,1,0\n", "pods.csv:2:cpu_milli: must be >= 0, got -4"),
        (POD_HEADER + "pod-1,4,8,one,0,,LS,R,0,1,0\n", "pods.csv:2:num_gpu: not a whole number: 'one'"),
        (
            POD_HEADER + "pod-1,4,8,1,500,H200,LS,R,0,1,0\n",
            "pods.csv:2:gpu_spec: unknown GPU model H200; the cluster has A100, T4, V100",
        ),
        (POD_HEADER, "pods.csv:2:-: no data rows"),
        (POD_HEADER + "pod-1,4,8,1,500,,LS,R,9,1,0\n", "pods.csv:2:deletion_time: 1 is before creation_time 9"),
    ],
)
def test_bad_pod_lists_name_file_line_and_column(
    trace: tuple[Path, Path], tmp_path: Path, content: str, message: str
) -> None:
    nodes, _ = trace
    bad = tmp_path / "pods.csv"
    bad.write_text(content)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("earlier results")
    code, text = sim("run", "--nodes", str(nodes), "--pods", str(bad), "--out", str(out))
    assert code == 2, text
    assert message in text
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]  # nothing half-written
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no temporary folder left behind


def test_bad_node_list(trace: tuple[Path, Path], tmp_path: Path) -> None:
    _, pods = trace
    bad = tmp_path / "nodes.csv"
    bad.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,lots,1,1,T4\n")
    code, text = sim("run", "--nodes", str(bad), "--pods", str(pods), "--out", str(tmp_path / "o"))
    assert code == 2 and "nodes.csv:2:cpu_milli: not a whole number: 'lots'" in text
    assert not (tmp_path / "o").exists()


def test_bad_options(trace: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = trace
    base = ["run", "--nodes", str(nodes), "--pods", str(pods), "--out", str(tmp_path / "o")]
    assert "policy: unknown policy 'tetris'" in sim(*base, "--policy", "tetris")[1]
    assert "--tune: must be a positive ratio of GPU capacity, got -1.0" in sim(*base, "--tune", "-1")[1]
    assert "several policies only with --online" in sim(*base, "--policy", "fgd,bestfit")[1]
    code, text = sim("matrix", "--nodes", str(nodes), "--pods", str(pods), "--out", str(tmp_path / "m"), "--seeds", "x")
    assert code == 2 and "--seeds: expected e.g. 42-51 or 42,43, got 'x'" in text


def test_yaml_cluster_and_pods(tmp_path: Path) -> None:
    nodes = tmp_path / "cluster.yaml"
    nodes.write_text("nodes:\n  - {name: a, cpu: 32, memory: 128GiB, gpus: [{model: L4, memory: 24GiB, count: 4}]}\n")
    pods = tmp_path / "pods.yaml"
    pods.write_text(
        "pods:\n"
        "  - {name: train, cpu: 8, memory: 32GiB, gpus: 2}\n"
        "  - {name: notebook, cpu: 2, memory: 8GiB, gpus: 1, gpu_fraction: 0.25}\n"
        "  - {name: infer, cpu: 2, memory: 8GiB, gpus: 1, gpu_memory: 6GiB, gpu_models: [L4]}\n"
        "  - {name: etl, cpu: 4, memory: 16GiB}\n"
    )
    out = tmp_path / "out"
    code, text = sim("run", "--nodes", str(nodes), "--pods", str(pods), "--policy", "binpack", "--out", str(out))
    assert code == 0, text
    events = list(csv.DictReader((out / "events.csv").open()))
    assert events[0]["pod"] in {"train", "notebook", "infer", "etl"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("pods:\n  - {name: x, gpus: 1, gpu_models: [H100]}\n")
    code, text = sim("run", "--nodes", str(nodes), "--pods", str(bad), "--out", str(out))
    assert code == 2 and "bad.yaml: pods[0].gpu_models: unknown GPU model H100; the cluster has L4" in text


def test_matrix_with_published_numbers(trace: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = trace
    published = tmp_path / "expected.csv"
    published.write_text(
        "workload,policy,alloc_at_100_mean,alloc_at_130_final_mean,frag_at_100_mean,n_seeds\npods,FGD,90.0,91.0,5.0,10\n"
    )
    out = tmp_path / "m"
    code, text = sim(
        "matrix", "--nodes", str(nodes), "--pods", str(pods), "--policies", "fgd,bestfit", "--seeds", "1-3",
        "--published", str(published), "--out", str(out), "--jobs", "1",
    )  # fmt: skip
    assert code == 0, text
    rows = {r["policy"]: r for r in csv.DictReader((out / "matrix.csv").open())}
    assert rows["fgd"]["seeds"] == "3" and rows["fgd"]["published_alloc_at_100"] == "90.0"
    assert float(rows["fgd"]["diff_alloc_at_100"]) == pytest.approx(float(rows["fgd"]["alloc_at_100_mean"]) - 90.0)
    assert rows["bestfit"]["published_alloc_at_100"] == ""
    assert (out / "matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| pods | fgd |" in (out / "matrix.md").read_text()
    assert len(json.loads((out / "runs.json").read_text())) == 6
