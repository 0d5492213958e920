"""The daemon releases a job's GPUs only when its cgroup is empty (issue 23, item 1): the issue's attack (4 GPUs, a
time limit, a setsid'd grandchild) and a kill -9 of the job's supervisor, over the real LocalExecutor and a simulated
inventory; the OOM reason; the "no cgroups" notice in /readyz and `corral gpus`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.cli import client as cli_client
from corral.cli.transport import Headers, Response
from corral.daemon.core import Daemon
from corral.daemon.tokens import TokenStore
from corral.executor import FakeExecutor, LocalExecutor
from corral.executor.cgroup import NoCgroups, populated
from corral.executor.local import ORPHANED, _Supervised
from corral.gpu.simulated import parse_simulated_inventory
from corral.jobs.model import JobSpec, JobState
from corral.model.resources import GpuBehavior, Request
from corral.placement import PlacementConfig
from corral.store import MemoryStore
from tests.api.test_api import ROOT, AsPeer
from tests.executor.test_containment import needs_cgroups
from tests.executor.test_local import gone, read_pid, wait_until

CONFIG = PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)
PATH = "/usr/local/bin:/usr/bin:/bin"


def job(command: str, gpus: int = 4, **kw: object) -> JobSpec:
    return JobSpec(
        ("bash", "-c", command),
        Request(cpu_milli=100, memory_mib=64, gpu_count=gpus, gpu_milli=1000 if gpus else 0),
        "alice",
        os.getuid(),
        os.getgid(),
        env={"PATH": PATH},
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon over the real LocalExecutor, 4 simulated GPUs."""
    ex = LocalExecutor(grace_s=0.3, run_dir=tmp_path / "run")
    node = parse_simulated_inventory("4xA100-80GB")[0]
    d = Daemon(MemoryStore(), ex, node, CONFIG, tmp_path)
    yield d
    for job_id in ex.running():
        ex.cancel(job_id, grace_s=0)
    wait_until(lambda: not (ex.poll() or ex.running()), 10)
    ex.close()


def leaf(d: Daemon, job_id: str) -> Path:
    tracked = d.executor._jobs[job_id]  # type: ignore[attr-defined]
    assert isinstance(tracked, _Supervised) and tracked.leaf is not None
    return tracked.leaf


def tick_until_started(d: Daemon, job_id: str, check: object, timeout: float = 20) -> None:
    """Tick until `job_id` starts; `check` runs the moment it does."""

    def started() -> bool:
        if job_id in d.tick():
            check()  # type: ignore[operator]
            return True
        return False

    assert wait_until(started, timeout), f"job {job_id} never started: {d.store.get(job_id)}"


@needs_cgroups
def test_the_issues_attack_the_next_job_gets_the_gpus_only_when_nothing_of_the_first_runs(
    machine: Daemon, tmp_path: Path
) -> None:
    d = machine
    pidfile = tmp_path / "escaped.pid"
    first = d.submit(job(f"setsid bash -c 'echo $$ > {pidfile}; exec sleep 120' & sleep 300", time_limit_s=1))
    assert d.tick() == [first.id]
    escaped = read_pid(pidfile)
    first_leaf = leaf(d, first.id)
    second = d.submit(job("sleep 30"))

    def nothing_of_the_first_runs() -> None:
        assert gone(escaped), "the escaped grandchild still runs with the GPUs handed on"
        assert not populated(str(first_leaf))

    tick_until_started(d, second.id, nothing_of_the_first_runs)
    done = d.store.get(first.id)
    assert done is not None and done.state is JobState.FAILED and done.reason == "time limit of 1 s reached"


@needs_cgroups
def test_a_killed_supervisor_keeps_the_gpus_held_and_says_why_until_the_cgroup_is_empty(
    machine: Daemon, tmp_path: Path
) -> None:
    d = machine
    pidfile = tmp_path / "escaped.pid"
    first = d.submit(job(f"setsid sleep 120 & echo $! > {pidfile}; sleep 300"))
    assert d.tick() == [first.id]
    escaped = read_pid(pidfile)
    tracked = d.executor._jobs[first.id]  # type: ignore[attr-defined]
    assert isinstance(tracked, _Supervised)
    second = d.submit(job("sleep 30"))
    os.kill(tracked.supervisor_pid, signal.SIGKILL)  # e.g. by the job's own user, where the daemon is not root
    assert wait_until(lambda: not d.executor._supervisor_alive(tracked))  # type: ignore[attr-defined]
    assert d.tick() == []  # its processes still run: the GPUs stay the first job's
    held = d.store.get(first.id)
    assert held is not None and held.state is JobState.RUNNING and held.reason == ORPHANED
    assert ORPHANED == (
        "ending: its supervisor is gone without recording the exit; its cgroup is being killed and its grant is "
        "released once the cgroup is empty"
    )
    tick_until_started(d, second.id, lambda: None)
    assert gone(escaped)
    lost = d.store.get(first.id)
    assert lost is not None and lost.state is JobState.LOST
    assert lost.reason == "lost: the job's supervisor ended without recording its exit (exit code unknown)"


def test_an_out_of_memory_kill_is_the_jobs_reason(tmp_path: Path) -> None:
    ex = FakeExecutor()
    node = parse_simulated_inventory("1xA100-80GB")[0]
    d = Daemon(MemoryStore(), ex, node, CONFIG, tmp_path)
    j = d.submit(job("python3 big.py", gpus=0))
    d.tick()
    assert ex.spec(j.id).memory_mib == 64 and ex.spec(j.id).cpu_milli == 100  # its cgroup's memory.max, cpu.max
    ex.finish(j.id, None, signal=signal.SIGKILL, oom_killed=True)
    d.tick()
    done = d.store.get(j.id)
    assert done is not None and done.state is JobState.FAILED
    assert done.reason == (
        "out of memory: the kernel killed a process of the job at its memory limit (64 MiB, the request's memory); "
        "killed by signal 9"
    )


# ------------------------------------------------------------------------------------------------ the notice
NOTICE = "no cgroups: falling back to process groups (cannot create /cg/corral-1: Permission denied)"


def test_no_cgroups_is_said_in_readyz_and_gpus(tmp_path: Path) -> None:
    ex = LocalExecutor(run_dir=tmp_path / "run", cgroups=NoCgroups("cannot create /cg/corral-1: Permission denied"))
    try:
        node = parse_simulated_inventory("1xA100-80GB")[0]
        d = Daemon(MemoryStore(), ex, node, CONFIG, tmp_path)
        d.tick()
        app = create_app(d, threading.Lock(), lambda: None, tokens=TokenStore(tmp_path / "tokens.json"))
        client = TestClient(AsPeer(app, ROOT, "unix"), raise_server_exceptions=False)
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json() == {"status": "ready", "containment": NOTICE}
        assert client.get("/v1/gpus").headers["X-Corral-Containment"] == NOTICE
    finally:
        ex.close()


def test_a_contained_daemon_adds_nothing_to_readyz_or_gpus(tmp_path: Path) -> None:
    node = parse_simulated_inventory("1xA100-80GB")[0]
    ex = FakeExecutor()
    d = Daemon(MemoryStore(), ex, node, CONFIG, tmp_path)
    d.tick()
    app = create_app(d, threading.Lock(), lambda: None, tokens=TokenStore(tmp_path / "tokens.json"))
    client = TestClient(AsPeer(app, ROOT, "unix"), raise_server_exceptions=False)
    assert client.get("/readyz").json() == {"status": "ready"}  # contained: nothing to say
    assert "X-Corral-Containment" not in client.get("/v1/gpus").headers


def test_corral_gpus_prints_the_notice(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = b'[{"index": 0, "uuid": "SIM-GPU-0-0", "model": "A100", "memory_mib": 81920, "granted_milli": 0, "held": [],'
    rows += b' "used_memory_mib": null, "utilization_pct": null, "foreign_memory_mib": null}]'

    def answer(notice: str | None) -> Response:
        return Response(200, Headers([] if notice is None else [("X-Corral-Containment", notice)]), rows)

    for notice, expected in ((NOTICE, f"note: {NOTICE}"), (None, None)):
        monkeypatch.setattr(cli_client, "call", lambda *a, _n=notice, **k: answer(_n))
        result = CliRunner().invoke(cli_client.gpus_cmd, [])
        assert result.exit_code == 0, result.output
        lines = [line.strip() for line in result.output.splitlines()]
        assert (expected in lines) if expected else not any(line.startswith("note:") for line in lines)


# ------------------------------------------------------------------------------------------------ a real daemon
NOBODY = 65534


def nobody_can_run_corral() -> bool:
    """The checkout and the venv must be readable by `nobody` (not so in a private home directory)."""
    if os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists():
        return False
    probe = subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", "import corral.executor.cgroup"],
        env={"PYTHONPATH": str(CHECKOUT), "PATH": PATH},
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


CHECKOUT = Path(__file__).resolve().parents[2]
AS_NOBODY = ["/usr/bin/setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


@pytest.mark.skipif(not nobody_can_run_corral(), reason="needs root, setpriv, and a checkout `nobody` can read")
def test_an_unprivileged_daemon_says_no_cgroups_at_start_in_readyz_and_in_corral_gpus() -> None:
    home = Path(tempfile.mkdtemp(prefix="corral-nobody-"))  # pytest's tmp_path is root's alone (0700)
    os.chown(home, NOBODY, NOBODY)
    sock = home / "s.sock"
    env = {"PYTHONPATH": str(CHECKOUT), "PATH": PATH, "HOME": str(home)}
    serve = [*AS_NOBODY, sys.executable, "-m", "corral.cli.main", "serve", "--simulate-gpus", "1xA100-80GB"]
    daemon = subprocess.Popen(
        [*serve, "--state-dir", str(home / "state"), "--socket", str(sock)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert daemon.stderr is not None
        first = daemon.stderr.readline()
        assert first.startswith("corral serve: listening on"), first
        said = first.strip().rsplit("; ", 2)[-2:]
        notice = "; ".join(said)
        assert notice.startswith("no cgroups: falling back to process groups (cannot create ")
        assert notice.endswith(": Permission denied; run the daemon as root, or under systemd with Delegate=yes)")
        transport = httpx.HTTPTransport(uds=str(sock))
        with httpx.Client(transport=transport, base_url="http://corral") as client:
            wait_until(lambda: client.get("/readyz").status_code == 200, 20)
            assert client.get("/readyz").json() == {"status": "ready", "containment": notice}
        gpus = subprocess.run(
            [*AS_NOBODY, sys.executable, "-m", "corral.cli.main", "gpus"],
            env={**env, "CORRAL_SOCKET": str(sock)},
            capture_output=True,
            text=True,
            check=True,
        )
        assert gpus.stdout.splitlines()[-1] == f"note: {notice}"
    finally:
        daemon.terminate()
        daemon.wait(timeout=15)
        shutil.rmtree(home, ignore_errors=True)
