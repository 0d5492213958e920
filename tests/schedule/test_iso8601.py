"""Chronos repeating intervals: repetitions, zones, calendar vs elapsed periods, and errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.model.errors import InvalidRequest
from corral.schedule.iso8601 import IsoDuration, RepeatingInterval, parse_duration, parse_repeating_interval

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def ticks(r: RepeatingInterval, after: datetime, n: int) -> list[datetime]:
    out: list[datetime] = []
    t: datetime | None = after
    while len(out) < n and t is not None:
        t = r.next_after(t)
        if t is not None:
            out.append(t)
    return out


def test_every_two_hours_forever() -> None:
    # Compatibility checklist item 7.
    r = parse_repeating_interval("R/2014-03-08T20:00:00Z/PT2H", now=NOW)
    assert r.repetitions is None
    assert ticks(r, utc(2014, 1, 1), 3) == [utc(2014, 3, 8, 20), utc(2014, 3, 8, 22), utc(2014, 3, 9, 0)]
    assert r.next_after(utc(2026, 5, 1, 11, 30)) == utc(2026, 5, 1, 12)  # far later: still on the 2-hour grid
    assert r.remaining_after(NOW) is None


def test_r3_counts_down_then_stops() -> None:
    r = parse_repeating_interval("R3/2014-03-08T20:00:00Z/PT2H", now=NOW)
    got = ticks(r, utc(2014, 1, 1), 10)
    assert got == [utc(2014, 3, 8, 20), utc(2014, 3, 8, 22), utc(2014, 3, 9, 0)]
    assert [r.remaining_after(t) for t in got] == [2, 1, 0]
    assert r.remaining_after(utc(2014, 1, 1)) == 3
    assert r.rewritten(got[0]) == "R2/2014-03-08T22:00:00.000Z/PT2H"
    assert r.rewritten(got[-1]).startswith("R0/")


def test_r0_never_fires() -> None:
    r = parse_repeating_interval("R0/2014-03-08T20:00:00Z/PT2H", now=NOW)
    assert r.next_after(utc(2000, 1, 1)) is None
    assert r.remaining_after(utc(2000, 1, 1)) == 0


def test_empty_start_is_now() -> None:
    r = parse_repeating_interval("R//PT10M", now=NOW)
    assert r.next_after(NOW - timedelta(seconds=1)) == NOW
    assert r.next_after(NOW) == NOW + timedelta(minutes=10)


def test_pt10m_is_minutes_and_p10m_is_months() -> None:
    assert parse_duration("PT10M") == IsoDuration(minutes=10)
    assert parse_duration("P10M") == IsoDuration(months=10)
    assert parse_duration("P1Y2M3W4DT5H6M7.5S") == IsoDuration(1, 2, 3, 4, 5, 6, Decimal("7.5"))
    assert str(parse_duration("P1Y2M3W4DT5H6M7.5S")) == "P1Y2M3W4DT5H6M7.5S"
    assert str(parse_duration("PT2H")) == "PT2H"


def test_schedule_time_zone_keeps_the_wall_clock_fields() -> None:
    r = parse_repeating_interval("R/2026-01-05T09:00:00Z/P1D", "Europe/Berlin", now=NOW)
    assert r.next_after(utc(2026, 1, 1)) == utc(2026, 1, 5, 8)  # 09:00 Berlin (CET), not 09:00 UTC


def test_p1d_keeps_wall_time_and_pt24h_is_elapsed_time_across_dst() -> None:
    daily = parse_repeating_interval("R/2026-03-27T09:00:00/P1D", "Europe/Berlin", now=NOW)
    hourly24 = parse_repeating_interval("R/2026-03-27T09:00:00/PT24H", "Europe/Berlin", now=NOW)
    berlin = ZoneInfo("Europe/Berlin")
    assert [t.astimezone(berlin).hour for t in ticks(daily, utc(2026, 3, 1), 4)] == [9, 9, 9, 9]
    assert [t.astimezone(berlin).hour for t in ticks(hourly24, utc(2026, 3, 1), 4)] == [9, 9, 10, 10]


def test_fixed_offset_start_has_no_dst() -> None:
    r = parse_repeating_interval("R/2026-03-27T09:00:00+01:00/P1D", now=NOW)
    assert [t.hour for t in ticks(r, utc(2026, 3, 1), 4)] == [8, 8, 8, 8]


def test_monthly_from_the_31st_does_not_drift() -> None:
    r = parse_repeating_interval("R/2026-01-31T00:00:00Z/P1M", now=NOW)
    assert [t.date().isoformat() for t in ticks(r, utc(2026, 1, 1), 4)] == [
        "2026-01-31",
        "2026-02-28",
        "2026-03-31",
        "2026-04-30",
    ]


def test_gap_start_is_shifted() -> None:
    r = parse_repeating_interval("R/2026-03-07T02:30:00/P1D", "America/New_York", now=NOW)
    ny = ZoneInfo("America/New_York")
    assert [t.astimezone(ny).strftime("%d %H:%M") for t in ticks(r, utc(2026, 3, 1), 3)] == [
        "07 02:30",
        "08 03:30",
        "09 02:30",
    ]


@settings(max_examples=50, deadline=None)
@given(
    reps=st.one_of(st.none(), st.integers(0, 400)),
    start_h=st.integers(-10_000, 10_000),
    period=st.sampled_from(["PT1M", "PT7M", "PT2H", "P1D", "P1W", "P1M", "P1Y", "P1DT1H", "PT90S", "P2M3D"]),
    zone=st.sampled_from(["", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe"]),
    j=st.integers(0, 300),
    jitter=st.floats(-1.0, 1.0),
)
def test_next_after_is_the_first_tick_after(
    reps: int | None, start_h: int, period: str, zone: str, j: int, jitter: float
) -> None:
    start = (utc(2026, 1, 1) + timedelta(hours=start_h)).strftime("%Y-%m-%dT%H:%M:%S")
    r = parse_repeating_interval(f"R{'' if reps is None else reps}/{start}/{period}", zone, now=NOW)
    unbounded = RepeatingInterval(None, r.start, r.period, r.zone)
    anchor = unbounded.tick(j)
    assert anchor is not None
    probe = anchor + timedelta(seconds=jitter * r.period.approx_seconds())
    # Brute force: walk the ticks from the first one.
    seq = [t for k in range(j + 3) if (t := r.tick(k)) is not None]
    assert seq == sorted(set(seq)), "ticks must be strictly increasing"
    expected = next((t for t in seq if t > probe), None)
    assert r.next_after(probe) == expected
    if reps is not None:
        assert r.remaining_after(probe) == reps - sum(1 for t in seq if t <= probe)


# ------------------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    ("text", "zone", "message"),
    [
        ("R/2014-03-08T20:00:00Z", "", "is not an ISO 8601 repeating interval R[n]/start/period"),
        ("2014-03-08T20:00:00Z/PT2H/R", "", "is not an ISO 8601 repeating interval"),
        ("Rx/2014-03-08T20:00:00Z/PT2H", "", "repetitions 'Rx' must be R (forever) or Rn"),
        ("R-1/2014-03-08T20:00:00Z/PT2H", "", "repetitions 'R-1' must be R (forever) or Rn"),
        ("R/yesterday/PT2H", "", "'yesterday' is not an ISO 8601 date-time"),
        ("R/1969-12-31T23:59:59Z/PT2H", "", "start '1969-12-31T23:59:59Z' is before 1970-01-01T00:00:00Z"),
        ("R/2014-03-08T20:00:00Z/P", "", "'P' is not an ISO 8601 duration"),
        ("R/2014-03-08T20:00:00Z/PT", "", "'PT' is not an ISO 8601 duration"),
        ("R/2014-03-08T20:00:00Z/10M", "", "'10M' is not an ISO 8601 duration like PT10M (10 minutes)"),
        ("R/2014-03-08T20:00:00Z/P1DT", "", "'P1DT' is not an ISO 8601 duration"),
        ("R/2014-03-08T20:00:00Z/PT0S", "", "period 'PT0S' must be longer than zero"),
    ],
)
def test_errors(text: str, zone: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_repeating_interval(text, zone, now=NOW)
    assert err.value.field == "schedule"
    assert message in err.value.message


def test_bad_schedule_time_zone() -> None:
    with pytest.raises(InvalidRequest, match="'Moon/Base' is not an IANA time zone name") as err:
        parse_repeating_interval("R/2014-03-08T20:00:00Z/PT2H", "Moon/Base", now=NOW)
    assert err.value.field == "scheduleTimeZone"
