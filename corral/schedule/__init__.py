"""Schedules: cron expressions (Metronome), ISO 8601 repeating intervals (Chronos), and the missed-tick rule.

Everything here is pure: no sleeping and no reading of the system clock except through an injected `Clock`.
"""

from corral.schedule.clock import (
    Clock,
    ConcurrencyPolicy,
    CountingSchedule,
    FakeClock,
    Schedule,
    SystemClock,
    TickDecision,
    TickPolicy,
    due_ticks,
)
from corral.schedule.cron import CronExpression, CronSchedule, CronSyntaxError
from corral.schedule.iso8601 import (
    MIN_PERIOD_S,
    IsoDuration,
    RepeatingInterval,
    check_min_period,
    parse_duration,
    parse_repeating_interval,
)

__all__ = [
    "MIN_PERIOD_S",
    "Clock",
    "ConcurrencyPolicy",
    "CountingSchedule",
    "CronExpression",
    "CronSchedule",
    "CronSyntaxError",
    "FakeClock",
    "IsoDuration",
    "RepeatingInterval",
    "Schedule",
    "SystemClock",
    "TickDecision",
    "TickPolicy",
    "check_min_period",
    "due_ticks",
    "parse_duration",
    "parse_repeating_interval",
]
