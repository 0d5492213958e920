"""What one `corral submit` costs, against the floor of Python's own start (issue 26, item 7).

    python -m benchmarks.submit_floor [--runs 21] [--code DIR ...]

Each command is a fresh process, run --runs times after one untimed run; the figures are the median wall time and
the median CPU time (user + system, from wait4) of the process, which the load on a shared machine moves far less
than the wall time. `corral submit` is the CLI as a console script starts it (this checkout, or each --code DIR, first
on the path), against a `corral serve` whose 4 GPUs are held, so the jobs wait (they are cancelled at the end):
through the fast path (corral.cli.fast, what pyproject's script runs) and through click (corral.cli.main), each with
the daemon's CPU per submission (its process's CPU over the runs, less what it used idle for as long; it includes
the scheduling round each submission wakes). The console script is written as pip writes one (it imports re), and
as dev.py installs it (without).
Run it with the Python of the environment to measure: its `site` (an editable install's finder or not) is part of
every start.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def measure(argv: list[str], runs: int, env: dict[str, str]) -> tuple[float, float]:
    """(median wall ms, median CPU ms) of `argv`, each run a fresh process."""
    walls, cpus = [], []
    for i in range(runs + 1):
        began = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - began
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}")
        if i:
            walls.append(wall * 1000)
            cpus.append((usage.ru_utime + usage.ru_stime) * 1000)
    return statistics.median(walls), statistics.median(cpus)


def process_cpu_ms(pid: int) -> float:
    """CPU time (user + system) a process has used, in ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--code", type=Path, action="append", help="another checkout's CLI too (e.g. before)")
    args = ap.parse_args()
    py = sys.executable
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # bytecode cached, as installed
    with tempfile.TemporaryDirectory(prefix="corral-floor-") as tmp:
        sock = Path(tmp) / "corral.sock"
        daemon = subprocess.Popen(
            [py, "-m", "corral.cli.main", "serve", "--simulate-gpus", "4xH100-80GB", "--state-dir",
             str(Path(tmp) / "state"), "--socket", str(sock)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        try:
            while not sock.exists():
                time.sleep(0.05)
            env["CORRAL_SOCKET"] = str(sock)
            rows = [
                ("`python -I -S -c pass` (the interpreter alone)", [py, "-I", "-S", "-c", "pass"], env),
                (
                    "`python -c pass` (with site: this environment's .pth files, an editable finder if any)",
                    [py, "-c", "pass"],
                    env,
                ),
            ]
            submit = ["submit", "--gpus", "1", "--", "true"]
            for code in [ROOT, *(args.code or [])]:
                label = "this checkout" if code == ROOT else str(code)
                entries = [("fast path", "corral.cli.fast")] if (code / "corral" / "cli" / "fast.py").exists() else []
                for how, module in [*entries, ("click", "corral.cli.main")]:
                    script = Path(tmp) / f"corral-{len(rows)}"
                    script.write_text(f"#!{py}\nimport re\nimport sys\nsys.path.insert(0, {str(code)!r})\n"
                                      f"from {module} import main\nsys.exit(main())\n")  # fmt: skip
                    script.chmod(0o755)
                    path = "corral.cli.fast" if module == "corral.cli.fast" else "corral.cli.client"
                    importing = f"import sys; sys.path.insert(0, {str(code)!r}); import {path}"
                    rows += [
                        (f"import the submit path, {how} ({label})", [py, "-c", importing], env),
                        (f"`corral submit --gpus 1 -- true`, {how} ({label})", [str(script), *submit], env),
                    ]
                    if module == "corral.cli.fast":  # what pip's script costs: its `import re` (its argv[0] fix)
                        lean = Path(tmp) / f"corral-{len(rows)}"
                        lean.write_text(script.read_text().replace("import re\n", ""))
                        lean.chmod(0o755)
                        rows.append((f"the same as dev.py installs it: without pip's `import re` ({label})",
                                     [str(lean), *submit], env))  # fmt: skip
            subprocess.run([py, "-m", "corral.cli.main", "submit", "--gpus", "4", "--", "sleep", "600"], check=True,
                           stdout=subprocess.DEVNULL, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)})  # fmt: skip
            time.sleep(2)
            began, idle_from = time.monotonic(), process_cpu_ms(daemon.pid)
            time.sleep(3)
            idle = (process_cpu_ms(daemon.pid) - idle_from) / (time.monotonic() - began)  # ms of CPU a second
            print(f"# {args.runs} runs each, load {load()} at the start; the daemon idle: {idle:.0f} ms CPU a second")
            print("| what | median wall ms | median CPU ms | the daemon's CPU ms per run |\n|---|---:|---:|---:|")
            for label, argv, e in rows:
                began, daemon_from = time.monotonic(), process_cpu_ms(daemon.pid)
                wall, cpu = measure(argv, args.runs, e)
                served = process_cpu_ms(daemon.pid) - daemon_from - idle * (time.monotonic() - began)
                per = f"{served / (args.runs + 1):.1f}" if "submit" in argv else "-"
                print(f"| {label} | {wall:.1f} | {cpu:.1f} | {per} |", flush=True)
            print(f"# load {load()} at the end")
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)


if __name__ == "__main__":
    main()
