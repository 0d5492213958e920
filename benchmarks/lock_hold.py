"""The longest hold of `corral serve`'s lock under a hostile load (issue 12, finding 2: one schedule held it 55 s).

    python -m benchmarks.lock_hold [--instances 1000] [--burst 500] [--write BENCHMARKS.md]

Starts a real `corral serve --simulate-gpus 2xA100-80GB` (subprocess, temporary state folder and socket), then, in
phases, each while the scheduling loop keeps running:

    chronos-refused   R/2020-01-01T00:00:00Z/PT0.001S (and PT0.000001S): must answer 400
    chronos-2000      20 jobs R/2000-01-01T00:00:00Z/PT1S: 845 million ticks behind each, and from then on 20
                      schedules due at once every second
    many-schedules    200 Chronos jobs R/2030-.../P1D and 50 Metronome jobs `* * * * *` (none due for a while)
    marathon          one app of --instances instances (0.001 CPU, 1 MiB each) until all run, then deleted
    burst             --burst submissions of `true` from 4 threads at once

and stops it with SIGTERM. The daemon's timed lock (corral.daemon.lockstat) writes its figures to stderr at exit:
the longest hold, its holder, a histogram, and the longest hold per holder. Also measured: how long SIGTERM took.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.bench_engine import cpu_name, emit, memory_gib

CHRONOS = "/chronos/v1/scheduler"


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} (1 min), {five:.2f} (5 min)"


def expect(response: httpx.Response, status: int) -> None:
    if response.status_code != status:
        raise SystemExit(
            f"{response.request.method} {response.request.url.path}: {response.status_code} {response.text}"
        )


def wait_for(what: str, check: Any, timeout: float, every_s: float = 0.25) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if check():
            return time.perf_counter() - start
        time.sleep(every_s)
    raise SystemExit(f"timed out waiting for {what}")


def progress(text: str) -> None:
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {text}\n")
    sys.stderr.flush()


def note(log: list[str], text: str) -> None:
    log.append(text)
    progress(text)


def phases(client: httpx.Client, instances: int, burst: int, log: list[str]) -> None:
    for period in ("PT0.001S", "PT0.000001S"):
        body = {"name": "fast", "command": "true", "schedule": f"R/2020-01-01T00:00:00Z/{period}"}
        expect(client.post(f"{CHRONOS}/iso8601", json=body), 400)
    note(log, "chronos-refused: PT0.001S and PT0.000001S answered 400")

    for i in range(20):
        body = {"name": f"every-second-{i}", "command": "true", "schedule": "R/2000-01-01T00:00:00Z/PT1S"}
        expect(client.post(f"{CHRONOS}/iso8601", json=body), 204)
    time.sleep(5)
    note(log, "chronos-2000: 20 jobs of PT1S from 2000, 5 s of rounds with 20 schedules due each second")

    for i in range(200):
        body = {"name": f"daily-{i}", "command": "true", "schedule": "R/2030-01-01T00:00:00Z/P1D"}
        expect(client.post(f"{CHRONOS}/iso8601", json=body), 204)
    for i in range(50):
        metronome: dict[str, Any] = {
            "id": f"minutely-{i}",
            "run": {"cmd": "true", "cpus": 0.01, "mem": 32, "disk": 0},
            "schedules": [{"id": "m", "cron": "* * * * *"}],
        }
        expect(client.post("/metronome/v1/jobs", json=metronome), 201)
    time.sleep(3)
    note(log, "many-schedules: 200 Chronos P1D jobs and 50 Metronome minutely jobs added")

    app = {"id": "/wide", "cmd": "sleep 120", "cpus": 0.001, "mem": 1, "instances": instances}
    expect(client.post("/marathon/v2/apps", json=app), 201)

    def all_running() -> bool:
        got = client.get("/marathon/v2/apps/wide").json()["app"]
        return bool(got["tasksRunning"] >= instances)

    # Polled every 2 s: showing the app lists every instance under the lock, a hold of its own.
    took = wait_for(f"{instances} instances", all_running, timeout=max(120.0, instances / 2), every_s=2.0)
    expect(client.delete("/marathon/v2/apps/wide"), 200)
    time.sleep(3)
    note(log, f"marathon: {instances} instances running after {took:.1f} s, then the app deleted")

    errors: list[str] = []

    def submit(n: int) -> None:
        for _ in range(n):
            r = client.post("/v1/jobs", json={"command": ["true"], "cpus": "0.01", "memory": "16MiB"})
            if r.status_code != 201:
                errors.append(r.text)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=submit, args=(burst // 4,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    why = f": {errors[0]}" if errors else ""
    note(log, f"burst: {burst // 4 * 4} submissions from 4 threads in {took:.1f} s, {len(errors)} refused{why}")
    time.sleep(3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--burst", type=int, default=500)
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    log: list[str] = []
    load_before = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        sock = Path(tmp) / "corral.sock"
        stderr_path = Path(tmp) / "serve.err"
        with stderr_path.open("w") as err:
            server = subprocess.Popen(
                [sys.executable, "-m", "corral.cli.main", "serve", "--simulate-gpus", "2xA100-80GB",
                 "--state-dir", tmp, "--socket", str(sock)],
                stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
            try:
                wait_for("the socket", sock.exists, timeout=30)
                transport = httpx.HTTPTransport(uds=str(sock))
                with httpx.Client(transport=transport, base_url="http://corral", timeout=60) as client:
                    phases(client, args.instances, args.burst, log)
            finally:
                t0 = time.perf_counter()
                server.send_signal(signal.SIGTERM)
                try:
                    server.wait(timeout=60)
                    stop_s = time.perf_counter() - t0
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
                    stop_s = float("inf")
        lines = stderr_path.read_text().splitlines()
    stats_line = next((ln for ln in lines if ln.startswith("corral serve: lock stats ")), None)
    if stats_line is None:
        sys.stderr.write("\n".join(lines[-30:]) + "\n")
        raise SystemExit("the daemon wrote no lock stats")
    stats = json.loads(stats_line.removeprefix("corral serve: lock stats "))
    holders = list(stats["by_holder"].items())[:6]
    text = (
        f"## Daemon lock holds under a hostile load ({datetime.date.today()})\n\n"
        f"Machine: 2-core dev machine ({cpu_name()}, {os.cpu_count()} logical CPUs, {memory_gib()}), shared with "
        f"other work: load average {load_before} before, {load_average()} after; Python {platform.python_version()}. "
        f"Command: `python -m benchmarks.lock_hold --instances {args.instances} --burst {args.burst}`.\n\n"
        + "".join(f"- {line}\n" for line in log)
        + f"- SIGTERM to exit: {stop_s:.2f} s\n\n"
        f"**Longest hold: {stats['longest_ms']:.1f} ms** ({stats['longest_holder']}); {stats['holds']:,} holds, "
        f"{stats['total_ms'] / 1000:.1f} s held in all.\n\n"
        "| hold | count |\n|---|---:|\n"
        + "".join(f"| {k} | {v:,} |\n" for k, v in stats["histogram"].items())
        + "\n| holder (longest first) | holds | longest ms |\n|---|---:|---:|\n"
        + "".join(f"| {h} | {v['holds']:,} | {v['longest_ms']:.1f} |\n" for h, v in holders)
    )
    emit(text, args.write)


if __name__ == "__main__":
    main()
