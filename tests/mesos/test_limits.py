"""The bounds every Mesos format meets at admission (docs/limits.md), each named by its JSON path in the format's own
error shape: numbers that overflowed the engine (issue 12: `cpus: 1e308`, `mem: Infinity`, `instances: 1e9`), and
commands, environments and text that would fail at launch."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from corral.mesos import chronos as c
from corral.mesos import marathon as mr
from corral.mesos import metronome as m
from corral.mesos.errors import ObjectNotValid

NOW = datetime(2026, 5, 1, 12, tzinfo=UTC)


def metronome(**run: Any) -> dict[str, Any]:
    return {"id": "j", "run": {"cmd": "true", "cpus": 0.1, "mem": 32, "disk": 0, **run}}


def marathon(**app: Any) -> dict[str, Any]:
    return {"id": "/a", "cmd": "true", **app}


def chronos(**job: Any) -> dict[str, Any]:
    return {"name": "c", "command": "true", **job}


CASES: list[tuple[str, dict[str, Any], str, int]] = [
    ("metronome", metronome(mem=1e308), "/run/mem", 422),
    ("metronome", metronome(cpus=float("inf")), "/run/cpus", 422),
    ("metronome", metronome(gpus=10**9), "/run/gpus", 422),
    ("metronome", metronome(maxLaunchDelay=10**12), "/run/maxLaunchDelay", 422),
    ("metronome", metronome(cmd="a\x00b"), "/run/cmd", 422),
    ("metronome", metronome(cmd="x" * (300 * 1024)), "/run/cmd", 422),
    ("metronome", metronome(cmd=None, args=["echo", "\ud800"]), "/run/args/1", 422),
    ("metronome", metronome(env={"A=B": "1"}), "/run/env", 422),
    ("metronome", metronome(env={"K": "v\x00"}), "/run/env/K", 422),
    ("marathon", marathon(cpus=1e308), "/cpus", 422),
    ("marathon", marathon(mem=float("inf")), "/mem", 422),
    ("marathon", marathon(instances=10**9), "/instances", 422),
    ("marathon", marathon(instances=1001), "/instances", 422),
    ("marathon", marathon(backoffSeconds=1e300), "/backoffSeconds", 422),
    ("marathon", marathon(healthChecks=[{"gracePeriodSeconds": 10**15}]), "/healthChecks/0/gracePeriodSeconds", 422),
    ("marathon", marathon(env={"": "x"}), "/env", 422),
    ("marathon", marathon(env={"\x1b[31m": "x"}), "/env", 422),
    ("marathon", marathon(cmd=None, args=["a"] * 5000), "/args", 422),
    ("marathon", marathon(id="/" + "a" * 300), "/id", 422),
    ("chronos", chronos(mem=float("nan")), "/mem", 400),
    ("chronos", chronos(retries=10**6), "/retries", 400),
    ("chronos", chronos(maxCompletionTime=10**12), "/maxCompletionTime", 400),
    ("chronos", chronos(command="a\x00"), "/command", 400),
    ("chronos", chronos(shell=False, arguments=["x" * (129 * 1024)]), "/arguments/0", 400),
    ("chronos", chronos(environmentVariables=[{"name": "A=B", "value": "1"}]), "/environmentVariables", 400),
    ("chronos", chronos(description="\ud800"), "/description", 400),
    ("chronos", chronos(name="n" * 201), "/name", 400),
]


@pytest.mark.parametrize(("kind", "data", "path", "status"), CASES, ids=lambda v: repr(v)[:50])
def test_out_of_bounds_is_refused_at_its_path(kind: str, data: dict[str, Any], path: str, status: int) -> None:
    with pytest.raises(ObjectNotValid) as caught:
        if kind == "metronome":
            m.parse_job(data)
        elif kind == "marathon":
            mr.parse_app(data)
        else:
            c.parse_job(data, now=NOW)
    assert caught.value.status == status
    assert caught.value.errors_at(path), caught.value.to_json()


def test_values_at_the_bounds_are_accepted() -> None:
    m.parse_job(metronome(cpus=1_000_000, mem=2**40, gpus=1024, env={"K": "v" * 1000}))
    mr.parse_app(marathon(instances=1000, cpus=1_000_000))
    c.parse_job(chronos(retries=100, maxCompletionTime=316_224_000, shell=False, arguments=["a"] * 100), now=NOW)
