"""kill -9 (or SIGTERM) the real `corral serve` in the middle of a burst of jobs, restart it, and count what went wrong.

    python -m benchmarks.kill9_burst                  # 500 jobs, 3 kill -9s; then Metronome and Chronos runs
    python -m benchmarks.kill9_burst --jobs 200 --signal TERM --kills 1

Every job appends a line to its own ledger file when it starts, so a job that ran twice (at once, or one after the
other) shows as too many lines. The kinds of job, by submission index:

    ok      exit 0, retries 2          -> ran once,  succeeded, exit code 0
    three   exit 3, retries 1          -> ran twice, failed,    exit code 3
    flaky   exit 5 the first time, then 0, retries 2 -> ran twice, succeeded, exit code 0
    once3   exit 3, retries 0          -> ran once,  failed,    exit code 3

A submission the daemon did not acknowledge (it was down) may or may not exist; if it does, it is checked the same
way. An acknowledged one must exist, end, and be true. `tests/daemon/test_kill9.py` runs a small burst of each kind;
this script runs the full one and prints the figures for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

CLI = [sys.executable, "-m", "corral.cli.main"]
KINDS: dict[str, tuple[int, str, int, str, int]] = {
    # kind: (retries, exit codes by run (the last repeats), runs expected, final state, final exit code)
    "ok": (2, "0", 1, "succeeded", 0),
    "three": (1, "3", 2, "failed", 3),
    "flaky": (2, "5 0", 2, "succeeded", 0),
    "once3": (0, "3", 1, "failed", 3),
}
FINAL = {"succeeded", "failed", "cancelled", "lost"}


def job_script(ledger: Path, codes: str, sleep_s: float) -> str:
    """Append to the ledger, sleep, exit with the n-th code (n = lines in the ledger; the last code repeats)."""
    return (
        f'echo "$CORRAL_JOB_ID" >> {ledger}; n=$(wc -l < {ledger}); set -- {codes}; '
        f'while [ "$n" -gt 1 ] && [ "$#" -gt 1 ]; do shift; n=$((n - 1)); done; sleep {sleep_s}; exit "$1"'
    )


class Serve:
    """`corral serve` as a subprocess on a temporary socket, in its own process group (which a kill -9 hits whole;
    the job supervisors live in sessions of their own)."""

    def __init__(self, root: Path) -> None:
        self.state, self.sock, self.root = root / "state", root / "corral.sock", root
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.root / f"serve-{self.starts}.log", "wb")  # noqa: SIM115 - the daemon's, closed with it
        self.proc = subprocess.Popen(
            [
                *CLI,
                "serve",
                "--simulate-gpus",
                "1xA100-80GB",
                "--state-dir",
                str(self.state),
                "--socket",
                str(self.sock),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"corral serve exited: {(self.root / f'serve-{self.starts}.log').read_text()}")
            try:
                with self.client(2) as c:
                    c.get("/v1/jobs", params={"limit": 1})
                return
            except httpx.TransportError:
                time.sleep(0.05)
        raise TimeoutError("corral serve did not come up")

    def client(self, timeout: float = 10) -> httpx.Client:
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.sock)), base_url="http://corral", timeout=timeout
        )

    def kill(self, sig: int) -> None:
        assert self.proc is not None
        if sig == signal.SIGKILL:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@dataclass
class Result:
    what: str
    submitted: int = 0
    acked: int = 0
    attempts: int = 0  # runs seen in the ledgers
    lost: list[str] = field(default_factory=list)  # acknowledged and missing, or ended LOST
    run_twice: list[str] = field(default_factory=list)  # more runs than its kind allows
    wrong: list[str] = field(default_factory=list)  # a state, an exit code or a run count that is not the truth
    kills: int = 0
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.run_twice or self.wrong)

    def line(self) -> str:
        return (
            f"{self.what}: {self.acked}/{self.submitted} acknowledged, {self.kills} kills, {self.attempts} runs, "
            f"lost {len(self.lost)}, run twice {len(self.run_twice)}, wrong {len(self.wrong)}, {self.wall_s:.1f} s"
        )


def under_fire(
    serve: Serve, n: int, kills: int, sig: int, submit: Callable[[httpx.Client, int], str | None], result: Result
) -> dict[int, str]:
    """Submit `n` things while another thread kills and restarts the daemon `kills` times, spread over the burst.
    Returns submission index -> acknowledged id."""
    acked: dict[int, str] = {}
    up = threading.Event()
    up.set()
    done = threading.Event()
    errors: list[BaseException] = []

    def killer() -> None:
        try:
            for k in range(1, kills + 1):
                while len(acked) < n * k // (kills + 1) and not done.is_set():
                    time.sleep(0.01)
                if done.is_set():
                    return
                time.sleep(0.05)  # let some launches be in flight
                up.clear()
                serve.kill(sig)
                result.kills += 1
                serve.start()
                up.set()
        except BaseException as exc:  # reported by the caller
            errors.append(exc)
            up.set()

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        client = serve.client()
        for i in range(n):
            result.submitted += 1
            try:
                got = submit(client, i)
            except httpx.TransportError:
                got = None
                up.wait(120)
                client.close()
                client = serve.client()
            if got is not None:
                acked[i] = got
        client.close()
    finally:
        done.set()
        thread.join()
    if errors:
        raise errors[0]
    result.acked = len(acked)
    return acked


def wait_final(serve: Serve, ids: Callable[[httpx.Client], dict[str, str]], timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    with serve.client(30) as c:
        while True:
            states = ids(c)
            if all(s in FINAL | {"SUCCESS", "FAILED"} for s in states.values()) or time.monotonic() > deadline:
                return states
            time.sleep(0.5)


# ------------------------------------------------------------------------------------------------ plain jobs
def plain_jobs(root: Path, n: int, kills: int, sig: int = signal.SIGKILL) -> Result:
    result = Result(f"jobs (SIG{signal.Signals(sig).name.removeprefix('SIG')})")
    ledgers = root / "ledgers"
    ledgers.mkdir(parents=True)
    names = list(KINDS)
    serve = Serve(root)
    started = time.monotonic()
    serve.start()
    try:

        def submit(c: httpx.Client, i: int) -> str | None:
            retries, codes, *_ = KINDS[names[i % len(names)]]
            cmd = job_script(ledgers / f"j{i}", codes, (i % 4) / 10)
            r = c.post(
                "/v1/jobs", json={"command": ["sh", "-c", cmd], "cpus": "10m", "memory": "16MiB", "retries": retries}
            )
            return str(r.json()["id"]) if r.status_code == 201 else None

        acked = under_fire(serve, n, kills, sig, submit, result)

        def states(c: httpx.Client) -> dict[str, str]:
            return {j["id"]: j["state"] for j in c.get("/v1/jobs", params={"all": "true"}).json()}

        wait_final(serve, states, 60 + n / 2)
        with serve.client(30) as c:
            jobs = {j["id"]: j for j in c.get("/v1/jobs").json()}
    finally:
        serve.stop()
    result.wall_s = time.monotonic() - started
    by_index = {int(Path(j["command"][2].split(" >> ")[1].split(";")[0]).name[1:]): j for j in jobs.values()}
    for i, job_id in acked.items():
        if job_id not in jobs:
            result.lost.append(f"{job_id} (submission {i}): acknowledged, not in the store")
    for i, job in by_index.items():
        _, _, runs, state, code = KINDS[names[i % len(names)]]
        ledger = ledgers / f"j{i}"
        seen = ledger.read_text().split() if ledger.exists() else []
        result.attempts += len(seen)
        if job["state"] == "lost":
            result.lost.append(f"{job['id']}: lost ({job['reason']})")
        if len(seen) > runs:
            result.run_twice.append(f"{job['id']}: ran {len(seen)} times, {runs} expected")
        if (job["state"], job["exit_code"], len(seen), job["attempts"]) != (state, code, runs, runs):
            result.wrong.append(
                f"{job['id']} ({names[i % len(names)]}): {job['state']} exit {job['exit_code']}, "
                f"{len(seen)} runs, {job['attempts']} attempts; expected {state} exit {code}, {runs} runs "
                f"({job['reason']})"
            )
    return result


# ------------------------------------------------------------------------------------------------ Metronome
METRONOME_KINDS = {
    # kind: (restart policy, exit codes by run, tasks expected, final run status)
    "ok": ("NEVER", "0", 1, "SUCCESS"),
    "flaky": ("ON_FAILURE", "5 0", 2, "SUCCESS"),
    "fails": ("NEVER", "3", 1, "FAILED"),
}


def metronome_runs(root: Path, n: int, kills: int, sig: int = signal.SIGKILL) -> Result:
    """`n` Metronome jobs, one run each, triggered in a burst under fire."""
    result = Result(f"Metronome runs (SIG{signal.Signals(sig).name.removeprefix('SIG')})")
    ledgers = root / "ledgers"
    ledgers.mkdir(parents=True)
    names = list(METRONOME_KINDS)
    serve = Serve(root)
    started = time.monotonic()
    serve.start()
    try:
        with serve.client(30) as c:
            for i in range(n):
                policy, codes, _, _ = METRONOME_KINDS[names[i % len(names)]]
                restart: dict[str, Any] = {"policy": policy}
                if policy == "ON_FAILURE":
                    restart["activeDeadlineSeconds"] = 600
                run = {"cpus": 0.01, "mem": 32, "disk": 0, "cmd": job_script(ledgers / f"m{i}", codes, 0.2)}
                r = c.post("/metronome/v1/jobs", json={"id": f"m{i}", "run": {**run, "restart": restart}})
                assert r.status_code == 201, r.text

        def submit(c: httpx.Client, i: int) -> str | None:
            r = c.post(f"/metronome/v1/jobs/m{i}/runs")
            return str(r.json()["id"]) if r.status_code == 201 else None

        acked = under_fire(serve, n, kills, sig, submit, result)

        def runs(c: httpx.Client) -> dict[str, str]:
            out = {}
            for i, run_id in acked.items():
                r = c.get(f"/metronome/v1/jobs/m{i}/runs/{run_id}")
                out[f"m{i}/{run_id}"] = r.json()["status"] if r.status_code == 200 else "missing"
            return out

        final = wait_final(serve, runs, 60 + n)
        with serve.client(30) as c:
            history = {
                i: c.get(f"/metronome/v1/jobs/m{i}", params={"embed": "history"}).json()["history"] for i in range(n)
            }
    finally:
        serve.stop()
    result.wall_s = time.monotonic() - started
    for i in range(n):
        kind = names[i % len(names)]
        _, _, tasks, status = METRONOME_KINDS[kind]
        ledger = ledgers / f"m{i}"
        seen = ledger.read_text().split() if ledger.exists() else []
        result.attempts += len(seen)
        finished = history[i]["successCount"] + history[i]["failureCount"]
        if i in acked:
            got = final[f"m{i}/{acked[i]}"]
            if got == "missing":
                result.lost.append(f"m{i} run {acked[i]}: acknowledged, not found")
            elif got != status:
                result.wrong.append(f"m{i} ({kind}) run {acked[i]}: {got}, expected {status}")
        if len(seen) > tasks * finished or len(seen) > tasks:
            result.run_twice.append(f"m{i} ({kind}): {len(seen)} tasks ran, {tasks} expected")
        elif finished and len(seen) != tasks:
            result.wrong.append(f"m{i} ({kind}): {len(seen)} tasks ran, {tasks} expected")
    return result


# ------------------------------------------------------------------------------------------------ Chronos
def chronos_runs(root: Path, n: int, kills: int, sig: int = signal.SIGKILL) -> Result:
    """`n` Chronos jobs (a far-off schedule, no retries), each run once by hand in a burst under fire; half fail."""
    result = Result(f"Chronos runs (SIG{signal.Signals(sig).name.removeprefix('SIG')})")
    ledgers = root / "ledgers"
    ledgers.mkdir(parents=True)
    serve = Serve(root)
    started = time.monotonic()
    serve.start()
    try:
        with serve.client(30) as c:
            for i in range(n):
                body = {
                    "name": f"c{i}",
                    "command": job_script(ledgers / f"c{i}", str(3 * (i % 2)), 0.2),
                    "schedule": "R/2030-01-01T00:00:00Z/P1D",
                    "retries": 0,  # Chronos retries a failure after 60 s by default: a second run, rightly
                    "cpus": 0.01,
                    "mem": 32,
                }
                r = c.post("/chronos/v1/scheduler/iso8601", json=body)
                assert r.status_code == 204, r.text

        def submit(c: httpx.Client, i: int) -> str | None:
            r = c.put(f"/chronos/v1/scheduler/job/c{i}")
            return f"c{i}" if r.status_code == 204 else None

        acked = under_fire(serve, n, kills, sig, submit, result)

        def counts(c: httpx.Client) -> dict[str, str]:
            jobs = {j["name"]: j for j in c.get("/chronos/v1/scheduler/jobs").json()}
            return {
                name: ("SUCCESS" if jobs[name]["successCount"] + jobs[name]["errorCount"] else "waiting")
                for name in acked.values()
            }

        wait_final(serve, counts, 60 + n)
        with serve.client(30) as c:
            jobs = {j["name"]: j for j in c.get("/chronos/v1/scheduler/jobs").json()}
    finally:
        serve.stop()
    result.wall_s = time.monotonic() - started
    for i in range(n):
        name = f"c{i}"
        ledger = ledgers / name
        seen = ledger.read_text().split() if ledger.exists() else []
        result.attempts += len(seen)
        ok, errors = jobs[name]["successCount"], jobs[name]["errorCount"]
        if len(seen) > 1:
            result.run_twice.append(f"{name}: ran {len(seen)} times")
        if i in acked and ok + errors == 0:
            result.lost.append(f"{name}: acknowledged run never ended")
        expected = (0, 1) if i % 2 else (1, 0)
        if (ok + errors or i in acked) and ((ok, errors) != expected or len(seen) != 1):
            result.wrong.append(
                f"{name}: {ok} successes, {errors} errors, {len(seen)} runs; expected {expected}, 1 run"
            )
    return result


def launch_rate(n: int = 100) -> float:
    """Launches per second of `true` through the local executor, one after the other (supervisor start included)."""
    from corral.executor import LaunchSpec, LocalExecutor

    with tempfile.TemporaryDirectory() as tmp:
        ex = LocalExecutor()
        began = time.monotonic()
        for i in range(n):
            log = Path(tmp) / f"j{i}.log"
            env = {"PATH": "/usr/bin:/bin"}
            ex.launch(LaunchSpec(f"j{i}", ("true",), env, "/", os.getuid(), os.getgid(), (), 0, 0, log, None))
        took = time.monotonic() - began
        while ex.running():
            ex.poll()
            time.sleep(0.01)
        ex.close()
    return n / took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--definitions", type=int, default=60, help="Metronome and Chronos jobs (one run each)")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--signal", choices=["KILL", "TERM"], default="KILL")
    parser.add_argument("--launch-rate", action="store_true", help="only measure launches per second")
    args = parser.parse_args()
    if args.launch_rate:
        print(f"{launch_rate():.0f} launches/s")
        return
    sig = signal.Signals[f"SIG{args.signal}"]
    results = []
    for name, run, n in (("jobs", plain_jobs, args.jobs), ("metronome", metronome_runs, args.definitions),
                         ("chronos", chronos_runs, args.definitions)):  # fmt: skip
        with tempfile.TemporaryDirectory(prefix=f"corral-kill9-{name}-") as tmp:
            result = run(Path(tmp), n, args.kills, sig)
        results.append(result)
        print(result.line(), flush=True)
        for problem in (result.lost + result.run_twice + result.wrong)[:10]:
            print("   ", problem)
    print(json.dumps([r.__dict__ for r in results], default=str))
    sys.exit(0 if all(r.ok for r in results) else 1)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
