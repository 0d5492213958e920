"""A short history of each GPU's use, for the dashboard's sparklines.

A thread samples every `every_s` seconds what /v1/gpus shows now (share granted, utilisation and memory used where
measured) and keeps the last `keep` samples per GPU in memory, so a page opened now draws the last few minutes at
once. Nothing here names a job or a user: every caller may see it, as every caller sees /v1/gpus' totals.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass

from corral.daemon.core import Daemon
from corral.jobs.model import JobState

#: Seconds between samples, and samples kept (2 s x 150 = the last 5 minutes).
EVERY_S = 2.0
KEEP = 150


@dataclass(frozen=True)
class Sample:
    at: float  # epoch seconds
    granted_milli: int  # 1000 = the whole GPU
    granted_memory_mib: int  # memory of shares' grants (whole GPUs count their whole memory)
    utilization_pct: float | None  # None where not measured (simulated GPUs)
    used_memory_mib: int | None


def granted_memory_mib(milli: int, memory_mib: int, device_mib: int) -> int:
    """The GPU memory a grant holds: a share's own grant, or a whole GPU's memory."""
    if memory_mib:
        return memory_mib
    return device_mib if milli >= 1000 else 0


class History:
    def __init__(self, daemon: Daemon, every_s: float = EVERY_S, keep: int = KEEP) -> None:
        self.daemon = daemon
        self.every_s = every_s
        self._lock = threading.Lock()
        self._samples: dict[int, deque[Sample]] = {g.index: deque(maxlen=keep) for g in daemon.node.gpus}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self, now: float | None = None) -> None:
        at = time.time() if now is None else now
        holding = self.daemon.store.list([JobState.STARTING, JobState.RUNNING])
        with self._lock:
            for dev in self.daemon.node.gpus:
                grants = [g for j in holding for g in j.gpus if g.index == dev.index]
                use = self.daemon.gpu_use.get(dev.uuid)
                self._samples[dev.index].append(
                    Sample(
                        at,
                        sum(g.milli for g in grants),
                        sum(granted_memory_mib(g.milli, g.memory_mib, dev.memory_mib) for g in grants),
                        None if use is None else use.utilization_pct,
                        None if use is None else use.used_mib,
                    )
                )

    def snapshot(self) -> dict[int, list[Sample]]:
        with self._lock:
            return {index: list(samples) for index, samples in self._samples.items()}

    def start(self) -> None:
        def run() -> None:
            while not self._stop.is_set():
                # A store that fails now is reported by the API; the history just has a gap.
                with contextlib.suppress(Exception):
                    self.sample()
                self._stop.wait(self.every_s)

        self._thread = threading.Thread(target=run, name="corral-dashboard-history", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
