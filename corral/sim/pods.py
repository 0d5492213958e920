"""Pod lists for `corral sim`: the openb CSV, or corral's own YAML/JSON so users can replay their own cluster.

pods:
  - name: train-1
    cpu: 8                    # cores or "500m"
    memory: 32GiB
    gpus: 2                   # whole GPUs unless gpu_milli / gpu_memory make it a share
    gpu_milli: 500            # per GPU, 1..1000 (or gpu_fraction: 0.5)
    gpu_memory: 10GiB         # per GPU, for memory shares
    gpu_models: [A100, H100]
    creation_time: 0          # seconds (online mode)
    deletion_time: 3600
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corral.model.errors import InvalidRequest
from corral.model.inventory import load_document_list
from corral.model.resources import MILLI_PER_GPU, Node, Request
from corral.model.units import parse_cpu_milli, parse_memory_mib
from corral.sim.openb import TraceError, TracePod, load_pods


def load_pod_file(path: Path) -> list[TracePod]:
    if not path.is_file():
        raise InvalidRequest(str(path), "no such file")
    if path.suffix == ".csv":
        return load_pods(path)
    pods = [_pod(path, i, item) for i, item in enumerate(load_document_list(path, "pods"))]
    names = [p.name for p in pods]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InvalidRequest(str(path), f"pod name {dup!r} appears twice")
    return pods


def _pod(path: Path, i: int, item: Any) -> TracePod:
    where = f"{path}: pods[{i}]"
    if not isinstance(item, dict) or not item.get("name"):
        raise InvalidRequest(where, "each pod needs at least a name")
    try:
        count = int(item.get("gpus", 0))
        if "gpu_fraction" in item:
            milli = round(float(item["gpu_fraction"]) * MILLI_PER_GPU)
        else:
            default = 0 if "gpu_memory" in item else MILLI_PER_GPU
            milli = int(item.get("gpu_milli", default if count else 0))
        models = item.get("gpu_models")
        if isinstance(models, str):
            models = models.split("|")
        request = Request(
            cpu_milli=parse_cpu_milli(item.get("cpu", 0), "cpu"),
            memory_mib=parse_memory_mib(item.get("memory", 0), "memory"),
            gpu_count=count,
            gpu_milli=milli,
            gpu_memory_mib=parse_memory_mib(item["gpu_memory"], "gpu_memory") if "gpu_memory" in item else 0,
            gpu_models=frozenset(str(m) for m in models) if models else None,
            id=str(item["name"]),
        )
        times = [item.get(k) for k in ("creation_time", "deletion_time")]
        created, deleted = (None if t is None else int(t) for t in times)
    except InvalidRequest as exc:
        raise InvalidRequest(f"{where}.{exc.field}", exc.message) from None
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(where, f"bad value: {exc}") from None
    spec = "|".join(sorted(request.gpu_models)) if request.gpu_models else ""
    return TracePod(str(item["name"]), request, spec, created, deleted, i)


def check_models(path: Path, pods: Sequence[TracePod], nodes: Sequence[Node]) -> None:
    """Every GPU model a pod asks for must exist in the cluster: a typo would silently make the pod unplaceable."""
    known = {g.model for n in nodes for g in n.gpus}
    for pod in pods:
        unknown = sorted((pod.request.gpu_models or frozenset()) - known)
        if unknown:
            message = f"unknown GPU model {', '.join(unknown)}; the cluster has {', '.join(sorted(known)) or 'none'}"
            if path.suffix == ".csv":
                raise TraceError(path, pod.line, "gpu_spec", message)
            raise InvalidRequest(f"{path}: pods[{pod.line}].gpu_models", message)
