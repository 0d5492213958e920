"""corral serve with a long queue (issue 12, finding 6): 20,000 queued jobs that cannot fit, then through the API:

    python -m benchmarks.serve_scale [--jobs 20000] [--code DIR] [--write BENCHMARKS.md]

- list with filters and paging (`state`, `user`, `name`, a second page by cursor): median and p95
- list of a user with no jobs (root's own list: the queue belongs to ten other users)
- the scheduling loop while nothing else happens: the daemon's CPU share (its busy fraction) and the round time
  it implies (a round every `tick_s` = 0.2 s plus the round itself)
- durable submissions per second from 8 concurrent clients over the Unix socket, queue full
- bulk cancel: one name's 2,000 jobs in one request, jobs per second

A real `corral serve --simulate-gpus 1xA100-80GB` (subprocess, temporary state folder and socket, SQLite with WAL and
synchronous=FULL). The queue is written to the daemon's SQLite file before it starts (by the code under test, so
filling it is not what is measured): job 1 (`sleep`) holds the only GPU; the others ask for a GPU (four shapes, ten
users, ten names) and wait. `--code DIR` runs the daemon (and the fill) from another checkout (in that folder), e.g.
the code before this change (`git archive <commit> corral | tar -x -C DIR`); an API it lacks is measured the way it
allows (list without filters, cancel one job at a time) and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks.bench_engine import cpu_name, emit, memory_gib

FILL = r"""
import sys, time
from pathlib import Path
from corral.jobs.model import JobSpec, spec_to_json
from corral.model.resources import Request
from corral.store import SqliteStore
path, n = Path(sys.argv[1]), int(sys.argv[2])
store = SqliteStore(path)
store.add(JobSpec(("sleep", "3600"), Request(cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=1000),
                  "user0", 1000, 1000, name="hog"), time.time())
shapes = [dict(gpu_count=1, gpu_milli=1000), dict(gpu_count=1, gpu_milli=500, gpu_memory_mib=10240),
          dict(gpu_count=1, gpu_milli=1000, cpu_milli=4000), dict(gpu_count=1, gpu_milli=250, gpu_memory_mib=4096)]
conn = store._conn
conn.execute("PRAGMA synchronous = OFF")  # filling is not what is measured; the daemon reopens with FULL
conn.execute("BEGIN")
now = time.time()
for i in range(n):
    shape = {"cpu_milli": 1000, "memory_mib": 1024, **shapes[i % 4]}
    spec = JobSpec(("true",), Request(**shape), f"user{i % 10}", 1000 + i % 10, 1000 + i % 10, name=f"n{i % 10}")
    conn.execute(
        "INSERT INTO jobs (spec, user, state, submitted_at, version) VALUES (?, ?, 'queued', ?, 1)",
        (spec_to_json(spec), spec.user, now + i * 1e-4),
    )
conn.execute("COMMIT")
store.close()
"""


def submitter(sock: Path, count: int, go: Any, failures: Any) -> None:
    """One client: waits for the start, then submits `count` jobs one after another (each acknowledged = durable)."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://corral", timeout=600) as client:
        client.get("/v1/jobs", params={"limit": 1})
        go.wait()
        for _ in range(count):
            r = client.post("/v1/jobs", json={"command": ["true"], "gpus": 1, "name": "burst"})
            if r.status_code != 201:
                with failures.get_lock():
                    failures.value += 1


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(1000 * (time.perf_counter() - t0))
    return out


def summary(ms: list[float]) -> str:
    ms = sorted(ms)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return f"median {statistics.median(ms):.1f} ms, p95 {p95:.1f} ms ({len(ms)} requests)"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--submissions", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--code", type=Path, help="Run the daemon from this checkout (default: this one).")
    ap.add_argument("--label", default="this branch")
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    code = (args.code or Path(__file__).resolve().parent.parent).resolve()
    env = {**os.environ, "PYTHONPATH": str(code)}
    lines: list[str] = []

    def note(text: str) -> None:
        print(text, flush=True)
        lines.append(f"- {text}")

    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        state.mkdir()
        sock = Path(tmp) / "corral.sock"
        subprocess.run(
            [sys.executable, "-c", FILL, str(state / "jobs.db"), str(args.jobs)], env=env, cwd=code, check=True
        )
        server = subprocess.Popen(
            [sys.executable, "-m", "corral.cli.main", "serve", "--simulate-gpus", "1xA100-80GB",
             "--state-dir", str(state), "--socket", str(sock)],
            env=env, cwd=code, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            for _ in range(600):
                if sock.exists():
                    break
                time.sleep(0.05)
            client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://corral", timeout=600)
            while client.get("/v1/jobs/1").json()["state"] != "running":
                time.sleep(0.1)
            time.sleep(2)  # the first rounds write every job's reason once
            load_before = load()

            # The scheduling loop alone: nothing else asks anything of the daemon for 10 s.
            c0, t0 = cpu_seconds(server.pid), time.monotonic()
            time.sleep(10)
            busy = (cpu_seconds(server.pid) - c0) / (time.monotonic() - t0)
            round_ms = 1000 * 0.2 * busy / max(1e-9, 1 - busy)
            note(
                f"scheduling loop with {args.jobs:,} queued jobs, no requests: daemon busy {100 * busy:.0f} % of "
                f"the time, so a round takes about {round_ms:.0f} ms (a round every 0.2 s plus the round)"
            )

            probe = client.get("/v1/jobs", params={"all": "true", "state": "queued", "limit": 100})
            filters = "X-Corral-Next-After" in probe.headers or len(probe.json()) <= 100
            if filters:
                page = probe.headers["X-Corral-Next-After"]
                queries = {
                    "state=queued&limit=100": {"all": "true", "state": "queued", "limit": 100},
                    "user=user3&order=newest&limit=100": {"user": "user3", "order": "newest", "limit": 100},
                    "name=n7&state=queued&limit=50": {"all": "true", "name": "n7", "state": "queued", "limit": 50},
                    "second page (after=cursor), limit=100": {"all": "true", "limit": 100, "after": page},
                    "default (all=true: limit 1000)": {"all": "true"},
                }
                for label, params in queries.items():

                    def ask(p: Any = params) -> None:
                        client.get("/v1/jobs", params=p).raise_for_status()

                    note(f"list `{label}`: {summary(timed(ask, 30))}")
            else:
                ms = timed(lambda: client.get("/v1/jobs", params={"all": "true"}).raise_for_status(), 3)
                note(f"list: no filters or paging in this code; `all=true` (every job, as JSON): {summary(ms)}")
            ms = timed(lambda: client.get("/v1/jobs").raise_for_status(), 30 if filters else 5)
            note(f"list of a user with no jobs (root's own): {summary(ms)}")
            if filters:  # the CLI as a user runs it (the code before this change took 96 s for `corral ps`)
                cli_env = {**env, "CORRAL_SOCKET": str(sock)}
                for argv in (
                    ["ps", "--all"],
                    ["ps", "--all", "--json"],
                    ["ps", "--all", "--state", "queued", "--limit", "50"],
                ):
                    t0 = time.perf_counter()
                    subprocess.run([sys.executable, "-m", "corral.cli.main", *argv], env=cli_env, cwd=code,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)  # fmt: skip
                    note(f"`corral {' '.join(argv)}` (a first page; the CLI process included): "
                         f"{time.perf_counter() - t0:.2f} s")  # fmt: skip

            # Durable submissions from concurrent clients (processes, as users' CLIs are) while the queue is full.
            per = args.submissions // args.clients
            ctx = multiprocessing.get_context("fork")
            go = ctx.Event()
            failures = ctx.Value("i", 0)
            workers = [ctx.Process(target=submitter, args=(sock, per, go, failures)) for _ in range(args.clients)]
            for w in workers:
                w.start()
            time.sleep(1)  # every client connected and waiting
            c0, t0 = cpu_seconds(server.pid), time.monotonic()
            go.set()
            for w in workers:
                w.join()
            took = time.monotonic() - t0
            cpu = (cpu_seconds(server.pid) - c0) / took
            note(
                f"durable submissions, {args.clients} concurrent client processes over the Unix socket: "
                f"{per * args.clients / took:,.0f}/s ({per * args.clients:,} jobs, {failures.value} errors; "
                f"daemon CPU {100 * cpu:.0f} %)"
            )

            # Bulk cancel: every queued job named n3 (a tenth of the queue).
            r = client.post("/v1/jobs/cancel", json={"name": "n3", "state": "queued", "all": True})
            if r.status_code == 200:
                t0 = time.perf_counter()
                r = client.post("/v1/jobs/cancel", json={"name": "n5", "state": "queued", "all": True})
                took = time.perf_counter() - t0
                done = len(r.json()["cancelled"])
                note(
                    f"bulk cancel (one request, name=n5): {done:,} jobs in {1000 * took:.0f} ms: "
                    f"{done / took:,.0f} jobs/s"
                )
            else:
                ids = [str(i) for i in range(2, args.jobs + 2)]
                t0 = time.perf_counter()
                done = 0
                while time.perf_counter() - t0 < 10 and done < len(ids):
                    client.post(f"/v1/jobs/{ids[done]}/cancel").raise_for_status()
                    done += 1
                took = time.perf_counter() - t0
                note(f"cancel: no bulk cancel in this code; one at a time: {done / took:,.1f} jobs/s ({done} in 10 s)")
        finally:
            # Jobs outlive the daemon (their supervisors do), so job 1's `sleep` is cancelled first, not left behind.
            with contextlib.suppress(httpx.HTTPError, OSError):
                with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://corral") as last:
                    last.post("/v1/jobs/1/cancel")
                time.sleep(0.5)
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    text = (
        f"## corral serve with a long queue: {args.label} ({datetime.date.today()})\n\n"
        f"Machine: {cpu_name()}, {os.cpu_count()} logical CPUs, {memory_gib()}; Python {platform.python_version()}; "
        f"load average {load_before} when measuring began (the CPUs are shared). Command: `python -m "
        f"benchmarks.serve_scale --jobs {args.jobs}` (`corral serve --simulate-gpus 1xA100-80GB`, one GPU held, "
        f"{args.jobs:,} jobs queued in 4 shapes for 10 users, HTTP over the Unix socket, SQLite synchronous=FULL).\n\n"
        + "\n".join(lines)
        + "\n"
    )
    emit(text, args.write)


if __name__ == "__main__":
    main()
