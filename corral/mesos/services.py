"""Pure rules for services (Marathon apps) that the daemon applies: launch back-off, health checks, which instances
a scale-down kills, and the bounds of a rolling upgrade.

Launch back-off (Marathon): after an instance ends, its replacement waits. The first wait is `backoffSeconds`, each
further one is `backoffFactor` times the last, capped at `maxLaunchDelaySeconds`: 1, 1.15, 1.3225, ... s by
default. Ending counts whether it failed or finished (`TASK_FINISHED` too: a service is not supposed to exit); a kill
(scale-down, a user's kill) does not. A new app version resets the delay, as does a quiet spell: no ending for the
current delay plus `maxLaunchDelaySeconds` after the last one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

from corral.mesos.model import BackoffPolicy, HealthCheckRule, UpgradeRule

#: Task endings that grow the launch delay. `TASK_UNHEALTHY` is corral's name for "killed by its health check".
COUNTED = frozenset({"TASK_FAILED", "TASK_FINISHED", "TASK_LOST", "TASK_ERROR", "TASK_GONE", "TASK_UNHEALTHY"})


def launch_delays(policy: BackoffPolicy) -> Iterator[float]:
    """The waits after the 1st, 2nd, 3rd ... counted ending in a row: 1, 1.15, 1.3225 ... capped."""
    delay = min(policy.backoff_s, policy.max_delay_s)
    while True:
        yield delay
        delay = min(delay * policy.factor, policy.max_delay_s)


@dataclass(frozen=True, slots=True)
class Backoff:
    version: str = ""
    delay_s: float = 0.0  # the current wait; 0 = none
    last_end: datetime | None = None

    def launch_not_before(self) -> datetime | None:
        """When a replacement may launch (None: at once)."""
        if self.last_end is None or self.delay_s == 0:
            return None
        return self.last_end + timedelta(seconds=self.delay_s)


def on_instance_end(policy: BackoffPolicy, state: Backoff, status: str, now: datetime, version: str) -> Backoff:
    if version != state.version:
        state = Backoff(version=version)
    if status not in COUNTED:
        return state
    if state.last_end is not None:
        quiet = timedelta(seconds=state.delay_s + policy.max_delay_s)
        if now - state.last_end > quiet:
            state = Backoff(version=version)
    if state.delay_s == 0:
        delay = min(policy.backoff_s, policy.max_delay_s)
    else:
        delay = min(state.delay_s * policy.factor, policy.max_delay_s)
    return Backoff(version, delay, now)


def reset_delay(state: Backoff) -> Backoff:
    """`DELETE /v2/queue/{app}/delay`."""
    return replace(state, delay_s=0.0, last_end=None)


# ------------------------------------------------------------------------------------------------ health checks
@dataclass(frozen=True, slots=True)
class Health:
    started_at: datetime
    consecutive_failures: int = 0
    healthy: bool | None = None  # None until the first result counts
    ever_healthy: bool = False


def on_check(rule: HealthCheckRule, state: Health, ok: bool, now: datetime) -> tuple[Health, bool]:
    """Record one health-check result; returns the new state and whether to kill the instance. Failures inside the
    grace period (from the start, until the first success) do not count; `maxConsecutiveFailures` 0 never kills."""
    if ok:
        return Health(state.started_at, 0, True, True), False
    in_grace = not state.ever_healthy and now < state.started_at + timedelta(seconds=rule.grace_period_s)
    if in_grace:
        return state, False
    failures = state.consecutive_failures + 1
    new = Health(state.started_at, failures, False, state.ever_healthy)
    return new, rule.max_consecutive_failures > 0 and failures >= rule.max_consecutive_failures


# -------------------------------------------------------------------------------------------------- scaling
def pick_victims(
    instances: Sequence[tuple[str, datetime]],
    count: int,
    selection: Literal["YOUNGEST_FIRST", "OLDEST_FIRST"],
) -> list[str]:
    """Which instances (id, started at) a scale-down kills: the youngest first (default) or the oldest."""
    ordered = sorted(instances, key=lambda i: (i[1], i[0]), reverse=selection == "YOUNGEST_FIRST")
    return [i for i, _ in ordered[: max(count, 0)]]


def upgrade_bounds(instances: int, rule: UpgradeRule) -> tuple[int, int]:
    """(instances that must stay healthy, most instances running at once) during a rolling upgrade."""
    keep = math.ceil(rule.minimum_health_capacity * instances)
    most = instances + math.floor(rule.maximum_over_capacity * instances)
    return keep, most
