"""`corral k8s`: the scheduler extender and the device plugin as commands (what the manifests in deploy/ run).

corral k8s extender --port 8888 --policy fgd-priced       serve kube-scheduler's extender verbs
corral k8s device-plugin --node-name $NODE_NAME           advertise this node's GPUs to kubelet, publish inventory
corral k8s scheduler --kubeconfig PATH                    schedule pods of schedulerName corral standalone
corral k8s explain NAMESPACE/POD                          why a pod waits (its PodScheduled condition and events)
"""

from __future__ import annotations

import gc
import logging
import signal
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.model.errors import CorralError, InvalidRequest
from corral.model.resources import GpuBehavior
from corral.model.units import parse_cpu_milli, parse_memory_mib
from corral.placement import GpuReserve, PlacementConfig, TargetWorkload

if TYPE_CHECKING:
    from corral.tenancy.config import QueuesConfig

RESOURCE_HELP = (
    "Resource to advertise (repeatable or comma-separated; default corral.dev/gpu, corral.dev/gpu-milli, "
    "elasticgpu.io/gpu-core, keti.com/mpsgpu; nvidia.com/gpu only when asked, as NVIDIA's or HAMi's plugin may own it)."
)
#: The verbs bind pods with the extender's rights and take no credentials, so by default only this machine (or, in
#: the chart, this pod, where kube-scheduler runs beside the extender) reaches them.
HOST_HELP = (
    "Address of the verbs (filter, prioritize, bind, preempt) and /healthz, /status. They take no credentials: keep it "
    "on loopback, beside kube-scheduler."
)
HEALTH_HOST_HELP = (
    "Also serve the read-only /healthz and /status (no verbs) on this address, e.g. the pod's IP for probes and a "
    "Service."
)
PICK_HELP = (
    "filter answers only the node corral picks, so kube-scheduler needs no prioritize call and no scoring of its own "
    "(several times the pods/s); pods with preferred affinities or ScheduleAnyway spreading still get every node "
    "that fits. --no-pick: every node that fits, ranked at prioritize."
)
WORKLOAD_HELP = (
    "Target workload of fgd and fgd-priced: auto (learned from the pods the extender sees: the engine's generic one "
    "until 200 have come, then their shapes, recent ones weighing most), default (the engine's generic one), or a pod "
    "list FILE as `corral sim` reads it (openb CSV, or corral's YAML/JSON), whose typical pods are the workload."
)
app = typer.Typer(no_args_is_help=True, help="corral on Kubernetes: scheduler extender and device plugin.")
log = logging.getLogger("corral.k8s")


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


@app.command("extender")
def extender_cmd(
    host: Annotated[str, typer.Option(help=HOST_HELP)] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the verbs.")] = 8888,
    health_host: Annotated[str | None, typer.Option(help=HEALTH_HOST_HELP)] = None,
    health_port: Annotated[int, typer.Option(help="Port of --health-host.")] = 8889,
    policy: Annotated[str, typer.Option(help="Default policy (a pod may set corral.dev/policy).")] = "fgd-priced",
    behavior: Annotated[str, typer.Option(help="GPU scheduling behaviour for pods without GPUs.")] = "preferential",
    reserve_cpus: Annotated[str, typer.Option(help="preferential: CPUs kept free per free GPU.")] = "4",
    reserve_memory: Annotated[str, typer.Option(help="preferential: memory kept free per free GPU.")] = "16GiB",
    load_weight: Annotated[float, typer.Option(help="0..1: how much live GPU utilisation lowers scores.")] = 0.0,
    kubeconfig: Annotated[str | None, typer.Option(help="Kubeconfig (default: in-cluster, else ~/.kube).")] = None,
    pick: Annotated[bool, typer.Option(help=PICK_HELP)] = True,
    workload: Annotated[str, typer.Option(help=WORKLOAD_HELP)] = "auto",
) -> None:
    """Serve the kube-scheduler extender verbs (filter, prioritize, bind, preempt) from corral's engine."""
    import uvicorn

    from corral.k8s.client import RealKubeApi
    from corral.k8s.extender import Extender, create_app
    from corral.k8s.state import ClusterState, Informer
    from corral.placement.learned import WorkloadLearner
    from corral.placement.native import kernels

    try:
        target = load_workload(workload)
        config = PlacementConfig(
            policy=policy,
            gpu_behavior=GpuBehavior.parse(behavior, "--behavior"),
            reserve=GpuReserve(
                parse_cpu_milli(reserve_cpus, "--reserve-cpus"), parse_memory_mib(reserve_memory, "--reserve-memory")
            ),
            load_weight=load_weight,
            workload=target,
        )
        api = RealKubeApi(kubeconfig)
    except (InvalidRequest, CorralError) as exc:
        raise _fail(str(exc)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    state = ClusterState()
    informer = Informer(api, state)
    informer.start()
    if health_host and health_port == port:
        # the app tells the two apart by the local port
        raise _fail("--health-port: must differ from --port")
    # The compiled kernels (F, the fill, fgd-priced's look-ahead) are loaded now, not in the first filter request,
    # which kube-scheduler would time out: a fresh install compiles them once (tens of seconds), later starts load
    # them from numba's cache (`placement.native`).
    kernels()
    if not informer.wait_synced(60):
        log.warning("nodes and pods not listed within 60 s; serving anyway, answers improve as the watch catches up")
    # Thousands of long-lived node and pod objects: keep them out of the collector's full scans (pauses of 10s of ms)
    gc.collect()
    gc.freeze()
    try:
        sockets = [bind_socket(host, port)]
        if health_host:
            sockets.append(bind_socket(health_host, health_port))
    except OSError as exc:
        informer.close()
        raise _fail(f"--host/--health-host: cannot listen: {exc}") from None
    app_ = create_app(
        Extender(state, api, config, pick=pick, learner=WorkloadLearner() if workload == "auto" else None),
        health_only_ports=frozenset({health_port}) if health_host else None,
    )
    try:
        uvicorn.Server(uvicorn.Config(app_, log_level="warning")).run(sockets=sockets)
    finally:
        informer.close()


SCHEDULER_NAME_HELP = "Schedule the pods whose spec.schedulerName is this."
SCHEDULER_WORKLOAD_HELP = (
    "Target workload of fgd and fgd-priced: default (the engine's generic one), or a pod list FILE as `corral sim` "
    "reads it (openb CSV, or corral's YAML/JSON), whose typical pods are the workload: with the same file and policy "
    "the scheduler places a trace as `corral sim` does."
)
GANG_TIMEOUT_HELP = (
    "Seconds a gang may stay bound short of its minMember (a Binding refused, a restart mid-gang) "
    "before its bound members are deleted for their controller to recreate."
)
QUEUES_HELP = (
    "Queues FILE (TOML, as `corral serve --queues`; a queue's `namespaces = [...]` maps namespaces to it): queue "
    "order by weighted fair share, guarantees, limits, borrowing, backfill with a reservation, preemption. Without "
    "it: arrival order, no limits."
)
LISTEN_HELP = "Serve GET /metrics, /healthz, /readyz and /explain/NS/POD on HOST:PORT (read-only; '' for none)."


def split_listen(value: str) -> tuple[str, int] | None:
    """--listen HOST:PORT -> (host, port); '' -> None. Raises InvalidRequest naming the flag."""
    if not value:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidRequest("--listen", f"expected HOST:PORT (e.g. 0.0.0.0:9444), got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


@app.command("scheduler")
def scheduler_cmd(
    kubeconfig: Annotated[str | None, typer.Option(help="Kubeconfig (default: in-cluster, else ~/.kube).")] = None,
    scheduler_name: Annotated[str, typer.Option(help=SCHEDULER_NAME_HELP)] = "corral",
    policy: Annotated[str, typer.Option(help="Default policy (a pod may set corral.dev/policy).")] = "fgd-priced",
    behavior: Annotated[str, typer.Option(help="GPU scheduling behaviour for pods without GPUs.")] = "preferential",
    qps: Annotated[float, typer.Option(help="Writes per second to the API server (token bucket).")] = 50.0,
    burst: Annotated[int, typer.Option(help="Writes the token bucket saves up.")] = 100,
    batch_window_ms: Annotated[float, typer.Option(help="Wait this long after a pod arrives for more.")] = 5.0,
    bind_workers: Annotated[int, typer.Option(help="Bindings in flight at once.")] = 16,
    listen: Annotated[str, typer.Option(help=LISTEN_HELP)] = "0.0.0.0:9444",
    workload: Annotated[str, typer.Option(help=SCHEDULER_WORKLOAD_HELP)] = "default",
    gang_timeout_s: Annotated[float, typer.Option(help=GANG_TIMEOUT_HELP)] = 30.0,
    queues: Annotated[str | None, typer.Option(help=QUEUES_HELP)] = None,
) -> None:
    """Schedule pods (spec.schedulerName) yourself: corral's engine places them in batches and binds them."""
    from corral.k8s.scheduler.core import Scheduler
    from corral.k8s.scheduler.http import serve
    from corral.k8s.scheduler.wire import connect

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        address = split_listen(listen)
        config = PlacementConfig(policy=policy, gpu_behavior=GpuBehavior.parse(behavior, "--behavior"),
                                 workload=load_workload(workload))  # fmt: skip
        Scheduler.check(qps, burst, batch_window_ms / 1000, bind_workers)
        if not gang_timeout_s > 0:
            raise InvalidRequest("--gang-timeout-s", f"must be > 0, got {gang_timeout_s:g}")
        queues_config = load_queues(queues) if queues else None
        scheduler = Scheduler(connect(kubeconfig), config, scheduler_name, qps, burst, batch_window_ms / 1000,
                              bind_workers, queues=queues_config)  # fmt: skip
        if queues_config is not None:
            scheduler.preempting()  # the queues' round preempts through the Eviction API (docs/k8s-scheduler.md)
        scheduler.gang_partial_seconds = gang_timeout_s
    except (InvalidRequest, CorralError) as exc:
        raise _fail(str(exc)) from None
    server = None
    if address is not None:
        try:
            server = serve(scheduler, *address)
        except OSError as exc:
            raise _fail(f"--listen: cannot listen on {listen}: {exc}") from None
    # What the policy needs (numba's kernels for fgd, scipy for fgd-priced's prices: seconds) loads while the books
    # are listed, not under the books' lock at the first batch.
    from corral.k8s.scheduler.core import warm_up
    from corral.k8s.scheduler.tenancy import collector_for_rounds

    warm = threading.Thread(target=warm_up, args=(config,), name="corral-warm-up", daemon=True)
    warm.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        t0 = time.monotonic()
        scheduler.informer.prime()
        listed = time.monotonic()
        warm.join()
        # Thousands of long-lived node and pod objects: keep them out of the collector's full scans
        gc.collect()
        gc.freeze()
        collector_for_rounds()
        scheduler.informer.start()
        scheduler.start_loop()
        state = scheduler.state
        log.info("books rebuilt from %d nodes and %d bound pods in %.2f s (engine ready %.2f s later); scheduling "
                 "pods of %r with policy %s", len(state.nodes), len(state.pods), listed - t0, time.monotonic() - listed,
                 scheduler_name, policy)  # fmt: skip
        stop.wait()
    except KeyboardInterrupt:
        pass
    except CorralError as exc:
        raise _fail(str(exc)) from None
    finally:
        scheduler.close()
        if server is not None:
            server.shutdown()


@app.command("explain")
def explain_cmd(
    pod: Annotated[str, typer.Argument(help="NAMESPACE/POD (or POD in namespace default).")],
    kubeconfig: Annotated[str | None, typer.Option(help="Kubeconfig (default: in-cluster, else ~/.kube).")] = None,
) -> None:
    """Why a pod waits: its PodScheduled condition and its scheduling events."""
    from corral.k8s.client import KubeApiError
    from corral.k8s.scheduler.wire import connect

    namespace, _, name = pod.rpartition("/")
    namespace = namespace or "default"
    if not name or "/" in namespace:
        raise _fail(f"expected NAMESPACE/POD, got {pod!r}")
    try:
        api = connect(kubeconfig)
        obj = api.get_pod(namespace, name)
        events = api.list_events(namespace, f"involvedObject.name={name}")
    except KubeApiError as exc:
        raise _fail(str(exc)) from None
    typer.echo(explain_text(obj, events))


def _queue_line(pod: dict[str, Any]) -> str:
    """A pending pod's queue (its label, Kueue's or KAI's, else its namespace) and gang, if it names one."""
    from corral.k8s.scheduler.gang import gang_of, queue_of

    ref = gang_of(pod)
    gang = f", gang {ref.key} (PodGroup {ref.api})" if ref is not None else ""
    return f"  queue {queue_of(pod)}{gang}"


def explain_text(pod: dict[str, Any], events: list[dict[str, Any]]) -> str:
    """`corral k8s explain`'s text: where the pod is, or why it waits, and its recent scheduling events."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    name = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
    uid = meta.get("uid")
    lines = []
    node = spec.get("nodeName")
    conditions = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"]
    if node:
        lines.append(f"{name}: bound to {node}")
    elif conditions and conditions[0].get("status") == "False":
        c = conditions[0]
        lines.append(f"{name}: pending ({c.get('reason') or 'no reason'}, since {c.get('lastTransitionTime')})")
        message = str(c.get("message") or "")
        lines.append(f"  {message}")
        if not message.startswith("queue "):  # (with --queues the message names the queue the scheduler resolved)
            lines.append(_queue_line(pod))
    else:
        who = spec.get("schedulerName") or "default-scheduler"
        lines.append(f"{name}: pending, not looked at yet by its scheduler ({who})")
    mine = [e for e in events if not uid or (e.get("involvedObject") or {}).get("uid") in (None, "", uid)]
    mine.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    if mine:
        lines.append("events:")
        for e in mine[-10:]:
            when = e.get("lastTimestamp") or e.get("eventTime") or ""
            count = e.get("count") or 1
            times = f" (x{count})" if count > 1 else ""
            source = (e.get("source") or {}).get("component") or e.get("reportingComponent") or ""
            lines.append(f"  {when} {e.get('reason')}{times} from {source}: {e.get('message')}")
    return "\n".join(lines)


def load_queues(path: str) -> QueuesConfig:
    """--queues FILE: the queues file, read (a regular file, as serve reads it) and checked at start-up; CorralError
    naming the file and the key otherwise."""
    from corral.queue.config import load_queues as read

    return read(Path(path))


def load_workload(value: str) -> TargetWorkload | None:
    """--workload's fixed workload: None for auto and default (the learner, or the engine's generic one), else the
    typical pods of the pod list FILE, as `corral sim` builds them from it. Raises InvalidRequest naming the flag."""
    if value in ("auto", "default"):
        return None
    from corral.sim.openb import target_workload
    from corral.sim.pods import load_pod_file

    path = Path(value)
    if not path.is_file():
        raise InvalidRequest("--workload", f"expected auto, default or a pod list file; {value!r} is none of them")
    try:
        return target_workload(load_pod_file(path))
    except InvalidRequest as exc:
        raise InvalidRequest("--workload", f"{exc.field}: {exc.message}") from None


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (IPv4 or IPv6, as the address says), without Nagle's delay."""
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(info[0], socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit this (Linux), and neither asyncio nor uvicorn sets it: without it the response
    # body, written after its headers, waits for kube-scheduler's delayed ACK (40 ms) on every verb.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind(info[4])
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


@app.command("device-plugin")
def device_plugin_cmd(
    node_name: Annotated[str, typer.Option(envvar="NODE_NAME", help="This node's name (downward API).")] = "",
    plugin_dir: Annotated[Path, typer.Option(help="kubelet's device plugin directory.")] = Path(
        "/var/lib/kubelet/device-plugins"
    ),
    pod_resources_socket: Annotated[Path, typer.Option(help="kubelet's PodResources socket.")] = Path(
        "/var/lib/kubelet/pod-resources/kubelet.sock"
    ),
    resource: Annotated[list[str], typer.Option(help=RESOURCE_HELP)] = [],  # noqa: B006
    share_slots: Annotated[int, typer.Option(help="keti.com/mpsgpu IDs per GPU (pods that may share one).")] = 10,
    gpu_split: Annotated[
        int,
        typer.Option(help="nvidia.com/gpu IDs per GPU: 1 whole GPUs (NVIDIA's plugin), 10 HAMi's vGPUs per GPU."),
    ] = 1,
    mps_root: Annotated[
        Path | None, typer.Option(help="Run one MPS daemon per shared GPU under this host folder (mounted in pods).")
    ] = None,
    simulate_gpus: Annotated[str | None, typer.Option(help="Simulated inventory, e.g. 4xH100-80GB.")] = None,
    publish_seconds: Annotated[float, typer.Option(help="How often to publish live GPU utilisation.")] = 15.0,
    kubeconfig: Annotated[str | None, typer.Option(help="Kubeconfig (default: in-cluster).")] = None,
    metrics_port: Annotated[int, typer.Option(help="Serve Prometheus /metrics on this port (0: not at all).")] = 0,
) -> None:
    """Advertise this node's GPUs to kubelet (device plugin API v1beta1) and publish them for the extender."""
    from corral.gpu.discovery import GpuDiscoveryError, discover_gpus
    from corral.gpu.mps import MpsControl
    from corral.gpu.simulated import parse_simulated_inventory
    from corral.k8s.client import RealKubeApi
    from corral.k8s.deviceplugin import (
        DEFAULT_RESOURCES,
        IDS_PER_GPU,
        CorralDevicePlugin,
        DevicePluginError,
        NodePublisher,
        PodFinder,
        PodResourcesClient,
        register,
        serve,
    )

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    names = [r.strip() for given in resource for r in given.split(",") if r.strip()] or list(DEFAULT_RESOURCES)
    unknown = [r for r in names if r not in IDS_PER_GPU]
    if unknown:
        raise _fail(f"--resource: cannot advertise {', '.join(unknown)}; use any of {', '.join(IDS_PER_GPU)}")
    if not node_name:
        raise _fail("--node-name (or NODE_NAME) is required")
    if not 1 <= gpu_split <= 100 or not 1 <= share_slots <= 100:
        raise _fail("--gpu-split and --share-slots must be 1..100 (IDs per GPU)")
    try:
        if simulate_gpus:
            gpus = parse_simulated_inventory(simulate_gpus)[0].gpus
            sample = None
        else:
            infos = discover_gpus()
            gpus = tuple(i.device() for i in infos)
            sample = discover_gpus
        api = RealKubeApi(kubeconfig)
    except (InvalidRequest, GpuDiscoveryError, CorralError) as exc:
        raise _fail(str(exc)) from None
    mps = MpsControl(mps_root) if mps_root else None

    def pipe_dir(uuid: str) -> str | None:
        if mps is None:
            return None
        try:
            return str(mps.start(uuid))
        except CorralError as exc:
            log.warning("no MPS for %s: %s (the share runs without enforced limits)", uuid, exc)
            return None

    finder = PodFinder(api, node_name, PodResourcesClient(pod_resources_socket))
    from corral.metrics import DevicePluginMetrics

    metrics = DevicePluginMetrics()
    if metrics_port:
        from prometheus_client import CollectorRegistry, start_http_server

        exposed = CollectorRegistry(auto_describe=False)
        exposed.register(metrics)
        start_http_server(metrics_port, registry=exposed)
    running = []
    try:
        for r in names:
            per_gpu = {"keti.com/mpsgpu": share_slots, "nvidia.com/gpu": gpu_split}.get(r, IDS_PER_GPU[r])
            running.append(serve(CorralDevicePlugin(r, gpus, finder, per_gpu, pipe_dir, metrics), plugin_dir))
            register(plugin_dir, r)
    except DevicePluginError as exc:
        for p in running:
            p.stop()
        raise _fail(str(exc)) from None
    publisher = NodePublisher(api, node_name, gpus)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    kubelet_sock = plugin_dir / "kubelet.sock"
    started = kubelet_sock.stat().st_ino if kubelet_sock.exists() else None
    try:
        while not stop.is_set():
            util: list[float | None] = []
            if sample is not None:
                try:
                    util = [None if g.utilization_pct is None else g.utilization_pct / 100 for g in sample()]
                except GpuDiscoveryError as exc:
                    log.warning("utilisation: %s", exc)
            try:
                publisher.publish(util)
            except CorralError as exc:
                log.warning("publishing the inventory: %s", exc)
            # kubelet restarts remove every plugin socket: re-register on a new kubelet.sock
            now = kubelet_sock.stat().st_ino if kubelet_sock.exists() else None
            if now != started and now is not None:
                log.info("kubelet restarted; registering again")
                for p in running:
                    p.stop()
                running = [serve(CorralDevicePlugin(p.plugin.resource, gpus, finder, p.plugin.per_gpu, pipe_dir,
                                                    metrics), plugin_dir) for p in running]  # fmt: skip
                for p in running:
                    register(plugin_dir, p.plugin.resource)
                started = now
            stop.wait(publish_seconds)
    except KeyboardInterrupt:
        pass
    finally:
        for p in running:
            p.stop()
        if mps is not None:
            mps.stop_all()
