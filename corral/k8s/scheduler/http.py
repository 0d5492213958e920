"""The scheduler's HTTP face (read-only, no credentials): GET /metrics, /healthz, /readyz, /explain/NS/POD.

A plain standard-library server in a thread: four GET routes need no framework, and the scheduler starts without
importing one (start-up time is measured).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from corral.k8s.scheduler.core import Scheduler
from corral.k8s.scheduler.metrics import PendingCollector, QueueCollector

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ROUTES = ("/metrics", "/healthz", "/readyz", "/explain/NAMESPACE/POD")


def answer(scheduler: Scheduler, path: str) -> tuple[int, str, bytes]:
    """(status, content type, body) for GET `path`."""
    from prometheus_client.exposition import generate_latest

    from corral.metrics import Joined

    path = path.split("?", 1)[0]
    if path == "/metrics":
        parts: list[Any] = [scheduler.metrics.registry, PendingCollector(scheduler.pending_by_reason)]
        if scheduler.tenancy is not None:
            parts.append(QueueCollector(scheduler.queue_views))
        body = generate_latest(Joined(*parts))
        return 200, METRICS_TYPE, body
    if path == "/healthz":
        return 200, "application/json", orjson.dumps({"ok": True})
    if path == "/readyz":
        ready = scheduler.ready.is_set() and scheduler.informer.wait_synced(0)
        return (200 if ready else 503), "application/json", orjson.dumps({"ready": ready})
    if path.startswith("/explain/"):
        parts = path.removeprefix("/explain/").split("/")
        if len(parts) != 2 or not all(parts):
            return 404, "application/json", orjson.dumps({"error": "expected /explain/NAMESPACE/POD"})
        return 200, "application/json", orjson.dumps(scheduler.explain(f"{parts[0]}/{parts[1]}"))
    known = ", ".join(ROUTES)
    return 404, "application/json", orjson.dumps({"error": f"{path}: no such endpoint (known: {known})"})


def serve(scheduler: Scheduler, host: str, port: int) -> ThreadingHTTPServer:
    """Serve the routes on host:port in a daemon thread; the server's `shutdown()` stops it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, ctype, body = answer(scheduler, self.path)
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="corral-scheduler-http", daemon=True).start()
    return server
