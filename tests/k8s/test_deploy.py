"""deploy/kubernetes: the Helm chart, rendered for its default values, is the plain manifest file; every object is
valid against the Kubernetes schemas (kubernetes-validate, offline); the scheduler configuration has the extender
stanza kube-scheduler needs; every sample pod converts to the request its comment promises.

There is no helm binary on the development machines, so the chart is rendered by tests/k8s/chart.py.
"""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from corral.k8s.convert import pod_request
from corral.k8s.deviceplugin import IDS_PER_GPU
from tests.k8s.chart import DEPLOY, documents, plain_manifests

ROOT = DEPLOY
K8S_VERSION = "1.32.0"


def test_plain_manifests_are_the_chart_rendered_with_its_defaults() -> None:
    assert (ROOT / "corral.yaml").read_text() == plain_manifests(), (
        "regenerate it: python -m tests.k8s.chart > deploy/kubernetes/corral.yaml"
    )


@pytest.mark.parametrize("path", ["corral.yaml", *sorted(p.name for p in (ROOT / "samples").glob("*.yaml"))])
def test_objects_are_valid_against_the_kubernetes_schemas(path: str) -> None:
    file = ROOT / path if path == "corral.yaml" else ROOT / "samples" / path
    docs = documents(file.read_text())
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_invalid_objects_are_caught() -> None:
    # the check has teeth: a misspelt field fails
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"portz": []}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_scheduler_configuration_has_the_extender_stanza() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in documents((ROOT / "corral.yaml").read_text())}
    cm = docs[("ConfigMap", "corral-scheduler-config")]
    config = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    assert (config["apiVersion"], config["kind"]) == ("kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration")
    [profile] = config["profiles"]
    assert profile["schedulerName"] == "corral-scheduler"
    [ext] = config["extenders"]
    assert ext["urlPrefix"] == "http://127.0.0.1:8888"
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"], ext["preemptVerb"]) == (
        "filter", "prioritize", "bind", "preempt",
    )  # fmt: skip
    assert ext["nodeCacheCapable"] is True and ext["weight"] > 0
    fit = profile["pluginConfig"][0]
    assert fit["name"] == "NodeResourcesFit"
    # kube-scheduler counts what device plugins advertise (its preemption needs the counts); only GPU memory, which
    # none advertises, is corral's alone
    assert "ignoredResourceGroups" not in fit["args"]
    assert set(fit["args"]["ignoredResources"]) == {"corral.dev/gpu-memory", "elasticgpu.io/gpu-memory"}
    assert not set(IDS_PER_GPU) & set(fit["args"]["ignoredResources"])
    deploy = docs[("Deployment", "corral-scheduler")]
    containers = {c["name"]: c for c in deploy["spec"]["template"]["spec"]["containers"]}
    assert containers["corral-extender"]["command"][:3] == ["corral", "k8s", "extender"]
    assert "--port" in containers["corral-extender"]["command"]
    ds = docs[("DaemonSet", "corral-device-plugin")]
    mounts = {m["mountPath"] for m in ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert {"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources"} <= mounts


@pytest.mark.parametrize(
    ("sample", "gpus"),
    [
        ("corral-whole", (2, 1000, 0)),
        ("corral-share", (1, 300, 10240)),
        ("elastic-cards", (2, 1000, 0)),
        ("elastic-share", (1, 300, 4096)),
        ("nvidia", (1, 1000, 0)),
        ("keti-mps", (1, 0, 8192)),
    ],
)
def test_sample_pods_convert(sample: str, gpus: tuple[int, int, int]) -> None:
    [pod] = documents((ROOT / "samples" / f"{sample}.yaml").read_text())
    r = pod_request(pod).request
    assert (r.gpu_count, r.gpu_milli, r.gpu_memory_mib) == gpus
    assert pod["spec"]["schedulerName"] == "corral-scheduler"
