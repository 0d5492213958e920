"""Bearer tokens: created with a secret shown once, verified by hash, revoked, kept across restarts."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from corral.daemon.tokens import PREFIX, TokenFileError, TokenStore, digest
from corral.model.errors import InvalidRequest


def test_create_verify_revoke_and_persist(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    store = TokenStore(path)
    token, secret = store.create("laptop", 1000, 1000, "alice", 5.0)
    assert secret.startswith(PREFIX) and len(secret) > 40
    assert store.verify(secret) == token and (token.uid, token.user, token.name) == (1000, "alice", "laptop")
    assert (
        store.verify(secret + "x") is None and store.verify("") is None and store.verify(secret[len(PREFIX) :]) is None
    )
    # only the hash is on disk, and only root can read the file
    text = path.read_text()
    assert secret not in text and digest(secret) in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    bob, bob_secret = store.create("ci", 1001, 1001, "bob", 6.0)

    again = TokenStore(path)  # a restarted daemon
    assert again.verify(secret) == token and again.verify(bob_secret) == bob
    assert [t.name for t in again.list()] == ["laptop", "ci"] and again.list(1001) == [bob]
    with pytest.raises(InvalidRequest, match=f"token: no token {token.id}"):
        again.revoke(token.id, uid=1001)  # not bob's
    assert again.revoke(token.id, uid=1000) == token
    assert again.verify(secret) is None
    assert TokenStore(path).verify(secret) is None and TokenStore(path).verify(bob_secret) == bob


@pytest.mark.parametrize("name", ["", "   ", "x" * 101, "tab\there"])
def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidRequest, match=r"name: a token name is 1\.\.100 printable characters"):
        TokenStore(tmp_path / "t.json").create(name, 1, 1, "u", 0.0)


def test_one_name_per_user(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "t.json")
    store.create("laptop", 1, 1, "u", 0.0)
    store.create("laptop", 2, 2, "v", 0.0)  # another user's laptop
    with pytest.raises(InvalidRequest, match="you already have a token named 'laptop'"):
        store.create("laptop", 1, 1, "u", 0.0)


def test_a_broken_file_is_a_clear_error_and_is_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text('{"tokens": [{"id": 1}]}')
    with pytest.raises(TokenFileError, match="cannot read the token file"):
        TokenStore(path)
    assert json.loads(path.read_text()) == {"tokens": [{"id": 1}]}


def test_a_failed_write_keeps_the_old_tokens(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "tokens.json"  # its folder does not exist: every write fails
    store = TokenStore(path)
    with pytest.raises(TokenFileError, match="cannot write the token file"):
        store.create("laptop", 1, 1, "u", 0.0)
    assert store.list() == []
