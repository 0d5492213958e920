"""`corral ps` with 5,000 waiting jobs (issue 26, item 7), against a real `corral serve`.

    python -m benchmarks.ps_listing [--jobs 5000] [--runs 7]

Starts `corral serve --simulate-gpus 4xH100-80GB` in a temporary directory, runs one 4-GPU job that holds every GPU,
submits JOBS more 4-GPU jobs behind it over HTTP (4 threads), then times `corral ps` (all rows), `ps --json` and the
API's pages alone, each RUNS times: the median and the spread. Compare `squeue` (0.06-0.07 s on this machine type).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from corral.cli.transport import Endpoint, request

CLI = [str(Path(sys.executable).parent / "corral")]  # the console script, as a user runs it


def timed(argv: list[str], env: dict[str, str], runs: int) -> tuple[float, float, float, int]:
    """(median, min, max) seconds of `argv`, and its stdout's size in bytes."""
    took: list[float] = []
    size = 0
    for _ in range(runs):
        t0 = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, check=True)
        took.append(time.perf_counter() - t0)
        size = len(done.stdout)
    return statistics.median(took), min(took), max(took), size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-ps-") as tmp:
        sock = Path(tmp) / "corral.sock"
        server = subprocess.Popen(
            [*CLI, "serve", "--simulate-gpus", "4xH100-80GB", "--state-dir", f"{tmp}/state", "--socket", str(sock)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while not sock.exists():
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the daemon did not start")
                time.sleep(0.05)
            endpoint = Endpoint.unix(str(sock))
            hog = request(endpoint, "POST", "/v1/jobs", json={"command": ["sleep", "3600"], "gpus": 4}).json()["id"]

            def submit(i: int) -> None:
                answer = request(endpoint, "POST", "/v1/jobs", json={"command": ["true"], "gpus": 4, "name": f"w{i}"})
                assert answer.status_code in (200, 201), answer.text

            t0 = time.perf_counter()
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(submit, range(args.jobs)))
            print(f"submitted {args.jobs} over HTTP in {time.perf_counter() - t0:.1f} s; load {os.getloadavg()[0]:.1f}")
            env = {**os.environ, "CORRAL_SOCKET": str(sock)}
            env.pop("CORRAL_URL", None)
            for label, argv in (
                ("ps", [*CLI, "ps"]),
                ("ps --json", [*CLI, "ps", "--json"]),
                ("ps --limit 1000", [*CLI, "ps", "--limit", "1000"]),
                ("ps --limit 10000", [*CLI, "ps", "--limit", "10000"]),
            ):
                med, lo, hi, size = timed(argv, env, args.runs)
                print(f"{label:18} median {med:.3f} s ({lo:.3f}-{hi:.3f}), {size / 1e6:.2f} MB out")
            took = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                answer = request(endpoint, "GET", "/v1/jobs", params={"limit": 10000})
                took.append(time.perf_counter() - t0)
            print(f"{'API page (10000)':18} median {statistics.median(took):.3f} s, {len(answer.content) / 1e6:.2f} MB")
            print(f"load after: {os.getloadavg()[0]:.1f}")
            request(endpoint, "POST", f"/v1/jobs/{hog}/cancel")  # a daemon that stops leaves its jobs running
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
