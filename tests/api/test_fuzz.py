"""Fuzz the OpenAPI spec with schemathesis: no request, however malformed, gets a 5xx, and every answer has the
status codes, content type and body the spec documents.

The daemon behind the API is real (SQLite store, scheduling after each submit) with a fake executor, so jobs move
through their states while the fuzzer talks to it.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from corral.api.app import create_app
from corral.daemon.core import Daemon
from corral.daemon.extensions import install_extensions
from corral.daemon.tokens import TokenStore
from corral.executor.fake import FakeExecutor
from corral.gpu.simulated import parse_simulated_inventory
from corral.placement import PlacementConfig
from corral.store import SqliteStore
from tests.api.test_api import ALICE, AsPeer


def make_app(peers: bool = False) -> AsPeer:
    """corral's API over a real daemon; `peers`: with the Metronome, Chronos and Marathon routes mounted too."""
    state = Path(tempfile.mkdtemp(prefix="corral-fuzz-"))
    atexit.register(shutil.rmtree, state, True)  # (made at import, by every worker that collects this file)
    node = parse_simulated_inventory("2xA100-80GB")[0]
    daemon = Daemon(SqliteStore(state / "jobs.db"), FakeExecutor(), node, PlacementConfig(), state)
    lock = threading.Lock()

    def wake() -> None:
        with lock:
            daemon.tick()

    routers = install_extensions(daemon, lock, wake) if peers else []
    return AsPeer(
        create_app(daemon, lock, wake, tokens=TokenStore(state / "tokens.json"), routers=routers), ALICE, "unix"
    )


schema = schemathesis.openapi.from_asgi("/openapi.json", make_app())
#: The peers' routes (their bodies are free JSON and their answers the peers' shapes, which the spec leaves open):
#: fewer examples each, and only the check that matters for them, no 5xx.
peer_schema = schemathesis.openapi.from_asgi("/openapi.json", make_app(peers=True)).include(
    path_regex="^/(metronome|marathon|chronos|v1/definitions)"
)


@schema.parametrize()
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_gets_a_server_error(case: schemathesis.Case[Any]) -> None:
    case.call_and_validate(checks=[not_a_server_error, content_type_conformance, response_schema_conformance])


def not_a_server_error_but_not_supported(ctx: Any, response: Any, case: schemathesis.Case[Any]) -> bool | None:
    """A peer's endpoint corral does not serve answers 501 saying so (docs/compat/*.md): that is its answer, not a
    failure. Schemathesis reaches them by trying the methods a served path does not document."""
    if response.status_code == 501 and "not supported by corral" in response.text:
        return None
    return not_a_server_error(ctx, response, case)


@peer_schema.parametrize()
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_to_the_peers_apis_gets_a_server_error(case: schemathesis.Case[Any]) -> None:
    case.call_and_validate(checks=[not_a_server_error_but_not_supported])
