"""A round of the daemon launches a bounded number of jobs (issue 12: a burst held the lock for seconds)."""

from __future__ import annotations

from pathlib import Path

from corral.daemon.core import STARTS_PER_ROUND
from tests.daemon.test_core import Clock, daemon, spec


def test_a_burst_is_launched_a_bounded_number_per_round_in_queue_order(tmp_path: Path) -> None:
    clock = Clock()
    d = daemon(tmp_path, clock=clock)
    burst = 3 * STARTS_PER_ROUND + 1
    ids = [d.submit(spec(gpus=0)).id for _ in range(burst)]
    rounds: list[list[str]] = []
    while len(rounds) < 10 and sum(len(r) for r in rounds) < burst:
        clock.t += 1
        rounds.append(d.tick())
    # The rest of the queue waits for the next rounds, first come first served.
    expected = [ids[i : i + STARTS_PER_ROUND] for i in range(0, burst, STARTS_PER_ROUND)]
    assert rounds == expected
