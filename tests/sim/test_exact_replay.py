"""The FGD study's policies, replayed on the authors' exact arrival orders, give their published numbers exactly.

This checks that bestfit, dotprod, gpu-packing, gpu-clustering and fgd are the study's policies (section 3 of
fgd-experiment.md) decision for decision, not approximately: one wrong tie or truncation moves the 2-decimal
figures. The trace lives in ../shared/traces/openb (override with CORRAL_TRACES).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from corral.sim.experiment import run_experiment
from corral.sim.openb import load_nodes, load_order, load_pods

TRACES = Path(os.environ.get("CORRAL_TRACES", Path(__file__).resolve().parents[3] / "shared" / "traces" / "openb"))

# Outside CI a checkout without ../shared skips these; CI always has the trace, so there they must run.
pytestmark = pytest.mark.skipif(
    not TRACES.is_dir() and not os.environ.get("CI"), reason=f"openb trace not found at {TRACES}"
)


def published(workload: str, policy: str, seed: int) -> tuple[float, float, float]:
    with (TRACES / "expected_per_seed.csv").open() as fh:
        for row in csv.DictReader(fh):
            if row["workload"] == f"openb_pod_list_{workload}" and row["policy"] == policy and int(row["seed"]) == seed:
                return float(row["alloc_at_100"]), float(row["alloc_at_130"]), float(row["frag_at_100"])
    raise LookupError((workload, policy, seed))


@pytest.mark.parametrize(
    ("workload", "policy", "seed"),
    [
        ("default", "fgd", 42),
        ("default", "bestfit", 42),
        ("default", "gpu-clustering", 43),
        ("gpuspec20", "bestfit", 43),
        ("multigpu30", "gpu-packing", 44),
        ("gpushare60", "dotprod", 42),
        ("gpuspec20", "fgd", 44),
    ],
)
def test_exact_replay_matches_the_published_values(workload: str, policy: str, seed: int) -> None:
    nodes = load_nodes(TRACES / "openb_node_list_gpu_node.csv")
    pods = load_pods(TRACES / f"openb_pod_list_{workload}.csv")
    order = load_order(TRACES / "orders" / f"openb_pod_list_{workload}.seed{seed}.order.gz")
    result = run_experiment(nodes, pods, policy, seed, order=order)
    summary = result.summary
    assert (summary["alloc_at_100"], summary["alloc_at_130"], summary["frag_at_100"]) == published(
        workload, policy, seed
    )
    assert summary["gpus"] == 6212 and summary["pods"] == len(order.pods)


def test_fgd_priced_beats_the_published_fgd_on_the_same_order() -> None:
    """Issue 7's bar on one exact order: above fgd's published figures at 100 % and 130 %, and >= 95.94 % at 100 %
    (the ten-seed mean is the benchmark's business; one seed keeps the suite's time)."""
    nodes = load_nodes(TRACES / "openb_node_list_gpu_node.csv")
    pods = load_pods(TRACES / "openb_pod_list_default.csv")
    order = load_order(TRACES / "orders" / "openb_pod_list_default.seed42.order.gz")
    summary = run_experiment(nodes, pods, "fgd-priced", 42, order=order).summary
    fgd_100, fgd_130, _ = published("default", "fgd", 42)
    assert summary["alloc_at_100"] >= 95.94 and summary["alloc_at_100"] > fgd_100
    assert summary["alloc_at_130"] > fgd_130
