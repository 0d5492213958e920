"""How long `corral serve` keeps jobs that ended: `--acct-retention` (default 90 days), then they are deleted, the
job and its accounting record together (docs/acct.md).

    every PRUNE_EVERY_S (and once soon after the start):
        prune(store, keep_s, now): store.prune_ended(now - keep_s, PRUNE_BATCH) again and again, a pause between
                                   batches, until a batch comes back short

Each batch is one short write (500 jobs: a few milliseconds), and the pause lets the daemon's own writes (a job's
start, its end, a submission) in between, so a backlog of a million old jobs never holds the store for long.
Jobs that have not ended are never pruned, however old.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from corral.model.errors import InvalidRequest
from corral.store.base import Store, StoreError

DEFAULT_RETENTION_S = 90 * 86400.0
#: Jobs deleted per write: small enough that the store's lock is held a few milliseconds at a time.
PRUNE_BATCH = 500
#: Between two batches of a backlog (the daemon's writes go first).
PRUNE_PAUSE_S = 0.02
PRUNE_EVERY_S = 3600.0
#: The first pruning after the start: not in the start itself (a restart must answer within a second).
FIRST_PRUNE_S = 60.0
FOREVER = ("0", "never", "forever", "infinite", "unlimited")
log = logging.getLogger("corral.store")


def parse_retention(text: str, flag: str = "--acct-retention") -> float | None:
    """Seconds to keep ended jobs; None to keep them for ever ("0", "never", "forever", "unlimited")."""
    from corral.model.units import parse_duration_seconds

    if text.strip().lower() in FOREVER:
        return None
    try:
        seconds = parse_duration_seconds(text, flag)
    except InvalidRequest as exc:
        raise InvalidRequest(flag, f"{exc.message}; or never, to keep every job") from None
    if seconds < 3600:
        raise InvalidRequest(flag, f"must be at least an hour (or never), got {text!r}")
    return seconds


def prune(
    store: Store,
    keep_s: float,
    now: float,
    *,
    batch: int = PRUNE_BATCH,
    pause: Callable[[], bool] = lambda: False,
) -> int:
    """Delete the jobs that ended more than `keep_s` before `now`, `batch` at a time; returns how many. `pause` runs
    between batches; it returns True to stop early (the daemon is stopping)."""
    total = 0
    while True:
        done = store.prune_ended(now - keep_s, batch)
        total += done
        if done < batch or pause():
            return total


class Pruner:
    """The daemon's thread that applies the retention: `start()`, then `stop()` at shutdown."""

    def __init__(self, store: Store, keep_s: float, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.keep_s = keep_s
        self.clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="corral-retention", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        wait = FIRST_PRUNE_S
        while not self._stop.wait(wait):
            wait = PRUNE_EVERY_S
            try:
                done = prune(self.store, self.keep_s, self.clock(), pause=lambda: self._stop.wait(PRUNE_PAUSE_S))
            except StoreError as exc:  # tried again at the next hour
                log.warning("could not delete jobs past their retention: %s", exc)
                continue
            if done:
                log.info(
                    "deleted %d jobs that ended more than %.0f days ago (--acct-retention)", done, self.keep_s / 86400
                )
