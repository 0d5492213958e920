"""Kubernetes objects <-> corral's model: the only place Kubernetes units and names are read or written.

    Pod JSON (as kube-scheduler sends it)  --pod_request-->  Request (cpu milli, memory MiB, GPU milli/MiB)
    Node JSON (allocatable + annotations)  --node_from_k8s-> Node (GPUs from the device plugin's annotation)
    Allocation                             --assignment_annotations-> pod annotations (what the device plugin reads)
    pod annotations                        --parse_assignment-> Assignment (state rebuilt after a restart)

GPU resource styles, one per pod (mixing them is an error):

    corral.dev/gpu: N                          N whole GPUs
    corral.dev/gpu-milli: M (1..1000)          a share of M/1000 of a GPU ...
    corral.dev/gpu-memory: MiB                 ... and/or of this much GPU memory; annotation corral.dev/gpu-count
                                               asks for that share on several GPUs (default 1)
    elasticgpu.io/gpu-core: 100 x cards        100 = one card, 200 = two; 1..99 = a share of one card
    elasticgpu.io/gpu-memory: MiB              GPU memory (with gpu-core < 100, or alone: a share of one card)
    nvidia.com/gpu: N                          N whole GPUs
    HAMi's (nvidia.com/gpu: N vGPUs, each on its own GPU, with any of):
      nvidia.com/gpumem: MiB                   GPU memory per GPU
      nvidia.com/gpumem-percentage: 1..100     percent of each GPU's memory (default 100: the GPU's memory, so the
                                               GPU alone); resolved to MiB against the cluster's GPUs (`gpu_memory`)
      nvidia.com/gpucores: 0..100              percent of each GPU's compute (100: the GPU alone)
    keti.com/mpsgpu: N                         N GPUs shared with MPS; memory per GPU from annotation GPUrequest
                                               (or GPUlimits), in MiB or as a quantity; without it, whole GPUs

Extended resources cannot be over-committed in Kubernetes, so for them a request and a limit must agree; a pod
usually gives only the limit.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson

from corral.model.errors import InvalidRequest
from corral.model.resources import MILLI_PER_GPU, Allocation, GpuBehavior, GpuDevice, GpuGrant, Node, Request

# ---------------------------------------------------------------------------------------------------- names
DOMAIN = "corral.dev"
GPU = f"{DOMAIN}/gpu"
GPU_MILLI = f"{DOMAIN}/gpu-milli"
GPU_MEMORY = f"{DOMAIN}/gpu-memory"
ELASTIC_CORE = "elasticgpu.io/gpu-core"
ELASTIC_MEMORY = "elasticgpu.io/gpu-memory"
NVIDIA_GPU = "nvidia.com/gpu"
NVIDIA_GPUMEM = "nvidia.com/gpumem"
NVIDIA_GPUMEM_PERCENT = "nvidia.com/gpumem-percentage"
NVIDIA_GPUCORES = "nvidia.com/gpucores"
#: HAMi's share resources beside nvidia.com/gpu: a pod that gives any of them is of the "hami" style.
HAMI_RESOURCES = (NVIDIA_GPUMEM, NVIDIA_GPUMEM_PERCENT, NVIDIA_GPUCORES)
KETI_MPSGPU = "keti.com/mpsgpu"
#: The phases of a pod that has ended: it holds nothing any more.
TERMINAL_PHASES = frozenset(("Succeeded", "Failed"))

#: Every GPU resource corral understands, by style.
STYLES: dict[str, tuple[str, ...]] = {
    "corral": (GPU, GPU_MILLI, GPU_MEMORY),
    "elasticgpu": (ELASTIC_CORE, ELASTIC_MEMORY),
    "nvidia": (NVIDIA_GPU, *HAMI_RESOURCES),  # HAMi's resources are nvidia.com/gpu's family
    "keti": (KETI_MPSGPU,),
}
GPU_RESOURCES: frozenset[str] = frozenset(r for names in STYLES.values() for r in names)
_STYLE_OF = {r: style for style, names in STYLES.items() for r in names}

# Pod annotations a user sets.
ANN_POLICY = f"{DOMAIN}/policy"
ANN_BEHAVIOR = f"{DOMAIN}/gpu-behavior"
ANN_GPU_COUNT = f"{DOMAIN}/gpu-count"
ANN_GPU_MODEL = f"{DOMAIN}/gpu-model"
ANN_MIN_GPU_MEMORY = f"{DOMAIN}/min-gpu-memory"
ANN_KETI_REQUEST = "GPUrequest"
ANN_KETI_LIMITS = "GPUlimits"
# HAMi's pod annotations that change placement
ANN_HAMI_USE_TYPE = "nvidia.com/use-gputype"
ANN_HAMI_NOUSE_TYPE = "nvidia.com/nouse-gputype"
ANN_HAMI_USE_UUID = "nvidia.com/use-gpuuuid"
ANN_HAMI_NOUSE_UUID = "nvidia.com/nouse-gpuuuid"
ANN_HAMI_NODE_POLICY = "hami.io/node-scheduler-policy"
ANN_HAMI_GPU_POLICY = "hami.io/gpu-scheduler-policy"
#: HAMi's policy names -> corral's policies (HAMi's node level first; its GPU level where no node level is given)
HAMI_POLICIES = {
    ANN_HAMI_NODE_POLICY: {"binpack": "binpack", "spread": "spread"},
    ANN_HAMI_GPU_POLICY: {"binpack": "binpack", "spread": "spread", "topology-aware": "topology"},
}
# Pod annotations corral writes at bind (the device plugin and a restarted extender read them).
ANN_ASSIGNMENT = f"{DOMAIN}/assignment"
ANN_ELASTIC_ASSUMED = "elasticgpu.io/assumed"
ANN_ELASTIC_CONTAINER = "elasticgpu.io/container-"
ANN_KETI_UUID = "UUID"
ANN_HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
# Node annotations and labels the device plugin publishes.
ANN_NODE_GPUS = f"{DOMAIN}/gpus"
ANN_NODE_UTILIZATION = f"{DOMAIN}/gpu-utilization"
LABEL_GPU_MODEL = f"{DOMAIN}/gpu.model"
LABEL_GPU_COUNT = f"{DOMAIN}/gpu.count"

ELASTIC_CORE_PER_CARD = 100

# ---------------------------------------------------------------------------------------------------- quantities
_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$"
)
_SUFFIX = {
    None: Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_MIB = Decimal(2) ** 20
#: The largest quantity read (2^63, Kubernetes' own int64 bound) and the largest amount in corral's units (milli-CPU,
#: MiB, GPUs): far beyond any machine, and small enough that the engine's int64 sums and products (x1000) never
#: overflow. A bigger value is refused as "too large" at the field, instead of failing deep in the engine.
MAX_QUANTITY = Decimal(2) ** 63
MAX_UNITS = 2**50
_MAX_EXPONENT = 30  # "1e400" needs no exact arithmetic to be called too large
_QUANTITY_TEXT = 64  # characters: longer is no quantity anyone writes


def _too_large(field: str, value: object) -> InvalidRequest:
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    return InvalidRequest(field, f"too large: {shown}")


def parse_quantity(value: object, field: str) -> Decimal:
    """A Kubernetes quantity ("500m", "4Gi", "1e3", 2) as an exact Decimal; negative, malformed or beyond
    MAX_QUANTITY -> InvalidRequest."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise InvalidRequest(field, f"not a Kubernetes quantity: {value!r}")
    if isinstance(value, int) and abs(value) > MAX_QUANTITY:
        raise _too_large(field, value)
    text = str(value).strip() if not isinstance(value, float) else repr(value)
    m = _QUANTITY.match(text) if len(text) <= _QUANTITY_TEXT else None
    if m is None:
        if len(text) > _QUANTITY_TEXT and re.fullmatch(r"[0-9]+", text):
            raise _too_large(field, value)
        shown = repr(value) if len(text) <= _QUANTITY_TEXT else repr(text[:20]) + "..."
        raise InvalidRequest(field, f"not a Kubernetes quantity: {shown} (examples: 2, 500m, 4Gi, 1e3)")
    number, suffix = m.group(1), m.group(2)
    try:
        if suffix is not None and suffix[0] in "eE":
            exponent = int(suffix[1:])
            if Decimal(number) == 0:
                amount = Decimal(0)
            elif exponent > _MAX_EXPONENT:
                raise _too_large(field, value)
            else:
                amount = Decimal(number) * (Decimal(10) ** max(exponent, -_MAX_EXPONENT))
        else:
            amount = Decimal(number) * _SUFFIX[suffix]
    except (ArithmeticError, KeyError):  # decimal's InvalidOperation and Overflow are ArithmeticErrors
        raise InvalidRequest(field, f"not a Kubernetes quantity: {value!r}") from None
    if amount < 0:
        raise InvalidRequest(field, f"must not be negative, got {value!r}")
    if amount > MAX_QUANTITY:
        raise _too_large(field, value)
    return amount


def _units(amount: int, field: str, value: object) -> int:
    """An amount in corral's units, refused when beyond MAX_UNITS."""
    if amount > MAX_UNITS:
        raise _too_large(field, value)
    return amount


def cpu_milli(value: object, field: str) -> int:
    """CPU quantity -> milli-CPU, rounded up as Kubernetes does ("1" -> 1000, "250m" -> 250, "0.1" -> 100)."""
    return _units(math.ceil(parse_quantity(value, field) * 1000), field, value)


def memory_mib(value: object, field: str) -> int:
    """Memory quantity in bytes -> MiB, rounded up ("4Gi" -> 4096, "1G" -> 954)."""
    return _units(math.ceil(parse_quantity(value, field) / _MIB), field, value)


def whole_number(value: object, field: str) -> int:
    """An extended-resource count: a whole number ("2", 2); "500m" or "1.5" is an error."""
    amount = parse_quantity(value, field)
    if amount != amount.to_integral_value():
        raise InvalidRequest(field, f"must be a whole number, got {value!r}")
    return _units(int(amount), field, value)


def mib_amount(value: object, field: str) -> int:
    """A GPU memory amount given as a count of MiB (the peers' unit): "256" -> 256; "4Gi" is read as bytes -> 4096."""
    text = str(value).strip()
    if re.fullmatch(r"[0-9]{1,20}", text):
        return _units(int(text), field, value)
    return memory_mib(value, field)


# ---------------------------------------------------------------------------------------------------- pods
def pod_key(pod: Mapping[str, Any]) -> str:
    """The id corral uses for a pod: its UID, else namespace/name (objects in tests may lack a UID)."""
    meta = _meta(pod)
    uid = meta.get("uid")
    if uid:
        return str(uid)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def pod_name(pod: Mapping[str, Any]) -> str:
    meta = _meta(pod)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """An object's metadata; {} where it is missing or no object (pod_request names that error)."""
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


@dataclass(frozen=True)
class GpuAsk:
    """What one container asks for in GPUs, in corral units (whole GPUs: milli 1000)."""

    container: str
    count: int
    milli: int
    memory_mib: int
    style: str


@dataclass(frozen=True)
class PodAsk:
    request: Request
    containers: tuple[GpuAsk, ...]  # containers that ask for GPUs, in spec order
    style: str | None  # the GPU resource style, None for pods without GPUs


def _mapping(value: Any, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidRequest(field, f"must be an object, got {type(value).__name__}")
    return value


def extended_amount(resources: Mapping[str, Any], name: str, where: str) -> object | None:
    """The amount of an extended resource (limit, else request), validated as a quantity where it was given."""
    limits = _mapping(resources.get("limits"), f"{where}.limits")
    requests = _mapping(resources.get("requests"), f"{where}.requests")
    lim, req = limits.get(name), requests.get(name)
    lim_q = None if lim is None else parse_quantity(lim, f"{where}.limits[{name}]")
    req_q = None if req is None else parse_quantity(req, f"{where}.requests[{name}]")
    if lim_q is not None and req_q is not None and lim_q != req_q:
        raise InvalidRequest(
            f"{where}[{name}]",
            f"request {req!r} and limit {lim!r} differ; extended resources cannot be over-committed, give one value",
        )
    return lim if lim is not None else req


@dataclass(frozen=True)
class _Gpus:
    """What a pod may use of the cluster's GPUs, for HAMi's forms that depend on them."""

    models: frozenset[str] | None  # the pod's allowed models (None: any)
    memory: Mapping[str, int] | None  # model -> the largest memory of a GPU of that model here; None: not known
    bound: bool = False  # the pod is on a node already: count it, refuse nothing that only placement needs

    def largest(self) -> int | None:
        """The largest memory of a GPU the pod may use; None where no such GPU is known."""
        if self.memory is None:
            return None
        sizes = [m for model, m in self.memory.items() if m > 0 and (self.models is None or model in self.models)]
        return max(sizes) if sizes else None

    def which(self) -> str:
        return "" if self.models is None else f" of {', '.join(sorted(self.models))}"


def gpu_memory_by_model(nodes: Iterable[Node]) -> dict[str, int]:
    """The cluster's GPU models and the largest memory of a GPU of each (MiB): what `pod_request` needs to read
    HAMi's percentages of GPU memory and its GPU type annotations (`nodes`: corral Nodes)."""
    out: dict[str, int] = {}
    for node in nodes:
        for g in node.gpus:
            out[g.model] = max(out.get(g.model, 0), g.memory_mib)
    return out


def percent(value: object, field: str, what: str, *, zero: bool) -> int:
    """A whole percentage 0..100 (1..100 unless `zero`) of one GPU."""
    amount = whole_number(value, field)
    low = 0 if zero else 1
    if not low <= amount <= 100:
        raise InvalidRequest(field, f"must be {low}..100 (percent of {what}), got {value!r}")
    return amount


def _hami_gpu(name: str, given: Mapping[str, object], where: str, gpus: _Gpus) -> GpuAsk:
    """HAMi's vGPU request -> corral's: N GPUs, each whole or by the same share (pkg/device/nvidia in HAMi: memory
    in MiB wins over a percentage; neither means 100 % of the memory; cores default to 0)."""

    def field(res: str) -> str:
        return f"{where}.resources[{res}]"

    count = whole_number(given[NVIDIA_GPU], field(NVIDIA_GPU)) if NVIDIA_GPU in given else 1  # HAMi's defaultGPUNum
    cores = percent(given[NVIDIA_GPUCORES], field(NVIDIA_GPUCORES), "a GPU's compute", zero=True) if (
        NVIDIA_GPUCORES in given) else 0  # fmt: skip
    largest = gpus.largest()
    share = percent(given.get(NVIDIA_GPUMEM_PERCENT, 100), field(NVIDIA_GPUMEM_PERCENT), "a GPU's memory",
                    zero=False)  # fmt: skip
    if NVIDIA_GPUMEM in given:
        memory = mib_amount(given[NVIDIA_GPUMEM], field(NVIDIA_GPUMEM))
        if not gpus.bound and largest is not None and memory > largest:
            raise InvalidRequest(
                field(NVIDIA_GPUMEM),
                f"{memory} MiB is more than any GPU here has (the largest{gpus.which()}: {largest} MiB)",
            )
    else:
        if share == 100:
            return GpuAsk(name, count, MILLI_PER_GPU, 0, "hami")  # all its memory: nothing else fits beside it
        if largest is None and gpus.bound:
            return GpuAsk(name, count, MILLI_PER_GPU, 0, "hami")  # counted whole rather than not at all
        if largest is None:
            raise InvalidRequest(
                field(NVIDIA_GPUMEM_PERCENT),
                f"a percentage of GPU memory needs the cluster's GPUs, and no GPU{gpus.which()} is known here; "
                f"give {NVIDIA_GPUMEM} in MiB",
            )
        memory = -(-largest * share // 100)
    if cores == 100:
        return GpuAsk(name, count, MILLI_PER_GPU, 0, "hami")  # HAMi's exclusive GPU: nothing else shares it
    return GpuAsk(name, count, cores * MILLI_PER_GPU // 100, memory, "hami")


def _container_gpu(
    container: Mapping[str, Any], where: str, annotations: Mapping[str, str], gpus: _Gpus
) -> GpuAsk | None:
    resources = _mapping(container.get("resources"), f"{where}.resources")
    name = str(container.get("name") or "")
    given: dict[str, object] = {}
    for res in GPU_RESOURCES:
        value = extended_amount(resources, res, f"{where}.resources")
        if value is not None:
            given[res] = value
    given = {r: v for r, v in given.items() if parse_quantity(v, f"{where}.resources[{r}]") != 0}
    if not given:
        return None
    styles = sorted({_STYLE_OF[r] for r in given})
    if len(styles) > 1:
        raise InvalidRequest(
            f"{where}.resources",
            f"mixes GPU resource styles ({', '.join(sorted(given))}); use one of corral.dev/*, elasticgpu.io/*, "
            f"{NVIDIA_GPU} (with HAMi's {', '.join(HAMI_RESOURCES)}) or {KETI_MPSGPU}",
        )
    style = styles[0]

    def field(res: str) -> str:
        return f"{where}.resources[{res}]"

    if style == "nvidia":
        if any(r in given for r in HAMI_RESOURCES):
            raw = extended_amount(resources, NVIDIA_GPU, f"{where}.resources")
            if raw is not None and NVIDIA_GPU not in given:
                raise InvalidRequest(field(NVIDIA_GPU), f"is 0 but {', '.join(sorted(given))} asks for a GPU share")
            return _hami_gpu(name, given, where, gpus)
        return GpuAsk(name, whole_number(given[NVIDIA_GPU], field(NVIDIA_GPU)), MILLI_PER_GPU, 0, style)
    if style == "keti":
        count = whole_number(given[KETI_MPSGPU], field(KETI_MPSGPU))
        text = annotations.get(ANN_KETI_REQUEST) or annotations.get(ANN_KETI_LIMITS)
        if not text:
            return GpuAsk(name, count, MILLI_PER_GPU, 0, style)
        return GpuAsk(name, count, 0, mib_amount(text, f"metadata.annotations[{ANN_KETI_REQUEST}]"), style)
    if style == "elasticgpu":
        core = whole_number(given[ELASTIC_CORE], field(ELASTIC_CORE)) if ELASTIC_CORE in given else 0
        mem = resource_mib(given[ELASTIC_MEMORY], field(ELASTIC_MEMORY)) if ELASTIC_MEMORY in given else 0
        if core >= ELASTIC_CORE_PER_CARD:
            if core % ELASTIC_CORE_PER_CARD:
                raise InvalidRequest(
                    field(ELASTIC_CORE),
                    f"{core} is more than one card but not a whole number of cards; "
                    f"use 1..99 for a share of one card or a multiple of {ELASTIC_CORE_PER_CARD}",
                )
            if mem:
                raise InvalidRequest(
                    field(ELASTIC_MEMORY), "whole cards (gpu-core >= 100) take all their memory; drop gpu-memory"
                )
            return GpuAsk(name, core // ELASTIC_CORE_PER_CARD, MILLI_PER_GPU, 0, style)
        return GpuAsk(name, 1, core * MILLI_PER_GPU // ELASTIC_CORE_PER_CARD, mem, style)
    # corral's own names
    if GPU in given:
        if GPU_MILLI in given or GPU_MEMORY in given:
            raise InvalidRequest(
                f"{where}.resources",
                f"{GPU} (whole GPUs) cannot be combined with {GPU_MILLI}/{GPU_MEMORY} (a share); for a share on "
                f"several GPUs set the annotation {ANN_GPU_COUNT}",
            )
        return GpuAsk(name, whole_number(given[GPU], field(GPU)), MILLI_PER_GPU, 0, style)
    milli = whole_number(given[GPU_MILLI], field(GPU_MILLI)) if GPU_MILLI in given else 0
    if milli > MILLI_PER_GPU:
        raise InvalidRequest(field(GPU_MILLI), f"must be 1..{MILLI_PER_GPU} per GPU, got {milli}; for more use {GPU}")
    mem = resource_mib(given[GPU_MEMORY], field(GPU_MEMORY)) if GPU_MEMORY in given else 0
    count_text = annotations.get(ANN_GPU_COUNT, "1")
    count = whole_number(count_text, f"metadata.annotations[{ANN_GPU_COUNT}]")
    if count < 1:
        raise InvalidRequest(f"metadata.annotations[{ANN_GPU_COUNT}]", f"must be >= 1, got {count_text!r}")
    return GpuAsk(name, count, milli, mem, style)


_BINARY_SUFFIXES = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def resource_mib(value: object, field: str) -> int:
    """A GPU memory extended resource (corral.dev/gpu-memory, elasticgpu.io/gpu-memory): a count of MiB, one device-
    plugin unit each. kube-apiserver stores a quantity in canonical form, so the pod kube-scheduler sends says "30k"
    for a count of 30000 (and "2048k" for 2048000): a decimal suffix or exponent is still a count of MiB. Only a
    binary suffix ("10Gi") is read as bytes."""
    if isinstance(value, str) and value.strip().endswith(_BINARY_SUFFIXES):
        return memory_mib(value, field)
    return _units(math.ceil(parse_quantity(value, field)), field, value)


def memory_amount_mib(value: object, field: str) -> int:
    """corral.dev/gpu-memory counts MiB (one device-plugin unit = 1 MiB), so a bare number is MiB, not bytes."""
    return mib_amount(value, field)


def _cpu_mem(containers: list[Mapping[str, Any]], where: str) -> tuple[int, int]:
    cpu = mem = 0
    for i, c in enumerate(containers):
        res = _mapping(c.get("resources"), f"{where}[{i}].resources")
        requests = _mapping(res.get("requests"), f"{where}[{i}].resources.requests")
        limits = _mapping(res.get("limits"), f"{where}[{i}].resources.limits")
        # Kubernetes defaults a missing request to the limit.
        c_cpu = requests.get("cpu", limits.get("cpu"))
        c_mem = requests.get("memory", limits.get("memory"))
        if c_cpu is not None:
            cpu += cpu_milli(c_cpu, f"{where}[{i}].resources.requests.cpu")
        if c_mem is not None:
            mem += memory_mib(c_mem, f"{where}[{i}].resources.requests.memory")
    return cpu, mem


def _containers(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = spec.get(key) or []
    if not isinstance(items, list) or not all(isinstance(c, Mapping) for c in items):
        raise InvalidRequest(f"spec.{key}", "must be a list of container objects")
    return items


#: Pod shapes kept by pod_request (the most recently used).
SHAPES_KEPT = 512
_shapes: OrderedDict[bytes, PodAsk] = OrderedDict()
_shapes_lock = threading.Lock()


#: Annotations bind writes (per pod, never read by pod_request): left out of a pod's shape.
_WRITTEN = frozenset(
    {ANN_ASSIGNMENT, ANN_ELASTIC_ASSUMED, ANN_KETI_UUID, ANN_HAMI_ALLOCATED,
     "kubectl.kubernetes.io/last-applied-configuration"}
)  # fmt: skip


def _shape(pod: Any, min_cpu_milli: int, gpu_memory: Mapping[str, int] | None) -> bytes | None:
    """Everything of a pod that pod_request reads, but its name and UID, as one key (None: not a well-formed pod;
    that one is read in full, and refused with the field named)."""
    try:
        meta, spec = pod["metadata"], pod["spec"]
        containers, init = spec["containers"], spec.get("initContainers") or []
        if not isinstance(containers, list) or not isinstance(init, list):
            return None
        annotations = meta.get("annotations")
        if annotations and _WRITTEN & annotations.keys():
            # corral's own assignment (and its peers' copies) differ per pod and pod_request reads none of them:
            # without this every bound pod is a shape of its own, read in full at each watch event
            annotations = {k: v for k, v in annotations.items() if k not in _WRITTEN}
        return orjson.dumps(
            [min_cpu_milli, annotations, [[c.get("name"), c.get("resources")] for c in containers],
             [[c.get("name"), c.get("resources")] for c in init], spec.get("overhead"), spec.get("priority", 0),
             None if gpu_memory is None else sorted(gpu_memory.items()), bool(spec.get("nodeName"))],
            option=orjson.OPT_SORT_KEYS,
        )  # fmt: skip
    except (KeyError, TypeError, AttributeError, orjson.JSONEncodeError):
        return None


_REQUEST_FIELDS = tuple(f.name for f in dataclasses.fields(Request))


def _with_id(request: Request, id_: str) -> Request:
    """`request` under another id. dataclasses.replace would validate every field again (a fifth of a cached
    pod_request, and of rebuilding the books from 50,000 pods at a restart); the fields are the checked ones."""
    out = object.__new__(Request)
    for name in _REQUEST_FIELDS:
        object.__setattr__(out, name, getattr(request, name))
    object.__setattr__(out, "id", id_)
    return out


def pod_request(pod: Any, *, min_cpu_milli: int = 1, gpu_memory: Mapping[str, int] | None = None) -> PodAsk:
    """A Pod object -> corral Request (+ which containers get GPUs). Raises InvalidRequest naming the field.

    CPU and memory follow Kubernetes: the sum over containers, at least the largest init container, plus the pod
    overhead. A pod that asks for nothing at all is given `min_cpu_milli` so that the engine can place it.

    Pods of one shape (a Deployment's, a Job's: the same resources and annotations) are read once: the next gets the
    same answer under its own id. Reading a pod in full costs about 0.15 ms, and every pod is read at filter and
    again at each watch event of it once it is bound (docs/kubernetes.md, "Throughput").

    `gpu_memory` (`gpu_memory_by_model` of the cluster's nodes) is what HAMi's forms that depend on the cluster need:
    a percentage of GPU memory, GPU types matched by part of their name, a gpumem no GPU has. Without it those are
    refused (a percentage, nvidia.com/nouse-gputype) or read as given (nvidia.com/use-gputype as exact models).
    """
    key = _shape(pod, min_cpu_milli, gpu_memory)
    if key is not None:
        with _shapes_lock:
            known = _shapes.get(key)
            if known is not None:
                _shapes.move_to_end(key)
        if known is not None:
            request = _with_id(known.request, pod_key(pod))
            return PodAsk(request, known.containers, known.style)
    ask = _pod_request(pod, min_cpu_milli, gpu_memory)
    if key is not None:
        with _shapes_lock:
            _shapes[key] = ask
            while len(_shapes) > SHAPES_KEPT:
                _shapes.popitem(last=False)
    return ask


def _type_matches(wanted: str, model: str) -> bool:
    """HAMi's test (the GPU's type contains the word, case aside), and for corral's short model names ("A100", from
    NVML's "NVIDIA A100-SXM4-80GB") also the model being one of the word's parts ("NVIDIA-A100-SXM4-80GB")."""
    return wanted in model.upper() or model.upper() in re.split(r"[^A-Z0-9]+", wanted)


def _hami_types(annotation: str, value: str, known: Mapping[str, int] | None) -> frozenset[str]:
    """HAMi's GPU types (a comma list; each matches the models _type_matches says) -> the models they allow."""
    wanted = [t.strip().upper() for t in value.split(",") if t.strip()]
    where = f"metadata.annotations[{annotation}]"
    if not wanted:
        raise InvalidRequest(where, f"names no GPU type: {value!r}")
    if annotation == ANN_HAMI_USE_TYPE:
        if known is None:
            return frozenset(t.strip() for t in value.split(",") if t.strip())
        hits = frozenset(m for m in known if any(_type_matches(t, m) for t in wanted))
        return hits or frozenset(t.strip() for t in value.split(",") if t.strip())
    if known is None:
        raise InvalidRequest(where, "excluding GPU types needs the cluster's GPUs, and none are known here")
    left = frozenset(m for m in known if not any(_type_matches(t, m) for t in wanted))
    if not left:
        raise InvalidRequest(where, f"excludes every GPU model here ({', '.join(sorted(known)) or 'none'})")
    return left


def _gpu_models(annotations: Mapping[str, str], known: Mapping[str, int] | None) -> frozenset[str] | None:
    """The GPU models a pod may use: corral's corral.dev/gpu-model, narrowed by HAMi's use-/nouse-gputype."""
    for ann in (ANN_HAMI_USE_UUID, ANN_HAMI_NOUSE_UUID):
        if ann in annotations:
            raise InvalidRequest(
                f"metadata.annotations[{ann}]",
                f"corral does not choose GPUs by UUID; use {ANN_HAMI_USE_TYPE}/{ANN_HAMI_NOUSE_TYPE} or "
                f"{ANN_GPU_MODEL}",
            )
    text = annotations.get(ANN_GPU_MODEL)
    models = frozenset(m.strip() for m in text.split(",") if m.strip()) if text else None
    for ann in (ANN_HAMI_USE_TYPE, ANN_HAMI_NOUSE_TYPE):
        if ann in annotations:
            allowed = _hami_types(ann, annotations[ann], known)
            models = allowed if models is None else models & allowed
            if not models:
                raise InvalidRequest(f"metadata.annotations[{ann}]", f"leaves no GPU model of {ANN_GPU_MODEL} allowed")
    return models


def _policy(annotations: Mapping[str, str]) -> str | None:
    """corral.dev/policy, else HAMi's node-level policy, else its GPU-level one, as a corral policy name."""
    if annotations.get(ANN_POLICY):
        return annotations[ANN_POLICY]
    for ann, names in HAMI_POLICIES.items():
        value = annotations.get(ann)
        if value is None:
            continue
        if value.strip().lower() not in names:
            raise InvalidRequest(
                f"metadata.annotations[{ann}]", f"{value!r} is not one corral follows; use one of {', '.join(names)}"
            )
        return names[value.strip().lower()]
    return None


def _pod_request(pod: Any, min_cpu_milli: int, gpu_memory: Mapping[str, int] | None) -> PodAsk:
    if not isinstance(pod, Mapping):
        raise InvalidRequest("Pod", "must be a Pod object")
    meta = _mapping(pod.get("metadata"), "metadata")
    spec = _mapping(pod.get("spec"), "spec")
    annotations = {str(k): str(v) for k, v in _mapping(meta.get("annotations"), "metadata.annotations").items()}
    containers = _containers(spec, "containers")
    if not containers:
        raise InvalidRequest("spec.containers", "a pod needs at least one container")
    init = _containers(spec, "initContainers")
    # A bound pod is counted as it runs, never refused for how it wished to be placed (a HAMi pod bound by HAMi's
    # scheduler may name GPUs by UUID): its placement annotations are not read, and its share is always read.
    bound = bool(spec.get("nodeName"))
    models = None if bound else _gpu_models(annotations, gpu_memory)
    gpus = _Gpus(models, gpu_memory, bound)
    cpu, mem = _cpu_mem(containers, "spec.containers")
    for i, c in enumerate(init):
        i_cpu, i_mem = _cpu_mem([c], f"spec.initContainers[{i}]")
        cpu, mem = max(cpu, i_cpu), max(mem, i_mem)
        if _container_gpu(c, f"spec.initContainers[{i}]", annotations, gpus) is not None:
            raise InvalidRequest(f"spec.initContainers[{i}].resources", "GPUs for init containers are not supported")
    overhead = _mapping(spec.get("overhead"), "spec.overhead")
    if "cpu" in overhead:
        cpu += cpu_milli(overhead["cpu"], "spec.overhead.cpu")
    if "memory" in overhead:
        mem += memory_mib(overhead["memory"], "spec.overhead.memory")

    asks = [a for i, c in enumerate(containers) if (a := _container_gpu(c, f"spec.containers[{i}]", annotations,
                                                                          gpus))]  # fmt: skip
    styles = sorted({a.style for a in asks})
    if styles == ["hami", "nvidia"]:  # one family: a container with nvidia.com/gpu alone beside HAMi's shares
        styles = ["hami"]
    if len(styles) > 1:
        raise InvalidRequest("spec.containers", f"containers use different GPU resource styles ({', '.join(styles)})")
    count = milli = gmem = 0
    if asks:
        shares = [a for a in asks if a.milli != MILLI_PER_GPU]
        if shares and len(asks) > 1:
            raise InvalidRequest(
                "spec.containers",
                "a GPU share can be asked for by one container of a pod only (others may not ask for GPUs)",
            )
        count = sum(a.count for a in asks)
        milli, gmem = (shares[0].milli, shares[0].memory_mib) if shares else (MILLI_PER_GPU, 0)
    behavior = annotations.get(ANN_BEHAVIOR)
    min_mem = annotations.get(ANN_MIN_GPU_MEMORY)
    priority = spec.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise InvalidRequest("spec.priority", f"must be an integer, got {priority!r}")
    if cpu == 0 and mem == 0 and count == 0:
        cpu = min_cpu_milli
    try:
        request = Request(
            cpu_milli=cpu,
            memory_mib=mem,
            gpu_count=count,
            gpu_milli=milli if count else 0,
            gpu_memory_mib=gmem if count else 0,
            gpu_models=models,
            min_gpu_memory_mib=memory_amount_mib(min_mem, f"metadata.annotations[{ANN_MIN_GPU_MEMORY}]")
            if min_mem
            else 0,
            priority=priority,
            gpu_behavior=GpuBehavior.parse(behavior, f"metadata.annotations[{ANN_BEHAVIOR}]") if behavior else None,
            policy=(annotations.get(ANN_POLICY) or None) if bound else _policy(annotations),
            id=pod_key(pod),
        )
    except InvalidRequest as exc:
        raise InvalidRequest(f"pod {pod_name(pod)}: {exc.field}", exc.message) from None
    return PodAsk(request, tuple(asks), styles[0] if styles else None)


# ---------------------------------------------------------------------------------------------------- nodes
def node_from_k8s(obj: Any) -> Node:
    """A Node object -> corral Node: allocatable CPU/memory, labels, GPUs from the device plugin's annotation."""
    if not isinstance(obj, Mapping):
        raise InvalidRequest("Node", "must be a Node object")
    meta = _mapping(obj.get("metadata"), "metadata")
    name = meta.get("name")
    if not name or not isinstance(name, str):
        raise InvalidRequest("metadata.name", "a node needs a name")
    status = _mapping(obj.get("status"), f"node {name}: status")
    alloc = _mapping(status.get("allocatable") or status.get("capacity"), f"node {name}: status.allocatable")
    labels = {str(k): str(v) for k, v in _mapping(meta.get("labels"), "metadata.labels").items()}
    annotations = _mapping(meta.get("annotations"), "metadata.annotations")
    gpus = parse_node_gpus(annotations.get(ANN_NODE_GPUS), name)
    try:
        return Node(
            name,
            cpu_milli(alloc.get("cpu", 0), f"node {name}: status.allocatable.cpu"),
            memory_mib(alloc.get("memory", 0), f"node {name}: status.allocatable.memory"),
            gpus,
            labels,
        )
    except InvalidRequest as exc:
        raise InvalidRequest(f"node {name}: {exc.field}", exc.message) from None


def node_gpus_annotation(gpus: tuple[GpuDevice, ...]) -> str:
    """What the device plugin publishes on its node: every GPU with UUID, model, memory and topology."""
    rows = []
    for g in gpus:
        row: dict[str, Any] = {"index": g.index, "uuid": g.uuid, "model": g.model, "memory_mib": g.memory_mib}
        if g.numa_node is not None:
            row["numa"] = g.numa_node
        if g.pcie_switch is not None:
            row["switch"] = g.pcie_switch
        if g.nvlink_peers:
            row["nvlink"] = sorted(g.nvlink_peers)
        rows.append(row)
    return json.dumps(rows, separators=(",", ":"))


def parse_node_gpus(text: Any, node: str) -> tuple[GpuDevice, ...]:
    if text is None or text == "":
        return ()
    where = f"node {node}: metadata.annotations[{ANN_NODE_GPUS}]"
    try:
        rows = json.loads(text) if isinstance(text, str) else None
    except json.JSONDecodeError as exc:
        raise InvalidRequest(where, f"not JSON: {exc}") from None
    if not isinstance(rows, list):
        raise InvalidRequest(where, "must be a JSON list of GPUs")
    out = []
    try:
        for i, r in enumerate(sorted(rows, key=lambda r: _small_int(r["index"]))):
            out.append(
                GpuDevice(
                    index=i,
                    model=str(r["model"]),
                    memory_mib=_small_int(r.get("memory_mib", 0)),
                    uuid=str(r.get("uuid", "")),
                    numa_node=None if r.get("numa") is None else _small_int(r["numa"]),
                    pcie_switch=None if r.get("switch") is None else _small_int(r["switch"]),
                    nvlink_peers=frozenset(_small_int(p) for p in r.get("nvlink", [])),
                )
            )
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise InvalidRequest(where, f"each GPU needs index, model, memory_mib ({exc})") from None
    except InvalidRequest as exc:
        raise InvalidRequest(where, exc.message) from None
    return tuple(out)


def _small_int(value: Any) -> int:
    """A whole number from the device plugin's JSON, within MAX_UNITS (ValueError otherwise: inf, NaN, 1e400)."""
    number = int(value)
    if (number != value and not isinstance(value, str)) or abs(number) > MAX_UNITS:
        raise ValueError(f"{value!r} is no whole number within bounds")
    return number


def node_utilization(obj: Mapping[str, Any]) -> list[float | None]:
    """Live GPU utilisation (0..1 per GPU, None unknown) the device plugin publishes; [] when absent or unreadable
    (load is a preference, so a bad value is ignored rather than failing the node)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(ANN_NODE_UTILIZATION)
    if not text:
        return []
    try:
        values = json.loads(text)
    except json.JSONDecodeError:
        return []
    if not isinstance(values, list):
        return []
    out: list[float | None] = []
    for v in values:
        ok = isinstance(v, int | float) and not isinstance(v, bool) and 0.0 <= v <= 1.0
        out.append(float(v) if ok else None)
    return out


# ---------------------------------------------------------------------------------------------------- assignment
@dataclass(frozen=True)
class GpuSlot:
    """One granted GPU as the device plugin needs it."""

    index: int
    uuid: str
    milli: int
    memory_mib: int


@dataclass(frozen=True)
class Assignment:
    node: str
    containers: Mapping[str, tuple[GpuSlot, ...]]  # container name -> its GPUs

    @property
    def slots(self) -> tuple[GpuSlot, ...]:
        return tuple(s for slots in self.containers.values() for s in slots)


def make_assignment(alloc: Allocation, node: Node, ask: PodAsk) -> Assignment:
    """Split the allocation's GPUs over the containers that asked for them, in spec order."""
    grants = list(alloc.gpus)
    containers: dict[str, tuple[GpuSlot, ...]] = {}
    for c in ask.containers:
        mine, grants = grants[: c.count], grants[c.count :]
        containers[c.container] = tuple(GpuSlot(g.index, node.gpus[g.index].uuid, g.milli, g.memory_mib) for g in mine)
    return Assignment(alloc.node, containers)


def assignment_annotations(assignment: Assignment, style: str | None) -> dict[str, str]:
    """The annotations bind writes: corral's own, plus the peers' so their tools and habits keep working."""
    body = {
        "node": assignment.node,
        "containers": {
            name: [{"index": s.index, "uuid": s.uuid, "milli": s.milli, "memory_mib": s.memory_mib} for s in slots]
            for name, slots in assignment.containers.items()
        },
    }
    out = {ANN_ASSIGNMENT: json.dumps(body, separators=(",", ":"), sort_keys=True)}
    if style == "elasticgpu":
        out[ANN_ELASTIC_ASSUMED] = "true"
        for name, slots in assignment.containers.items():
            out[ANN_ELASTIC_CONTAINER + name] = ",".join(str(s.index) for s in slots)
    if style == "keti":
        out[ANN_KETI_UUID] = ",".join(s.uuid for s in assignment.slots)
    if style in ("hami", "nvidia"):
        # HAMi's record of what a pod of nvidia.com/gpu holds (per GPU "UUID,NVIDIA,MiB,cores:", containers
        # ";"-separated): HAMi's own scheduler, still running beside corral while pods move over, counts these GPUs
        # as taken
        out[ANN_HAMI_ALLOCATED] = "".join(
            "".join(f"{s.uuid},NVIDIA,{s.memory_mib},{s.milli * 100 // MILLI_PER_GPU}:" for s in slots) + ";"
            for slots in assignment.containers.values()
        )
    return out


def hami_uuids(annotations: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The GPUs HAMi's record names (hami.io/vgpu-devices-allocated: per GPU "UUID,type,MiB,cores:", containers
    ";"-separated), in order; () where there is none or it is unreadable. A pod HAMi's scheduler bound carries it and
    no corral assignment: it says which GPUs the pod holds."""
    text = (annotations or {}).get(ANN_HAMI_ALLOCATED)
    if not isinstance(text, str) or len(text) > 64 * 1024:
        return ()
    out: list[str] = []
    for device in text.replace(";", ":").split(":"):
        fields = device.split(",")
        if len(fields) >= 2 and fields[0].strip():
            out.append(fields[0].strip())
    return tuple(out)


def parse_assignment(annotations: Mapping[str, Any] | None) -> Assignment | None:
    """The assignment corral wrote on a pod, None when there is none; a damaged one is an InvalidRequest."""
    text = (annotations or {}).get(ANN_ASSIGNMENT)
    if not text:
        return None
    where = f"metadata.annotations[{ANN_ASSIGNMENT}]"
    try:
        body = orjson.loads(text)
        containers = {
            str(name): tuple(
                GpuSlot(int(s["index"]), str(s["uuid"]), int(s["milli"]), int(s["memory_mib"])) for s in slots
            )
            for name, slots in body["containers"].items()
        }
        return Assignment(str(body["node"]), containers)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidRequest(where, f"unreadable assignment ({exc})") from None


def allocation_of(request: Request, assignment: Assignment | None, node: str, node_index: int) -> Allocation:
    """The snapshot allocation of a pod already on `node` (rebuilding state from the API server)."""
    from corral.model.resources import affinity_tag

    grants = tuple(
        sorted(
            (GpuGrant(s.index, s.milli, s.memory_mib) for s in (assignment.slots if assignment else ())),
            key=lambda g: g.index,
        )
    )
    return Allocation(
        request_id=request.id,
        node=node,
        node_index=node_index,
        cpu_milli=request.cpu_milli,
        memory_mib=request.memory_mib,
        gpus=grants,
        tag=affinity_tag(request) if grants else 0,
        share_owner=request.share_owner if grants and not request.whole_gpus else "",
    )
