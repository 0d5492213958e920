"""FakeApiServer: a small fake of the Kubernetes API server over real HTTP, for testing `RealKubeApi` (the official
client) without a cluster. No kube-apiserver can be installed on the development machines.

    RealKubeApi (kubernetes.client, urllib3) --HTTP/1.1 on 127.0.0.1:free port-->  FakeApiServer (http.server thread)

It implements only what corral calls, with the API server's own paths, JSON and status codes:

    GET   /api/v1/nodes, /api/v1/pods, /api/v1/namespaces/{ns}/pods   list (fieldSelector: spec.nodeName, metadata.name)
          ...?watch=true&resourceVersion=N&timeoutSeconds=S             watch: chunked JSON lines {"type", "object"},
                                                                        replayed from N; ERROR 410 once N is compacted
    GET   /api/v1/namespaces/{ns}/pods/{name}, /api/v1/nodes/{name}
    PATCH the same, and /api/v1/nodes/{name}/status                     merge and strategic merge patches (maps merge,
                                                                        null deletes, lists are replaced)
    POST  /api/v1/namespaces/{ns}/pods/{name}/binding                   Binding: sets spec.nodeName and the Binding's
          /api/v1/namespaces/{ns}/bindings                              metadata.annotations in one write (409 if
                                                                        already bound or the UID differs)

Errors are `Status` objects. Every request is recorded (`requests`) so tests can check what the client sent.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

JsonObj = dict[str, Any]
MERGE_PATCH_TYPES = {"application/merge-patch+json", "application/strategic-merge-patch+json"}


@dataclass(frozen=True)
class Recorded:
    """One request as the fake API server saw it."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: Any  # decoded JSON, None without a body


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message

    def status(self) -> JsonObj:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message,
                "reason": self.reason, "code": self.code}  # fmt: skip


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what strategic merge does too for the maps corral patches)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def select(items: list[JsonObj], namespace: str | None, selector: str) -> list[JsonObj]:
    """The objects in `namespace` (None: all) that match a field selector (the two fields corral uses)."""
    if namespace is not None:
        items = [p for p in items if p["metadata"].get("namespace") == namespace]
    for term in filter(None, selector.split(",")):
        field, sep, value = term.partition("=")
        value = value.lstrip("=")  # "==" is allowed too
        if not sep or field not in ("spec.nodeName", "metadata.name"):
            raise ApiError(400, "BadRequest", f"field selector {term!r} is not supported by this fake")
        part = "spec" if field == "spec.nodeName" else "metadata"
        key = "nodeName" if part == "spec" else "name"
        items = [o for o in items if ((o.get(part) or {}).get(key) or "") == value]
    return items


class FakeApiServer:
    """Nodes and pods with resourceVersions, served over HTTP on 127.0.0.1. Use as a context manager (yields URL)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.version = 0
        self.nodes: dict[str, JsonObj] = {}
        self.pods: dict[tuple[str, str], JsonObj] = {}
        self._events: list[tuple[int, str, str, JsonObj]] = []  # (resourceVersion, kind, type, object)
        self._compacted = 0  # events at or below this version are gone (a watch from there gets 410)
        self._closing = False
        self._watch_generation = 0  # bumped to end every open watch
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self.connections = 0  # TCP connections accepted: a client that keeps its connections opens few
        self._http = _Server(("127.0.0.1", 0), _handler_class(self))
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.02,), name="fake-apiserver",
                                        daemon=True)  # fmt: skip
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"

    def __enter__(self) -> str:
        self._thread.start()
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving; open watch streams end (as an API server restart ends them)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._http.shutdown()
        self._http.server_close()

    # ------------------------------------------------------------------ what tests do to the cluster
    def _record(self, kind: str, event: str, obj: JsonObj) -> None:
        self.version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self._events.append((self.version, kind, event, copy.deepcopy(obj)))
        self._cond.notify_all()

    def put_node(self, node: JsonObj) -> None:
        with self._cond:
            name = node["metadata"]["name"]
            event = "MODIFIED" if name in self.nodes else "ADDED"
            self.nodes[name] = obj = copy.deepcopy(node)
            self._record("nodes", event, obj)

    def delete_node(self, name: str) -> None:
        with self._cond:
            self._record("nodes", "DELETED", self.nodes.pop(name))

    def put_pod(self, pod: JsonObj) -> None:
        with self._cond:
            obj = copy.deepcopy(pod)
            meta = obj["metadata"]
            meta.setdefault("namespace", "default")
            key = (meta["namespace"], meta["name"])
            event = "MODIFIED" if key in self.pods else "ADDED"
            self.pods[key] = obj
            self._record("pods", event, obj)

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._cond:
            self._record("pods", "DELETED", self.pods.pop((namespace, name)))

    def compact(self) -> None:
        """Forget the event history (etcd compaction): a watch from an older resourceVersion gets 410 Gone."""
        with self._cond:
            self._compacted = self.version
            self._events.clear()

    def end_watches(self) -> None:
        """End every open watch stream now (the client lists again or watches again)."""
        with self._cond:
            self._watch_generation += 1
            self._cond.notify_all()

    # ------------------------------------------------------------------ the API (called from handler threads)
    def _items(self, kind: str, namespace: str | None, selector: str) -> list[JsonObj]:
        items = list(self.nodes.values()) if kind == "nodes" else list(self.pods.values())
        return select(items, namespace, selector)

    def list(self, kind: str, namespace: str | None, selector: str) -> JsonObj:
        with self._cond:
            items = copy.deepcopy(self._items(kind, namespace, selector))
            list_kind = "NodeList" if kind == "nodes" else "PodList"
            return {"kind": list_kind, "apiVersion": "v1", "metadata": {"resourceVersion": str(self.version)},
                    "items": items}  # fmt: skip

    def watch(self, kind: str, namespace: str | None, selector: str, since: str, timeout: float,
              emit: Callable[[JsonObj], None]) -> None:  # fmt: skip
        """Stream events after resourceVersion `since` ("" or "0": the current objects as ADDED first)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            generation = self._watch_generation
            if since in ("", "0"):
                initial = [("ADDED", o) for o in copy.deepcopy(self._items(kind, namespace, selector))]
                cursor = self.version
            else:
                cursor = int(since)
                if cursor < self._compacted:
                    gone = ApiError(410, "Expired", f"too old resource version: {cursor} ({self._compacted})")
                    initial, cursor = [("ERROR", gone.status())], -1
                else:
                    initial = []
        for event, obj in initial:
            emit({"type": event, "object": obj})
        if cursor < 0:
            return
        while True:
            with self._cond:
                pending = [e for e in self._events if e[0] > cursor and e[1] == kind]
                while not pending:
                    left = deadline - time.monotonic()
                    if self._closing or left <= 0 or self._watch_generation != generation:
                        return
                    self._cond.wait(min(left, 0.5))
                    pending = [e for e in self._events if e[0] > cursor and e[1] == kind]
                cursor = pending[-1][0]
            for _, _, event, obj in pending:
                if select([obj], namespace, selector):
                    emit({"type": event, "object": obj})

    def get(self, kind: str, key: Any) -> JsonObj:
        with self._cond:
            obj = (self.nodes if kind == "nodes" else self.pods).get(key)
            if obj is None:
                name = key if isinstance(key, str) else key[1]
                raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
            return copy.deepcopy(obj)

    def patch(self, kind: str, key: Any, content_type: str, patch: Any) -> JsonObj:
        if content_type not in MERGE_PATCH_TYPES:
            raise ApiError(415, "UnsupportedMediaType", f"patch type {content_type!r} is not supported by this fake")
        if not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
        with self._cond:
            store: dict[Any, JsonObj] = self.nodes if kind == "nodes" else self.pods
            obj = store.get(key)
            if obj is None:
                name = key if isinstance(key, str) else key[1]
                raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
            merged = merge_patch(obj, patch)
            merged["metadata"]["name"] = obj["metadata"]["name"]  # a patch cannot rename
            store[key] = merged
            self._record(kind, "MODIFIED", merged)
            return copy.deepcopy(merged)

    def bind(self, namespace: str, name: str | None, binding: Any) -> JsonObj:
        if not isinstance(binding, dict) or binding.get("kind", "Binding") != "Binding":
            raise ApiError(400, "BadRequest", "expected a Binding object")
        meta = binding.get("metadata") or {}
        name = name or meta.get("name")
        target = (binding.get("target") or {}).get("name")
        if not name or not target:
            raise ApiError(422, "Invalid", "Binding needs metadata.name and target.name")
        with self._cond:
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found')
            # kube-apiserver checks neither the Binding's UID nor its node (tests/k8s/test_control_plane.py).
            if (pod.get("spec") or {}).get("nodeName"):
                node = pod["spec"]["nodeName"]
                raise ApiError(409, "Conflict", f'pod {name} is already assigned to node "{node}"')
            pod.setdefault("spec", {})["nodeName"] = target
            annotations = meta.get("annotations") or {}
            if annotations:  # kube-apiserver copies a Binding's annotations onto the pod in the same write
                pod.setdefault("metadata", {}).setdefault("annotations", {}).update(annotations)
            self._record("pods", "MODIFIED", pod)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("GET", re.compile(r"/api/v1/(nodes|pods)"), "list"),
    ("GET", re.compile(r"/api/v1/namespaces/([^/]+)/pods"), "list_ns"),
    ("GET", re.compile(r"/api/v1/nodes/([^/]+)"), "get_node"),
    ("GET", re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)"), "get_pod"),
    ("PATCH", re.compile(r"/api/v1/nodes/([^/]+)(?:/status)?"), "patch_node"),
    ("PATCH", re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)"), "patch_pod"),
    ("POST", re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/binding"), "bind"),
    ("POST", re.compile(r"/api/v1/namespaces/([^/]+)/bindings"), "bind_ns"),
]


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # a real API server's backlog is long: connections opened at once are not refused


def _handler_class(server: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, and chunked watch streams

        def setup(self) -> None:
            super().setup()
            with server._lock:
                server.connections += 1

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._serve("GET")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def do_POST(self) -> None:
            self._serve("POST")

        def _reply(self, code: int, body: JsonObj) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
                error: ApiError | None = ApiError(400, "BadRequest", "body is not valid JSON")
            else:
                error = None
            server.requests.append(Recorded(method, url.path, query, headers, body))
            try:
                if error is not None:
                    raise error
                for m, pattern, action in _ROUTES:
                    match = pattern.fullmatch(url.path)
                    if m == method and match:
                        self._act(action, match.groups(), query, headers, body)
                        return
                raise ApiError(404, "NotFound", f"{method} {url.path}: not served by this fake API server")
            except ApiError as exc:
                self._reply(exc.code, exc.status())

        def _act(self, action: str, groups: tuple[str, ...], query: dict[str, str], headers: dict[str, str],
                 body: Any) -> None:  # fmt: skip
            selector = query.get("fieldSelector", "")
            ctype = headers.get("content-type", "").split(";")[0].strip()
            if action in ("list", "list_ns"):
                kind, namespace = (groups[0], None) if action == "list" else ("pods", groups[0])
                if query.get("watch", "").lower() in ("true", "1"):
                    timeout = float(query.get("timeoutSeconds") or 1800)
                    self._watch(kind, namespace, selector, query.get("resourceVersion", ""), timeout)
                else:
                    self._reply(200, server.list(kind, namespace, selector))
            elif action == "get_node":
                self._reply(200, server.get("nodes", groups[0]))
            elif action == "get_pod":
                self._reply(200, server.get("pods", (groups[0], groups[1])))
            elif action == "patch_node":
                self._reply(200, server.patch("nodes", groups[0], ctype, body))
            elif action == "patch_pod":
                self._reply(200, server.patch("pods", (groups[0], groups[1]), ctype, body))
            elif action == "bind":
                self._reply(201, server.bind(groups[0], groups[1], body))
            else:
                self._reply(201, server.bind(groups[0], None, body))

        def _watch(self, kind: str, namespace: str | None, selector: str, since: str, timeout: float) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def emit(event: JsonObj) -> None:
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()

            try:
                server.watch(kind, namespace, selector, since, timeout, emit)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away (it stopped watching)

    return Handler
