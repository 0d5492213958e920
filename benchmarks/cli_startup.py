"""How long the common `corral` commands take, start to exit, against a live `corral serve` (issue 15: 150 ms or less):

    python -m benchmarks.cli_startup [--runs 20] [--code DIR] [--before DIR] [--label L] [--write BENCHMARKS.md]

A real `corral serve --simulate-gpus 2xA100-80GB` on a temporary socket and state folder. One job (`true`) is
submitted and left to end; a `sleep` then holds both GPUs, so that the jobs submitted for `cancel` wait in the queue
(each run cancels one of them: a real cancellation). Each command then runs `--runs` times as a fresh process, the way
a user types it: `--help`, `--version`, `submit`, `ps`, `show`, `logs`, `explain`, `cancel` and `gpus`. Each run is
timed from spawn to exit (wall clock), after one untimed run that writes the bytecode caches.

The CLI is the `corral` console script beside this Python when it exists (what a user runs), else
`python -m corral.cli.main`. `--code DIR` runs the CLI and the daemon from another checkout (that folder is put first
on PYTHONPATH). `--before DIR` also times the CLI of another checkout, e.g. the code before a change
(`git archive <commit> corral | tar -x -C DIR`), against the same daemon, its runs interleaved with this code's so
that both see the same load on a shared machine.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from benchmarks.bench_engine import cpu_name, emit, memory_gib

#: (label, arguments); JOB stands for the id of the job that ended before the timed runs, QUEUED for a waiting job.
COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("corral --help", ("--help",)),
    ("corral --version", ("--version",)),
    ("corral submit", ("submit", "--cpus", "100m", "--memory", "16MiB", "--gpus", "2", "--", "true")),
    ("corral ps", ("ps",)),
    ("corral show", ("show", "JOB")),
    ("corral logs", ("logs", "JOB")),
    ("corral explain", ("explain", "JOB")),
    ("corral cancel", ("cancel", "QUEUED")),
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


def timed(argv: Sequence[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds (user + system), exit status) of one run. The CPU time barely moves with the
    machine's load, the wall time does: on a shared machine the first shows what the code costs."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.returncode


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--code", type=Path, default=None, help="Run the CLI and daemon from this checkout.")
    parser.add_argument("--before", type=Path, default=None, help="Also time this checkout's CLI, interleaved.")
    parser.add_argument("--label", default="", help="Names the run in the section's title.")
    parser.add_argument("--write", type=Path, default=None, help="Append the section to this file.")
    args = parser.parse_args(argv)

    def environment(root: Path) -> dict[str, str]:
        path = os.pathsep.join([str(root.resolve()), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env = {**os.environ, "PYTHONPATH": path, "COLUMNS": "120"}
        env.pop("CORRAL_URL", None)
        env.pop("CORRAL_TOKEN", None)
        return env

    codes = {"after": environment(args.code or Path(__file__).resolve().parent.parent)}
    if args.before is not None:
        codes = {"before": environment(args.before), **codes}
    cli = cli_prefix()
    times: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    exits: dict[tuple[str, str], set[int]] = {}
    with tempfile.TemporaryDirectory(prefix="corral-cli-") as tmp, daemon(Path(tmp), codes["after"]) as sock:
        for env in codes.values():
            env["CORRAL_SOCKET"] = str(sock)
        env = codes["after"]

        def corral(*command: str) -> str:
            return subprocess.run([*cli, *command], env=env, capture_output=True, text=True, check=True).stdout

        job = corral("submit", "--cpus", "100m", "--memory", "16MiB", "--", "true").strip()
        deadline = time.monotonic() + 30
        while "succeeded" not in corral("explain", job):
            if time.monotonic() > deadline:
                raise SystemExit(f"job {job} did not end")
            time.sleep(0.2)
        blocker = corral("submit", "--cpus", "100m", "--memory", "16MiB", "--gpus", "2", "--", "sleep", "3600")
        queued = [
            corral("submit", "--cpus", "100m", "--memory", "16MiB", "--gpus", "1", "--", "true").strip()
            for _ in range((args.runs + 1) * len(codes))
        ]
        load_before = os.getloadavg()
        for label, command in COMMANDS:
            for name in codes:
                times[label, name], cpu[label, name], exits[label, name] = [], [], set()
            for run in range(args.runs + 1):
                for name, code_env in codes.items():
                    argv_ = [*cli, *(job if a == "JOB" else queued.pop() if a == "QUEUED" else a for a in command)]
                    seconds, cpu_seconds, exit_code = timed(argv_, code_env)
                    if run:  # the first: bytecode caches
                        times[label, name].append(seconds)
                        cpu[label, name].append(cpu_seconds)
                        exits[label, name].add(exit_code)
            sys.stderr.write(
                f"{label}: "
                + ", ".join(f"{n} median {statistics.median(times[label, n]) * 1000:.0f} ms" for n in codes)
                + "\n"
            )
        load_after = os.getloadavg()
        corral("cancel", blocker.strip())

    today = datetime.date.today().isoformat()
    title = f"CLI start-up: common commands against a live corral serve{f', {args.label}' if args.label else ''}"
    head = " | ".join(f"{n} median ms | {n} p95 ms | {n} CPU ms | {n} exit" for n in codes)
    lines = [
        f"## {title} (issue 15; {today})",
        "",
        f"- machine: {cpu_name()}, {os.cpu_count()} logical CPUs, {memory_gib()} (2-core dev machine, shared)",
        f"- Python {platform.python_version()}; CLI: `{' '.join(Path(c).name for c in cli)}`"
        + (f"; after: {args.code}" if args.code else "; after: this checkout")
        + (f"; before: {args.before}" if args.before else ""),
        f"- load average (1, 5, 15 min) at the start: {' '.join(f'{x:.2f}' for x in load_before)}; "
        f"at the end: {' '.join(f'{x:.2f}' for x in load_after)}",
        f"- command: `python -m benchmarks.cli_startup {' '.join(argv if argv is not None else sys.argv[1:])}`",
        f"- {args.runs} runs per command and code, each a fresh process timed from spawn to exit (wall clock: median, "
        "95th percentile), after one untimed run"
        + ("; before and after interleaved run by run" if len(codes) > 1 else ""),
        "- CPU ms: the median CPU time (user + system) of the command's process, which the load on a shared machine "
        "changes far less than the wall time",
        "",
        f"| command | {head} |",
        "|---|" + "---:|---:|---:|---|" * len(codes),
    ]
    for label, _ in COMMANDS:
        cells = " | ".join(
            f"{statistics.median(times[label, n]) * 1000:.0f} | {p95(times[label, n]) * 1000:.0f} | "
            f"{statistics.median(cpu[label, n]) * 1000:.0f} | {','.join(map(str, sorted(exits[label, n])))}"
            for n in codes
        )
        lines.append(f"| `{label}` | {cells} |")
    emit("\n".join(lines) + "\n", args.write)


if __name__ == "__main__":
    main()
