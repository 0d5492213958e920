"""A plain-HTTP proxy on loopback in front of a real kube-apiserver that fails a share of Binding POSTs.

    scheduler --http, no credentials--> FailingProxy --TLS + the kubeconfig's token--> kube-apiserver
                                            |
                                            +-- every k-th Binding POST (deterministic), in turn:
                                                  refuse: answered 500 without forwarding (the bind did not happen)
                                                  lose:   forwarded (the bind happens), then answered 500
                                                  drop:   forwarded, then the connection is closed with no answer

`refuse` is a failed write; `lose` and `drop` are the hard ones, the write landed and the scheduler was told otherwise
or nothing: an assume-before-bind cache that releases on any error frees a GPU that is in use, and the next pod
double-books it until the watch says otherwise. Watches are relayed chunk by chunk as they arrive.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import urllib3
import yaml

MODES = ("refuse", "lose", "drop")
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "authorization",
        "accept-encoding", "host", "proxy-connection", "te", "upgrade"}  # fmt: skip


def is_binding(method: str, path: str) -> bool:
    route = path.split("?", 1)[0]
    return method == "POST" and (route.endswith("/bindings") or route.endswith("/binding"))


class FailingProxy:
    """Serve on 127.0.0.1 (a free port); `every`: fail every k-th Binding POST (0: none), cycling through `modes`."""

    def __init__(self, kubeconfig: str, every: int = 3, modes: tuple[str, ...] = MODES) -> None:
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        cluster = cfg["clusters"][0]["cluster"]
        self.upstream: str = cluster["server"]
        token = cfg["users"][0]["user"].get("token", "")
        ctx = ssl.create_default_context(cafile=cluster.get("certificate-authority"))
        self.http = urllib3.PoolManager(maxsize=64, ssl_context=ctx, retries=False)
        self.auth = {"Authorization": f"Bearer {token}"} if token else {}
        self.every = every
        self.modes = modes
        self.lock = threading.Lock()
        self.bindings = 0
        #: what was done to Binding POSTs: forwarded, refuse, lose, drop
        self.counts: Counter[str] = Counter()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                proxy.handle(self)

            do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="failing-proxy")

    def __enter__(self) -> FailingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path) -> str:
        """A kubeconfig that points at the proxy (plain HTTP, no credentials: the proxy adds them)."""
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "proxy", "user": {}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
            "current-context": "proxy",
        }))  # fmt: skip
        return str(path)

    def _verdict(self, method: str, path: str) -> str:
        if not is_binding(method, path):
            return "pass"
        with self.lock:
            self.bindings += 1
            n = self.bindings
            mode = "forwarded"
            if self.every and n % self.every == 0:
                mode = self.modes[(n // self.every - 1) % len(self.modes)]
            self.counts[mode] += 1
        return mode

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else None
        verdict = self._verdict(h.command, h.path)
        if verdict == "refuse":
            self._status(h, 500, "injected failure: the Binding was not forwarded")
            return
        headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP}
        headers.update(self.auth)
        watch = "watch=1" in h.path or "watch=true" in h.path
        try:
            resp = self.http.request(h.command, self.upstream + h.path, body=body, headers=headers,
                                     preload_content=not watch,
                                     timeout=urllib3.Timeout(connect=10, read=None if watch else 60))  # fmt: skip
        except urllib3.exceptions.HTTPError as exc:
            self._status(h, 502, f"proxy: {exc}")
            return
        if verdict == "lose":
            self._status(h, 500, "injected failure: the Binding was forwarded, its answer replaced")
            return
        if verdict == "drop":
            h.close_connection = True
            with contextlib.suppress(OSError):
                h.connection.shutdown(2)
            return
        out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
        try:
            if not watch:
                data = resp.data
                h.send_response(resp.status)
                for k, v in out.items():
                    h.send_header(k, v)
                h.send_header("Content-Length", str(len(data)))
                h.end_headers()
                h.wfile.write(data)
                return
            h.send_response(resp.status)
            for k, v in out.items():
                h.send_header(k, v)
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            h.wfile.flush()
            chunks = resp.read_chunked() if resp.chunked else resp.stream(65536)
            for chunk in chunks:
                if chunk:
                    h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    h.wfile.flush()
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except (OSError, urllib3.exceptions.HTTPError):
            h.close_connection = True
            resp.close()  # a watch cut mid-stream (its client killed): unread chunks must not reach the next request
        finally:
            resp.release_conn()

    @staticmethod
    def _status(h: BaseHTTPRequestHandler, code: int, message: str) -> None:
        body = orjson.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                             "reason": "InternalError", "code": code})  # fmt: skip
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
