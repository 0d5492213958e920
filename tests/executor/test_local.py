"""The local executor with real processes: environment, logs, exit statuses, signals, process groups, time limits,
adoption after a restart, and running jobs as their user."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from corral.executor import Exit, LaunchSpec, LocalExecutor, job_environment, pid_start_time, read_proc_stat
from corral.executor.local import parse_proc_stat
from tests.executor.specs import PATH, make_spec

NOBODY = 65534
ROOT = os.getuid() == 0


@pytest.fixture
def ex() -> Iterator[LocalExecutor]:
    executor = LocalExecutor(grace_s=0.2)
    yield executor
    for job_id in executor.running():
        executor.cancel(job_id, grace_s=0)
    wait_until(lambda: not (executor.poll() or executor.running()))
    executor.close()


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def wait_exit(ex: LocalExecutor, job_id: str, timeout: float = 5.0) -> Exit:
    found: list[Exit] = []

    def has_ended() -> bool:
        found.extend(e for e in ex.poll() if e.job_id == job_id)
        return bool(found)

    wait_until(has_ended, timeout)
    assert found, f"job {job_id} did not end within {timeout} s (running: {ex.running()})"
    [ended] = found
    return ended


def run(ex: LocalExecutor, spec: LaunchSpec) -> tuple[Exit, str]:
    ex.launch(spec)
    ended = wait_exit(ex, spec.job_id)
    return ended, spec.log_path.read_text()


def env_of(log: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in log.splitlines() if "=" in line)


def gone(pid: int) -> bool:
    st = read_proc_stat(pid)
    return st is None or st.state in ("Z", "X")


def read_pid(path: Path) -> int:
    assert wait_until(lambda: path.exists() and path.read_text().strip() != ""), f"{path} was never written"
    return int(path.read_text())


# ------------------------------------------------------------------------------------------------ environment
def test_env_has_job_id_and_the_granted_gpu_uuids(ex: LocalExecutor, tmp_path: Path) -> None:
    spec = make_spec(
        tmp_path,
        "j1",
        "env",
        gpu_uuids=("GPU-aaaa", "GPU-bbbb"),
        env={"PATH": PATH, "FOO": "bar", "CUDA_VISIBLE_DEVICES": "7", "CORRAL_JOB_ID": "forged"},
    )
    ended, log = run(ex, spec)
    assert ended == Exit("j1", 0, None, False)
    env = env_of(log)
    assert env["CORRAL_JOB_ID"] == "j1"
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa,GPU-bbbb"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaaa,GPU-bbbb"
    assert env["FOO"] == "bar"
    assert not [k for k in env if k.startswith("CUDA_MPS_")]  # a whole GPU is not shared


def test_no_gpus_hides_all_gpus_even_if_the_caller_had_some(
    ex: LocalExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "all")
    ended, log = run(ex, make_spec(tmp_path, "j1", "env", env=dict(os.environ)))
    assert ended.succeeded
    lines = log.splitlines()
    assert "CUDA_VISIBLE_DEVICES=" in lines  # set and empty: CUDA shows no GPU (unset would show all)
    assert "NVIDIA_VISIBLE_DEVICES=" in lines


def test_a_share_under_mps_gets_the_mps_caps(ex: LocalExecutor, tmp_path: Path) -> None:
    spec = make_spec(
        tmp_path,
        "share",
        "env",
        gpu_uuids=("GPU-aaaa",),
        gpu_milli=250,
        gpu_memory_mib=10240,
        mps_pipe_dir="/run/corral/mps/GPU-aaaa",
        env={"PATH": PATH, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PIPE_DIRECTORY": "/tmp/mine"},
    )
    _, log = run(ex, spec)
    env = env_of(log)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/corral/mps/GPU-aaaa"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"


def test_job_environment_mps_rules(tmp_path: Path) -> None:
    def mps(**changes: Any) -> dict[str, str]:
        base = make_spec(tmp_path, "j", "true", gpu_uuids=("GPU-a",), mps_pipe_dir="/p")
        env = job_environment(replace(base, **changes))
        return {k: v for k, v in env.items() if k.startswith("CUDA_MPS_")}

    assert mps() == {}  # a whole GPU
    assert mps(gpu_milli=300, mps_pipe_dir=None) == {}  # a share without MPS: not enforced, nothing to set
    assert mps(gpu_milli=300, gpu_uuids=()) == {}  # no GPU at all
    assert mps(gpu_milli=1) == {"CUDA_MPS_PIPE_DIRECTORY": "/p", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "1"}
    assert mps(gpu_milli=999)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"  # rounded up, never below the grant
    assert mps(gpu_milli=0, gpu_memory_mib=512) == {
        "CUDA_MPS_PIPE_DIRECTORY": "/p",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=512M",
    }
    two = mps(gpu_uuids=("GPU-a", "GPU-b"), gpu_milli=500, gpu_memory_mib=512)
    assert two["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=512M,1=512M"


# ------------------------------------------------------------------------------------------------ logs and exits
def test_log_gets_stdout_and_stderr_appended(ex: LocalExecutor, tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "j", "sh", "-c", "echo out; echo err >&2; cat", log_path=tmp_path / "a" / "b" / "j.log")
    run(ex, spec)
    _, log = run(ex, spec)  # a retry appends to the same log; stdin is /dev/null, so `cat` ends at once
    assert log == "out\nerr\nout\nerr\n"


def test_exit_codes_and_signals_are_recorded(ex: LocalExecutor, tmp_path: Path) -> None:
    assert run(ex, make_spec(tmp_path, "ok", "true"))[0] == Exit("ok", 0, None, False)
    assert run(ex, make_spec(tmp_path, "three", "sh", "-c", "exit 3"))[0] == Exit("three", 3, None, False)
    killed = run(ex, make_spec(tmp_path, "killed", "sh", "-c", "kill -KILL $$"))[0]
    assert killed == Exit("killed", None, signal.SIGKILL, False)


def test_launch_errors_raise_and_leave_nothing_running(ex: LocalExecutor, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ex.launch(make_spec(tmp_path, "a", "no-such-command-corral"))
    with pytest.raises(FileNotFoundError):
        ex.launch(make_spec(tmp_path, "b", "true", cwd=str(tmp_path / "missing")))
    assert ex.running() == set()


# ------------------------------------------------------------------------------------------------ signals
TRAPS_TERM = 'trap "echo got TERM" TERM; echo ready; while :; do sleep 0.05; done'


def test_cancel_sends_sigterm_then_sigkill_after_the_grace(ex: LocalExecutor, tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "stubborn", "sh", "-c", TRAPS_TERM)
    ex.launch(spec)
    assert wait_until(lambda: "ready" in spec.log_path.read_text())
    ex.cancel("stubborn", grace_s=0.3)
    ended = wait_exit(ex, "stubborn")
    assert ended == Exit("stubborn", None, signal.SIGKILL, False, cancelled=True)
    assert "got TERM" in spec.log_path.read_text()  # it was asked politely first


def test_cancel_kills_the_whole_process_group(ex: LocalExecutor, tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    ex.launch(make_spec(tmp_path, "j", "sh", "-c", f"sleep 30 & echo $! > {pidfile}; wait"))
    grandchild = read_pid(pidfile)
    ex.cancel("j", grace_s=1.0)
    assert wait_exit(ex, "j").signal == signal.SIGTERM
    assert wait_until(lambda: gone(grandchild)), "the backgrounded grandchild survived the cancel"


def test_leftovers_of_a_finished_job_are_killed(ex: LocalExecutor, tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    spec = make_spec(tmp_path, "j", "sh", "-c", f"sleep 30 & echo $! > {pidfile}; exit 0")
    ended, _ = run(ex, spec)
    assert ended == Exit("j", 0, None, False)
    grandchild = read_pid(pidfile)
    assert wait_until(lambda: gone(grandchild)), "a process left behind by the job would keep its GPUs"


def test_time_limit_terminates_and_reports_timed_out(ex: LocalExecutor, tmp_path: Path) -> None:
    ended, _ = run(ex, make_spec(tmp_path, "slow", "sleep", "30", time_limit_s=0.3))
    assert ended == Exit("slow", None, signal.SIGTERM, True)
    quick, _ = run(ex, make_spec(tmp_path, "quick", "true", time_limit_s=5))
    assert quick == Exit("quick", 0, None, False)


def test_time_limit_escalates_to_sigkill(ex: LocalExecutor, tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "stubborn", "sh", "-c", TRAPS_TERM, time_limit_s=0.3)
    ended, log = run(ex, spec)
    assert ended == Exit("stubborn", None, signal.SIGKILL, True)
    assert "got TERM" in log


# ------------------------------------------------------------------------------------------------ adoption
def test_adopt_after_a_daemon_restart(tmp_path: Path) -> None:
    before = LocalExecutor(grace_s=0.2)
    handle = before.launch(make_spec(tmp_path, "j", "sleep", "30"))
    after = LocalExecutor(grace_s=0.2)  # the restarted daemon: the process is not its child
    try:
        assert not after.adopt("j", handle.pid, handle.start_time - 1)  # PID reuse protection
        assert after.adopt("j", handle.pid, handle.start_time, time_limit_s=0.2)
        assert after.running() == {"j"}
        assert wait_exit(after, "j") == Exit("j", None, None, True)  # killed at its remaining time limit
    finally:
        before.cancel("j", grace_s=0)
        wait_exit(before, "j")
        before.close()
        after.close()


def test_adopt_reports_a_process_reaped_elsewhere(ex: LocalExecutor) -> None:
    outside = subprocess.Popen(["sleep", "30"])
    start = pid_start_time(outside.pid)
    assert start is not None
    assert ex.adopt("j", outside.pid, start)
    assert ex.poll() == []
    outside.kill()
    outside.wait()  # reaped by its real parent: /proc/<pid> is gone
    assert wait_exit(ex, "j") == Exit("j", None, None, False)


def test_adopt_of_a_missing_pid_is_false(ex: LocalExecutor) -> None:
    assert not ex.adopt("j", 0, 1)
    assert not ex.adopt("j", 2**22 + 1, 1)  # above any pid_max
    assert ex.running() == set()


def test_proc_stat_parsing_survives_odd_command_names(tmp_path: Path) -> None:
    fields = ["S", "1", "4321", *["0"] * 16, "4242", *["0"] * 30]  # fields 3.., field 22 = 4242
    parsed = parse_proc_stat(f"4321 (a) b (c) {' '.join(fields)}\n")
    assert (parsed.state, parsed.pgrp, parsed.start_time) == ("S", 4321, 4242)
    with pytest.raises(ValueError, match="not a /proc"):
        parse_proc_stat("garbage")

    odd = tmp_path / "x) (y z"
    odd.write_bytes(Path("/bin/sleep").read_bytes())
    odd.chmod(0o755)
    p = subprocess.Popen([str(odd), "30"])
    try:
        own = pid_start_time(os.getpid())
        start = pid_start_time(p.pid)
        assert own is not None and start is not None and start >= own
        with open(f"/proc/{p.pid}/stat") as f:
            assert ") (y z)" in f.read()  # the name really has a space and parentheses
    finally:
        p.kill()
        p.wait()
    assert pid_start_time(p.pid) is None


# ------------------------------------------------------------------------------------------------ users
def test_a_non_root_daemon_refuses_other_users(
    ex: LocalExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    with pytest.raises(PermissionError) as info:
        ex.launch(make_spec(tmp_path, "j", "true", uid=1001))
    assert str(info.value) == (
        "job j asks to run as uid 1001, but the corral daemon runs as uid 1000, not root: it can only run jobs as "
        "itself. Submit as uid 1000, or run the daemon as root to serve several users"
    )
    assert ex.running() == set()


@pytest.mark.skipif(not ROOT, reason="switching users needs root")
def test_root_runs_the_job_as_its_user(ex: LocalExecutor, tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "j", "sh", "-c", "id -u; id -g; id -G; pwd", uid=NOBODY, gid=NOBODY, cwd="/")
    ended, log = run(ex, spec)
    assert ended.succeeded, log
    assert log.splitlines() == [str(NOBODY), str(NOBODY), str(NOBODY), "/"]  # no root group left behind
    st = spec.log_path.stat()
    assert st.st_uid == NOBODY and stat.S_IMODE(st.st_mode) == 0o600  # the user reads their own log; nobody else


@pytest.mark.skipif(not ROOT, reason="switching users needs root")
def test_the_working_directory_is_entered_as_the_user(ex: LocalExecutor, tmp_path: Path) -> None:
    private = tmp_path / "private"
    inner = private / "inner"
    inner.mkdir(parents=True)
    private.chmod(0o700)
    inner.chmod(0o777)  # reachable by path only through a directory that nobody may not traverse
    ended, log = run(ex, make_spec(tmp_path, "j", "pwd", uid=NOBODY, gid=NOBODY, cwd=str(inner)))
    assert ended == Exit("j", 126, None, False)
    assert log == f"corral: the job cannot enter its working directory {inner} as its user\n"


@pytest.mark.skipif(not ROOT, reason="switching users needs root")
def test_a_hard_linked_log_is_not_handed_to_the_user(ex: LocalExecutor, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    (tmp_path / "logs").mkdir()
    os.link(secret, tmp_path / "logs" / "j.log")
    with pytest.raises(PermissionError, match="has 2 links; refusing to hand it to uid 65534"):
        ex.launch(make_spec(tmp_path, "j", "true", uid=NOBODY, gid=NOBODY, cwd="/"))
    assert secret.stat().st_uid == 0


# ------------------------------------------------------------------------------------------------ threads
def test_concurrent_launches_and_polls_report_each_exit_once(ex: LocalExecutor, tmp_path: Path) -> None:
    exits: list[Exit] = []
    stop = threading.Event()

    def poller() -> None:
        while not stop.is_set():
            exits.extend(ex.poll())
            time.sleep(0.005)

    def launcher(i: int) -> None:
        ex.launch(make_spec(tmp_path, f"j{i}", "sh", "-c", f"exit {i}"))

    threads = [threading.Thread(target=poller), *(threading.Thread(target=launcher, args=(i,)) for i in range(8))]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join()
    assert wait_until(lambda: len(exits) >= 8)
    stop.set()
    threads[0].join()
    exits.extend(ex.poll())
    assert sorted((e.job_id, e.exit_code) for e in exits) == [(f"j{i}", i) for i in range(8)]
