"""kill -9 and SIGTERM of the real `corral serve` in the middle of bursts, restarted each time: no acknowledged job
lost, none run twice (at once or one after the other), every state and exit code true. Plain jobs with retries,
Metronome runs (ON_FAILURE relaunches) and Chronos runs.

Supersedes tests/api/test_crash.py, which allowed a job caught between launch and record to end LOST. The suite
runs the issue's test as it is written (500 jobs with retries, kill -9 three times) and smaller bursts of the rest;
`CORRAL_KILL9_FULL=1` runs every burst at full size (also `python -m benchmarks.kill9_burst`, whose figures are in
BENCHMARKS.md).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from benchmarks.kill9_burst import Result, chronos_runs, metronome_runs, plain_jobs

FULL = os.environ.get("CORRAL_KILL9_FULL") == "1"


def check(result: Result) -> None:
    assert result.kills > 0 and result.acked > 0, result.line()
    assert result.lost == [], result.line()
    assert result.run_twice == [], result.line()
    assert result.wrong == [], result.line()


def test_kill9_three_times_in_a_burst_of_jobs_with_retries(tmp_path: Path) -> None:
    check(plain_jobs(tmp_path, 500, kills=3))


def test_sigterm_in_a_burst_of_jobs_with_retries(tmp_path: Path) -> None:
    check(plain_jobs(tmp_path, 500 if FULL else 24, kills=1, sig=signal.SIGTERM))


def test_kill9_in_a_burst_of_metronome_runs(tmp_path: Path) -> None:
    check(metronome_runs(tmp_path, 60 if FULL else 9, kills=3 if FULL else 2))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM] if FULL else [signal.SIGKILL])
def test_kill_in_a_burst_of_chronos_runs(tmp_path: Path, sig: int) -> None:
    check(chronos_runs(tmp_path, 60 if FULL else 8, kills=3 if FULL else 1, sig=sig))
