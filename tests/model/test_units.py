from __future__ import annotations

import pytest

from corral.model.errors import InvalidRequest
from corral.model.units import parse_cpu_milli, parse_duration_seconds, parse_memory_mib


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("10GiB", 10240),
        ("10Gi", 10240),
        ("512MiB", 512),
        ("512Mi", 512),
        ("1G", 954),
        ("1.5GiB", 1536),
        ("2TiB", 2 * 1024 * 1024),
        ("1048576", 1),
        (16, 16),
    ],
)
def test_memory(text: str | int, mib: int) -> None:
    assert parse_memory_mib(text) == mib


@pytest.mark.parametrize(("text", "milli"), [("2", 2000), ("0.5", 500), ("250m", 250), (1.5, 1500)])
def test_cpu(text: str | float, milli: int) -> None:
    assert parse_cpu_milli(text) == milli


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("45m", 2700), ("2h", 7200), ("1h30m", 5400), ("1d", 86400)])
def test_duration(text: str, seconds: float) -> None:
    assert parse_duration_seconds(text) == seconds


def test_bad_quantities_say_what_is_expected() -> None:
    with pytest.raises(InvalidRequest, match="memory: not a memory amount: '10 parsecs'"):
        parse_memory_mib("10 parsecs")
    with pytest.raises(InvalidRequest, match="cpus: not a CPU amount: '2GiB'"):
        parse_cpu_milli("2GiB")
    with pytest.raises(InvalidRequest, match="must be a non-negative amount"):
        parse_cpu_milli(-1)
    with pytest.raises(InvalidRequest, match="time limit: not a duration: '2 fortnights'"):
        parse_duration_seconds("2 fortnights")
