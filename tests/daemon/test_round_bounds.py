"""A round of the daemon launches a bounded number of jobs (issue 12: a burst held the lock for seconds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.daemon.core import STARTS_PER_ROUND
from corral.placement import place
from corral.tenancy import round as scheduler
from tests.daemon.test_core import Clock, daemon, spec


def counting_place(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return place(*args, **kwargs)

    monkeypatch.setattr(scheduler, "place", counted)
    return calls


def test_a_burst_is_launched_a_bounded_number_per_round_in_queue_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    d = daemon(tmp_path, clock=clock)
    burst = 3 * STARTS_PER_ROUND + 1
    ids = [d.submit(spec(gpus=0)).id for _ in range(burst)]
    rounds: list[list[str]] = []
    placed = counting_place(monkeypatch)
    while len(rounds) < 10 and sum(len(r) for r in rounds) < burst:
        clock.t += 1
        rounds.append(d.tick())
        if len(rounds) == 1:
            behind = d.store.get(ids[-1])
            assert behind is not None
            assert behind.reason == f"waiting for the next round: at most {STARTS_PER_ROUND} jobs start in one round"
    assert placed[0] == burst  # each job placed once, in the round that starts it: never the whole queue each round
    # The rest of the queue waits for the next rounds, first come first served.
    expected = [ids[i : i + STARTS_PER_ROUND] for i in range(0, burst, STARTS_PER_ROUND)]
    assert rounds == expected
