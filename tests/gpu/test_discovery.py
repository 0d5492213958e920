"""NVML discovery against a fake NVML: every fact converted, NotSupported means unknown, no driver is a clear error."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from corral.gpu.discovery import GpuDiscoveryError, GpuInfo, discover_gpus, local_node


class NVMLError(Exception):
    pass


class NotSupported(NVMLError):
    pass


class FakeNvml:
    """The slice of pynvml discovery uses. `topology[(i, j)]` = common-ancestor level; `nvlink` = linked pairs."""

    NVMLError = NVMLError
    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0

    def __init__(
        self,
        n: int,
        topology: dict[tuple[int, int], int] | None = None,
        nvlink: set[tuple[int, int]] | None = None,
        numa: list[int] | None = None,
        init_error: bool = False,
    ) -> None:
        self.n, self.topology, self.nvlink, self.numa, self.init_error = n, topology, nvlink, numa, init_error
        self.shut = False

    def nvmlInit(self) -> None:
        if self.init_error:
            raise NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return self.n

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-0000-{h}"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        if h == 1:
            raise NotSupported("Not Supported")
        return SimpleNamespace(total=81559 << 20, used=(500 + h) << 20)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=10 * h, memory=0)

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0".encode())

    def nvmlDeviceGetNumaNodeId(self, h: int) -> int:
        if self.numa is None:
            raise NotSupported("Not Supported")
        return self.numa[h]

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        if self.topology is None:
            raise NotSupported("Not Supported")
        return self.topology[(a, b)]

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, cap: int) -> int:
        if self.nvlink is None:
            raise NotSupported("Not Supported")
        return 0 if (a, b) in self.nvlink else 4


def test_full_topology_is_converted() -> None:
    # GPUs 0,1 under one switch, 2,3 under another (host bridge between); NVLink 0-1, 2-3, 1-3.
    levels = {(0, 1): 20, (0, 2): 30, (0, 3): 30, (1, 2): 30, (1, 3): 30, (2, 3): 10}
    fake = FakeNvml(4, topology=levels, nvlink={(0, 1), (2, 3), (1, 3)}, numa=[0, 0, 1, 1])
    gpus = discover_gpus(fake)  # type: ignore[arg-type]
    assert fake.shut
    assert [g.uuid for g in gpus] == ["GPU-0000-0", "GPU-0000-1", "GPU-0000-2", "GPU-0000-3"]
    assert [g.pcie_switch for g in gpus] == [0, 0, 1, 1]
    assert [sorted(g.nvlink_peers) for g in gpus] == [[1], [0, 3], [3], [1, 2]]
    assert [g.numa_node for g in gpus] == [0, 0, 1, 1]
    assert gpus[0].memory_total_mib == 81559 and gpus[0].memory_used_mib == 500
    assert gpus[2].utilization_pct == 20 and gpus[2].pci_bus_id == "00000000:1A:00.0"
    assert gpus[0].model == "H100" and gpus[0].name == "NVIDIA H100 80GB HBM3"


def test_not_supported_is_unknown_never_a_crash(tmp_path: Path) -> None:
    # What a single GPU in a VM answered on the real H200: NotSupported for NUMA, NVLink and topology.
    (tmp_path / "0000:18:00.0").mkdir()
    (tmp_path / "0000:18:00.0" / "numa_node").write_text("-1\n")
    (tmp_path / "0000:19:00.0").mkdir()
    (tmp_path / "0000:19:00.0" / "numa_node").write_text("1\n")
    gpus = discover_gpus(FakeNvml(2), sysfs=tmp_path)  # type: ignore[arg-type]
    assert [g.numa_node for g in gpus] == [None, 1]  # NVML NotSupported -> sysfs; -1 there -> unknown
    assert [g.pcie_switch for g in gpus] == [None, None]
    assert all(not g.nvlink_peers for g in gpus)
    assert gpus[1].memory_total_mib == 0 and gpus[1].memory_used_mib is None  # memory NotSupported on GPU 1


def test_no_driver_is_a_clear_error() -> None:
    with pytest.raises(GpuDiscoveryError, match="NVML is not usable here \\(Driver Not Loaded\\); no NVIDIA driver\\?"):
        discover_gpus(FakeNvml(0, init_error=True))  # type: ignore[arg-type]


def test_real_nvml_without_a_gpu_says_so() -> None:
    # This machine (and CI) has no NVIDIA driver: the real library must fail cleanly, not crash.
    try:
        gpus = discover_gpus()
    except GpuDiscoveryError as exc:
        assert "NVML is not usable here" in str(exc)
    else:  # a GPU machine: the facts must be consistent
        assert all(g.uuid.startswith(("GPU-", "MIG-")) for g in gpus)


def test_local_node_feeds_the_engine() -> None:
    from corral.model.resources import Request
    from corral.model.snapshot import ClusterSnapshot
    from corral.placement import PlacementConfig, place

    levels = {(0, 1): 30, (0, 2): 20, (1, 2): 30}
    gpus = discover_gpus(FakeNvml(3, topology=levels, nvlink={(0, 2)}))  # type: ignore[arg-type]
    node = local_node("box", gpus)
    assert node.cpu_milli > 0 and node.memory_mib > 0
    snap = ClusterSnapshot([node])
    decision = place(snap, Request(gpu_count=2, gpu_milli=1000, id="j"), PlacementConfig())
    assert decision.allocation is not None and decision.allocation.gpu_indices == (0, 2)  # the NVLinked pair


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("Tesla T4", "T4"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA GeForce RTX 4090", "RTX"),
    ],
)
def test_model_names(name: str, model: str) -> None:
    assert GpuInfo(0, "GPU-x", name, 1).model == model
