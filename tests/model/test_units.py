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


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 5400),  # MM: a bare number is minutes in a time limit, as Slurm's --time
        ("1:30", 90),  # MM:SS
        ("90:00", 5400),  # MM:SS, the minutes over an hour
        ("1:30:00", 5400),  # HH:MM:SS
        ("36:00:00", 129600),  # HH:MM:SS past a day
        ("2-12", 216000),  # D-HH
        ("2-12:30", 217800),  # D-HH:MM
        ("2-12:30:15", 217815),  # D-HH:MM:SS
        ("0-0:0:1", 1),
        ("45m", 2700),
        ("2h", 7200),
    ],
)
def test_slurm_time_limits(text: str, seconds: float) -> None:
    assert parse_duration_seconds(text, "time_limit", bare="minutes") == seconds


def test_slurm_forms_are_accepted_where_a_bare_number_is_seconds() -> None:
    assert parse_duration_seconds("1:30:00", "--since") == 5400
    assert parse_duration_seconds("90", "--since") == 90


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1:75:00", "time_limit: not a duration: '1:75:00': minutes must be below 60 there"),
        ("10:61", "time_limit: not a duration: '10:61': seconds must be below 60 there"),
        ("1-24", "time_limit: not a duration: '1-24': hours must be below 24 there"),
        ("1:2:3:4", "time_limit: not a duration: '1:2:3:4' (examples: 90, 45m, 2h, 1h30m, 1:30:00, 2-12)"),
        ("-1", "time_limit: not a duration: '-1' (examples:"),
        ("1-", "time_limit: not a duration: '1-' (examples:"),
        ("99999-23:00:00", "time_limit: must be at most 316224000 seconds (ten years), got '99999-23:00:00'"),
    ],
)
def test_bad_slurm_times_say_why(text: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_duration_seconds(text, "time_limit", bare="minutes")
    assert str(caught.value).startswith(message) or f"{caught.value.field}: {caught.value.message}".startswith(
        message
    ), str(caught.value)


def test_bad_quantities_say_what_is_expected() -> None:
    with pytest.raises(InvalidRequest, match="memory: not a memory amount: '10 parsecs'"):
        parse_memory_mib("10 parsecs")
    with pytest.raises(InvalidRequest, match="cpus: not a CPU amount: '2GiB'"):
        parse_cpu_milli("2GiB")
    with pytest.raises(InvalidRequest, match="must be a non-negative amount"):
        parse_cpu_milli(-1)
    with pytest.raises(InvalidRequest, match="time limit: not a duration: '2 fortnights'"):
        parse_duration_seconds("2 fortnights")
