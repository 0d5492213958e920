"""`corral ps` filters and pages, and `corral cancel` several jobs at once, against a real `corral serve`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.test_serve import Corral, serving, wait_for


@pytest.fixture
def corral(tmp_path: Path) -> Iterator[Corral]:
    with serving(tmp_path / "corral.sock", tmp_path / "state") as (client, _):
        yield client


def ids(corral: Corral, *args: str) -> list[str]:
    return [j["id"] for j in json.loads(corral.run("ps", "--json", *args).stdout)]


def test_ps_filters_and_pages_and_cancel_takes_many(corral: Corral) -> None:
    hog = corral.submit("--gpus", "2", "--name", "hog", "--", "sleep", "600")  # holds both GPUs
    wait_for("the hog to run", lambda: ids(corral, "--state", "running") == [hog])
    big = [corral.submit("--gpus", "2", "--name", "big", "--", "true") for _ in range(4)]
    corral.run("cancel", *big)  # several ids: the bulk route
    assert ids(corral, "--state", "cancelled") == big
    small = [corral.submit("--gpus", "1", "--name", f"s{i % 2}", "--", "true") for i in range(5)]
    assert ids(corral, "--state", "queued") == small
    assert ids(corral, "--state", "queued", "--name", "s1") == small[1::2]
    assert ids(corral, "--since", "10m", "--newest", "--limit", "2") == small[:-3:-1]
    page = corral.run("ps", "--json", "--limit", "3")
    assert [j["id"] for j in json.loads(page.stdout)] == [hog, *big[:2]]
    assert (
        page.stderr.strip()
        == f"more jobs not shown (--limit 3): the next ones with --after {big[1]}, or a larger --limit"
    )
    assert corral.run("ps", "--json", "--limit", "10").stderr == ""  # all 10 fit: nothing left out, nothing said
    assert ids(corral, "--limit", "3", "--after", big[1]) == [big[2], big[3], small[0]]
    done = corral.run("cancel", "--state", "queued", "--name", "s0")
    assert done.stdout.strip() == "cancelled 3, cancelling 0 (running: SIGTERM sent), already ended 0"
    assert ids(corral, "--state", "queued") == small[1::2]
    done = corral.run("cancel", hog, small[1], "999", ok=False)
    assert done.returncode == 2 and done.stderr.strip() == "error: no job 999"
    assert "cancelled 1, cancelling 1" in done.stdout
    assert (
        corral.run("cancel", ok=False).stderr.strip() == "error: say which jobs to cancel: job ids, --state or --name"
    )
    bad = corral.run("ps", "--state", "asleep", ok=False)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --state: must be one of queued, starting, running")
    assert corral.run("ps", "--since", "soon", ok=False).stderr.startswith("error: --since: give a duration ago")
    wait_for("the hog to end", lambda: ids(corral, "--state", "running") == [])
