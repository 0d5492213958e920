"""A proxy in front of a real kube-apiserver that holds Binding POSTs at a gate and fails chosen pods' Bindings, for
the gang tests that kill the scheduler mid-gang or refuse some members' Bindings (test_scheduler_gang_kill.py).

    scheduler --http--> BindingProxy --TLS + token--> kube-apiserver
                            |
                            +-- a Binding POST (everything else is relayed as benchmarks/_k8s_proxy.py does):
                                  gate shut: it waits until allow(n) lets n through, or drop() resets it unsent
                                  script[pod]: the pod's next Bindings, in turn (then forwarded as usual):
                                    refuse:   answered 500, not forwarded (the bind did not happen)
                                    conflict: someone else binds the pod to `elsewhere` (no corral annotations), and
                                              the scheduler's Binding is answered 409 "already assigned", as the API
                                              server answers a Binding of a pod bound meanwhile
                                    reset:    the connection is reset (RST), not forwarded
                                    landed:   forwarded (the bind happens), then the connection is reset
                                  refuse* as the script's last entry: refused for good

Nothing here sleeps for timing: the gate is opened by the test once it has read what it waits on.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler
from typing import Any

import orjson
import urllib3

from benchmarks._k8s_proxy import _HOP, FailingProxy, is_binding

MODES = ("refuse", "conflict", "reset", "landed", "refuse*")


class BindingProxy(FailingProxy):
    """Serve on 127.0.0.1 (a free port); the gate starts open and no pod is scripted."""

    def __init__(self, kubeconfig: str) -> None:
        super().__init__(kubeconfig, every=0)
        self.cond = threading.Condition()
        self.shut = False
        self.allowance = 0
        self.held = 0  # Bindings waiting at the gate now
        self.dropping = False
        self.script: dict[str, list[str]] = {}
        self.elsewhere = ""
        #: what was done to Binding POSTs, by mode ("forwarded", "dropped", and the script's modes)
        self.done: Counter[str] = Counter()
        #: per pod name, the modes its Bindings met
        self.met: dict[str, list[str]] = {}

    def __enter__(self) -> BindingProxy:
        super().__enter__()
        return self

    # ------------------------------------------------------------------ the test's controls
    def hold(self) -> None:
        """Shut the gate: Bindings wait until allowed or dropped."""
        with self.cond:
            self.shut, self.allowance, self.dropping = True, 0, False

    def allow(self, n: int) -> None:
        with self.cond:
            self.allowance += n
            self.cond.notify_all()

    def drop(self) -> None:
        """Reset every Binding waiting at the gate (and any that comes while it is shut) without forwarding it."""
        with self.cond:
            self.dropping = True
            self.cond.notify_all()

    def open(self) -> None:
        with self.cond:
            self.shut, self.dropping = False, False
            self.cond.notify_all()

    def waiting(self) -> int:
        with self.cond:
            return self.held

    def fail(self, pod: str, *modes: str) -> None:
        assert all(m in MODES for m in modes), modes
        with self.cond:
            self.script[pod] = list(modes)

    # ------------------------------------------------------------------ serving
    def handle(self, h: BaseHTTPRequestHandler) -> None:
        if not is_binding(h.command, h.path):
            super().handle(h)
            return
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        binding: dict[str, Any] = orjson.loads(body) if body else {}
        name = str((binding.get("metadata") or {}).get("name") or "")
        with self.cond:
            self.held += 1
            while self.shut and not self.dropping and self.allowance == 0:
                self.cond.wait()
            self.held -= 1
            if self.shut and self.dropping:
                mode = "dropped"
            else:
                if self.shut:
                    self.allowance -= 1
                script = self.script.get(name) or []
                mode = script[0] if script else "forwarded"
                if script and mode != "refuse*":
                    script.pop(0)
            self.done[mode] += 1
            self.met.setdefault(name, []).append(mode)
        if mode in ("dropped", "reset"):
            self._reset(h)
            return
        if mode in ("refuse", "refuse*"):
            self._status(h, 500, "injected failure: the Binding was not forwarded")
            return
        if mode == "conflict":
            other = {**binding, "metadata": {k: v for k, v in binding["metadata"].items() if k != "annotations"},
                     "target": {"apiVersion": "v1", "kind": "Node", "name": self.elsewhere}}  # fmt: skip
            self._forward(h, orjson.dumps(other))
            self._answer(h, 409, orjson.dumps({
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
                "message": f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already '
                           f'assigned to node "{self.elsewhere}"',
                "details": {"name": name, "kind": "pods/binding"}}))  # fmt: skip
            return
        resp = self._forward(h, body)
        if resp is None:
            self._status(h, 502, "proxy: the API server did not answer")
            return
        if mode == "landed":
            self._reset(h)
            return
        self._answer(h, resp.status, resp.data)

    def _forward(self, h: BaseHTTPRequestHandler, body: bytes) -> urllib3.BaseHTTPResponse | None:
        headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP}
        headers.update(self.auth)
        try:
            return self.http.request(h.command, self.upstream + h.path, body=body, headers=headers,
                                     timeout=urllib3.Timeout(connect=10, read=60))  # fmt: skip
        except urllib3.exceptions.HTTPError:
            return None

    @staticmethod
    def _answer(h: BaseHTTPRequestHandler, code: int, data: bytes) -> None:
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    @staticmethod
    def _reset(h: BaseHTTPRequestHandler) -> None:
        """Close the connection with a RST (SO_LINGER 0): the client sees 'connection reset', no answer."""
        h.close_connection = True
        with contextlib.suppress(OSError):
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.connection.close()
