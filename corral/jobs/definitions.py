"""Named job definitions (Metronome jobs, Chronos jobs), their runs and their schedule/dependency state, kept in the
store's documents so that a restart of `corral serve` loses and repeats nothing.

    kind "jobs.def"    key NAME           who owns it, the source format and its JSON as validated (+ ISO anchor)
    kind "jobs.state"  key NAME           schedule cursors, counters, latest outcome, dependency bookkeeping,
                                          and `pending`: a run decided on but maybe not yet written (see below)
    kind "jobs.run"    key NAME/RUN_ID    one run: trigger, status, its tasks (corral jobs), retry time, deadline

A trigger (schedule tick, dependency, Chronos' run-at-creation) is recorded in ONE write of the state document: the
advanced cursor or consumed dependency counters together with the run it decided on (`pending`). The run document is
written next and `pending` cleared after; a restart in between finds `pending` and writes the run then. So a tick is
never lost and never run twice, and a dependency round is consumed exactly once.

`Book` is a write-through cache over those documents: every write goes to the store first (compare-and-set on the
cached version), so the store is the truth and the cache only saves the daemon's round from re-reading it.
"""

from __future__ import annotations

import builtins
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from corral.model.errors import CorralError
from corral.store.base import StaleDocument, Store

DEF = "jobs.def"
STATE = "jobs.state"
RUN = "jobs.run"
KINDS = (DEF, STATE, RUN)

#: Finished runs kept per job (their ids and times stay in the history lists of the state document too).
HISTORY_KEPT = 50

# Run statuses (Metronome's words; INITIAL is never stored).
STARTING = "STARTING"
ACTIVE = "ACTIVE"
SUCCESS = "SUCCESS"
FAILED = "FAILED"
FINAL = frozenset({SUCCESS, FAILED})


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a definition belongs to; its runs run as this user."""

    user: str
    uid: int
    gid: int

    @property
    def root(self) -> bool:
        return self.uid == 0

    def to_json(self) -> dict[str, Any]:
        return {"user": self.user, "uid": self.uid, "gid": self.gid}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Owner:
        return cls(str(d["user"]), int(d["uid"]), int(d["gid"]))

    def may_see(self, owner: Owner) -> bool:
        return self.root or self.uid == owner.uid


class DefinitionNotFound(CorralError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no job definition {name!r}")
        self.name = name


class NameTaken(CorralError):
    def __init__(self, name: str) -> None:
        super().__init__(f"a job definition named {name!r} already exists")
        self.name = name


class RunNotFound(CorralError):
    def __init__(self, name: str, run_id: str) -> None:
        super().__init__(f"job {name!r} has no run {run_id!r}")


class Conflict(CorralError):
    """The request is valid but the definition's state refuses it (active runs, dependants); `status` 409."""


def run_key(name: str, run_id: str) -> str:
    return f"{name}/{run_id}"


def epoch(t: datetime) -> float:
    return t.timestamp()


def instant(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def iso(t: float | None) -> str | None:
    """Metronome's instants: ISO 8601 UTC with milliseconds."""
    if t is None:
        return None
    return instant(t).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Book:
    """The documents of kinds `KINDS` in memory, written through to the store. Not thread-safe: the caller holds the
    daemon's lock (the round and the API handlers both do)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._docs: dict[str, dict[str, tuple[dict[str, Any], int]]] = {}

    def _kind(self, kind: str) -> dict[str, tuple[dict[str, Any], int]]:
        docs = self._docs.get(kind)
        if docs is None:
            docs = {key: (body, version) for key, body, version in self.store.list_docs(kind)}
            self._docs[kind] = docs
        return docs

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        found = self._kind(kind).get(key)
        return None if found is None else found[0]

    def items(self, kind: str) -> Iterator[tuple[str, dict[str, Any]]]:
        for key, (body, _) in builtins.list(self._kind(kind).items()):
            yield key, body

    def put(self, kind: str, key: str, body: dict[str, Any]) -> None:
        docs = self._kind(kind)
        version = docs[key][1] if key in docs else 0
        try:
            new = self.store.put_doc(kind, key, body, expect_version=version)
        except StaleDocument:
            self._docs.pop(kind, None)  # someone else wrote: forget what we knew and let the caller fail
            raise
        docs[key] = (copy.deepcopy(body), new)  # the caller's dict may change after this; the cache must not

    def delete(self, kind: str, key: str) -> None:
        docs = self._kind(kind)
        if key in docs:
            self.store.delete_doc(kind, key)
            del docs[key]


def run_json(run: dict[str, Any]) -> dict[str, Any]:
    """A run as Metronome shows it; each task's `id` is the corral job that ran it (`corral logs ID` shows its
    output)."""
    return {
        "id": run["id"],
        "jobId": run["job"],
        "status": run["status"],
        "createdAt": iso(run["created_at"]),
        "completedAt": iso(run["completed_at"]),
        "tasks": [
            {
                "id": t["job"],
                "startedAt": iso(t["started_at"]),
                "completedAt": iso(t["completed_at"]),
                "status": t["status"],
            }
            for t in run["tasks"]
        ],
        "trigger": run["trigger"],
        "reason": run["reason"],
    }
