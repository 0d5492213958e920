"""FakeKubeApi: an in-memory stand-in for the Kubernetes API server, for tests and benchmarks (no cluster here).

It keeps nodes and pods as JSON dicts with resourceVersions, answers list / watch (events fan out to every open
watch), merges annotation patches and applies Bindings as the API server does: sets spec.nodeName and copies the
Binding's metadata.annotations onto the pod in the same write; a pod already bound gets 409 and stays as it was; like
kube-apiserver it checks neither the Binding's UID nor its node. Calls are recorded so tests can check what corral
asked for.
"""

from __future__ import annotations

import builtins
import copy
import queue
import threading
from collections.abc import Iterator
from typing import Any

from corral.k8s.client import JsonObj, KubeApiError


class FakeKubeApi:
    """An in-memory API server (named a fake on purpose: it implements only what corral calls)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version = 0
        self.nodes: dict[str, JsonObj] = {}
        self.pods: dict[tuple[str, str], JsonObj] = {}
        self._watchers: dict[str, list[queue.Queue[tuple[str, JsonObj] | None]]] = {"nodes": [], "pods": []}
        self.calls: list[tuple[str, ...]] = []
        self.pod_groups: dict[tuple[str, str, str], JsonObj] = {}  # (api, namespace, name) -> PodGroup
        self.events: list[tuple[str, JsonObj]] = []  # (namespace, Event) in the order they were created
        self.fail_next: dict[str, KubeApiError] = {}  # call name -> error raised once, before the call does anything
        self.lose_answer: dict[str, KubeApiError] = {}  # call name -> error raised once, after the call took effect

    # ------------------------------------------------------------------ server side (what tests do)
    def _bump(self, obj: JsonObj) -> None:
        self._version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._version)

    def _emit(self, kind: str, event: str, obj: JsonObj) -> None:
        for q in self._watchers[kind]:
            q.put((event, copy.deepcopy(obj)))

    def put_node(self, node: JsonObj) -> None:
        with self._lock:
            name = node["metadata"]["name"]
            event = "MODIFIED" if name in self.nodes else "ADDED"
            obj = copy.deepcopy(node)
            self._bump(obj)
            self.nodes[name] = obj
            self._emit("nodes", event, obj)

    def put_pod(self, pod: JsonObj) -> None:
        with self._lock:
            meta = pod["metadata"]
            key = (meta.get("namespace") or "default", meta["name"])
            event = "MODIFIED" if key in self.pods else "ADDED"
            obj = copy.deepcopy(pod)
            obj["metadata"].setdefault("namespace", key[0])
            self._bump(obj)
            self.pods[key] = obj
            self._emit("pods", event, obj)

    def subscribe(self, kind: str) -> queue.Queue[tuple[str, JsonObj] | None]:
        """A queue that receives every later event of `kind` (tests deliver them to a state when they choose)."""
        q: queue.Queue[tuple[str, JsonObj] | None] = queue.Queue()
        with self._lock:
            self._watchers[kind].append(q)
        return q

    def unsubscribe(self, kind: str, q: queue.Queue[tuple[str, JsonObj] | None]) -> None:
        with self._lock:
            if q in self._watchers[kind]:
                self._watchers[kind].remove(q)

    def get_pod_group(self, api: str, namespace: str, name: str) -> JsonObj:
        with self._lock:
            self.calls.append(("get_pod_group", api, namespace, name))
            group = self.pod_groups.get((api, namespace, name))
            if group is None:
                raise KubeApiError(f"podgroups {name!r} not found", 404)
            return copy.deepcopy(group)

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            obj = self.pods.pop((namespace, name))
            self._bump(obj)
            self._emit("pods", "DELETED", obj)

    def close_watches(self) -> None:
        """End every open watch stream (as an API server restart would)."""
        with self._lock:
            for qs in self._watchers.values():
                for q in qs:
                    q.put(None)

    # ------------------------------------------------------------------ KubeApi
    def _maybe_fail(self, name: str) -> None:
        err = self.fail_next.pop(name, None)
        if err is not None:
            raise err

    def list(self, kind: str, field_selector: str = "") -> tuple[list[JsonObj], str]:
        with self._lock:
            self.calls.append(("list", kind))
            items = list(self.nodes.values()) if kind == "nodes" else list(self.pods.values())
            if field_selector.startswith("spec.nodeName="):
                node = field_selector.split("=", 1)[1]
                items = [p for p in items if (p.get("spec") or {}).get("nodeName") == node]
            return copy.deepcopy(items), str(self._version)

    def watch(self, kind: str, resource_version: str, stop: threading.Event) -> Iterator[tuple[str, JsonObj]]:
        q: queue.Queue[tuple[str, JsonObj] | None] = queue.Queue()
        with self._lock:
            self._watchers[kind].append(q)
        try:
            while not stop.is_set():
                try:
                    item = q.get(timeout=0.05)
                except queue.Empty:
                    continue
                if item is None:
                    return
                yield item
        finally:
            with self._lock:
                self._watchers[kind].remove(q)

    def get_pod(self, namespace: str, name: str) -> JsonObj:
        with self._lock:
            self.calls.append(("get_pod", namespace, name))
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise KubeApiError(f"pods {name!r} not found", 404)
            return copy.deepcopy(pod)

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._maybe_fail("patch_pod_annotations")
        with self._lock:
            self.calls.append(("patch_pod_annotations", namespace, name))
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise KubeApiError(f"pods {name!r} not found", 404)
            pod["metadata"].setdefault("annotations", {}).update(annotations)
            self._bump(pod)
            self._emit("pods", "MODIFIED", pod)

    def create_binding(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str] | None = None
    ) -> None:
        self._maybe_fail("create_binding")
        with self._lock:
            self.calls.append(("create_binding", namespace, name, node))
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise KubeApiError(f"pods {name!r} not found", 404)
            # Like kube-apiserver (v1.34.2, seen in tests/k8s/test_control_plane.py): neither the Binding's UID nor
            # its node is checked; only a pod that is bound already is refused.
            if (pod.get("spec") or {}).get("nodeName"):
                node_ = pod["spec"]["nodeName"]
                raise KubeApiError(f"pod {namespace}/{name} is already assigned to node {node_!r}", 409)
            pod.setdefault("spec", {})["nodeName"] = node
            if annotations:  # as the API server does: the Binding's annotations land with the node, in one write
                pod["metadata"].setdefault("annotations", {}).update(annotations)
            self._bump(pod)
            self._emit("pods", "MODIFIED", pod)
        lost = self.lose_answer.pop("create_binding", None)
        if lost is not None:
            raise lost  # the Binding was applied, but its answer never reached the caller

    def patch_node_metadata(self, name: str, annotations: dict[str, str], labels: dict[str, str]) -> None:
        with self._lock:
            self.calls.append(("patch_node_metadata", name))
            node = self.nodes.get(name)
            if node is None:
                raise KubeApiError(f"node {name!r} not found", 404)
            node["metadata"].setdefault("annotations", {}).update(annotations)
            node["metadata"].setdefault("labels", {}).update(labels)
            self._bump(node)
            self._emit("nodes", "MODIFIED", node)

    def patch_pod_status(self, namespace: str, name: str, status: JsonObj) -> None:
        self._maybe_fail("patch_pod_status")
        with self._lock:
            self.calls.append(("patch_pod_status", namespace, name))
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise KubeApiError(f"pods {name!r} not found", 404)
            mine = pod.setdefault("status", {})
            for key, value in status.items():
                if key != "conditions":
                    mine[key] = copy.deepcopy(value)
                    continue
                # a strategic merge: conditions merge by type
                have = {c.get("type"): c for c in mine.get("conditions") or []}
                for c in value:
                    have[c.get("type")] = {**have.get(c.get("type"), {}), **copy.deepcopy(c)}
                mine["conditions"] = list(have.values())
            self._bump(pod)
            self._emit("pods", "MODIFIED", pod)

    def create_event(self, namespace: str, event: JsonObj) -> None:
        self._maybe_fail("create_event")
        with self._lock:
            self.calls.append(("create_event", namespace))
            self.events.append((namespace, copy.deepcopy(event)))

    def list_events(self, namespace: str, field_selector: str = "") -> builtins.list[JsonObj]:
        with self._lock:
            wanted = dict(part.split("=", 1) for part in field_selector.split(",") if "=" in part)
            out = []
            for ns, ev in self.events:
                if ns != namespace:
                    continue
                involved = ev.get("involvedObject") or {}
                fields = {f"involvedObject.{k}": str(v) for k, v in involved.items()}
                if all(fields.get(k) == v for k, v in wanted.items()):
                    out.append(copy.deepcopy(ev))
            return out


def node_object(name: str, cpu: str, memory: str, annotations: dict[str, str] | None = None,
                labels: dict[str, str] | None = None) -> JsonObj:  # fmt: skip
    """A Node object as the API server returns it (the parts corral reads)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": dict(labels or {}), "annotations": dict(annotations or {})},
        "status": {"capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
                   "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}},
    }  # fmt: skip


def pod_object(name: str, containers: list[dict[str, Any]], namespace: str = "default", uid: str | None = None,
               annotations: dict[str, str] | None = None, node: str | None = None) -> JsonObj:  # fmt: skip
    """A Pod object as kube-scheduler sends it (metadata, spec with containers and resources, status)."""
    spec: dict[str, Any] = {"containers": containers, "schedulerName": "corral-scheduler", "priority": 0}
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}",
                     "annotations": dict(annotations or {}), "labels": {}},
        "spec": spec,
        "status": {"phase": "Pending"},
    }  # fmt: skip
