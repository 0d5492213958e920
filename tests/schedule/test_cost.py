"""Schedules cost a bounded number of steps however many ticks a window holds (issue 12, finding 2): the arithmetic
answers agree with a slow walk over the ticks on small windows, and a hostile schedule costs a few tick evaluations.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.mesos import chronos
from corral.mesos.errors import ObjectNotValid
from corral.model.errors import InvalidRequest
from corral.schedule.clock import MISSED_COUNT_CAP, Schedule, TickPolicy, due_ticks
from corral.schedule.cron import CronExpression, CronSchedule, DayOfMonth, DayOfWeek
from corral.schedule.iso8601 import (
    MIN_PERIOD_S,
    IsoDuration,
    RepeatingInterval,
    check_min_period,
    parse_repeating_interval,
)
from tests.schedule.counting import counted

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
ZONES: list[tzinfo] = [
    UTC,
    ZoneInfo("Europe/Berlin"),
    ZoneInfo("America/New_York"),
    ZoneInfo("Australia/Lord_Howe"),  # a 30-minute daylight-saving change
    timezone(timedelta(hours=5, minutes=30)),
]


class OnlyNextAfter:
    """A schedule that can only say its next tick: due_ticks must walk or bisect it (the cron path)."""

    def __init__(self, inner: Schedule) -> None:
        self.inner = inner

    def next_after(self, instant: datetime) -> datetime | None:
        return self.inner.next_after(instant)

    def describe(self) -> str:
        return self.inner.describe()


def walk_index_after(r: RepeatingInterval, instant: datetime) -> int:
    """The slow reference: the first k whose tick is later, by trying k = 0, 1, 2, ..."""
    k = 0
    while True:
        try:
            if r.period.add_to(r.start, k, r.zone) > instant:
                return k
        except OverflowError:
            return k
        k += 1


def walk_ticks(r: RepeatingInterval, since: datetime, until: datetime) -> list[datetime]:
    out = []
    k = 0
    while (t := r.tick(k)) is not None and t <= until:
        if t > since:
            out.append(t)
        k += 1
    return out


periods = st.builds(
    IsoDuration,
    years=st.sampled_from([0, 0, 0, 1]),
    months=st.sampled_from([0, 0, 1, 2, 13]),
    weeks=st.sampled_from([0, 0, 1]),
    days=st.sampled_from([0, 0, 1, 3]),
    hours=st.integers(0, 30),
    minutes=st.integers(0, 90),
    seconds=st.sampled_from([Decimal(s) for s in ("0", "1", "0.5", "2.25", "0.000001", "59")]),
).filter(lambda p: not p.is_zero)

intervals = st.builds(
    RepeatingInterval,
    repetitions=st.one_of(st.none(), st.integers(0, 60)),
    start=st.datetimes(datetime(1999, 1, 1), datetime(2030, 1, 1), timezones=st.just(UTC)),
    period=periods,
    zone=st.sampled_from(ZONES),
)


def window(r: RepeatingInterval, lo: float, hi: float) -> tuple[datetime, datetime]:
    """A window around the first ~100 ticks, in units of the period's average length."""
    p = r.period.approx_seconds()
    return r.start + timedelta(seconds=lo * p), r.start + timedelta(seconds=hi * p)


@settings(max_examples=300, deadline=None)
@given(intervals, st.floats(-3, 100))
def test_index_after_matches_a_walk_over_the_ticks(r: RepeatingInterval, where: float) -> None:
    instant, _ = window(r, where, where)
    assert r.index_after(instant) == walk_index_after(r, instant)
    expected = r.tick(walk_index_after(r, instant))
    assert r.next_after(instant) == expected


@settings(max_examples=300, deadline=None)
@given(intervals, st.floats(-3, 100), st.floats(0, 40))
def test_ticks_in_a_window_match_a_walk(r: RepeatingInterval, where: float, width: float) -> None:
    since, until = window(r, where, where + width)
    walked = walk_ticks(r, since, until)
    assert r.ticks_in(since, until) == (len(walked), walked[-1] if walked else None)


@settings(max_examples=150, deadline=None)
@given(intervals, st.floats(-3, 100), st.floats(0, 40), st.sampled_from([None, 0.0, 900.0]))
def test_due_ticks_by_arithmetic_equal_due_ticks_by_walking(
    r: RepeatingInterval, where: float, width: float, deadline: float | None
) -> None:
    cursor, now = window(r, where, where + width)
    policy = TickPolicy(starting_deadline_s=deadline)
    fast = due_ticks(r, cursor, now, policy)
    slow = due_ticks(OnlyNextAfter(r), cursor, now, policy)
    if slow.count_capped:  # the walk stopped counting; the arithmetic did not
        assert fast.passed >= slow.passed == MISSED_COUNT_CAP
        fast = replace(fast, passed=0, missed=0)
        slow = replace(slow, passed=0, missed=0, count_capped=False)
    assert fast == slow


CRONS = ["0 * * * *", "*/7 3-5 * * *", "30 2 * * *", "0 9 1-7 * 1", "15 1 L * *", "0 0 29 2 *", "* * * * *"]


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(CRONS),
    st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]),
    st.datetimes(datetime(2023, 1, 1), datetime(2027, 1, 1), timezones=st.just(UTC)),
    st.integers(0, 3 * 24 * 60),
)
def test_cron_latest_tick_by_bisection_matches_a_walk(cron: str, zone: str, since: datetime, minutes: int) -> None:
    schedule = CronSchedule.parse(cron, zone)
    now = since + timedelta(minutes=minutes, seconds=17)
    walked = []
    t = schedule.next_after(since)
    while t is not None and t <= now:
        walked.append(t)
        t = schedule.next_after(t)
    d = due_ticks(schedule, since, now, TickPolicy(starting_deadline_s=None))
    assert d.run == (walked[-1] if walked else None)
    assert d.passed == min(len(walked), MISSED_COUNT_CAP)
    assert d.count_capped == (len(walked) >= MISSED_COUNT_CAP)


# ------------------------------------------------------------------------------------------------ bounded work
@pytest.mark.parametrize("period", ["PT1S", "PT0.001S", "PT0.000001S", "PT1.5S", "PT1H"])
@pytest.mark.parametrize("start", ["2000-01-01T00:00:00Z", "2020-01-01T00:00:00+05:30"])
def test_a_dense_schedule_from_long_ago_costs_a_few_tick_evaluations(period: str, start: str) -> None:
    r = parse_repeating_interval(f"R/{start}/{period}", now=NOW)
    with counted(IsoDuration, "add_to") as calls:
        d = due_ticks(r, r.start - timedelta(milliseconds=1), NOW, TickPolicy(starting_deadline_s=None))
    assert calls[0] <= 6, f"{calls[0]} tick evaluations for {period} from {start}"
    assert d.run is not None and d.run <= NOW < d.run + timedelta(seconds=float(r.period.time_seconds))
    assert d.passed == r.index_after(NOW) and not d.count_capped  # exact, however many (10^14 for PT0.000001S)
    assert d.next_tick == d.run + timedelta(seconds=float(r.period.time_seconds))


@settings(max_examples=200, deadline=None)
@given(intervals.filter(lambda r: r.period.has_date_part), st.datetimes(datetime(1999, 1, 1), datetime(2100, 1, 1)))
def test_a_calendar_period_costs_a_bounded_number_of_evaluations(r: RepeatingInterval, at: datetime) -> None:
    # P1M, P1Y, P1W1DT3H...: a division estimate and a short correction, never a walk from the start.
    instant = at.replace(tzinfo=UTC)
    with counted(IsoDuration, "add_to") as calls:
        k = r.index_after(instant)
    assert calls[0] <= 12, f"{calls[0]} evaluations for {r.period} from {r.start} to {instant}"
    assert r._later(k, instant) and not r._later(k - 1, instant)


def test_cron_after_a_long_downtime_costs_bounded_next_after_calls() -> None:
    minutely = CronSchedule.parse("* * * * *", "Europe/Berlin")
    with counted(CronSchedule, "next_after") as calls:
        d = due_ticks(minutely, NOW - timedelta(days=3650), NOW, TickPolicy(starting_deadline_s=None))
    assert d.run == NOW and d.count_capped and d.passed == MISSED_COUNT_CAP
    assert calls[0] <= MISSED_COUNT_CAP + 2 * 64 + 2


def test_a_cron_expression_that_never_fires_ends_its_search() -> None:
    # February 30 is refused when parsed; one built by hand (or read from an old store) must still not loop forever.
    feb30 = CronExpression("0 0 30 2 *", (0,), (0,), DayOfMonth(frozenset({30})), (2,), DayOfWeek(every=True), None)
    assert feb30.first_at_or_after(datetime(2026, 1, 1)) is None
    assert CronSchedule(feb30).next_after(NOW) is None
    d = due_ticks(CronSchedule(feb30), NOW - timedelta(days=400), NOW)
    assert (d.run, d.passed, d.next_tick) == (None, 0, None)


# ------------------------------------------------------------------------------------------------ minimum period
@pytest.mark.parametrize("period", ["PT0.001S", "PT0.999S", "PT0.5S"])
def test_periods_under_a_second_are_refused(period: str) -> None:
    r = parse_repeating_interval(f"R/2020-01-01T00:00:00Z/{period}", now=NOW)
    with pytest.raises(InvalidRequest) as caught:
        check_min_period(r)
    assert caught.value.field == "schedule"
    assert caught.value.message == (
        f"period {r.period} is shorter than the minimum of {MIN_PERIOD_S} second: every tick starts a run, and "
        f"corral starts runs at most once a second per schedule (use PT{MIN_PERIOD_S}S or longer)"
    )


@pytest.mark.parametrize("period", ["PT1S", "PT1.0S", "PT0M60S", "P1D", "P1M", "PT1.5S"])
def test_periods_of_a_second_or_more_are_accepted(period: str) -> None:
    check_min_period(parse_repeating_interval(f"R/2020-01-01T00:00:00Z/{period}", now=NOW))


def test_the_minimum_is_checked_at_submission_and_a_stored_job_still_loads() -> None:
    body = {"name": "fast", "command": "true", "schedule": "R/2020-01-01T00:00:00Z/PT0.001S"}
    with pytest.raises(ObjectNotValid) as caught:
        chronos.parse_job(body, now=NOW, known_jobs={})  # a submission
    assert caught.value.status == 400 and caught.value.details[0].path == "/schedule"
    stored = chronos.parse_job(body, now=NOW)  # read back from the store: admitted by an older corral
    assert stored.schedule == body["schedule"]


@pytest.mark.parametrize("deadline_s", [1e12, 1e15, 1e300])
def test_a_starting_deadline_past_year_9999_is_no_deadline_not_an_overflow(deadline_s: float) -> None:
    minutely = CronSchedule.parse("* * * * *")
    d = due_ticks(minutely, NOW - timedelta(minutes=2), NOW + timedelta(seconds=30), TickPolicy(deadline_s))
    assert d.run == NOW and d.run_deadline is None and d.missed == 1
