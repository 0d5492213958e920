"""The daemon's lock, timed: how long each hold lasted and who held it (issue 12: one schedule held it for 55 s).

    TimedLock        a drop-in for threading.Lock (acquire/release/locked, `with`) that records, per hold, the
                     time from acquire to release and the holder: the thread and the function that took the lock
                     (`corral-tick in corral.daemon.server.serve.<locals>.loop`)
    LockStats        holds counted, total and longest time, the longest holder, a histogram in milliseconds, and
                     the longest hold per holder
    daemon_lock()    the TimedLock `corral serve` uses; at exit it writes one line to stderr,
                     `corral serve: lock stats {...json...}`, and a hold longer than WARN_S is logged as it ends

The figures are written only by the thread that holds the lock, just before it releases it, so they need no lock of
their own; the cost is two clock reads and a frame lookup per hold.
"""

from __future__ import annotations

import atexit
import bisect
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import Any, cast

log = logging.getLogger("corral.lock")

#: Upper bounds of the histogram's buckets, in milliseconds; the last bucket holds everything longer.
BUCKETS_MS = (0.1, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0)
#: A hold at least this long is logged as a warning when it ends: nothing else can schedule or answer meanwhile.
WARN_S = 0.25


@dataclass
class LockStats:
    holds: int = 0
    total_s: float = 0.0
    longest_s: float = 0.0
    longest_holder: str = ""
    histogram: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_MS) + 1))
    by_holder: dict[str, tuple[int, float]] = field(default_factory=dict)  # holder -> (holds, longest s)

    def record(self, held_s: float, holder: str) -> None:
        self.holds += 1
        self.total_s += held_s
        if held_s > self.longest_s:
            self.longest_s, self.longest_holder = held_s, holder
        self.histogram[bisect.bisect_left(BUCKETS_MS, held_s * 1000)] += 1
        count, longest = self.by_holder.get(holder, (0, 0.0))
        self.by_holder[holder] = (count + 1, max(longest, held_s))

    def to_json(self) -> dict[str, Any]:
        labels = [f"<={b:g}ms" for b in BUCKETS_MS] + [f">{BUCKETS_MS[-1]:g}ms"]
        return {
            "holds": self.holds,
            "total_ms": round(self.total_s * 1000, 3),
            "longest_ms": round(self.longest_s * 1000, 3),
            "longest_holder": self.longest_holder,
            "histogram": dict(zip(labels, self.histogram, strict=True)),
            "by_holder": {
                h: {"holds": n, "longest_ms": round(s * 1000, 3)}
                for h, (n, s) in sorted(self.by_holder.items(), key=lambda kv: -kv[1][1])
            },
        }


def _holder(frame: FrameType | None) -> str:
    thread = threading.current_thread().name
    if frame is None:
        return thread
    module = frame.f_globals.get("__name__", "?")
    return f"{thread} in {module}.{frame.f_code.co_qualname}"


class TimedLock:
    """A threading.Lock that times its holds (see the module docstring). Not re-entrant, like the lock it wraps."""

    def __init__(self, name: str = "lock", clock: Callable[[], float] = time.perf_counter) -> None:
        self.name = name
        self.stats = LockStats()
        self._lock = threading.Lock()
        self._clock = clock
        self._since = 0.0
        self._holder = ""

    def _taken(self, frame: FrameType | None) -> None:
        self._since = self._clock()
        self._holder = _holder(frame)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._taken(sys._getframe(1))
        return got

    def release(self) -> None:
        held = self._clock() - self._since
        holder = self._holder
        self.stats.record(held, holder)  # still held: only this thread writes the figures
        self._lock.release()
        if held >= WARN_S:
            log.warning("the %s was held for %.0f ms by %s", self.name, held * 1000, holder)

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        self._lock.acquire()
        self._taken(sys._getframe(1))  # the frame of the `with` statement
        return True

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def summary(self) -> dict[str, Any]:
        """The figures so far, read while holding the lock (or, if it stays held for a second, as they are)."""
        got = self._lock.acquire(timeout=1.0)
        try:
            out = self.stats.to_json()
        finally:
            if got:
                self._lock.release()
        return {"lock": self.name, **out}


def daemon_lock(report: Callable[[str], None] | None = None) -> threading.Lock:
    """The lock of `corral serve`, typed as the threading.Lock its users expect. Its figures are written to stderr
    (or given to `report`) as one line when the process exits."""
    lock = TimedLock("daemon lock")

    def write() -> None:
        line = f"corral serve: lock stats {json.dumps(lock.summary())}"
        if report is not None:
            report(line)
        else:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    atexit.register(write)
    return cast(threading.Lock, lock)


class Released:
    """A context in which `lock`, held by the caller, is let go, and taken again at the end (a round's process
    launches run so: see `Daemon.tick`)."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock

    def __enter__(self) -> None:
        self.lock.release()

    def __exit__(self, *_: object) -> None:
        self.lock.acquire()
