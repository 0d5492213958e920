"""`corral k8s scheduler` as a process of its own, as the chart runs it: started, killed (-9) and started again by the
end-to-end tests and the benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.k8s.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


class SchedulerProcess:
    def __init__(self, kubeconfig: str, log: Path, *extra: str, port: int | None = None,
                 module: str = "corral.cli.main", env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.kubeconfig = kubeconfig
        self.port = port or free_port()
        self.log = log
        self.extra = extra
        self.module = module
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), **self.env}
        cmd = [sys.executable, "-m", self.module, "k8s", "scheduler", "--kubeconfig", self.kubeconfig,
               "--listen", f"127.0.0.1:{self.port}", *self.extra]  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"the scheduler did not become ready: {self.log.read_text()[-3000:]}")

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", timeout=10)

    def kill(self) -> None:
        """SIGKILL: a crash, not a clean stop."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
