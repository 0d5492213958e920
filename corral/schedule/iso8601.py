"""Chronos schedules: ISO 8601 repeating intervals `R[n]/start/period` with an optional `scheduleTimeZone`.

    R/2014-03-08T20:00:00Z/PT2H      every 2 hours from the start, forever
    R3/2014-03-08T20:00:00Z/P1D      3 ticks: the start and the next two days at the same wall time
    R0/...                           no tick at all (Chronos disables such a job)
    R//PT10M                         an empty start means "now" (the injected clock's now)

Tick k (k = 0, 1, ...) is `start + k x period`, computed from the start each time rather than by adding the period
k times, so `P1M` from January 31 gives Feb 28/29, Mar 31, Apr 30 (Chronos added step by step and drifted to the
28th for good). The date part of the period (years, months, weeks, days) moves the wall clock in the zone, so `P1D`
keeps 09:00 across a daylight-saving change; the time part (hours, minutes, seconds) is elapsed time, so `PT24H` is
exactly 24 hours and shows 10:00 after clocks go forward. This is Joda-Time's `DateTime.plus(Period)`, which
Chronos uses. A wall time that does not exist is shifted forward by the gap (as for cron).

`scheduleTimeZone` keeps the start's wall-clock fields and replaces its offset (Chronos: `withZoneRetainFields`):
`R/2024-01-01T09:00:00Z/P1D` with `Europe/Berlin` fires at 09:00 Berlin time. Without it, the start's own offset is
a fixed zone (no daylight saving) and a start without an offset is UTC.

`Rn` counts ticks, not runs: a tick that passes while the daemon is down, or is collapsed into a later run (see
`corral.schedule.clock`), uses up one repetition just as Chronos' schedule stream does when it skips forward.

Cost: finding the first tick after an instant, or counting the ticks in a window, never walks over ticks (a
`PT0.001S` schedule started in 2020 has 10^11 of them). A period without a date part is exact integer arithmetic:
tick k is `start + floor(k x period)` in microseconds, so the index is one ceiling division. A period with a date
part (at least a day long) starts from a division by its average length and corrects the estimate with a few tick
evaluations (the calendar drifts from the average by days, not periods), bracketed and bisected so that even a bad
estimate costs O(log) evaluations. Admission also refuses periods shorter than `MIN_PERIOD_S` (see
`check_min_period`), so a schedule cannot ask for a run more often than the daemon can start one.
"""

from __future__ import annotations

import calendar
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from decimal import Decimal
from fractions import Fraction

from corral.model.errors import InvalidRequest
from corral.schedule.cron import parse_zone

_DURATION = re.compile(
    r"P(?:(?P<Y>\d+)Y)?(?:(?P<M>\d+)M)?(?:(?P<W>\d+)W)?(?:(?P<D>\d+)D)?"
    r"(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:[.,]\d+)?)S)?)?"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

#: The shortest period a schedule may have. A run is a process (fork, exec, a store write or three); a period shorter
#: than a second asks for more runs than any daemon starts, and every tick that cannot run is only bookkeeping. One
#: second is also the resolution of cron (a minute) made sixty times finer, which no peer offers: Chronos itself ran
#: jobs on a scheduler loop of seconds.
MIN_PERIOD_S = 1


@dataclass(frozen=True, slots=True)
class IsoDuration:
    """An ISO 8601 duration `PnYnMnWnDTnHnMnS`. `P10M` is ten months, `PT10M` ten minutes."""

    years: int = 0
    months: int = 0
    weeks: int = 0
    days: int = 0
    hours: int = 0
    minutes: int = 0
    seconds: Decimal = Decimal(0)

    @property
    def time_seconds(self) -> Decimal:
        return self.hours * 3600 + self.minutes * 60 + self.seconds

    @property
    def is_zero(self) -> bool:
        return not (self.years or self.months or self.weeks or self.days) and self.time_seconds == 0

    @property
    def has_date_part(self) -> bool:
        return bool(self.years or self.months or self.weeks or self.days)

    @property
    def elapsed_us(self) -> Fraction:
        """The time part in microseconds, exactly (a fraction when the seconds are finer than a microsecond)."""
        return Fraction(self.time_seconds) * 1_000_000

    def approx_seconds(self) -> float:
        days = self.years * 365.2425 + self.months * 30.436875 + self.weeks * 7 + self.days
        return days * 86400 + float(self.time_seconds)

    def shortest_seconds(self) -> Decimal:
        """A lower bound of the period's length: calendar months of 28 days, days of 23 hours (daylight saving)."""
        days = (self.years * 12 + self.months) * 28 + self.weeks * 7 + self.days
        return days * Decimal(23 * 3600) + self.time_seconds

    def add_to(self, start: datetime, times: int, zone: tzinfo) -> datetime:
        """`start` (aware) plus `times` x this duration: the date part on the wall clock of `zone`, then the time
        part as elapsed time. Returns UTC. Raises OverflowError past year 9999."""
        wall = start.astimezone(zone).replace(tzinfo=None)
        months = wall.month - 1 + (self.years * 12 + self.months) * times
        year = wall.year + months // 12
        month = months % 12 + 1
        if not 1 <= year <= 9999:
            raise OverflowError("date out of range")
        day = min(wall.day, calendar.monthrange(year, month)[1])
        wall = wall.replace(year=year, month=month, day=day) + timedelta(days=(self.weeks * 7 + self.days) * times)
        instant = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
        # Exact: floor(times x period) in whole microseconds (a float of the product drifts by microseconds far out).
        return instant + timedelta(microseconds=math.floor(self.elapsed_us * times))

    def __str__(self) -> str:
        units = ((self.years, "Y"), (self.months, "M"), (self.weeks, "W"), (self.days, "D"))
        date = "".join(f"{v}{u}" for v, u in units if v)
        secs = f"{self.seconds.normalize():f}" if self.seconds else ""
        time = "".join(f"{v}{u}" for v, u in ((self.hours, "H"), (self.minutes, "M"), (secs, "S")) if v)
        return "P" + date + ("T" + time if time else "") if (date or time) else "PT0S"


def parse_duration(text: str, field: str = "schedule") -> IsoDuration:
    m = _DURATION.fullmatch(text.strip())
    if m is None or text.strip() in ("P", "PT") or text.strip().endswith("T"):
        raise InvalidRequest(
            field, f"{text!r} is not an ISO 8601 duration like PT10M (10 minutes), P1D (1 day) or P1M (1 month)"
        )
    g = m.groupdict()
    return IsoDuration(
        years=int(g["Y"] or 0),
        months=int(g["M"] or 0),
        weeks=int(g["W"] or 0),
        days=int(g["D"] or 0),
        hours=int(g["h"] or 0),
        minutes=int(g["m"] or 0),
        seconds=Decimal((g["s"] or "0").replace(",", ".")),
    )


def parse_instant(text: str, field: str, zone: tzinfo | None = None) -> datetime:
    """An ISO 8601 date-time. With `zone`, its wall-clock fields are kept and its offset replaced by the zone."""
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidRequest(field, f"{text!r} is not an ISO 8601 date-time like 2014-03-08T20:00:00Z") from None
    if zone is not None:
        return parsed.replace(tzinfo=zone, fold=0)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class RepeatingInterval:
    """A parsed Chronos schedule: the `Schedule` of Chronos jobs. `repetitions` None = forever."""

    repetitions: int | None
    start: datetime  # aware
    period: IsoDuration
    zone: tzinfo

    def tick(self, k: int) -> datetime | None:
        """Tick k in UTC, or None when there is no such tick (past the repetitions or past year 9999)."""
        if k < 0 or (self.repetitions is not None and k >= self.repetitions):
            return None
        try:
            return self.period.add_to(self.start, k, self.zone)
        except OverflowError:
            return None

    def _later(self, k: int, instant: datetime) -> bool:
        """Whether tick k (repetitions ignored) is later than `instant`; a tick past year 9999 is later than all."""
        if k < 0:
            return False
        try:
            return self.period.add_to(self.start, k, self.zone) > instant
        except OverflowError:
            return True

    def index_after(self, instant: datetime) -> int:
        """The smallest k >= 0 whose tick is later than `instant` (ignoring the repetitions; may be past year 9999).

        O(1) for a period without a date part (one ceiling division); for a calendar period a division estimate
        corrected by a few tick evaluations, O(log) in the estimate's error at worst (see the module docstring)."""
        if instant.tzinfo is None:
            raise ValueError("index_after needs an aware datetime (a naive one has no instant)")
        instant = instant.astimezone(UTC)
        if not self.period.has_date_part:
            base = self.period.add_to(self.start, 0, self.zone)  # tick 0; tick k = base + floor(k x period) us
            behind = (instant - base) // _MICROSECOND
            if behind < 0:
                return 0
            # floor(k p) > behind  <=>  k p >= behind + 1  <=>  k >= (behind + 1) / p
            return math.ceil((behind + 1) / self.period.elapsed_us)
        if self._later(0, instant):
            return 0
        estimate = int((instant - self.start).total_seconds() / self.period.approx_seconds())
        return self._settle(max(estimate, 0), instant)

    def _settle(self, k: int, instant: datetime) -> int:
        """The smallest index whose tick is later than `instant`, searched from the estimate `k`: gallop away from
        it until the answer is bracketed, then bisect (ticks of a calendar period increase with k)."""
        step = 1
        if self._later(k, instant):
            hi = k
            lo = hi - step
            while self._later(lo, instant):  # _later(-1) is False: this stops
                hi, step = lo, step * 2
                lo = hi - step
        else:
            lo = k
            hi = lo + step
            while not self._later(hi, instant):
                lo, step = hi, step * 2
                hi = lo + step
        while hi - lo > 1:  # invariant: tick(lo) <= instant < tick(hi)
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if self._later(mid, instant) else (mid, hi)
        return hi

    def ticks_in(self, since: datetime, until: datetime) -> tuple[int, datetime | None]:
        """How many ticks fall in (since, until], and the latest of them: two index computations, no walk."""
        first, end = self.index_after(since), self.index_after(until)
        if self.repetitions is not None:
            first, end = min(first, self.repetitions), min(end, self.repetitions)
        if end <= first:
            return 0, None
        return end - first, self.tick(end - 1)

    def next_after(self, instant: datetime) -> datetime | None:
        if instant.tzinfo is None:
            raise ValueError("next_after needs an aware datetime (a naive one has no instant)")
        return self.tick(self.index_after(instant))

    def remaining_after(self, instant: datetime) -> int | None:
        """Ticks still to come after `instant` (Chronos' n in `Rn`); None = forever."""
        if self.repetitions is None:
            return None
        return max(self.repetitions - self.index_after(instant), 0)

    def rewritten(self, after: datetime) -> str:
        """The schedule as Chronos echoes it once ticks up to `after` have passed: `R{left}/{next tick}/{period}`."""
        k = self.index_after(after)
        left = None if self.repetitions is None else max(self.repetitions - k, 0)
        nxt = self.tick(k) if left != 0 else None
        when = (nxt or self.start).astimezone(self.zone).isoformat(timespec="milliseconds")
        return f"R{'' if left is None else left}/{when.replace('+00:00', 'Z')}/{self.period}"

    def describe(self) -> str:
        times = "forever" if self.repetitions is None else f"{self.repetitions} times"
        return f"every {self.period} from {self.start.isoformat()} ({times}) in {self.zone}"


def check_min_period(interval: RepeatingInterval, field: str = "schedule") -> None:
    """Refuse a period shorter than `MIN_PERIOD_S` (at admission: a stored schedule is read as it was admitted)."""
    if interval.period.shortest_seconds() < MIN_PERIOD_S:
        raise InvalidRequest(
            field,
            f"period {interval.period} is shorter than the minimum of {MIN_PERIOD_S} second: every tick starts a "
            f"run, and corral starts runs at most once a second per schedule (use PT{MIN_PERIOD_S}S or longer)",
        )


def parse_repeating_interval(
    text: str, timezone_name: str = "", *, now: datetime, field: str = "schedule"
) -> RepeatingInterval:
    """`R[n]/start/period`; `now` (aware) stands for an empty start. Errors name `field`."""
    parts = text.strip().split("/")
    if len(parts) != 3 or not parts[0].startswith("R"):
        raise InvalidRequest(
            field, f"{text!r} is not an ISO 8601 repeating interval R[n]/start/period, e.g. R/2014-03-08T20:00:00Z/PT2H"
        )
    reps_text, start_text, period_text = parts
    if reps_text != "R" and not reps_text[1:].isdigit():
        raise InvalidRequest(field, f"repetitions {reps_text!r} must be R (forever) or Rn with n a whole number >= 0")
    repetitions = None if reps_text == "R" else int(reps_text[1:])
    zone: tzinfo | None = parse_zone(timezone_name, "scheduleTimeZone") if timezone_name else None
    if start_text:
        start = parse_instant(start_text, field, zone)
    else:
        if now.tzinfo is None:
            raise ValueError("now must be aware")
        start = now.astimezone(zone or UTC)
    if start < _EPOCH:
        raise InvalidRequest(field, f"start {start_text!r} is before 1970-01-01T00:00:00Z")
    period = parse_duration(period_text, field)
    if period.is_zero:
        raise InvalidRequest(field, f"period {period_text!r} must be longer than zero")
    if zone is None:
        offset = start.utcoffset()
        zone = UTC if not offset else timezone(offset)
    return RepeatingInterval(repetitions, start, period, zone)
