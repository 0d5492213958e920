"""Points in time as people type them to `corral acct` (Slurm's sacct habits), in seconds since the epoch.

    2026-11-01, 2026-11-01T10:00, 2026-11-01 10:00:30   a date and time in local time (ISO 8601; an offset is kept)
    now, today (= midnight), yesterday                   now; the start of today or yesterday, local time
    now-7d, now-2h30m, now-1-12, now-3days, now+1h       now, minus (or plus) a duration (`parse_duration_seconds`,
                                                         or Slurm's words: seconds, minutes, hours, days, weeks)
    7d, 45m, 1:30:00                                      a duration ago, as `corral ps --since` reads it

Shared by the CLI (which sends the API plain numbers) and anything else that reads such text; imports nothing heavy.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from corral.model.errors import InvalidRequest

#: The latest time accepted: the end of year 9999 (what an ISO 8601 date can say), in seconds since the epoch.
MAX_TIME = 253402300799.0
TIME_EXAMPLES = "2026-11-01, 2026-11-01T10:00, now-7d, 7d (ago), today"
_RELATIVE = re.compile(r"now\s*([+-])\s*(.+)", re.IGNORECASE)
_SLURM_UNIT = re.compile(r"(\d+)\s*(seconds?|minutes?|hours?|days?|weeks?|w)", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_time(text: str, now: float, field: str = "time") -> float:
    """`text` as seconds since the epoch; InvalidRequest naming `field` for anything else, or a time outside
    1970..9999."""
    from corral.model.units import parse_duration_seconds

    t = text.strip()
    if not t or len(t) > 64:
        raise InvalidRequest(field, f"not a time: {text[:64]!r} (examples: {TIME_EXAMPLES})")
    lowered = t.lower()
    if lowered == "now":
        value = now
    elif lowered in ("today", "midnight", "yesterday"):
        midnight = datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
        value = (midnight - timedelta(days=1 if lowered == "yesterday" else 0)).timestamp()
    elif m := _RELATIVE.fullmatch(t):
        sign, amount = m.groups()
        value = now + (1 if sign == "+" else -1) * _duration(amount, field, text)
    else:
        try:
            value = datetime.fromisoformat(t).timestamp()
        except (ValueError, OverflowError, OSError):
            try:
                value = now - parse_duration_seconds(t, field)
            except InvalidRequest as exc:
                if "at most" in exc.message:  # a duration, but a huge one: say so
                    raise
                raise InvalidRequest(field, f"not a time: {text!r} (examples: {TIME_EXAMPLES})") from None
    if not 0 <= value <= MAX_TIME:
        raise InvalidRequest(
            field, f"{text!r} is {'before 1970' if value < 0 else 'after 9999'}: give a time from 1970 to 9999"
        )
    return value


def _duration(amount: str, field: str, text: str) -> float:
    from corral.model.units import parse_duration_seconds

    m = _SLURM_UNIT.fullmatch(amount.strip())
    if m:
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)[0].lower()]
        if seconds > 10 * 366 * 86400:
            raise InvalidRequest(field, f"must be at most ten years from now, got {text!r}")
        return seconds
    return parse_duration_seconds(amount, field)
