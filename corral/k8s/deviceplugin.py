"""The node side: a kubelet device plugin (API v1beta1) per GPU resource, and the node's published inventory.

    corral k8s device-plugin
      discover GPUs (NVML, or --simulate-gpus)  -> patch Node: corral.dev/gpus (UUID, model, memory, topology),
                                                   corral.dev/gpu-utilization (live), labels gpu.model / gpu.count
      per advertised resource: gRPC server on <plugin dir>/corral-<name>.sock, Register with kubelet.sock
        ListAndWatch   IDs per GPU: corral.dev/gpu 1, corral.dev/gpu-milli 1000, elasticgpu.io/gpu-core 100,
                       keti.com/mpsgpu --share-slots, nvidia.com/gpu --gpu-split (opt-in: NVIDIA's or HAMi's plugin
                       may own it; 1 = whole GPUs as NVIDIA's, 10 = HAMi's deviceSplitCount, vGPUs sharing a GPU)
        Allocate       which pod? kubelet does not say. Candidates: pods bound to this node with a corral assignment
                       whose container asks for exactly this many IDs and that the PodResources API does not show
                       holding devices yet, oldest first. Env: NVIDIA_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES = granted
                       UUIDs; a share of one GPU also gets its MPS pipe and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE /
                       CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; a HAMi-style share (nvidia.com/gpumem, ...) also gets
                       HAMi-core's CUDA_DEVICE_MEMORY_LIMIT_<i> / CUDA_DEVICE_SM_LIMIT, for images that preload it
        PreStartContainer  the check: PodResources now names the pod and container holding these IDs; if that is
                       not the pod Allocate picked, the container is refused (no GPU is ever handed to the wrong pod)

The device IDs are bookkeeping for kubelet only; which GPUs a container gets comes from the extender's assignment.
GPU memory resources are not advertised (one ID per MiB is too many for kubelet): kubelet's admission drops extended
resources a node does not advertise, and the extender accounts them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from corral.k8s.client import JsonObj, KubeApi
from corral.k8s.convert import (
    ANN_NODE_GPUS,
    ANN_NODE_UTILIZATION,
    ELASTIC_CORE,
    GPU,
    GPU_MILLI,
    HAMI_RESOURCES,
    KETI_MPSGPU,
    LABEL_GPU_COUNT,
    LABEL_GPU_MODEL,
    NVIDIA_GPU,
    TERMINAL_PHASES,
    Assignment,
    GpuSlot,
    extended_amount,
    node_gpus_annotation,
    parse_assignment,
    parse_quantity,
    pod_name,
    whole_number,
)
from corral.k8s.proto import deviceplugin_pb2 as pb
from corral.k8s.proto import deviceplugin_pb2_grpc as pb_grpc
from corral.k8s.proto import podresources_pb2 as pr
from corral.k8s.proto import podresources_pb2_grpc as pr_grpc
from corral.metrics import DevicePluginMetrics
from corral.model.errors import CorralError, InvalidRequest
from corral.model.resources import MILLI_PER_GPU, GpuDevice

log = logging.getLogger("corral.k8s.deviceplugin")

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
MAX_ID_LENGTH = 63

#: IDs per GPU of each resource corral can advertise (keti.com/mpsgpu: --share-slots).
IDS_PER_GPU = {GPU: 1, GPU_MILLI: MILLI_PER_GPU, ELASTIC_CORE: 100, KETI_MPSGPU: 10, NVIDIA_GPU: 1}
DEFAULT_RESOURCES = (GPU, GPU_MILLI, ELASTIC_CORE, KETI_MPSGPU)


class DevicePluginError(CorralError):
    pass


def device_ids(gpu: GpuDevice, per_gpu: int) -> list[str]:
    base = gpu.uuid or f"gpu{gpu.index}"
    ids = [base] if per_gpu == 1 else [f"{base}-{k}" for k in range(per_gpu)]
    if len(ids[-1]) > MAX_ID_LENGTH:
        raise DevicePluginError(f"device ID {ids[-1]!r} is longer than kubelet's {MAX_ID_LENGTH} characters")
    return ids


def container_env(slots: Sequence[GpuSlot], mps_pipe_dir: str | None, hami: bool = False) -> dict[str, str]:
    """The container's GPU environment: granted UUIDs; for a share of one GPU, its MPS pipe and limits; for a pod
    that asked in HAMi's style (`hami`), also HAMi-core's limits on each shared GPU.

    MPS limits apply to one-GPU shares only (a client talks to one MPS server), as in `corral serve`. HAMi-core's
    (libvgpu.so, preloaded in the container: HAMi-built images and nodes) are per visible device, so a share of
    several GPUs is limited too; where nothing preloads it they are inert, as MPS's are without an MPS server.
    """
    visible = ",".join(s.uuid for s in slots)
    env = {"NVIDIA_VISIBLE_DEVICES": visible, "CUDA_VISIBLE_DEVICES": visible}
    if hami:
        for i, slot in enumerate(slots):
            if slot.milli < MILLI_PER_GPU and slot.memory_mib > 0:
                env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{slot.memory_mib}m"
        cores = {s.milli for s in slots if 0 < s.milli < MILLI_PER_GPU}
        if cores:
            env["CUDA_DEVICE_SM_LIMIT"] = str(-(-max(cores) // 10))  # HAMi's one value per container, in percent
    if len(slots) == 1 and slots[0].milli < MILLI_PER_GPU and mps_pipe_dir:
        slot = slots[0]
        env["CUDA_MPS_PIPE_DIRECTORY"] = mps_pipe_dir
        if slot.milli > 0:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(-(-slot.milli // 10))  # ceil: never below the grant
        if slot.memory_mib > 0:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={slot.memory_mib}M"
    return env


@dataclass(frozen=True)
class Holder:
    namespace: str
    name: str
    container: str


class PodResourcesClient:
    """Asks kubelet's PodResources API (v1) which container holds which device IDs."""

    def __init__(self, socket: Path = POD_RESOURCES_SOCKET) -> None:
        self.target = f"unix://{socket}"

    def holders(self, resource: str) -> dict[str, Holder]:
        """device ID -> the container holding it, for one resource."""
        with grpc.insecure_channel(self.target) as channel:
            stub = pr_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
            resp = stub.List(pr.ListPodResourcesRequest(), timeout=10)
        out: dict[str, Holder] = {}
        for pod in resp.pod_resources:
            for c in pod.containers:
                for d in c.devices:
                    if d.resource_name == resource:
                        for dev in d.device_ids:
                            out[dev] = Holder(pod.namespace, pod.name, c.name)
        return out


@dataclass
class Given:
    """What Allocate handed out for one set of device IDs (PreStartContainer checks it)."""

    holder: Holder
    uid: str
    slots: tuple[GpuSlot, ...]
    hami: bool = False  # the container asked in HAMi's style (its limits get HAMi-core's names too)


def _asks(resources: Any, name: str) -> bool:
    """Whether a container's resources ask for a non-zero amount of `name` (unreadable: no)."""
    try:
        amount = extended_amount(resources, name, "resources")
        return amount is not None and parse_quantity(amount, name) > 0
    except InvalidRequest:
        return False


class PodFinder:
    """Which pod and container an Allocate call is for (kubelet's request carries only device IDs)."""

    def __init__(self, api: KubeApi, node: str, pod_resources: PodResourcesClient) -> None:
        self.api = api
        self.node = node
        self.pod_resources = pod_resources
        self.lock = threading.Lock()
        self.given: dict[frozenset[str], Given] = {}

    def find(self, resource: str, ids: Sequence[str]) -> Given:
        with self.lock:
            pods, _ = self.api.list("pods", f"spec.nodeName={self.node}")
            held = {(h.namespace, h.name, h.container) for h in self.pod_resources.holders(resource).values()}
            taken = {(g.uid, g.holder.container) for g in self.given.values()}
            candidates: list[tuple[str, str, JsonObj, str, Assignment, bool]] = []
            for pod in pods:
                meta = pod.get("metadata") or {}
                if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
                    continue
                try:
                    assignment = parse_assignment(meta.get("annotations"))
                except InvalidRequest:
                    continue
                if assignment is None or assignment.node != self.node:
                    continue
                for c in (pod.get("spec") or {}).get("containers") or []:
                    cname = str(c.get("name", ""))
                    try:
                        amount = extended_amount(c.get("resources") or {}, resource, "resources")
                        count = 0 if amount is None else whole_number(amount, resource)
                    except InvalidRequest:
                        continue
                    if count != len(ids) or cname not in assignment.containers:
                        continue
                    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
                    uid = str(meta.get("uid") or f"{ns}/{name}")
                    if (ns, name, cname) in held or (uid, cname) in taken:
                        continue
                    resources = c.get("resources") or {}
                    hami = any(_asks(resources, r) for r in HAMI_RESOURCES)
                    candidates.append((str(meta.get("creationTimestamp") or ""), name, pod, cname, assignment, hami))
            if not candidates:
                raise DevicePluginError(
                    f"no pod on {self.node} with a corral assignment is waiting for {len(ids)} {resource}; "
                    "was it scheduled by corral (its extender or `corral k8s scheduler`)?"
                )
            candidates.sort(key=lambda c: (c[0], c[1]))
            _, _, pod, cname, assignment, hami = candidates[0]
            meta = pod["metadata"]
            holder = Holder(str(meta.get("namespace") or "default"), str(meta["name"]), cname)
            g = Given(holder, str(meta.get("uid") or ""), assignment.containers[cname], hami)
            self.given[frozenset(ids)] = g
            log.info("allocate %s x%d -> %s container %s", resource, len(ids), pod_name(pod), cname)
            return g

    def check(self, resource: str, ids: Sequence[str]) -> None:
        """PreStartContainer: the container now holding these IDs must be the one Allocate chose."""
        with self.lock:
            g = self.given.get(frozenset(ids))
        holders = self.pod_resources.holders(resource)
        actual = {holders[i] for i in ids if i in holders}
        if g is None:
            raise DevicePluginError(f"PreStartContainer for {resource} IDs that Allocate never saw")
        if actual != {g.holder}:
            who = ", ".join(sorted(f"{h.namespace}/{h.name}/{h.container}" for h in actual)) or "nobody"
            raise DevicePluginError(
                f"{resource}: Allocate gave GPUs of {g.holder.namespace}/{g.holder.name}/{g.holder.container} "
                f"but kubelet shows these devices held by {who}; refusing to start it with another pod's GPUs"
            )


class CorralDevicePlugin(pb_grpc.DevicePluginServicer):
    """One advertised resource: its fake device IDs, health, and Allocate from the extender's assignment."""

    def __init__(
        self,
        resource: str,
        gpus: Sequence[GpuDevice],
        finder: PodFinder,
        per_gpu: int | None = None,
        mps_pipe_dir: Callable[[str], str | None] | None = None,
        metrics: DevicePluginMetrics | None = None,
    ) -> None:
        self.resource = resource
        self.per_gpu = per_gpu or IDS_PER_GPU[resource]
        self.gpus = list(gpus)
        self.finder = finder
        self.mps_pipe_dir = mps_pipe_dir or (lambda uuid: None)
        self.health = {g.uuid: HEALTHY for g in gpus}
        self._changed = threading.Condition()
        self._version = 0
        self.stopped = threading.Event()
        #: Allocate/PreStartContainer outcomes for /metrics (corral.metrics), shared by a node's plugins.
        self.metrics = metrics if metrics is not None else DevicePluginMetrics()
        self.metrics.plugins.append(self)

    def devices(self) -> list[Any]:
        out = []
        for g in self.gpus:
            topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=g.numa_node)]) if g.numa_node is not None else None
            for dev in device_ids(g, self.per_gpu):
                out.append(pb.Device(ID=dev, health=self.health[g.uuid], topology=topo))
        return out

    def set_health(self, uuid: str, healthy: bool) -> None:
        with self._changed:
            self.health[uuid] = HEALTHY if healthy else UNHEALTHY
            self._version += 1
            self._changed.notify_all()

    def stop(self) -> None:
        self.stopped.set()
        if self in self.metrics.plugins:  # a stopped plugin (kubelet restarted) advertises nothing any more
            self.metrics.plugins.remove(self)
        with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------------ the gRPC methods kubelet calls
    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return pb.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=False)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        seen = -1
        while not self.stopped.is_set() and context.is_active():
            with self._changed:
                if seen == self._version:
                    self._changed.wait(timeout=1.0)
                    continue
                seen = self._version
                devices = self.devices()
            yield pb.ListAndWatchResponse(devices=devices)

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        responses = []
        for req in request.container_requests:
            chosen = list(req.must_include_deviceIDs)
            room = max(0, req.allocation_size - len(chosen))
            chosen += [d for d in req.available_deviceIDs if d not in chosen][:room]
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: Any, context: Any) -> Any:
        responses = []
        for req in request.container_requests:
            try:
                given = self.finder.find(self.resource, list(req.devices_ids))
            except (DevicePluginError, CorralError) as exc:
                self.metrics.calls.labels(self.resource, "allocate", "refused").inc()
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
                raise  # abort raises; this line only satisfies the type checker
            pipe = self.mps_pipe_dir(given.slots[0].uuid) if len(given.slots) == 1 else None
            env = container_env(given.slots, pipe, given.hami)
            mps = pipe is not None and "CUDA_MPS_PIPE_DIRECTORY" in env
            mounts = [pb.Mount(container_path=pipe, host_path=pipe, read_only=False)] if pipe and mps else []
            annotations = {"corral.dev/gpus": ",".join(s.uuid for s in given.slots)}
            responses.append(pb.ContainerAllocateResponse(envs=env, mounts=mounts, annotations=annotations))
            self.metrics.calls.labels(self.resource, "allocate", "ok").inc()
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        try:
            self.finder.check(self.resource, list(request.devices_ids))
        except (DevicePluginError, CorralError) as exc:
            self.metrics.calls.labels(self.resource, "prestart", "refused").inc()
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            raise
        self.metrics.calls.labels(self.resource, "prestart", "ok").inc()
        return pb.PreStartContainerResponse()


@dataclass
class RunningPlugin:
    plugin: CorralDevicePlugin
    server: Any
    socket: Path

    def stop(self) -> None:
        self.plugin.stop()
        self.server.stop(grace=1).wait()
        self.socket.unlink(missing_ok=True)


def socket_name(resource: str) -> str:
    return "corral-" + resource.replace("/", "_").replace(".", "-") + ".sock"


def serve(plugin: CorralDevicePlugin, plugin_dir: Path) -> RunningPlugin:
    path = plugin_dir / socket_name(plugin.resource)
    path.unlink(missing_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_DevicePluginServicer_to_server(plugin, server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return RunningPlugin(plugin, server, path)


def register(plugin_dir: Path, resource: str) -> None:
    """Register one resource with kubelet (its Registration service on kubelet.sock). Failure: DevicePluginError."""
    req = pb.RegisterRequest(
        version=API_VERSION,
        endpoint=socket_name(resource),
        resource_name=resource,
        options=pb.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=False),
    )
    try:
        with grpc.insecure_channel(f"unix://{plugin_dir / 'kubelet.sock'}") as channel:
            pb_grpc.RegistrationStub(channel).Register(req, timeout=10)  # type: ignore[no-untyped-call]
    except grpc.RpcError as exc:
        raise DevicePluginError(f"kubelet refused to register {resource}: {exc.details() or exc}") from None


@dataclass
class NodePublisher:
    """Publishes the node's GPUs and their live utilisation on its Node object for the extender."""

    api: KubeApi
    node: str
    gpus: tuple[GpuDevice, ...]
    last: dict[str, str] = field(default_factory=dict)

    def publish(self, utilization: Sequence[float | None] = ()) -> None:
        annotations = {
            ANN_NODE_GPUS: node_gpus_annotation(self.gpus),
            ANN_NODE_UTILIZATION: "[" + ",".join("null" if u is None else f"{u:.3f}" for u in utilization) + "]",
        }
        if annotations == self.last:
            return  # an unchanged value would only wake every watcher of Node objects
        models = sorted({g.model for g in self.gpus})
        labels = {LABEL_GPU_COUNT: str(len(self.gpus)), LABEL_GPU_MODEL: models[0] if len(models) == 1 else "mixed"}
        self.api.patch_node_metadata(self.node, annotations, labels)
        self.last = annotations
