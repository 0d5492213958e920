"""The suite as pytest-xdist runs it: every collected test has a node id of its own (xdist hands tests to its workers
by node id and would run only the first of tests that share one: schemathesis' per-operation fuzz tests did, 78 tests
run as 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FUZZ = "tests/api/test_fuzz.py"


def test_each_fuzzed_operation_is_a_test_with_its_own_node_id() -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "--collect-only", FUZZ],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr[-2000:]
    ids = [line for line in listed.stdout.splitlines() if line.startswith(f"{FUZZ}::test_no_input")]
    assert len(ids) > 10 and len(set(ids)) == len(ids), sorted(ids)[:5]
    assert f"{FUZZ}::test_no_input_gets_a_server_error[POST /v1/jobs]" in ids
