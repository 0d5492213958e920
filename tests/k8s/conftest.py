"""Shared fixtures: a fake API server with GPU nodes, and the extender served over real HTTP on a free port."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from corral.k8s.convert import ANN_NODE_GPUS, node_gpus_annotation
from corral.k8s.extender import Extender, create_app
from corral.k8s.fake import FakeKubeApi, node_object
from corral.k8s.state import ClusterState, Informer
from corral.model.resources import GpuDevice
from corral.placement import PlacementConfig


def gpu_node(name: str, count: int, model: str = "A100", memory_mib: int = 81920, cpu: str = "64",
             memory: str = "256Gi") -> dict[str, object]:  # fmt: skip
    gpus = tuple(GpuDevice(j, model, memory_mib, f"GPU-{name}-{j}") for j in range(count))
    ann = {ANN_NODE_GPUS: node_gpus_annotation(gpus)} if gpus else {}
    return node_object(name, cpu, memory, ann)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """An app served by uvicorn on 127.0.0.1 in a thread, for tests that must go over HTTP."""

    def __init__(self, app: object) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))  # type: ignore[arg-type]
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.server.started, "the test server did not start"
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class Cluster:
    """A fake API server, the extender's state synced from it, and the extender."""

    def __init__(self, config: PlacementConfig | None = None, pick: bool = False) -> None:
        self.api = FakeKubeApi()
        self.state = ClusterState()
        self.extender = Extender(self.state, self.api, config, pick=pick)

    def sync(self) -> None:
        Informer(self.api, self.state).sync_once()


def small(pick: bool = False) -> Cluster:
    """gpu-a: 2 A100, gpu-b: 4 A100, gpu-t4: 1 T4 (16 GiB), cpu-1: no GPUs; `pick`: the extender's filter answers
    only its pick (corral k8s extender --pick)."""
    c = Cluster(pick=pick)
    c.api.put_node(gpu_node("gpu-a", 2))
    c.api.put_node(gpu_node("gpu-b", 4))
    c.api.put_node(gpu_node("gpu-t4", 1, model="T4", memory_mib=16384, cpu="16", memory="64Gi"))
    c.api.put_node(node_object("cpu-1", "32", "128Gi"))
    c.sync()
    return c


@pytest.fixture
def small_cluster() -> Cluster:
    return small()


@pytest.fixture
def served(small_cluster: Cluster) -> Iterator[tuple[str, Cluster]]:
    with Served(create_app(small_cluster.extender)) as url:
        yield url, small_cluster
