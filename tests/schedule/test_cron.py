"""Cron parsing, next-fire times in time zones across daylight-saving changes, and every error text."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from corral.model.errors import InvalidRequest
from corral.schedule.cron import DAY_OF_MONTH_MUST_EXIST, CronExpression, CronSchedule, CronSyntaxError


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def fires(cron: str, after: datetime, n: int, zone: str = "UTC") -> list[datetime]:
    schedule = CronSchedule.parse(cron, zone)
    out: list[datetime] = []
    t: datetime | None = after
    for _ in range(n):
        assert t is not None
        t = schedule.next_after(t)
        if t is None:
            break
        out.append(t)
    return out


def local(instants: list[datetime], zone: str) -> list[str]:
    return [t.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M %Z") for t in instants]


# ------------------------------------------------------------------------------------------------ field semantics
def test_first_monday_is_dom_and_dow_together() -> None:
    # Compatibility checklist item 6: Metronome matches day of month AND day of week.
    assert fires("0 9 1-7 * 1", utc(2017, 10, 2, 10), 1) == [utc(2017, 11, 6, 9)]
    # Classic cron (OR) would fire on Oct 3 (day 3) and on every Monday; AND gives first Mondays only.
    assert [t.day for t in fires("0 9 1-7 * 1", utc(2017, 1, 1), 4)] == [2, 6, 6, 3]


def test_friday_the_13th() -> None:
    assert [(t.month, t.day) for t in fires("0 0 13 * FRI", utc(2026, 1, 1), 3)] == [(2, 13), (3, 13), (11, 13)]


@pytest.mark.parametrize(
    ("cron", "after", "expected"),
    [
        ("*/15 * * * *", utc(2026, 1, 1, 0, 7), [(0, 15), (0, 30), (0, 45), (1, 0)]),
        ("5/20 * * * *", utc(2026, 1, 1), [(0, 5), (0, 25), (0, 45), (1, 5)]),
        ("1-10/3 4 * * *", utc(2026, 1, 1), [(4, 1), (4, 4), (4, 7), (4, 10)]),
        ("0,30 9-10 * * *", utc(2026, 1, 1), [(9, 0), (9, 30), (10, 0), (10, 30)]),
    ],
)
def test_minutes_and_hours(cron: str, after: datetime, expected: list[tuple[int, int]]) -> None:
    assert [(t.hour, t.minute) for t in fires(cron, after, len(expected))] == expected


def test_names_are_case_insensitive() -> None:
    got = fires("0 12 * jan,JUL Mon-Fri", utc(2026, 1, 30), 3)
    assert [t.date().isoformat() for t in got] == ["2026-01-30", "2026-07-01", "2026-07-02"]


def test_sunday_is_0_and_7() -> None:
    assert CronExpression.parse("0 0 * * 7").dow == CronExpression.parse("0 0 * * SUN").dow
    assert all(t.weekday() == 6 for t in fires("0 0 * * 7", utc(2026, 1, 1), 5))
    assert [t.weekday() for t in fires("0 0 * * 5-7", utc(2026, 1, 1), 3)] == [4, 5, 6]  # Fri 2, Sat 3, Sun 4
    assert CronExpression.parse("0 0 * * FRI-SUN").dow == CronExpression.parse("0 0 * * 5-7").dow


@pytest.mark.parametrize(
    ("cron", "after", "days"),
    [
        ("0 0 L * *", utc(2024, 1, 15), ["2024-01-31", "2024-02-29", "2024-03-31", "2024-04-30"]),
        ("0 0 L-2 * *", utc(2026, 1, 15), ["2026-01-29", "2026-02-26", "2026-03-29"]),
        # Aug 15 2026 is a Saturday -> Friday 14th; Nov 15 2026 a Sunday -> Monday 16th.
        ("0 0 15W 8,11 *", utc(2026, 1, 1), ["2026-08-14", "2026-11-16"]),
        # Aug 1 2026 is a Saturday: the nearest weekday inside the month is Monday the 3rd, not July 31.
        ("0 0 1W 8 *", utc(2026, 1, 1), ["2026-08-03"]),
        ("0 0 LW * *", utc(2026, 5, 1), ["2026-05-29", "2026-06-30", "2026-07-31"]),  # May 31 2026 is a Sunday
        ("0 0 * * 5#3", utc(2026, 1, 1), ["2026-01-16", "2026-02-20"]),
        ("0 0 * * FRI#5", utc(2026, 1, 1), ["2026-01-30", "2026-05-29"]),
        ("0 0 * * 5L", utc(2026, 1, 1), ["2026-01-30", "2026-02-27"]),
        ("0 0 ? * 1L", utc(2026, 2, 1), ["2026-02-23", "2026-03-30"]),
        ("0 0 29 2 *", utc(2025, 1, 1), ["2028-02-29", "2032-02-29"]),
        ("0 0 31 1 *", utc(2026, 2, 1), ["2027-01-31"]),  # Metronome's own check wrongly refused this
    ],
)
def test_special_days(cron: str, after: datetime, days: list[str]) -> None:
    assert [t.date().isoformat() for t in fires(cron, after, len(days))] == days


def test_year_field_ends_the_schedule() -> None:
    assert fires("0 0 1 1 * 2030", utc(2026, 6, 1), 3) == [utc(2030, 1, 1)]
    assert fires("0 0 1 1 * 2027-2099/36", utc(2026, 6, 1), 5) == [utc(2027, 1, 1), utc(2063, 1, 1), utc(2099, 1, 1)]


def test_next_after_is_strictly_after_and_ignores_seconds() -> None:
    s = CronSchedule.parse("0 * * * *")
    assert s.next_after(utc(2026, 1, 1, 5)) == utc(2026, 1, 1, 6)
    assert s.next_after(utc(2026, 1, 1, 4, 59, 59)) == utc(2026, 1, 1, 5)
    with pytest.raises(ValueError, match="aware"):
        s.next_after(datetime(2026, 1, 1))


# ------------------------------------------------------------------------------------------- zones and DST
def test_zone_shifts_the_instant() -> None:
    assert fires("0 9 * * *", utc(2026, 1, 10), 1, "Europe/Berlin") == [utc(2026, 1, 10, 8)]
    assert fires("0 9 * * *", utc(2026, 7, 10), 1, "Europe/Berlin") == [utc(2026, 7, 10, 7)]


def test_daily_job_keeps_its_wall_time_across_both_changes() -> None:
    spring = fires("0 9 * * *", utc(2026, 3, 27), 4, "Europe/Berlin")
    assert local(spring, "Europe/Berlin") == [
        "2026-03-27 09:00 CET",
        "2026-03-28 09:00 CET",
        "2026-03-29 09:00 CEST",
        "2026-03-30 09:00 CEST",
    ]
    assert spring[2] - spring[1] == timedelta(hours=23)
    autumn = fires("0 9 * * *", utc(2026, 10, 24), 2, "Europe/Berlin")
    assert autumn[1] - autumn[0] == timedelta(hours=25)


def test_time_in_the_spring_forward_gap_is_shifted_by_the_gap() -> None:
    got = fires("30 2 * * *", utc(2026, 3, 7, 12), 3, "America/New_York")
    assert local(got, "America/New_York") == [
        "2026-03-08 03:30 EDT",  # 02:30 does not exist that day
        "2026-03-09 02:30 EDT",
        "2026-03-10 02:30 EDT",
    ]


def test_frequent_job_across_the_gap_fires_once_per_instant() -> None:
    got = fires("*/15 * * * *", utc(2026, 3, 8, 6), 8, "America/New_York")
    # 01:00 EST .. 01:45 EST, then 03:00 EDT (02:xx shifted onto 03:xx, merged): one tick every 15 real minutes.
    assert got == [utc(2026, 3, 8, 6, 15) + timedelta(minutes=15 * i) for i in range(8)]


def test_repeated_hour_fires_once() -> None:
    got = fires("30 1 * * *", utc(2026, 10, 31, 12), 3, "America/New_York")
    assert got == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30), utc(2026, 11, 3, 6, 30)]
    half_hourly = fires("*/30 * * * *", utc(2026, 11, 1, 4), 5, "America/New_York")
    # 00:30 EDT, 01:00 EDT, 01:30 EDT, (01:00 and 01:30 EST are the same wall times: skipped), 02:00 EST, 02:30 EST
    assert half_hourly == [
        utc(2026, 11, 1, 4, 30),
        utc(2026, 11, 1, 5),
        utc(2026, 11, 1, 5, 30),
        utc(2026, 11, 1, 7),
        utc(2026, 11, 1, 7, 30),
    ]


def test_half_hour_gap_on_lord_howe_keeps_order() -> None:
    # Lord Howe goes from 02:00 to 02:30 on 2026-10-04. 02:20 is shifted to 02:50, after the real 02:35.
    zone = "Australia/Lord_Howe"
    assert local(fires("20,35 2 * * *", utc(2026, 10, 3, 12), 3, zone), zone) == [
        "2026-10-04 02:35 +11",
        "2026-10-04 02:50 +11",
        "2026-10-05 02:20 +11",
    ]
    assert local(fires("*/10 2 * * *", utc(2026, 10, 3, 12), 4, zone), zone) == [
        "2026-10-04 02:30 +11",
        "2026-10-04 02:40 +11",
        "2026-10-04 02:50 +11",
        "2026-10-05 02:00 +11",
    ]


# ------------------------------------------------------------------- property: agrees with a brute-force search
ZONES = ["UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe"]
TRANSITIONS = [
    utc(2026, 3, 8, 7),
    utc(2026, 11, 1, 6),
    utc(2026, 3, 29, 1),
    utc(2026, 10, 25, 1),
    utc(2026, 4, 4, 15),
    utc(2026, 10, 3, 15, 30),
    utc(2028, 2, 28, 12),
]


def brute_force(expr: CronExpression, zone: ZoneInfo, after: datetime, horizon: timedelta) -> list[datetime]:
    """Every firing instant in (after, after + horizon], by checking every wall-clock minute that could map there."""
    start = after.astimezone(zone).replace(tzinfo=None, second=0, microsecond=0) - timedelta(days=1)
    found = set()
    for i in range(int((horizon + timedelta(days=2)) / timedelta(minutes=1))):
        wall = start + timedelta(minutes=i)
        if wall.minute in expr.minutes and wall.hour in expr.hours and expr.matches(wall):
            instant = wall.replace(tzinfo=zone).astimezone(UTC)  # fold=0: first occurrence / pre-gap offset
            if after < instant <= after + horizon:
                found.add(instant)
    return sorted(found)


def items(lo: int, hi: int) -> st.SearchStrategy[str]:
    single = st.integers(lo, hi).map(str)
    rng = st.tuples(st.integers(lo, hi), st.integers(lo, hi)).map(lambda ab: f"{min(ab)}-{max(ab)}")
    step = st.tuples(st.sampled_from(["*", str(lo)]), st.integers(1, max(1, (hi - lo) // 2))).map(
        lambda bs: f"{bs[0]}/{bs[1]}"
    )
    return st.one_of(single, rng, step, st.lists(single, min_size=2, max_size=4).map(",".join))


crons = st.tuples(
    st.one_of(st.just("*"), items(0, 59)),
    st.one_of(st.just("*"), items(0, 23)),
    st.one_of(st.just("*"), st.just("?"), items(1, 31), st.sampled_from(["L", "L-3", "15W", "LW", "1W"])),
    st.one_of(st.just("*"), st.just("*"), items(1, 12)),
    st.one_of(st.just("*"), st.just("?"), items(0, 7), st.sampled_from(["5L", "1#1", "MON-FRI", "SAT,SUN"])),
).map(" ".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cron=crons,
    zone=st.sampled_from(ZONES),
    base=st.sampled_from(TRANSITIONS),
    offset_min=st.integers(-2 * 1440, 2 * 1440),
)
def test_next_fire_matches_minute_by_minute_search(cron: str, zone: str, base: datetime, offset_min: int) -> None:
    try:
        schedule = CronSchedule.parse(cron, zone)
    except CronSyntaxError:
        assume(False)
        raise
    after = base + timedelta(minutes=offset_min, seconds=offset_min % 7)
    horizon = timedelta(days=2)
    expected = brute_force(schedule.expression, ZoneInfo(zone), after, horizon)
    event("fires in the window" if expected else "no fire in the window")
    got: list[datetime] = []
    t = schedule.next_after(after)
    while t is not None and t <= after + horizon:
        assert not got or t > got[-1], "next-fire must be strictly increasing"
        got.append(t)
        t = schedule.next_after(t)
    assert got == expected
    assert t is None or t > after + horizon


# ------------------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    ("cron", "field", "text"),
    [
        ("0 0 31 2 *", "day of month", DAY_OF_MONTH_MUST_EXIST),
        ("0 0 30,31 2 *", "day of month", DAY_OF_MONTH_MUST_EXIST),
        ("0 0 31 4,6 *", "day of month", DAY_OF_MONTH_MUST_EXIST),
        ("60 * * * *", "minute", "value 60 is out of range 0..59"),
        ("* 24 * * *", "hour", "value 24 is out of range 0..23"),
        ("* * 0 * *", "day of month", "value 0 is out of range 1..31"),
        ("* * * 13 *", "month", "value 13 is out of range 1..12"),
        ("* * * FOO *", "month", "'FOO' is not a number in 1..12 or a name (JAN, FEB"),
        ("* * * * 8", "day of week", "value 8 is out of range 0..7"),
        ("* * * * * 1969", "year", "value 1969 is out of range 1970..2099"),
        ("5-1 * * * *", "minute", "range '5-1' runs backwards (5 > 1); write it as a list"),
        ("*/0 * * * *", "minute", "step '0' in '*/0' must be a whole number >= 1"),
        ("1,,2 * * * *", "minute", "'1,,2' has an empty list item"),
        ("? * * * *", "minute", "'?' is only allowed in the day-of-month and day-of-week fields"),
        ("* * 1,? * *", "day of month", "'?' must stand alone, not in a list"),
        ("* * * * 1,*", "day of week", "'*' must stand alone, not in a list"),
        ("* * 3#2 * *", "day of month", "'3#2' is not one of n, a-b, a-b/s, L, L-n, nW, LW"),
        ("* * L-31 * *", "day of month", "'L-31': at most L-30"),
        ("* * * * L", "day of week", "'L' needs a weekday before it"),
        ("* * * * 5#6", "day of week", "the number after # must be 1..5"),
        ("* * * * 3W", "day of week", "'3W' is not a number in 0..7 or a name"),
    ],
)
def test_errors_name_the_field(cron: str, field: str, text: str) -> None:
    with pytest.raises(CronSyntaxError) as err:
        CronExpression.parse(cron)
    assert err.value.cron_field == field
    assert text in err.value.reason
    assert err.value.field == "cron"
    assert str(err.value).startswith(f"cron: {field} field: ")


@pytest.mark.parametrize("cron", ["0 0 1-7 * 1#2", "0 0 29 2 * 2023", "0 0 L 2 1#1"])
def test_expression_that_never_fires_is_refused(cron: str) -> None:
    with pytest.raises(CronSyntaxError, match="never fires: no date matches") as err:
        CronExpression.parse(cron)
    assert err.value.cron_field is None


@pytest.mark.parametrize("cron", ["* * * *", "* * * * * * *", ""])
def test_wrong_number_of_fields(cron: str) -> None:
    with pytest.raises(CronSyntaxError, match=r"expected 5 fields .* and an optional year"):
        CronExpression.parse(cron)


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "../etc/passwd", "Europe/Berlin "])
def test_unknown_time_zone(zone: str) -> None:
    with pytest.raises(InvalidRequest, match="is not an IANA time zone name") as err:
        CronSchedule.parse("* * * * *", zone)
    assert err.value.field == "timezone"
