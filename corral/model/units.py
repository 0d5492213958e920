"""Conversion of human quantities ("10GiB", "2.5", "500m", "2h") into corral's integer base units.

Only the faces call these: the core model works in CPU milli, memory MiB, GPU milli and GPU memory MiB.
"""

from __future__ import annotations

import math
import re

from corral.model.errors import InvalidRequest
from corral.model.resources import MAX_QUANTITY

#: A quantity is a short text; a longer one is refused before it is parsed (float("9" * 10**6) is slow, and inf).
MAX_QUANTITY_TEXT = 64
#: The longest duration (a time limit): ten years, far beyond any job, well inside what datetime can add.
MAX_DURATION_S = 10 * 366 * 86400.0

_MEM_UNITS = {
    "": 1.0 / (1024 * 1024),  # a bare number is bytes, as in Kubernetes quantities
    "b": 1.0 / (1024 * 1024),
    "k": 1000 / 1024 / 1024,
    "kb": 1000 / 1024 / 1024,
    "ki": 1 / 1024,
    "kib": 1 / 1024,
    "m": 1000**2 / 1024**2,
    "mb": 1000**2 / 1024**2,
    "mi": 1.0,
    "mib": 1.0,
    "g": 1000**3 / 1024**2,
    "gb": 1000**3 / 1024**2,
    "gi": 1024.0,
    "gib": 1024.0,
    "t": 1000**4 / 1024**2,
    "tb": 1000**4 / 1024**2,
    "ti": 1024.0**2,
    "tib": 1024.0**2,
}
_QTY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_memory_mib(text: str | int | float, field: str = "memory") -> int:
    """'10GiB' -> 10240, '512Mi' -> 512, '1G' -> 954; rounds up to whole MiB. Bare numbers are bytes."""
    limit = MAX_QUANTITY["memory_mib"]
    if isinstance(text, int | float):
        if text < 0 or not math.isfinite(text):
            raise InvalidRequest(field, f"must be a non-negative amount, got {text!r}")
        value = float(text)
    else:
        m = _QTY.match(text) if len(text) <= MAX_QUANTITY_TEXT else None
        if not m or m.group(2).lower() not in _MEM_UNITS:
            shown = text if len(text) <= MAX_QUANTITY_TEXT else text[:MAX_QUANTITY_TEXT] + "..."
            raise InvalidRequest(field, f"not a memory amount: {shown!r} (examples: 512MiB, 10GiB, 16Gi, 2TB)")
        value = float(m.group(1)) * _MEM_UNITS[m.group(2).lower()] - 1e-9
    if not math.isfinite(value) or value > limit:
        raise InvalidRequest(field, f"must be at most {limit} MiB (1 EiB), got {text!r}")
    return max(0, math.ceil(value))


def parse_cpu_milli(text: str | int | float, field: str = "cpus") -> int:
    """'2' -> 2000, '0.5' -> 500, '250m' -> 250."""
    if isinstance(text, int | float):
        value = float(text) * 1000
    else:
        m = _QTY.match(text) if len(text) <= MAX_QUANTITY_TEXT else None
        if not m or m.group(2) not in {"", "m"}:
            shown = text if len(text) <= MAX_QUANTITY_TEXT else text[:MAX_QUANTITY_TEXT] + "..."
            raise InvalidRequest(field, f"not a CPU amount: {shown!r} (examples: 2, 0.5, 250m)")
        value = float(m.group(1)) * (1 if m.group(2) == "m" else 1000)
    if value < 0 or not math.isfinite(value):
        raise InvalidRequest(field, f"must be a non-negative amount, got {text!r}")
    if value > MAX_QUANTITY["cpu_milli"]:
        raise InvalidRequest(field, f"must be at most {MAX_QUANTITY['cpu_milli'] // 1000} CPUs, got {text!r}")
    return math.ceil(value - 1e-9)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: Slurm's --time spellings: D-HH, D-HH:MM, D-HH:MM:SS, and MM:SS, HH:MM:SS (a bare number is the caller's unit).
_SLURM_DAYS = re.compile(r"(\d{1,5})-(\d{1,2})(?::(\d{1,2})(?::(\d{1,2}))?)?")
_SLURM_CLOCK = re.compile(r"(\d{1,9}):(\d{1,2})(?::(\d{1,2}))?")
DURATION_EXAMPLES = "90, 45m, 2h, 1h30m, 1:30:00, 2-12"


def _slurm_seconds(text: str, field: str, original: str) -> float | None:
    """Slurm's colon and day forms in seconds; None when `text` is in neither. A part after the first must be a
    clock's (minutes and seconds below 60, hours below 24 after a day count): "1:75:00" is a typo, not 2h15m."""
    parts: tuple[tuple[int, int, str], ...]
    if m := _SLURM_DAYS.fullmatch(text):
        days, hours, minutes, seconds = (int(g) if g is not None else 0 for g in m.groups())
        parts = ((hours, 24, "hours"), (minutes, 60, "minutes"), (seconds, 60, "seconds"))
    elif m := _SLURM_CLOCK.fullmatch(text):
        a, b, c = m.groups()
        days = 0
        if c is None:  # MM:SS
            hours, minutes, seconds = 0, int(a), int(b)
            parts = ((seconds, 60, "seconds"),)
        else:  # HH:MM:SS
            hours, minutes, seconds = int(a), int(b), int(c)
            parts = ((minutes, 60, "minutes"), (seconds, 60, "seconds"))
    else:
        return None
    for value, bound, name in parts:
        if value >= bound:
            raise InvalidRequest(field, f"not a duration: {original!r}: {name} must be below {bound} there")
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def parse_duration_seconds(text: str, field: str = "time limit", *, bare: str = "seconds") -> float:
    """'90' -> 90.0, '2h' -> 7200.0, '1h30m' -> 5400.0, and Slurm's --time forms: '1:30' (MM:SS) -> 90.0,
    '1:30:00' (HH:MM:SS) -> 5400.0, '2-12' (D-HH) -> 216000.0, '2-12:30', '2-12:30:15'.

    `bare`: the unit of a bare number: "seconds", or "minutes" for a job's time limit, as Slurm's --time reads it
    ('90' -> 5400.0)."""
    stripped = text.strip()
    if len(stripped) > MAX_QUANTITY_TEXT:
        raise InvalidRequest(
            field, f"not a duration: at most {MAX_QUANTITY_TEXT} characters (examples: {DURATION_EXAMPLES})"
        )
    if re.fullmatch(r"\d+(?:\.\d+)?", stripped):
        seconds = float(stripped) * (60 if bare == "minutes" else 1)
    elif (slurm := _slurm_seconds(stripped, field, text)) is not None:
        seconds = slurm
    else:
        parts = _DURATION.findall(stripped)
        if not parts or "".join(n + u for n, u in parts) != stripped.replace(" ", ""):
            raise InvalidRequest(field, f"not a duration: {text!r} (examples: {DURATION_EXAMPLES})")
        seconds = sum(float(n) * _DURATION_SECONDS[u] for n, u in parts)
    if not seconds <= MAX_DURATION_S:
        raise InvalidRequest(field, f"must be at most {MAX_DURATION_S:.0f} seconds (ten years), got {text!r}")
    return seconds
