"""Dependencies between ordinary jobs, in Slurm's words: `afterok:ID[:ID],afterany:ID,afternotok:ID,after:ID,singleton`.

    parse("afterok:3:4,singleton")  -> (Dependency(AFTEROK, ("3", "4")), Dependency(SINGLETON, ()))
    verdict(deps, state_of, ...)    -> READY | WAITING ("job 3 (afterok) is running") | NEVER ("job 3 failed ...")

Every clause must hold (Slurm's `,`; its `?`, any of them, is refused). What each kind waits for, by the other job's
state (a job that fails with retries left is queued again, so it has not ended):

    after:ID       ID has started (or ended): not while it is queued and has never started
    afterany:ID    ID has ended, however
    afterok:ID     ID succeeded             never: it failed, was cancelled or lost
    afternotok:ID  ID failed, was cancelled or lost       never: it succeeded
    singleton      no other job of the same user and name is starting or running, nor queued ahead of it

The ids must name jobs that exist when the job is submitted (corral.daemon.core checks, and that the submitter may
see them), so every dependency points at an older job: a cycle cannot be made, and a round that walks the waiting
jobs oldest first sees a dependency's fate before its dependents'. Pure: no store, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from corral.jobs.model import JobState
from corral.model.errors import InvalidRequest

FIELD = "dependency"
#: Most job ids one job may depend on (all clauses together), and the longest text: a list longer than any job's
#: dependencies is a mistake (or an attack on the round, which reads them every time).
MAX_DEPENDENCY_IDS = 1000
MAX_DEPENDENCY_TEXT = 16 * 1024
#: How many unmet clauses a reason names before "and N more".
SHOWN = 5


class Kind(StrEnum):
    AFTER = "after"
    AFTERANY = "afterany"
    AFTEROK = "afterok"
    AFTERNOTOK = "afternotok"
    SINGLETON = "singleton"


@dataclass(frozen=True)
class Dependency:
    kind: Kind
    job_ids: tuple[str, ...] = ()  # empty for singleton


#: A job's id, or an array's task (12_3): an array's id stands for every task (corral.jobs.array).
_ID = re.compile(r"[1-9][0-9]{0,18}(?:_[0-9]{1,10})?")
KINDS_TEXT = "afterok:ID[:ID...], afterany:ID, afternotok:ID, after:ID or singleton"


def parse(text: str) -> tuple[Dependency, ...]:
    """Slurm's --dependency text; InvalidRequest naming `dependency` and what is wrong. "" -> ()."""
    if len(text) > MAX_DEPENDENCY_TEXT:
        raise InvalidRequest(FIELD, f"at most {MAX_DEPENDENCY_TEXT} characters, got {len(text)}")
    stripped = text.strip()
    if not stripped:
        return ()
    if "?" in stripped:
        raise InvalidRequest(FIELD, "'?' (any one of them) is not supported: every clause must hold (join with ',')")
    out: list[Dependency] = []
    count = 0
    for clause in stripped.split(","):
        head, _, rest = clause.strip().partition(":")
        try:
            kind = Kind(head.lower())
        except ValueError:
            shown = clause.strip()[:40]
            raise InvalidRequest(FIELD, f"unknown kind {shown!r}: give {KINDS_TEXT}") from None
        if kind is Kind.SINGLETON:
            if rest:
                raise InvalidRequest(FIELD, "singleton takes no job ids")
            out.append(Dependency(kind))
            continue
        ids = rest.split(":") if rest else []
        if not ids:
            raise InvalidRequest(FIELD, f"{kind.value} needs a job id ({kind.value}:ID)")
        for job_id in ids:
            if "+" in job_id:
                raise InvalidRequest(FIELD, f"{kind.value}:{job_id}: a delay after the job (+minutes) is not supported")
            if not _ID.fullmatch(job_id):
                raise InvalidRequest(FIELD, f"{kind.value}: {job_id[:40]!r} is not a job id (a number such as 12)")
        count += len(ids)
        if count > MAX_DEPENDENCY_IDS:
            raise InvalidRequest(FIELD, f"at most {MAX_DEPENDENCY_IDS} job ids in all")
        out.append(Dependency(kind, tuple(dict.fromkeys(ids))))
    if sum(d.kind is Kind.SINGLETON for d in out) > 1:
        out = [d for d in out if d.kind is not Kind.SINGLETON] + [Dependency(Kind.SINGLETON)]
    return tuple(out)


def text(deps: Sequence[Dependency]) -> str:
    """The canonical text: "afterok:3:4,singleton" (what is stored and shown)."""
    return ",".join(d.kind.value if not d.job_ids else f"{d.kind.value}:{':'.join(d.job_ids)}" for d in deps)


def job_ids(deps: Sequence[Dependency]) -> list[str]:
    return [i for d in deps for i in d.job_ids]


class Status(StrEnum):
    READY = "ready"
    WAITING = "waiting"
    NEVER = "never"


@dataclass(frozen=True)
class Verdict:
    status: Status
    #: READY: ""; WAITING: "job 3 (afterok) is running; ..."; NEVER: "job 3 failed (afterok needs it to succeed)"
    text: str


READY = Verdict(Status.READY, "")


@dataclass(frozen=True)
class ArrayState:
    """A job array as a dependency reads it: how many tasks, how many have ended and started, and the first that
    ended other than succeeded ("task 12_3 failed"; "" when none). Every kind waits for every task:

        after:A       every task has started (or ended)
        afterany:A    every task has ended
        afterok:A     every task succeeded   never: one ended otherwise (at once, before the others end)
        afternotok:A  every task has ended, one of them not succeeded    never: every task succeeded
    """

    total: int
    ended: int
    started: int
    succeeded: int
    first_bad: str = ""


#: A job's state as a dependency reads it: (state, attempts), an array's `ArrayState`, or None when the store has no
#: such job.
StateOf = Callable[[str], tuple[JobState, int] | ArrayState | None]

ENDED_WORDS = {
    JobState.SUCCEEDED: "succeeded",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "was cancelled",
    JobState.LOST: "was lost",
}


def _array(kind: Kind, array_id: str, a: ArrayState) -> tuple[Status, str]:
    if kind is Kind.AFTER:
        if a.started < a.total:
            return Status.WAITING, f"array {array_id} (after): {a.total - a.started} of its {a.total} tasks not started"
        return Status.READY, ""
    if kind is Kind.AFTEROK and a.first_bad:
        return Status.NEVER, f"array {array_id}: {a.first_bad} (afterok needs every task to succeed)"
    if a.ended < a.total:
        return Status.WAITING, f"array {array_id} ({kind.value}): {a.ended} of its {a.total} tasks ended"
    if kind is Kind.AFTERNOTOK and a.succeeded == a.total:
        return Status.NEVER, f"array {array_id}: every task succeeded (afternotok needs one to fail)"
    return Status.READY, ""


def _one(kind: Kind, job_id: str, found: tuple[JobState, int] | ArrayState | None) -> tuple[Status, str]:
    if found is None:
        return Status.NEVER, f"job {job_id} is not in the job store ({kind.value})"
    if isinstance(found, ArrayState):
        return _array(kind, job_id, found)
    state, attempts = found
    if kind is Kind.AFTER:
        if state is JobState.QUEUED and attempts == 0:
            return Status.WAITING, f"job {job_id} (after) has not started"
        return Status.READY, ""
    if not state.final:
        return Status.WAITING, f"job {job_id} ({kind.value}) is {state.value}"
    if kind is Kind.AFTEROK and state is not JobState.SUCCEEDED:
        return Status.NEVER, f"job {job_id} {ENDED_WORDS[state]} (afterok needs it to succeed)"
    if kind is Kind.AFTERNOTOK and state is JobState.SUCCEEDED:
        return Status.NEVER, f"job {job_id} succeeded (afternotok needs it to fail)"
    return Status.READY, ""


def verdict(deps: Sequence[Dependency], state_of: StateOf, singleton: str = "") -> Verdict:
    """Whether a job's dependencies hold now. `singleton`: "" when no other job of its user and name is ahead of it,
    else that job's words ("job 7 (singleton: yours, named 'train') is running")."""
    waiting: list[str] = []
    never: list[str] = []
    for d in deps:
        if d.kind is Kind.SINGLETON:
            if singleton:
                waiting.append(singleton)
            continue
        for job_id in d.job_ids:
            status, words = _one(d.kind, job_id, state_of(job_id))
            if status is Status.NEVER:
                never.append(words)
            elif status is Status.WAITING:
                waiting.append(words)
    if never:
        return Verdict(Status.NEVER, _listed(never))
    if waiting:
        return Verdict(Status.WAITING, _listed(waiting))
    return READY


def _listed(parts: Sequence[str]) -> str:
    more = f" and {len(parts) - SHOWN} more" if len(parts) > SHOWN else ""
    return "; ".join(parts[:SHOWN]) + more


def waiting_reason(v: Verdict) -> str:
    """A waiting job's reason (what `ps` and `explain` show) for a verdict that is not READY."""
    if v.status is Status.NEVER:
        return (
            f"its dependency can never be met: {v.text}; it waits until cancelled (submit with --kill-on-invalid-dep "
            "to have such a job cancelled)"
        )
    return f"waiting for its dependency: {v.text}"


def cancelled_reason(v: Verdict) -> str:
    """The reason of a job cancelled by --kill-on-invalid-dep."""
    return f"cancelled: its dependency can never be met: {v.text} (--kill-on-invalid-dep)"
