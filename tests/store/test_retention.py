"""How long ended jobs are kept (corral.store.retention, `corral serve --acct-retention`): pruning in batches with the
store free between them, the daemon's thread, and the flag's texts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner as TyperRunner

from corral.cli.main import app as corral_cli
from corral.jobs.model import JobState
from corral.model.errors import InvalidRequest
from corral.store import MemoryStore, SqliteStore, Store, retention
from corral.store.acct import AcctQuery
from corral.store.retention import Pruner, parse_retention, prune
from tests.store.test_acct import run, spec

DAY = 86400.0


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "jobs.db")
    yield s
    s.close()


def test_prune_goes_batch_by_batch_and_the_store_takes_writes_in_between(store: Store) -> None:
    old = [run(store, spec(), i * 10.0, i * 10.0 + 5) for i in range(1, 8)]
    recent = run(store, spec(), 100 * DAY, 100 * DAY + 5)
    waiting = store.add(spec(), now=1.0)  # never ended: kept, however old
    between: list[str] = []

    def pause() -> bool:
        between.append(store.add(spec(), now=2.0).id)  # another write gets in: nothing holds the store
        return False

    assert prune(store, keep_s=90 * DAY, now=100 * DAY + 10, batch=3, pause=pause) == 7
    assert len(between) == 2  # 3 + 3, then a short batch of 1 ends it
    assert all(store.get(i) is None for i in old)
    assert [r.id for r in store.acct(AcctQuery())] == [recent]
    assert store.get(waiting.id) is not None and all(store.get(i) is not None for i in between)


def test_prune_stops_early_when_asked(store: Store) -> None:
    for i in range(1, 8):
        run(store, spec(), i * 10.0, i * 10.0 + 5)
    assert prune(store, keep_s=DAY, now=10 * DAY, batch=2, pause=lambda: True) == 2
    assert len(store.acct(AcctQuery())) == 5


def test_the_daemons_thread_prunes_and_stops(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention, "FIRST_PRUNE_S", 0.0)
    ids = [run(store, spec(), i * 10.0, i * 10.0 + 5) for i in range(1, 4)]
    pruner = Pruner(store, keep_s=DAY, clock=lambda: 10 * DAY)
    pruner.start()
    deadline = time.monotonic() + 10
    while any(store.get(i) is not None for i in ids) and time.monotonic() < deadline:
        time.sleep(0.01)
    pruner.stop()
    assert all(store.get(i) is None for i in ids)
    assert store.get(ids[0]) is None and not store.acct(AcctQuery(states={JobState.SUCCEEDED}))


def test_retention_texts() -> None:
    assert parse_retention("90d") == 90 * DAY and parse_retention("2-00") == 2 * DAY
    assert parse_retention("never") is None and parse_retention("0") is None and parse_retention("Forever") is None
    with pytest.raises(InvalidRequest) as info:
        parse_retention("5m")
    assert str(info.value) == "--acct-retention: must be at least an hour (or never), got '5m'"
    with pytest.raises(InvalidRequest) as info:
        parse_retention("a while")
    assert str(info.value) == (
        "--acct-retention: not a duration: 'a while' (examples: 90, 45m, 2h, 1h30m, 1:30:00, 2-12); or never, to keep "
        "every job"
    )


def test_serve_takes_the_retention_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}
    monkeypatch.setattr("corral.daemon.server.serve", lambda *a, **kw: seen.update(kw))
    runner = TyperRunner()
    where = ["--state-dir", str(tmp_path / "state"), "--socket", str(tmp_path / "s.sock")]
    assert runner.invoke(corral_cli, ["serve", *where]).exit_code == 0
    assert seen["retention_s"] == 90 * DAY
    assert runner.invoke(corral_cli, ["serve", *where, "--acct-retention", "never"]).exit_code == 0
    assert seen["retention_s"] is None
    result = runner.invoke(corral_cli, ["serve", *where, "--acct-retention", "10m"])
    assert result.exit_code != 0
    assert "--acct-retention: must be at least an hour (or never), got '10m'" in result.output, result.output
