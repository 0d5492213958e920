"""`corral logs` of a gang (issue 23, item 11) against a real `corral serve` running real gangs of 3 processes: every
instance's output, each line prefixed with its instance, by default; one instance's as it is with --instance K; the
same while following. One daemon for the module (each CLI call is a process)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.test_serve import Corral, serving

SMALL = ("--cpus", "100m", "--memory", "16MiB")


@pytest.fixture(scope="module")
def corral(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Corral]:
    tmp = tmp_path_factory.mktemp("gang-logs")
    with serving(tmp / "corral.sock", tmp / "state") as (client, _):
        yield client


def test_logs_of_a_gang_print_every_instance_prefixed_or_one_with_instance(corral: Corral) -> None:
    script = 'echo "a $CORRAL_INSTANCE"; echo "b $CORRAL_INSTANCE"; printf "tail $CORRAL_INSTANCE"'
    gang = corral.submit(*SMALL, "--instances", "3", "--gang", "--", "sh", "-c", script)
    corral.run("wait", gang, "--timeout", "30")
    # was "a 0\nb 0\ntail 0": instance 0's only
    assert corral.run("logs", gang).stdout == "".join(f"[{k}] a {k}\n[{k}] b {k}\n[{k}] tail {k}\n" for k in range(3))
    assert corral.run("logs", gang, "--instance", "2").stdout == "a 2\nb 2\ntail 2"
    assert corral.run("logs", gang, "--instance", "0").stdout == "a 0\nb 0\ntail 0"
    wrong = corral.run("logs", gang, "--instance", "3", ok=False)
    assert wrong.returncode == 2
    assert wrong.stderr.strip() == f"error: --instance: job {gang} has instances 0..2, not instance 3"
    chunks = [json.loads(line) for line in corral.run("logs", gang, "--json").stdout.splitlines()]
    assert [(c["instance"], c["text"]) for c in chunks if c["text"]] == [
        (k, f"a {k}\nb {k}\ntail {k}") for k in range(3)
    ]

    alone = corral.submit(*SMALL, "--", "sh", "-c", "echo one; echo two")
    corral.run("wait", alone, "--timeout", "30")
    assert corral.run("logs", alone).stdout == "one\ntwo\n"  # a job of one process: as before, no prefix
    assert "instance" not in json.loads(corral.run("logs", alone, "--json").stdout.splitlines()[0])


def test_logs_follow_a_gang_until_it_ends_with_its_status(corral: Corral, tmp_path: Path) -> None:
    # Instance 1 fails (exit 3), but only once the others have ended (a failing instance stops the rest).
    script = (
        'for i in 1 2 3; do echo "$CORRAL_INSTANCE.$i"; sleep 0.2; done; touch "$0/done.$CORRAL_INSTANCE"; '
        '[ "$CORRAL_INSTANCE" != 1 ] && exit 0; '
        'n=0; until [ -e "$0/done.0" ] && [ -e "$0/done.2" ] || [ $n -gt 400 ]; do sleep 0.05; n=$((n+1)); done; exit 3'
    )
    tmp_path.chmod(0o777)
    gang = corral.submit(*SMALL, "--instances", "3", "--gang", "--", "sh", "-c", script, str(tmp_path))
    followed = corral.run("logs", "-f", gang, "--interval", "0.05", ok=False)
    assert followed.returncode == 3, followed.stderr  # instance 1's exit code is the gang's
    lines = followed.stdout.splitlines()
    for k in range(3):  # each instance's lines, prefixed, in its order (the instances interleave as they ran)
        assert [line for line in lines if line.startswith(f"[{k}] ")] == [f"[{k}] {k}.{i}" for i in (1, 2, 3)]
    assert len(lines) == 9
