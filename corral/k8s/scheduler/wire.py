"""WireKubeApi: the KubeApi the scheduler talks through: HTTP/1.1 over kept-alive TLS sockets, JSON in and out.

Why not the official client (client.RealKubeApi, kept for the extender and as the fallback here): importing it and
loading a kubeconfig cost 0.7-3.9 s of the scheduler's start on a loaded 2-core machine, and each Binding through
urllib3 and http.client (which parses every answer's headers with the email package) cost about 1 ms of CPU, more than
placing the pod. Here a request is one bytes join and one send; an answer is a status line, the few headers that
frame the body, and the body.

    endpoint (kubeconfig: server, CA, token / client certificate; in-cluster: the ServiceAccount's token and CA)
        |
    Conn pool (LIFO, grows on demand)  --request(method, path, body)-->  (status, body)
    watch: a connection of its own, chunked lines as they arrive, shut from another thread on stop

A kubeconfig whose user authenticates by an exec plugin or an auth provider is left to the official client
(`connect()` returns RealKubeApi then).
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import os
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import quote, urlencode, urlsplit

import orjson

from corral.k8s.client import (
    WATCH_SECONDS,
    JsonObj,
    KubeApi,
    KubeApiError,
    _loads,
    _status_message,
    binding_body,
    eviction_body,
)

#: The kind `list` and `watch` take for policy/v1 PodDisruptionBudgets (across namespaces).
PDBS = "poddisruptionbudgets"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TIMEOUT = 30.0
#: How long an in-cluster token read from its file is used before the file is read again.
TOKEN_SECONDS = 60.0


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    tls: ssl.SSLContext | None
    server_hostname: str
    headers: dict[str, str] = field(default_factory=dict)  # Authorization
    token_file: str = ""  # re-read now and then (in-cluster tokens rotate)


def _read_data(value: str | None, path: str | None, base: str) -> bytes | None:
    if value:
        return base64.b64decode(value)
    if path:
        full = path if os.path.isabs(path) else os.path.join(base, path)
        with open(full, "rb") as f:
            return f.read()
    return None


def _tls(ca: bytes | None, insecure: bool, cert: bytes | None, key: bytes | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca.decode() if ca else None)
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert and key:
        # load_cert_chain reads files only: a private temporary file each, removed at once
        with tempfile.TemporaryDirectory(prefix="corral-tls-") as tmp:
            paths = []
            for name, data in (("cert.pem", cert), ("key.pem", key)):
                p = os.path.join(tmp, name)
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                paths.append(p)
            ctx.load_cert_chain(paths[0], paths[1])
    return ctx


def _endpoint(server: str, tls: ssl.SSLContext | None, headers: dict[str, str], token_file: str = "") -> Endpoint:
    url = urlsplit(server)
    if url.scheme not in ("https", "http") or not url.hostname:
        raise KubeApiError(f"cannot use the API server address {server!r}")
    port = url.port or (443 if url.scheme == "https" else 80)
    return Endpoint(url.hostname, port, tls if url.scheme == "https" else None, url.hostname, headers, token_file)


def from_kubeconfig(path: str) -> Endpoint | None:
    """The endpoint a kubeconfig's current context names; None where its user needs the official client (an exec
    plugin, an auth provider). Raises KubeApiError for a kubeconfig that cannot be read."""
    import yaml

    try:
        with open(path, "rb") as f:
            doc = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        ctx_name = doc.get("current-context")
        contexts = {c["name"]: c["context"] for c in doc.get("contexts") or []}
        ctx = contexts[ctx_name] if ctx_name else next(iter(contexts.values()))
        cluster = {c["name"]: c["cluster"] for c in doc.get("clusters") or []}[ctx["cluster"]]
        user = {u["name"]: u.get("user") or {} for u in doc.get("users") or []}.get(ctx.get("user"), {})
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError, StopIteration) as exc:
        raise KubeApiError(f"cannot read the kubeconfig {path}: {type(exc).__name__}: {exc}") from None
    if user.get("exec") or user.get("auth-provider"):
        return None
    base = os.path.dirname(os.path.abspath(path))
    try:
        ca = _read_data(cluster.get("certificate-authority-data"), cluster.get("certificate-authority"), base)
        cert = _read_data(user.get("client-certificate-data"), user.get("client-certificate"), base)
        key = _read_data(user.get("client-key-data"), user.get("client-key"), base)
        token = user.get("token") or ""
        token_file = user.get("tokenFile") or ""
        if token_file and not token:
            token = _read_data(None, token_file, base).decode().strip()  # type: ignore[union-attr]
        headers: dict[str, str] = {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif user.get("username"):
            basic = base64.b64encode(f"{user['username']}:{user.get('password', '')}".encode()).decode()
            headers["Authorization"] = f"Basic {basic}"
        tls = _tls(ca, bool(cluster.get("insecure-skip-tls-verify")), cert, key)
    except (OSError, ValueError, ssl.SSLError) as exc:
        raise KubeApiError(f"cannot use the kubeconfig {path}: {type(exc).__name__}: {exc}") from None
    ep = _endpoint(str(cluster.get("server", "")), tls, headers)
    if cluster.get("tls-server-name"):
        ep = Endpoint(ep.host, ep.port, ep.tls, str(cluster["tls-server-name"]), ep.headers)
    return ep


def in_cluster() -> Endpoint | None:
    """The ServiceAccount's endpoint inside a pod; None outside one."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    token_file = os.path.join(SA_DIR, "token")
    if not host or not port or not os.path.exists(token_file):
        return None
    with open(token_file) as f:
        token = f.read().strip()
    with open(os.path.join(SA_DIR, "ca.crt"), "rb") as f:
        ca = f.read()
    server = f"https://{'[' + host + ']' if ':' in host else host}:{port}"
    return _endpoint(server, _tls(ca, False, None, None), {"Authorization": f"Bearer {token}"}, token_file)


def connect(kubeconfig: str | None) -> KubeApi:
    """The scheduler's client: WireKubeApi where the credentials allow (kubeconfig, else in-cluster, else
    ~/.kube/config), else the official client's RealKubeApi."""
    ep: Endpoint | None = None
    if kubeconfig:
        ep = from_kubeconfig(kubeconfig)
    else:
        ep = in_cluster()
        if ep is None:
            default = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")
            if os.path.exists(default):
                ep = from_kubeconfig(default)
    if ep is None:
        from corral.k8s.client import RealKubeApi

        return RealKubeApi(kubeconfig)
    return WireKubeApi(ep)


class Conn:
    """One kept-alive HTTP/1.1 connection."""

    def __init__(self, ep: Endpoint, timeout: float | None = TIMEOUT) -> None:
        sock = socket.create_connection((ep.host, ep.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ep.tls is not None:
            sock = ep.tls.wrap_socket(sock, server_hostname=ep.server_hostname)
        self.sock = sock
        self.reader = sock.makefile("rb")
        self.used = False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.reader.close()
        with contextlib.suppress(OSError):
            self.sock.close()

    def send(self, head: bytes, body: bytes) -> None:
        self.sock.sendall(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.sock.sendall(body)

    def head(self) -> tuple[int, bool, int, bool]:
        """(status, chunked, content length (-1: to the end), keep alive)"""
        line = self.reader.readline(65537)
        if not line:
            raise ConnectionError("the API server closed the connection")
        parts = line.split(None, 2)
        status = int(parts[1])
        chunked, length, keep = False, -1, parts[0] != b"HTTP/1.0"
        while True:
            h = self.reader.readline(65537)
            if h in (b"\r\n", b"\n", b""):
                break
            name, _, value = h.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                keep = b"close" not in value.lower() and (keep or b"keep-alive" in value.lower())
        return status, chunked, length, keep

    def chunks(self) -> Iterator[bytes]:
        while True:
            size_line = self.reader.readline(65537)
            if not size_line:
                raise ConnectionError("the stream ended inside a chunk")
            size = int(size_line.split(b";", 1)[0], 16)
            if size == 0:
                while self.reader.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass
                return
            data = self.reader.read(size)
            self.reader.readline(65537)
            yield data

    def body(self, chunked: bool, length: int) -> bytes:
        if chunked:
            return b"".join(self.chunks())
        if length >= 0:
            return self.reader.read(length)
        return self.reader.read()


class WireKubeApi:
    """KubeApi over raw HTTP/1.1 (see the module's docstring)."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        self._idle: list[Conn] = []
        self._lock = threading.Lock()
        host = ep.server_hostname if ep.port in (443, 80) else f"{ep.server_hostname}:{ep.port}"
        self._fixed = f"Host: {host}\r\nAccept: application/json\r\nUser-Agent: corral-scheduler\r\n"
        self._auth = "".join(f"{k}: {v}\r\n" for k, v in ep.headers.items())
        self._read_at = time.monotonic()

    def _headers(self) -> str:
        if self.ep.token_file and time.monotonic() - self._read_at >= TOKEN_SECONDS:
            # in-cluster tokens rotate (kubelet rewrites the file well before the old one expires)
            with contextlib.suppress(OSError), open(self.ep.token_file) as f:
                self._auth = f"Authorization: Bearer {f.read().strip()}\r\n"
            self._read_at = time.monotonic()
        return self._fixed + self._auth

    def _take(self) -> Conn:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return Conn(self.ep)

    def _give(self, conn: Conn) -> None:
        with self._lock:
            self._idle.append(conn)

    def request(self, method: str, path: str, body: JsonObj | None = None,
                content_type: str = "application/json") -> tuple[int, bytes]:  # fmt: skip
        data = b"" if body is None else orjson.dumps(body)
        head = f"{method} {path} HTTP/1.1\r\n{self._headers()}Content-Length: {len(data)}\r\n"
        if body is not None:
            head += f"Content-Type: {content_type}\r\n"
        raw = (head + "\r\n").encode("latin-1")
        for attempt in (0, 1):
            conn = self._take()
            reused = conn.used
            try:
                conn.send(raw, data)
                status, chunked, length, keep = conn.head()
            except (OSError, ConnectionError, ValueError, IndexError) as exc:
                conn.close()
                if reused and attempt == 0:
                    continue  # an idle connection the server had closed: once more on a new one
                raise KubeApiError(f"{method} {path}: {type(exc).__name__}: {exc}") from None
            try:
                answer = conn.body(chunked, length)
            except (OSError, ConnectionError, ValueError) as exc:
                conn.close()
                raise KubeApiError(f"{method} {path}: {type(exc).__name__}: {exc}") from None
            if keep:
                conn.used = True
                self._give(conn)
            else:
                conn.close()
            return status, answer
        raise AssertionError("unreachable")

    def _call(self, what: str, method: str, path: str, body: JsonObj | None = None,
              content_type: str = "application/json") -> bytes:  # fmt: skip
        try:
            status, data = self.request(method, path, body, content_type)
        except KubeApiError as exc:
            raise KubeApiError(f"{what}: {exc}") from None
        if status >= 400:
            raise KubeApiError(f"{what}: {status}: {_status_message(data)}", status)
        return data

    @staticmethod
    def _path(kind: str) -> str:
        if kind == PDBS:
            return "/apis/policy/v1/poddisruptionbudgets"
        return "/api/v1/nodes" if kind == "nodes" else "/api/v1/pods"

    # ------------------------------------------------------------------ KubeApi
    def list(self, kind: str, field_selector: str = "") -> tuple[builtins.list[JsonObj], str]:
        query = f"?{urlencode({'fieldSelector': field_selector})}" if field_selector else ""
        body = _loads(self._call(f"list {kind}", "GET", self._path(kind) + query))
        return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion", ""))

    def watch(self, kind: str, resource_version: str, stop: threading.Event) -> Iterator[tuple[str, JsonObj]]:
        params = {"watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": str(WATCH_SECONDS)}
        if resource_version:
            params["resourceVersion"] = resource_version
        path = f"{self._path(kind)}?{urlencode(params)}"
        try:
            conn = Conn(self.ep, timeout=TIMEOUT)
            conn.send(f"GET {path} HTTP/1.1\r\n{self._headers()}\r\n".encode("latin-1"), b"")
            status, chunked, length, _ = conn.head()
        except (OSError, ConnectionError, ValueError, IndexError) as exc:
            raise KubeApiError(f"watch {kind}: {type(exc).__name__}: {exc}") from None
        if status >= 400:
            data = conn.body(chunked, length)
            conn.close()
            raise KubeApiError(f"watch {kind}: {status}: {_status_message(data)}", status)
        conn.sock.settimeout(None)  # a quiet cluster may send nothing for minutes; stop shuts the socket instead
        done = threading.Event()
        closer = threading.Thread(target=_shut_on_stop, args=(conn, stop, done), name=f"corral-watch-{kind}-stop",
                                  daemon=True)  # fmt: skip
        closer.start()
        buffer = b""
        try:
            for chunk in conn.chunks() if chunked else iter(lambda: conn.reader.read1(65536), b""):
                buffer += chunk
                if b"\n" not in chunk:
                    continue
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = _loads(line)
                    type_ = str(event.get("type", ""))
                    obj = event.get("object") or {}
                    if type_ == "ERROR":
                        raise KubeApiError(
                            f"watch {kind}: {obj.get('message', obj)}", int(obj.get("code") or 0) or None
                        )
                    if type_ != "BOOKMARK":
                        yield type_, obj
        except KubeApiError:
            raise
        except Exception as exc:  # the stream broke, or was shut on stop
            if not stop.is_set():
                raise KubeApiError(f"watch {kind}: the stream broke: {exc}") from None
        finally:
            done.set()
            conn.close()

    def get_pod(self, namespace: str, name: str) -> JsonObj:
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
        obj: JsonObj = _loads(self._call(f"get pod {namespace}/{name}", "GET", path))
        return obj

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
        self._call(f"annotate pod {namespace}/{name}", "PATCH", path, {"metadata": {"annotations": annotations}},
                   "application/merge-patch+json")  # fmt: skip

    def create_binding(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str] | None = None
    ) -> None:
        body = binding_body(namespace, name, uid, node, annotations)
        self._call(f"bind pod {namespace}/{name} to {node}", "POST",
                   f"/api/v1/namespaces/{quote(namespace)}/bindings", body)  # fmt: skip

    def get_pod_group(self, api: str, namespace: str, name: str) -> JsonObj:
        path = f"/apis/{api}/namespaces/{quote(namespace)}/podgroups/{quote(name)}"
        obj: JsonObj = _loads(self._call(f"get PodGroup {namespace}/{name} ({api})", "GET", path))
        return obj

    def delete_pod(self, namespace: str, name: str) -> None:
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
        self._call(f"delete pod {namespace}/{name}", "DELETE", path)

    def evict_pod(self, namespace: str, name: str, uid: str = "") -> None:
        """POST a policy/v1 Eviction of the pod: the API server checks its PodDisruptionBudgets (429 when one allows
        no disruption now, its causes in the message) and deletes it with its own terminationGracePeriodSeconds (no
        gracePeriodSeconds is sent). `uid`: evict only that pod, not another of the same name since (409 then)."""
        body = eviction_body(namespace, name, uid)
        what = f"evict pod {namespace}/{name}"
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/eviction"
        try:
            status, data = self.request("POST", path, body)
        except KubeApiError as exc:
            raise KubeApiError(f"{what}: {exc}") from None
        if status >= 400:
            raise KubeApiError(f"{what}: {status}: {status_causes(data)}", status)

    def patch_node_metadata(self, name: str, annotations: dict[str, str], labels: dict[str, str]) -> None:
        self._call(f"annotate node {name}", "PATCH", f"/api/v1/nodes/{quote(name)}",
                   {"metadata": {"annotations": annotations, "labels": labels}},
                   "application/merge-patch+json")  # fmt: skip

    def patch_pod_status(self, namespace: str, name: str, status: JsonObj) -> None:
        self._call(f"patch the status of pod {namespace}/{name}", "PATCH",
                   f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/status", {"status": status},
                   "application/strategic-merge-patch+json")  # fmt: skip

    def create_event(self, namespace: str, event: JsonObj) -> None:
        self._call(f"create an event in {namespace}", "POST", f"/api/v1/namespaces/{quote(namespace)}/events", event)

    def list_events(self, namespace: str, field_selector: str = "") -> builtins.list[JsonObj]:
        query = f"?{urlencode({'fieldSelector': field_selector})}" if field_selector else ""
        body = _loads(self._call(f"list events in {namespace}", "GET",
                                 f"/api/v1/namespaces/{quote(namespace)}/events{query}"))  # fmt: skip
        return list(body.get("items") or [])

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()


def status_causes(data: bytes) -> str:
    """A Status answer's message with its details' causes (an Eviction's 429 names the disruption budget there:
    "Cannot evict pod as it would violate the pod's disruption budget. (The disruption budget db needs 2 healthy
    pods and has 2 currently)")."""
    message = _status_message(data)
    try:
        status = _loads(data)
        causes = (status.get("details") or {}).get("causes") or []
        said = [str(c.get("message") or c.get("reason")) for c in causes if isinstance(c, dict)]
    except Exception:  # no Status: its body as it came is the message
        return message
    return f"{message} ({'; '.join(said)})" if said else message


def _shut_on_stop(conn: Conn, stop: threading.Event, done: threading.Event) -> None:
    """Shut a watch's socket when `stop` is set, so the thread reading it wakes at once."""
    while not done.is_set():
        if stop.wait(0.1):
            if not done.is_set():
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)
            return
