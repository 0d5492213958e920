"""`corral place`, `discover` and `policies`: the placement engine on this machine, without a daemon.

corral place  --simulate-gpus 2x8xA100-80GB --gpus 2 --explain     one decision, explained
corral place  --nodes cluster.yaml --gpu-fraction 0.3 --policy fgd --json
corral policies                                                  the policies and what they do

These load the engine (numpy, scipy through fgd-priced), so `corral.cli.main` imports this module only when one of
them runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from corral.cli.render import error_line, literal, row
from corral.cli.views import FLAGS, engine_words, flag_error
from corral.gpu.simulated import parse_simulated_inventory
from corral.model.errors import InvalidRequest
from corral.model.inventory import load_inventory
from corral.model.requests import build_request
from corral.model.resources import GpuBehavior, Node
from corral.model.snapshot import ClusterSnapshot
from corral.model.units import parse_cpu_milli, parse_memory_mib
from corral.placement import Decision, GpuReserve, PlacementConfig, get_policy, place, policy_names, render
from corral.placement.explain import render_long

out = Console()
err = Console(stderr=True, soft_wrap=True)

EXIT_BAD_INPUT = 2
EXIT_NO_FIT = 3
#: `place`'s flags for the request's fields (those of `submit`, and a few more).
PLACE_FLAGS = {
    **FLAGS, "min_gpu_memory_mib": "--min-gpu-memory", "constraints": "--constraint", "constraint": "--constraint",
    "labels": "--label", "label": "--label", "policy": "--policy",
}  # fmt: skip


def fail(message: str) -> typer.Exit:
    error_line(err, message)
    return typer.Exit(EXIT_BAD_INPUT)


def decision_json(d: Decision, snapshot: ClusterSnapshot) -> dict[str, Any]:
    alloc = d.allocation
    data: dict[str, Any] = {"placed": d.placed, "policy": d.policy, "behavior": d.behavior.value}
    if alloc is not None:
        node = snapshot.nodes[alloc.node_index]
        data["node"] = alloc.node
        data["gpus"] = [
            {
                "index": g.index,
                "uuid": node.gpus[g.index].uuid,
                "model": node.gpus[g.index].model,
                "milli": g.milli,
                "memory_mib": g.memory_mib,
            }
            for g in alloc.gpus
        ]
    data["explanation"] = d.explanation.to_dict()
    return data


def place_cmd(
    nodes: Annotated[Path | None, typer.Option(help="Cluster file: corral YAML/JSON, or an openb node CSV.")] = None,
    simulate_gpus: Annotated[
        str | None,
        typer.Option("--simulate-gpus", help="Simulated inventory, e.g. 4xH100-80GB or 2x8xA100-80GB."),
    ] = None,
    gpus: Annotated[
        int | None, typer.Option(help="Number of GPUs (whole unless a fraction or memory is given).")
    ] = None,
    gpu_fraction: Annotated[float | None, typer.Option(help="Share of each GPU, e.g. 0.3.")] = None,
    gpu_memory: Annotated[str | None, typer.Option(help="GPU memory per GPU for a share, e.g. 10GiB.")] = None,
    cpus: Annotated[str, typer.Option(help="CPUs, e.g. 4 or 500m.")] = "1",
    memory: Annotated[str, typer.Option(help="Memory, e.g. 8GiB.")] = "1GiB",
    gpu_model: Annotated[list[str], typer.Option(help="Allowed GPU model (repeatable).")] = [],  # noqa: B006
    min_gpu_memory: Annotated[str | None, typer.Option(help="Only GPUs with at least this much memory.")] = None,
    constraint: Annotated[list[str], typer.Option(help="ATTRIBUTE:IS|LIKE|UNLIKE:VALUE (repeatable).")] = [],  # noqa: B006
    label: Annotated[list[str], typer.Option(help="KEY=VALUE, e.g. GPU_SCHEDULING_BEHAVIOR=restricted.")] = [],  # noqa: B006
    priority: Annotated[int, typer.Option(help="Priority (higher first).")] = 0,
    policy: Annotated[str, typer.Option(help="Placement policy (see `corral policies`).")] = "binpack",
    behavior: Annotated[str, typer.Option(help="GPU scheduling behaviour for work without GPUs.")] = "preferential",
    reserve_cpus: Annotated[str, typer.Option(help="preferential: CPUs kept free per free GPU.")] = "4",
    reserve_memory: Annotated[str, typer.Option(help="preferential: memory kept free per free GPU.")] = "16GiB",
    seed: Annotated[int, typer.Option(help="Seed for the random policy.")] = 0,
    explain: Annotated[bool, typer.Option(help="Show shortfalls, every failing dimension and top scores.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the decision as JSON.")] = False,
) -> None:
    """Place one request on a cluster and say why. Exit code 3 when no node fits, 2 on bad input."""
    try:
        if (nodes is None) == (simulate_gpus is None):
            raise InvalidRequest("--nodes/--simulate-gpus", "give exactly one of them")
        inventory: list[Node] = load_inventory(nodes) if nodes else parse_simulated_inventory(simulate_gpus or "")
        snapshot = ClusterSnapshot(inventory)
        request = build_request(
            gpus,
            gpu_fraction,
            gpu_memory,
            cpus,
            memory,
            gpu_model,
            min_gpu_memory,
            constraint,
            label,
            priority,
            None,
            "cli",
        )
        config = PlacementConfig(
            policy=policy,
            gpu_behavior=GpuBehavior.parse(behavior, "--behavior"),
            reserve=GpuReserve(
                parse_cpu_milli(reserve_cpus, "--reserve-cpus"),
                parse_memory_mib(reserve_memory, "--reserve-memory"),
            ),
        )
        decision = place(snapshot, request, config, rng=seed)
    except InvalidRequest as exc:
        raise fail(flag_error(exc.field, exc.message, PLACE_FLAGS)) from None
    if as_json:
        sys.stdout.write(json.dumps(decision_json(decision, snapshot), indent=2) + "\n")
    else:
        if simulate_gpus:
            out.print("[yellow]simulated GPU inventory[/] (no real devices)", highlight=False)
        said = render_long(decision.explanation) if explain else render(decision.explanation)
        out.print(literal(engine_words(said), lines=True))
        if decision.allocation is not None:
            table = Table("GPU", "UUID", "model", "milli", "memory MiB", title=f"granted on {decision.allocation.node}")
            node = snapshot.nodes[decision.allocation.node_index]
            for g in decision.allocation.gpus:
                dev = node.gpus[g.index]
                row(table, g.index, dev.uuid, dev.model, g.milli, g.memory_mib)
            if decision.allocation.gpus:
                out.print(table)
    if not decision.placed:
        raise typer.Exit(EXIT_NO_FIT)


def discover_cmd(
    simulate_gpus: Annotated[
        str | None, typer.Option("--simulate-gpus", help="Show a simulated inventory instead, e.g. 4xH100-80GB.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """The GPUs of this machine as corral sees them (NVML): UUID, model, memory, use and topology."""
    import dataclasses

    from corral.gpu.discovery import GpuDiscoveryError, GpuInfo, discover_gpus

    try:
        if simulate_gpus:
            machines = parse_simulated_inventory(simulate_gpus)
            if len(machines) > 1:  # this command shows one machine: showing the first of several would mislead
                raise fail(
                    f"--simulate-gpus: {simulate_gpus!r} is {len(machines)} machines; discover shows this machine "
                    f"only: give one (e.g. {len(machines[0].gpus)}x{machines[0].gpus[0].model}-"
                    f"{machines[0].gpus[0].memory_mib // 1024}GB), or see a cluster with `corral place "
                    f"--simulate-gpus {simulate_gpus} ...`"
                )
            gpus = [GpuInfo(g.index, g.uuid, g.model, g.memory_mib) for g in machines[0].gpus]
        else:
            gpus = discover_gpus()
    except (InvalidRequest, GpuDiscoveryError) as exc:
        raise fail(f"{exc}; use --simulate-gpus to try corral without GPUs") from None
    if as_json:
        rows = [{**dataclasses.asdict(g), "model": g.model, "nvlink_peers": sorted(g.nvlink_peers)} for g in gpus]
        sys.stdout.write(json.dumps({"simulated": bool(simulate_gpus), "gpus": rows}, indent=2) + "\n")
        return
    if simulate_gpus:
        out.print("[yellow]simulated GPU inventory[/] (no real devices)", highlight=False)
    table = Table("GPU", "UUID", "model", "memory MiB", "used MiB", "util %", "NUMA", "PCIe switch", "NVLink peers")

    def cell(v: object) -> str:
        return "unknown" if v is None else str(v)

    for g in gpus:
        peers = ",".join(str(p) for p in sorted(g.nvlink_peers)) or "-"
        row(
            table, g.index, g.uuid, g.model, g.memory_total_mib, cell(g.memory_used_mib), cell(g.utilization_pct),
            cell(g.numa_node), cell(g.pcie_switch), peers,
        )  # fmt: skip
    out.print(table)


POLICY_HELP = {
    "binpack": "fill the fullest node and GPU first (leaves whole nodes free)",
    "spread": "use the emptiest node and GPU (spreads load and failures)",
    "random": "a feasible node at random (seeded)",
    "bestfit": "FGD study: least free CPU + GPU left on the node",
    "dotprod": "FGD study: smallest dot product of free and demand vectors",
    "gpu-packing": "FGD study: fill used GPUs, then used nodes, then small empty nodes",
    "gpu-clustering": "FGD study: keep pods of one GPU kind together",
    "fgd": "FGD study: least growth of fragmentation for the target workload",
    "topology": "multi-GPU work on the best-connected GPUs (NVLink, PCIe switch, NUMA)",
    "load": "least busy GPUs by measured utilisation",
    "fgd-scarcity": "fgd, with its ties going to the node whose loss the future pods feel least (scarce room, "
    "GPU models others depend on)",
    "fgd-priced": "shares go where they spoil the least room an optimal packing of the workload's shares would use "
    "(LP dual prices); hosts for multi-GPU pods kept; fgd-scarcity for the rest",
}


def policies_cmd(as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False) -> None:
    """List the placement policies."""
    names = policy_names()
    for n in names:
        get_policy(n)
    if as_json:
        sys.stdout.write(json.dumps({n: POLICY_HELP.get(n, "") for n in names}, indent=2) + "\n")
        return
    table = Table("policy", "what it does")
    for n in names:
        table.add_row(n, POLICY_HELP.get(n, "(registered plugin)"))
    out.print(table)
