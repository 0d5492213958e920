"""Test-wide settings: in CI, hypothesis runs a fixed set of examples so a run is repeatable; no test leaves a
process running in its tmp_path.

Under pytest-xdist (`python3 dev.py test` runs `--dist loadscope`) each module's tests run on one worker, in
order: a module-scoped fixture (a live daemon, a control plane, a browser) starts once, and the tests of a module
that build on each other's state (the browser's login, the Chronos client's jobs) keep doing so. (xdist's
loadgroup cannot group them on pytest 9.2, whose node ids no longer take xdist's `@group` suffix.)"""

from __future__ import annotations

import contextlib
import os
import signal
from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import settings

# dcos-metronome's generated protobuf code (tests/mesos/test_metronome_client.py) runs only on protobuf's pure-Python
# backend, which is chosen once per process when protobuf is first imported; the k8s tests import it earlier.
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def unique_node_ids(items: list[pytest.Item]) -> list[str]:
    """Give each item a node id of its own where pytest gave several the same (schemathesis' per-operation tests on
    pytest 9.2, whose node id leaves out their `[GET /v1/jobs]`); returns the ids still shared. pytest-xdist runs tests
    by node id: of tests that share one, it would run only the first and count the rest as never collected."""
    counts = Counter(item.nodeid for item in items)
    for item in items:
        if counts[item.nodeid] > 1 and item.parent is not None and "[" in item.name and "[" not in item.nodeid:
            try:
                from _pytest.nodeid import NodeId  # pytest 9.2's structured id (nodeid is str(item._id))
            except ImportError:
                break
            item._id = NodeId.parse(f"{item.parent.nodeid}::{item.name}")
    return sorted(nodeid for nodeid, n in Counter(item.nodeid for item in items).items() if n > 1)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    shared = unique_node_ids(items)
    if shared and hasattr(config, "workerinput"):  # an xdist worker: these would silently not run
        raise pytest.UsageError(f"tests that share a node id, which pytest-xdist cannot run: {shared[:5]}")


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


# ------------------------------------------------------------------------------------------------ cgroups left behind
def _corral_cgroups() -> set[str]:
    """The `corral-*` subtrees beside this process's own cgroup v2 (corral.executor.cgroup makes one per daemon's
    state directory, as root without delegation)."""
    from corral.executor.cgroup import find_v2_mount, own_cgroup

    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            mount = find_v2_mount(f.read())
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            own = own_cgroup(f.read())
        if mount is None or own is None:
            return set()
        home = mount / own.lstrip("/")
        return {str(p) for p in home.iterdir() if p.name.startswith("corral-") and p.is_dir()}
    except OSError:
        return set()


_CGROUPS_BEFORE: set[str] = set()


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the run's own process, not an xdist worker
        _CGROUPS_BEFORE.update(_corral_cgroups())


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Daemons the tests killed with -9 (on purpose) never remove their subtree: once every worker has finished, the
    empty ones this run made go (rmdir refuses a cgroup that still has a leaf or a process)."""
    if hasattr(session.config, "workerinput"):
        return
    for path in sorted(_corral_cgroups() - _CGROUPS_BEFORE):
        with contextlib.suppress(OSError):
            os.rmdir(path)
