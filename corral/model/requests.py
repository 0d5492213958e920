"""A placement `Request` from the fields every face takes the same way (`corral place`'s flags, a submission to
`corral serve`'s API), so that neither face borrows the other's parsing:

    corral.cli.place (corral place --gpus 2 ...)  --+
                                                    +-->  build_request  -->  Request
    corral.api.app   (POST /v1/jobs {"gpus": 2})  --+

Errors name the flag (`--memory`); the API words them for its own fields.
"""

from __future__ import annotations

from corral.model.errors import InvalidRequest
from corral.model.resources import MILLI_PER_GPU, Constraint, Request
from corral.model.units import parse_cpu_milli, parse_memory_mib


def build_request(
    gpus: int | None,
    gpu_fraction: float | None,
    gpu_memory: str | None,
    cpus: str,
    memory: str,
    gpu_model: list[str],
    min_gpu_memory: str | None,
    constraint: list[str],
    label: list[str],
    priority: int,
    policy: str | None,
    name: str,
) -> Request:
    """Flags -> Request. `--gpu-fraction 0.3` is 300 milli of one GPU (of `--gpus` GPUs when given)."""
    if gpu_fraction is not None and not 0 < gpu_fraction < 1:
        raise InvalidRequest("--gpu-fraction", f"must be between 0 and 1 (exclusive), got {gpu_fraction}")
    share = gpu_fraction is not None or gpu_memory is not None
    count = gpus if gpus is not None else (1 if share else 0)
    milli = round(gpu_fraction * MILLI_PER_GPU) if gpu_fraction is not None else (0 if share else MILLI_PER_GPU)
    constraints = []
    for c in constraint:
        parts = c.split(":", 2)
        if len(parts) != 3:
            raise InvalidRequest("--constraint", f"expected ATTRIBUTE:OPERATOR:VALUE, got {c!r}")
        constraints.append(Constraint.parse(*parts))
    labels = {}
    for item in label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidRequest("--label", f"expected KEY=VALUE, got {item!r}")
        labels[key] = value
    return Request(
        cpu_milli=parse_cpu_milli(cpus, "--cpus"),
        memory_mib=parse_memory_mib(memory, "--memory"),
        gpu_count=count,
        gpu_milli=milli if count else 0,
        gpu_memory_mib=parse_memory_mib(gpu_memory, "--gpu-memory") if gpu_memory else 0,
        gpu_models=frozenset(gpu_model) if gpu_model else None,
        min_gpu_memory_mib=parse_memory_mib(min_gpu_memory, "--min-gpu-memory") if min_gpu_memory else 0,
        constraints=tuple(constraints),
        priority=priority,
        labels=labels,
        policy=policy,
        id=name,
    )
