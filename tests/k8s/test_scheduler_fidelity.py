"""Fidelity end to end (issue 24, item 4) on a 100-node slice of openb's default trace: real Node and Pod objects on
the real plane, placed by `corral k8s scheduler` (its own process), land exactly where `corral sim` places them.

The slice (benchmarks/k8s_fidelity.py): every 12th node of the trace with the study's seed-42 tie-break ranks kept in
order, and the seed-42 arrival order up to 1.3 x the slice's GPU capacity (841 pods, 642 of them placed by the
simulator). The whole trace is the benchmark (`python -m benchmarks.k8s_fidelity`, BENCHMARKS.md).

Skipped where ../shared/k8s/control-plane.sh (or CORRAL_K8S_CONTROL_PLANE) or ../shared/traces/openb is absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks._k8s_plane import Writer
from benchmarks.k8s_fidelity import TRACES, compare, load_trace, run_on_plane, simulate
from tests.k8s.plane import Plane

POLICY = "fgd"


def test_a_100_node_slice_of_openb_binds_pod_by_pod_as_corral_sim_places_it(tmp_path: Path) -> None:
    if not (TRACES / "orders").is_dir():
        pytest.skip(f"no openb trace at {TRACES}")
    plane = Plane.find(tmp_path / "plane")
    if plane is None:
        pytest.skip("no control plane here (../shared/k8s/control-plane.sh, openssl, curl, xz)")
    trace = load_trace(nodes=100)
    sim = simulate(trace, POLICY)
    try:
        writer = Writer(plane.up())
        got, timings = run_on_plane(plane, writer, trace, POLICY, tmp_path, timeout=120)
    finally:
        plane.down()
    result = compare(sim, got)
    assert timings["settled"] == "settled", f"the scheduler did not answer every pod: {timings}, {result}"
    assert abs(result["diff_pp"]) <= 0.1, f"GPU allocation differs from corral sim's: {result}"
    assert got.placed == sim.placed, f"pods placed differently from corral sim: {result}"


def test_the_scheduler_says_which_workload_it_cannot_read(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from corral.k8s.cli import app

    missing = tmp_path / "nope.csv"
    done = CliRunner().invoke(app, ["scheduler", "--kubeconfig", str(tmp_path / "kc"), "--workload", str(missing)])
    assert done.exit_code == 2
    assert f"--workload: expected auto, default or a pod list file; {str(missing)!r} is none of them" in done.output
