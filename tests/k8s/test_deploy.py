"""deploy/kubernetes: the Helm chart, rendered for its default values, is the plain manifest file; every object is
valid against the Kubernetes schemas (kubernetes-validate, offline); the scheduler configuration has the extender
stanza kube-scheduler needs; every sample pod converts to the request its comment promises.

There is no helm binary on the development machines, so the chart is rendered by tests/k8s/chart.py.
"""

from __future__ import annotations

from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate
import pytest
import yaml

from corral.k8s.convert import HAMI_RESOURCES, pod_request
from corral.k8s.deviceplugin import IDS_PER_GPU
from tests.k8s.chart import DEPLOY, PLAIN, chart_values, documents, plain_manifests, render_chart

ROOT = DEPLOY
K8S_VERSION = "1.32.0"


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_plain_manifests_are_the_chart_rendered(name: str) -> None:
    sets = " ".join(f"scheduler.mode={v['scheduler']['mode']}" for v in [PLAIN[name]] if v)
    assert (ROOT / name).read_text() == plain_manifests(name), (
        f"regenerate it: python -m tests.k8s.chart {sets} > deploy/kubernetes/{name}".replace("  ", " ")
    )


@pytest.mark.parametrize("path", [*sorted(PLAIN), *sorted(p.name for p in (ROOT / "samples").glob("*.yaml"))])
def test_objects_are_valid_against_the_kubernetes_schemas(path: str) -> None:
    file = ROOT / path if path in PLAIN else ROOT / "samples" / path
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
    assert set(fit["args"]["ignoredResources"]) == {"corral.dev/gpu-memory", "elasticgpu.io/gpu-memory",
                                                    *HAMI_RESOURCES}  # fmt: skip
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
        ("hami-vgpu", (1, 300, 8192)),
    ],
)
def test_sample_pods_convert(sample: str, gpus: tuple[int, int, int]) -> None:
    [pod] = documents((ROOT / "samples" / f"{sample}.yaml").read_text())
    r = pod_request(pod).request
    assert (r.gpu_count, r.gpu_milli, r.gpu_memory_mib) == gpus
    assert pod["spec"]["schedulerName"] == "corral-scheduler"


def test_the_standalone_mode_runs_corrals_scheduler_with_the_agreed_flags_and_rbac() -> None:
    """scheduler.mode=standalone: no kube-scheduler, no extender, no scheduler configuration; one Deployment running
    `corral k8s scheduler` with the flags of its contract, its ServiceAccount bound to exactly the RBAC it needs
    (k8s-shared), a Service for /metrics; the device plugin is the same in both modes."""
    docs = {(d["kind"], d["metadata"]["name"]): d for d in documents((ROOT / "corral-standalone.yaml").read_text())}
    extender = {(d["kind"], d["metadata"]["name"]): d for d in documents((ROOT / "corral.yaml").read_text())}
    assert not [k for k in docs if k[0] == "ConfigMap" or "extender" in k[1] or "kube-scheduler" in k[1]]
    deploy = docs[("Deployment", "corral-scheduler")]
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"] == {"type": "Recreate"}
    pod = deploy["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "corral-scheduler"
    [c] = pod["containers"]
    cmd = c["command"]
    assert cmd[:3] == ["corral", "k8s", "scheduler"] and "--kubeconfig" not in cmd  # in-cluster: its ServiceAccount
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert flags == {"--scheduler-name": "corral-scheduler", "--policy": "fgd-priced", "--behavior": "preferential",
                     "--qps": "50", "--burst": "100", "--batch-window-ms": "5", "--bind-workers": "16",
                     "--listen": "0.0.0.0:9444", "--queues": ""}  # fmt: skip
    # scheduler.queues: '' runs without queues; the file comes from an optional ConfigMap (docs/k8s-scheduler.md)
    assert pod["volumes"] == [{"name": "queues", "configMap": {"name": "corral-queues", "optional": True}}]
    assert c["volumeMounts"] == [{"name": "queues", "mountPath": "/etc/corral/queues", "readOnly": True}]
    assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [("http", 9444)]
    assert deploy["spec"]["template"]["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "9444", "prometheus.io/path": "/metrics"}  # fmt: skip
    assert (c["readinessProbe"]["httpGet"], c["livenessProbe"]["httpGet"]) == (
        {"path": "/readyz", "port": "http"}, {"path": "/healthz", "port": "http"})  # fmt: skip
    svc = docs[("Service", "corral-scheduler")]
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(9444, "http")]
    assert svc["spec"]["selector"] == deploy["spec"]["template"]["metadata"]["labels"]
    rules = {(g, r): set(rule["verbs"]) for rule in docs[("ClusterRole", "corral-scheduler")]["rules"]
             for g in rule["apiGroups"] for r in rule["resources"]}  # fmt: skip
    assert rules == {
        ("", "nodes"): {"get", "list", "watch"},
        ("", "pods"): {"get", "list", "watch", "delete"},  # delete: a gang's bound part past its deadline
        ("scheduling.x-k8s.io", "podgroups"): {"get", "list", "watch"},
        ("scheduling.volcano.sh", "podgroups"): {"get", "list", "watch"},
        ("", "pods/binding"): {"create"},
        ("", "bindings"): {"create"},  # corral's client posts namespaces/NS/bindings (test_e2e_manifests proves it)
        ("", "pods/status"): {"patch"},
        ("", "events"): {"create", "patch"},
        ("events.k8s.io", "events"): {"create", "patch"},
        ("", "pods/eviction"): {"create"},  # preemption through the Eviction API
        ("policy", "poddisruptionbudgets"): {"get", "list", "watch"},  # budgets watched: their pods never picked
    }
    binding = docs[("ClusterRoleBinding", "corral-scheduler")]
    assert binding["roleRef"]["name"] == "corral-scheduler"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "corral-scheduler", "namespace": "corral-system"}]
    for key in [("DaemonSet", "corral-device-plugin"), ("ServiceAccount", "corral-scheduler")]:
        assert docs[key] == extender[key]
    assert ("Deployment", "corral-scheduler") in extender and ("ClusterRole", "corral-scheduler") not in extender


def test_values_are_checked_against_the_schema_and_the_renderer_refuses_what_it_cannot_render() -> None:
    assert chart_values()["scheduler"]["mode"] == "extender"
    with pytest.raises(jsonschema.ValidationError, match="'both' is not one of \\['extender', 'standalone'\\]"):
        render_chart(overrides={"scheduler": {"mode": "both"}})
    with pytest.raises(jsonschema.ValidationError):
        chart_values({"devicePlugin": {"gpuSplit": 0}})


def test_the_device_plugin_advertises_what_the_chart_says(tmp_path: Any) -> None:
    [ds] = [
        d
        for d in documents(
            render_chart(overrides={"devicePlugin": {"resources": "corral.dev/gpu,nvidia.com/gpu", "gpuSplit": 10}})
        )
        if d["kind"] == "DaemonSet"
    ]
    cmd = ds["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--resource") + 1] == "corral.dev/gpu,nvidia.com/gpu"
    assert cmd[cmd.index("--gpu-split") + 1] == "10"
    default = chart_values()["devicePlugin"]["resources"].split(",")
    assert set(default) <= set(IDS_PER_GPU) and "nvidia.com/gpu" not in default  # NVIDIA's plugin may own it


@pytest.mark.parametrize(("name", "kind"), [("corral-standalone.yaml", "Deployment"), ("corral.yaml", "DaemonSet")])
def test_the_commands_the_chart_runs_are_the_clis(name: str, kind: str, tmp_path: Any) -> None:
    """Every flag the chart passes `corral k8s scheduler` and `corral k8s device-plugin` is one they take: run with a
    kubeconfig that is not there, they get as far as reading it."""
    from typer.testing import CliRunner

    from corral.cli.main import app

    [d] = [d for d in documents((ROOT / name).read_text()) if d["kind"] == kind]
    [c] = [c for c in d["spec"]["template"]["spec"]["containers"] if c["command"][0] == "corral"]
    extra = ["--node-name", "n1", "--simulate-gpus", "1xA100-80GB"] if kind == "DaemonSet" else []
    missing = str(tmp_path / "kubeconfig")
    r = CliRunner().invoke(app, [*c["command"][1:], *extra, "--kubeconfig", missing])
    assert r.exit_code == 2 and "kube" in r.output and "No such option" not in r.output, r.output
    assert ("cannot read the kubeconfig" if kind == "Deployment" else "cannot configure the Kubernetes client") in (
        r.output)  # fmt: skip
