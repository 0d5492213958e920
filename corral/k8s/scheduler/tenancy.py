"""The tenancy face of `corral k8s scheduler` (issue 25): the queues file's rules on the cluster.

    pending pod (batch.Pending) --work_of--> Work      queue: its label (corral.dev/queue, Kueue's, KAI's), else its
                                                       namespace's queue (`namespaces = [...]` in the file), else a
                                                       queue named as its namespace, else the default queue;
                                                       user: its namespace; gang: its PodGroup (gang_size: minMember
                                                       less the members bound)
    bound pod of ours (Bound + PodRecord) --> Running  started_at: its bind time (the books'), after a restart its
                                                       status.startTime or PodScheduled's lastTransitionTime
    the books' snapshot (+ capacity held for preemptors) --> ClusterView (ends: start + activeDeadlineSeconds, or
                                                       the corral.dev/time-limit annotation, else the default)
    plan_pods(...) = corral.tenancy.plan_round + the k8s words --> Bind | Wait per pod, preemptions, positions

Pure: no I/O, no clock (`now` is given). `Evictions` is the contract with corral/k8s/scheduler/evict.py (the Eviction
API, PDBs, grace, minimum runtime, the capacity held for the preemptor). `NoEvictions` is the default: nothing is
ever evicted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import re
from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime
from itertools import repeat
from operator import attrgetter, eq, is_, itemgetter
from typing import Any, NamedTuple, Protocol

import numpy as np

from corral.k8s.convert import assignment_annotations, make_assignment
from corral.k8s.scheduler.batch import INVALID, NO_NODES, Bind, Decision, Pending, Wait
from corral.k8s.scheduler.gang import GANG_INCOMPLETE, GANG_INVALID, GangInfo, queue_label
from corral.model.errors import AllocationError, InvalidRequest
from corral.model.resources import Allocation, Request
from corral.model.snapshot import ClusterSnapshot
from corral.model.units import parse_duration_seconds
from corral.tenancy.config import QueuesConfig
from corral.tenancy.fairshare import UsageLedger
from corral.tenancy.model import Running, Work
from corral.tenancy.plan import ClusterView, Preemption, RoundConfig, RoundPlan, plan_round, tenancy_for
from corral.tenancy.queues import Tenancy
from corral.tenancy.quota import NOT_PREEMPTIBLE
from corral.tenancy.reservation import FastBooker, expected_end
from corral.tenancy.round import NO_ROOM_NOW, ShapeCache, clock_text


class Evictions(Protocol):
    """How the scheduler carries out preemptions. Pod keys are UIDs."""

    def busy(self) -> bool:
        """A preemption is still being carried out: the round plans with preempt=False."""
        ...

    def stopping(self) -> frozenset[str]:
        """Pod keys being evicted: their Running has stopping=True."""
        ...

    def protected(self) -> frozenset[str]:
        """Pod keys that may not be victims now (a PDB allows no disruption): Running.preemptible=False."""
        ...

    def held(self) -> Mapping[str, Allocation]:
        """Preemptor pod key -> the capacity held for it until it binds."""
        ...

    def start(self, preemption: Preemption, victims: Sequence[tuple[str, str, str]]) -> None:
        """Evict `victims` ((uid, namespace, name) each) for `preemption.preemptor`; never blocks."""
        ...

    def bound(self, key: str) -> None:
        """The preemptor `key` was bound (or is gone): its hold ends."""
        ...


class NoEvictions:
    """No preemption: never busy, nothing stopping, protected or held; `start` does nothing."""

    def busy(self) -> bool:
        return False

    def stopping(self) -> frozenset[str]:
        return frozenset()

    def protected(self) -> frozenset[str]:
        return frozenset()

    def held(self) -> Mapping[str, Allocation]:
        return {}

    def start(self, preemption: Preemption, victims: Sequence[tuple[str, str, str]]) -> None:
        return None

    def bound(self, key: str) -> None:
        return None


def preempts(evictions: Evictions) -> bool:
    """Whether preemption is planned at all: not with `NoEvictions` (nothing would carry it out, and a pod would be
    told it waits for victims that never go)."""
    return type(evictions) is not NoEvictions  # (a subclass that records or carries out does plan it)


# ------------------------------------------------------------------------------------------------ pods -> tenancy
#: A pod's time limit for planning (backfill, reservations) when it has no activeDeadlineSeconds: "2h", "90m", 3600.
TIME_LIMIT_ANNOTATION = "corral.dev/time-limit"
#: Metric codes (corral_scheduler_pending_pods{reason}) of pods that the queues hold back.
QUEUE_UNKNOWN = "queue_unknown"
QUEUE_PRIORITY = "queue_priority"
QUEUE_LIMIT = "queue_limit"
RESERVATION = "reservation"
PREEMPTING = "preempting"


def queue_map(config: QueuesConfig) -> dict[str, str]:
    """namespace -> queue, from the queues' `namespaces` lists."""
    return {ns: q.name for q in config.queues.values() for ns in q.namespaces}


def queue_for(obj: Mapping[str, Any], config: QueuesConfig, by_namespace: Mapping[str, str]) -> str:
    """The queue of a pod object: its queue label (corral's, Kueue's, KAI's: the label wins), else the queue its
    namespace is mapped to, else a queue named as its namespace, else the file's default queue."""
    meta = obj.get("metadata") or {}
    if not isinstance(meta, Mapping):
        return config.default_queue
    labelled = queue_label(meta)
    if labelled is not None:
        return labelled
    ns = str(meta.get("namespace") or "default")
    found = by_namespace.get(ns)
    if found is not None:
        return found
    return ns if ns in config.queues else config.default_queue


def _epoch(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def created_at(obj: Mapping[str, Any]) -> float:
    """metadata.creationTimestamp as epoch seconds (0 when absent: oldest first)."""
    meta = obj.get("metadata") or {}
    return (_epoch(meta.get("creationTimestamp")) if isinstance(meta, Mapping) else None) or 0.0


def time_limit_of(obj: Mapping[str, Any]) -> float | None:
    """How long a pod runs at most: spec.activeDeadlineSeconds, else its corral.dev/time-limit annotation, else None
    (planned with the default). Raises InvalidRequest naming the annotation when it is not a duration."""
    spec = obj.get("spec") or {}
    deadline = spec.get("activeDeadlineSeconds") if isinstance(spec, Mapping) else None
    if isinstance(deadline, int) and not isinstance(deadline, bool) and deadline > 0:
        return float(deadline)
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    raw = annotations.get(TIME_LIMIT_ANNOTATION) if isinstance(annotations, Mapping) else None
    if raw is None:
        return None
    seconds = parse_duration_seconds(str(raw), f"metadata.annotations[{TIME_LIMIT_ANNOTATION}]")
    if not seconds > 0:
        raise InvalidRequest(f"metadata.annotations[{TIME_LIMIT_ANNOTATION}]", f"must be more than 0, got {raw!r}")
    return seconds


def started_at(obj: Mapping[str, Any]) -> float | None:
    """When a bound pod started, as the API shows it after a restart: status.startTime, else its PodScheduled
    condition's lastTransitionTime (None: neither)."""
    status = obj.get("status") or {}
    if not isinstance(status, Mapping):
        return None
    t = _epoch(status.get("startTime"))
    if t is not None:
        return t
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "PodScheduled" and c.get("status") == "True":
            return _epoch(c.get("lastTransitionTime"))
    return None


@dataclass(frozen=True)
class Bound:
    """What the face keeps of a bound pod of this scheduler (the books keep its grant)."""

    namespace: str
    name: str
    queue: str
    started_at: float  # its bind time (the books'), after a restart status.startTime or PodScheduled's time
    time_limit_s: float | None = None
    stopping: bool = False  # being deleted (a deletionTimestamp): no victim again


def running_of(key: str, b: Bound, alloc: Allocation, stopping: frozenset[str], protected: frozenset[str],
               request: Request | None = None) -> Running:  # fmt: skip
    """A bound pod as tenancy's Running (its request: the books'; else what its grant holds)."""
    r = dataclasses.replace(request if request is not None else alloc_request(alloc), id=key)
    return Running(key, r, b.started_at, alloc.gpus, b.queue,
                   b.namespace, preemptible=key not in protected, stopping=b.stopping or key in stopping)  # fmt: skip


class BoundRequests(Mapping[str, Request]):
    """The books' request of each bound pod (`pods`: key -> a record with `.request`), read when the face makes a
    pod's Running (once per bound pod), not copied into a map every round."""

    def __init__(self, pods: Mapping[str, Any], bound: Mapping[str, Bound]) -> None:
        self._pods = pods
        self._bound = bound

    def __getitem__(self, key: str) -> Request:
        rec = self._pods.get(key) if key in self._bound else None
        if rec is None:
            raise KeyError(key)
        return rec.request  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[str]:
        return (k for k in self._bound if k in self._pods)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def alloc_request(alloc: Allocation) -> Request:
    gpus = alloc.gpus
    milli = gpus[0].milli if gpus else 0
    return Request(cpu_milli=alloc.cpu_milli, memory_mib=alloc.memory_mib, gpu_count=len(gpus),
                   gpu_milli=milli, gpu_memory_mib=gpus[0].memory_mib if gpus and milli < 1000 else 0,
                   id=alloc.request_id)  # fmt: skip


def work_of(p: Pending, gang_size: int = 0) -> Work:
    """A pending pod (read, with a queue) as tenancy's Work: one per pod; a gang member names its gang."""
    assert p.ask is not None
    return Work(p.key, p.ask.request, p.queue, p.namespace, submitted_at=p.created, gang=p.gang,
                gang_size=gang_size, time_limit_s=p.time_limit_s)  # fmt: skip


# ------------------------------------------------------------------------------------------------ one round
class Hold(NamedTuple):
    """Why a pod waits, in the words a user asks for: its queue, its position, what holds it, when it may start.
    (A tuple: a round makes one per waiting pod, ten thousand of them.)"""

    queue: str
    position: int  # 1-based, in the round's queue order (0: not offered)
    of: int
    holds: str  # "limit", "guarantee", "gang", "reservation of POD", "no room", "its victims to stop", ...
    estimated_start: float | None = None  # its reservation's start, when it has one

    def text(self) -> str:
        out = held_text(self.queue, self.position, self.of, self.holds)
        if self.estimated_start is not None:
            out += f"; estimated start {clock_text(self.estimated_start)}"
        return out


def held_text(queue: str, position: int, of: int, holds: str) -> str:
    """A waiting pod's words before its reason: "queue Q, position i of n; held by H" (Hold.text, less a start)."""
    if position:
        return f"queue {queue}, position {position} of {of}; held by {holds}"
    return f"queue {queue}; held by {holds}"


@dataclass(frozen=True)
class TenancyRound:
    decisions: list[Decision]  # one per pending pod, in the order given
    plan: RoundPlan | None  # None: nothing was offered
    holds: dict[str, Hold] = field(default_factory=dict)  # pod key -> why it waits (pods that wait)
    #: the bound pods in the books, as the round saw them (read only: the face keeps it for the next round)
    running: dict[str, Running] = field(default_factory=dict)
    #: The earliest time after `now` at which a bound pod (not being stopped) passes its minimum runtime: a pod that
    #: waits may preempt it from then, and no event of the cluster's says so (None: none)
    wake_at: float | None = None


#: A bound pod's cached Running: (its Bound, grant, stopping, protected, Running, fixed end or None, protected until)
RunEntry = tuple[Bound, Allocation, bool, bool, Running, float | None, float]


@dataclass
class Face:
    """What the scheduler keeps across rounds: the file, its tenancy (rebuilt when the nodes change), the fair-share
    ledger (finished pods' usage; lost on a restart: the API keeps no finished pods), the round's cache."""

    config: QueuesConfig
    round: RoundConfig
    ledger: UsageLedger
    by_namespace: dict[str, str]
    cache: ShapeCache = field(default_factory=ShapeCache)
    tenancy: Tenancy | None = None
    nodes_of: ClusterSnapshot | None = None  # the snapshot its tenancy was made for (capacity)
    #: Each bound pod's Running, made once while its Bound, grant and eviction state are the same, with its fixed
    #: expected end (None: no time limit) and the end of its minimum runtime (tens of thousands of bound pods a
    #: round: BENCHMARKS.md, k8s_round)
    runs: dict[str, RunEntry] = field(default_factory=dict)
    made: int = 0  # Running records made since `settle` last froze them
    booker: FastBooker = field(default_factory=FastBooker)  # the head's reservation, its columns kept between rounds
    bound_round: BoundRound | None = None  # the bound pods' part of the last round, while they stay as they were

    def enter(self, key: str, b: Bound, alloc: Allocation, stopping: bool, protected: bool,
              request: Request | None) -> RunEntry:  # fmt: skip
        """A bound pod's entry made and kept: (its Bound, grant, stopping, protected, Running, end, protected until).
        plan_pods makes one when the kept one is not for this Bound, grant and eviction state."""
        run = running_of(key, b, alloc, frozenset((key,)) if stopping else frozenset(),
                         frozenset((key,)) if protected else frozenset(), request)  # fmt: skip
        limit = b.time_limit_s
        entry = (b, alloc, stopping, protected, run, None if limit is None else b.started_at + limit,
                 b.started_at + self.config.min_runtime(b.queue))  # fmt: skip
        self.runs[key] = entry
        self.made += 1
        return entry

    @classmethod
    def of(cls, config: QueuesConfig, placement: Any) -> Face:
        return cls(config, RoundConfig(placement, config), UsageLedger(config.half_life_s), queue_map(config))

    def tenancy_for(self, snapshot: ClusterSnapshot) -> Tenancy:
        if self.tenancy is None or self.nodes_of is not snapshot:
            self.tenancy = tenancy_for(self.round, snapshot, self.ledger)
            self.nodes_of = snapshot
        return self.tenancy


#: Running records made since the collector last froze them, past which `settle` freezes them.
FREEZE_RUNS = 10_000
#: Allocations between the collector's youngest collections in the scheduler's process (Python's default: 700).
YOUNG_COLLECTION = 50_000


def collector_for_rounds() -> None:
    """Set the scheduler process's collector for its rounds: a round makes tens of thousands of short-lived objects
    (a pod's words, its Wait), and with Python's default threshold the youngest generation was collected about 30
    times a round, 12-20 ms of a 200 ms round (k8s_round, BENCHMARKS.md); most of them are freed by their count
    before a collection at YOUNG_COLLECTION allocations sees them. Cycles are still collected."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION, older, oldest)


def settle(face: Face) -> bool:
    """Keep the face's long-lived records out of the collector's full scans, as the start-up keeps the books'
    (`gc.freeze`, corral/k8s/cli.py): a Running per bound pod lives as long as its pod runs, and with tens of
    thousands of them each full scan cost a round 60-130 ms (k8s_round, BENCHMARKS.md). Done once more than
    FREEZE_RUNS were made since the last time (after the first round, then as pods come); True when it froze."""
    if face.made <= FREEZE_RUNS:
        return False
    gc.collect()
    gc.freeze()
    face.made = 0
    return True


def _kind(reason: str, limited: str | None) -> str:
    if limited is not None:
        return "guarantee" if limited == NOT_PREEMPTIBLE else "borrow limit" if "borrowing" in limited else "limit"
    if reason.startswith("gang"):
        return "gang"
    if reason.startswith("would delay the reservation"):
        return "reservation"
    return "no room"


_ID = r"[0-9A-Za-z/_.:-]*[0-9A-Za-z_]"  # (not the colon or full stop after it)
_JOB = re.compile(rf"\bjob ({_ID})")
#: Protected.text's "it may preempt job(s) UID, UID from ..." (tenancy's words for any face).
_JOBS = re.compile(rf"\bjobs? ({_ID}(?:, {_ID})*) from ")
#: The round's gang words: "gang: ..." and serve's Marathon wording of all or none.
_GANG = "gang: "
_MARATHON = "(the app asked for corral.gang: all start or none)"


def pod_words(reason: str, gang: str, name_of: Any) -> str:
    """The plan's words as a pod's reason: pods named (namespace/name, by `name_of(key)`) where the plan names jobs
    by id, "pods" for "jobs", and a gang's words naming its PodGroup (`gang`: "namespace/name") without the word
    "gang" twice or serve's Marathon wording."""

    def many(m: re.Match[str]) -> str:
        ids = m.group(1).split(", ")
        return f"pod{'s' if len(ids) > 1 else ''} {', '.join(name_of(i) for i in ids)} from "

    out = _JOBS.sub(many, reason)
    out = _JOB.sub(lambda m: f"pod {name_of(m.group(1))}", out)
    if gang and out.startswith(_GANG):
        out = out[len(_GANG) :]
    if gang:
        out = out.replace(_MARATHON, f"(PodGroup {gang}: all its members start or none)")
    return out


#: (the bound pods as Running, by pod key, their expected ends, the earliest end of a minimum runtime after now)
BoundPart = tuple[tuple[Running, ...], dict[str, Running], dict[str, float], float | None]


class BoundRound:
    """The bound pods' part of a round, kept for the next one while the same pods hold the same grants: the Bound
    map it was made from and each pod's entry (compared at C speed, by identity, next round), the Running records,
    and each pod's expected end and end of minimum runtime as columns (a round's ends and wake depend on its time)."""

    def __init__(self, bound: Mapping[str, Bound], stopping: AbstractSet[str], protected: AbstractSet[str],
                 running: tuple[Running, ...], running_by: dict[str, Running], entries: list[RunEntry],
                 default: float) -> None:  # fmt: skip
        self.bound, self.missing = dict(bound), len(bound) - len(entries)
        self.stopping, self.protected = stopping, protected
        self.running, self.running_by, self.entries, self.default = running, running_by, entries, default
        self.keys = list(running_by)
        self._columns: tuple[list[Allocation], Any, list[tuple[int, float | None]], Any, Any] | None = None
        self._ends: dict[str, float] | None = None  # the ends while every one is fixed and ahead (`ends`)

    def columns(self) -> tuple[list[Allocation], Any, list[tuple[int, float | None]], Any, Any]:
        """(grants, fixed ends (NaN: no time limit), (row, start) of those without one, ends of minimum runtime,
        whether each wakes a round (not being stopped))."""
        if self._columns is None:
            e = self.entries
            n = len(e)
            fixed = np.array(list(map(_END, e)), dtype=np.float64)  # (None, no time limit: NaN)
            self._columns = (
                list(map(_GRANT, e)),
                fixed,
                [(i, e[i][0].started_at) for i in np.flatnonzero(np.isnan(fixed)).tolist()],
                np.fromiter(map(_PROTECTED_UNTIL, e), dtype=np.float64, count=n),
                ~np.fromiter(map(_STOPPED, map(_BOUND, e)), dtype=np.bool_, count=n),
            )
        return self._columns

    def same(self, bound: Mapping[str, Bound], allocations: Mapping[str, Allocation], stopping: AbstractSet[str],
             protected: AbstractSet[str]) -> bool:  # fmt: skip
        """Whether a round over `bound` would make this part again: the same Bound objects, every one of them in the
        books with the same grant object as then, and the same pods being stopped and protected."""
        return (self.missing == 0 and self.bound == bound and self.stopping == stopping
                and self.protected == protected
                and list(map(allocations.get, self.keys)) == self.columns()[0])  # fmt: skip

    def ends(self, now: float) -> dict[str, float]:
        """Each pod's expected end at `now` (as the walk computes it: its fixed end, not before now). Read only: while
        every pod has a fixed end still ahead, the same dict again (a full cluster's rounds: 40,000 ends)."""
        _, fixed, open_, _, _ = self.columns()
        ahead = not open_ and not (fixed < now).any()  # (then every end is its fixed one, whatever `now` is)
        if ahead and self._ends is not None:
            return self._ends
        values = np.maximum(fixed, now).tolist()  # (a NaN, no time limit, is filled below)
        for i, started in open_:
            values[i] = expected_end(started, None, self.default, now)
        out = dict(zip(self.keys, values, strict=True))
        self._ends = out if ahead else None
        return out

    def wake(self, now: float) -> float | None:
        _, _, _, until, wakes = self.columns()
        later = until[(until > now) & wakes]
        return float(later.min()) if len(later) else None


def _bound_round(face: Face, bound: Mapping[str, Bound], allocations: Mapping[str, Allocation],
                 stopping: AbstractSet[str], protected: AbstractSet[str], requests: Mapping[str, Request] | None,
                 now: float, default: float) -> BoundPart:  # fmt: skip
    """The bound pods in the books as Running (each pod's entry made again where its Bound, grant or eviction state
    changed), their expected ends, and the earliest end of a minimum runtime after `now` (BoundRound's, which the
    face keeps for the next round).

    The walk is done at C speed (maps over the 40,000 pods, each kept entry checked by identity), with a Python step
    only for the pods whose entry must be made again (a cluster's churn: tens a round) and those not in the books."""
    requests = requests if requests is not None else {}  # (a BoundRequests counts 40,000 pods for its truth)
    keys = list(bound)
    n = len(keys)
    grants = list(map(allocations.get, keys))
    found: list[Any] = list(map(face.runs.get, keys, repeat(_NO_ENTRY)))
    same = np.fromiter(map(is_, map(_BOUND, found), bound.values()), dtype=np.bool_, count=n)
    same &= np.fromiter(map(is_, map(_GRANT, found), grants), dtype=np.bool_, count=n)
    if stopping or protected or any(map(_STOPPING, found)) or any(map(_PROTECTED, found)):
        same &= np.fromiter(map(eq, map(_STOPPING, found), map(stopping.__contains__, keys)), np.bool_, count=n)
        same &= np.fromiter(map(eq, map(_PROTECTED, found), map(protected.__contains__, keys)), np.bool_, count=n)
    absent = np.fromiter(map(is_, grants, repeat(None)), dtype=np.bool_, count=n)
    for i in np.flatnonzero(~same & ~absent).tolist():
        key, grant = keys[i], grants[i]
        assert grant is not None
        found[i] = face.enter(key, bound[key], grant, key in stopping, key in protected, requests.get(key))
    if absent.any():  # (not in the books: no Running, no end)
        kept_rows = np.flatnonzero(~absent).tolist()
        keys, found = [keys[i] for i in kept_rows], [found[i] for i in kept_rows]
    running = tuple(map(_RUN, found))
    running_by = dict(zip(keys, running, strict=True))
    if len(face.runs) > 2 * len(bound) + 64:
        face.runs = {k: v for k, v in face.runs.items() if k in bound}
    kept = face.bound_round = BoundRound(bound, stopping, protected, running, running_by, found, default)
    return kept.running, running_by, kept.ends(now), kept.wake(now)


_STOPPED = attrgetter("stopping")
#: A RunEntry's fields, read at C speed over a round's 40,000 entries (and the entry of a pod without one).
_BOUND, _GRANT, _STOPPING, _PROTECTED, _RUN = (itemgetter(i) for i in range(5))
_END, _PROTECTED_UNTIL = itemgetter(5), itemgetter(6)
_NO_ENTRY = (None, None, False, False, None, None, 0.0)


def plan_pods(
    face: Face,
    pending: Sequence[Pending],
    snapshot: ClusterSnapshot | None,
    bound: Mapping[str, Bound],
    now: float,
    gangs: Mapping[str, GangInfo] | None = None,
    evictions: Evictions | None = None,
    names: Mapping[str, str] | None = None,
    requests: Mapping[str, Request] | None = None,
) -> TenancyRound:
    """One round over ALL pending pods: plan_round on the books, carried into Bind | Wait per pod.

    `snapshot`: the books' (the caller holds their lock; starts are granted on it, as place_batch does); `bound`: the
    bound pods of this scheduler (pod key -> Bound; those in the snapshot become Running, the rest of the snapshot
    is capacity held by others); `evictions`: who is being evicted, who is protected, the capacity held for
    preemptors; `names`: pod key -> "namespace/name" of pods the words may name (a reservation's, a victim's);
    `requests`: the bound pods' requests (the books'; their priorities decide who may preempt whom)."""
    ev = evictions if evictions is not None else NoEvictions()
    gangs = gangs or {}
    names = names or {}
    out: dict[str, Decision] = {}
    offered: list[Pending] = []
    config = face.config
    if snapshot is None:
        return TenancyRound([Wait(p, "corral knows no nodes yet", NO_NODES, False) for p in pending], None)
    sizes: dict[str, int] = {}
    for p in pending:
        if p.ask is None:
            out[p.key] = Wait(p, p.error, INVALID, True)
            continue
        spec = config.queues.get(p.queue)
        if spec is None:
            known = ", ".join(sorted(config.queues))
            out[p.key] = Wait(p, f"pod {p.name}: queue {p.queue!r} is not in the queues file {config.source} (queues: "
                              f"{known})", QUEUE_UNKNOWN, True)  # fmt: skip
            continue
        if spec.max_priority is not None and p.ask.request.priority > spec.max_priority:
            out[p.key] = Wait(p, f"pod {p.name}: priority {p.ask.request.priority} is above queue {p.queue}'s "
                              f"max_priority {spec.max_priority}", QUEUE_PRIORITY, True)  # fmt: skip
            continue
        if p.gang:
            info = gangs.get(p.gang)
            if info is None or info.error:
                why = info.error if info is not None else "its PodGroup is not known yet"
                out[p.key] = Wait(p, f"gang {p.gang}: {why}", GANG_INVALID, info is not None)
                continue
            sizes[p.gang] = max(1, info.min_member - info.held)
        offered.append(p)
    by_item = {p.key: p for p in offered}
    held = dict(ev.held())
    # The capacity held for preemptors: taken first by their own pod (once its victims are gone), kept from the rest.
    # evict.Evictions says which victims each hold is freeing: they are released on the round's view (what they hold
    # is the preemptor's), so the hold stands whole while they terminate, not only the part already free.
    victims_of = getattr(ev, "victims_of", None)
    ready = getattr(ev, "ready", None)
    said = getattr(ev, "reason", None)
    view = snapshot.copy()
    early: list[tuple[Pending, Allocation]] = []
    for key, kept in held.items():
        for uid in victims_of(key) if victims_of is not None else ():
            if uid in view.allocations:
                view.release(uid)
        # (one that does not fit: its victims have not gone yet, or the books changed; planned with the rest)
        with contextlib.suppress(AllocationError):
            view.allocate(dataclasses.replace(kept, request_id=f"held:{key}"))
    for p in [p for p in offered if p.key in held] if held else ():
        mine = held.get(p.key)
        if mine is None:
            continue
        if ready is not None and not ready(p.key):
            offered.remove(p)
            out[p.key] = Wait(p, (said(p.key) if said is not None else "") or "preempting: waiting for its victims "
                              "to stop", PREEMPTING, False)  # fmt: skip
            continue
        if f"held:{p.key}" in view.allocations:
            view.release(f"held:{p.key}")
        try:
            view.allocate(dataclasses.replace(mine, request_id=p.key))
        except AllocationError:
            offered.remove(p)
            out[p.key] = Wait(p, "preempting: waiting for its victims to stop", PREEMPTING, False)
            continue
        # kept on the view: the rest of the round is planned beside it (it binds there first)
        early.append((p, dataclasses.replace(mine, request_id=p.key)))
        offered.remove(p)
    # A gang short of members waits whole (tenancy's group check says so, without a placement).
    items: list[Any] = [p if not p.gang else dataclasses.replace(p) for p in offered]
    stopping, protected = ev.stopping(), ev.protected()
    default = face.round.default_time_limit_s
    allocations = snapshot.allocations
    last_round = face.bound_round
    if last_round is not None and last_round.same(bound, allocations, stopping, protected):
        # The same bound pods with the same grants as last round (a full cluster's queue: pods arrive, none starts):
        # their Running records, and their ends and wake from columns kept with them, without a walk of them all.
        # (the very tuple of last round: tenancy knows it again without comparing 40,000 ids)
        running, running_by = last_round.running, last_round.running_by
        ends, wake_at = last_round.ends(now), last_round.wake(now)
    else:
        running, running_by, ends, wake_at = _bound_round(face, bound, allocations, stopping, protected, requests,
                                                          now, default)  # fmt: skip
    tenancy = face.tenancy_for(snapshot)

    def convert(item: Pending) -> Work:
        return work_of(item, sizes.get(item.gang, 0))

    preempt = preempts(ev) and not ev.busy()
    # (`view` is this round's own copy of the books: the round grants its starts in it)
    plan = plan_round(face.round, items, running, ClusterView(view, ends, owned=True), tenancy, now, work_of=convert,
                      cache=face.cache, preempt=preempt, booker=face.booker, prefilter=True)  # fmt: skip
    holds: dict[str, Hold] = {}
    for p, alloc in early:
        out[p.key] = _bind(p, alloc, snapshot)
    for s in plan.starts:
        p = by_item[s.job_id]
        out[p.key] = _bind(p, s.allocation, snapshot)
    not_offered = [p for p in pending if p.key in out]  # (the invalid, the held and the bound among them)
    started = {st.job_id for st in plan.starts}
    in_line = [k for k in plan.order if k not in started]  # the queue order of the pods that still wait
    explained: dict[Any, str] = {}
    words: dict[tuple[str, str], str] = {}  # the plan's words with pods named (a few texts for thousands of pods)

    pending_by: dict[str, Pending] = {}

    def name_of(key: str) -> str:
        """A pod the words name: by `names`, else a pending pod's name, else a bound pod's (a few a round)."""
        found = names.get(key)
        if found is not None:
            return found
        if not pending_by:
            pending_by.update((p.key, p) for p in pending)
        if key in pending_by:
            return pending_by[key].name
        b = bound.get(key)
        return f"{b.namespace}/{b.name}" if b is not None else key

    reservation = {r.job_id: r for r in plan.reservations}
    preempting = {pr.preemptor for pr in plan.preemptions}
    special = preempting | reservation.keys()  # (one or two pods a round: worded apart)
    first = next(iter(plan.reservations), None)
    reasons, limited_of = plan.reasons, tenancy.limited
    unresolvable = plan.unresolvable
    n_line = len(in_line)
    # A round's thousands of waiting pods share a few (reason, gang, limit) texts: each is worded once
    worded: dict[tuple[str, str, str | None], tuple[str, str, str]] = {}
    # ... and per queue the pieces of each text around the pod's position (head, tail, the words at position 0),
    # with what holds it and its code
    pieces: dict[tuple[str, str, str, str | None], tuple[str, str, str, str, str]] = {}
    entry_of = face.cache.known  # (the entry made for this very pod object, if any)

    def texts_of(reason: str, gang: str, limited: str | None) -> tuple[str, str, str]:
        """(the plan's words with pods named, what holds the pod, its code), once per (reason, gang, limit)."""
        texts = worded.get((reason, gang, limited))
        if texts is None:
            kind = _kind(reason, limited)
            said = words.get((reason, gang))
            if said is None:
                said = words[(reason, gang)] = pod_words(reason, gang, name_of)
            if kind == "gang" and gang:
                kind = f"gang {gang}"
            if kind == "reservation":
                kind = f"the reservation of pod {name_of(first.job_id)}" if first is not None else kind
            gang_short = kind.startswith("gang") and "queued" in said
            code = (QUEUE_LIMIT if limited is not None else GANG_INCOMPLETE if gang_short
                    else RESERVATION if kind.startswith("the reservation") else "unschedulable")  # fmt: skip
            texts = worded[(reason, gang, limited)] = (said, kind, code)
        return texts

    def tell(p: Pending, at: int) -> None:
        """A waiting pod's words and hold, `at` its position (0: none), as a first of its kind or a special one."""
        key = p.key
        reason = reasons.get(key, "waiting for the next round")
        if reason == NO_ROOM_NOW and p.ask is not None:
            entry = entry_of(p)
            worded_shape = explained.get(entry.shape) if entry is not None else None
            reason = worded_shape if worded_shape is not None else _explained(snapshot, p, explained, face)
        limited = limited_of.get(key)
        said, kind, code = texts_of(reason, p.gang, limited)
        if key in special:
            r = None
            if key in preempting:
                kind = "its victims to stop (preempting)"
                code = code if limited is not None else PREEMPTING
            else:
                r = reservation[key]
            hold = Hold(p.queue, at, n_line, kind, r.start if r is not None else None)
            holds[key] = hold
            text = f"{hold.text()}: {said}"
            out[key] = Wait(p, text, code, key in unresolvable, text)
            return
        head, tail = f"queue {p.queue}, position ", f" of {n_line}; held by {kind}: {said}"
        gist = f"{held_text(p.queue, 0, n_line, kind)}: {said}"
        pieces[(p.queue, reason, p.gang, limited)] = (head, tail, gist, kind, code)
        holds[key] = Hold(p.queue, at, n_line, kind)
        out[key] = Wait(p, f"{held_text(p.queue, at, n_line, kind)}: {said}" if at else gist, code, key in unresolvable,
                        gist)  # fmt: skip

    # Each waiting pod in queue order (its position is its place there), then any the plan kept out of the order
    # (no position). The common case inlined: this runs for ten thousand pods a round.
    for at, key in enumerate(in_line, 1):
        p = by_item[key]
        reason = reasons.get(key, "waiting for the next round")
        if reason == NO_ROOM_NOW and p.ask is not None:
            # the prefilter's short words: the engine's own, once per shape a round (what a user acts on)
            entry = entry_of(p)
            if entry is None or (reason := explained.get(entry.shape, "")) == "":
                tell(p, at)
                continue
        piece = pieces.get((p.queue, reason, p.gang, limited_of.get(key)))
        if piece is None or key in special:
            tell(p, at)
            continue
        holds[key] = Hold(p.queue, at, n_line, piece[3])
        out[key] = Wait(p, f"{piece[0]}{at}{piece[1]}", piece[4], key in unresolvable, piece[2])
    if len(in_line) + len(plan.starts) < len(offered):
        ordered = set(plan.order)
        for p in offered:
            if p.key not in ordered:
                tell(p, 0)
    for p in not_offered:
        if isinstance(out[p.key], Wait) and p.ask is not None:
            spec = config.queues.get(p.queue)
            if spec is not None:
                holds[p.key] = Hold(p.queue, 0, len(in_line), "its own pod spec or its PodGroup")
    return TenancyRound([out[p.key] for p in pending], plan, holds, running_by, wake_at)


#: The most request shapes a round explains with the engine's words when the prefilter said only NO_ROOM_NOW.
EXPLAIN_SHAPES = 32


def _explained(snapshot: ClusterSnapshot, p: Pending, done: dict[Any, str], face: Face) -> str:
    assert p.ask is not None
    known = face.cache.known(p)  # (its shape's number, made when the round took it: no key built per pod)
    shape: Any = known.shape if known is not None else p.ask.request.placement_key()
    found = done.get(shape)
    if found is not None:
        return found
    if len(done) >= EXPLAIN_SHAPES:
        return NO_ROOM_NOW
    from corral.placement import place, render

    try:
        d = place(snapshot, p.ask.request, face.round.placement)  # (a decision only: nothing is granted)
        text = render(d.explanation) if d.allocation is None else NO_ROOM_NOW
    except InvalidRequest as exc:
        text = str(exc)
    done[shape] = text
    return text


def victims_of(preemption: Preemption, bound: Mapping[str, Bound]) -> list[tuple[str, str, str]]:
    """(uid, namespace, name) of each victim of `preemption` that is a bound pod of this scheduler."""
    return [(v, bound[v].namespace, bound[v].name) for v in preemption.victims if v in bound]


def _bind(p: Pending, alloc: Allocation, snapshot: ClusterSnapshot) -> Bind:
    assert p.ask is not None
    snapshot.allocate(alloc)
    assignment = make_assignment(alloc, snapshot.nodes[alloc.node_index], p.ask)
    return Bind(p, alloc, assignment, assignment_annotations(assignment, p.ask.style))


__all__ = [
    "Bound",
    "BoundRequests",
    "Evictions",
    "Face",
    "Hold",
    "NoEvictions",
    "TenancyRound",
    "collector_for_rounds",
    "plan_pods",
    "queue_for",
    "settle",
]
