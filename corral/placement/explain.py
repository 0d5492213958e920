"""Explanations: what the engine looked at and why, as data, and the one renderer every face uses.

    0/1213 nodes fit: 900 insufficient GPU (need 2 whole GPUs), 300 GPU model not in [T4], 13 DeclinedScarceResources

Counts in that sentence are per node's *primary* reason, so they add up to the nodes evaluated; `failing` keeps
every dimension that failed on any node (a node short of CPU and of GPU counts under both).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from corral.model.resources import Constraint, Request
from corral.placement.reasons import Reason, reasons_of


@dataclass(frozen=True, slots=True)
class Shortfall:
    """A resolvable dimension: what was needed, the most any node rejected on it had, on how many nodes."""

    reason: Reason
    need: int
    best: int
    unit: str
    nodes: int

    def render(self) -> str:
        return f"{_DIMENSION[self.reason]}: need {self.need}{self.unit}, at most {self.best}{self.unit} free"


_DIMENSION = {
    Reason.INSUFFICIENT_CPU: "CPU",
    Reason.INSUFFICIENT_MEMORY: "memory",
    Reason.INSUFFICIENT_GPU: "GPU",
}


def reason_labels(request: Request) -> dict[Reason, str]:
    """The words for each reason, with the request's numbers in them (a new dict: the caller's to keep)."""
    # Composed once per request shape: twelve formatted sentences per decision cost as much as a filter pass.
    return dict(
        _labels(
            request.cpu_milli,
            request.memory_mib,
            request.gpu_count,
            request.gpu_milli,
            request.gpu_memory_mib,
            request.gpu_models,
            request.min_gpu_memory_mib,
            request.constraints,
        )
    )


@functools.lru_cache(maxsize=1024)
def _labels(
    cpu_milli: int,
    memory_mib: int,
    gpu_count: int,
    gpu_milli: int,
    gpu_memory_mib: int,
    gpu_models: frozenset[str] | None,
    min_gpu_memory_mib: int,
    constraints: tuple[Constraint, ...],
) -> dict[Reason, str]:
    request = Request(
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        gpu_count=gpu_count,
        gpu_milli=gpu_milli,
        gpu_memory_mib=gpu_memory_mib,
        gpu_models=gpu_models,
        min_gpu_memory_mib=min_gpu_memory_mib,
        constraints=constraints,
    )
    models = ", ".join(sorted(request.gpu_models)) if request.gpu_models else ""
    gpu_mem = max(request.min_gpu_memory_mib, request.gpu_memory_mib)
    k = request.gpu_count
    return {
        Reason.CONSTRAINT: "constraint not met (" + "; ".join(str(c) for c in request.constraints) + ")",
        Reason.NO_GPUS: "no GPUs",
        Reason.GPU_MODEL: f"GPU model not in [{models}]",
        Reason.GPU_MEMORY: f"no GPU with {gpu_mem} MiB" + (f" of model [{models}]" if models else ""),
        Reason.TOO_FEW_GPUS: f"fewer than {k} eligible GPUs",
        Reason.CPU_CAPACITY: f"CPU capacity below {request.cpu_milli}m",
        Reason.MEMORY_CAPACITY: f"memory capacity below {request.memory_mib} MiB",
        Reason.INSUFFICIENT_CPU: f"insufficient CPU (need {request.cpu_milli}m)",
        Reason.INSUFFICIENT_MEMORY: f"insufficient memory (need {request.memory_mib} MiB)",
        Reason.INSUFFICIENT_GPU: f"insufficient GPU (need {request.describe_gpus()})",
        Reason.DECLINED_SCARCE: "DeclinedScarceResources",
        Reason.GPU_RESERVE: "GPU reserve (CPU/memory kept for free GPUs)",
    }


@dataclass(frozen=True)
class Explanation:
    request: str  # the request's GPU ask in words
    policy: str
    behavior: str
    nodes_evaluated: int
    nodes_feasible: int
    rejected: tuple[tuple[Reason, int], ...]  # primary reason -> nodes, most frequent first
    failing: tuple[tuple[Reason, int], ...]  # every failing dimension -> nodes
    unresolvable_nodes: int  # rejected nodes where waiting or preemption can never help
    shortfalls: tuple[Shortfall, ...]
    top: tuple[tuple[str, float], ...]  # best nodes and their scores, in selection order
    chosen: str | None
    gpus: tuple[int, ...]
    labels: Mapping[Reason, str]
    notes: tuple[str, ...] = ()

    @property
    def placed(self) -> bool:
        return self.chosen is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "request": self.request,
            "policy": self.policy,
            "behavior": self.behavior,
            "nodes_evaluated": self.nodes_evaluated,
            "nodes_feasible": self.nodes_feasible,
            "rejected": [{"reason": r.name, "text": self.labels[r], "nodes": n} for r, n in self.rejected],
            "failing": [{"reason": r.name, "nodes": n} for r, n in self.failing],
            "unresolvable_nodes": self.unresolvable_nodes,
            "shortfalls": [
                {"reason": s.reason.name, "need": s.need, "best": s.best, "unit": s.unit, "nodes": s.nodes}
                for s in self.shortfalls
            ],
            "top": [{"node": n, "score": s} for n, s in self.top],
            "chosen": self.chosen,
            "gpus": list(self.gpus),
            "notes": list(self.notes),
            "summary": render(self),
        }


def _fmt(score: float) -> str:
    return f"{score:.6g}"


def render(e: Explanation) -> str:
    """One sentence for the CLI, the API, the extender's FailedNodes and the simulator alike."""
    head = f"{e.nodes_feasible}/{e.nodes_evaluated} nodes fit"
    rejected = ", ".join(f"{n} {e.labels[r]}" for r, n in e.rejected)
    if e.chosen is None:
        return f"{head}: {rejected}" if rejected else head
    where = e.chosen + (f" GPU {','.join(str(g) for g in e.gpus)}" if e.gpus else "")
    score = f" ({e.policy} score {_fmt(e.top[0][1])})" if e.top else ""
    text = f"{head}; chose {where}{score}"
    if rejected:
        text += f"; rejected: {rejected}"
    return text


def render_long(e: Explanation) -> str:
    """The sentence plus shortfalls, every failing dimension, the top scores and notes, one per line."""
    lines = [render(e)]
    if e.shortfalls:
        lines.append("short: " + "; ".join(s.render() for s in e.shortfalls))
    if dict(e.failing) != dict(e.rejected):
        lines.append("failing dimensions: " + ", ".join(f"{n} {e.labels[r]}" for r, n in e.failing))
    if e.unresolvable_nodes:
        lines.append(f"{e.unresolvable_nodes} nodes can never fit this request")
    if e.top:
        lines.append("top: " + ", ".join(f"{n} {_fmt(s)}" for n, s in e.top))
    lines.extend(f"note: {n}" for n in e.notes)
    return "\n".join(lines)


def node_reason_text(bits: int, labels: Mapping[Reason, str]) -> str:
    """Every reason one node was rejected, for per-node answers (the Kubernetes extender's FailedNodes)."""
    return ", ".join(labels[r] for r in reasons_of(bits))
