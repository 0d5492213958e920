"""deploy/kubernetes against a REAL kube-apiserver (v1.34.2, from ../shared/k8s/control-plane.sh):

- corral.yaml is created in one pass, in file order, on a fresh API server (the official client's create-from-yaml,
  as one `kubectl apply -f` would: an object whose namespace or ServiceAccount comes later fails);
- the chart, rendered for another namespace that exists first (`helm install --create-namespace`), is created the
  same way, and makes no Namespace of its own;
- the extender's ServiceAccount, with exactly the chart's RBAC, can do what the extender does (list and watch nodes
  and pods, bind with the assignment annotations in the Binding) and no more (no pod patches);
- both scheduler modes, rendered, pass a server-side dry-run apply with strict field validation (an unknown or
  duplicated field is an error, not a warning), and the standalone mode's ServiceAccount can do what `corral k8s
  scheduler` does (bind with annotations, set the PodScheduled condition, write Events) and no more;
- the extender (its own process, behind the plane's kube-scheduler with the chart's configuration) binds pods that
  ask in HAMi's style, with the GPUs and memory HAMi's resources mean; so does `corral k8s scheduler` run with the
  chart's standalone flags and a token of the chart's ServiceAccount (its RBAC is enough: binds, conditions,
  events), and a hostile HAMi pod gets its reason in its PodScheduled condition.

Skipped where the control plane's script or its tools are absent.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, dynamic, utils

from corral.k8s.client import RealKubeApi
from corral.k8s.convert import ANN_ASSIGNMENT, parse_assignment
from tests.k8s.chart import DEPLOY, PLAIN, documents, plain_manifests, render_chart
from tests.k8s.extender_proc import ExtenderProcess
from tests.k8s.plane import Plane, chart_scheduler_config, gpu_node, pod, write_config
from tests.k8s.scheduler_proc import SchedulerProcess

MODES = ("extender", "standalone")


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    found = Plane.find(tmp_path_factory.mktemp("manifests-plane"))
    if found is None:
        pytest.skip("no control plane here (../shared/k8s/control-plane.sh, openssl, curl, xz)")
    try:
        found.up()
        yield found
    finally:
        found.down()


@pytest.fixture(scope="module")
def admin(plane: Plane) -> client.ApiClient:
    return RealKubeApi(kubeconfig=plane.kubeconfig).core.api_client


def create_all(api: client.ApiClient, docs: list[dict[str, Any]]) -> None:
    """One pass in order, as `kubectl apply -f FILE` goes; FailToCreateError names every object that failed."""
    utils.create_from_yaml(api, yaml_objects=docs)


def delete_all(api: client.ApiClient, docs: list[dict[str, Any]]) -> None:
    dyn = dynamic.DynamicClient(api)
    for d in reversed(docs):
        res = dyn.resources.get(api_version=d["apiVersion"], kind=d["kind"])
        meta = d["metadata"]
        res.delete(name=meta["name"], namespace=meta.get("namespace"))


def sa_client(admin: client.ApiClient, namespace: str, name: str) -> client.CoreV1Api:
    """A client that is the ServiceAccount itself: a token from the TokenRequest API, no other rights."""
    core = client.CoreV1Api(admin)
    req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))
    token = core.create_namespaced_service_account_token(name, namespace, req).status.token
    conf = client.Configuration()
    conf.host = admin.configuration.host
    conf.ssl_ca_cert = admin.configuration.ssl_ca_cert
    conf.api_key = {"authorization": f"Bearer {token}"}
    return client.CoreV1Api(client.ApiClient(conf))


def test_the_plain_manifests_create_in_one_pass_and_the_extender_needs_no_pod_patch(admin: client.ApiClient) -> None:
    docs = documents(plain_manifests())
    assert docs == documents((DEPLOY / "corral.yaml").read_text())
    create_all(admin, docs)
    try:
        apps = client.AppsV1Api(admin)
        assert apps.read_namespaced_deployment("corral-scheduler", "corral-system").spec.replicas == 1
        assert apps.read_namespaced_daemon_set("corral-device-plugin", "corral-system")
        core = client.CoreV1Api(admin)
        core.create_namespaced_pod("default", pod("rbac-probe", {"corral.dev/gpu": "1"}, {"team": "vision"}))
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "rbac-node"}})
        uid = core.read_namespaced_pod("rbac-probe", "default").metadata.uid
        ext = sa_client(admin, "corral-system", "corral-scheduler")
        assert ext.list_node().items and ext.list_pod_for_all_namespaces().items
        # what the extender writes: one Binding that carries the assignment
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name="rbac-probe", namespace="default", uid=uid,
                                         annotations={ANN_ASSIGNMENT: '{"node":"rbac-node"}'}),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name="rbac-node"),
        )  # fmt: skip
        ext.create_namespaced_binding("default", body, _preload_content=False)
        bound = core.read_namespaced_pod("rbac-probe", "default")
        assert bound.spec.node_name == "rbac-node"
        assert bound.metadata.annotations == {"team": "vision", ANN_ASSIGNMENT: '{"node":"rbac-node"}'}
        # and nothing it does not need: the chart grants no pod patches
        with pytest.raises(client.ApiException) as denied:
            ext.patch_namespaced_pod("rbac-probe", "default", {"metadata": {"labels": {"x": "y"}}})
        assert denied.value.status == 403
        plugin = sa_client(admin, "corral-system", "corral-device-plugin")
        plugin.patch_node("rbac-node", {"metadata": {"annotations": {"corral.dev/gpus": "[]"}}})
        core.delete_namespaced_pod("rbac-probe", "default", grace_period_seconds=0)
        core.delete_node("rbac-node")
    finally:
        delete_all(admin, docs)


def test_the_chart_installs_into_a_namespace_made_for_it(admin: client.ApiClient) -> None:
    rendered = documents(render_chart(namespace="corral-e2e"))
    assert not [d for d in rendered if d["kind"] == "Namespace"], "a chart must not create its release namespace"
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": "corral-e2e"}})  # helm's --create-namespace
    create_all(admin, rendered)
    try:
        apps = client.AppsV1Api(admin)
        deploy = apps.read_namespaced_deployment("corral-scheduler", "corral-e2e")
        assert {c.name for c in deploy.spec.template.spec.containers} == {"kube-scheduler", "corral-extender"}
        svc = client.CoreV1Api(admin).read_namespaced_service("corral-extender", "corral-e2e")
        assert svc.spec.ports[0].target_port == "health"
    finally:
        delete_all(admin, rendered)


def test_the_old_order_fails_on_a_fresh_api_server(admin: client.ApiClient) -> None:
    """The check has teeth: a DaemonSet before its Namespace (the order corral.yaml had) is refused. (Another
    namespace: with no controller-manager here, a deleted namespace stays Terminating.)"""
    ds = [d for d in documents(render_chart(namespace="corral-order")) if d["kind"] == "DaemonSet"]
    ns = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "corral-order"}}]
    with pytest.raises(utils.FailToCreateError) as failed:
        create_all(admin, [*ds, *ns])
    [refused] = failed.value.api_exceptions
    assert refused.status == 404 and 'namespaces \\"corral-order\\" not found' in refused.body


def strict_dry_run(api: client.ApiClient, doc: dict[str, Any]) -> None:
    """`kubectl create --dry-run=server --validate=strict`: the API server decodes, defaults, validates and admits
    the object, refusing any field it does not know (fieldValidation=Strict: an error, not a warning), and stores
    nothing. (A server-side apply refuses unknown fields too, but with a 500 from building its typed patch.)"""
    dyn = dynamic.DynamicClient(api)
    res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    strict = [("fieldValidation", "Strict")]
    res.create(body=doc, namespace=doc["metadata"].get("namespace"), dry_run="All", query_params=strict)


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_applies_with_strict_field_validation(admin: client.ApiClient, mode: str) -> None:
    namespace = f"corral-strict-{mode}"
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": namespace}})
    docs = documents(render_chart(namespace=namespace, overrides={"scheduler": {"mode": mode}}))
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service"} <= kinds
    assert ("ConfigMap" in kinds) == (mode == "extender")  # kube-scheduler's configuration
    for doc in docs:
        strict_dry_run(admin, doc)
    # nothing was stored
    assert not client.AppsV1Api(admin).list_namespaced_deployment(namespace).items


def test_strict_validation_has_teeth(admin: client.ApiClient) -> None:
    [deploy] = [d for d in documents(plain_manifests("corral-standalone.yaml")) if d["kind"] == "Deployment"]
    deploy["metadata"]["namespace"] = "default"
    deploy["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(client.ApiException) as refused:
        strict_dry_run(admin, deploy)
    assert refused.value.status == 400
    assert 'strict decoding error: unknown field \\"spec.template.spec.containers[0].imagePullPolicyy\\"' in str(
        refused.value.body)  # fmt: skip


def test_the_standalone_manifests_create_in_one_pass_and_grant_what_the_scheduler_does(
    admin: client.ApiClient,
) -> None:
    """The standalone mode's manifests (corral-standalone.yaml's, into a namespace of their own: with no
    controller-manager here the extender test's deleted namespace stays Terminating), created in one pass in file
    order; its ServiceAccount (a token of its own) lists nodes and pods, binds with the assignment in the Binding,
    sets a pod's PodScheduled condition, writes core and events.k8s.io Events, reads PodDisruptionBudgets, evicts a
    pod through the Eviction API, and may not patch a pod itself."""
    ns = "corral-sa"
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            *documents(render_chart(namespace=ns, overrides=PLAIN["corral-standalone.yaml"]))]  # fmt: skip
    core = client.CoreV1Api(admin)
    create_all(admin, docs)
    try:
        core.create_namespaced_pod("default", pod("sched-probe", {"nvidia.com/gpu": "1"}))
        core.create_namespaced_pod("default", pod("pending-probe", {"nvidia.com/gpu": "1"}))
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "sched-node"}})
        uid = core.read_namespaced_pod("sched-probe", "default").metadata.uid
        sched = sa_client(admin, ns, "corral-scheduler")
        assert sched.list_node().items and sched.list_pod_for_all_namespaces().items
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name="sched-probe", namespace="default", uid=uid,
                                         annotations={ANN_ASSIGNMENT: '{"node":"sched-node"}'}),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name="sched-node"),
        )  # fmt: skip
        sched.create_namespaced_binding("default", body, _preload_content=False)
        assert core.read_namespaced_pod("sched-probe", "default").spec.node_name == "sched-node"
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": "0/1 nodes fit: 1 insufficient GPU"}  # fmt: skip
        sched.patch_namespaced_pod_status("pending-probe", "default", {"status": {"conditions": [condition]}})
        [got] = [c for c in core.read_namespaced_pod("pending-probe", "default").status.conditions
                 if c.type == "PodScheduled"]  # fmt: skip
        assert (got.reason, got.message) == ("Unschedulable", "0/1 nodes fit: 1 insufficient GPU")
        ref = client.V1ObjectReference(kind="Pod", namespace="default", name="pending-probe")
        sched.create_namespaced_event("default", client.CoreV1Event(
            metadata=client.V1ObjectMeta(name="pending-probe.core"), involved_object=ref,
            reason="FailedScheduling", message="0/1 nodes fit", type="Warning",
            source=client.V1EventSource(component="corral-scheduler")))  # fmt: skip
        token_api = sched.api_client
        client.EventsV1Api(token_api).create_namespaced_event("default", client.EventsV1Event(
            metadata=client.V1ObjectMeta(name="pending-probe.events"), regarding=ref, reason="FailedScheduling",
            note="0/1 nodes fit", type="Warning", action="Scheduling", reporting_controller="corral-scheduler",
            reporting_instance="corral-scheduler-0", event_time=datetime.datetime.now(datetime.UTC)))  # fmt: skip
        with pytest.raises(client.ApiException) as denied:
            sched.patch_namespaced_pod("pending-probe", "default", {"metadata": {"labels": {"x": "y"}}})
        assert denied.value.status == 403
        # preemption: the budgets read (listed and watched), a victim evicted through the Eviction API
        budgets = client.PolicyV1Api(token_api)
        assert budgets.list_pod_disruption_budget_for_all_namespaces(watch=False).items is not None
        sched.create_namespaced_pod_eviction("sched-probe", "default", client.V1Eviction(
            metadata=client.V1ObjectMeta(name="sched-probe", namespace="default")))  # fmt: skip
        assert "sched-probe" not in [p.metadata.name for p in core.list_namespaced_pod("default").items]
        core.delete_namespaced_pod("pending-probe", "default", grace_period_seconds=0)
        core.delete_node("sched-node")
    finally:
        delete_all(admin, docs)


HAMI_PODS = {
    # name: (limits, annotations, expected (milli, MiB) per GPU, GPUs)
    "hami-half": ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50", "nvidia.com/gpucores": "50"}, {},
                  (500, 40960), 1),
    "hami-mib": ({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "20"},
                 {"nvidia.com/use-gputype": "NVIDIA-A100-SXM4-80GB"}, (200, 10240), 2),
    "hami-whole": ({"nvidia.com/gpu": "1"}, {}, (1000, 81920), 1),
}  # fmt: skip


def hami_node(core: client.CoreV1Api) -> None:
    """4 A100s; nvidia.com/gpu 10 per GPU, as the device plugin advertises it with --gpu-split 10."""
    node = gpu_node("hami-node", 4, model="A100", memory_mib=81920)
    for key in ("capacity", "allocatable"):
        node["status"][key]["nvidia.com/gpu"] = "40"
    core.create_node(node)


def bound_as_hami_means(core: client.CoreV1Api, log: str) -> None:
    """Wait for HAMI_PODS to be bound, and check each one's GPUs and shares."""
    deadline = time.monotonic() + 60
    bound: dict[str, Any] = {}
    while len(bound) < len(HAMI_PODS) and time.monotonic() < deadline:
        bound = {p.metadata.name: p for p in core.list_namespaced_pod("default").items
                 if p.metadata.name in HAMI_PODS and p.spec.node_name}  # fmt: skip
        time.sleep(0.2)
    assert set(bound) == set(HAMI_PODS), log
    used: list[str] = []
    for name, (_, _, share, count) in HAMI_PODS.items():
        annotations = bound[name].metadata.annotations
        a = parse_assignment(annotations)
        assert a is not None and a.node == "hami-node"
        slots = a.containers["main"]
        assert [(s.milli, s.memory_mib) for s in slots] == [share] * count, name
        assert annotations["hami.io/vgpu-devices-allocated"].count(",NVIDIA,") == count
        used += [s.uuid for s in slots if s.milli == 1000]
    assert len(used) == len(set(used))  # a whole GPU is nobody else's


def test_the_extender_binds_hami_style_pods(plane: Plane, tmp_path: Path) -> None:
    """HAMi's resources and annotations through the real kube-scheduler (the chart's configuration: it ignores
    HAMi's gpumem/gpucores counts, as HAMi's chart does) and the extender."""
    core = RealKubeApi(kubeconfig=plane.kubeconfig).core
    hami_node(core)
    extender = ExtenderProcess(plane.kubeconfig, tmp_path / "extender.log")
    extender.start()
    try:
        plane.scheduler(write_config(tmp_path / "scheduler.yaml", chart_scheduler_config(extender.url)))
        for name, (limits, annotations, _, _) in HAMI_PODS.items():
            core.create_namespaced_pod("default", pod(name, limits, annotations))
        bound_as_hami_means(core, plane.scheduler_log()[-3000:])
    finally:
        plane.stop_scheduler()
        extender.stop()
        for name in HAMI_PODS:
            core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        core.delete_node("hami-node")


def test_the_standalone_scheduler_with_the_charts_flags_and_rbac_binds_hami_style_pods(
    plane: Plane, admin: client.ApiClient, tmp_path: Path
) -> None:
    """`corral k8s scheduler` with the flags the chart's standalone Deployment passes, authenticated as the chart's
    ServiceAccount (a TokenRequest token, so exactly the chart's ClusterRole): HAMi pods are bound, a hostile one
    (gpucores 250) gets its reason in its PodScheduled condition and a FailedScheduling event, nothing forbidden."""
    ns = "corral-run"
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            *documents(render_chart(namespace=ns, overrides=PLAIN["corral-standalone.yaml"]))]  # fmt: skip
    create_all(admin, docs)
    core = client.CoreV1Api(admin)
    hami_node(core)
    [deploy] = [d for d in docs if d["kind"] == "Deployment"]
    cmd = deploy["spec"]["template"]["spec"]["containers"][0]["command"]
    flags = cmd[3:]
    del flags[flags.index("--listen") : flags.index("--listen") + 2]  # the test listens on a free loopback port
    token = core.create_namespaced_service_account_token("corral-scheduler", ns, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))).status.token  # fmt: skip
    kubeconfig = yaml.safe_load(Path(plane.kubeconfig).read_text())
    kubeconfig["users"][0]["user"] = {"token": token}
    sa_kubeconfig = tmp_path / "kubeconfig"
    sa_kubeconfig.write_text(yaml.safe_dump(kubeconfig))
    scheduler = SchedulerProcess(str(sa_kubeconfig), tmp_path / "scheduler.log", *flags)
    scheduler.start()
    hostile = pod("hami-hostile", {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "250"})
    try:
        for name, (limits, annotations, _, _) in HAMI_PODS.items():
            core.create_namespaced_pod("default", pod(name, limits, annotations))
        core.create_namespaced_pod("default", hostile)
        bound_as_hami_means(core, scheduler.log.read_text()[-3000:])
        deadline = time.monotonic() + 30
        reason = ""
        while not reason and time.monotonic() < deadline:
            conditions = core.read_namespaced_pod("hami-hostile", "default").status.conditions or []
            reason = next((c.message for c in conditions if c.type == "PodScheduled" and c.status == "False"), "")
            time.sleep(0.2)
        assert "nvidia.com/gpucores]: must be 0..100 (percent of a GPU's compute), got '250'" in reason
        events = core.list_namespaced_event("default", field_selector="involvedObject.name=hami-hostile").items
        assert events and {e.reason for e in events} == {"FailedScheduling"} and "gpucores" in events[0].message
        log = scheduler.log.read_text()
        assert "forbidden" not in log.lower() and " 403" not in log, log[-3000:]
    finally:
        scheduler.stop()
        for name in [*HAMI_PODS, "hami-hostile"]:
            core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        core.delete_node("hami-node")
        delete_all(admin, docs)
