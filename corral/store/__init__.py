"""Where `corral serve` keeps its jobs: the `Store` protocol, in memory (tests) or in SQLite (the daemon)."""

from __future__ import annotations

from pathlib import Path

from corral.store.base import (
    IDEMPOTENCY_TTL_S,
    JobNotFound,
    JobQuery,
    KeyInUse,
    StaleDocument,
    StaleJob,
    Store,
    StoreError,
)
from corral.store.memory import MemoryStore
from corral.store.sqlite import SqliteStore

__all__ = [
    "IDEMPOTENCY_TTL_S",
    "JobNotFound",
    "JobQuery",
    "KeyInUse",
    "MemoryStore",
    "SqliteStore",
    "StaleDocument",
    "StaleJob",
    "Store",
    "StoreError",
    "open_store",
]


def open_store(path: Path | None) -> Store:
    """The SQLite store at `path`, or a store in memory (nothing survives a restart) when `path` is None."""
    return MemoryStore() if path is None else SqliteStore(path)
