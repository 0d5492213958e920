"""Slurm on this machine, as issue 26's side-by-side benchmark needs it (never part of CI; run as root).

    python -m benchmarks.slurm_setup install     # apt: slurm-wlm, munge, slurmdbd, mariadb-server (no services started)
    python -m benchmarks.slurm_setup start       # configure (every time) and start munged, mariadbd, slurmdbd,
                                                  # slurmctld, slurmd; accounts and users made with sacctmgr
    python -m benchmarks.slurm_setup stop        # stop them all (they cost other work CPU while idle)

One node (this machine's name) with 4 fake GPUs as GRES (`gres.conf` naming /dev/fakegpu0-3, stand-ins made with
mknod), 32 CPUs and 20 GB declared (`SlurmdParameters=config_overrides`: the node is taken as configured, not as
probed), one partition;
`select/cons_tres`, `sched/backfill` with Slurm's default parameters, `priority/multifactor` with fair share
weighted over age, and accounting through slurmdbd on MariaDB.

Why fair share did not take effect in an earlier run (usage stayed 0): every one of these is needed, and each alone
leaves RawUsage at 0 or the factor at 1.0 for everyone:
- a user's jobs get usage only through an association: the cluster, an account and the user must exist in slurmdbd
  (`sacctmgr add cluster/account/user`), and `AccountingStorageEnforce=associations` makes slurmctld refuse jobs
  without one rather than run them unaccounted;
- slurmctld adds the running jobs' usage to their associations every `PriorityCalcPeriod` (default 5 minutes):
  a benchmark of a few minutes never sees it; here 1 minute (the smallest), and the benchmark waits for it;
- usage is counted in billing TRES: with CPUs only counted, 1-CPU GPU jobs make little; `TRESBillingWeights` on the
  partition counts a GPU as 1, so GPU time is what fair share weighs, as corral's does;
- `PriorityDecayHalfLife` must be non-zero for decay (7 days, corral's example's half-life), and
  `PriorityUsageResetPeriod` NONE;
- `PriorityWeightFairshare` must dominate the other factors, or the age factor orders the queue.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ("slurm-wlm", "slurmdbd", "munge", "mariadb-server", "mariadb-client")
ETC = Path("/etc/slurm")
SPOOL = Path("/var/spool/slurm-bench")
LOGS = Path("/var/log/slurm-bench")
RUN = Path("/run/slurm-bench")
CLUSTER = "bench"
ACCOUNT = "bench"
#: Users of the fair-share scenario (real Unix users, made if missing), beside root.
FAIR_USERS = ("fsalice", "fsbob")
DB_PASSWORD = "bench-only"
MYSQL_SOCKET = Path("/run/mysqld/mysqld.sock")
#: Where each daemon writes its pid (`stop` signals those pids, and no other process).
PIDS = {
    "slurmd": RUN / "slurmd.pid",
    "slurmctld": RUN / "slurmctld.pid",
    "slurmdbd": RUN / "slurmdbd.pid",
    "mariadbd": Path("/run/mysqld/bench.pid"),
    "munged": Path("/run/munge/munged.pid"),
}


#: The node as declared (SlurmdParameters=config_overrides keeps it so, whatever the machine has).
NODE = "CPUs=32 Boards=1 SocketsPerBoard=1 CoresPerSocket=32 ThreadsPerCore=1 RealMemory=20000 Gres=gpu:4 State=UNKNOWN"


def node_name() -> str:
    return socket.gethostname().split(".")[0]


def slurm_conf() -> str:
    node = node_name()
    return f"""# written by benchmarks/slurm_setup.py (issue 26's side-by-side benchmark)
ClusterName={CLUSTER}
SlurmctldHost={node}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={SPOOL}/ctld
SlurmdSpoolDir={SPOOL}/d
SlurmctldPidFile={RUN}/slurmctld.pid
SlurmdPidFile={RUN}/slurmd.pid
SlurmctldLogFile={LOGS}/slurmctld.log
SlurmdLogFile={LOGS}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
PriorityType=priority/multifactor
PriorityDecayHalfLife=7-0
PriorityCalcPeriod=1
PriorityUsageResetPeriod=NONE
PriorityWeightFairshare=100000
PriorityWeightAge=100
PriorityWeightJobSize=0
PriorityWeightPartition=0
PriorityWeightQOS=0
PriorityMaxAge=7-0
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageEnforce=associations
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none
MaxJobCount=200000
DefMemPerCPU=100
MaxArraySize=100001
KillWait=5
MinJobAge=30
SlurmdParameters=config_overrides
NodeName={node} {NODE}
PartitionName=main Nodes={node} Default=YES MaxTime=INFINITE State=UP TRESBillingWeights="CPU=0.0,GRES/gpu=1.0"
"""


def slurmdbd_conf() -> str:
    return f"""# written by benchmarks/slurm_setup.py
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StoragePort=3306
StorageUser=slurm
StoragePass={DB_PASSWORD}
StorageLoc=slurm_acct_db
LogFile={LOGS}/slurmdbd.log
PidFile={RUN}/slurmdbd.pid
"""


def run(*argv: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, text=True, capture_output=True)
    if check and out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {out.returncode}: {out.stderr.strip() or out.stdout.strip()}")
    if not quiet and out.stdout.strip():
        print(out.stdout.strip())
    return out


def install() -> None:
    missing = [p for p in PACKAGES if run("dpkg-query", "-W", "-f=${Status}", p, check=False, quiet=True).stdout
               != "install ok installed"]  # fmt: skip
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # No service is started by the install (policy-rc.d): `start` starts what the benchmark needs, when it needs it.
    policy = Path("/usr/sbin/policy-rc.d")
    made = not policy.exists()
    if made:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        subprocess.run(["apt-get", "update"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *missing], check=True, env=env)
    finally:
        if made:
            policy.unlink()


def configure() -> None:
    for d in (SPOOL / "ctld", SPOOL / "d", LOGS, RUN, MYSQL_SOCKET.parent):
        d.mkdir(parents=True, exist_ok=True)
    shutil.chown(MYSQL_SOCKET.parent, "mysql", "mysql")
    ETC.mkdir(exist_ok=True)
    (ETC / "slurm.conf").write_text(slurm_conf())
    # Slurm 22.05 counts a node's GPUs by their device files: four stand-ins for /dev/nvidia0-3 (each a copy of
    # /dev/null's device numbers; nothing opens them, task/none confines nothing).
    for i in range(4):
        fake = Path(f"/dev/fakegpu{i}")
        if not fake.exists():
            os.mknod(fake, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    (ETC / "gres.conf").write_text(f"NodeName={node_name()} Name=gpu File=/dev/fakegpu[0-3]\n")
    (ETC / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=yes\n")
    dbd = ETC / "slurmdbd.conf"
    dbd.write_text(slurmdbd_conf())
    dbd.chmod(0o600)
    for user in FAIR_USERS:
        if run("id", user, check=False, quiet=True).returncode != 0:
            run("useradd", "--create-home", "--shell", "/bin/sh", user)


def wait_for(what: str, check: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise SystemExit(f"{what} did not come up in {timeout:.0f} s (logs: {LOGS})")


def up(argv: list[str]) -> bool:
    return subprocess.run(argv, capture_output=True).returncode == 0


def start() -> None:
    configure()
    if not up(["pgrep", "-x", "munged"]):
        Path("/run/munge").mkdir(mode=0o755, exist_ok=True)
        for d in ("/run/munge", "/var/log/munge", "/var/lib/munge", "/etc/munge"):
            for path in (Path(d), *Path(d).iterdir()):
                shutil.chown(path, "munge", "munge")
        run("runuser", "-u", "munge", "--", "/usr/sbin/munged")
    if not up(["pgrep", "-x", "mariadbd"]):
        subprocess.Popen(
            ["/usr/sbin/mariadbd", "--user=mysql", f"--socket={MYSQL_SOCKET}", f"--pid-file={PIDS['mariadbd']}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    wait_for("mariadbd", lambda: up(["mariadb", "-e", "SELECT 1"]))
    run("mariadb", "-e", f"CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '{DB_PASSWORD}'; "
        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;")  # fmt: skip
    if not up(["pgrep", "-x", "slurmdbd"]):
        run("/usr/sbin/slurmdbd")
    wait_for("slurmdbd", lambda: up(["sacctmgr", "-n", "list", "cluster"]))
    if CLUSTER not in run("sacctmgr", "-n", "-P", "list", "cluster", "format=cluster", quiet=True).stdout.split():
        run("sacctmgr", "-i", "add", "cluster", CLUSTER)
    if not up(["pgrep", "-x", "slurmctld"]):
        run("/usr/sbin/slurmctld")
    wait_for("slurmctld", lambda: up(["scontrol", "ping"]) and "UP" in run("scontrol", "ping", quiet=True).stdout)
    if ACCOUNT not in run("sacctmgr", "-n", "-P", "list", "account", "format=account", quiet=True).stdout.split():
        run("sacctmgr", "-i", "add", "account", ACCOUNT, f"cluster={CLUSTER}", "fairshare=1")
    users = run("sacctmgr", "-n", "-P", "list", "user", "format=user", quiet=True).stdout.split()
    for user in ("root", *FAIR_USERS):
        if user not in users:
            run("sacctmgr", "-i", "add", "user", user, f"account={ACCOUNT}", "fairshare=1")
    if not up(["pgrep", "-x", "slurmd"]):
        run("/usr/sbin/slurmd")
    node = node_name()

    def idle() -> bool:
        state = run("sinfo", "-h", "-n", node, "-o", "%T", check=False, quiet=True).stdout.strip()
        if state.startswith(("down", "drain")):
            run("scontrol", "update", f"nodename={node}", "state=resume", check=False, quiet=True)
        return state in ("idle", "mixed", "allocated")

    wait_for("the node", idle)


def stop() -> None:
    """SIGTERM to each daemon `start` started, by the pid in its pid file; waits until they are gone."""
    pids = []
    for path in PIDS.values():
        try:
            pid = int(path.read_text().split()[0])
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
        except (OSError, ValueError, IndexError):
            continue
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
        time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["install", "start", "stop"])
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: it installs packages and starts Slurm's daemons")
    {"install": install, "start": start, "stop": stop}[args.action]()


if __name__ == "__main__":
    main()
