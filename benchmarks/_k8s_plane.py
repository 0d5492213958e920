"""What the standalone scheduler's benchmarks and end-to-end tests share on a real plane (tests/k8s/plane.py):

    Writer            many API writes at once (nodes with their status, pods, bound pods): raw JSON POSTs over one
                      pooled TLS connection per thread, with the kubeconfig's token; no client models
    BindWatch         a watch on one label's pods that records when each is first seen with a node (monotonic time)
    SchedulerProcess  `corral k8s scheduler` as its own process, as the chart runs it (start time recorded just
                      before the process is created, so start-up counts)
    plain_config      kube-scheduler's configuration for the comparison: the chart's profile without the extender,
                      under a scheduler name of its own, with the client's QPS and burst given
    plane_in          a plane up in a temporary folder for the length of a `with` (down after, whatever happened)

The plane's own `gpu_node` and `pod` builders (tests/k8s/plane.py) make the objects.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import orjson
import urllib3
import yaml

from tests.k8s.plane import Plane, chart_scheduler_config

ROOT = Path(__file__).resolve().parents[1]
#: The label every benchmark pod carries, so that a watch follows one run's pods only.
RUN_LABEL = "corral.dev/bench-run"


class Writer:
    """Raw JSON calls to the API server with the kubeconfig's credentials, from many threads at once."""

    def __init__(self, kubeconfig: str, threads: int = 16) -> None:
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        cluster = cfg["clusters"][0]["cluster"]
        self.server: str = cluster["server"]
        self.token: str = cfg["users"][0]["user"].get("token", "")
        ctx = ssl.create_default_context(cafile=cluster.get("certificate-authority"))
        self.threads = threads
        self.http = urllib3.PoolManager(maxsize=threads + 4, ssl_context=ctx, retries=False,
                                        timeout=urllib3.Timeout(connect=10, read=120))  # fmt: skip
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token:
            self.headers["Authorization"] = f"Bearer {self.token}"

    def request(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201, 202)) -> Any:
        resp = self.http.request(method, self.server + path, body=None if body is None else orjson.dumps(body),
                                 headers=self.headers)  # fmt: skip
        if resp.status not in ok:
            raise RuntimeError(f"{method} {path}: {resp.status} {resp.data[:500]!r}")
        return orjson.loads(resp.data) if resp.data else None

    def create_all(self, path: str, objs: Iterable[dict[str, Any]]) -> int:
        """POST every object to `path` from `threads` threads; returns how many were created."""
        with ThreadPoolExecutor(self.threads) as pool:
            return sum(1 for _ in pool.map(lambda o: self.request("POST", path, o), objs))

    def create_nodes(self, nodes: Iterable[dict[str, Any]]) -> int:
        return self.create_all("/api/v1/nodes", nodes)

    def create_pods(self, pods: Iterable[dict[str, Any]], namespace: str = "default") -> int:
        return self.create_all(f"/api/v1/namespaces/{quote(namespace)}/pods", pods)

    def get(self, path: str, **params: str) -> dict[str, Any]:
        out: dict[str, Any] = self.request("GET", path + ("?" + urlencode(params) if params else ""))
        return out

    def pods(self, label: str = "", namespace: str = "default") -> list[dict[str, Any]]:
        """Every pod of `namespace` (with label selector `label`), read in pages."""
        items: list[dict[str, Any]] = []
        cont = ""
        while True:
            params = {"limit": "5000"}
            if label:
                params["labelSelector"] = label
            if cont:
                params["continue"] = cont
            page = self.get(f"/api/v1/namespaces/{quote(namespace)}/pods", **params)
            items += page.get("items") or []
            cont = page.get("metadata", {}).get("continue") or ""
            if not cont:
                return items

    def delete_pods(self, namespace: str = "default", label: str = "", timeout: float = 300) -> None:
        """Delete the namespace's pods (grace 0) and wait until none is left."""
        q = "?gracePeriodSeconds=0" + (f"&labelSelector={quote(label)}" if label else "")
        self.request("DELETE", f"/api/v1/namespaces/{quote(namespace)}/pods{q}")
        deadline = time.monotonic() + timeout
        sel = {"labelSelector": label} if label else {}
        while self.get(f"/api/v1/namespaces/{quote(namespace)}/pods", limit="1", **sel).get("items"):
            if time.monotonic() > deadline:
                raise RuntimeError("pods still there after delete")
            time.sleep(0.3)


class BindWatch:
    """Watches the pods labelled RUN_LABEL=`run` and records when each is first seen with a node."""

    def __init__(self, writer: Writer, run: str, expect: int, namespace: str = "default") -> None:
        self.writer = writer
        self.expect = expect
        self.bound: dict[str, float] = {}
        self.nodes: dict[str, str] = {}
        self.done = threading.Event()
        self._stop = threading.Event()
        self._path = f"/api/v1/namespaces/{quote(namespace)}/pods"
        self._sel = f"{RUN_LABEL}={run}"
        listed = writer.get(self._path, labelSelector=self._sel, limit="1")
        self.rv = str(listed["metadata"]["resourceVersion"])
        self._resp: Any = None
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"bindwatch-{run}")
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and not self.done.is_set():
            q = urlencode({"watch": "1", "labelSelector": self._sel, "resourceVersion": self.rv,
                           "timeoutSeconds": "600", "allowWatchBookmarks": "true"})  # fmt: skip
            try:
                resp = self.writer.http.request("GET", f"{self.writer.server}{self._path}?{q}",
                                                headers=self.writer.headers, preload_content=False,
                                                timeout=urllib3.Timeout(connect=10, read=None))  # fmt: skip
            except urllib3.exceptions.HTTPError:
                time.sleep(0.2)
                continue
            self._resp = resp
            buf = b""
            try:
                for chunk in resp.stream(65536):
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        if line and self._event(orjson.loads(line)):
                            return
            except (urllib3.exceptions.HTTPError, OSError):
                pass
            finally:
                resp.release_conn()

    def _event(self, ev: dict[str, Any]) -> bool:
        obj = ev.get("object") or {}
        meta = obj.get("metadata") or {}
        self.rv = meta.get("resourceVersion", self.rv)
        if ev.get("type") in ("ADDED", "MODIFIED"):
            node = (obj.get("spec") or {}).get("nodeName")
            if node and meta["name"] not in self.bound:
                self.bound[meta["name"]] = time.monotonic()
                self.nodes[meta["name"]] = node
                if len(self.bound) >= self.expect:
                    self.done.set()
                    return True
        return False

    def wait(self, timeout: float) -> bool:
        return self.done.wait(timeout)

    def close(self) -> None:
        self._stop.set()
        self.done.set()
        if self._resp is not None:
            with contextlib.suppress(AttributeError, RuntimeError, OSError):
                self._resp.shutdown()


class SchedulerProcess:
    """`corral k8s scheduler` as its own process; `started` is the monotonic time just before the process began."""

    def __init__(self, kubeconfig: str, log: Path, *extra: str, listen_port: int = 0,
                 module: str = "corral.cli.main", env: dict[str, str] | None = None) -> None:  # fmt: skip
        from tests.k8s.conftest import free_port

        self.kubeconfig = kubeconfig
        self.port = listen_port or free_port()
        self.log = log
        self.extra = extra
        self.module = module
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", self.module, "k8s", "scheduler", "--kubeconfig", self.kubeconfig,
                "--listen", f"127.0.0.1:{self.port}", *self.extra]  # fmt: skip

    def start(self, wait: bool = False, timeout: float = 120) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), **self.env}
        with self.log.open("ab") as out:
            self.started = time.monotonic()
            self.proc = subprocess.Popen(self.command(), env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        if wait:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.log_tail()
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"the scheduler did not become ready: {self.log_tail()}")

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", timeout=10)

    def metrics(self) -> dict[str, float]:
        """Its /metrics as {sample with labels: value} (comments skipped)."""
        out: dict[str, float] = {}
        for line in self.get("/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    out[name] = float(value)
                except ValueError:
                    continue
        return out

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    @property
    def pid(self) -> int | None:
        return None if self.proc is None or self.proc.poll() is not None else self.proc.pid

    def kill(self) -> None:
        """SIGKILL: a crash, nothing flushed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)


def plain_config(name: str, qps: float, burst: int) -> dict[str, Any]:
    """kube-scheduler alone (the chart's profile without the extender) as scheduler `name`, client QPS and burst."""
    cfg = chart_scheduler_config(None)
    cfg["profiles"][0]["schedulerName"] = name
    cfg["clientConnection"]["qps"] = qps
    cfg["clientConnection"]["burst"] = burst
    return cfg


def labelled(pod: dict[str, Any], run: str) -> dict[str, Any]:
    pod["metadata"].setdefault("labels", {})[RUN_LABEL] = run
    return pod


def chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


@contextlib.contextmanager
def plane_in(prefix: str) -> Iterator[tuple[Plane, Path]]:
    """(a plane started in a temporary folder, the folder) for a benchmark's run; the plane is taken down after."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        where = Path(tmp)
        plane = Plane.find(where / "plane")
        if plane is None:
            raise SystemExit("no control plane: set CORRAL_K8S_CONTROL_PLANE to control-plane.sh")
        try:
            plane.up()
            yield plane, where
        finally:
            plane.down()
