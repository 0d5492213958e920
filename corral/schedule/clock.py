"""Clocks, the `Schedule` protocol, and the rule for ticks that came due while nobody was looking.

The daemon never sleeps on a schedule's behalf inside this package: it asks `due_ticks(schedule, cursor, now, ...)`
what to do now, acts on the answer, persists `decision.cursor`, and wakes up again at `decision.next_tick`. Tests
drive the same function with a `FakeClock`.

The missed-tick rule (also in docs/schedules.md):

    ticks in (cursor, now]   ->  all but the latest are missed (never back-filled: 30 missed minutely runs do not
                                 start 30 copies)
                                 the latest runs, if it is still within its starting deadline
                                 (now <= tick + startingDeadlineSeconds; no deadline = always),
                                 unless FORBID and a run of the job is active (then it is skipped, no error),
                                 or the schedule is disabled (then nothing runs)
    the run started for tick T must be ACTIVE by T + startingDeadlineSeconds, or it is aborted as FAILED

Metronome dropped every tick missed while it was down; corral still runs the latest one when the daemon is back
within that tick's starting deadline, which is exactly the lateness Metronome accepts for a run that waits for
resources. Chronos jobs have no deadline (Chronos 3 removed `epsilon` to "never skip a job"), so all their missed
ticks collapse into one run, as Chronos does when it skips its schedule forward.

Cost: the daemon asks this under its lock, so no answer walks over ticks. A schedule that can count its ticks in a
window by arithmetic (`CountingSchedule`: ISO 8601 intervals) answers in a few tick evaluations however many ticks
passed. Any other schedule (cron) finds the latest tick by bisecting the window with `next_after` (about 60 calls
for a century, 2 when a tick just passed) and counts passed ticks one by one only up to `MISSED_COUNT_CAP`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Protocol, runtime_checkable

#: How many passed ticks `due_ticks` counts one by one (cron) before it reports "at least this many": a few ms.
#: ISO 8601 intervals count any number exactly, by arithmetic.
MISSED_COUNT_CAP = 200


class Clock(Protocol):
    def now(self) -> datetime:
        """The current instant, aware (UTC)."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("FakeClock needs an aware start time")
        self._now = start.astimezone(UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float = 0, **delta: float) -> datetime:
        step = timedelta(seconds=seconds, **delta)
        if step < timedelta(0):
            raise ValueError("a clock does not go backwards")
        self._now += step
        return self._now

    def set(self, when: datetime) -> datetime:
        self._now = when.astimezone(UTC)
        return self._now


@runtime_checkable
class Schedule(Protocol):
    def next_after(self, instant: datetime) -> datetime | None:
        """The first tick strictly after `instant` (aware), in UTC; None when there are no more ticks."""
        ...

    def describe(self) -> str: ...


@runtime_checkable
class CountingSchedule(Schedule, Protocol):
    def ticks_in(self, since: datetime, until: datetime) -> tuple[int, datetime | None]:
        """How many ticks fall in (since, until], and the latest of them, without walking over them."""
        ...


class ConcurrencyPolicy(StrEnum):
    ALLOW = "ALLOW"  # a tick starts a run even while another run of the job is active
    FORBID = "FORBID"  # a tick during an active run is skipped (silently); manual runs are not affected


@dataclass(frozen=True, slots=True)
class TickPolicy:
    starting_deadline_s: float | None = 900.0  # None: no deadline (Chronos 3)
    concurrency: ConcurrencyPolicy = ConcurrencyPolicy.ALLOW
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class TickDecision:
    run: datetime | None  # the tick to start a run for now (its scheduled instant)
    run_deadline: datetime | None  # that run must be ACTIVE by then, else it is aborted as FAILED
    skipped_by_forbid: datetime | None  # a due tick that was not run because FORBID and a run was active
    passed: int  # ticks in (cursor, now]: exact for intervals, counted up to MISSED_COUNT_CAP for cron
    missed: int  # of those, how many will never run (late, collapsed, disabled)
    count_capped: bool  # passed/missed are lower bounds
    cursor: datetime  # persist this: the latest tick now handled (the old cursor if none passed)
    next_tick: datetime | None  # the next tick after now: when to ask again


def _latest_at_or_before(schedule: Schedule, since: datetime, now: datetime) -> datetime | None:
    """The latest tick in (since, now], for a schedule that only knows `next_after`: bisect the window, keeping
    `candidate` a tick <= now and no tick in (hi, now]. Each step halves hi - candidate, so a century costs about
    52 steps of two calls; the common case (one tick just passed) ends at the first check."""
    candidate = schedule.next_after(since)
    if candidate is None or candidate > now:
        return None
    hi = now
    while True:
        following = schedule.next_after(candidate)
        if following is None or following > now:
            return candidate
        candidate = following  # <= hi, as no tick is in (hi, now]
        mid = candidate + (hi - candidate) / 2
        probe = schedule.next_after(mid)
        if probe is not None and probe <= now:
            candidate = probe
        else:
            hi = mid


def _walk_ticks_in(schedule: Schedule, since: datetime, now: datetime) -> tuple[int, datetime | None, bool]:
    latest = _latest_at_or_before(schedule, since, now)
    if latest is None:
        return 0, None, False
    passed = 0
    t: datetime | None = schedule.next_after(since)
    while t is not None and t <= latest:
        passed += 1
        if passed >= MISSED_COUNT_CAP:
            return passed, latest, True
        t = schedule.next_after(t)
    return passed, latest, False


def _later_by(t: datetime, seconds: float | None) -> datetime | None:
    """`t` + `seconds`; None for no deadline, or for one past what a datetime holds (a startingDeadlineSeconds of
    10^12 is no deadline in practice, and must not fail every round of every schedule with an OverflowError)."""
    if seconds is None:
        return None
    try:
        return t + timedelta(seconds=seconds)
    except OverflowError:
        return None


def due_ticks(
    schedule: Schedule,
    cursor: datetime,
    now: datetime,
    policy: TickPolicy = TickPolicy(),
    *,
    active_runs: int = 0,
) -> TickDecision:
    """What to do about the ticks in (cursor, now]. `cursor` is the last tick already handled (or the time the
    schedule was created); `active_runs` the job's runs not yet finished, of any kind."""
    if cursor.tzinfo is None or now.tzinfo is None:
        raise ValueError("cursor and now must be aware datetimes")
    cursor, now = cursor.astimezone(UTC), now.astimezone(UTC)
    passed, latest, capped = 0, None, False
    if now > cursor:
        if isinstance(schedule, CountingSchedule):
            passed, latest = schedule.ticks_in(cursor, now)
        else:
            passed, latest, capped = _walk_ticks_in(schedule, cursor, now)
    next_tick = schedule.next_after(max(now, cursor))
    if latest is None:
        return TickDecision(None, None, None, 0, 0, False, cursor, next_tick)

    deadline_s = policy.starting_deadline_s
    deadline = _later_by(latest, deadline_s)
    in_time = deadline is None or now <= deadline
    run: datetime | None = None
    forbidden: datetime | None = None
    if policy.enabled and in_time:
        if policy.concurrency is ConcurrencyPolicy.FORBID and active_runs > 0:
            forbidden = latest
        else:
            run = latest
    run_deadline = _later_by(run, deadline_s) if run is not None else None
    missed = passed - (1 if run is not None or forbidden is not None else 0)
    return TickDecision(run, run_deadline, forbidden, passed, missed, capped, latest, next_tick)
