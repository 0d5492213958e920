"""`corral place` and `corral policies`: the words and exit codes a user sees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app
from corral.placement import policy_names

runner = CliRunner()


def test_place_on_a_simulated_inventory() -> None:
    result = runner.invoke(app, ["place", "--simulate-gpus", "2x8xA100-80GB", "--gpus", "2"])
    assert result.exit_code == 0, result.output
    assert "simulated GPU inventory (no real devices)" in result.output
    said = " ".join(result.output.split())
    assert "2/2 nodes fit; chose sim-0 GPU 0,1 (binpack score 15.3516 of 100, higher preferred)" in said
    assert "SIM-GPU-0-1" in result.output


def test_place_json_for_a_share() -> None:
    result = runner.invoke(app, ["place", "--simulate-gpus", "4xH100-80GB", "--gpu-fraction", "0.3", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["placed"] and data["node"] == "sim-0"
    assert data["gpus"] == [{"index": 0, "uuid": "SIM-GPU-0-0", "model": "H100", "milli": 300, "memory_mib": 0}]
    assert data["explanation"]["summary"] == "1/1 nodes fit; chose sim-0 GPU 0 (binpack score 5.20312)"


def test_no_fit_exits_3_and_says_why() -> None:
    result = runner.invoke(app, ["place", "--simulate-gpus", "4xH100-80GB", "--gpus", "8", "--explain"])
    assert result.exit_code == 3
    assert "0/1 nodes fit: 1 fewer than 8 eligible GPUs" in result.output
    assert "1 nodes can never fit this request" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu-model", "T4", "--gpus", "1"], "--gpu-model: unknown GPU model T4; this cluster has: H100"),
        (["--gpu-fraction", "1.5"], "--gpu-fraction: must be between 0 and 1 (exclusive), got 1.5"),
        (["--gpu-memory", "200GiB"], "--gpu-memory: 204800 MiB is more than any GPU of this cluster has"),
        (["--memory", "lots"], "--memory: not a memory amount: 'lots'"),
        (["--policy", "tetris"], "policy: unknown policy 'tetris'; use one of"),
        (["--behavior", "maybe"], "--behavior: unknown GPU scheduling behaviour 'maybe'"),
        (["--constraint", "rack=r1"], "--constraint: expected ATTRIBUTE:OPERATOR:VALUE, got 'rack=r1'"),
        (["--cpus", "-2"], "--cpus: not a CPU amount: '-2' (examples: 2, 0.5, 250m)"),
    ],
)
def test_bad_input_is_exit_2_with_the_field(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["place", "--simulate-gpus", "4xH100-80GB", *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_bad_inventory() -> None:
    result = runner.invoke(app, ["place", "--simulate-gpus", "4xH100", "--gpus", "1"])
    assert result.exit_code == 2
    assert "cannot read '4xH100'; write [NODES x] GPUS x MODEL-MEMORY GB" in " ".join(result.output.split())
    both = runner.invoke(app, ["place", "--gpus", "1"])
    assert both.exit_code == 2 and "give exactly one of them" in both.output


def test_place_with_a_yaml_cluster(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "nodes:\n"
        "  - name: box\n    cpu: 32\n    memory: 128GiB\n    labels: {rack: r1}\n"
        "    gpus:\n      - {model: A100, memory: 80GiB, numa: 0, nvlink: [2]}\n"
        "      - {model: A100, memory: 80GiB, numa: 0}\n      - {model: A100, memory: 80GiB, numa: 1, nvlink: [0]}\n"
        "  - name: cpu-box\n    cpu: 64\n    memory: 256GiB\n"
    )
    result = runner.invoke(
        app, ["place", "--nodes", str(cluster), "--gpus", "2", "--constraint", "rack:IS:r1", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["node"] == "box" and [g["index"] for g in data["gpus"]] == [0, 2]  # the NVLinked pair
    assert data["explanation"]["rejected"] == [
        {"reason": "CONSTRAINT", "text": "constraint not met (rack IS r1)", "nodes": 1}
    ]
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes:\n  - name: x\n    cpu: lots\n")
    result = runner.invoke(app, ["place", "--nodes", str(bad), "--cpus", "1"])
    assert result.exit_code == 2
    assert "nodes[0].cpu: not a CPU amount: 'lots'" in " ".join(result.output.split())


def test_behaviour_flag_and_label() -> None:
    base = ["place", "--simulate-gpus", "1x2xT4-16GB", "--cpus", "1"]
    declined = runner.invoke(app, [*base, "--behavior", "restricted"])
    said = " ".join(declined.output.split())
    assert (
        declined.exit_code == 3
        and "0/1 nodes fit: 1 declined: the job needs no GPU, and the GPU behaviour keeps "
        "nodes with free GPUs for GPU work (DeclinedScarceResources)"
        in said
    )
    overridden = runner.invoke(
        app, [*base, "--behavior", "restricted", "--label", "GPU_SCHEDULING_BEHAVIOR=unrestricted"]
    )
    assert overridden.exit_code == 0, overridden.output


def test_policies_lists_every_policy() -> None:
    result = runner.invoke(app, ["policies", "--json"])
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert sorted(data) == policy_names()  # every registered policy, plugins included
    assert data["fgd"] == "FGD study: least growth of fragmentation for the target workload"
    assert all(data.values()), [name for name, text in data.items() if not text]  # each policy says what it does
    table = runner.invoke(app, ["policies"])
    assert "registered plugin" not in table.output and "fgd-priced" in table.output


def test_discover_refuses_several_simulated_machines() -> None:
    several = runner.invoke(app, ["discover", "--simulate-gpus", "2x8xA100-80GB"])
    said = " ".join(several.output.split())
    assert several.exit_code == 2 and "'2x8xA100-80GB' is 2 machines; discover shows this machine only" in said
    assert "8xA100-80GB" in said and "corral place --simulate-gpus 2x8xA100-80GB" in said
    one = runner.invoke(app, ["discover", "--simulate-gpus", "8xA100-80GB", "--json"])
    assert one.exit_code == 0 and len(json.loads(one.output)["gpus"]) == 8


def test_discover_without_a_driver_or_simulated() -> None:
    from corral.gpu.discovery import GpuDiscoveryError, discover_gpus

    try:
        discover_gpus()
        has_gpus = True
    except GpuDiscoveryError:
        has_gpus = False
    result = runner.invoke(app, ["discover"])
    if not has_gpus:
        assert result.exit_code == 2
        assert "NVML is not usable here" in result.output and "use --simulate-gpus" in result.output
    sim = runner.invoke(app, ["discover", "--simulate-gpus", "2xH100-80GB", "--json"])
    assert sim.exit_code == 0
    data = json.loads(sim.output)
    assert data["simulated"] is True
    assert [g["uuid"] for g in data["gpus"]] == ["SIM-GPU-0-0", "SIM-GPU-0-1"]
    assert data["gpus"][0]["model"] == "H100" and data["gpus"][0]["memory_total_mib"] == 81920


def test_sim_matrix_names_its_flags_as_sim_run_does() -> None:
    shown = " ".join(runner.invoke(app, ["sim", "matrix", "--help"]).output.split())
    assert "--policy,--policies" in shown and "--behavior,--behaviors" in shown  # the plural: as first shipped
