"""`corral ps` shows every job that matches, paging the API itself; `--limit N` caps it and says so; root sees
everyone's jobs, a user only their own (issue 26, item 7). The CLI's requests go to an in-process daemon core
(tests/api/test_api.py's World), as root or as a user; the page size is cut to 3 so that a few jobs take pages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from corral.cli import client, render
from corral.cli.transport import Headers, Response
from tests.api.test_api import ALICE, BOB, ROOT, World, submit

Peer = tuple[int, int, str]


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


@pytest.fixture
def pages(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The `limit` of every GET /v1/jobs the command sends."""
    monkeypatch.setattr(client, "PS_PAGE", 3)
    return []


def ps(world: World, peer: Peer, pages: list[Any], monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    api = world.client(peer)

    def call(_socket: Any, method: str, url: str, *_: Any, params: Any = None, **__: Any) -> Any:
        assert (method, url) == ("GET", "/v1/jobs")
        pages.append(dict(params)["limit"])
        answer = api.get(url, params=params)
        assert answer.status_code == 200, answer.text
        return answer

    monkeypatch.setattr(client, "call", call)
    return CliRunner().invoke(client.ps_cmd, list(args))


def listed(result: Any) -> list[str]:
    assert result.exit_code == 0, result.output
    return [j["id"] for j in json.loads(result.stdout)]


def test_ps_shows_every_job_page_after_page(world: World, pages: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    alice = world.client(ALICE)
    mine = [submit(alice, gpus=2)["id"] for _ in range(7)]
    result = ps(world, ALICE, pages, monkeypatch, "--json")
    assert listed(result) == mine and result.stderr == ""
    assert pages == [3, 3, 3]  # 3 + 3 + 1: the short page is the last
    pages.clear()
    table = ps(world, ALICE, pages, monkeypatch)
    assert [line.split()[0] for line in table.stdout.splitlines()[1:]] == mine


def test_ps_limit_caps_and_says_how_to_see_more(
    world: World, pages: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = world.client(ALICE)
    mine = [submit(alice, gpus=2)["id"] for _ in range(7)]
    result = ps(world, ALICE, pages, monkeypatch, "--json", "--limit", "4")
    assert listed(result) == mine[:4]
    assert result.stderr == (
        f"more jobs not shown (--limit 4): the next ones with --after {mine[3]}, or a larger --limit\n"
    )
    assert listed(ps(world, ALICE, pages, monkeypatch, "--json", "--after", mine[3])) == mine[4:]
    exact = ps(world, ALICE, pages, monkeypatch, "--json", "--limit", "7")  # all fit: nothing is said
    assert listed(exact) == mine and exact.stderr == ""
    more = ps(world, ALICE, pages, monkeypatch, "--json", "--limit", "6", "--newest")
    assert listed(more) == mine[:0:-1] and f"--after {mine[1]}," in more.stderr


def test_root_sees_everyones_jobs_and_a_user_only_their_own(
    world: World, pages: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    alices = [submit(world.client(ALICE), gpus=2)["id"] for _ in range(2)]
    bobs = [submit(world.client(BOB), gpus=2)["id"] for _ in range(2)]
    assert listed(ps(world, ROOT, pages, monkeypatch, "--json")) == alices + bobs
    assert listed(ps(world, ROOT, pages, monkeypatch, "--json", "-u", "bob")) == bobs
    assert listed(ps(world, ALICE, pages, monkeypatch, "--json")) == alices
    assert listed(ps(world, BOB, pages, monkeypatch, "--json", "--all")) == bobs  # --all widens no user's view
    table = ps(world, ROOT, pages, monkeypatch)
    assert [line.split()[2] for line in table.stdout.splitlines()[1:]] == ["alice", "alice", "bob", "bob"]


def test_a_tables_fast_path_lines_up_as_the_cut_one() -> None:
    """Piped (no colour, no cut) a table takes a faster path: the same lines as on a wide terminal, wide characters
    taking two cells, control characters escaped."""
    view = render.table("ID", "NAME", "STATE")
    render.row(view, "1", "名前", render.Styled("queued", "yellow"))
    render.row(view, "22", "a\x1bb", "running")
    piped = view.lines(color=False, cells=None)
    assert piped == ["ID   NAME     STATE", "1    名前     queued", "22   a\\x1bb   running"]
    assert view.lines(color=False, cells=200) == piped
    assert view.lines(color=False, cells=12) == ["ID   NAME", "1    名前", "22   a\\x1bb"]


def test_an_answer_with_a_lone_surrogates_escape_still_decodes() -> None:
    """Answers are decoded by orjson, which refuses `\\ud800`; the daemon sends that escape for text an older corral
    stored (SafeJSONResponse), so such an answer goes to json instead, and bad JSON is still a ValueError."""
    assert Response(200, Headers(), b'[{"name": "\\ud800x"}]').json() == [{"name": "\ud800x"}]
    assert Response(200, Headers(), b'{"id": "1"}').json() == {"id": "1"}
    with pytest.raises(ValueError):
        Response(502, Headers(), b"<html>bad gateway</html>").json()
