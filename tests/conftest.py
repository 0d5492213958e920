"""Test-wide settings: in CI, hypothesis runs a fixed set of examples so a run is repeatable."""

from __future__ import annotations

import os

from hypothesis import settings

# dcos-metronome's generated protobuf code (tests/mesos/test_metronome_client.py) runs only on protobuf's pure-Python
# backend, which is chosen once per process when protobuf is first imported; the k8s tests import it earlier.
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
