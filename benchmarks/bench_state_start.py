"""What the trust boundary costs a start, and how fast SIGTERM stops a daemon whose tick never returns.

    python -m benchmarks.bench_state_start [--jobs 20000]

1. An older corral's store of N submitted jobs, each with a 40-variable environment holding CORRAL_TOKEN: the first
   start's scrub (rewrite every spec, VACUUM, truncate the WAL), then a later start's (nothing to change), and
   make_private over a state directory with N log files (first: every mode changed; then: none).
2. A daemon whose tick blocks forever holding the lock, with a request waiting for it: seconds from SIGTERM to exit.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from corral.daemon.server import make_private
from corral.jobs.environment import RULE, admitted_environment
from corral.jobs.model import JobSpec
from corral.model.resources import Request
from corral.store import SqliteStore
from tests.daemon.test_shutdown import STUCK_DAEMON


def bench_scrub(n: int, tmp: Path) -> None:
    store = SqliteStore(tmp / "jobs.db")
    env = {f"VAR_{i}": "x" * 40 for i in range(38)} | {"CORRAL_TOKEN": "corral_" + "t" * 43, "PATH": "/usr/bin"}
    spec = JobSpec(command=("true",), request=Request(cpu_milli=100), user="u", uid=1000, gid=1000, env=env)
    for i in range(n):
        store.add(spec, now=float(i))
    for label in ("first start (all changed)", "later start (none changed)"):
        started = time.perf_counter()
        changed = store.scrub_submitted_env(admitted_environment, RULE)
        print(f"scrub, {label}: {changed} jobs changed in {time.perf_counter() - started:.2f} s")
    store.close()
    logs = tmp / "logs"
    logs.mkdir()
    for i in range(n):
        (logs / f"{i}.log").write_text("x")
        os.chmod(logs / f"{i}.log", 0o644)
    for label in ("first start (all modes changed)", "later start (none)"):
        started = time.perf_counter()
        make_private(tmp)
        print(f"make_private, {label}, {n} logs: {time.perf_counter() - started:.2f} s")


def bench_stop(tmp: Path) -> None:
    sock = tmp / "corral.sock"
    server = subprocess.Popen(
        [sys.executable, "-c", STUCK_DAEMON, "serve", "--simulate-gpus", "1xA100-80GB",
         "--state-dir", str(tmp / "state"), "--socket", str(sock)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert server.stdout is not None
    while "tick holds the lock" not in server.stdout.readline():
        pass
    waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    waiting.connect(str(sock))
    waiting.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: corral\r\n\r\n")
    started = time.perf_counter()
    server.send_signal(signal.SIGTERM)
    server.communicate(timeout=60)
    print(f"SIGTERM to exit with a stuck tick and a waiting request: {time.perf_counter() - started:.2f} s")
    waiting.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        bench_scrub(args.jobs, Path(a))
        bench_stop(Path(b))


if __name__ == "__main__":
    main()
