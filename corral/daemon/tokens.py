"""Bearer tokens for the TCP listener: who a request is when it does not come over the Unix socket.

    corral token create        (over the Unix socket: the caller is known from SO_PEERCRED)
        -> "corral_<43 random characters>", shown once; the file keeps only its SHA-256
    TCP request  "Authorization: Bearer corral_..."  -> that token's (uid, gid, user), or 401

A token acts as the user who created it (root may create one for another user). Tokens are created, listed and
revoked only over the Unix socket, so a token that leaks cannot mint more. The file (STATE_DIR/tokens.json, mode
0600) is replaced atomically on every change, so a crash never leaves it half written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from corral.model.errors import CorralError, InvalidRequest

PREFIX = "corral_"
MAX_NAME = 100


class TokenFileError(CorralError):
    """The token file cannot be read or written."""


class TokenNotFound(InvalidRequest):
    def __init__(self, token_id: str) -> None:
        super().__init__("token", f"no token {token_id}")


@dataclass(frozen=True)
class Token:
    id: str
    name: str
    uid: int
    gid: int
    user: str
    created_at: float
    sha256: str


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class TokenStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._tokens: dict[str, Token] = {}  # by id
        self._by_hash: dict[str, Token] = {}
        self._load()

    def _load(self) -> None:
        try:
            raw = json.loads(self.path.read_text())
            tokens = [Token(**t) for t in raw["tokens"]]
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise TokenFileError(f"cannot read the token file {self.path}: {exc}") from None
        self._tokens = {t.id: t for t in tokens}
        self._by_hash = {t.sha256: t for t in tokens}

    def _save(self, tokens: dict[str, Token]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        data = json.dumps({"tokens": [asdict(t) for t in tokens.values()]}, indent=1).encode()
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise TokenFileError(f"cannot write the token file {self.path}: {exc}") from None

    def create(self, name: str, uid: int, gid: int, user: str, now: float) -> tuple[Token, str]:
        """A new token for (uid, gid, user); returns it and its secret (the only time the secret is seen)."""
        name = name.strip()
        if not name or len(name) > MAX_NAME or not name.isprintable():
            raise InvalidRequest("name", f"a token name is 1..{MAX_NAME} printable characters, got {name!r}")
        secret = PREFIX + secrets.token_urlsafe(32)
        with self._lock:
            if any(t.name == name and t.uid == uid for t in self._tokens.values()):
                raise InvalidRequest("name", f"you already have a token named {name!r}; revoke it or pick another")
            token = Token(secrets.token_hex(4), name, uid, gid, user, now, digest(secret))
            while token.id in self._tokens:
                token = Token(secrets.token_hex(4), name, uid, gid, user, now, token.sha256)
            tokens = {**self._tokens, token.id: token}
            self._save(tokens)
            self._tokens = tokens
            self._by_hash[token.sha256] = token
        return token, secret

    def verify(self, secret: str) -> Token | None:
        if not secret.startswith(PREFIX):
            return None
        return self._by_hash.get(digest(secret))

    def list(self, uid: int | None = None) -> list[Token]:
        """Every token (uid None) or one user's, oldest first."""
        return sorted((t for t in self._tokens.values() if uid is None or t.uid == uid), key=lambda t: t.created_at)

    def revoke(self, token_id: str, uid: int | None = None) -> Token:
        """Revoke a token; `uid` None = root (any token), otherwise only the caller's own."""
        with self._lock:
            token = self._tokens.get(token_id)
            if token is None or (uid is not None and token.uid != uid):
                raise TokenNotFound(token_id)
            tokens = {k: v for k, v in self._tokens.items() if k != token_id}
            self._save(tokens)
            self._tokens = tokens
            self._by_hash.pop(token.sha256, None)
        return token
