"""Marathon constraints on one machine: which of them an instance about to launch meets, and how the rest become a
request the placement engine understands.

A service's instances all run on this machine, so the fields a constraint can name come in two kinds:

    machine fields   hostname (@hostname), the node's labels (rack, @zone, ...)   the same for every instance
    GPU fields       gpu (index), gpu_model, gpu_uuid, gpu_memory_mib, numa       those of the GPU(s) it was given

    machine-field constraints  -> checked here with the live instances counted on this machine: `hostname UNIQUE`
                                  allows one instance, `hostname MAX_PER 2` two; a failing one holds the instance back
    GPU-field constraints      -> each GPU checked as a candidate (an instance on k GPUs counts on each of them); the
                                  GPUs allowed become `gpu_models` or a GPU memory minimum on the request where
                                  that says exactly the same; otherwise the instance is held back with the reason

Marathon's `gpus` is a whole number, so an instance holds whole GPUs and the engine never gives one GPU to two of
them: GPUs held by the app's own instances need no exclusion of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from corral.mesos.constraints import check
from corral.mesos.model import ServiceConstraint
from corral.model.resources import GpuDevice, Node

GPU_FIELDS = frozenset({"gpu", "gpu_model", "gpu_uuid", "gpu_memory_mib", "numa"})


def machine_fields(node: Node) -> dict[str, str]:
    return {**node.labels, "hostname": node.name}


def gpu_fields(node: Node, gpu: GpuDevice) -> dict[str, str]:
    fields = {
        **machine_fields(node),
        "gpu": str(gpu.index),
        "gpu_model": gpu.model,
        "gpu_uuid": gpu.uuid,
        "gpu_memory_mib": str(gpu.memory_mib),
    }
    if gpu.numa_node is not None:
        fields["numa"] = str(gpu.numa_node)
    return fields


def is_gpu_constraint(c: ServiceConstraint) -> bool:
    return c.field in GPU_FIELDS


@dataclass(frozen=True, slots=True)
class Admission:
    """May one more instance launch now, and with which narrowing of its GPU request."""

    reason: str = ""  # non-empty: held back, and why
    gpu_models: frozenset[str] | None = None
    min_gpu_memory_mib: int = 0

    @property
    def ok(self) -> bool:
        return not self.reason


def admit(
    constraints: Sequence[ServiceConstraint],
    node: Node,
    gpus_per_instance: int,
    live_instances: int,
    placed_gpus: Sequence[int],
) -> Admission:
    """Whether another instance may launch. `live_instances`: the app's instances alive now (queued ones too: they
    will run here); `placed_gpus`: the GPU indices those instances hold (one entry per instance and GPU)."""
    here = machine_fields(node)
    machine = [c for c in constraints if not is_gpu_constraint(c)]
    on_gpus = [c for c in constraints if is_gpu_constraint(c)]
    rejected = check(machine, here, [here] * live_instances)
    if rejected:
        return Admission("; ".join(map(str, rejected)))
    if not on_gpus:
        return Admission()
    if gpus_per_instance == 0:
        rejected = check(on_gpus, here, [])
        return Admission("; ".join(f"{r} (the app asks for no GPUs)" for r in rejected)) if rejected else Admission()
    by_index = {g.index: g for g in node.gpus}
    placed = [gpu_fields(node, by_index[i]) for i in placed_gpus if i in by_index]
    domains: dict[str, set[str]] = {}
    for g in node.gpus:
        for key, value in gpu_fields(node, g).items():
            domains.setdefault(key, set()).add(value)
    own = set(placed_gpus)
    why: dict[int, str] = {}
    for g in node.gpus:
        if g.index in own:
            why[g.index] = "held by an instance of this app"
            continue
        rejections = check(on_gpus, gpu_fields(node, g), placed, domains)
        if rejections:
            why[g.index] = "; ".join(map(str, rejections))
    allowed = [g for g in node.gpus if g.index not in why]
    if len(allowed) < gpus_per_instance:
        detail = "; ".join(f"GPU {i}: {text}" for i, text in sorted(why.items()))
        return Admission(
            f"constraints leave {len(allowed)} of {len(node.gpus)} GPUs for an instance that needs "
            f"{gpus_per_instance}" + (f" ({detail})" if detail else "")
        )
    refused = [g for g in node.gpus if g.index in why and g.index not in own]
    if not refused:
        return Admission()
    # The engine can narrow a request by GPU model or by GPU memory; pinning to particular GPUs it cannot do.
    usable = {g.index for g in allowed} | own
    models = frozenset(g.model for g in allowed)
    if all(g.index in usable for g in node.gpus if g.model in models):
        return Admission(gpu_models=models)
    least = min(g.memory_mib for g in allowed)
    if all(g.index in usable for g in node.gpus if g.memory_mib >= least):
        return Admission(min_gpu_memory_mib=least)
    names = ", ".join(str(c) for c in on_gpus)
    return Admission(
        f"constraint {names} can only be met by pinning the instance to GPU "
        f"{', '.join(str(g.index) for g in allowed)}, which corral's engine cannot do (it narrows GPUs by model or "
        "memory only): use gpu_model or gpu_memory_mib, or spread with UNIQUE/MAX_PER/GROUP_BY over gpu"
    )
