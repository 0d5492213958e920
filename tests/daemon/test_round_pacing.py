"""How `corral serve`'s loop paces its rounds under a burst of submissions (each wakes it): scheduling takes at most
a quarter of the CPU however long a round grows with the queue (issue 26, item 7: past a round of 0.2 s, rounds ran
back to back and a burst of 5,000 submissions with queues on lost half its rate)."""

from __future__ import annotations

import gc
import threading

import pytest

from corral.daemon.server import MAX_ROUND_REST_S, _LetGo, round_rest, start_frozen


@pytest.mark.parametrize("cpu", [0.001, 0.02, 0.05, 0.1, 0.2, 0.3, 0.6])
def test_a_round_is_followed_by_three_times_its_cpu_of_rest(cpu: float) -> None:
    assert round_rest(cpu) == pytest.approx(3 * cpu)  # the round, then 3 c for the submissions: a quarter


def test_the_rest_after_a_very_long_round_is_bounded() -> None:
    assert round_rest(1.0) == round_rest(30.0) == MAX_ROUND_REST_S == 2.0


@pytest.mark.parametrize(("cpu", "held"), [(0.01, 0.05), (0.02, 0.2), (0.05, 0.3)])
def test_a_round_that_held_the_lock_longer_than_its_cpu_rests_three_times_the_hold(cpu: float, held: float) -> None:
    # a loaded machine: the round waited for a core and the GIL while it held the lock the submissions need
    assert round_rest(cpu, held) == pytest.approx(3 * held)
    assert round_rest(held, cpu) == pytest.approx(3 * held)  # and the CPU, when it is the more
    assert round_rest(cpu, 10.0) == MAX_ROUND_REST_S


def test_a_rounds_launches_are_not_counted_in_its_hold() -> None:
    lock = threading.Lock()
    now = [100.0]
    let_go = _LetGo(lock, clock=lambda: now[0])
    with lock:
        for _ in range(2):
            now[0] += 1.0  # the round's own work, under the lock
            with let_go():
                assert not lock.locked()  # a launch runs without the lock
                now[0] += 0.25  # a supervisor's answer, waited for
            assert lock.locked()
    assert let_go.seconds == pytest.approx(0.5)


def test_what_the_start_made_is_out_of_the_collectors_sight() -> None:
    # a full collection walked every module, route and schema of the daemon, under its lock (50-70 ms)
    try:
        kept = start_frozen()
        assert kept > 1000 and gc.get_freeze_count() == kept
        gc.collect()  # a full collection now walks only what was made since: the frozen stay frozen
        assert gc.get_freeze_count() == kept
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
