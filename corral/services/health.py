"""Health checks of service instances, run away from the daemon's round.

    controller.tick (under the daemon's lock)            worker threads
      a check is due  -> checker.submit(Probe) ----------> HTTP GET / TCP connect / command, at most timeoutSeconds
      checker.results() <-------------------------------- Result(job, check index, ok, message, at)
      -> corral.mesos.services.on_check -> kill the instance after maxConsecutiveFailures

HTTP(S) and MESOS_HTTP(S): healthy on a status 200-399 (Marathon's rule; HTTPS certificates are not verified, as
Marathon does not). TCP and MESOS_TCP: healthy when a connection opens. COMMAND: healthy when the command exits 0; it
runs with `/bin/sh -c` in the instance's environment (its `$PORT0`...), as the instance's user, and is killed with
its process group at the timeout. Checks go to 127.0.0.1: every instance runs on this machine.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

HTTP = frozenset({"HTTP", "HTTPS", "MESOS_HTTP", "MESOS_HTTPS"})
TCP = frozenset({"TCP", "MESOS_TCP"})


@dataclass(frozen=True)
class Probe:
    job_id: str
    index: int  # which of the app's health checks
    protocol: str
    timeout_s: float
    at: float  # the round's time when it was asked for (results count as of then)
    port: int | None = None
    path: str = "/"
    command: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    uid: int | None = None
    gid: int | None = None


@dataclass(frozen=True)
class Result:
    probe: Probe
    ok: bool
    message: str


def run_probe(p: Probe) -> Result:
    """One check, blocking for at most about `timeout_s`."""
    if p.protocol in HTTP:
        return _http(p)
    try:
        if p.protocol in TCP:
            with socket.create_connection(("127.0.0.1", p.port or 0), timeout=p.timeout_s):
                return Result(p, True, f"TCP port {p.port} open")
        return _command(p)
    except OSError as exc:
        return Result(p, False, f"{type(exc).__name__}: {exc}")


def _http(p: Probe) -> Result:
    # httpx (with its command line's rich and pygments: about 85 ms) only once an HTTP check runs, not at every
    # start of `corral serve` (issue 26, item 7).
    import httpx

    scheme = "https" if p.protocol.endswith("HTTPS") else "http"
    url = f"{scheme}://127.0.0.1:{p.port}{p.path if p.path.startswith('/') else '/' + p.path}"
    try:
        with httpx.Client(verify=False, timeout=p.timeout_s, trust_env=False) as client:
            status = client.get(url).status_code
    except httpx.TimeoutException:
        return Result(p, False, f"no answer within {p.timeout_s:g} s")
    except (OSError, httpx.HTTPError) as exc:
        return Result(p, False, f"{type(exc).__name__}: {exc}")
    return Result(p, 200 <= status < 400, f"HTTP {status} from {url}")


#: Command checks running now: the daemon kills them as it stops (it does not wait for their worker threads).
_running: set[subprocess.Popen[bytes]] = set()
_running_lock = threading.Lock()


def stop_commands() -> None:
    """Kill every command check still running, with its process group (the daemon is stopping: no one will read the
    result, and nothing else would end a hung check at its timeout)."""
    with _running_lock:
        running = list(_running)
    for proc in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _command(p: Probe) -> Result:
    as_other = p.uid is not None and p.uid != os.geteuid() and os.geteuid() == 0
    proc = subprocess.Popen(
        ["/bin/sh", "-c", p.command or "false"],
        env=dict(p.env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        user=p.uid if as_other else None,
        group=p.gid if as_other else None,
        cwd="/",
    )
    with _running_lock:
        _running.add(proc)
    try:
        code = proc.wait(timeout=p.timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return Result(p, False, f"command did not finish within {p.timeout_s:g} s")
    finally:
        with _running_lock:
            _running.discard(proc)
    return Result(p, code == 0, f"command exited with {code}")


class Checker(Protocol):
    def submit(self, probe: Probe) -> None: ...

    def results(self) -> list[Result]: ...


class HealthChecker:
    """Runs probes on a few worker threads; `results()` hands back what finished, never blocking."""

    def __init__(self, workers: int = 4) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="corral-health")
        self._done: queue.SimpleQueue[Result] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._idle = threading.Condition(self._lock)

    def submit(self, probe: Probe) -> None:
        with self._lock:
            self._in_flight += 1
        self._pool.submit(self._run, probe)

    def _run(self, probe: Probe) -> None:
        try:
            result = run_probe(probe)
        except Exception as exc:  # a probe's own fault is a failed check, never a dead worker
            result = Result(probe, False, f"check failed: {type(exc).__name__}: {exc}")
        self._done.put(result)
        with self._lock:
            self._in_flight -= 1
            self._idle.notify_all()

    def results(self) -> list[Result]:
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """For tests: wait until no probe runs."""
        with self._lock:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
