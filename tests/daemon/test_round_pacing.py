"""How `corral serve`'s loop paces its rounds under a burst of submissions (each wakes it): scheduling takes at most
about a quarter of the time however long a round grows with the queue (issue 26, item 7: past a round of 0.2 s,
rounds ran back to back and a burst of 5,000 submissions with queues on lost half its rate)."""

from __future__ import annotations

import pytest

from corral.daemon.server import MAX_ROUND_GAP_S, round_gap


@pytest.mark.parametrize("took", [0.001, 0.02, 0.05, 0.1, 0.2, 0.3, 0.45])
def test_a_round_is_followed_by_three_times_its_length_of_rest(took: float) -> None:
    assert round_gap(took) == pytest.approx(4 * took)  # the round, then 3 t for the submissions


def test_the_rest_after_a_very_long_round_is_bounded() -> None:
    assert round_gap(1.0) == round_gap(30.0) == MAX_ROUND_GAP_S == 2.0
