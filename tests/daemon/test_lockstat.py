"""The daemon's timed lock: a drop-in threading.Lock that records each hold's length and holder."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable

import pytest

from corral.daemon.lockstat import BUCKETS_MS, TimedLock, daemon_lock


class Ticks:
    """A clock that moves only when told (the tests never read the wall clock)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def hold_for(lock: TimedLock, clock: Ticks, seconds: float) -> None:
    with lock:
        clock.t += seconds


def test_holds_are_recorded_with_their_holder() -> None:
    clock = Ticks()
    lock = TimedLock("daemon lock", clock=clock)
    hold_for(lock, clock, 0.002)
    hold_for(lock, clock, 0.120)
    assert lock.acquire()
    clock.t += 0.0004
    lock.release()
    stats = lock.summary()
    holder = f"{threading.current_thread().name} in {__name__}.hold_for"
    assert stats["lock"] == "daemon lock" and stats["holds"] == 3
    assert stats["longest_ms"] == 120.0 and stats["longest_holder"] == holder
    assert stats["total_ms"] == 122.4
    assert stats["histogram"]["<=1ms"] == 1 and stats["histogram"]["<=5ms"] == 1 and stats["histogram"]["<=250ms"] == 1
    assert sum(stats["histogram"].values()) == 3 and len(stats["histogram"]) == len(BUCKETS_MS) + 1
    direct = f"{threading.current_thread().name} in {__name__}.{test_holds_are_recorded_with_their_holder.__name__}"
    assert stats["by_holder"] == {holder: {"holds": 2, "longest_ms": 120.0}, direct: {"holds": 1, "longest_ms": 0.4}}


def test_it_behaves_as_a_lock_between_threads() -> None:
    lock = TimedLock()
    assert lock.acquire() and lock.locked()
    assert not lock.acquire(blocking=False) and not lock.acquire(timeout=0.01)
    seen: list[bool] = []
    other = threading.Thread(target=lambda: seen.append(lock.acquire(timeout=5)), name="other")
    other.start()
    lock.release()
    other.join()
    assert seen == [True] and lock.locked()
    lock.release()
    assert not lock.locked()
    assert lock.summary()["longest_holder"].startswith(("other in", "MainThread in"))
    assert lock.summary()["holds"] == 2


def test_the_daemon_lock_reports_its_figures_at_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[Callable[[], None]] = []
    lines: list[str] = []
    monkeypatch.setattr(atexit, "register", registered.append)
    lock = daemon_lock(report=lines.append)
    with lock:
        pass
    assert len(registered) == 1
    registered[0]()
    assert len(lines) == 1 and lines[0].startswith('corral serve: lock stats {"lock": "daemon lock", "holds": 1,')
