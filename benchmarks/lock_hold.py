"""The longest hold of `corral serve`'s lock under a hostile load (issue 12, finding 2: one schedule held it 55 s).

    python -m benchmarks.lock_hold [--instances 1000] [--burst 500] [--phases chronos,schedules,marathon,burst]
                                   [--write BENCHMARKS.md]

Each phase starts a real `corral serve --simulate-gpus 2xA100-80GB` (subprocess, temporary state folder and
socket), loads it while its scheduling loop runs, and stops it with SIGTERM:

    chronos     R/2020-01-01T00:00:00Z/PT0.001S and PT0.000001S (must answer 400), then 20 jobs
                R/2000-01-01T00:00:00Z/PT1S: 845 million ticks behind each, and 20 schedules due every second
    schedules   200 Chronos jobs R/2030-.../P1D and 50 Metronome jobs `* * * * *`, until the 50 came due at once
    marathon    one app of --instances instances (0.001 CPU, 1 MiB each) until all run, then deleted
    burst       --burst submissions of `true` from 4 threads at once, then the rounds start them

The daemon's timed lock (corral.daemon.lockstat) writes its figures to stderr at exit: the longest hold and its
holder, a histogram, the longest hold per holder. Also measured: how long SIGTERM took to end the daemon.
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
from corral.daemon.core import STARTS_PER_ROUND
from corral.daemon.lockstat import BUCKETS_MS
from corral.services.controller import KILLS_PER_ROUND

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


def chronos_phase(client: httpx.Client, args: argparse.Namespace, log: list[str]) -> None:
    for period in ("PT0.001S", "PT0.000001S"):
        body = {"name": "fast", "command": "true", "schedule": f"R/2020-01-01T00:00:00Z/{period}"}
        expect(client.post(f"{CHRONOS}/iso8601", json=body), 400)
    for i in range(20):
        body = {"name": f"every-second-{i}", "command": "true", "schedule": "R/2000-01-01T00:00:00Z/PT1S"}
        expect(client.post(f"{CHRONOS}/iso8601", json=body), 204)
    time.sleep(10)
    note(log, "PT0.001S and PT0.000001S answered 400; 20 jobs of PT1S from 2000 accepted, 10 s of rounds after")


def schedules_phase(client: httpx.Client, args: argparse.Namespace, log: list[str]) -> None:
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
    time.sleep(60 - time.time() % 60 + 15)  # past the next minute: all 50 crons due at once
    note(log, "200 Chronos P1D jobs and 50 Metronome `* * * * *` jobs, until 15 s after the 50 came due at once")


def marathon_phase(client: httpx.Client, args: argparse.Namespace, log: list[str]) -> None:
    instances = args.instances
    app = {"id": "/wide", "cmd": "sleep 600", "cpus": 0.001, "mem": 1, "instances": instances}
    expect(client.post("/marathon/v2/apps", json=app), 201)

    def all_running() -> bool:
        got = client.get("/marathon/v2/apps", params={"id": "/wide"}).json()["apps"]
        return bool(got and got[0]["tasksRunning"] >= instances)

    # Polled every 2 s: listing apps counts every instance under the lock, a hold of its own.
    took = wait_for(f"{instances} instances", all_running, timeout=max(120.0, instances / 2), every_s=2.0)
    expect(client.delete("/marathon/v2/apps/wide"), 200)
    time.sleep(instances / KILLS_PER_ROUND / 5 + 10)  # the rounds kill KILLS_PER_ROUND a round, 5 rounds a second
    note(log, f"one app of {instances} instances, all running after {took:.0f} s; then deleted")


def burst_phase(client: httpx.Client, args: argparse.Namespace, log: list[str]) -> None:
    errors: list[str] = []
    per_thread = args.burst // 4

    def submit() -> None:
        for _ in range(per_thread):
            r = client.post("/v1/jobs", json={"command": ["true"], "cpus": "0.01", "memory": "16MiB"})
            if r.status_code != 201:
                errors.append(r.text)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=submit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    time.sleep(args.burst / STARTS_PER_ROUND / 5 + 10)  # the rounds start STARTS_PER_ROUND a round
    why = f": {errors[0]}" if errors else ""
    note(log, f"{per_thread * 4} submissions of `true` from 4 threads in {took:.1f} s ({len(errors)} refused{why}); "
              "then the rounds start them")  # fmt: skip


PHASES = {"chronos": chronos_phase, "schedules": schedules_phase, "marathon": marathon_phase, "burst": burst_phase}


def run_phase(name: str, args: argparse.Namespace) -> tuple[list[str], float, dict[str, Any]]:
    """A fresh daemon, one phase, SIGTERM: (what happened, seconds SIGTERM took, the lock's figures)."""
    log: list[str] = []
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
                    PHASES[name](client, args, log)
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
    return log, stop_s, json.loads(stats_line.removeprefix("corral serve: lock stats "))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--burst", type=int, default=500)
    ap.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}")
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    load_before = load_average()
    rows = []
    for name in args.phases.split(","):
        log, stop_s, stats = run_phase(name, args)
        rows.append((name, log, stop_s, stats))
    command = f"python -m benchmarks.lock_hold --instances {args.instances} --burst {args.burst} --phases {args.phases}"
    text = (
        f"## Daemon lock holds under a hostile load ({datetime.date.today()})\n\n"
        f"Machine: 2-core dev machine ({cpu_name()}, {os.cpu_count()} logical CPUs, {memory_gib()}), shared with "
        f"other work: load average {load_before} before, {load_average()} after; Python {platform.python_version()}; "
        f"SQLite WAL with synchronous=FULL. Command: `{command}`. Each phase runs against a fresh "
        "`corral serve --simulate-gpus 2xA100-80GB` and ends with SIGTERM; the lock's figures are the daemon's own "
        "(corral.daemon.lockstat, written at exit).\n\n"
        "| phase | what it did | longest hold ms | its holder | holds | > 50 ms | > 250 ms | SIGTERM to exit s |\n"
        "|---|---|---:|---|---:|---:|---:|---:|\n"
    )
    for name, log, stop_s, stats in rows:
        hist = list(stats["histogram"].values())
        over_50 = sum(hist[BUCKET_50 + 1 :])
        over_250 = sum(hist[BUCKET_250 + 1 :])
        text += (
            f"| {name} | {'; '.join(log)} | {stats['longest_ms']:.1f} | {stats['longest_holder']} | "
            f"{stats['holds']:,} | {over_50:,} | {over_250:,} | {stop_s:.2f} |\n"
        )
    text += "\nLongest hold per holder, all phases:\n\n| holder | phase | holds | longest ms |\n|---|---|---:|---:|\n"
    for name, _, _, stats in rows:
        for holder, v in list(stats["by_holder"].items())[:3]:
            text += f"| {holder} | {name} | {v['holds']:,} | {v['longest_ms']:.1f} |\n"
    emit(text, args.write)


#: Index of the histogram's 50 ms and 250 ms buckets (corral.daemon.lockstat.BUCKETS_MS).
BUCKET_50 = BUCKETS_MS.index(50.0)
BUCKET_250 = BUCKETS_MS.index(250.0)


if __name__ == "__main__":
    main()
