"""Schedules: cron expressions (Metronome), ISO 8601 repeating intervals (Chronos), and the missed-tick rule.

Everything here is pure: no sleeping and no reading of the system clock except through an injected `Clock`.
"""

from corral.schedule.clock import (
    Clock,
    ConcurrencyPolicy,
    FakeClock,
    Schedule,
    SystemClock,
    TickDecision,
    TickPolicy,
    due_ticks,
)
from corral.schedule.cron import CronExpression, CronSchedule, CronSyntaxError
from corral.schedule.iso8601 import IsoDuration, RepeatingInterval, parse_duration, parse_repeating_interval

__all__ = [
    "Clock",
    "ConcurrencyPolicy",
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
    "due_ticks",
    "parse_duration",
    "parse_repeating_interval",
]
