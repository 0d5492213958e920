"""How long the common `corral` commands take, start to exit, against a live `corral serve` (issue 15: 150 ms or less):

    python -m benchmarks.cli_startup [--runs 20] [--code DIR] [--label after] [--write BENCHMARKS.md]

A real `corral serve --simulate-gpus 2xA100-80GB` on a temporary socket and state folder. One job (`true`) is
submitted and left to end, then each command runs `--runs` times as a fresh process, the way a user types it:
`--help`, `--version`, `submit`, `ps`, `show`, `logs`, `explain`, `cancel` (of the ended job: an answer, not a
signal) and `gpus`. Each run is timed from spawn to exit (wall clock), after one untimed run that writes the
bytecode caches. The daemon is idle between runs (no jobs running), so what is measured is the CLI's own start-up
plus one request.

The CLI is the `corral` console script beside this Python when it exists (what a user runs), else
`python -m corral.cli.main`. `--code DIR` runs the CLI and the daemon from another checkout (that folder is put first
on PYTHONPATH), e.g. the code before a change: `git archive <commit> corral | tar -x -C DIR`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from benchmarks.bench_engine import cpu_name, emit, memory_gib

#: (label, arguments); JOB stands for the id of the job submitted before the timed runs.
COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("corral --help", ("--help",)),
    ("corral --version", ("--version",)),
    ("corral submit", ("submit", "--cpus", "100m", "--memory", "16MiB", "--gpus", "2", "--", "true")),
    ("corral ps", ("ps",)),
    ("corral show", ("show", "JOB")),
    ("corral logs", ("logs", "JOB")),
    ("corral explain", ("explain", "JOB")),
    ("corral cancel", ("cancel", "JOB")),
    ("corral gpus", ("gpus",)),
)


def cli_prefix() -> list[str]:
    script = Path(sys.executable).parent / "corral"
    return [str(script)] if script.exists() else [sys.executable, "-m", "corral.cli.main"]


@contextlib.contextmanager
def daemon(tmp: Path, env: dict[str, str]) -> Iterator[Path]:
    sock = tmp / "corral.sock"
    server = subprocess.Popen(
        [sys.executable, "-m", "corral.cli.main", "serve", "--simulate-gpus", "2xA100-80GB",
         "--state-dir", str(tmp / "state"), "--socket", str(sock)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("corral serve did not start")
            time.sleep(0.1)
        yield sock
    finally:
        server.terminate()
        server.wait(timeout=30)


def timed(argv: Sequence[str], env: dict[str, str]) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start, done.returncode


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--code", type=Path, default=None, help="Run the CLI and daemon from this checkout.")
    parser.add_argument("--label", default="", help="Names the run in the section's title (e.g. before, after).")
    parser.add_argument("--write", type=Path, default=None, help="Append the section to this file.")
    args = parser.parse_args(argv)

    root = (args.code or Path(__file__).resolve().parent.parent).resolve()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(":")}
    env.pop("CORRAL_URL", None)
    env.pop("CORRAL_TOKEN", None)
    cli = cli_prefix()
    rows = []
    with tempfile.TemporaryDirectory(prefix="corral-cli-") as tmp, daemon(Path(tmp), env) as sock:
        env["CORRAL_SOCKET"] = str(sock)
        env["COLUMNS"] = "120"
        job = subprocess.run(
            [*cli, "submit", "--cpus", "100m", "--memory", "16MiB", "--", "true"],
            env=env, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        deadline = time.monotonic() + 30
        while "succeeded" not in subprocess.run([*cli, "explain", job], env=env, capture_output=True, text=True).stdout:
            if time.monotonic() > deadline:
                raise SystemExit(f"job {job} did not end")
            time.sleep(0.2)
        load_before = os.getloadavg()
        for label, command in COMMANDS:
            argv_ = [*cli, *(job if a == "JOB" else a for a in command)]
            timed(argv_, env)  # bytecode caches
            times, codes = [], set()
            for _ in range(args.runs):
                seconds, code = timed(argv_, env)
                times.append(seconds)
                codes.add(code)
            rows.append((label, statistics.median(times), p95(times), min(times), sorted(codes)))
            sys.stderr.write(f"{label}: median {statistics.median(times) * 1000:.0f} ms\n")
        load_after = os.getloadavg()

    today = datetime.date.today().isoformat()
    title = f"CLI start-up: common commands against a live corral serve{f', {args.label}' if args.label else ''}"
    lines = [
        f"## {title} (issue 15; {today})",
        "",
        f"- machine: {cpu_name()}, {os.cpu_count()} logical CPUs, {memory_gib()} (2-core dev machine, shared)",
        f"- Python {platform.python_version()}; CLI: `{' '.join(Path(c).name for c in cli)}`"
        + (f"; code: {args.code}" if args.code else ""),
        f"- load average (1, 5, 15 min) before: {' '.join(f'{x:.2f}' for x in load_before)}; "
        f"after: {' '.join(f'{x:.2f}' for x in load_after)}",
        f"- command: `python -m benchmarks.cli_startup {' '.join(argv if argv is not None else sys.argv[1:])}`",
        f"- {args.runs} runs per command, each a fresh process timed from spawn to exit, after one untimed run",
        "",
        "| command | median ms | p95 ms | min ms | exit codes |",
        "|---|---:|---:|---:|---|",
    ]
    for label, median, high, low, exits in rows:
        lines.append(
            f"| `{label}` | {median * 1000:.0f} | {high * 1000:.0f} | {low * 1000:.0f} | {','.join(map(str, exits))} |"
        )
    emit("\n".join(lines) + "\n", args.write)


if __name__ == "__main__":
    main()
