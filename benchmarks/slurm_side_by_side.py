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
  fair     two users: fsalice has used all 4 GPUs for 75 s; then, while root's job holds the 4 GPUs for 20 s,
           fsalice submits 8 one-GPU jobs of 10 s, and after them fsbob 8: how many of the first 4 to start are
           fsbob's (fair share: all 4), and each side's recorded usage
  acct     100,000 ended jobs in the history: `sacct` / `corral acct` of one user's jobs of the last 2 days (as
           that user, median of 5) and of everyone's 30 days (as root, median of 3), output piped
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

    def __init__(self, queues: str | None = None, history: int = 0) -> None:
        self.queues = queues
        self.history = history

    def __enter__(self) -> Corral:
        self.tmp = Path(tempfile.mkdtemp(prefix="corral-vs-slurm-"))
        os.chmod(self.tmp, 0o755)  # the fair-share users reach the socket in it
        self.sock = self.tmp / "corral.sock"
        self.cli = self.tmp / "corral"  # the command as dev.py installs it, with this checkout first on the path
        entry = "corral.cli.fast" if (ROOT / "corral" / "cli" / "fast.py").exists() else "corral.cli.main"
        self.cli.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                            f"from {entry} import main\nsys.exit(main())\n")  # fmt: skip
        self.cli.chmod(0o755)
        argv = [sys.executable, "-m", "corral.cli.main", "serve", "--simulate-gpus", "4xH100-80GB",
                "--state-dir", str(self.tmp / "state"), "--socket", str(self.sock)]  # fmt: skip
        if self.history:
            fill = [sys.executable, "-c", CORRAL_HISTORY, str(self.tmp / "state" / "jobs.db"), str(self.history)]
            subprocess.run(fill, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        if self.queues is not None:
            (self.tmp / "queues.toml").write_text(self.queues)
            argv += ["--queues", str(self.tmp / "queues.toml")]
        self.err = (self.tmp / "serve.err").open("wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self.err, start_new_session=True,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
        wait_until("corral serve", self.answers, 300)
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
    # root holds the 4 GPUs while both users submit (alice first), so that fair share, not arrival, orders them
    if isinstance(side, Slurm):
        blocker = side.sbatch("--gres=gpu:4 --time=1 --wrap 'sleep 20'")
    else:
        blocker = side.submit("--gpus 4 --time-limit 1m -- sleep 20")
    wait_until("root's 4-GPU job", lambda: side.started(blocker) is not None, 60)
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


#: The history both sides' accounting is asked about: ended jobs over the last 30 days, fsalice's and fsbob's in
#: turn, one GPU each for a minute, one in ten failed. Slurm's are written into slurmdbd's job table; corral's into
#: its store, both before the side starts answering.
HISTORY_FIRST_ID = 10_000_000


def slurm_history(n: int) -> None:
    have = must(
        f"mariadb -N slurm_acct_db -e 'SELECT COUNT(*) FROM bench_job_table WHERE id_job >= {HISTORY_FIRST_ID}'"
    )
    if int(have.strip()) >= n:
        return
    which = "SELECT user, id_assoc FROM bench_assoc_table WHERE user IN ('fsalice', 'fsbob')"
    assoc = dict(ln.split("\t") for ln in must(f'mariadb -N slurm_acct_db -e "{which}"').splitlines())
    uid = {u: must(f"id -u {u}").strip() for u in ("fsalice", "fsbob")}
    now = int(time.time())
    sql = f"""DELETE FROM bench_job_table WHERE id_job >= {HISTORY_FIRST_ID};
INSERT INTO bench_job_table (mod_time, account, cpus_req, job_name, id_assoc, id_job, id_resv, id_wckey, id_user,
  id_group, het_job_id, het_job_offset, state_reason_prev, nodelist, nodes_alloc, node_inx, `partition`, priority,
  state, exit_code, timelimit, time_submit, time_eligible, time_start, time_end, tres_alloc, tres_req, work_dir)
SELECT {now}, 'bench', 1, CONCAT('h', seq % 10), IF(seq % 2, {assoc["fsalice"]}, {assoc["fsbob"]}),
  {HISTORY_FIRST_ID} + seq, 0, 0, IF(seq % 2, {uid["fsalice"]}, {uid["fsbob"]}), IF(seq % 2, {uid["fsalice"]},
  {uid["fsbob"]}), 0, 4294967294, 0, 'vm', 1, '0', 'main', 1, IF(seq % 10 = 0, 5, 3), IF(seq % 10 = 0, 256, 0), 2,
  {now} - 2592000 + seq * 25 - 120, {now} - 2592000 + seq * 25 - 120, {now} - 2592000 + seq * 25 - 60,
  {now} - 2592000 + seq * 25, '1=1,2=100,4=1,5=1,1001=1', '1=1,2=100,4=1,5=1,1001=1', '/tmp'
FROM seq_1_to_{n};"""
    must(f"mariadb slurm_acct_db <<'SQL'\n{sql}\nSQL")


CORRAL_HISTORY = r"""
import json, pwd, sys, time
from pathlib import Path
from corral.jobs.model import JobSpec, spec_to_json
from corral.model.resources import Request
from corral.store import SqliteStore
path, n = Path(sys.argv[1]), int(sys.argv[2])
path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
store = SqliteStore(path)
conn = store._conn
conn.execute("PRAGMA synchronous = OFF")  # filling is not what is measured; the daemon reopens with FULL
conn.execute("BEGIN")
now = time.time()
users = [pwd.getpwnam(u) for u in ("fsbob", "fsalice")]
for i in range(1, n + 1):
    u = users[i % 2]
    spec = JobSpec(("true",), Request(cpu_milli=1000, memory_mib=100, gpu_count=1, gpu_milli=1000), u.pw_name,
                   u.pw_uid, u.pw_gid, name=f"h{i % 10}")
    end = now - 2592000 + i * 25
    state, code = ("failed", 1) if i % 10 == 0 else ("succeeded", 0)
    conn.execute(
        "INSERT INTO jobs (spec, user, state, submitted_at, attempts, started_at, finished_at, exit_code, gpus,"
        " gpu_uuids, version) VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?, ?, 3)",
        (spec_to_json(spec), spec.user, state, end - 120, end - 60, end, code, json.dumps([[i % 4, 1000, 0]]),
         json.dumps([f"SIM-GPU-0-{i % 4}"])),
    )
conn.execute("COMMIT")
# accounting's records are written with each job's end: a store without them fills them from its ended jobs when
# it opens (corral.store.sqlite), as the daemon's open now does
conn.execute("DROP TABLE IF EXISTS acct_hours")
conn.execute("DROP TABLE IF EXISTS acct")
store.close()
"""


def row_acct(side: Side, args: argparse.Namespace) -> str:
    """fsalice's jobs that ended in the last 2 days, as fsalice (median of 5), and every user's as root."""
    if isinstance(side, Slurm):
        slurm_history(args.history)
        mine = "sacct -X -n -S now-2days -E now"
        everyone = "sacct -X -n -a -S now-30days -E now"
    else:
        if not side.has("acct"):
            return "not run (no `corral acct` on this checkout: branch acct)"
        mine = f"{side.cli} acct --since 2d"
        everyone = f"{side.cli} acct --since 30d"
    times = [timed(f"{mine} > /dev/null", user="fsalice") for _ in range(5)]
    rows = len(must(mine, user="fsalice").splitlines())
    all_times = [timed(f"{everyone} > /dev/null") for _ in range(3)]
    all_rows = len(must(everyone).splitlines())
    return (f"one user's last 2 days: {statistics.median(times):.2f} s ({rows:,} lines); everyone's 30 days: "
            f"{statistics.median(all_times):.2f} s ({all_rows:,} lines)")  # fmt: skip


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
def side_for(name: str, row: str, args: argparse.Namespace) -> Iterator[Side]:
    if name == "Slurm":
        with Slurm() as s:
            yield s
    else:
        with Corral(FAIR_QUEUES if row == "fair" else None, history=args.history if row == "acct" else 0) as c:
            yield c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--sides", default="Slurm,corral", help="Slurm,corral (both) or one of them")
    ap.add_argument("--per-shell", type=int, default=50)
    ap.add_argument("--pending", type=int, default=5000)
    ap.add_argument("--chain", type=int, default=100)
    ap.add_argument("--history", type=int, default=100_000, help="ended jobs for the acct row")
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
                for name in (n for n in order if n in args.sides.split(",")):
                    at = load()
                    try:
                        with side_for(name, row, args) as side:
                            got = fn(side, args)
                    except (TimeoutError, SystemExit) as exc:
                        got = f"failed: {exc}"
                    text = f"{got} (load {at})"
                    print(f"[{time.strftime('%H:%M:%S')}] {row} {name}: {text}", flush=True)
                    results.setdefault(title, {}).setdefault(name, []).append(text)
    finally:
        slurm_setup.stop()
    version = sh("sinfo -V").stdout.strip() or "Slurm"
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
