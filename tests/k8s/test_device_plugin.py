"""The device plugin, with the tests acting as kubelet over temporary Unix sockets and the real v1beta1 messages:
Registration, ListAndWatch, Allocate (env from the extender's assignment), PreStartContainer (checked through a fake
PodResources service)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from typer.testing import CliRunner

from corral.cli.main import app
from corral.k8s.convert import ANN_NODE_GPUS, GPU, GPU_MILLI, KETI_MPSGPU, NVIDIA_GPU, parse_node_gpus
from corral.k8s.deviceplugin import (
    API_VERSION,
    CorralDevicePlugin,
    NodePublisher,
    PodFinder,
    PodResourcesClient,
    RunningPlugin,
    container_env,
    register,
    serve,
)
from corral.k8s.proto import deviceplugin_pb2 as pb
from corral.k8s.proto import deviceplugin_pb2_grpc as pb_grpc
from corral.k8s.proto import podresources_pb2 as pr
from corral.k8s.proto import podresources_pb2_grpc as pr_grpc
from corral.model.resources import GpuDevice
from tests.k8s.conftest import Cluster
from tests.k8s.test_extender import bind_args, kube_pod

GPUS = (
    GpuDevice(0, "A100", 81920, "GPU-gpu-a-0", numa_node=0),
    GpuDevice(1, "A100", 81920, "GPU-gpu-a-1", numa_node=1),
)


class FakeKubelet(pb_grpc.RegistrationServicer, pr_grpc.PodResourcesListerServicer):
    """kubelet's two services a device plugin talks to: Registration and PodResources (a fake, for tests)."""

    def __init__(self) -> None:
        self.registered: list[Any] = []
        self.holding: list[tuple[str, str, str, str, list[str]]] = []  # ns, pod, container, resource, IDs

    def Register(self, request: Any, context: Any) -> Any:
        if request.version != API_VERSION:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unsupported version")
        self.registered.append(request)
        return pb.Empty()

    def List(self, request: Any, context: Any) -> Any:
        pods = []
        for ns, name, container, resource, ids in self.holding:
            devices = [pr.ContainerDevices(resource_name=resource, device_ids=ids)]
            pods.append(pr.PodResources(name=name, namespace=ns, containers=[
                pr.ContainerResources(name=container, devices=devices)]))  # fmt: skip
        return pr.ListPodResourcesResponse(pod_resources=pods)


@pytest.fixture
def kubelet() -> Iterator[tuple[Path, FakeKubelet]]:
    # A short path: Unix socket names are limited to about 100 bytes.
    with tempfile.TemporaryDirectory(prefix="corral-dp-") as d:
        root = Path(d)
        fake = FakeKubelet()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(fake, server)  # type: ignore[no-untyped-call]
        pr_grpc.add_PodResourcesListerServicer_to_server(fake, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{root / 'kubelet.sock'}")
        server.add_insecure_port(f"unix://{root / 'pod-resources.sock'}")
        server.start()
        try:
            yield root, fake
        finally:
            server.stop(grace=None).wait()


def start(c: Cluster, root: Path, resource: str, mps: bool = False, per_gpu: int | None = None) -> RunningPlugin:
    finder = PodFinder(c.api, "gpu-a", PodResourcesClient(root / "pod-resources.sock"))
    pipe = (lambda uuid: f"/run/corral/mps/{uuid}/pipe") if mps else None
    return serve(CorralDevicePlugin(resource, GPUS, finder, per_gpu, mps_pipe_dir=pipe), root)


def allocate_request(ids: list[str]) -> Any:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])


def stub(running: RunningPlugin) -> Any:
    channel = grpc.insecure_channel(f"unix://{running.socket}")
    return pb_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]


def test_register_with_kubelet(small_cluster: Cluster, kubelet: tuple[Path, FakeKubelet]) -> None:
    root, fake = kubelet
    running = start(small_cluster, root, GPU_MILLI)
    try:
        register(root, GPU_MILLI)
        [req] = fake.registered
        assert (req.version, req.endpoint) == ("v1beta1", running.socket.name)
        assert req.resource_name == "corral.dev/gpu-milli"
        assert req.options.pre_start_required is True
        options = stub(running).GetDevicePluginOptions(pb.Empty(), timeout=5)
        assert options.pre_start_required and not options.get_preferred_allocation_available
    finally:
        running.stop()


def test_list_and_watch_streams_devices_and_health(small_cluster: Cluster, kubelet: tuple[Path, FakeKubelet]) -> None:
    root, _ = kubelet
    running = start(small_cluster, root, GPU_MILLI)
    try:
        stream = stub(running).ListAndWatch(pb.Empty(), timeout=10)
        first = next(stream)
        assert len(first.devices) == 2000  # 1000 milli IDs per GPU
        assert all(len(d.ID) <= 63 and d.health == "Healthy" for d in first.devices)
        assert {d.topology.nodes[0].ID for d in first.devices} == {0, 1}
        running.plugin.set_health("GPU-gpu-a-1", False)
        second = next(stream)
        sick = {d.ID.rsplit("-", 1)[0] for d in second.devices if d.health == "Unhealthy"}
        assert sick == {"GPU-gpu-a-1"}
        stream.cancel()
    finally:
        running.stop()


def test_allocate_returns_the_assigned_gpus_and_prestart_checks_the_holder(
    small_cluster: Cluster, kubelet: tuple[Path, FakeKubelet]
) -> None:
    root, fake = kubelet
    c = small_cluster
    p = kube_pod("whole", {GPU: "1"})
    c.api.put_pod(p)
    assert c.extender.bind(bind_args(p, "gpu-a")) == {"Error": ""}
    running = start(c, root, GPU)
    try:
        s = stub(running)
        # kubelet picks IDs by its own accounting; the GPU the container sees is the extender's choice.
        resp = s.Allocate(allocate_request(["GPU-gpu-a-1"]))
        [cr] = resp.container_responses
        granted = c.api.pods[("default", "whole")]["metadata"]["annotations"]["corral.dev/assignment"]
        uuid = "GPU-gpu-a-0" if "GPU-gpu-a-0" in granted else "GPU-gpu-a-1"
        assert dict(cr.envs) == {"NVIDIA_VISIBLE_DEVICES": uuid, "CUDA_VISIBLE_DEVICES": uuid}
        # PreStartContainer: kubelet now shows who holds the IDs; the right pod passes ...
        fake.holding = [("default", "whole", "cuda", GPU, ["GPU-gpu-a-1"])]
        s.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["GPU-gpu-a-1"]), timeout=5)
        # ... a different pod holding them is refused with the reason
        fake.holding = [("default", "intruder", "cuda", GPU, ["GPU-gpu-a-1"])]
        with pytest.raises(grpc.RpcError) as exc:
            s.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["GPU-gpu-a-1"]), timeout=5)
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "held by default/intruder/cuda" in str(exc.value.details())
    finally:
        running.stop()


def test_allocate_a_share_sets_the_mps_limits(small_cluster: Cluster, kubelet: tuple[Path, FakeKubelet]) -> None:
    root, _ = kubelet
    c = small_cluster
    p = kube_pod("share", {GPU_MILLI: "250", "corral.dev/gpu-memory": "10240"})
    c.api.put_pod(p)
    assert c.extender.bind(bind_args(p, "gpu-a")) == {"Error": ""}
    running = start(c, root, GPU_MILLI, mps=True)
    try:
        ids = [f"GPU-gpu-a-0-{k}" for k in range(250)]
        resp = stub(running).Allocate(allocate_request(ids))
        [cr] = resp.container_responses
        env = dict(cr.envs)
        uuid = env["CUDA_VISIBLE_DEVICES"]
        assert uuid.startswith("GPU-gpu-a-") and env["NVIDIA_VISIBLE_DEVICES"] == uuid
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == f"/run/corral/mps/{uuid}/pipe"
        assert [(m.container_path, m.host_path) for m in cr.mounts] == [(env["CUDA_MPS_PIPE_DIRECTORY"],) * 2]
    finally:
        running.stop()


def test_allocate_without_a_waiting_pod_fails_clearly(
    small_cluster: Cluster, kubelet: tuple[Path, FakeKubelet]
) -> None:
    root, _ = kubelet
    running = start(small_cluster, root, KETI_MPSGPU)
    try:
        with pytest.raises(grpc.RpcError) as exc:
            stub(running).Allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-gpu-a-0-0"])])
            )
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no pod on gpu-a with a corral assignment is waiting for 1 keti.com/mpsgpu" in str(exc.value.details())
    finally:
        running.stop()


def test_publisher_puts_the_inventory_on_the_node(small_cluster: Cluster) -> None:
    c = small_cluster
    pub = NodePublisher(c.api, "gpu-a", GPUS)
    pub.publish([0.5, None])
    meta = c.api.nodes["gpu-a"]["metadata"]
    assert parse_node_gpus(meta["annotations"][ANN_NODE_GPUS], "gpu-a") == GPUS
    assert meta["annotations"]["corral.dev/gpu-utilization"] == "[0.500,null]"
    assert meta["labels"] == {"corral.dev/gpu.count": "2", "corral.dev/gpu.model": "A100"}
    calls = len(c.api.calls)
    pub.publish([0.5, None])
    assert len(c.api.calls) == calls  # unchanged: no patch
    c.sync()
    assert c.state.utilization["gpu-a"] == [0.5, None]


def test_allocate_a_hami_pod_gives_its_gpus_with_mps_and_hami_core_limits(
    small_cluster: Cluster, kubelet: tuple[Path, FakeKubelet]
) -> None:
    """HAMi's style through nvidia.com/gpu with 10 IDs per GPU (HAMi's deviceSplitCount): a vGPU share of two GPUs
    gets both UUIDs and HAMi-core's limits per device (no MPS: one client talks to one MPS server); a share of one
    GPU also gets its MPS pipe and limits; a whole GPU asked for alone gets no limit."""
    root, _ = kubelet
    c = small_cluster
    two = kube_pod("vgpu2", {NVIDIA_GPU: "2", "nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "30"})
    one = kube_pod("vgpu1", {NVIDIA_GPU: "1", "nvidia.com/gpumem-percentage": "25", "nvidia.com/gpucores": "25"})
    for p in (two, one):
        c.api.put_pod(p)
        assert c.extender.bind(bind_args(p, "gpu-a")) == {"Error": ""}
    running = start(c, root, NVIDIA_GPU, mps=True, per_gpu=10)
    try:
        s = stub(running)
        first = next(s.ListAndWatch(pb.Empty(), timeout=10))
        assert len(first.devices) == 20
        [cr] = s.Allocate(allocate_request(["GPU-gpu-a-0-3", "GPU-gpu-a-1-7"])).container_responses
        assert dict(cr.envs) == {
            "NVIDIA_VISIBLE_DEVICES": "GPU-gpu-a-0,GPU-gpu-a-1",
            "CUDA_VISIBLE_DEVICES": "GPU-gpu-a-0,GPU-gpu-a-1",
            "CUDA_DEVICE_MEMORY_LIMIT_0": "10240m",
            "CUDA_DEVICE_MEMORY_LIMIT_1": "10240m",
            "CUDA_DEVICE_SM_LIMIT": "30",
        }
        assert list(cr.mounts) == []
        [cr] = s.Allocate(allocate_request(["GPU-gpu-a-0-4"])).container_responses
        env = dict(cr.envs)
        uuid = env["CUDA_VISIBLE_DEVICES"]
        assert env == {
            "NVIDIA_VISIBLE_DEVICES": uuid,
            "CUDA_VISIBLE_DEVICES": uuid,
            "CUDA_MPS_PIPE_DIRECTORY": f"/run/corral/mps/{uuid}/pipe",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",  # 25 % of an 80 GiB A100
            "CUDA_DEVICE_MEMORY_LIMIT_0": "20480m",
            "CUDA_DEVICE_SM_LIMIT": "25",
        }
        assert [(m.container_path, m.host_path) for m in cr.mounts] == [(env["CUDA_MPS_PIPE_DIRECTORY"],) * 2]
    finally:
        running.stop()
    whole = kube_pod("whole-vgpu", {NVIDIA_GPU: "1", "nvidia.com/gpucores": "100"})
    c.api.put_pod(whole)
    assert c.extender.bind(bind_args(whole, "gpu-b")) == {"Error": ""}
    finder = PodFinder(c.api, "gpu-b", PodResourcesClient(root / "pod-resources.sock"))
    given = finder.find(NVIDIA_GPU, ["x-0"])
    assert given.hami and [s.milli for s in given.slots] == [1000]
    assert set(container_env(given.slots, "/run/pipe", given.hami)) == {"NVIDIA_VISIBLE_DEVICES",
                                                                        "CUDA_VISIBLE_DEVICES"}  # fmt: skip


def test_device_plugin_command_reads_comma_lists_and_checks_the_split() -> None:
    base = ["k8s", "device-plugin", "--node-name", "n1", "--simulate-gpus", "1xA100-80GB"]
    r = CliRunner().invoke(app, [*base, "--resource", "corral.dev/gpu, foo/bar"])
    assert r.exit_code == 2 and "cannot advertise foo/bar" in r.output
    r = CliRunner().invoke(app, [*base, "--resource", "nvidia.com/gpu", "--gpu-split", "0"])
    assert r.exit_code == 2 and "--gpu-split and --share-slots must be 1..100 (IDs per GPU)" in r.output
