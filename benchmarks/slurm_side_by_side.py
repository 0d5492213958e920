"""corral and Slurm side by side on this machine (issue 26, item 8). Never part of CI; run as root.

    python -m benchmarks.slurm_side_by_side [--rows submit,array,list,cancel,chain,starve,fair,acct] [--reps 2]
                                            [--write BENCHMARKS.md]

Slurm 22.05 (Debian's slurm-wlm, slurmdbd on MariaDB; benchmarks/slurm_setup.py installs, configures, starts and
stops it): one node with 4 fake GPUs as GRES, select/cons_tres, sched/backfill, priority/multifactor with fair
share. corral: a fresh `corral serve --simulate-gpus 4xH100-80GB` (this checkout) per row, on a temporary state
folder and socket. Each row runs both sides, alternating (Slurm first in odd repetitions, corral first in even ones),
with the load average printed beside each figure; Slurm's daemons are stopped at the end (and on any failure).

Rows (what a user types on each side, as a user would: the CLI, from shells):
  submit   4 shells, each submitting --per-shell one-GPU jobs one after another (`sbatch --wrap true` /
           `corral submit -- true`) behind a 4-GPU job that holds the machine: submissions per second
  array    one array of 1,000 CPU-only `true` tasks: acknowledged in; all ended in
  list     5,000 pending jobs: `squeue` / `corral ps`, output piped, median of 5, rows shown
  cancel   the same 5,000: `scancel --state=PENDING -u root` / `corral cancel --state queued`: until none is left
  chain    100 one-GPU `true` jobs, each afterok on the one before: from the first submission to the last end
  starve   4 one-GPU jobs run (20-35 s); a 4-GPU job, then a one-GPU job every 0.5 s for 40 s: when the 4-GPU job
           started, and how many of the stream started before it
  fair     two users: fsalice has used all 4 GPUs for 75 s; then fsalice submits 8 one-GPU jobs of 10 s, and after
           them fsbob 8: how many of the first 4 to start are fsbob's (fair share: all 4), and each side's usage
  acct     100,000 ended jobs in the history: `sacct` / `corral acct` of one user's jobs of the last 2 days
corral's arrays (`--array`) and accounting (`corral acct`) come from the branches `arrays` and `acct`; where this
checkout lacks them, their corral column says "not run".
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks import slurm_setup
from benchmarks.bench_engine import cpu_name, emit, memory_gib

ROOT = Path(__file__).resolve().parent.parent
FAIR_QUEUES = 'half_life = "7d"\ndefault_queue = "default"\n[queues.default]\n'
MEM = "--mem=100M"


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def sh(command: str, *, user: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = ["bash", "-c", command]
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    return subprocess.run(argv, text=True, capture_output=True, env={**os.environ, **(env or {})})


def must(command: str, **kw: Any) -> str:
    out = sh(command, **kw)
    if out.returncode != 0:
        raise SystemExit(f"{command}: exit {out.returncode}: {out.stderr.strip()[-2000:]}")
    return out.stdout


def timed(command: str, **kw: Any) -> float:
    began = time.perf_counter()
    must(command, **kw)
    return time.perf_counter() - began


def wait_until(what: str, check: Callable[[], bool], timeout: float, every: float = 0.2) -> float:
    began = time.perf_counter()
    while time.perf_counter() - began < timeout:
        if check():
            return time.perf_counter() - began
        time.sleep(every)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def shells(n: int, command: str, per: int) -> float:
    """`n` shells at once, each running `command` `per` times one after another; the wall time of all."""
    loop = f"for i in $(seq {per}); do {command} > /dev/null || exit 1; done"
    began = time.perf_counter()
    procs = [subprocess.Popen(["bash", "-c", loop], stderr=subprocess.PIPE, text=True) for _ in range(n)]
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"{command}: {err.strip()[-2000:]}")
    return time.perf_counter() - began


# ------------------------------------------------------------------------------------------------ Slurm
class Slurm:
    name = "Slurm"

    def __enter__(self) -> Slurm:
        slurm_setup.start()
        self.clear()
        return self

    def __exit__(self, *exc: object) -> None:
        self.clear()

    def clear(self) -> None:
        sh("scancel -u root; scancel -u fsalice; scancel -u fsbob")
        wait_until("Slurm's queue empty", lambda: not must("squeue -h -o %i").strip(), 120)

    def sbatch(self, args: str, user: str | None = None) -> str:
        return (
            must(f"sbatch --parsable -o /dev/null {MEM} {args}", user=user, env={"PWD": "/tmp"}).strip().split(";")[0]
        )

    def started(self, job: str) -> float | None:
        """When a job started (epoch s), None while it has not."""
        out = must(f"scontrol show job {job} -o")
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        if fields.get("JobState") in ("PENDING", None):
            return None
        return datetime.datetime.fromisoformat(fields["StartTime"]).timestamp()

    def hold_machine(self) -> str:
        job = self.sbatch("--gres=gpu:4 --time=30 --wrap 'sleep 1800'")
        wait_until("the 4-GPU job running", lambda: self.started(job) is not None, 60)
        return job

    def pending(self) -> int:
        return len(must("squeue -h -t PENDING -o %i").split())

    def fill(self, n: int) -> None:
        per = n // 4
        shells(4, f"sbatch -Q -o /dev/null {MEM} --gres=gpu:1 --time=1 --wrap true", per)


# ------------------------------------------------------------------------------------------------ corral
class Corral:
    name = "corral"

    def __init__(self, queues: str | None = None) -> None:
        self.queues = queues

    def __enter__(self) -> Corral:
        self.tmp = Path(tempfile.mkdtemp(prefix="corral-vs-slurm-"))
        os.chmod(self.tmp, 0o755)  # the fair-share users reach the socket in it
        self.sock = self.tmp / "corral.sock"
        self.cli = self.tmp / "corral"  # what a console script does, with this checkout first on the path
        self.cli.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                            "from corral.cli.main import main\nmain()\n")  # fmt: skip
        self.cli.chmod(0o755)
        argv = [sys.executable, "-m", "corral.cli.main", "serve", "--simulate-gpus", "4xH100-80GB",
                "--state-dir", str(self.tmp / "state"), "--socket", str(self.sock)]  # fmt: skip
        if self.queues is not None:
            (self.tmp / "queues.toml").write_text(self.queues)
            argv += ["--queues", str(self.tmp / "queues.toml")]
        self.err = (self.tmp / "serve.err").open("wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self.err, start_new_session=True,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
        wait_until("corral serve", self.answers, 60)
        os.environ["CORRAL_SOCKET"] = str(self.sock)
        return self

    def answers(self) -> bool:
        try:
            return self.http().get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def http(self) -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.sock)), base_url="http://corral", timeout=60)

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            must(f"{self.cli} cancel --all --state queued --state running --state starting")
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.err.close()
        os.environ.pop("CORRAL_SOCKET", None)
        subprocess.run(["rm", "-rf", str(self.tmp)])

    def submit(self, args: str, user: str | None = None) -> str:
        return must(f"{self.cli} submit {args}", user=user, env={"CORRAL_SOCKET": str(self.sock)}).strip()

    def job(self, job: str) -> dict[str, Any]:
        with self.http() as c:
            got: dict[str, Any] = c.get(f"/v1/jobs/{job}").json()
            return got

    def started(self, job: str) -> float | None:
        value = self.job(job).get("started_at")
        return None if value is None else float(value)

    def hold_machine(self) -> str:
        job = self.submit("--gpus 4 --time-limit 30m -- sleep 1800")
        wait_until("the 4-GPU job running", lambda: self.started(job) is not None, 60)
        return job

    def pending(self) -> int:
        with self.http() as c:
            return len(c.get("/v1/jobs", params={"state": "queued", "limit": 10000, "fields": "id"}).json())

    def fill(self, n: int) -> None:
        """`n` pending jobs through the API (4 threads): filling is not what is measured."""
        errors: list[str] = []

        def post(k: int) -> None:
            with self.http() as c:
                for _ in range(k):
                    r = c.post("/v1/jobs", json={"command": ["true"], "gpus": 1, "time_limit": "1m"})
                    if r.status_code != 201:
                        errors.append(r.text)

        threads = [threading.Thread(target=post, args=(n // 4,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise SystemExit(f"corral refused a submission: {errors[0]}")

    def has(self, command: str, option: str = "") -> bool:
        out = sh(f"{self.cli} {command} --help")
        return out.returncode == 0 and option in out.stdout


Side = Slurm | Corral


# ------------------------------------------------------------------------------------------------ rows
def row_submit(side: Side, args: argparse.Namespace) -> str:
    side.hold_machine()
    n = args.per_shell
    if isinstance(side, Slurm):
        command = f"sbatch -Q -o /dev/null {MEM} --gres=gpu:1 --time=1 --wrap true"
    else:
        command = f"{side.cli} submit --gpus 1 --time-limit 1m -- true"
    cpu0 = os.times()
    took = shells(4, command, n)
    cpu1 = os.times()
    cpu = (cpu1.children_user + cpu1.children_system - cpu0.children_user - cpu0.children_system) / (4 * n)
    return f"{4 * n / took:.0f}/s ({took / n:.2f} s each, {cpu * 1000:.0f} ms CPU)"


def row_array(side: Side, args: argparse.Namespace) -> str:
    if isinstance(side, Slurm):
        began = time.perf_counter()
        job = side.sbatch("--array=0-999 -c 1 --time=1 --wrap true")
        acked = time.perf_counter() - began
        done = wait_until("the array", lambda: not must(f"squeue -h -j {job} -o %i").strip(), 900, every=0.5)
    else:
        if not side.has("submit", "--array"):
            return "not run (no --array on this checkout: branch arrays)"
        began = time.perf_counter()
        job = side.submit("--array 0-999 --cpus 1 --time-limit 1m -- true")
        acked = time.perf_counter() - began

        def ended() -> bool:
            with side.http() as c:
                return not c.get("/v1/jobs", params={"state": ["queued", "starting", "running"], "limit": 1}).json()

        done = wait_until("the array", ended, 900, every=0.5)
    return f"acknowledged in {acked:.2f} s, all 1,000 ended after {acked + done:.0f} s"


def row_list(side: Side, args: argparse.Namespace) -> str:
    side.hold_machine()
    side.fill(args.pending)
    wait_until("all pending", lambda: side.pending() >= args.pending, 300)
    command = "squeue" if isinstance(side, Slurm) else f"{side.cli} ps"
    times = [timed(f"{command} > /dev/null") for _ in range(5)]
    rows = len(must(command).splitlines()) - 1
    spread = f"{min(times):.2f}-{max(times):.2f}"
    return f"`{command.split('/')[-1]}` {statistics.median(times):.2f} s ({spread}), {rows:,} rows"


def row_cancel(side: Side, args: argparse.Namespace) -> str:
    side.hold_machine()
    side.fill(args.pending)
    wait_until("all pending", lambda: side.pending() >= args.pending, 300)
    if isinstance(side, Slurm):
        command = "scancel --state=PENDING -u root"
    else:
        command = f"{side.cli} cancel --state queued > /dev/null"
    began = time.perf_counter()
    must(command)
    returned = time.perf_counter() - began
    gone = returned + wait_until("none pending", lambda: side.pending() == 0, 300, every=0.05)
    return f"{gone:.2f} s ({args.pending:,} jobs; the command returned after {returned:.2f} s)"


def row_chain(side: Side, args: argparse.Namespace) -> str:
    began = time.perf_counter()
    prev = ""
    for _ in range(args.chain):
        dep = f"--dependency=afterok:{prev}" if prev else ""
        if isinstance(side, Slurm):
            prev = side.sbatch(f"--gres=gpu:1 --time=1 {dep} --wrap true")
        else:
            prev = side.submit(f"--gpus 1 --time-limit 1m {dep.replace('=', ' ')} -- true")
    submitted = time.perf_counter() - began
    last = prev

    def ended() -> bool:
        if isinstance(side, Slurm):
            return "COMPLETED" in must(f"sacct -n -X -j {last} -o State").split()
        return bool(side.job(last).get("state") == "succeeded")

    done = wait_until("the chain's last job", ended, 900, every=0.25)
    return f"{submitted + done:.1f} s ({args.chain} jobs; submitting them took {submitted:.1f} s)"


def row_starve(side: Side, args: argparse.Namespace) -> str:
    def submit(gpus: int, seconds: float) -> str:
        if isinstance(side, Slurm):
            return side.sbatch(f"--gres=gpu:{gpus} --time=1 --wrap 'sleep {seconds}'")
        return side.submit(f"--gpus {gpus} --time-limit 1m -- sleep {seconds}")

    first = [submit(1, s) for s in (20, 25, 30, 35)]
    wait_until("the first 4 running", lambda: all(side.started(j) is not None for j in first), 60)
    t0 = time.time()
    big = submit(4, 1)
    stream: list[tuple[str, float]] = []
    while time.time() - t0 < 40:
        stream.append((submit(1, 5), time.time()))
        time.sleep(0.5)
    big_at = side.started(big)
    if big_at is None:
        big_at_s = wait_until("the 4-GPU job", lambda: side.started(big) is not None, 120) + time.time() - t0
        big_at = t0 + big_at_s
    jumped = sum(1 for job, _ in stream if (s := side.started(job)) is not None and s < big_at)
    return f"started at t={big_at - t0:.1f} s; {jumped} of {len(stream)} later one-GPU jobs started before it"


def row_fair(side: Side, args: argparse.Namespace) -> str:
    def submit(user: str, seconds: float) -> str:
        if isinstance(side, Slurm):
            return side.sbatch(f"--gres=gpu:1 --time=2 --wrap 'sleep {seconds}'", user=user)
        return side.submit(f"--gpus 1 --time-limit 2m -- sleep {seconds}", user=user)

    head = [submit("fsalice", 75) for _ in range(4)]
    wait_until("fsalice's head start", lambda: all(side.started(j) is not None for j in head), 60)
    for job in head:
        wait_until("fsalice's head start to end", functools.partial(ended, side, job), 180, every=1)
    usage = ""
    if isinstance(side, Slurm):
        # slurmctld adds usage every PriorityCalcPeriod (1 min here): wait until fsalice's shows
        def charged() -> bool:
            line = must("sshare -n -P -u fsalice -o User,RawUsage").splitlines()
            return any(ln.startswith("fsalice|") and float(ln.split("|")[1] or 0) > 0 for ln in line)

        wait_until("fsalice's usage in sshare", charged, 150, every=2)
    alice = [submit("fsalice", 10) for _ in range(8)]
    bob = [submit("fsbob", 10) for _ in range(8)]
    wait_until("the first 4", lambda: sum(side.started(j) is not None for j in alice + bob) >= 4, 120)
    starts = sorted((s, j) for j in alice + bob if (s := side.started(j)) is not None)[:4]
    bobs = sum(1 for _, j in starts if j in bob)
    if isinstance(side, Slurm):
        raw = {ln.split("|")[0]: ln.split("|")[1:] for ln in
               must("sshare -n -P -a -o User,RawUsage,FairShare").splitlines() if ln.split("|")[0]}  # fmt: skip
        a_usage, b_usage = ("/".join(raw.get(u, ["?"])) for u in ("fsalice", "fsbob"))
        usage = f"; sshare RawUsage/FairShare fsalice {a_usage}, fsbob {b_usage}"
    else:
        with side.http() as c:
            accounts = c.get("/v1/shares").json().get("accounts", [])
        gpuh = {a["user"]: a["usage"]["gpu_milli"] / 1000 / 3600 for a in accounts if a.get("user")}
        usage = "; usage (GPU-h, decayed) " + ", ".join(f"{u} {h:.3f}" for u, h in sorted(gpuh.items()))
    return f"{bobs} of the first 4 starts were fsbob's{usage}"


def ended(side: Side, job: str) -> bool:
    if isinstance(side, Slurm):
        return must(f"sacct -n -X -j {job} -o State").split()[:1] in (["COMPLETED"], ["FAILED"], ["CANCELLED"])
    return side.job(job).get("state") in ("succeeded", "failed", "cancelled")


def row_acct(side: Side, args: argparse.Namespace) -> str:
    if isinstance(side, Corral) and not side.has("acct"):
        return "not run (no `corral acct` on this checkout: branch acct)"
    return "not run (history fill not written yet)"


ROWS: dict[str, tuple[str, Callable[[Side, argparse.Namespace], str]]] = {
    "submit": ("CLI submits/s, 4 shells", row_submit),
    "array": ("an array of 1,000 (CPU-only `true` tasks)", row_array),
    "list": ("list 5,000 pending", row_list),
    "cancel": ("cancel 5,000 pending", row_cancel),
    "chain": ("100-job afterok chain, run to completion", row_chain),
    "starve": ("4-GPU job in a stream of 1-GPU jobs", row_starve),
    "fair": ("two users' fair share", row_fair),
    "acct": ("`sacct` / `corral acct` over 100,000 records", row_acct),
}


@contextlib.contextmanager
def side_for(name: str, row: str) -> Iterator[Side]:
    if name == "Slurm":
        with Slurm() as s:
            yield s
    else:
        with Corral(FAIR_QUEUES if row == "fair" else None) as c:
            yield c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--per-shell", type=int, default=50)
    ap.add_argument("--pending", type=int, default=5000)
    ap.add_argument("--chain", type=int, default=100)
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (Slurm's daemons, the fair-share users)")
    slurm_setup.install()
    results: dict[str, dict[str, list[str]]] = {}
    try:
        for row in args.rows.split(","):
            title, fn = ROWS[row]
            for rep in range(args.reps):
                order = ("Slurm", "corral") if rep % 2 == 0 else ("corral", "Slurm")
                for name in order:
                    at = load()
                    try:
                        with side_for(name, row) as side:
                            got = fn(side, args)
                    except (TimeoutError, SystemExit) as exc:
                        got = f"failed: {exc}"
                    text = f"{got} (load {at})"
                    print(f"[{time.strftime('%H:%M:%S')}] {row} {name}: {text}", flush=True)
                    results.setdefault(title, {}).setdefault(name, []).append(text)
    finally:
        slurm_setup.stop()
    version = must("sinfo -V").strip()
    text = (
        f"## corral and Slurm side by side (issue 26, item 8; {datetime.date.today()})\n\n"
        f"- machine: {cpu_name()}, {os.cpu_count()} logical CPUs, {memory_gib()}; Python {platform.python_version()};"
        f" {version} with slurmdbd (MariaDB), cons_tres, backfill, multifactor; one node, 4 fake GPUs as GRES\n"
        f"- command: `python -m benchmarks.slurm_side_by_side --rows {args.rows} --reps {args.reps}`; corral: "
        "`corral serve --simulate-gpus 4xH100-80GB`, the CLI as a console script; each cell: one run, its load "
        "average (1, 5, 15 min) at its start; runs alternate between the sides\n\n"
        "| scenario | Slurm | corral |\n|---|---|---|\n"
    )
    for title, by_side in results.items():
        text += f"| {title} | {'<br>'.join(by_side.get('Slurm', []))} | {'<br>'.join(by_side.get('corral', []))} |\n"
    emit(text, args.write)


if __name__ == "__main__":
    main()
