"""The missed-tick rule, driven by an injected clock: restarts between ticks, deadlines, FORBID, disabled."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from corral.schedule.clock import (
    MISSED_COUNT_CAP,
    ConcurrencyPolicy,
    FakeClock,
    Schedule,
    SystemClock,
    TickPolicy,
    due_ticks,
)
from corral.schedule.cron import CronSchedule
from corral.schedule.iso8601 import parse_repeating_interval


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


HOURLY = CronSchedule.parse("0 * * * *")


def test_schedules_satisfy_the_protocol() -> None:
    assert isinstance(HOURLY, Schedule)
    assert isinstance(parse_repeating_interval("R/2026-01-01T00:00:00Z/PT1H", now=utc(2026, 1, 1)), Schedule)


def test_fake_clock_moves_only_forward_when_told() -> None:
    clock = FakeClock(utc(2026, 1, 1))
    assert clock.now() == utc(2026, 1, 1)
    assert clock.advance(90) == utc(2026, 1, 1, 0, 1, 30)
    assert clock.advance(hours=1) == utc(2026, 1, 1, 1, 1, 30)
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="aware"):
        FakeClock(datetime(2026, 1, 1))
    assert SystemClock().now().tzinfo is not None


def test_nothing_due_reports_the_next_tick() -> None:
    d = due_ticks(HOURLY, utc(2026, 1, 1, 5), utc(2026, 1, 1, 5, 30))
    assert (d.run, d.passed, d.missed, d.cursor, d.next_tick) == (None, 0, 0, utc(2026, 1, 1, 5), utc(2026, 1, 1, 6))


def test_tick_on_time_runs_with_its_starting_deadline() -> None:
    d = due_ticks(HOURLY, utc(2026, 1, 1, 5), utc(2026, 1, 1, 6, 0, 1))
    assert d.run == utc(2026, 1, 1, 6)
    assert d.run_deadline == utc(2026, 1, 1, 6, 15)  # default startingDeadlineSeconds 900
    assert (d.passed, d.missed, d.cursor, d.next_tick) == (1, 0, utc(2026, 1, 1, 6), utc(2026, 1, 1, 7))


def test_restart_between_two_ticks_loses_and_repeats_nothing() -> None:
    clock = FakeClock(utc(2026, 1, 1, 5, 59))
    cursor = utc(2026, 1, 1, 5)
    ran: list[datetime] = []
    for _ in range(3):  # daemon loop: wake at next_tick
        d = due_ticks(HOURLY, cursor, clock.now())
        if d.run:
            ran.append(d.run)
        cursor = d.cursor
        assert d.next_tick is not None
        clock.set(d.next_tick)
    assert ran == [utc(2026, 1, 1, 6), utc(2026, 1, 1, 7)]
    # The daemon stops at 07:30 with cursor 07:00 persisted and comes back at 07:45: nothing to do, next is 08:00.
    d = due_ticks(HOURLY, utc(2026, 1, 1, 7), utc(2026, 1, 1, 7, 45))
    assert (d.run, d.passed, d.next_tick) == (None, 0, utc(2026, 1, 1, 8))
    # Back at 08:10 instead: 08:00 is within its 15-minute deadline, so it runs (late), once.
    d = due_ticks(HOURLY, utc(2026, 1, 1, 7), utc(2026, 1, 1, 8, 10))
    assert (d.run, d.missed) == (utc(2026, 1, 1, 8), 0)
    again = due_ticks(HOURLY, d.cursor, utc(2026, 1, 1, 8, 11))
    assert again.run is None


def test_down_for_hours_runs_only_the_latest_tick_within_its_deadline() -> None:
    d = due_ticks(HOURLY, utc(2026, 1, 1, 0), utc(2026, 1, 1, 5, 10))
    assert d.run == utc(2026, 1, 1, 5)
    assert (d.passed, d.missed, d.cursor) == (5, 4, utc(2026, 1, 1, 5))


def test_latest_tick_past_its_deadline_is_missed_not_run() -> None:
    d = due_ticks(HOURLY, utc(2026, 1, 1, 0), utc(2026, 1, 1, 5, 16))
    assert d.run is None
    assert (d.passed, d.missed, d.cursor, d.next_tick) == (5, 5, utc(2026, 1, 1, 5), utc(2026, 1, 1, 6))
    on_edge = due_ticks(HOURLY, utc(2026, 1, 1, 0), utc(2026, 1, 1, 5, 15))
    assert on_edge.run == utc(2026, 1, 1, 5)


def test_forbid_skips_a_tick_during_an_active_run_and_allow_does_not() -> None:
    forbid = TickPolicy(concurrency=ConcurrencyPolicy.FORBID)
    d = due_ticks(HOURLY, utc(2026, 1, 1, 5), utc(2026, 1, 1, 6), forbid, active_runs=1)
    assert (d.run, d.skipped_by_forbid, d.missed, d.cursor) == (None, utc(2026, 1, 1, 6), 0, utc(2026, 1, 1, 6))
    assert due_ticks(HOURLY, utc(2026, 1, 1, 5), utc(2026, 1, 1, 6), forbid, active_runs=0).run == utc(2026, 1, 1, 6)
    d = due_ticks(HOURLY, utc(2026, 1, 1, 5), utc(2026, 1, 1, 6), TickPolicy(), active_runs=3)
    assert d.run == utc(2026, 1, 1, 6)


def test_disabled_schedule_never_runs_and_does_not_back_fill_when_enabled() -> None:
    off = TickPolicy(enabled=False)
    d = due_ticks(HOURLY, utc(2026, 1, 1, 0), utc(2026, 1, 1, 3), off)
    assert (d.run, d.passed, d.missed, d.cursor) == (None, 3, 3, utc(2026, 1, 1, 3))
    # Enabled again at 03:05: the 03:00 tick was handled (dropped) while disabled.
    assert due_ticks(HOURLY, d.cursor, utc(2026, 1, 1, 3, 5)).run is None


def test_no_deadline_collapses_everything_missed_into_one_run() -> None:
    chronos = TickPolicy(starting_deadline_s=None)
    d = due_ticks(HOURLY, utc(2026, 1, 1, 0), utc(2026, 1, 3, 0, 30), chronos)
    assert (d.run, d.run_deadline, d.passed, d.missed) == (utc(2026, 1, 3, 0), None, 48, 47)


def test_a_month_of_minutely_ticks_is_counted_up_to_the_cap() -> None:
    minutely = CronSchedule.parse("* * * * *")
    d = due_ticks(minutely, utc(2026, 1, 1), utc(2026, 2, 1, 0, 0, 30))
    assert d.run == utc(2026, 2, 1)
    assert d.count_capped and d.passed == MISSED_COUNT_CAP


def test_chronos_repetitions_are_used_up_by_missed_ticks() -> None:
    r3 = parse_repeating_interval("R3/2026-01-01T00:00:00Z/PT1H", now=utc(2026, 1, 1))
    created = utc(2025, 12, 31, 23)
    # The daemon was down from before the first tick until 02:30: ticks 00:00, 01:00, 02:00 all passed.
    d = due_ticks(r3, created, utc(2026, 1, 1, 2, 30), TickPolicy(starting_deadline_s=None))
    assert (d.run, d.passed, d.missed, d.next_tick) == (utc(2026, 1, 1, 2), 3, 2, None)
    assert r3.remaining_after(d.cursor) == 0  # R0: Chronos disables the job


def test_cron_schedule_across_dst_driven_by_the_clock() -> None:
    berlin_9am = CronSchedule.parse("0 9 * * *", "Europe/Berlin")
    clock = FakeClock(utc(2026, 3, 27, 12))
    cursor = clock.now()
    ran = []
    for _ in range(4):
        d = due_ticks(berlin_9am, cursor, clock.now())
        if d.run:
            ran.append(d.run)
        cursor = d.cursor
        assert d.next_tick is not None
        clock.set(d.next_tick + timedelta(seconds=2))
    assert ran == [utc(2026, 3, 28, 8), utc(2026, 3, 29, 7), utc(2026, 3, 30, 7)]


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        due_ticks(HOURLY, datetime(2026, 1, 1), utc(2026, 1, 1))
