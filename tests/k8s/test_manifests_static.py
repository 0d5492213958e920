"""What the manifests promise without an API server: the extender's verbs stay on the pod's loopback (beside
kube-scheduler), its read-only /healthz and /status listen on the pod's address for the Service and kubelet's probes,
the command-line default keeps the verbs off other machines, and the image the chart names is the one
deploy/Dockerfile builds."""

from __future__ import annotations

import inspect
import socket
import threading
import time
import tomllib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
import yaml
from prometheus_client.parser import text_string_to_metric_families

from corral.k8s.cli import bind_socket, extender_cmd
from corral.k8s.extender import Extender, create_app
from tests.k8s.chart import DEPLOY, documents, plain_manifests
from tests.k8s.conftest import Cluster, free_port

ROOT = DEPLOY.parents[1]


def objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in documents(plain_manifests())}


def extender_container() -> dict[str, Any]:
    deploy = objects()[("Deployment", "corral-scheduler")]
    [c] = [c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == "corral-extender"]
    return dict(c)


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_the_command_line_default_keeps_the_verbs_on_loopback() -> None:
    assert inspect.signature(extender_cmd).parameters["host"].default == "127.0.0.1"


def test_verbs_on_loopback_health_on_the_pods_address_probes_and_service_reach_it() -> None:
    c = extender_container()
    cmd = c["command"]
    assert option(cmd, "--host") == "127.0.0.1"
    assert option(cmd, "--health-host") == "$(POD_IP)"
    [env] = [e for e in c["env"] if e["name"] == "POD_IP"]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    [port] = c["ports"]
    assert (port["name"], str(port["containerPort"])) == ("health", option(cmd, "--health-port"))
    for probe in ("readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert "host" not in get, f"{probe}: kubelet probes the pod's address unless told a host"
        assert (get["path"], get["port"]) == ("/healthz", "health")
    svc = objects()[("Service", "corral-extender")]
    assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["health"]
    config = yaml.safe_load(objects()[("ConfigMap", "corral-scheduler-config")]["data"]["scheduler-config.yaml"])
    assert config["extenders"][0]["urlPrefix"] == f"http://127.0.0.1:{option(cmd, '--port')}"


def test_prometheus_is_told_where_each_metrics_endpoint_listens() -> None:
    """The prometheus.io/* annotations name the port /metrics is served on: the extender's health port (on the pod's
    address, read-only), and the device plugin's --metrics-port, which its container declares."""
    scheduler = objects()[("Deployment", "corral-scheduler")]["spec"]["template"]
    plugin = objects()[("DaemonSet", "corral-device-plugin")]["spec"]["template"]
    [device] = plugin["spec"]["containers"]
    wanted = {
        "extender": (scheduler, option(extender_container()["command"], "--health-port")),
        "device plugin": (plugin, option(device["command"], "--metrics-port")),
    }
    for who, (template, port) in wanted.items():
        notes = template["metadata"]["annotations"]
        assert notes == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": port,
            "prometheus.io/path": "/metrics",
        }, who
    assert [(p["name"], str(p["containerPort"])) for p in device["ports"]] == [("metrics", wanted["device plugin"][1])]


def test_the_chart_names_the_image_the_dockerfile_builds() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert f"-t corral/corral:{version} " in dockerfile
    for (kind, _), d in objects().items():
        if kind in ("Deployment", "DaemonSet"):
            images = [c["image"] for c in d["spec"]["template"]["spec"]["containers"]]
            assert f"corral/corral:{version}" in images
    values = yaml.safe_load((DEPLOY / "helm" / "corral" / "values.yaml").read_text())
    assert values["image"]["corral"] == f"corral/corral:{version}"


@pytest.fixture
def two_listeners() -> Iterator[tuple[str, str]]:
    """The extender as `corral k8s extender --health-host` serves it: one server, two sockets."""
    verbs, health = free_port(), free_port()
    sockets = [bind_socket("127.0.0.1", verbs), bind_socket("127.0.0.1", health)]
    app = create_app(Extender(Cluster().state, None), health_only_ports=frozenset({health}))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{verbs}", f"http://127.0.0.1:{health}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        for s in sockets:
            s.close()


def test_the_health_address_serves_no_verbs(two_listeners: tuple[str, str]) -> None:
    verbs, health = two_listeners
    body = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n"}
    for base in (verbs, health):
        assert httpx.get(f"{base}/healthz").status_code == 200
        assert httpx.get(f"{base}/status").status_code == 200
    scraped = httpx.get(f"{health}/metrics")  # where the pod's prometheus.io/port annotation sends Prometheus
    assert scraped.status_code == 200
    families = {f.name for f in text_string_to_metric_families(scraped.text)}
    assert {"corral_extender_requests", "corral_extender_decisions"} <= families, families
    for verb in ("filter", "prioritize", "bind", "preempt"):
        r = httpx.post(f"{health}/{verb}", json=body)
        assert r.status_code == 404 and "not served on this address" in r.json()["Error"]
    assert httpx.post(f"{verbs}/bind", json=body).status_code == 200  # the verbs port answers (a refusal, in shape)


def test_bind_socket_refuses_a_port_in_use() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(OSError):
            bind_socket("127.0.0.1", s.getsockname()[1])
