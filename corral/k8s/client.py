"""The few Kubernetes API calls corral makes, behind a small protocol.

    KubeApi            list / watch nodes and pods, get a pod, patch annotations, create a Binding (with annotations)
    RealKubeApi        the official `kubernetes` client; objects travel as the API server's own JSON (dicts)
    corral.k8s.fake    FakeKubeApi: an in-memory API server for tests and benchmarks

Objects are plain JSON dicts everywhere (as kube-scheduler sends them to the extender), so the conversion code in
`convert.py` has one input shape.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any, Protocol

from corral.model.errors import CorralError

JsonObj = dict[str, Any]


#: How long one watch request lasts before the API server ends it (the informer then lists and watches again).
WATCH_SECONDS = 300


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

    def create_binding(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str] | None = None
    ) -> None:
        """Bind the pod to `node` and set `annotations` on it in the same call (the API server copies a Binding's
        metadata.annotations onto the pod as it sets spec.nodeName: both land, or neither). A pod already bound
        gets 409 and keeps its node and annotations."""
        ...

    def patch_node_metadata(self, name: str, annotations: dict[str, str], labels: dict[str, str]) -> None: ...


class RealKubeApi:
    """KubeApi over the official client (in-cluster service account, else the local kubeconfig, or a given
    `kubernetes.client.Configuration`: tests point one at their fake API server)."""

    def __init__(self, kubeconfig: str | None = None, configuration: Any = None) -> None:
        from kubernetes import client, config

        try:
            if configuration is None:
                if kubeconfig:
                    config.load_kube_config(config_file=kubeconfig)
                else:
                    try:
                        config.load_incluster_config()
                    except config.ConfigException:
                        config.load_kube_config()
            api_client = client.ApiClient(configuration)  # None: the default configuration just loaded
        except Exception as exc:  # the client raises several unrelated types here
            raise KubeApiError(f"cannot configure the Kubernetes client: {exc}") from None
        self._client = client
        self.core = client.CoreV1Api(api_client)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.rest import ApiException

        try:
            return fn(*args, _preload_content=False, **kwargs)
        except ApiException as exc:
            raise KubeApiError(f"{what}: {exc.status} {exc.reason}: {_status_message(exc.body)}", exc.status) from None
        except Exception as exc:  # connection errors come from urllib3
            raise KubeApiError(f"{what}: {exc}") from None

    def list(self, kind: str, field_selector: str = "") -> tuple[list[JsonObj], str]:
        fn = self.core.list_node if kind == "nodes" else self.core.list_pod_for_all_namespaces
        resp = self._call(f"list {kind}", fn, field_selector=field_selector or None)
        body = json.loads(resp.data)
        return list(body.get("items") or []), str(body.get("metadata", {}).get("resourceVersion", ""))

    def watch(self, kind: str, resource_version: str, stop: threading.Event) -> Iterator[tuple[str, JsonObj]]:
        # The stream is read here, not through kubernetes.watch.Watch: corral wants the objects as JSON (Watch would
        # build model objects first), and a watch must end as soon as `stop` is set, not at the next event (Watch
        # checks its stop flag only between events, and a quiet cluster may send none for minutes).
        fn = self.core.list_node if kind == "nodes" else self.core.list_pod_for_all_namespaces
        resp = self._call(f"watch {kind}", fn, watch=True, resource_version=resource_version or None,
                          timeout_seconds=WATCH_SECONDS)  # fmt: skip
        done = threading.Event()
        closer = threading.Thread(target=_end_on_stop, args=(resp, stop, done), name=f"corral-watch-{kind}-stop",
                                  daemon=True)  # fmt: skip
        closer.start()
        try:
            for line in _lines(resp):
                event = json.loads(line)
                kind_ = str(event.get("type", ""))
                obj = event.get("object") or {}
                if kind_ == "ERROR":  # e.g. 410: the version is too old, list again
                    raise KubeApiError(f"watch {kind}: {obj.get('message', obj)}", int(obj.get("code") or 0) or None)
                if kind_ == "BOOKMARK":
                    continue
                yield kind_, obj
        except KubeApiError:
            raise
        except Exception as exc:  # urllib3 raises when the stream breaks, or when it is ended on stop
            if not stop.is_set():
                raise KubeApiError(f"watch {kind}: the stream broke: {exc}") from None
        finally:
            done.set()
            resp.release_conn()

    def get_pod(self, namespace: str, name: str) -> JsonObj:
        resp = self._call(f"get pod {namespace}/{name}", self.core.read_namespaced_pod, name, namespace)
        obj: JsonObj = json.loads(resp.data)
        return obj

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        body = {"metadata": {"annotations": annotations}}
        self._call(f"annotate pod {namespace}/{name}", self.core.patch_namespaced_pod, name, namespace, body)

    def create_binding(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str] | None = None
    ) -> None:
        c = self._client
        body = c.V1Binding(
            metadata=c.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None, annotations=annotations or None),
            target=c.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        self._call(f"bind pod {namespace}/{name} to {node}", self.core.create_namespaced_binding, namespace, body)

    def patch_node_metadata(self, name: str, annotations: dict[str, str], labels: dict[str, str]) -> None:
        body = {"metadata": {"annotations": annotations, "labels": labels}}
        self._call(f"annotate node {name}", self.core.patch_node, name, body)


def _status_message(body: Any) -> str:
    """The message of the API server's Status answer (its body as it came, where it is no Status)."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    try:
        status = json.loads(text)
    except ValueError:
        return text
    return str(status.get("message") or text) if isinstance(status, dict) else text


def _lines(resp: Any) -> Iterator[bytes]:
    """The non-empty lines of a streamed response (one JSON watch event each), as they arrive."""
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        yield from (line for line in lines if line.strip())
    if buffer.strip():
        yield buffer


def _end_on_stop(resp: Any, stop: threading.Event, done: threading.Event) -> None:
    """Shut a watch's socket when `stop` is set, so the thread reading it wakes up at once."""
    while not done.is_set():
        if stop.wait(0.1):
            if done.is_set():
                return
            shutdown = getattr(resp, "shutdown", None)  # urllib3 >= 2.3: wakes a read blocked in another thread
            # RuntimeError: the stream ended meanwhile and its connection went back to the pool; nothing to wake.
            with contextlib.suppress(RuntimeError, OSError):
                (shutdown or resp.close)()
            return
