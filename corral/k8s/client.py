"""The few Kubernetes API calls corral makes, behind a small protocol.

    KubeApi            list / watch nodes and pods, get a pod, patch annotations, create a Binding (with annotations)
    RealKubeApi        the official `kubernetes` client; objects travel as the API server's own JSON (dicts)
    corral.k8s.fake    FakeKubeApi: an in-memory API server for tests and benchmarks

Objects are plain JSON dicts everywhere (as kube-scheduler sends them to the extender), so the conversion code in
`convert.py` has one input shape.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol
from urllib.parse import quote

import orjson

from corral.model.errors import CorralError

JsonObj = dict[str, Any]


#: How long one watch request lasts before the API server ends it (the informer then lists and watches again).
WATCH_SECONDS = 300
#: Connections kept open to the API server, at least. The client's default (5 per CPU) is below the extender's binds
#: in flight (extender.BIND_THREADS) plus its two watches on a small machine; past it urllib3 opens a connection per
#: request and throws it away after.
POOL_SIZE = 32
#: How long the credentials of a POST are reused before they are asked for again. Asking runs the configuration's
#: refresh hook, which for a kubeconfig rewrites the whole configuration (its host setter scans the environment for
#: proxies): about 0.8 ms of CPU per request. Tokens that rotate (in-cluster, exec plugins) stay valid far longer.
AUTH_SECONDS = 10.0


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

    def get_pod_group(self, api: str, namespace: str, name: str) -> JsonObj:
        """A PodGroup (`api`: scheduling.x-k8s.io/v1alpha1 or scheduling.volcano.sh/v1beta1); 404 if none."""
        ...

    def delete_pod(self, namespace: str, name: str) -> None: ...

    def patch_pod_status(self, namespace: str, name: str, status: JsonObj) -> None:
        """Strategic-merge `status` into the pod's status (conditions merge by type)."""
        ...

    def create_event(self, namespace: str, event: JsonObj) -> None:
        """Create a core/v1 Event in `namespace`."""
        ...

    def list_events(self, namespace: str, field_selector: str = "") -> builtins.list[JsonObj]:
        """core/v1 Events of `namespace` matching `field_selector`."""
        ...


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
                configuration = client.Configuration.get_default_copy()  # what was just loaded
            configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, POOL_SIZE)
            api_client = client.ApiClient(configuration)
        except Exception as exc:  # the client raises several unrelated types here
            raise KubeApiError(f"cannot configure the Kubernetes client: {exc}") from None
        self._client = client
        self.core = client.CoreV1Api(api_client)
        self._host = configuration.host
        self._auth: tuple[float, dict[str, str]] = (-AUTH_SECONDS, {})

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.rest import ApiException

        try:
            return fn(*args, _preload_content=False, **kwargs)
        except ApiException as exc:
            raise KubeApiError(f"{what}: {exc.status} {exc.reason}: {_status_message(exc.body)}", exc.status) from None
        except Exception as exc:  # connection errors come from urllib3
            raise KubeApiError(f"{what}: {exc}") from None

    def _body(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> bytes:
        """A whole answer's body, read to the end and its connection handed back to the pool (an answer left unread
        keeps its connection, and the next call opens a new one: a TLS handshake on both sides for every bind)."""
        resp = self._call(what, fn, *args, **kwargs)
        try:
            data: bytes = resp.data
        finally:
            resp.release_conn()
        return data

    def _lister(self, kind: str) -> Any:
        if kind == "poddisruptionbudgets":  # preemption's (corral.k8s.scheduler.evict)
            return self._client.PolicyV1Api(self.core.api_client).list_pod_disruption_budget_for_all_namespaces
        return self.core.list_node if kind == "nodes" else self.core.list_pod_for_all_namespaces

    def list(self, kind: str, field_selector: str = "") -> tuple[list[JsonObj], str]:
        fn = self._lister(kind)
        body = _loads(self._body(f"list {kind}", fn, field_selector=field_selector or None))
        return list(body.get("items") or []), str(body.get("metadata", {}).get("resourceVersion", ""))

    def watch(self, kind: str, resource_version: str, stop: threading.Event) -> Iterator[tuple[str, JsonObj]]:
        # The stream is read here, not through kubernetes.watch.Watch: corral wants the objects as JSON (Watch would
        # build model objects first), and a watch must end as soon as `stop` is set, not at the next event (Watch
        # checks its stop flag only between events, and a quiet cluster may send none for minutes).
        fn = self._lister(kind)
        resp = self._call(f"watch {kind}", fn, watch=True, resource_version=resource_version or None,
                          timeout_seconds=WATCH_SECONDS)  # fmt: skip
        done = threading.Event()
        closer = threading.Thread(target=_end_on_stop, args=(resp, stop, done), name=f"corral-watch-{kind}-stop",
                                  daemon=True)  # fmt: skip
        closer.start()
        try:
            for line in _lines(resp):
                event = _loads(line)
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
        what = f"get pod {namespace}/{name}"
        obj: JsonObj = _loads(self._body(what, self.core.read_namespaced_pod, name, namespace))
        return obj

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        body = {"metadata": {"annotations": annotations}}
        self._body(f"annotate pod {namespace}/{name}", self.core.patch_namespaced_pod, name, namespace, body)

    def create_binding(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str] | None = None
    ) -> None:
        body = binding_body(namespace, name, uid, node, annotations)
        self._post(f"bind pod {namespace}/{name} to {node}", f"/api/v1/namespaces/{quote(namespace)}/bindings", body)

    def _post(
        self, what: str, path: str, body: JsonObj, method: str = "POST", content_type: str = "application/json"
    ) -> bytes:
        """POST JSON straight through the client's connection pool, with its credentials (refreshed where the
        configuration refreshes them). The generated method checks its arguments with pydantic and builds and
        serialises model objects: about 3 ms of CPU for each bind, more than the rest of a bind together."""
        api = self.core.api_client
        try:
            when, auth = self._auth
            if time.monotonic() - when >= AUTH_SECONDS:
                auth = {}
                api.update_params_for_auth(auth, [], ["BearerToken"], path, "POST", None)
                self._auth = (time.monotonic(), auth)
            headers = {**api.default_headers, **auth, "Content-Type": content_type, "Accept": "application/json"}
            resp = api.rest_client.pool_manager.request(method, self._host + path, body=orjson.dumps(body),
                                                        headers=headers)  # fmt: skip
        except Exception as exc:  # urllib3's connection errors, a failing token refresh
            raise KubeApiError(f"{what}: {exc}") from None
        data: bytes = resp.data
        if resp.status >= 400:
            raise KubeApiError(f"{what}: {resp.status} {resp.reason}: {_status_message(data)}", resp.status)
        return data

    def evict_pod(self, namespace: str, name: str, uid: str = "") -> None:
        """As WireKubeApi.evict_pod: a policy/v1 Eviction, the pod's own grace period, `uid` as a precondition."""
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/eviction"
        self._post(f"evict pod {namespace}/{name}", path, eviction_body(namespace, name, uid))

    def patch_node_metadata(self, name: str, annotations: dict[str, str], labels: dict[str, str]) -> None:
        body = {"metadata": {"annotations": annotations, "labels": labels}}
        self._body(f"annotate node {name}", self.core.patch_node, name, body)

    def get_pod_group(self, api: str, namespace: str, name: str) -> JsonObj:
        path = f"/apis/{api}/namespaces/{quote(namespace)}/podgroups/{quote(name)}"
        obj: JsonObj = _loads(self._get(f"get PodGroup {namespace}/{name} ({api})", path))
        return obj

    def delete_pod(self, namespace: str, name: str) -> None:
        self._body(f"delete pod {namespace}/{name}", self.core.delete_namespaced_pod, name, namespace)

    def _get(self, what: str, path: str) -> bytes:
        api = self.core.api_client
        try:
            auth: dict[str, str] = {}
            api.update_params_for_auth(auth, [], ["BearerToken"], path, "GET", None)
            headers = {**api.default_headers, **auth, "Accept": "application/json"}
            resp = api.rest_client.pool_manager.request("GET", self._host + path, headers=headers)
        except Exception as exc:
            raise KubeApiError(f"{what}: {exc}") from None
        data: bytes = resp.data
        if resp.status >= 400:
            raise KubeApiError(f"{what}: {resp.status} {resp.reason}: {_status_message(data)}", resp.status)
        return data

    def patch_pod_status(self, namespace: str, name: str, status: JsonObj) -> None:
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/status"
        self._post(f"patch the status of pod {namespace}/{name}", path, {"status": status}, "PATCH",
                   "application/strategic-merge-patch+json")  # fmt: skip

    def create_event(self, namespace: str, event: JsonObj) -> None:
        self._post(f"create an event in {namespace}", f"/api/v1/namespaces/{quote(namespace)}/events", event)

    def list_events(self, namespace: str, field_selector: str = "") -> builtins.list[JsonObj]:
        fn = self.core.list_namespaced_event
        body = _loads(self._body(f"list events in {namespace}", fn, namespace, field_selector=field_selector or None))
        return list(body.get("items") or [])


def eviction_body(namespace: str, name: str, uid: str) -> JsonObj:
    """A policy/v1 Eviction of pod `namespace/name`: no gracePeriodSeconds (the pod's own applies), its `uid` (where
    known) as a precondition, so a pod made again under that name is not evicted."""
    body: JsonObj = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
    if uid:
        body["deleteOptions"] = {"preconditions": {"uid": uid}}
    return body


def binding_body(namespace: str, name: str, uid: str, node: str, annotations: dict[str, str] | None) -> JsonObj:
    """The Binding of pod `namespace/name` (its `uid`, where known, so a pod made again under that name is not bound)
    to `node`; `annotations` are set on the pod in the same call (corral's assignment)."""
    meta: JsonObj = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip


def _loads(data: bytes) -> Any:
    """JSON from the API server: orjson (a pod in a fifth of the standard library's time; the watch reads one per
    change of every pod), the standard library where orjson refuses (integers beyond 64 bits)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


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
