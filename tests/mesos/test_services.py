"""Service rules: launch back-off (checklist item 14), health checks, scale-down victims, upgrade bounds."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from corral.mesos.model import BackoffPolicy, HealthCheckRule, UpgradeRule
from corral.mesos.services import (
    Backoff,
    Health,
    launch_delays,
    on_check,
    on_instance_end,
    pick_victims,
    reset_delay,
    upgrade_bounds,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DEFAULT = BackoffPolicy()


def test_delay_sequence_grows_by_the_factor_up_to_the_cap() -> None:
    got = list(itertools.islice(launch_delays(DEFAULT), 4))
    assert got == pytest.approx([1.0, 1.15, 1.3225, 1.520875])
    capped = list(itertools.islice(launch_delays(BackoffPolicy(10, 2, 35)), 5))
    assert capped == [10, 20, 35, 35, 35]


def test_each_failure_waits_longer_and_the_replacement_launches_after_the_delay() -> None:
    state, now, delays = Backoff(version="v1"), T0, []
    for status in ["TASK_FAILED", "TASK_FINISHED", "TASK_LOST", "TASK_UNHEALTHY"]:
        state = on_instance_end(DEFAULT, state, status, now, "v1")
        delays.append(state.delay_s)
        assert state.launch_not_before() == now + timedelta(seconds=state.delay_s)
        now += timedelta(seconds=5)
    assert delays == pytest.approx([1.0, 1.15, 1.3225, 1.520875])


def test_kills_do_not_grow_the_delay() -> None:
    state = on_instance_end(DEFAULT, Backoff(version="v1"), "TASK_FAILED", T0, "v1")
    assert on_instance_end(DEFAULT, state, "TASK_KILLED", T0 + timedelta(seconds=1), "v1") == state


def test_a_new_version_resets_the_delay() -> None:
    state = Backoff(version="v1")
    for i in range(5):
        state = on_instance_end(DEFAULT, state, "TASK_FAILED", T0 + timedelta(seconds=i), "v1")
    assert state.delay_s > 1.5
    assert on_instance_end(DEFAULT, state, "TASK_FAILED", T0 + timedelta(seconds=6), "v2").delay_s == 1.0
    assert on_instance_end(DEFAULT, state, "TASK_KILLED", T0 + timedelta(seconds=6), "v2") == Backoff(version="v2")


def test_a_quiet_spell_resets_the_delay_and_a_busy_one_does_not() -> None:
    policy = BackoffPolicy(1, 2, 10)
    state = Backoff()
    for i in range(4):
        state = on_instance_end(policy, state, "TASK_FAILED", T0 + timedelta(seconds=i), "")
    assert state.delay_s == 8
    busy = on_instance_end(policy, state, "TASK_FAILED", T0 + timedelta(seconds=3 + 18), "")
    assert busy.delay_s == 10
    quiet = on_instance_end(policy, state, "TASK_FAILED", T0 + timedelta(seconds=3 + 19), "")
    assert quiet.delay_s == 1


def test_reset_delay_launches_at_once() -> None:
    state = on_instance_end(DEFAULT, Backoff(), "TASK_FAILED", T0, "")
    assert reset_delay(state).launch_not_before() is None
    assert Backoff().launch_not_before() is None


HC = HealthCheckRule("HTTP", grace_period_s=300, interval_s=60, timeout_s=20, max_consecutive_failures=3)


def run_checks(rule: HealthCheckRule, results: list[tuple[int, bool]]) -> list[bool]:
    state, kills = Health(T0), []
    for at, ok in results:
        state, kill = on_check(rule, state, ok, T0 + timedelta(seconds=at))
        kills.append(kill)
    return kills


def test_failures_in_the_grace_period_do_not_count() -> None:
    assert run_checks(HC, [(60, False), (120, False), (180, False), (240, False)]) == [False] * 4
    assert run_checks(HC, [(300, False), (360, False), (420, False)]) == [False, False, True]


def test_the_grace_period_ends_with_the_first_success() -> None:
    assert run_checks(HC, [(10, True), (70, False), (130, False), (190, False)]) == [False, False, False, True]


def test_a_success_resets_the_count_and_zero_never_kills() -> None:
    assert run_checks(HC, [(400, False), (460, False), (520, True), (580, False), (640, False)]) == [False] * 5
    never = HealthCheckRule("TCP", 0, 10, 2, 0)
    assert not any(run_checks(never, [(i * 10, False) for i in range(20)]))


def test_scale_down_victims() -> None:
    instances = [("a", T0), ("b", T0 + timedelta(hours=2)), ("c", T0 + timedelta(hours=1))]
    assert pick_victims(instances, 2, "YOUNGEST_FIRST") == ["b", "c"]
    assert pick_victims(instances, 2, "OLDEST_FIRST") == ["a", "c"]
    assert pick_victims(instances, 0, "OLDEST_FIRST") == []


def test_upgrade_bounds() -> None:
    assert upgrade_bounds(4, UpgradeRule()) == (4, 8)
    assert upgrade_bounds(5, UpgradeRule(0.5, 0.0)) == (3, 5)
    assert upgrade_bounds(1, UpgradeRule(0.0, 0.0)) == (0, 1)
