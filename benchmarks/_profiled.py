"""Run `corral ...` (argv) under cProfile, every thread included and timed by its own CPU time (time.thread_time: wall
time would charge each thread for the others holding the GIL), and write the profile to $CORRAL_PROFILE when the
process ends (SIGTERM included): the k8s side-by-side benchmark profiles its extender with it."""

from __future__ import annotations

import contextlib
import cProfile
import os
import pstats
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

from corral.cli.main import app

profiles: list[cProfile.Profile] = []
_lock = threading.Lock()


def _start(frame: FrameType, event: str, arg: Any) -> None:
    """Installed by threading.setprofile in every new thread: hands the thread to a profiler of its own."""
    profile = cProfile.Profile(time.thread_time)
    with _lock:
        profiles.append(profile)
    profile.enable()


def _dump(*_: object) -> None:
    with _lock:
        for p in profiles:
            p.disable()
        stats = pstats.Stats(profiles[0])
        for p in profiles[1:]:
            with contextlib.suppress(TypeError):  # a thread's profiler that never saw a call
                stats.add(p)
    stats.dump_stats(os.environ["CORRAL_PROFILE"])


def _term(signum: int, frame: FrameType | None) -> None:
    _dump()
    os._exit(0)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _term)
    sys.argv[0] = "corral"
    threading.setprofile(_start)
    main_profile = cProfile.Profile(time.thread_time)
    profiles.append(main_profile)
    main_profile.enable()
    try:
        app()
    finally:
        _dump()
