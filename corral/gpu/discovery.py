"""GPU discovery with NVML (nvidia-ml-py), turned into corral's `Node`.

    nvmlInit -> per device: index, UUID, name, memory, utilisation, PCI bus id
             -> topology where the driver answers: NUMA node (NVML, else sysfs), PCIe switch groups (common
                ancestor at most "multiple switches"), NVLink peers (P2P status over NVLink)
    NotSupported / FunctionNotFound / any per-device error  ->  that fact is unknown (None), never a crash
    no library or driver  ->  GpuDiscoveryError, which the caller turns into a clear message or a simulated inventory

Index order is NVML's, which may differ from CUDA's; corral hands out GPUs by UUID (CUDA_VISIBLE_DEVICES=GPU-...),
so the order only names GPUs for people.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from corral.model.errors import CorralError
from corral.model.resources import GpuDevice, Node

#: NVML's common-ancestor levels: at most this close means the two GPUs sit under one PCIe switch (or closer).
_SAME_SWITCH_LEVEL = 20  # NVML_TOPOLOGY_MULTIPLE


class GpuDiscoveryError(CorralError):
    """NVML cannot be used here (no library, no driver, no permission)."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str  # as NVML says it, e.g. "NVIDIA H100 80GB HBM3"
    memory_total_mib: int
    memory_used_mib: int | None = None
    utilization_pct: int | None = None
    pci_bus_id: str | None = None
    numa_node: int | None = None
    pcie_switch: int | None = None
    nvlink_peers: frozenset[int] = field(default_factory=frozenset)

    @property
    def model(self) -> str:
        """A short model name for requests (`--gpu-model H100`): the name without vendor words, first token."""
        words = [w for w in self.name.replace("-", " ").split() if w.upper() not in {"NVIDIA", "TESLA", "GEFORCE"}]
        return words[0] if words else self.name

    def device(self) -> GpuDevice:
        return GpuDevice(
            index=self.index,
            model=self.model,
            memory_mib=self.memory_total_mib,
            uuid=self.uuid,
            numa_node=self.numa_node,
            pcie_switch=self.pcie_switch,
            nvlink_peers=self.nvlink_peers,
        )


def _load_nvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise GpuDiscoveryError(f"nvidia-ml-py is not installed: {exc}") from None
    module: ModuleType = pynvml
    return module


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def discover_gpus(nvml: ModuleType | None = None, sysfs: Path = Path("/sys/bus/pci/devices")) -> list[GpuInfo]:
    """Every GPU NVML sees, with whatever topology the driver answers. Raises GpuDiscoveryError without NVML."""
    nv = nvml or _load_nvml()
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        raise GpuDiscoveryError(f"NVML is not usable here ({exc}); no NVIDIA driver?") from None
    try:
        return _discover(nv, sysfs)
    finally:
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()


class _Asker:
    """Calls NVML; NotSupported, FunctionNotFound, NoPermission, GPU lost...: the fact is unknown (None)."""

    def __init__(self, nv: ModuleType) -> None:
        self.nv = nv

    def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nv.NVMLError:
            return None


def _discover(nv: ModuleType, sysfs: Path) -> list[GpuInfo]:
    ask = _Asker(nv)

    count = nv.nvmlDeviceGetCount()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    base: list[dict[str, Any]] = []
    for i, h in enumerate(handles):
        mem = ask(nv.nvmlDeviceGetMemoryInfo, h)
        util = ask(nv.nvmlDeviceGetUtilizationRates, h)
        pci = ask(nv.nvmlDeviceGetPciInfo, h)
        bus = _text(pci.busId) if pci is not None else None
        raw_numa = ask(nv.nvmlDeviceGetNumaNodeId, h)
        numa = None if raw_numa is None else int(raw_numa)
        if (numa is None or numa < 0) and bus:
            numa = _sysfs_numa(sysfs, bus)
        base.append(
            {
                "index": i,
                "uuid": _text(nv.nvmlDeviceGetUUID(h)),
                "name": _text(nv.nvmlDeviceGetName(h)),
                "memory_total_mib": int(mem.total) // (1 << 20) if mem is not None else 0,
                "memory_used_mib": int(mem.used) // (1 << 20) if mem is not None else None,
                "utilization_pct": int(util.gpu) if util is not None else None,
                "pci_bus_id": bus,
                "numa_node": numa if numa is not None and numa >= 0 else None,
            }
        )
    switch = _switch_groups(nv, handles, ask)
    peers = _nvlink_peers(nv, handles, ask)
    return [GpuInfo(**b, pcie_switch=switch[i], nvlink_peers=peers[i]) for i, b in enumerate(base)]


def _sysfs_numa(sysfs: Path, bus_id: str) -> int | None:
    # NVML's bus id is 8 hex digits of domain ("00000000:3B:00.0"); sysfs uses 4 ("0000:3b:00.0").
    domain, _, rest = bus_id.partition(":")
    try:
        text = (sysfs / f"{domain[-4:]}:{rest}".lower() / "numa_node").read_text().strip()
        value = int(text)
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def _switch_groups(nv: ModuleType, handles: list[Any], ask: _Asker) -> list[int | None]:
    """Number GPUs that share a PCIe switch (union of pairs whose common ancestor is at most a switch)."""
    n = len(handles)
    parent = list(range(n))
    known = [False] * n

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(n):
        for j in range(i + 1, n):
            level = ask(nv.nvmlDeviceGetTopologyCommonAncestor, handles[i], handles[j])
            if level is None:
                continue
            known[i] = known[j] = True
            if int(level) <= _SAME_SWITCH_LEVEL:
                parent[root(j)] = root(i)
    ids: dict[int, int] = {}
    return [ids.setdefault(root(i), len(ids)) if known[i] else None for i in range(n)]


def _nvlink_peers(nv: ModuleType, handles: list[Any], ask: _Asker) -> list[frozenset[int]]:
    n = len(handles)
    peers: list[set[int]] = [set() for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            status = ask(nv.nvmlDeviceGetP2PStatus, handles[i], handles[j], nv.NVML_P2P_CAPS_INDEX_NVLINK)
            if status == nv.NVML_P2P_STATUS_OK:
                peers[i].add(j)
                peers[j].add(i)
    return [frozenset(p) for p in peers]


def host_resources() -> tuple[int, int]:
    """(CPU milli, memory MiB) of this machine."""
    cpu = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1) * 1000
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) // 1024
                break
    except OSError:
        pass
    return cpu, mem


def local_node(name: str, gpus: list[GpuInfo]) -> Node:
    cpu, mem = host_resources()
    return Node(name, cpu, mem, tuple(g.device() for g in gpus))
