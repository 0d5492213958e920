"""The resource model: nodes with GPUs, requests, and allocations, all in integer base units.

    CPU        milli-CPU          (1000 = one core)
    memory     MiB
    GPU        milli-GPU          (1000 = one whole GPU; 1..999 is a share of one GPU)
    GPU memory MiB per GPU

A request asks for CPU and memory and either no GPU, or `gpu_count` distinct GPUs, each granted whole
(`gpu_milli == 1000`) or by the same share (`gpu_milli` 0..999 and/or `gpu_memory_mib`). So "2 GPUs at 30 %" is
`Request(gpu_count=2, gpu_milli=300)` and "1 GPU with 10 GiB" is `Request(gpu_count=1, gpu_memory_mib=10240)`.
Validation happens here, at construction, so the engine never meets a malformed request.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from corral.model.errors import InvalidRequest

MILLI_PER_GPU = 1000

#: Upper bounds of a request's quantities (docs/limits.md). Far beyond any machine, yet small enough that the engine's
#: int64 sums over thousands of nodes cannot overflow: an absurd request is refused by name, not by an OverflowError.
MAX_QUANTITY = {
    "cpu_milli": 10**9,  # a million CPUs
    "memory_mib": 2**40,  # 1 EiB
    "gpu_count": 1024,
    "gpu_milli": MILLI_PER_GPU,
    "gpu_memory_mib": 2**30,  # 1 PiB per GPU
    "min_gpu_memory_mib": 2**30,
}
#: The widest priority anyone may give (a 32-bit integer); the API narrows it for users other than root.
MAX_PRIORITY = 2**31 - 1

#: The request label that overrides the global GPU scheduling behaviour, as in Marathon and Metronome.
GPU_BEHAVIOR_LABEL = "GPU_SCHEDULING_BEHAVIOR"


class GpuBehavior(StrEnum):
    """How work that asks for no GPU treats nodes that still have free GPUs (see `filters.behaviour`)."""

    UNDEFINED = "undefined"  # Marathon's old default: place anywhere, but say so
    UNRESTRICTED = "unrestricted"  # place anywhere
    RESTRICTED = "restricted"  # decline nodes with a free GPU (DeclinedScarceResources)
    PREFERENTIAL = "preferential"  # corral's own: prefer nodes without free GPUs, never eat a free GPU's reserve

    @classmethod
    def parse(cls, value: str, field_name: str = "gpu_behavior") -> GpuBehavior:
        try:
            return cls(value.strip().lower())
        except ValueError:
            allowed = ", ".join(b.value for b in cls)
            raise InvalidRequest(
                field_name, f"unknown GPU scheduling behaviour {value!r}; use one of {allowed}"
            ) from None


class ConstraintOp(StrEnum):
    IS = "IS"  # attribute equals value (Marathon's EQ is read as IS)
    LIKE = "LIKE"  # attribute matches the regular expression (whole string)
    UNLIKE = "UNLIKE"  # attribute is absent or does not match


@dataclass(frozen=True, slots=True)
class Constraint:
    """An attribute constraint over node labels. The attribute `hostname` means the node's name."""

    attribute: str
    op: ConstraintOp
    value: str

    def __post_init__(self) -> None:
        if not self.attribute:
            raise InvalidRequest("constraints.attribute", "must be a non-empty label name")
        if self.op in (ConstraintOp.LIKE, ConstraintOp.UNLIKE):
            try:
                re.compile(self.value)
            except re.error as exc:
                raise InvalidRequest("constraints.value", f"not a regular expression: {self.value!r} ({exc})") from None

    @classmethod
    def parse(cls, attribute: str, op: str, value: str) -> Constraint:
        name = op.strip().upper()
        if name == "EQ":
            name = "IS"
        try:
            operator = ConstraintOp(name)
        except ValueError:
            raise InvalidRequest(
                "constraints.operator", f"unknown operator {op!r}; use one of IS, EQ, LIKE, UNLIKE"
            ) from None
        return cls(attribute, operator, value)

    def matches(self, labels: Mapping[str, str], node_name: str) -> bool:
        actual = node_name if self.attribute == "hostname" else labels.get(self.attribute)
        if self.op is ConstraintOp.IS:
            return actual == self.value
        matched = actual is not None and re.fullmatch(self.value, actual) is not None
        return matched if self.op is ConstraintOp.LIKE else not matched

    def __str__(self) -> str:
        return f"{self.attribute} {self.op.value} {self.value}"


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU of a node. Topology fields are None where unknown."""

    index: int
    model: str
    memory_mib: int = 0  # 0 = unknown (only requests that ask for no GPU memory fit)
    uuid: str = ""
    numa_node: int | None = None
    pcie_switch: int | None = None
    nvlink_peers: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.index < 0:
            raise InvalidRequest("gpu.index", f"must be >= 0, got {self.index}")
        if self.memory_mib < 0:
            raise InvalidRequest("gpu.memory_mib", f"must be >= 0, got {self.memory_mib}")
        if not self.model:
            raise InvalidRequest("gpu.model", "must be a non-empty model name")


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuDevice, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidRequest("node.name", "must be non-empty")
        for name, value in (("cpu_milli", self.cpu_milli), ("memory_mib", self.memory_mib)):
            if value < 0:
                raise InvalidRequest(f"node.{name}", f"must be >= 0, got {value} (node {self.name})")
        indices = [g.index for g in self.gpus]
        if indices != list(range(len(indices))):
            raise InvalidRequest("node.gpus", f"GPU indices must be 0..{len(indices) - 1} in order (node {self.name})")


@dataclass(frozen=True, slots=True)
class Request:
    """What one job, pod or task asks for. Construction validates every field."""

    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_count: int = 0
    gpu_milli: int = 0  # per GPU; 1000 = whole GPUs; 0 with gpu_memory_mib = a share by memory only
    gpu_memory_mib: int = 0  # per GPU, for shares; whole GPUs take all of each GPU's memory
    gpu_models: frozenset[str] | None = None  # allowed GPU models; None = any
    min_gpu_memory_mib: int = 0  # only GPUs with at least this much memory in total
    constraints: tuple[Constraint, ...] = ()
    priority: int = 0
    gpu_behavior: GpuBehavior | None = None  # overrides the global behaviour (for work without GPUs)
    labels: Mapping[str, str] = field(default_factory=dict)
    policy: str | None = None  # overrides the global policy
    id: str = ""
    #: Shares of one GPU that carry an owner go only to GPUs whose other shares have the same owner (MPS serves one
    #: Unix user per GPU at a time). Empty: no such rule. Whole GPUs ignore it.
    share_owner: str = ""

    def __post_init__(self) -> None:
        for name in (
            "cpu_milli",
            "memory_mib",
            "gpu_count",
            "gpu_milli",
            "gpu_memory_mib",
            "min_gpu_memory_mib",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidRequest(name, f"must be a whole number, got {value!r}")
            if value < 0:
                raise InvalidRequest(name, f"must be >= 0, got {value}")
            if value > MAX_QUANTITY[name] and name != "gpu_milli":
                raise InvalidRequest(name, f"must be at most {MAX_QUANTITY[name]}, got {value}")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool) or abs(self.priority) > MAX_PRIORITY:
            raise InvalidRequest("priority", f"must be a whole number in -{MAX_PRIORITY}..{MAX_PRIORITY}")
        if self.gpu_milli > MILLI_PER_GPU:
            raise InvalidRequest(
                "gpu_milli",
                f"must be in 0..{MILLI_PER_GPU} per GPU (1000 = a whole GPU), got {self.gpu_milli}",
            )
        if self.gpu_count == 0:
            if self.gpu_milli or self.gpu_memory_mib:
                raise InvalidRequest(
                    "gpu_count",
                    "is 0 but a GPU share was asked for (gpu_milli/gpu_memory_mib); ask for at least 1 GPU",
                )
            if self.gpu_models is not None or self.min_gpu_memory_mib:
                raise InvalidRequest("gpu_count", "is 0 but a GPU model or GPU memory minimum was given")
        else:
            if self.gpu_milli == 0 and self.gpu_memory_mib == 0:
                raise InvalidRequest(
                    "gpu_milli",
                    f"a GPU request needs gpu_milli in 1..{MILLI_PER_GPU} and/or gpu_memory_mib > 0",
                )
            if self.gpu_milli == MILLI_PER_GPU and self.gpu_memory_mib:
                raise InvalidRequest(
                    "gpu_memory_mib",
                    "a whole GPU takes all of its memory; give gpu_memory_mib only for shares",
                )
        if self.gpu_models is not None and (not self.gpu_models or not all(self.gpu_models)):
            raise InvalidRequest("gpu_models", "must name at least one non-empty GPU model (or be omitted)")
        if self.cpu_milli == 0 and self.memory_mib == 0 and self.gpu_count == 0:
            raise InvalidRequest("request", "asks for nothing: give CPU, memory or GPUs")

    @property
    def wants_gpu(self) -> bool:
        return self.gpu_count > 0

    @property
    def whole_gpus(self) -> bool:
        return self.gpu_milli == MILLI_PER_GPU

    @property
    def gpu_demand_milli(self) -> int:
        """Total GPU compute asked for: k x per-GPU milli."""
        return self.gpu_count * self.gpu_milli

    def placement_key(self) -> tuple[object, ...]:
        """Everything but the id and priority that decides where this request can go: two requests with the same
        key fit the same nodes, so a failure of one within a scheduling round is a failure of the other."""
        return (
            self.cpu_milli,
            self.memory_mib,
            self.gpu_count,
            self.gpu_milli,
            self.gpu_memory_mib,
            self.gpu_models,
            self.min_gpu_memory_mib,
            self.constraints,
            self.gpu_behavior,
            tuple(sorted(self.labels.items())),
            self.policy,
            self.share_owner,
        )

    def effective_behavior(self, default: GpuBehavior) -> GpuBehavior:
        """The explicit override, else the `GPU_SCHEDULING_BEHAVIOR` label, else the global mode.

        As in Marathon, a label value that is not a known behaviour is ignored; `undefined` cannot be asked for
        per request (it is only ever a global default).
        """
        if self.gpu_behavior is not None:
            return self.gpu_behavior
        label = self.labels.get(GPU_BEHAVIOR_LABEL)
        if label is not None:
            value = label.strip().lower()
            if value in {"restricted", "unrestricted", "preferential"}:
                return GpuBehavior(value)
        return default

    def describe_gpus(self) -> str:
        """'2 whole GPUs', '1 GPU at 30 %', '1 GPU with 10240 MiB', 'no GPU'."""
        if not self.wants_gpu:
            return "no GPU"
        noun = "GPU" if self.gpu_count == 1 else "GPUs"
        if self.whole_gpus:
            return f"{self.gpu_count} whole {noun}"
        parts = []
        if self.gpu_milli:
            parts.append(f"at {self.gpu_milli / 10:g} %")
        if self.gpu_memory_mib:
            parts.append(f"with {self.gpu_memory_mib} MiB")
        return f"{self.gpu_count} {noun} " + " and ".join(parts)


@dataclass(frozen=True, slots=True)
class GpuGrant:
    index: int
    milli: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class Allocation:
    """Where a request was placed: the node, and per GPU the milli and memory granted."""

    request_id: str
    node: str
    node_index: int
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuGrant, ...] = ()
    #: GpuClustering's affinity tag: 0 = no GPU, -1 = a share of one GPU, k = k whole GPUs.
    tag: int = 0
    #: The request's `share_owner` for shares that carry one: their GPUs then serve only that owner's shares.
    share_owner: str = ""

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus)


def affinity_tag(request: Request) -> int:
    """The GpuClustering tag of a request: 0 no GPU, -1 a share of one GPU, k for k whole GPUs (or k shares)."""
    if not request.wants_gpu:
        return 0
    if request.gpu_count == 1 and not request.whole_gpus:
        return -1
    return request.gpu_count
