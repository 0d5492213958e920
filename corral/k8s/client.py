"""The few Kubernetes API calls corral makes, behind a small protocol.

    KubeApi            list / watch nodes and pods, get a pod, patch annotations, create a Binding
    RealKubeApi        the official `kubernetes` client; objects travel as the API server's own JSON (dicts)
    corral.k8s.fake    FakeKubeApi: an in-memory API server for tests and benchmarks

Objects are plain JSON dicts everywhere (as kube-scheduler sends them to the extender), so the conversion code in
`convert.py` has one input shape.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any, Protocol

from corral.model.errors import CorralError

JsonObj = dict[str, Any]


class KubeApiError(CorralError):
    """A call to the API server failed; `status` is the HTTP status where there was one (409 conflict, 410 gone)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class KubeApi(Protocol):
    def list(self, kind: str, field_selector: str = "") -> tuple[list[JsonObj], str]:
        """(items, resourceVersion) of `kind` ("nodes" or "pods", pods across namespaces)."""
        ...

    def watch(self, kind: str, resource_version: str, stop: threading.Event) -> Iterator[tuple[str, JsonObj]]:
        """(ADDED|MODIFIED|DELETED, object) from `resource_version` on, until `stop` is set or the stream ends.
        Raises KubeApiError(status=410) when the version is too old (the caller lists again)."""
        ...

    def get_pod(self, namespace: str, name: str) -> JsonObj: ...

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str]) -> None: ...

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None: ...

    def patch_node_metadata(self, name: str, annotations: dict[str, str], labels: dict[str, str]) -> None: ...


class RealKubeApi:
    """KubeApi over the official client (in-cluster service account, else the local kubeconfig)."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        from kubernetes import client, config

        try:
            if kubeconfig:
                config.load_kube_config(config_file=kubeconfig)
            else:
                try:
                    config.load_incluster_config()
                except config.ConfigException:
                    config.load_kube_config()
        except Exception as exc:  # the client raises several unrelated types here
            raise KubeApiError(f"cannot configure the Kubernetes client: {exc}") from None
        self._client = client
        self.core = client.CoreV1Api()

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.rest import ApiException

        try:
            return fn(*args, _preload_content=False, **kwargs)
        except ApiException as exc:
            raise KubeApiError(f"{what}: {exc.status} {exc.reason}: {exc.body}", exc.status) from None
        except Exception as exc:  # connection errors come from urllib3
            raise KubeApiError(f"{what}: {exc}") from None

    def list(self, kind: str, field_selector: str = "") -> tuple[list[JsonObj], str]:
        fn = self.core.list_node if kind == "nodes" else self.core.list_pod_for_all_namespaces
        resp = self._call(f"list {kind}", fn, field_selector=field_selector or None)
        body = json.loads(resp.data)
        return list(body.get("items") or []), str(body.get("metadata", {}).get("resourceVersion", ""))

    def watch(self, kind: str, resource_version: str, stop: threading.Event) -> Iterator[tuple[str, JsonObj]]:
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        fn = self.core.list_node if kind == "nodes" else self.core.list_pod_for_all_namespaces
        w = watch.Watch()
        try:
            for event in w.stream(fn, resource_version=resource_version, timeout_seconds=300):
                if stop.is_set():
                    break
                kind_ = event.get("type", "")
                raw = event.get("raw_object") or {}
                if kind_ == "ERROR":
                    raise KubeApiError(f"watch {kind}: {raw.get('message', raw)}", int(raw.get("code") or 0) or None)
                yield kind_, raw
        except ApiException as exc:
            raise KubeApiError(f"watch {kind}: {exc.status} {exc.reason}", exc.status) from None
        finally:
            w.stop()

    def get_pod(self, namespace: str, name: str) -> JsonObj:
        resp = self._call(f"get pod {namespace}/{name}", self.core.read_namespaced_pod, name, namespace)
        obj: JsonObj = json.loads(resp.data)
        return obj

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        body = {"metadata": {"annotations": annotations}}
        self._call(f"annotate pod {namespace}/{name}", self.core.patch_namespaced_pod, name, namespace, body)

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None:
        c = self._client
        body = c.V1Binding(
            metadata=c.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
            target=c.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        self._call(f"bind pod {namespace}/{name} to {node}", self.core.create_namespaced_binding, namespace, body)

    def patch_node_metadata(self, name: str, annotations: dict[str, str], labels: dict[str, str]) -> None:
        body = {"metadata": {"annotations": annotations, "labels": labels}}
        self._call(f"annotate node {name}", self.core.patch_node, name, body)
