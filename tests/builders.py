"""Builders for test objects: `node("n1").gpus(8, model="H100").cpu(64).build()`, `cluster(...)`."""

from __future__ import annotations

from collections.abc import Iterable

from corral.model.resources import GpuDevice, Node, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import Decision, render


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self._name = name
        self._cpu = 64_000
        self._mem = 256 * 1024
        self._gpus: list[GpuDevice] = []
        self._labels: dict[str, str] = {}

    def cpu(self, cores: float) -> NodeBuilder:
        self._cpu = int(cores * 1000)
        return self

    def mem(self, gib: float) -> NodeBuilder:
        self._mem = int(gib * 1024)
        return self

    def gpus(
        self,
        count: int,
        model: str = "A100",
        memory_gib: int = 80,
        numa: list[int] | None = None,
        switch: list[int] | None = None,
        nvlink: Iterable[tuple[int, int]] = (),
    ) -> NodeBuilder:
        links: dict[int, set[int]] = {i: set() for i in range(count)}
        for a, b in nvlink:
            links[a].add(b)
            links[b].add(a)
        self._gpus = [
            GpuDevice(
                index=i,
                model=model,
                memory_mib=memory_gib * 1024,
                uuid=f"GPU-{self._name}-{i}",
                numa_node=None if numa is None else numa[i],
                pcie_switch=None if switch is None else switch[i],
                nvlink_peers=frozenset(links[i]),
            )
            for i in range(count)
        ]
        return self

    def label(self, key: str, value: str) -> NodeBuilder:
        self._labels[key] = value
        return self

    def build(self) -> Node:
        return Node(self._name, self._cpu, self._mem, tuple(self._gpus), dict(self._labels))


def node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


def cluster(*builders: NodeBuilder, ranks: list[int] | None = None) -> ClusterSnapshot:
    return ClusterSnapshot([b.build() for b in builders], ranks)


def gpus(count: int, milli: int = 1000, cpu: int = 1000, mem: int = 1024, **kw: object) -> Request:
    """A GPU request: `gpus(2)` = two whole GPUs, `gpus(1, 300)` = 30 % of one GPU."""
    return Request(cpu_milli=cpu, memory_mib=mem, gpu_count=count, gpu_milli=milli, **kw)  # type: ignore[arg-type]


def cpu_only(cpu: int = 1000, mem: int = 1024, **kw: object) -> Request:
    return Request(cpu_milli=cpu, memory_mib=mem, **kw)  # type: ignore[arg-type]


def commit(s: ClusterSnapshot, decision: Decision) -> Decision:
    """Grant a decision that must have placed; fails with its explanation otherwise."""
    assert decision.allocation is not None, render(decision.explanation)
    s.allocate(decision.allocation)
    return decision
