"""Test-wide settings: in CI, hypothesis runs a fixed set of examples so a run is repeatable; no test leaves a
process running in its tmp_path; under pytest-xdist (`python3 dev.py test` runs `-n auto --dist loadgroup`), the
tests of a module that share a module-scoped fixture (a live daemon, a control plane, a browser) go to one worker, so
that fixture starts once, not once per worker."""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# dcos-metronome's generated protobuf code (tests/mesos/test_metronome_client.py) runs only on protobuf's pure-Python
# backend, which is chosen once per process when protobuf is first imported; the k8s tests import it earlier.
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

TESTS = Path(__file__).resolve().parent


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    """Whether `item` uses a fixture of module (or class, package) scope defined in this test tree: what the module's
    other tests reuse rather than set up again."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for defs in info.name2fixturedefs.values():
        for fixturedef in defs:
            if fixturedef.scope not in ("module", "class", "package"):
                continue
            try:
                source = inspect.getsourcefile(fixturedef.func)
            except TypeError:
                continue
            if source is not None and Path(source).resolve().is_relative_to(TESTS):
                return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist's loadgroup, a test without a group goes wherever a worker is free; one that shares a module-scoped
    fixture is grouped by its module, so the fixture is set up on one worker only."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None and _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


def _strays(where: str) -> list[int]:
    """Processes (not this one) whose command line or working directory lies under `where`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
            cwd = os.readlink(f"/proc/{entry.name}/cwd")
        except OSError:  # gone, or another user's
            continue
        if where in cmdline or cwd == where or cwd.startswith(where + "/"):
            found.append(int(entry.name))
    return found


@pytest.fixture(autouse=True)
def _no_strays(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that starts real jobs and fails before its clean-up would leave them running for ever (a job that
    ignores SIGTERM in a loop, say), eating the CPU of every later test and of the machine. After each test that
    has a tmp_path, whatever still runs in it or names it is killed."""
    where = str(request.getfixturevalue("tmp_path")) if "tmp_path" in request.fixturenames else None
    yield
    if where is None:
        return
    for pid in _strays(where):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
