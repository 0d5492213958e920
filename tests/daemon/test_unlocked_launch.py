"""A round starts its jobs' supervisors without the daemon's lock (issue 12: the scheduling loop never holds the lock
for long), and nothing said while the lock is let go is lost: a cancel of a job being launched, of a queued job."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from corral.daemon.lockstat import Released
from corral.executor.base import Handle, LaunchSpec
from corral.executor.fake import FakeExecutor
from corral.jobs.model import JobState
from tests.daemon.test_core import daemon, spec


class WatchingExecutor(FakeExecutor):
    """A fake executor that records whether the daemon's lock was held at each launch, and runs `during` then (as
    an API call on another thread would, between the round's decisions and their records)."""

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__(cancel_ends=False)
        self.lock = lock
        self.held_at_launch: list[bool] = []
        self.during: list[str] = []  # job ids to cancel through the daemon while the first launch runs
        self.daemon_cancel: Callable[[str], object] = lambda job_id: None

    def launch(self, spec: LaunchSpec) -> Handle:
        self.held_at_launch.append(self.lock.locked())
        while self.during:
            job_id = self.during.pop()
            with self.lock:  # what the API's cancel route does
                self.daemon_cancel(job_id)
        return super().launch(spec)


def test_launches_run_without_the_lock_and_a_cancel_meanwhile_is_sent(tmp_path: Path) -> None:
    lock = threading.Lock()
    ex = WatchingExecutor(lock)
    d = daemon(tmp_path, ex=ex)
    ex.daemon_cancel = lambda job_id: d.cancel(job_id)
    first, second = d.submit(spec(gpus=1)).id, d.submit(spec(gpus=1)).id
    queued = d.submit(spec(gpus=2)).id  # cannot fit beside the two: waits, and is cancelled during the launches
    ex.during = [queued, first]  # `first` is STARTING (stored) but not yet known to the executor
    with lock:
        started = d.tick(unlocked=lambda: Released(lock))
        assert lock.locked()  # the round ends holding the lock it was given
    assert started == [first, second]
    assert ex.held_at_launch == [False, False]
    job = d.store.get(first)
    assert job is not None and job.state is JobState.RUNNING and job.reason == "cancel requested"
    assert [c for c, _ in ex.cancelled].count(first) == 2  # once at the cancel (a no-op then), once after launch
    ex.finish(first, None, signal=15, cancelled=True)
    d.tick()
    done = d.store.get(first)
    assert done is not None and done.state is JobState.CANCELLED
    gone = d.store.get(queued)
    # its waiting reason was stored before the launches, so the cancel's word stands
    assert gone is not None and gone.state is JobState.CANCELLED and gone.reason == "cancelled"


def test_without_an_unlocked_context_the_round_launches_under_the_callers_lock(tmp_path: Path) -> None:
    lock = threading.Lock()
    ex = WatchingExecutor(lock)
    d = daemon(tmp_path, ex=ex)
    d.submit(spec(gpus=1))
    with lock:
        assert d.tick() == ["1"]
    assert ex.held_at_launch == [True]
