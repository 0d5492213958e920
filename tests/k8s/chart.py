"""The Helm chart rendered without helm (there is none on the development machines, and none in apt or PyPI that
runs here), and the plain manifest files made from it.

`render_chart` supports exactly the subset the templates use and fails on anything else:

    {{ .Values.x.y }}  {{ .Release.Namespace }}          values, as text
    {{- if eq .Values.x.y "word" }} ... {{- else }} ... {{- end }}
                                                          one level, each tag alone on its line (helm's `{{-` then
                                                          leaves the text between the tags exactly as this does)

Values are the chart's values.yaml with `overrides` merged over it (as `helm install --set`), checked against the
chart's values.schema.json as helm checks them. Like `helm install`, it orders the objects by kind (helm's
InstallOrder: namespaces and service accounts before the roles that name them, roles before bindings, config maps
before the workloads that mount them), so one pass of creates applies the whole file on a fresh API server.

    python -m tests.k8s.chart > deploy/kubernetes/corral.yaml
    python -m tests.k8s.chart scheduler.mode=standalone > deploy/kubernetes/corral-standalone.yaml
"""

from __future__ import annotations

import copy
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
CHART = DEPLOY / "helm" / "corral"
NAMESPACE = "corral-system"
#: The plain manifest files: file name -> the values they are rendered with (over the chart's defaults).
PLAIN = {"corral.yaml": {}, "corral-standalone.yaml": {"scheduler": {"mode": "standalone"}}}
_EXPR = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_CONTROL = re.compile(r"^\s*\{\{-?\s*(if eq (\.Values\.[\w.]+) \"([\w-]*)\"|else|end)\s*-?\}\}\s*$")
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


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` merged into a copy of `base`, maps key by key (helm's coalescing of --set over values.yaml)."""
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def chart_values(overrides: Mapping[str, Any] | None = None, chart: Path = CHART) -> dict[str, Any]:
    """values.yaml with `overrides` over it, validated against values.schema.json (jsonschema.ValidationError)."""
    values = merged(yaml.safe_load((chart / "values.yaml").read_text()), overrides or {})
    jsonschema.validate(values, json.loads((chart / "values.schema.json").read_text()))
    return values


def _lookup(values: Mapping[str, Any], expr: str) -> Any:
    node: Any = values
    for part in expr.removeprefix(".Values.").split("."):
        node = node[part]
    return node


def _branches(text: str, values: Mapping[str, Any], name: str) -> str:
    """The template with its if/else/end blocks decided (one level, each tag on a line of its own)."""
    out: list[str] = []
    keep: list[bool] = []  # the open block's state: is its current branch kept?
    for line in text.splitlines(keepends=True):
        if "{{" in line and re.search(r"\{\{-?\s*(if|else|end|range|with|define|include|template)\b", line):
            m = _CONTROL.match(line)
            if m is None:
                raise AssertionError(f"{name}: {line.strip()!r} is outside the subset render_chart supports")
            if m.group(1).startswith("if"):
                if keep:
                    raise AssertionError(f"{name}: nested if: outside the subset render_chart supports")
                keep.append(str(_lookup(values, m.group(2))) == m.group(3))
            elif m.group(1) == "else":
                keep[-1] = not keep[-1]
            else:
                keep.pop()
            continue
        if not keep or keep[-1]:
            out.append(line)
    if keep:
        raise AssertionError(f"{name}: an if without its end")
    return "".join(out)


def render_chart(chart: Path = CHART, namespace: str = NAMESPACE, overrides: Mapping[str, Any] | None = None) -> str:
    """The chart's objects for its values (defaults, `overrides` over them), one YAML document each, in helm's
    install order (stable within a kind: template file order, then document order)."""
    values = chart_values(overrides, chart)

    def lookup(match: re.Match[str]) -> str:
        expr = match.group(1)
        if expr == ".Release.Namespace":
            return namespace
        if not expr.startswith(".Values."):
            raise AssertionError(f"template uses {expr!r}: outside the subset render_chart supports")
        return str(_lookup(values, expr))

    docs: list[str] = []
    for t in sorted((chart / "templates").glob("*.yaml")):
        text = _EXPR.sub(lookup, _branches(t.read_text(), values, t.name))
        for doc in re.split(r"(?m)^---\s*$", text):
            body = doc.strip()
            if not yaml.safe_load(body):
                continue  # a comment-only document
            docs.append(f"# Source: corral/templates/{t.name}\n{body}\n")
    docs.sort(key=_kind_rank)
    return "---\n".join(docs)


def plain_manifests(name: str = "corral.yaml") -> str:
    """deploy/kubernetes/NAME: the namespace, then the chart rendered into it with PLAIN[name]'s values."""
    return (DEPLOY / "namespace.yaml").read_text() + "---\n" + render_chart(overrides=PLAIN[name])


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _set(assignments: list[str]) -> dict[str, Any]:
    """helm's --set a.b=c, as nested maps (strings only: what this chart's modes need)."""
    out: dict[str, Any] = {}
    for a in assignments:
        path, _, value = a.partition("=")
        *parents, leaf = path.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


if __name__ == "__main__":
    overrides = _set(sys.argv[1:])
    [name] = [n for n, v in PLAIN.items() if v == overrides] or [""]
    if not name:
        raise SystemExit(f"no plain manifest file is rendered with {overrides}; see PLAIN")
    print(plain_manifests(name), end="")
