"""Cron expressions as Metronome reads them, and their next fire time in an IANA time zone.

    minute hour day-of-month month day-of-week [year]

    field          values               also
    minute         0-59                 *  a-b  */s  a-b/s  a/s  lists
    hour           0-23                 as above
    day of month   1-31                 ?  L  L-n (n days before the last)  nW (weekday nearest n)  LW
    month          1-12 or JAN-DEC      as minute
    day of week    0-7 or SUN-SAT       ?  nL (last weekday n of the month)  n#k (k-th weekday n, k 1..5);
                   (0 and 7 are Sunday)
    year           1970-2099            as minute; omitted = every year

Day of month and day of week must **both** match (Metronome's cron-utils definition uses
`matchDayOfWeekAndDayOfMonth`), unlike classic Unix cron which fires when either matches: `0 9 1-7 * 1` is the first
Monday of each month, not "days 1-7 and every Monday". `*` and `?` mean the same (match every day).

An expression that can never fire is refused when it is parsed: `0 0 31 2 *` with Metronome's message, and anything
else that no date satisfies (`0 0 1-7 * 1#2`, `0 0 29 2 * 2023`) with corral's. Metronome's own check only looked at
plain day/month values and wrongly refused day 31 of 31-day months; this one is exact.

Time zones and daylight saving (`CronSchedule.next_after`): the expression describes wall-clock times in the zone.

    * A wall time that does not exist (the hour skipped when clocks go forward) is **shifted forward by the length of
      the gap**: `30 2 * * *` in America/New_York fires at 03:30 EDT on the spring-forward day. This is java.time's
      rule for turning a local time into an instant (`ZonedDateTime.of`), the time library Metronome's cron-utils
      works in (cron-utils' own output on gap days has varied between releases: its issues #61 and #446), and a
      daily job is never silently dropped for a day. A shifted time that coincides with another firing time fires
      once.
    * A wall time that occurs twice (the hour repeated when clocks go back) **fires once**, at its first occurrence
      (the earlier instant, daylight time).
"""

from __future__ import annotations

import bisect
import calendar
import functools
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from corral.model.errors import InvalidRequest

MIN_YEAR = 1970
MAX_YEAR = 2099  # cron-utils' year range; next_after returns None beyond it

#: Metronome's text for a day that no listed month has (verbatim, including its grammar).
DAY_OF_MONTH_MUST_EXIST = (
    "Day of the month must exist in the provided month and year "
    "(e.g. February have only < 29 days so running cron on 30.2. is invalid)"
)

MONTH_NAMES = {n.upper(): i for i, n in enumerate(calendar.month_abbr) if n}
DOW_NAMES = {"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6}
_MAX_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # any year: Feb 29 exists in leap years


class CronSyntaxError(InvalidRequest):
    """A cron expression that cannot be read or can never fire. `cron_field` names the field ("day of week"), or is
    None when the fields are fine one by one but no date satisfies them together."""

    def __init__(self, cron_field: str | None, message: str) -> None:
        super().__init__("cron", f"{cron_field} field: {message}" if cron_field else message)
        self.cron_field = cron_field
        self.reason = message


@dataclass(frozen=True, slots=True)
class DayOfMonth:
    days: frozenset[int] = frozenset()  # plain days 1..31
    before_last: frozenset[int] = frozenset()  # L = 0, L-3 = 3
    nearest_weekday: frozenset[int] = frozenset()  # 15W
    last_weekday: bool = False  # LW
    every: bool = False  # * or ?

    def matches(self, year: int, month: int, day: int, weekday: int) -> bool:
        """`weekday` in cron numbering (0 = Sunday)."""
        if self.every or day in self.days:
            return True
        last = calendar.monthrange(year, month)[1]
        if last - day in self.before_last:
            return True
        if self.last_weekday and day == _nearest_weekday(year, month, last, last):
            return True
        return any(day == _nearest_weekday(year, month, n, last) for n in self.nearest_weekday if n <= last)


@dataclass(frozen=True, slots=True)
class DayOfWeek:
    weekdays: frozenset[int] = frozenset()  # 0 = Sunday .. 6 = Saturday
    last: frozenset[int] = frozenset()  # 5L = last Friday of the month
    nth: frozenset[tuple[int, int]] = frozenset()  # (5, 3) = third Friday
    every: bool = False

    def matches(self, year: int, month: int, day: int, weekday: int) -> bool:
        if self.every or weekday in self.weekdays:
            return True
        if weekday in self.last and day + 7 > calendar.monthrange(year, month)[1]:
            return True
        return (weekday, (day - 1) // 7 + 1) in self.nth


def _nearest_weekday(year: int, month: int, n: int, last: int) -> int:
    """Quartz's nW: the Monday-Friday day nearest to day n, never leaving the month."""
    wd = calendar.weekday(year, month, n)  # Monday = 0
    if wd == 5:  # Saturday: Friday before, unless that is in the previous month
        return n - 1 if n > 1 else n + 2
    if wd == 6:  # Sunday: Monday after, unless that is in the next month
        return n + 1 if n < last else n - 2
    return n


@functools.lru_cache(maxsize=4096)
def _month_days(dom: DayOfMonth, dow: DayOfWeek, year: int, month: int) -> tuple[int, ...]:
    first_wd, last = calendar.monthrange(year, month)  # Monday = 0
    out = []
    for day in range(1, last + 1):
        weekday = (first_wd + day) % 7  # cron numbering: (Monday 0 + 1) % 7 == 1, Sunday == 0
        if dom.matches(year, month, day, weekday) and dow.matches(year, month, day, weekday):
            out.append(day)
    return tuple(out)


def _next_in(values: tuple[int, ...], x: int) -> int | None:
    i = bisect.bisect_left(values, x)
    return values[i] if i < len(values) else None


# ------------------------------------------------------------------------------------------------------- parsing
def _value(field: str, token: str, lo: int, hi: int, names: dict[str, int] | None) -> int:
    upper = token.upper()
    if names is not None and upper in names:
        return names[upper]
    if not token.isdigit():
        hint = f" or a name ({', '.join(names)})" if names else ""
        raise CronSyntaxError(field, f"{token!r} is not a number in {lo}..{hi}{hint}")
    value = int(token)
    if not lo <= value <= hi:
        raise CronSyntaxError(field, f"value {value} is out of range {lo}..{hi}")
    return value


def _parse_values(field: str, item: str, lo: int, hi: int, names: dict[str, int] | None) -> list[int]:
    """One list item without the specials: `*`, `n`, `a-b`, each optionally `/step`."""
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not step_text.isdigit() or int(step_text) == 0:
            raise CronSyntaxError(field, f"step {step_text!r} in {item!r} must be a whole number >= 1")
        step = int(step_text)
    if base == "*":
        start, end = lo, hi
    elif "-" in base:
        a, _, b = base.partition("-")
        start, end = _value(field, a, lo, hi, names), _value(field, b, lo, hi, names)
        if start > end:
            raise CronSyntaxError(field, f"range {item!r} runs backwards ({start} > {end}); write it as a list")
    else:
        start = _value(field, base, lo, hi, names)
        end = hi if slash else start  # "5/15" = from 5 to the end, every 15
    return list(range(start, end + 1, step))


def _split(field: str, text: str) -> list[str]:
    items = text.split(",")
    if any(not i for i in items):
        raise CronSyntaxError(field, f"{text!r} has an empty list item")
    return items


def _parse_set(field: str, text: str, lo: int, hi: int, names: dict[str, int] | None = None) -> frozenset[int]:
    if text == "?":
        raise CronSyntaxError(field, "'?' is only allowed in the day-of-month and day-of-week fields")
    values: set[int] = set()
    for item in _split(field, text):
        values.update(_parse_values(field, item, lo, hi, names))
    return frozenset(values)


_L_MINUS = re.compile(r"L-(\d+)")
_NEAREST = re.compile(r"(\d+)W")


def _parse_dom(text: str) -> DayOfMonth:
    field = "day of month"
    if text in ("*", "?"):
        return DayOfMonth(every=True)
    days: set[int] = set()
    before_last: set[int] = set()
    nearest: set[int] = set()
    last_weekday = False
    for item in _split(field, text):
        upper = item.upper()
        if upper in ("*", "?"):
            raise CronSyntaxError(field, f"{item!r} must stand alone, not in a list")
        if upper == "L":
            before_last.add(0)
        elif upper == "LW":
            last_weekday = True
        elif m := _L_MINUS.fullmatch(upper):
            offset = int(m.group(1))
            if offset > 30:
                raise CronSyntaxError(field, f"{item!r}: at most L-30")
            before_last.add(offset)
        elif m := _NEAREST.fullmatch(upper):
            nearest.add(_value(field, m.group(1), 1, 31, None))
        elif "L" in upper or "W" in upper or "#" in upper:
            raise CronSyntaxError(field, f"{item!r} is not one of n, a-b, a-b/s, L, L-n, nW, LW")
        else:
            days.update(_parse_values(field, item, 1, 31, None))
    return DayOfMonth(frozenset(days), frozenset(before_last), frozenset(nearest), last_weekday)


def _parse_dow(text: str) -> DayOfWeek:
    field = "day of week"
    if text in ("*", "?"):
        return DayOfWeek(every=True)
    weekdays: set[int] = set()
    last: set[int] = set()
    nth: set[tuple[int, int]] = set()
    for item in _split(field, text):
        upper = item.upper()
        if upper in ("*", "?"):
            raise CronSyntaxError(field, f"{item!r} must stand alone, not in a list")
        if "#" in upper:
            day, _, k = upper.partition("#")
            if not k.isdigit() or not 1 <= int(k) <= 5:
                raise CronSyntaxError(field, f"{item!r}: the number after # must be 1..5 (k-th weekday of the month)")
            nth.add((_value(field, day, 0, 7, DOW_NAMES) % 7, int(k)))
        elif upper.endswith("L"):
            if upper == "L":
                raise CronSyntaxError(field, "'L' needs a weekday before it (5L or FRIL: the last Friday of the month)")
            last.add(_value(field, upper[:-1], 0, 7, DOW_NAMES) % 7)
        else:
            # "FRI-SUN" means Friday to Sunday: a range that ends on Sunday ends on 7, not 0.
            if re.fullmatch(r"[^-/]+-SUN(?:/\d+)?", upper):
                upper = upper.replace("-SUN", "-7")
            weekdays.update(v % 7 for v in _parse_values(field, upper, 0, 7, DOW_NAMES))
    return DayOfWeek(frozenset(weekdays), frozenset(last), frozenset(nth))


@dataclass(frozen=True, slots=True)
class CronExpression:
    """A parsed cron expression over wall-clock minutes (no time zone: see `CronSchedule`)."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    dom: DayOfMonth
    months: tuple[int, ...]
    dow: DayOfWeek
    years: tuple[int, ...] | None  # None = every year up to MAX_YEAR

    @classmethod
    def parse(cls, text: str) -> CronExpression:
        parts = text.split()
        if len(parts) not in (5, 6):
            raise CronSyntaxError(
                None,
                f"expected 5 fields (minute hour day-of-month month day-of-week) and an optional year, "
                f"got {len(parts)} in {text!r}",
            )
        minute, hour, dom_text, month, dow_text = parts[:5]
        expr = cls(
            text=" ".join(parts),
            minutes=tuple(sorted(_parse_set("minute", minute, 0, 59))),
            hours=tuple(sorted(_parse_set("hour", hour, 0, 23))),
            dom=_parse_dom(dom_text),
            months=tuple(sorted(_parse_set("month", month, 1, 12, MONTH_NAMES))),
            dow=_parse_dow(dow_text),
            years=tuple(sorted(_parse_set("year", parts[5], MIN_YEAR, MAX_YEAR))) if len(parts) == 6 else None,
        )
        expr._check_can_fire()
        return expr

    def _check_can_fire(self) -> None:
        dom = self.dom
        plain = not (dom.every or dom.before_last or dom.nearest_weekday or dom.last_weekday)
        if plain and not any(d <= _MAX_DAYS[m - 1] for d in dom.days for m in self.months):
            raise CronSyntaxError("day of month", DAY_OF_MONTH_MUST_EXIST)
        # Without a year field, 28 consecutive years contain every calendar (weekday of Jan 1 x leap) that occurs
        # between 1901 and 2099, so a pattern that matches nowhere in them matches nowhere at all.
        years = self.years if self.years is not None else range(2000, 2028)
        if not any(self.days_of(y, m) for y in years for m in self.months):
            raise CronSyntaxError(
                None, f"{self.text!r} never fires: no date matches its day of month, month, day of week and year"
            )

    def days_of(self, year: int, month: int) -> tuple[int, ...]:
        """The days of this month on which the expression fires (day of month AND day of week)."""
        if month not in self.months or (self.years is not None and year not in self.years):
            return ()
        return _month_days(self.dom, self.dow, year, month)

    def matches(self, wall: datetime) -> bool:
        """Whether the expression fires at this wall-clock minute (seconds ignored)."""
        on_day = wall.day in self.days_of(wall.year, wall.month)
        return on_day and wall.minute in self.minutes and wall.hour in self.hours

    def first_at_or_after(self, wall: datetime) -> datetime | None:
        """The first firing wall-clock minute at or after `wall` (naive), or None if none before MAX_YEAR ends."""
        t = wall.replace(second=0, microsecond=0, tzinfo=None, fold=0)
        if t < wall.replace(tzinfo=None, fold=0):
            t += timedelta(minutes=1)
        while t.year <= MAX_YEAR:
            if self.years is not None and t.year not in self.years:
                y = _next_in(self.years, t.year)
                if y is None:
                    return None
                t = datetime(y, 1, 1)
                continue
            if t.month not in self.months:
                m = _next_in(self.months, t.month)
                t = datetime(t.year, m, 1) if m is not None else datetime(t.year + 1, 1, 1)
                continue
            d = _next_in(self.days_of(t.year, t.month), t.day)
            if d is None:
                t = datetime(t.year + 1, 1, 1) if t.month == 12 else datetime(t.year, t.month + 1, 1)
                continue
            if d != t.day:
                t = datetime(t.year, t.month, d)
                continue
            h = _next_in(self.hours, t.hour)
            if h is None:
                t = datetime(t.year, t.month, t.day) + timedelta(days=1)
                continue
            if h != t.hour:
                t = t.replace(hour=h, minute=0)
                continue
            mi = _next_in(self.minutes, t.minute)
            if mi is None:
                t = t.replace(minute=0) + timedelta(hours=1)
                continue
            return t.replace(minute=mi)
        return None

    def next_local(self, wall: datetime) -> datetime | None:
        """The first firing wall-clock minute strictly after `wall`."""
        return self.first_at_or_after(wall.replace(second=0, microsecond=0) + timedelta(minutes=1))

    def __str__(self) -> str:
        return self.text


def parse_zone(name: str, field: str = "timezone") -> ZoneInfo:
    """An IANA zone by name ("Europe/Berlin", "UTC"), or a clear error."""
    try:
        if not name or name != name.strip() or name.startswith("/") or ".." in name:
            raise ValueError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidRequest(field, f"{name!r} is not an IANA time zone name (e.g. UTC, Europe/Berlin)") from None


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A cron expression in a time zone: the `Schedule` Metronome jobs use."""

    expression: CronExpression
    zone: tzinfo = UTC

    @classmethod
    def parse(cls, cron: str, timezone: str = "UTC") -> CronSchedule:
        return cls(CronExpression.parse(cron), parse_zone(timezone))

    def to_instant(self, wall: datetime) -> tuple[datetime, timedelta]:
        """The instant (UTC) a firing wall time stands for, and how far it was shifted (non-zero only in a gap)."""
        aware = wall.replace(tzinfo=self.zone, fold=0)  # fold=0: first occurrence; in a gap, the offset before it
        instant = aware.astimezone(UTC)
        back = instant.astimezone(self.zone).replace(tzinfo=None)
        return instant, back - wall

    def next_after(self, instant: datetime) -> datetime | None:
        """The first firing instant strictly after `instant` (aware), in UTC; None when the expression has no more."""
        if instant.tzinfo is None:
            raise ValueError("next_after needs an aware datetime (a naive one has no instant)")
        after = instant.astimezone(UTC)
        # A wall time L stands for L - offset(L), with the smaller (pre-gap) offset inside a gap, so every L whose
        # instant is later than `after` is at or after `after` + the smallest offset in force around it.
        day_before = (after - timedelta(days=1)).astimezone(self.zone).utcoffset()
        now_offset = after.astimezone(self.zone).utcoffset()
        assert day_before is not None and now_offset is not None
        wall = self.expression.first_at_or_after((after + min(day_before, now_offset)).replace(tzinfo=None))
        while wall is not None:
            at, shift = self.to_instant(wall)
            if at > after:
                if shift:
                    # A shifted time overtakes real wall times in (wall, wall + shift]; the earliest instant wins.
                    later = self.expression.next_local(wall)
                    while later is not None and later <= wall + shift:
                        other, _ = self.to_instant(later)
                        if after < other < at:
                            at = other
                        later = self.expression.next_local(later)
                return at
            wall = self.expression.next_local(wall)
        return None

    def describe(self) -> str:
        return f"cron {self.expression.text!r} in {self.zone}"
