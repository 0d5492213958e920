"""`corral ps` with 5,000 waiting jobs (issue 26, item 7), against a real `corral serve`.

    python -m benchmarks.ps_listing [--jobs 5000] [--runs 7] [--code DIR]

Starts `corral serve --simulate-gpus 4xH100-80GB` in a temporary directory, runs one 4-GPU job that holds every GPU,
submits JOBS more 4-GPU jobs behind it over HTTP (4 threads), then times `corral ps` (all rows), `ps --json` and the
API's pages alone (every field; the table's fields; those as columns, `layout=columns`, what `ps` reads), each RUNS
times: the median and the spread. Compare `squeue` (0.05-0.07 s on this machine type; benchmarks/slurm_side_by_side.py
--rows list runs both).
The CLI is the console script beside this Python (corral.cli.fast: `ps` without click), and `ps` through click
(corral.cli.main) for comparison; `--code DIR` runs the daemon and the CLI of another checkout (e.g. before a change:
`git archive COMMIT corral | tar -x -C DIR`) as a console script would. Also printed: the CPU time of each `ps`
process, and the daemon's CPU while it idles with the queue (its scheduling rounds).
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
from corral.cli.wire import PS_FIELDS

CLI = [str(Path(sys.executable).parent / "corral")]  # the console script, as a user runs it


def console_script(where: Path, code: Path, module: str) -> list[str]:
    """The command as dev.py installs it (pip's console script without its `import re`), running `module`'s main
    with `code` first on the path."""
    where.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(code)!r})\n"
                     f"from {module} import main\nsys.exit(main())\n")  # fmt: skip
    where.chmod(0o755)
    return [str(where)]


def process_cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def timed(argv: list[str], env: dict[str, str], runs: int) -> tuple[float, float, float, int, float]:
    """(median, min, max) seconds of `argv`, its stdout's size in bytes, and its median CPU seconds."""
    took: list[float] = []
    cpu: list[float] = []
    size = 0
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        out = proc.stdout.read() if proc.stdout is not None else b""
        _, status, usage = os.wait4(proc.pid, 0)
        took.append(time.perf_counter() - t0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{' '.join(argv)}: exit {os.waitstatus_to_exitcode(status)}")
        cpu.append(usage.ru_utime + usage.ru_stime)
        size = len(out)
    return statistics.median(took), min(took), max(took), size, statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--code", type=Path, default=None, help="Run the daemon and the CLI of this checkout.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-ps-") as tmp:
        sock = Path(tmp) / "corral.sock"
        code = args.code.resolve() if args.code is not None else Path(__file__).resolve().parent.parent
        fast = (code / "corral" / "cli" / "fast.py").exists()
        cli = console_script(Path(tmp) / "corral", code, "corral.cli.fast" if fast else "corral.cli.main")
        click = console_script(Path(tmp) / "corral-click", code, "corral.cli.main")
        server = subprocess.Popen(
            [*cli, "serve", "--simulate-gpus", "4xH100-80GB", "--state-dir", f"{tmp}/state", "--socket", str(sock)],
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
            env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached, as installed
            time.sleep(30)  # the rounds after a burst store each waiting job's reason, a page a round: let them
            began, idle_from = time.monotonic(), process_cpu_ms(server.pid)
            time.sleep(10)
            idle = (process_cpu_ms(server.pid) - idle_from) / (time.monotonic() - began)
            print(f"the daemon idle with {args.jobs} waiting, 30 s on: {idle:.0f} ms CPU a second (its rounds)")
            print(f"code: {code}{'' if fast else ' (no fast path)'}")
            for label, argv in (
                ("ps", [*cli, "ps"]),
                ("ps (click)", [*click, "ps"]),
                ("ps --json", [*cli, "ps", "--json"]),
                ("ps --limit 1000", [*cli, "ps", "--limit", "1000"]),
                ("ps --limit 10000", [*cli, "ps", "--limit", "10000"]),
            ):
                timed(argv, env, 1)  # bytecode caches
                med, lo, hi, size, cpu = timed(argv, env, args.runs)
                print(f"{label:18} median {med:.3f} s ({lo:.3f}-{hi:.3f}), CPU {cpu:.3f} s, {size / 1e6:.2f} MB out")
            took = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                answer = request(endpoint, "GET", "/v1/jobs", params={"limit": 10000})
                took.append(time.perf_counter() - t0)
            print(f"{'API page (10000)':18} median {statistics.median(took):.3f} s, {len(answer.content) / 1e6:.2f} MB")
            took = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                answer = request(endpoint, "GET", "/v1/jobs", params={"limit": 10000, "fields": PS_FIELDS})
                took.append(time.perf_counter() - t0)
            print(f"{'  with ps fields':18} median {statistics.median(took):.3f} s, {len(answer.content) / 1e6:.2f} MB")
            took = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                answer = request(
                    endpoint, "GET", "/v1/jobs", params={"limit": 10000, "fields": PS_FIELDS, "layout": "columns"}
                )
                took.append(time.perf_counter() - t0)
            print(f"{'  as columns':18} median {statistics.median(took):.3f} s, {len(answer.content) / 1e6:.2f} MB")
            print(f"load after: {os.getloadavg()[0]:.1f}")
            request(endpoint, "POST", f"/v1/jobs/{hog}/cancel")  # a daemon that stops leaves its jobs running
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
