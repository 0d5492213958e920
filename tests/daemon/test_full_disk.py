"""Exit codes are never lost to a full state disk (issue 23, item 4): jobs `sleep N; exit K` end while a small tmpfs
state directory is full (dd); their outcomes are kept (the supervisor's record, reserved when the job started, is
overwritten in place; the daemon hears the end on the supervisor's pipe and keeps what SQLite cannot store), stored
once there is room, and read back after a restart."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.daemon.core import Daemon
from corral.executor import LocalExecutor
from corral.executor.local import _lock_free, _read_record
from corral.gpu.simulated import parse_simulated_inventory
from corral.jobs.model import JobSpec, JobState
from corral.model.resources import GpuBehavior, Request
from corral.placement import PlacementConfig
from corral.store import SqliteStore, StoreError
from tests.executor.test_local import wait_until

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="mounting a tmpfs needs root")
CONFIG = PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)
CODES = (3, 4, 5, 6, 7)


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "state"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def start(folder: Path) -> Daemon:
    node = parse_simulated_inventory("1xA100-80GB")[0]
    executor = LocalExecutor(grace_s=0.2, run_dir=folder / "run")
    return Daemon(SqliteStore(folder / "jobs.db"), executor, node, CONFIG, folder)


def stop(d: Daemon) -> None:
    d.executor.close()  # type: ignore[attr-defined]
    d.store.close()


def fill(folder: Path) -> None:
    subprocess.run(["dd", "if=/dev/zero", f"of={folder}/fill", "bs=64k"], capture_output=True, check=False)
    probe = os.open(folder / "probe", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError, match="No space left"):
            os.write(probe, b"x" * 65536)
            os.fsync(probe)
    finally:
        os.close(probe)
        os.unlink(folder / "probe")


def submit_and_start(d: Daemon, folder: Path) -> list[str]:
    ids = []
    for code in CODES:
        spec = JobSpec(("sh", "-c", f"sleep 1.5; exit {code}"), Request(cpu_milli=10, memory_mib=16), "u", 0, 0)
        ids.append(d.submit(spec).id)
    assert wait_until(lambda: not d.tick() and all(d.store.get(i).state is JobState.RUNNING for i in ids), 10)  # type: ignore[union-attr]
    return ids


def ended_on_disk(folder: Path, job_ids: list[str]) -> dict[str, int | None]:
    codes = {}
    for job_id in job_ids:
        record = _read_record(folder / "run" / f"{job_id}.1") or {}
        if record.get("ended") and _lock_free(folder / "run" / f"{job_id}.1"):
            codes[job_id] = record.get("exit_code")
    return codes


def stored(d: Daemon, job_ids: list[str]) -> dict[str, tuple[JobState, int | None]]:
    return {i: (j.state, j.exit_code) for i in job_ids if (j := d.store.get(i)) is not None}


def test_exits_while_the_state_disk_is_full_are_kept_stored_later_and_after_a_restart(state: Path) -> None:
    d = start(state)
    ids = submit_and_start(d, state)
    fill(state)
    want = dict(zip(ids, CODES, strict=True))
    assert wait_until(lambda: ended_on_disk(state, ids) == want, 15), ended_on_disk(state, ids)

    failing: list[bool] = []

    def kept() -> bool:  # the daemon has every exit, stored or kept in memory until it can be
        with contextlib.suppress(StoreError):  # a round's other writes fail too; its exits are kept all the same
            d.tick()
        failing.append(d._store_failing)
        known = {i: e.exit_code for i, e in d._exits.items()}
        known |= {i: code for i, (s, code) in stored(d, ids).items() if s is JobState.FAILED}
        return known == want

    assert wait_until(kept, 10), (d._exits, stored(d, ids))
    assert any(failing), "SQLite never failed: the full disk did not reach the store"
    (state / "fill").unlink()  # room again
    assert wait_until(lambda: (d.tick() is not None) and not d._exits, 10)  # stored now
    assert stored(d, ids) == {i: (JobState.FAILED, code) for i, code in want.items()}
    stop(d)
    again = start(state)  # a restart reads the same outcomes
    try:
        again.recover()
        assert stored(again, ids) == {i: (JobState.FAILED, code) for i, code in want.items()}
        assert {again.store.get(i).reason for i in ids} == {f"exit code {c}" for c in CODES}  # type: ignore[union-attr]
    finally:
        stop(again)


def test_exits_while_the_disk_is_full_and_no_daemon_runs_are_read_after_a_restart(state: Path) -> None:
    d = start(state)
    ids = submit_and_start(d, state)
    stop(d)  # the daemon is gone; its jobs end while the disk is full
    fill(state)
    want = dict(zip(ids, CODES, strict=True))
    assert wait_until(lambda: ended_on_disk(state, ids) == want, 15), ended_on_disk(state, ids)
    (state / "fill").unlink()
    again = start(state)
    try:
        again.recover()
        assert stored(again, ids) == {i: (JobState.FAILED, code) for i, code in want.items()}
    finally:
        stop(again)


def test_a_full_disk_at_launch_fails_the_start_and_says_why(state: Path) -> None:
    d = start(state)
    try:
        d.store.get("0")  # the database exists before the disk fills
        fill(state)
        spec = JobSpec(("true",), Request(cpu_milli=10, memory_mib=16), "u", 0, 0)
        ex = d.executor
        assert isinstance(ex, LocalExecutor)
        from corral.executor.base import LaunchSpec

        launch = LaunchSpec(
            "9", spec.command, {}, "/", 0, 0, (), 1000, 0, state / "logs" / "9.log", None, cpu_milli=10, memory_mib=16
        )
        with pytest.raises(OSError, match="the state disk is full: no room to reserve the job's end record"):
            ex.launch(launch)
        assert ex.running() == set()
    finally:
        (state / "fill").unlink()
        stop(d)
