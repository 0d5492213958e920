"""Health checks: grace period, consecutive failures, the kill and the replacement; real TCP, HTTP and command checks
on worker threads."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.services.health import HealthChecker
from corral.services.ports import PortAllocator
from tests.services.helpers import ALICE, World

TCP_CHECK = {"protocol": "TCP", "gracePeriodSeconds": 10, "intervalSeconds": 2, "timeoutSeconds": 1,
             "maxConsecutiveFailures": 3}  # fmt: skip


def test_failures_in_the_grace_period_do_not_count_then_the_instance_is_killed_and_replaced(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.create(instances=2, healthChecks=[TCP_CHECK])
    world.tick()
    world.tick()  # the round after the launch asks for the first checks
    first, second = world.running()
    assert world.checker.answer(False) == 2  # at once, inside the grace period
    for _ in range(3):
        world.tick(2.0)
        world.checker.answer({first.id: False})
    assert not world.executor.cancelled, "failures inside the grace period were counted"
    world.tick(4.0)  # past the grace period (10 s) now
    for n in range(3):
        world.checker.answer({first.id: False}, "connection refused")
        world.tick(2.0)
        killed = [j for j, _ in world.executor.cancelled]
        assert killed == ([first.id] if n == 2 else []), f"after {n + 1} failures"
    app = world.controller.apps["/web"]
    world.tick()  # the kill is seen: the replacement waits the launch delay (a health kill counts)
    assert app.backoff().delay_s == 1.0 and len(world.live()) == 1
    failure = app.state["lastTaskFailure"]
    assert failure["state"] == "TASK_UNHEALTHY" and failure["message"] == (
        "unhealthy: TCP health check failed 3 times in a row (connection refused)"
    )
    world.tick(1.0)
    assert len(world.running()) == 2 and second.id in {j.id for j in world.running()}


def test_a_success_resets_the_count_and_max_consecutive_failures_0_never_kills(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.create(healthChecks=[{**TCP_CHECK, "gracePeriodSeconds": 0}])
    world.create(id="/never", healthChecks=[{**TCP_CHECK, "gracePeriodSeconds": 0, "maxConsecutiveFailures": 0}])
    world.tick()
    world.tick()
    for ok in [False, False, True, False, False, True] * 2:
        world.checker.answer(ok)
        world.tick(2.0)
    assert not world.executor.cancelled
    (never,) = world.running("/never")
    for _ in range(5):
        world.checker.answer({never.id: False})
        world.tick(2.0)
    assert [j.spec.origin for j in world.live("/web") + world.live("/never")] == [
        "marathon:/web:web.1", "marathon:/never:never.1",
    ]  # fmt: skip
    health = world.controller.health_of(never.id)
    assert health is not None and health.states[0].consecutive_failures == 5 and health.states[0].healthy is False


def test_new_instances_must_be_healthy_before_old_ones_are_replaced(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.create(instances=1, healthChecks=[{**TCP_CHECK, "gracePeriodSeconds": 0}])
    world.tick()
    world.tick()
    world.checker.answer(True)
    world.tick(2.0)
    world.controller.restart(world.daemon, "/web")
    world.tick()
    assert len(world.live()) == 2 and not world.executor.cancelled
    world.checker.answer(False)  # the new instance is not healthy yet: the old one stays
    world.tick(2.0)
    assert not world.executor.cancelled
    world.checker.answer(True)
    world.tick(2.0)
    world.tick()
    assert [j.spec.origin for j in world.live()] == ["marathon:/web:web.2"]


# ------------------------------------------------------------------------------------------------ real checks
def real_world(tmp_path: Path, free: Any = None) -> World:
    world = World(tmp_path)
    checker = HealthChecker(workers=2)
    world.checker = checker  # type: ignore[assignment]
    world.controller.checker = checker
    if free is not None:
        world.controller.ports = PortAllocator(40000, 40099, free=free)
    return world


def settle(world: World, seconds: float) -> None:
    """One round, then wait for the probes it started (they run on worker threads), then the round that reads them."""
    world.tick(seconds)
    checker = world.controller.checker
    assert isinstance(checker, HealthChecker)
    assert checker.wait_idle(10)
    world.tick()


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_tcp_check_against_a_port_nothing_listens_on_takes_the_instance_out(tmp_path: Path) -> None:
    world = real_world(tmp_path)
    port = unused_port()
    check = {**TCP_CHECK, "gracePeriodSeconds": 0, "maxConsecutiveFailures": 2, "port": port}
    world.create(healthChecks=[check])
    first = None
    for _ in range(4):
        settle(world, 2.0)
        first = first or world.running()[0]
    assert [j for j, _ in world.executor.cancelled] == [first.id if first else ""]
    settle(world, 1.0)
    settle(world, 1.0)
    (replacement,) = world.live()
    assert replacement.id != (first.id if first else "")
    world.controller.checker.close()  # type: ignore[attr-defined]


class Flaky(http.server.BaseHTTPRequestHandler):
    healthy = True

    def do_GET(self) -> None:
        self.send_response(200 if Flaky.healthy else 503)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Flaky.healthy = True
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_an_http_check_that_starts_failing_takes_the_instance_out_and_a_new_one_replaces_it(
    tmp_path: Path, server: int
) -> None:
    world = real_world(tmp_path, free=lambda _: True)
    check = {"protocol": "HTTP", "path": "/health", "gracePeriodSeconds": 0, "intervalSeconds": 2,
             "timeoutSeconds": 1, "maxConsecutiveFailures": 2}  # fmt: skip
    world.create(requirePorts=True, portDefinitions=[{"port": server}], healthChecks=[check])
    settle(world, 0)
    settle(world, 2.0)
    (first,) = world.running()
    health = world.controller.health_of(first.id)
    assert health is not None and health.states[0].healthy is True and "HTTP 200" in health.last_message[0]
    Flaky.healthy = False
    for _ in range(2):
        settle(world, 2.0)
    settle(world, 2.0)
    assert [j for j, _ in world.executor.cancelled] == [first.id]
    assert "HTTP 503" in world.controller.apps["/web"].state["lastTaskFailure"]["message"]
    Flaky.healthy = True
    settle(world, 1.0)
    settle(world, 2.0)
    (second,) = world.running()
    assert second.id != first.id
    h = world.controller.health_of(second.id)
    assert h is not None and h.states[0].healthy is True
    world.controller.checker.close()  # type: ignore[attr-defined]


def test_a_command_check_runs_in_the_instances_environment(tmp_path: Path) -> None:
    world = real_world(tmp_path, free=lambda _: True)
    check = {"protocol": "COMMAND", "command": {"value": 'test "$PORT0" = 40000'}, "gracePeriodSeconds": 0,
             "intervalSeconds": 2, "timeoutSeconds": 1}  # fmt: skip
    world.create(instances=2, healthChecks=[check])
    settle(world, 0)
    settle(world, 0)
    by_port = {j.spec.env["PORT0"]: world.controller.health_of(j.id) for j in world.running()}
    assert {p: h.states[0].healthy for p, h in by_port.items() if h} == {"40000": True, "40001": False}
    world.controller.checker.close()  # type: ignore[attr-defined]
    assert ALICE.user == "alice"
