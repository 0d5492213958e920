"""`corral acct` over a month of history: 1,000,000 ended jobs (issue 26, item 6).

    python -m benchmarks.acct_history [--jobs 1000000] [--users 50] [--days 30] [--runs 5] [--no-cli]

Fills a job store (SQLite, the daemon's own schema) directly: JOBS jobs of USERS users in 4 queues that ended over the
last DAYS days, in the order they ended (as a daemon writes them), with GPU figures for most; then times, each RUNS
times (median, min, max):
- opening the store (what a restart pays for it);
- filtered queries through the store: one user's week, one user's month (first page), a state's week, a whole month's
  first page, the summary of the month per user and queue, one user's summary;
- end to end (unless --no-cli): `corral serve` on that store and `corral acct` as root, the CLI a user runs;
- one batch of pruning (500 of the oldest jobs, as the retention thread deletes them).
Prints a Markdown table for BENCHMARKS.md, with the machine, the date and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from corral.jobs.model import JobState
from corral.store import SqliteStore
from corral.store.acct import AcctQuery
from corral.store.sqlite import _ACCT_COLUMNS

CLI = [str(Path(sys.executable).parent / "corral")]
QUEUES = ("default", "train", "interactive", "batch")


def spec_text(user: str, uid: int, queue: str, gpus: int, cpus: int) -> str:
    return json.dumps(
        {
            "command": ["python", "train.py", "--epochs", "10"],
            "request": {
                "cpu_milli": cpus, "memory_mib": 16384, "gpu_count": gpus, "gpu_milli": 1000 if gpus else 0,
                "gpu_memory_mib": 0, "gpu_models": None, "min_gpu_memory_mib": 0, "constraints": [], "priority": 0,
                "gpu_behavior": None, "labels": {}, "policy": None, "id": "", "share_owner": "",
            },
            "user": user, "uid": uid, "gid": uid, "name": f"exp-{gpus}", "retries": 0, "time_limit_s": None,
            "env": {"PATH": "/usr/bin:/bin"}, "cwd": f"/home/{user}", "origin": "", "queue": queue,
        },
        sort_keys=True,
    )  # fmt: skip


def fill(path: Path, jobs: int, users: int, days: int, now: float, seed: int = 1) -> None:
    """The store's own schema (SqliteStore creates it), then rows written straight into SQLite."""
    SqliteStore(path).close()
    rng = random.Random(seed)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("BEGIN")
    # a store whose jobs were admitted clean: `corral serve` skips its one-off scan of every stored environment
    from corral.jobs.environment import RULE

    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('env_rule', ?)", (RULE,))
    span = days * 86400.0
    ends = sorted(now - span + rng.random() * span for _ in range(jobs))
    states = [("succeeded", 85), ("failed", 10), ("cancelled", 4), ("lost", 1)]
    population = [s for s, w in states for _ in range(w)]
    job_rows, acct_rows = [], []
    put = f"INSERT INTO acct ({', '.join(_ACCT_COLUMNS)}) VALUES ({', '.join('?' * len(_ACCT_COLUMNS))})"
    for i, end in enumerate(ends, start=1):
        u = rng.randrange(users)
        user, uid, queue = f"user{u:03d}", 2000 + u, QUEUES[u % len(QUEUES)]
        gpus = rng.choice((0, 1, 1, 1, 2, 2, 4, 8))
        cpus = 1000 * rng.choice((1, 2, 4, 8))
        state = rng.choice(population)
        elapsed = 0.0 if state == "cancelled" and rng.random() < 0.5 else rng.expovariate(1 / 3600.0)
        started = None if elapsed == 0.0 else end - elapsed
        code = 0 if state == "succeeded" else (1 if state == "failed" else None)
        grants = json.dumps([[k, 1000, 81920] for k in range(gpus)]) if started is not None else "[]"
        sampled = gpus > 0 and started is not None and rng.random() < 0.9
        util = round(rng.uniform(5, 99), 2) if sampled else None
        mem = rng.randrange(1000, 80000) * gpus if sampled else None
        usage = (
            json.dumps({"samples": int(elapsed), "gpu_util_pct": util, "gpu_mem_peak_mib": mem, "simulated": False})
            if sampled
            else None
        )
        submitted = (started if started is not None else end) - rng.uniform(0, 600)
        job_rows.append(
            (i, spec_text(user, uid, queue, gpus, cpus), user, state, submitted, 1, 0.0, started, end, code, grants,
             "[]", "", 4, usage)
        )  # fmt: skip
        acct_rows.append(
            (end, i, uid, user, queue, f"exp-{gpus}", state, code, submitted, started, elapsed,
             gpus * 1000, json.dumps(list(range(gpus)) if started is not None else []), cpus, util, mem,
             int(elapsed) if sampled else 0, 0)
        )  # fmt: skip
        if len(job_rows) == 20000:
            flush(conn, job_rows, acct_rows, put)
    flush(conn, job_rows, acct_rows, put)
    conn.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'jobs'", (jobs,))
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()


def flush(conn: sqlite3.Connection, job_rows: list[Any], acct_rows: list[Any], put: str) -> None:
    conn.executemany(
        "INSERT INTO jobs (id, spec, user, state, submitted_at, attempts, not_before, started_at, finished_at,"
        " exit_code, gpus, gpu_uuids, reason, version, usage) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        job_rows,
    )
    conn.executemany(put, acct_rows)
    job_rows.clear()
    acct_rows.clear()


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def settle(pid: int, quiet_ticks: int = 20, every_s: float = 2.0, most_s: float = 600.0) -> float:
    """When the process has used under `quiet_ticks` of CPU over `every_s` (or `most_s` passed)."""
    deadline = time.monotonic() + most_s
    before = cpu_ticks(pid)
    while time.monotonic() < deadline:
        time.sleep(every_s)
        now = cpu_ticks(pid)
        if now - before < quiet_ticks:
            return time.perf_counter()
        before = now
    return time.perf_counter()


def timed(what: Callable[[], Any], runs: int) -> tuple[float, float, float, Any]:
    took, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = what()
        took.append(time.perf_counter() - t0)
    return statistics.median(took), min(took), max(took), out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-cli", action="store_true")
    args = parser.parse_args()
    now = time.time()
    week = now - 7 * 86400
    results: list[tuple[str, float, float, float, str]] = []

    def record(name: str, stats: tuple[float, float, float, Any], rows: str) -> None:
        results.append((name, *stats[:3], rows))
        print(f"{name}: median {stats[0] * 1000:.1f} ms (min {stats[1] * 1000:.1f}, max {stats[2] * 1000:.1f}); {rows}")

    with tempfile.TemporaryDirectory(prefix="corral-acct-") as tmp:
        state_dir = Path(tmp) / "state"
        state_dir.mkdir(mode=0o700)
        path = state_dir / "jobs.db"
        t0 = time.perf_counter()
        fill(path, args.jobs, args.users, args.days, now)
        filled = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in state_dir.iterdir()) / 2**20
        print(f"filled {args.jobs} jobs in {filled:.1f} s; {size:.0f} MiB")
        record("open the store", timed(lambda: SqliteStore(path).close(), args.runs), "")
        store = SqliteStore(path)
        user = "user007"
        uid = 2007
        for name, query in (
            ("one user's week, every row", AcctQuery(since=week, uid=uid)),
            ("one user's month, first page", AcctQuery(since=now - 31 * 86400, uid=uid, limit=10000)),
            ("failed, the week, first page", AcctQuery(since=week, states={JobState.FAILED}, limit=10000)),
            ("the month, first page (root)", AcctQuery(since=now - 31 * 86400, limit=10000)),
            ("root: one user by name, the week", AcctQuery(since=week, user=user)),
        ):
            stats = timed(partial(store.acct, query), args.runs)
            record(name, stats, f"{len(stats[3])} rows")
        stats = timed(lambda: store.acct_summary(AcctQuery(since=now - 31 * 86400)), args.runs)
        record("summary of the month, every user and queue", stats, f"{len(stats[3])} rows of {args.jobs} jobs")
        stats = timed(lambda: store.acct_summary(AcctQuery(since=now - 31 * 86400, uid=uid)), args.runs)
        record("summary of one user's month", stats, f"{len(stats[3])} rows")
        store.close()
        if not args.no_cli:
            sock = Path(tmp) / "corral.sock"
            server = subprocess.Popen(
                [*CLI, "serve", "--simulate-gpus", "4xH100-80GB", "--state-dir", str(state_dir), "--socket", str(sock),
                 "--acct-retention", "never"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            try:
                deadline = time.monotonic() + 60
                while not sock.exists():
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise SystemExit("the daemon did not start")
                    time.sleep(0.05)
                # A start reads the history (corral.jobs.controller's first round decodes every stored job):
                # the CLI is timed once the daemon is idle again, and the wait is reported.
                started = time.perf_counter()
                settled = settle(server.pid)
                print(f"the daemon was busy for {settled - started:.0f} s after it started listening")
                results.append(("(daemon busy after its start, reading the history)", settled - started, 0, 0, ""))
                env = {**os.environ, "CORRAL_SOCKET": str(sock)}
                for name, argv in (
                    ("CLI: acct -u user007 -S now-7d (table)", ["acct", "-u", user, "-S", "now-7d"]),
                    ("CLI: acct -u user007 -S now-7d --json", ["acct", "-u", user, "-S", "now-7d", "--json"]),
                    ("CLI: acct -s failed -S now-1d", ["acct", "-s", "failed", "-S", "now-1d"]),
                    ("CLI: acct --summary -S now-30d", ["acct", "--summary", "-S", "now-30d"]),
                ):
                    stats = timed(
                        partial(subprocess.run, [*CLI, *argv], env=env, capture_output=True, check=True), args.runs
                    )
                    lines = stats[3].stdout.count(b"\n")
                    record(name, stats, f"{lines} lines")
            finally:
                server.terminate()
                server.wait(timeout=30)
        store = SqliteStore(path)
        first = store.acct(AcctQuery(limit=1))[0].ended_at
        stats = timed(lambda: store.prune_ended(first + 86400, 500), args.runs)
        record("prune one batch (500 oldest jobs)", stats, "")
        store.close()
    print()
    load = os.getloadavg()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores; load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; {args.jobs} jobs of {args.users} "
        f"users over {args.days} days, {size:.0f} MiB"
    )
    print("| query | median | min | max | answer |\n|---|---|---|---|---|")
    for name, med, low, high, rows in results:
        if name.startswith("("):
            print(f"| {name} | {med:.0f} s | | | |")
            continue
        print(f"| {name} | {med * 1000:.0f} ms | {low * 1000:.0f} ms | {high * 1000:.0f} ms | {rows} |")


if __name__ == "__main__":
    main()
