"""RealKubeApi (the official `kubernetes` client) against a fake API server over real HTTP (`fake_apiserver`):
list, watch, get, annotate, bind, node metadata, and the extender end to end on top of it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from kubernetes import client as kube_client

from corral.k8s.client import KubeApiError, RealKubeApi
from corral.k8s.convert import ANN_ASSIGNMENT, parse_assignment
from corral.k8s.extender import BIND_THREADS, Extender, create_app
from corral.k8s.fake import node_object, pod_object
from corral.k8s.state import ClusterState, Informer
from tests.k8s.conftest import Served, gpu_node
from tests.k8s.fake_apiserver import FakeApiServer
from tests.k8s.test_extender import bind_args, kube_pod

TOKEN = "test-token"


def eventually(check: Callable[[], bool], what: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.01)


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    server.put_node(gpu_node("gpu-a", 2))
    server.put_node(gpu_node("gpu-b", 4))
    server.put_node(node_object("cpu-1", "32", "128Gi"))
    with server:
        yield server


@pytest.fixture
def api(apiserver: FakeApiServer) -> RealKubeApi:
    configuration = kube_client.Configuration(host=apiserver.url)
    configuration.api_key = {"BearerToken": TOKEN}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    return RealKubeApi(configuration=configuration)


def running(name: str, node: str, limits: dict[str, str] | None = None) -> dict[str, Any]:
    resources = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": dict(limits or {})}
    p = pod_object(name, [{"name": "main", "resources": resources}], node=node)
    p["status"] = {"phase": "Running"}
    return p


def test_list_sends_the_api_servers_paths_and_reads_items_and_version(
    apiserver: FakeApiServer, api: RealKubeApi
) -> None:
    apiserver.put_pod(running("on-a", "gpu-a"))
    apiserver.put_pod(running("on-b", "gpu-b"))
    nodes, version = api.list("nodes")
    assert sorted(n["metadata"]["name"] for n in nodes) == ["cpu-1", "gpu-a", "gpu-b"]
    assert nodes[0] == apiserver.nodes[nodes[0]["metadata"]["name"]]  # the objects as the server holds them
    assert version == str(apiserver.version) == "5"
    pods, _ = api.list("pods", "spec.nodeName=gpu-b")
    assert [p["metadata"]["name"] for p in pods] == ["on-b"]
    seen = [(r.method, r.path, r.query) for r in apiserver.requests]
    assert seen == [
        ("GET", "/api/v1/nodes", {}),
        ("GET", "/api/v1/pods", {"fieldSelector": "spec.nodeName=gpu-b"}),
    ]
    assert {r.headers["authorization"] for r in apiserver.requests} == {f"Bearer {TOKEN}"}


def test_watch_streams_events_from_a_version_and_stops_when_told(apiserver: FakeApiServer, api: RealKubeApi) -> None:
    _, version = api.list("nodes")
    stop = threading.Event()
    events: list[tuple[str, str]] = []

    def consume() -> None:
        for event, obj in api.watch("nodes", version, stop):
            events.append((event, obj["metadata"]["name"]))

    reader = threading.Thread(target=consume)
    reader.start()
    apiserver.put_node(gpu_node("gpu-new", 8, model="H100"))
    apiserver.put_node(gpu_node("gpu-new", 4, model="H100"))
    apiserver.delete_node("cpu-1")
    eventually(lambda: len(events) == 3, "three node events")
    assert events == [("ADDED", "gpu-new"), ("MODIFIED", "gpu-new"), ("DELETED", "cpu-1")]
    watch = apiserver.requests[-1]
    assert watch.query == {"watch": "true", "resourceVersion": version, "timeoutSeconds": "300"}
    stop.set()  # a quiet stream: the reader must not wait for another event to notice
    reader.join(timeout=5)
    assert not reader.is_alive()


def test_watch_from_a_compacted_version_is_410(apiserver: FakeApiServer, api: RealKubeApi) -> None:
    _, version = api.list("nodes")
    apiserver.put_node(gpu_node("gpu-new", 1))
    apiserver.compact()
    with pytest.raises(KubeApiError) as err:
        next(iter(api.watch("nodes", version, threading.Event())))
    assert err.value.status == 410
    assert "too old resource version" in str(err.value)


def test_informer_over_the_real_client_keeps_the_state_current(apiserver: FakeApiServer, api: RealKubeApi) -> None:
    state = ClusterState()
    informer = Informer(api, state, retry_seconds=0.05)
    informer.start()
    try:
        assert informer.wait_synced(10)
        assert sorted(state.nodes) == ["cpu-1", "gpu-a", "gpu-b"]
        apiserver.put_node(gpu_node("gpu-new", 8, model="H100"))
        eventually(lambda: "gpu-new" in state.nodes, "the added node")
        apiserver.put_pod(running("job", "gpu-new", {"corral.dev/gpu": "0"}))
        eventually(lambda: "uid-default-job" in state.pods, "the added pod")
        done = apiserver.pods[("default", "job")]
        done["status"] = {"phase": "Succeeded"}
        apiserver.put_pod(done)  # modified: finished, holds nothing any more
        eventually(lambda: "uid-default-job" not in state.pods, "the finished pod")
        apiserver.delete_node("gpu-new")
        eventually(lambda: "gpu-new" not in state.nodes, "the deleted node")
        # The API server ends the streams (a restart): the informer lists again and goes on watching.
        apiserver.end_watches()
        apiserver.put_node(gpu_node("gpu-late", 1))
        eventually(lambda: "gpu-late" in state.nodes, "a node added after the streams ended")
    finally:
        informer.close()
    assert not any(t.is_alive() for t in informer._threads)


def test_get_annotate_and_bind_a_pod(apiserver: FakeApiServer, api: RealKubeApi) -> None:
    p = kube_pod("train", {"corral.dev/gpu": "1"}, {"team": "vision"})
    apiserver.put_pod(p)
    got = api.get_pod("default", "train")
    assert got["metadata"]["uid"] == "uid-default-train"
    assert got["spec"]["containers"][0]["resources"]["limits"] == {"corral.dev/gpu": "1"}
    api.patch_pod_annotations("default", "train", {ANN_ASSIGNMENT: '{"node":"gpu-a"}'})
    patch = apiserver.requests[-1]
    assert (patch.method, patch.path) == ("PATCH", "/api/v1/namespaces/default/pods/train")
    assert patch.headers["content-type"] == "application/strategic-merge-patch+json"
    assert patch.body == {"metadata": {"annotations": {ANN_ASSIGNMENT: '{"node":"gpu-a"}'}}}
    stored = apiserver.pods[("default", "train")]
    assert stored["metadata"]["annotations"] == {"team": "vision", ANN_ASSIGNMENT: '{"node":"gpu-a"}'}
    api.create_binding("default", "train", "uid-default-train", "gpu-a")
    bind = apiserver.requests[-1]
    assert bind.method == "POST" and bind.path == "/api/v1/namespaces/default/bindings"
    assert bind.body["metadata"] == {"name": "train", "namespace": "default", "uid": "uid-default-train"}
    assert bind.body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-a"}
    assert stored["spec"]["nodeName"] == "gpu-a"
    with pytest.raises(KubeApiError) as again:
        api.create_binding("default", "train", "uid-default-train", "gpu-b")
    assert again.value.status == 409 and "already assigned" in str(again.value)
    apiserver.put_pod(kube_pod("other", {}))
    api.create_binding("default", "other", "not-its-uid", "gpu-a")  # as kube-apiserver: the UID is not checked
    assert apiserver.pods[("default", "other")]["spec"]["nodeName"] == "gpu-a"
    with pytest.raises(KubeApiError) as missing:
        api.get_pod("default", "nobody")
    assert missing.value.status == 404
    assert str(missing.value) == 'get pod default/nobody: 404 Not Found: pods "nobody" not found'


def test_binds_from_many_threads_keep_their_connections(apiserver: FakeApiServer, api: RealKubeApi) -> None:
    """Binds in flight at once (the extender's BIND_THREADS) reuse pooled connections: each new one costs a TLS
    handshake on both sides against a real API server. Before, every Binding's answer was left unread, so its
    connection never went back to the pool and each bind opened one."""
    pods = [f"p{i}" for i in range(64)]
    for name in pods:
        apiserver.put_pod(kube_pod(name, {}))
    api.get_pod("default", "p0")  # the first connection
    before = apiserver.connections
    with ThreadPoolExecutor(max_workers=BIND_THREADS) as pool:
        list(pool.map(lambda n: api.create_binding("default", n, f"uid-default-{n}", "gpu-a", {"k": n}), pods))
    assert all(apiserver.pods[("default", n)]["spec"]["nodeName"] == "gpu-a" for n in pods)
    assert apiserver.pods[("default", "p7")]["metadata"]["annotations"] == {"k": "p7"}
    assert apiserver.connections - before <= BIND_THREADS  # at most one per thread, not one per bind
    bind = apiserver.requests[-1]
    assert bind.headers["authorization"] == f"Bearer {TOKEN}" and bind.headers["content-type"] == "application/json"


def test_device_plugin_publishes_node_metadata(apiserver: FakeApiServer, api: RealKubeApi) -> None:
    api.patch_node_metadata("gpu-a", {"corral.dev/gpu-utilization": "[0.5,null]"}, {"corral.dev/gpu-model": "A100"})
    node = apiserver.nodes["gpu-a"]
    assert node["metadata"]["annotations"]["corral.dev/gpu-utilization"] == "[0.5,null]"
    assert node["metadata"]["annotations"]["corral.dev/gpus"]  # the inventory already there is kept
    assert node["metadata"]["labels"] == {"corral.dev/gpu-model": "A100"}
    with pytest.raises(KubeApiError) as missing:
        api.patch_node_metadata("ghost", {}, {})
    assert missing.value.status == 404


def test_extender_binds_through_the_real_client(apiserver: FakeApiServer, api: RealKubeApi) -> None:
    """kube-scheduler's verbs over HTTP, the extender's state from the fake API server through the official client,
    and the assignments landing on the fake's pod objects; a restarted extender rebuilds the same allocations."""
    state = ClusterState()
    informer = Informer(api, state, retry_seconds=0.05)
    informer.start()
    try:
        assert informer.wait_synced(10)
        pods = [kube_pod(f"w{i}", {"corral.dev/gpu": "1"}) for i in range(5)]
        pods.append(kube_pod("half", {"corral.dev/gpu-milli": "500"}))
        with Served(create_app(Extender(state, api))) as url:
            for p in pods:
                apiserver.put_pod(p)
                args = {"Pod": p, "Nodes": None, "NodeNames": ["gpu-a", "gpu-b", "cpu-1"]}
                f = httpx.post(f"{url}/filter", json=args, timeout=10).json()
                assert f["Error"] == "" and f["NodeNames"], f
                args["NodeNames"] = f["NodeNames"]
                scores = httpx.post(f"{url}/prioritize", json=args, timeout=10).json()
                best = max(scores, key=lambda h: h["Score"])["Host"]
                r = httpx.post(f"{url}/bind", json=bind_args(p, best), timeout=10)
                assert r.json() == {"Error": ""}
        granted: list[str] = []
        for p in pods:
            stored = apiserver.pods[("default", p["metadata"]["name"])]
            a = parse_assignment(stored["metadata"]["annotations"])
            assert a is not None and stored["spec"]["nodeName"] == a.node
            granted += [f"{s.uuid}:{s.milli}" for s in a.containers["cuda"]]
        whole = sorted(g for g in granted if g.endswith(":1000"))
        assert len(whole) == len(set(whole)) == 5  # no GPU given twice
        assert len(granted) == 6
        # The watch brings the binds back: counted once each.
        eventually(lambda: all(apiserver.pods[k].get("spec", {}).get("nodeName") for k in apiserver.pods), "binds")
        assert state.snapshot is not None
        eventually(lambda: state.snapshot is not None and state.snapshot.gpu_allocated_milli == 5500, "5.5 GPUs")
        writes = [r for r in apiserver.requests if r.method in ("PATCH", "POST")]
        assert [r.method for r in writes] == ["POST"] * 6  # one Binding per pod, carrying the assignment
        assert all(json.loads(r.body["metadata"]["annotations"][ANN_ASSIGNMENT]) for r in writes)
    finally:
        informer.close()
    restarted = ClusterState()
    Informer(api, restarted).sync_once()
    assert restarted.snapshot is not None and restarted.snapshot.gpu_allocated_milli == 5500
    assert {k: a.gpus for k, a in restarted.snapshot.allocations.items()} == {
        k: a.gpus for k, a in state.snapshot.allocations.items()
    }
