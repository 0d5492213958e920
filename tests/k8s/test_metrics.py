"""/metrics of the Kubernetes faces: the extender (verbs, latency, decisions, GPUs granted per node, scraped over HTTP)
and the device plugin (devices advertised and healthy, Allocate and PreStartContainer outcomes)."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import pytest

from corral.k8s.convert import GPU, GPU_MILLI
from corral.metrics import DevicePluginMetrics, render_text
from tests.api.test_metrics import parse, total, value
from tests.k8s.conftest import Cluster
from tests.k8s.test_device_plugin import GPUS, FakeKubelet, allocate_request, kubelet, stub  # noqa: F401
from tests.k8s.test_extender import ALL, bind_args, kube_pod, post


def test_extender_metrics_count_verbs_decisions_and_grants(served: tuple[str, Cluster]) -> None:
    url, c = served
    whole = kube_pod("whole", {GPU: "2"})
    c.api.put_pod(whole)
    assert post(url, "filter", {"Pod": whole, "Nodes": None, "NodeNames": ALL}).json()["NodeNames"] == [
        "gpu-a",
        "gpu-b",
    ]
    too_big = kube_pod("big", {GPU: "8"})
    post(url, "filter", {"Pod": too_big, "Nodes": None, "NodeNames": ALL})
    post(url, "prioritize", {"Pod": whole, "Nodes": None, "NodeNames": ["gpu-a", "gpu-b"]})
    assert post(url, "bind", bind_args(whole, "gpu-b")).json() == {"Error": ""}
    assert post(url, "bind", bind_args(kube_pod("ghost", {GPU: "1"}), "gpu-b")).json()["Error"]  # no such pod
    assert post(url, "filter", b"{not json").status_code == 200  # refused in filter's own shape

    scraped = httpx.get(f"{url}/metrics", timeout=10)
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain; version=0.0.4")
    m = parse(scraped.text)
    assert value(m, "corral_extender_requests_total", verb="filter", code="200") == 3  # a refused filter is a 200 too
    assert value(m, "corral_extender_decisions_total", verb="filter", outcome="invalid") == 1
    assert value(m, "corral_extender_requests_total", verb="prioritize", code="200") == 1
    assert value(m, "corral_extender_request_duration_seconds_count", verb="bind") == 2
    assert value(m, "corral_extender_decisions_total", verb="filter", outcome="fits") == 1
    assert value(m, "corral_extender_decisions_total", verb="filter", outcome="unschedulable") == 1
    assert value(m, "corral_extender_decisions_total", verb="bind", outcome="bound") == 1
    assert value(m, "corral_extender_decisions_total", verb="bind", outcome="refused") == 1
    # GPUs granted per node: the bound pod's two whole GPUs, on gpu-b only
    assert value(m, "corral_node_gpus_granted", node="gpu-b") == 2
    assert value(m, "corral_node_gpu_milli_granted", node="gpu-b") == 2000
    assert value(m, "corral_node_gpu_milli_granted", node="gpu-a") == 0
    assert value(m, "corral_node_gpu_milli_capacity", node="gpu-b") == 4000
    # per pod and container, in HAMi's names: the two whole GPUs of default/whole
    cores = [x for x in m["vGPUCoreAllocated"] if x.labels["podname"] == "whole"]
    assert sorted(x.value for x in cores) == [100, 100]
    assert {(x.labels["podnamespace"], x.labels["nodename"], x.labels["containeridx"]) for x in cores} == {
        ("default", "gpu-b", "cuda")
    }
    assert total(m, "vGPUMemoryAllocated") == 2 * 81920 * 2**20


def test_device_plugin_metrics_count_devices_and_allocations(
    small_cluster: Cluster,
    kubelet: tuple[Path, FakeKubelet],  # noqa: F811
) -> None:
    from corral.k8s.deviceplugin import CorralDevicePlugin, PodFinder, PodResourcesClient, serve

    root, _ = kubelet
    c = small_cluster
    p = kube_pod("whole", {GPU: "1"})
    c.api.put_pod(p)
    assert c.extender.bind(bind_args(p, "gpu-a")) == {"Error": ""}
    metrics = DevicePluginMetrics()
    finder = PodFinder(c.api, "gpu-a", PodResourcesClient(root / "pod-resources.sock"))
    whole = serve(CorralDevicePlugin(GPU, GPUS, finder, metrics=metrics), root)
    shares = serve(CorralDevicePlugin(GPU_MILLI, GPUS, finder, metrics=metrics), root)
    try:
        stub(whole).Allocate(allocate_request(["GPU-gpu-a-1"]))
        with pytest.raises(grpc.RpcError):  # nobody waits for a second GPU
            stub(whole).Allocate(allocate_request(["GPU-gpu-a-0"]))
        shares.plugin.set_health("GPU-gpu-a-1", False)
        m = parse(render_text(metrics).decode())
        assert value(m, "corral_device_plugin_devices", resource=GPU) == 2
        assert value(m, "corral_device_plugin_devices", resource=GPU_MILLI) == 2000
        assert value(m, "corral_device_plugin_devices_healthy", resource=GPU_MILLI) == 1000
        assert value(m, "corral_device_plugin_gpus_healthy", resource=GPU_MILLI, UUID="GPU-gpu-a-1") == 0
        assert value(m, "corral_device_plugin_allocations_total", resource=GPU, call="allocate", outcome="ok") == 1
        assert value(m, "corral_device_plugin_allocations_total", resource=GPU, call="allocate", outcome="refused") == 1
    finally:
        whole.stop()
        shares.stop()
    assert "corral_device_plugin_devices" not in parse(render_text(metrics).decode())  # stopped: advertises nothing
