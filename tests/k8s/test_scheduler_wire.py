"""The scheduler's wire client (corral.k8s.scheduler.wire) against a fake API server over real HTTP
(tests/k8s/fake_apiserver.py), and the credentials it reads from a kubeconfig. On a real kube-apiserver with TLS:
test_scheduler_e2e.py (the scheduler process talks through it)."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from corral.k8s.client import KubeApiError, RealKubeApi
from corral.k8s.convert import ANN_ASSIGNMENT
from corral.k8s.fake import node_object
from corral.k8s.scheduler.wire import Endpoint, WireKubeApi, connect, from_kubeconfig, in_cluster
from corral.k8s.state import ClusterState, Informer
from tests.k8s.conftest import gpu_node
from tests.k8s.fake_apiserver import FakeApiServer
from tests.k8s.test_extender import kube_pod
from tests.k8s.test_real_client import running

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
    server.put_node(node_object("cpu-1", "32", "128Gi"))
    with server:
        yield server


@pytest.fixture
def api(apiserver: FakeApiServer) -> WireKubeApi:
    port = int(apiserver.url.rsplit(":", 1)[1])
    return WireKubeApi(Endpoint("127.0.0.1", port, None, "127.0.0.1", {"Authorization": f"Bearer {TOKEN}"}))


def test_list_get_patch_and_bind_speak_the_api_servers_paths(apiserver: FakeApiServer, api: WireKubeApi) -> None:
    apiserver.put_pod(running("on-a", "gpu-a"))
    nodes, version = api.list("nodes")
    assert sorted(n["metadata"]["name"] for n in nodes) == ["cpu-1", "gpu-a"] and version == str(apiserver.version)
    pods, _ = api.list("pods", "spec.nodeName=gpu-a")
    assert [p["metadata"]["name"] for p in pods] == ["on-a"]
    apiserver.put_pod(kube_pod("train", {"corral.dev/gpu": "1"}, {"team": "vision"}))
    assert api.get_pod("default", "train")["metadata"]["uid"] == "uid-default-train"
    api.patch_pod_annotations("default", "train", {"x": "y"})
    assert apiserver.pods[("default", "train")]["metadata"]["annotations"] == {"team": "vision", "x": "y"}
    api.create_binding("default", "train", "uid-default-train", "gpu-a", {ANN_ASSIGNMENT: '{"node":"gpu-a"}'})
    stored = apiserver.pods[("default", "train")]
    assert stored["spec"]["nodeName"] == "gpu-a" and stored["metadata"]["annotations"][ANN_ASSIGNMENT]
    bind = apiserver.requests[-1]
    assert (bind.method, bind.path) == ("POST", "/api/v1/namespaces/default/bindings")
    assert bind.headers["content-type"] == "application/json"
    assert {r.headers["authorization"] for r in apiserver.requests} == {f"Bearer {TOKEN}"}
    with pytest.raises(KubeApiError) as again:
        api.create_binding("default", "train", "uid-default-train", "gpu-a")
    assert again.value.status == 409 and str(again.value).startswith("bind pod default/train to gpu-a: 409: ")
    with pytest.raises(KubeApiError) as missing:
        api.get_pod("default", "nobody")
    assert missing.value.status == 404
    assert str(missing.value) == 'get pod default/nobody: 404: pods "nobody" not found'
    api.patch_node_metadata("gpu-a", {"corral.dev/gpu-utilization": "[0.5,null]"}, {"l": "v"})
    assert apiserver.nodes["gpu-a"]["metadata"]["labels"] == {"l": "v"}


def test_binds_from_many_threads_reuse_their_connections(apiserver: FakeApiServer, api: WireKubeApi) -> None:
    pods = [f"p{i}" for i in range(64)]
    for name in pods:
        apiserver.put_pod(kube_pod(name, {}))
    api.get_pod("default", "p0")
    before = apiserver.connections
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda n: api.create_binding("default", n, f"uid-default-{n}", "gpu-a", {"k": n}), pods))
    assert all(apiserver.pods[("default", n)]["spec"]["nodeName"] == "gpu-a" for n in pods)
    assert apiserver.connections - before <= 16


def test_a_connection_the_server_closed_is_replaced(apiserver: FakeApiServer, api: WireKubeApi) -> None:
    api.list("nodes")
    [idle] = api._idle
    idle.sock.close()  # as a server that ends idle connections
    nodes, _ = api.list("nodes")
    assert len(nodes) == 2


def test_watch_streams_from_a_version_stops_when_told_and_says_410(apiserver: FakeApiServer, api: WireKubeApi) -> None:
    _, version = api.list("nodes")
    stop = threading.Event()
    events: list[tuple[str, str]] = []

    def consume() -> None:
        for event, obj in api.watch("nodes", version, stop):
            events.append((event, obj["metadata"]["name"]))

    reader = threading.Thread(target=consume)
    reader.start()
    apiserver.put_node(gpu_node("gpu-new", 8, model="H100"))
    apiserver.delete_node("cpu-1")
    eventually(lambda: len(events) == 2, "two node events")
    assert events == [("ADDED", "gpu-new"), ("DELETED", "cpu-1")]
    stop.set()  # a quiet stream: the reader must not wait for another event
    reader.join(timeout=5)
    assert not reader.is_alive()
    apiserver.compact()
    with pytest.raises(KubeApiError) as err:
        next(iter(api.watch("nodes", version, threading.Event())))
    assert err.value.status == 410


def test_an_informer_over_the_wire_keeps_the_books_current(apiserver: FakeApiServer, api: WireKubeApi) -> None:
    state = ClusterState()
    informer = Informer(api, state, retry_seconds=0.05)
    informer.prime()
    informer.start()
    try:
        assert sorted(state.nodes) == ["cpu-1", "gpu-a"]
        apiserver.put_pod(running("job", "gpu-a", {"corral.dev/gpu": "1"}))
        eventually(lambda: "uid-default-job" in state.pods, "the added pod")
        apiserver.end_watches()  # the API server ends the streams: list again, watch on
        apiserver.put_node(gpu_node("gpu-late", 1))
        eventually(lambda: "gpu-late" in state.nodes, "a node added after the streams ended")
    finally:
        informer.close()
    assert not any(t.is_alive() for t in informer._threads)


# ---------------------------------------------------------------------------------------------------- credentials
def kubeconfig(tmp_path: Path, user: str, cluster: str = 'server: "https://127.0.0.1:6443"') -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(f"""apiVersion: v1
kind: Config
current-context: c
contexts: [{{name: c, context: {{cluster: k, user: u}}}}]
clusters: [{{name: k, cluster: {{{cluster}}}}}]
users: [{{name: u, user: {user}}}]
""")
    return path


def test_a_kubeconfig_gives_the_server_and_the_credentials(tmp_path: Path) -> None:
    ep = from_kubeconfig(str(kubeconfig(tmp_path, "{token: abc}")))
    assert ep is not None and (ep.host, ep.port, ep.headers) == ("127.0.0.1", 6443, {"Authorization": "Bearer abc"})
    assert ep.tls is not None
    (tmp_path / "tok").write_text("from-a-file\n")
    ep = from_kubeconfig(str(kubeconfig(tmp_path, "{tokenFile: tok}", 'server: "http://localhost:8080"')))
    assert ep is not None and ep.headers == {"Authorization": "Bearer from-a-file"} and ep.tls is None
    basic = base64.b64encode(b"admin:secret").decode()
    ep = from_kubeconfig(str(kubeconfig(tmp_path, "{username: admin, password: secret}")))
    assert ep is not None and ep.headers == {"Authorization": f"Basic {basic}"}
    ep = from_kubeconfig(
        str(kubeconfig(tmp_path, "{token: t}", 'server: "https://k:6443", insecure-skip-tls-verify: true'))
    )
    assert ep is not None and ep.tls is not None and not ep.tls.check_hostname


def test_a_kubeconfig_that_needs_the_official_client_falls_back_to_it(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, "{exec: {apiVersion: client.authentication.k8s.io/v1, command: get-token}}")
    assert from_kubeconfig(str(path)) is None
    assert isinstance(connect(str(path)), RealKubeApi)


def test_an_unreadable_kubeconfig_is_named(tmp_path: Path) -> None:
    with pytest.raises(KubeApiError, match=r"^cannot read the kubeconfig /nonexistent: FileNotFoundError: "):
        from_kubeconfig("/nonexistent")
    bad = tmp_path / "bad"
    bad.write_text("contexts: 7\n")
    with pytest.raises(KubeApiError, match=r"^cannot read the kubeconfig .*/bad: "):
        from_kubeconfig(str(bad))
    with pytest.raises(KubeApiError, match=r"^cannot use the API server address 'ftp://x'$"):
        from_kubeconfig(str(kubeconfig(tmp_path, "{token: t}", 'server: "ftp://x"')))


def test_outside_a_pod_there_are_no_in_cluster_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert in_cluster() is None
