"""The Helm chart rendered without helm (there is none on the development machines, and none in apt or PyPI), and
the plain manifest file made from it.

`render_chart` supports exactly the subset the templates use ({{ .Values.x.y }}, {{ .Release.Namespace }}) and fails
on anything else. Like `helm install`, it orders the objects by kind (helm's InstallOrder: namespaces and service
accounts before the roles that name them, roles before bindings, config maps before the workloads that mount them),
so one pass of creates applies the whole file on a fresh API server.

    python -m tests.k8s.chart > deploy/kubernetes/corral.yaml
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
CHART = DEPLOY / "helm" / "corral"
NAMESPACE = "corral-system"
_EXPR = re.compile(r"\{\{\s*(.*?)\s*\}\}")
#: helm's releaseutil.InstallOrder (the kinds this chart has, and the ones around them)
INSTALL_ORDER = (
    "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodSecurityPolicy", "PodDisruptionBudget",
    "ServiceAccount", "Secret", "SecretList", "ConfigMap", "StorageClass", "PersistentVolume",
    "PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
    "ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service", "DaemonSet", "Pod",
    "ReplicationController", "ReplicaSet", "Deployment", "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob",
    "IngressClass", "Ingress", "APIService",
)  # fmt: skip


def _kind_rank(doc: str) -> int:
    kind = (yaml.safe_load(doc) or {}).get("kind", "")
    return INSTALL_ORDER.index(kind) if kind in INSTALL_ORDER else len(INSTALL_ORDER)


def render_chart(chart: Path = CHART, namespace: str = NAMESPACE) -> str:
    """The chart's objects for its default values, one YAML document each, in helm's install order (stable within a
    kind: template file order, then document order)."""
    values = yaml.safe_load((chart / "values.yaml").read_text())

    def lookup(match: re.Match[str]) -> str:
        expr = match.group(1)
        if expr == ".Release.Namespace":
            return namespace
        if not expr.startswith(".Values."):
            raise AssertionError(f"template uses {expr!r}: outside the subset render_chart supports")
        node: Any = values
        for part in expr.removeprefix(".Values.").split("."):
            node = node[part]
        return str(node)

    docs: list[str] = []
    for t in sorted((chart / "templates").glob("*.yaml")):
        text = _EXPR.sub(lookup, t.read_text())
        for doc in re.split(r"(?m)^---\s*$", text):
            body = doc.strip()
            if not yaml.safe_load(body):
                continue  # a comment-only document
            docs.append(f"# Source: corral/templates/{t.name}\n{body}\n")
    docs.sort(key=_kind_rank)
    return "---\n".join(docs)


def plain_manifests() -> str:
    """deploy/kubernetes/corral.yaml: the namespace, then the chart rendered into it."""
    return (DEPLOY / "namespace.yaml").read_text() + "---\n" + render_chart()


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


if __name__ == "__main__":
    print(plain_manifests(), end="")
