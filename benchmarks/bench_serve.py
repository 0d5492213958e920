"""corral serve through its API (issue 4 targets): submit-to-running latency with a free GPU (p50 at most 100 ms)
and sustained durable submissions per second (at least 300/s).

    python -m benchmarks.bench_serve [--latency-runs 20] [--submissions 1000] [--write BENCHMARKS.md]

Starts a real `corral serve --simulate-gpus 2xA100-80GB` on a temporary socket and state folder (SQLite, WAL,
synchronous=FULL) and talks HTTP over the Unix socket like the CLI does.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.bench_engine import cpu_name, emit, memory_gib


def wait_state(client: httpx.Client, job_id: str, states: set[str], timeout: float = 10.0) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if client.get(f"/v1/jobs/{job_id}").json()["state"] in states:
            return time.perf_counter()
        time.sleep(0.002)
    raise TimeoutError(f"job {job_id} did not reach {states}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--latency-runs", type=int, default=20)
    ap.add_argument("--submissions", type=int, default=1000)
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sock = Path(tmp) / "corral.sock"
        server = subprocess.Popen(
            [sys.executable, "-m", "corral.cli.main", "serve", "--simulate-gpus", "2xA100-80GB",
             "--state-dir", tmp, "--socket", str(sock)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            for _ in range(200):
                if sock.exists():
                    break
                time.sleep(0.05)
            client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://corral", timeout=30)
            latencies = []
            for _ in range(args.latency_runs):
                t0 = time.perf_counter()
                job = client.post("/v1/jobs", json={"command": ["sleep", "30"], "gpus": 1}).json()
                latencies.append(wait_state(client, job["id"], {"running"}) - t0)
                client.post(f"/v1/jobs/{job['id']}/cancel")
                wait_state(client, job["id"], {"cancelled"})
            # hold both GPUs so the burst queues instead of starting processes
            held = [client.post("/v1/jobs", json={"command": ["sleep", "60"], "gpus": 1}).json()["id"] for _ in (1, 2)]
            for h in held:
                wait_state(client, h, {"running"})
            t0 = time.perf_counter()
            for _ in range(args.submissions):
                r = client.post("/v1/jobs", json={"command": ["true"], "gpus": 1})
                assert r.status_code == 201, r.text
            rate = args.submissions / (time.perf_counter() - t0)
            for h in held:
                client.post(f"/v1/jobs/{h}/cancel")
        finally:
            server.terminate()
            server.wait(timeout=30)
    ms = sorted(1000 * x for x in latencies)
    text = (
        f"## corral serve through the API ({datetime.date.today()})\n\n"
        f"Machine: {cpu_name()}, {os.cpu_count()} logical CPUs, {memory_gib()}; Python {platform.python_version()}. "
        f"Command: `python -m benchmarks.bench_serve --latency-runs {args.latency_runs} --submissions "
        f"{args.submissions}` (a real `corral serve --simulate-gpus 2xA100-80GB`, HTTP over its Unix socket, SQLite "
        "with synchronous=FULL).\n\n"
        f"- submit-to-running with a free GPU (POST until GET says running; includes spawning `sleep`): p50 "
        f"{statistics.median(ms):.1f} ms, max {ms[-1]:.1f} ms over {len(ms)} jobs (target: p50 at most 100 ms)\n"
        f"- durable submissions, one client, one after another, while both GPUs are held: {rate:,.0f}/s over "
        f"{args.submissions:,} (target: at least 300/s)\n"
    )
    emit(text, args.write)


if __name__ == "__main__":
    main()
