"""Which placement policy each face starts with (issue 16). A default is a decision with figures behind it
(README's policy table, BENCHMARKS.md's issue-16 sections): changing one must change this test too, never silently."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from corral.cli.main import app
from corral.cli.typer_app import TYPER_COMMANDS, load

#: (command path, option) -> the default policy, and where its reason is written down.
DEFAULTS = {
    # one machine: binpack kept while it waits no longer than fgd-priced there (benchmarks/one_node.py)
    (("serve",), "policy"): "binpack",
    # a cluster replayed with its own pod statistics: the recommended policy (BENCHMARKS.md, issue-16 sections)
    (("sim", "run"), "policy"): "fgd-priced",
    # fgd-priced starves 8-GPU jobs on README's fair example (BENCHMARKS.md, "corral sim fair's placement")
    (("sim", "fair"), "placement"): "fgd",
    # with the workload the extender learns (--workload auto), fgd-priced is above binpack and fgd on all five
    # shared lists (BENCHMARKS.md, "The extender's learned workload")
    (("k8s", "extender"), "policy"): "fgd-priced",
    # ...which it is only with the learned workload: the generic one loses 3.0 pp to binpack on multigpu30 (same)
    (("k8s", "extender"), "workload"): "auto",
}


def command(path: tuple[str, ...]) -> Any:
    """The command as `corral` itself loads it (corral.cli.typer_app), down to the subcommand (Typer's own click
    objects, which are not the installed click's classes)."""
    found: Any = load(path[0], TYPER_COMMANDS[path[0]])
    for name in path[1:]:
        found = found.commands[name]
    return found


@pytest.mark.parametrize(("where", "expected"), list(DEFAULTS.items()), ids=[" ".join(p) for p, _ in DEFAULTS])
def test_default_policy_of_each_face(where: tuple[tuple[str, ...], str], expected: str) -> None:
    path, option = where
    params = {p.name: p for p in command(path).params}
    assert params[option].default == expected, (
        f"`corral {' '.join(path)} --{option}` now defaults to {params[option].default!r}, not {expected!r}: "
        "update README's policy table and this test with the figures that justify it"
    )


def test_sim_run_online_without_a_policy_replays_the_default(tmp_path: Path) -> None:
    """The default is what actually runs, not only what --help says."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,4,T4\n")
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n"
        "a,2000,4096,1,500,0,10\nb,2000,4096,1,1000,1,5\n"
    )
    out = tmp_path / "out"
    r = CliRunner().invoke(
        app, ["sim", "run", "--online", "--nodes", str(nodes), "--pods", str(pods), "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == [DEFAULTS[(("sim", "run"), "policy")]]
    assert summary[DEFAULTS[(("sim", "run"), "policy")]]["placed"] == 2
