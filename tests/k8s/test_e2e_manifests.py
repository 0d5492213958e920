"""deploy/kubernetes against a REAL kube-apiserver (v1.34.2, from ../shared/k8s/control-plane.sh):

- corral.yaml is created in one pass, in file order, on a fresh API server (the official client's create-from-yaml,
  as one `kubectl apply -f` would: an object whose namespace or ServiceAccount comes later fails);
- the chart, rendered for another namespace that exists first (`helm install --create-namespace`), is created the
  same way, and makes no Namespace of its own;
- the extender's ServiceAccount, with exactly the chart's RBAC, can do what the extender does (list and watch nodes
  and pods, bind with the assignment annotations in the Binding) and no more (no pod patches).

Skipped where the control plane's script or its tools are absent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, dynamic, utils

from corral.k8s.client import RealKubeApi
from corral.k8s.convert import ANN_ASSIGNMENT
from tests.k8s.chart import DEPLOY, documents, plain_manifests, render_chart
from tests.k8s.plane import Plane, pod


@pytest.fixture(scope="module")
def admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[client.ApiClient]:
    plane = Plane.find(tmp_path_factory.mktemp("manifests-plane"))
    if plane is None:
        pytest.skip("no control plane here (../shared/k8s/control-plane.sh, openssl, curl, xz)")
    try:
        kubeconfig = plane.up()
        api = RealKubeApi(kubeconfig=kubeconfig)
        yield api.core.api_client
    finally:
        plane.down()


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
