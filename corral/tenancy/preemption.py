"""Preemption: which running jobs a waiting job may stop, and which of them it stops (pure; the daemon carries it out).

    the preemptor = the face's choice (serve: the first job in queue order that waits, due, not unresolvable, once
                    no preemption is pending; sim fair: the same, at most PREEMPT_ATTEMPTS a round)
    candidates    = running jobs that are preemptible, not already being stopped, that `Rules.borrowing` says hold
                    more than their queue's guarantee, and that the preemptor outranks (`Rules.outranks`: a strictly
                    higher priority class) or may reclaim from (`Rules.below_guarantee`: its queue is below its own),
                    and that have run their minimum runtime since they (re)started (`Rules.min_runtime`, per queue,
                    5 minutes by default): a victim loses at most one run per minimum runtime, however often
                    higher-priority jobs come and go; one still protected is named in the preemptor's reason with the
                    time it may be preempted (`protected`)
    all of them released on a copy of the snapshot, and the preemptor still does not fit  -> no preemption at all
    otherwise, per node where it then fits (fewest candidates, then cheapest, first; at most PREEMPT_NODES):
                    for k = 1, 2, ...: every k of the node's candidates released on a copy, place(preemptor) on it;
                    the first k with a fit wins, and among its sets the one losing the least run time (GPU-seconds,
                    then seconds); the best over the nodes: fewest, then cheapest
                    (past a budget of placements, the first node's set pared down greedily, the costliest first)
    -> Choice: the victims, the grant the preemptor gets on what they free, and why (the words each victim keeps)

Shares count exactly: a victim's release gives back exactly its grant on its GPU (ClusterSnapshot.release), so a
0.5-GPU share frees half a GPU and nothing more. The freed resources are the preemptor's: during the grace period
the victims' expected ends are their kill deadlines, so the head's reservation (corral.tenancy.reservation) holds
them and backfill does not take them; the preemptor is first in queue order when they come free.

Pure and face-free: the preemptor is a `Work`, the candidates `Running` records (corral.tenancy.model); what the
face calls a job being stopped is `Running.stopping`. One machine (corral serve) is one node, so the search is the
exhaustive one; a cluster's (sim fair, next the k8s scheduler) is bounded by its nodes.

The seam for queues (docs/preemption.md): `Rules` holds the predicates. With no queues nothing is guaranteed, so
every running job "borrows", no queue is below its guarantee, and any job may borrow: a job of strictly higher
priority may preempt preemptible jobs of lower priority, and that is all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, NamedTuple, overload

import numpy as np
import numpy.typing as npt

from corral.model.holdings import Holdings, give_back
from corral.model.resources import Allocation, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.tenancy.gang import place_gang
from corral.tenancy.model import Running, Work
from corral.tenancy.round import clock_text

#: Placements tried per search before the greedy fallback: one machine has few running jobs, so the exhaustive
#: search is usually far below it; the bound keeps a round cheap when many small shares run.
SEARCH_BUDGET = 64
#: Nodes searched per preemptor on a cluster (fewest, then cheapest, candidates first): bounds the cost there.
PREEMPT_NODES = 64


def _always(_: object) -> bool:
    return True


def _never(_: object) -> bool:
    return False


def _no_min_runtime(_: Running) -> float:
    return 0.0


def span_text(seconds: float) -> str:
    """A minimum runtime as a person writes it: 300 -> "5m", 90 -> "1m30s", 3600 -> "1h", 0 -> "0s"."""
    s = round(seconds)
    parts = [f"{s // 3600}h" if s >= 3600 else "", f"{s % 3600 // 60}m" if s % 3600 >= 60 else "",
             f"{s % 60}s" if s % 60 or not s else ""]  # fmt: skip
    return "".join(parts)


def higher_priority(preemptor: Work, victim: Running) -> bool:
    """The priority-class rule: a strictly higher `priority` (equal priorities never preempt each other)."""
    return preemptor.priority > victim.priority


@dataclass(frozen=True)
class Rules:
    """Who may preempt whom. The defaults are the rules without queues; a face with queues supplies the real ones
    (serve: `corral.daemon.queues.Queues.preemption_rules`).

    `borrowing(victim)`: it holds more than its queue's guarantee (only such jobs may be preempted).
    `below_guarantee(preemptor)`: its queue holds less than its guarantee (it may reclaim from any borrower).
    `outranks(preemptor, victim)`: a higher priority class.
    `may_borrow(work)`: a non-preemptible job may start now (without queues: always; with them: only within its
    queue's guarantee, the price of not being preemptible).
    `min_runtime(victim)`: seconds it runs after it (re)started before it may be preempted (here none)."""

    borrowing: Callable[[Running], bool] = _always
    below_guarantee: Callable[[Work], bool] = _never
    outranks: Callable[[Work, Running], bool] = higher_priority
    may_borrow: Callable[[Work], bool] = _always
    min_runtime: Callable[[Running], float] = _no_min_runtime
    #: The running jobs `borrowing` may accept, found without asking it job by job (a cluster's tens of thousands):
    #: a superset of them, in `running`'s order; None: every job is asked.
    borrowers: Callable[[Sequence[Running]], Sequence[Running]] | None = None
    #: `candidates` worked out at once (a face's columns, as a Pool), or None when it cannot: then the rules are
    #: asked job by job
    victims: Callable[[Work, Sequence[Running], float, ClusterSnapshot], Sequence[Victim] | None] | None = None

    def protected_until(self, victim: Running) -> float:
        """Until when `victim` may not be preempted: its (re)start plus its minimum runtime (-inf: not protected)."""
        if victim.started_at is None:
            return -math.inf
        return victim.started_at + self.min_runtime(victim)

    @property
    def borrows_freely(self) -> bool:
        """No `may_borrow` rule (no queues): every job may start, preemptible or not."""
        return self.may_borrow is _always

    def why(self, preemptor: Work, victim: Running) -> str | None:
        """Why `preemptor` may preempt `victim` ("priority" or "guarantee"), None when it may not."""
        return self.whys(preemptor)(victim)

    def whys(self, preemptor: Work) -> Callable[[Running], str | None]:
        """`why` for one preemptor over many victims: what depends on the preemptor alone (whether its queue is
        below its guarantee) is asked once, not once per running job (tens of thousands on a cluster)."""
        below: list[bool] = []  # asked at most once, and only when a victim needs it (as `why` always did)
        borrowing, outranks = self.borrowing, self.outranks

        def why(victim: Running) -> str | None:
            if not victim.preemptible or victim.stopping or not borrowing(victim):
                return None
            if outranks(preemptor, victim):
                return "priority"
            if not below:
                below.append(self.below_guarantee(preemptor))
            return "guarantee" if below[0] else None

        return why


class Victim(NamedTuple):
    """A running job a preemptor may stop (a tuple: a cluster's search makes tens of thousands a round)."""

    job: Running
    why: str  # "priority" | "guarantee"
    seconds: float  # run time lost: now - started_at
    gpu_seconds: float  # the same, times the GPUs it holds (shares as fractions)
    min_runtime_s: float = 0.0  # what it had to run first (Rules.min_runtime), said in its words
    grant: Allocation | None = None  # what it holds in the snapshot it was found in

    def held_in(self, snapshot: ClusterSnapshot) -> Allocation:
        """What it holds in `snapshot` (the grant it was found with, else the snapshot's record of it)."""
        return self.grant if self.grant is not None else snapshot.allocations[self.job.id]

    @property
    def free_from(self) -> float:
        """When its minimum runtime ends (Rules.protected_until: -inf when it never started)."""
        started = self.job.started_at
        return -math.inf if started is None else started + self.min_runtime_s


class Pool(Sequence[Victim]):
    """Candidates as columns (`Rules.victims` on a cluster's tens of thousands of running jobs): the same victims,
    in the same order, as a list of them, but a Victim is made only when it is read. `choose` and `protected` rank
    and bound the nodes from the columns, and read the victims of the few nodes they search.

    `jobs`, `grants`: each candidate and what it holds in the snapshot it was found in; `priority`: whether it may
    be preempted for priority (else for the guarantee); `seconds`, `gpu_seconds`, `min_runtime_s`: as Victim's;
    `started`: its (re)start (NaN: never started)."""

    def __init__(
        self,
        jobs: list[Running],
        grants: list[Allocation],
        priority: npt.NDArray[np.bool_],
        seconds: npt.NDArray[np.float64],
        gpu_seconds: npt.NDArray[np.float64],
        min_runtime_s: npt.NDArray[np.float64],
        started: npt.NDArray[np.float64],
        holdings: Holdings | None = None,
        gpus: int = 0,
    ) -> None:
        self.jobs, self.grants = jobs, grants
        self.priority, self.seconds, self.gpu_seconds = priority, seconds, gpu_seconds
        self.min_runtime_s = min_runtime_s
        # Victim.free_from, element by element
        self.free_from = np.where(np.isnan(started), -np.inf, started + min_runtime_s)
        #: what each holds (Holdings' columns, kept between rounds by the face's `holdings`): node, CPU, memory,
        #: tag + 1, share owner or not, GPU milli and memory per GPU index, grants
        self.held = (holdings or Holdings()).of(grants, gpus)
        self.node, self.cpu, self.mem, self.gpus = self.held[0], self.held[1], self.held[2], self.held[7]
        self._made: dict[int, Victim] = {}

    def give_back(self, future: ClusterSnapshot, rows: npt.NDArray[np.int64]) -> None:
        """Release what these rows hold on `future`, a what-if copy (as `release_held` of their grants)."""
        node, cpu, mem, tag, shared, g_milli, g_mem, _ = (column[rows] for column in self.held)
        if shared.any():
            future.release_held([self.grants[i] for i in rows.tolist()])
        else:
            give_back(future, node, cpu, mem, tag, g_milli, g_mem)

    def __len__(self) -> int:
        return len(self.jobs)

    @overload
    def __getitem__(self, i: int) -> Victim: ...
    @overload
    def __getitem__(self, i: slice) -> list[Victim]: ...
    def __getitem__(self, i: int | slice) -> Victim | list[Victim]:
        if isinstance(i, slice):
            return self.victims(range(len(self))[i])
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        made = self._made.get(i)
        if made is None:
            why = "priority" if self.priority[i] else "guarantee"
            made = Victim(self.jobs[i], why, float(self.seconds[i]), float(self.gpu_seconds[i]),
                          float(self.min_runtime_s[i]), self.grants[i])  # fmt: skip
            self._made[i] = made
        return made

    def __iter__(self) -> Iterator[Victim]:
        return (self[i] for i in range(len(self)))

    def victims(self, rows: Sequence[int] | npt.NDArray[np.int64]) -> list[Victim]:
        """The victims of these rows, in their order."""
        return [self[i] for i in (rows.tolist() if isinstance(rows, np.ndarray) else rows)]

    def cheapest_first(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """`rows` in `choose`'s order: run time lost in GPU-seconds, then seconds, then the larger numeric id (a
        stable sort, as `choose`'s)."""
        ids = [self.jobs[i].id for i in rows.tolist()]
        if any(i.isdigit() and len(i) > 18 for i in ids):  # (beyond int64: the key as Python compares it)
            return np.array(sorted(rows.tolist(), key=lambda i: _cheap(self[i])), dtype=np.int64)
        tie = np.fromiter((-int(i) if i.isdigit() else 0 for i in ids), dtype=np.int64, count=len(ids))
        return rows[np.lexsort((tie, self.seconds[rows], self.gpu_seconds[rows]))]


def _cheap(v: Victim) -> tuple[float, float, int]:
    """`choose`'s order of victims: the run time they lose, cheapest first (GPU-seconds, then seconds)."""
    return (v.gpu_seconds, v.seconds, -int(v.job.id) if v.job.id.isdigit() else 0)


def _total(values: Iterator[float] | Sequence[float]) -> float:
    """A sum added up in order, one by one (as np.bincount adds a column's weights, on every Python)."""
    out = 0.0
    for x in values:
        out += x
    return out


@dataclass(frozen=True)
class Choice:
    preemptor: Work
    victims: tuple[Victim, ...]
    allocation: Allocation  # where the preemptor fits once the victims are gone
    placements: int = 0  # engine calls the search made
    words: dict[str, str] = field(default_factory=dict)  # victim id -> its preemption reason

    @property
    def gpu_seconds(self) -> float:
        return sum(v.gpu_seconds for v in self.victims)


def cost(job: Running, now: float) -> tuple[float, float]:
    """(GPU-seconds, seconds) of run time lost if `job` is stopped now."""
    seconds = max(0.0, now - (job.started_at if job.started_at is not None else now))
    return seconds * job.gpu_milli / 1000, seconds


def _grant(left: ClusterSnapshot, preemptor: Work, request: Request, config: PlacementConfig) -> Allocation | None:
    # Its own seed: planning must not change the face's draws (as corral.tenancy.reservation).
    rng = np.random.default_rng(0)
    if preemptor.instances > 1:  # a gang: all its instances must fit on what the victims leave
        return place_gang(left, request, preemptor.instances, config, rng).allocation
    # (where it fits is all a trial asks: no explanation composed)
    return place(left, request, config, rng, explain_placed=False, explain_refused=False).allocation


class Bound:
    """What releasing victims could free on a node at most, for a preemptor of whole GPUs (one instance): its fully
    free GPUs plus every GPU the victims touch, its free CPU and memory plus theirs. A set below the request in any
    of them cannot make room, so the search does not place it (the result is the same; the budget goes further)."""

    def __init__(self, snapshot: ClusterSnapshot, request: Request) -> None:
        self.snapshot = snapshot
        self.request = request

    def room(self, node: Any, gpus: Any, cpu: Any, mem: Any) -> Any:
        """Whether `node` (or each of an array of nodes) would have the request's whole GPUs, CPU and memory with
        `gpus` more whole GPUs and `cpu` and `mem` more free (scalars or arrays alike)."""
        s, r = self.snapshot, self.request
        return (
            (s.gpu_full_free[node] + gpus >= r.gpu_count)
            & (s.cpu_free[node] + cpu >= r.cpu_milli)
            & (s.mem_free[node] + mem >= r.memory_mib)
        )

    def could(self, node: int, chosen: Sequence[Victim]) -> bool:
        s = self.snapshot
        gpus = cpu = mem = 0
        for v in chosen:
            a = v.held_in(s)
            gpus += len(a.gpus)
            cpu += a.cpu_milli
            mem += a.memory_mib
        return bool(self.room(node, gpus, cpu, mem))

    def could_any(self, node: int, victims: Sequence[Victim], k: int) -> bool:
        """Whether some `k` of `victims` could make room (`could` for each k-set is False when this is): the k
        largest of each resource together, a bound no k-set exceeds."""
        held = [v.held_in(self.snapshot) for v in victims]
        top = sorted((len(a.gpus) for a in held), reverse=True)[:k]
        cpu = sorted((a.cpu_milli for a in held), reverse=True)[:k]
        mem = sorted((a.memory_mib for a in held), reverse=True)[:k]
        return bool(self.room(node, sum(top), sum(cpu), sum(mem)))


def choose(
    snapshot: ClusterSnapshot,
    preemptor: Work,
    running: Sequence[Running],
    config: PlacementConfig,
    now: float,
    rules: Rules | None = None,
    budget: int = SEARCH_BUDGET,
    found: Sequence[Victim] | None = None,
) -> Choice | None:
    """The fewest, then cheapest, running jobs whose release lets the preemptor's request be placed on `snapshot`;
    None when no eligible set does (then nothing is preempted). `snapshot` is not changed; each allocation in it is
    named by its holder's id (`Running.id`). `found`: `candidates(...)`, when the caller has them."""
    rules = rules or Rules()
    request = preemptor.placing
    found = found if found is not None else candidates(snapshot, preemptor, running, now, rules)
    # (a cluster's whole-GPU preemptor: sets that could not make room are not placed; one machine: the search as
    # it always was)
    bound = Bound(snapshot, request) if request.whole_gpus and preemptor.instances <= 1 and len(snapshot) > 1 else None
    # Cheapest first: the search tries sets in this order, so within one size the first fits tend to be cheap.
    pool = found if isinstance(found, Pool) and bound is not None else None
    if pool is not None:  # (from the columns: a Victim made only for the nodes searched)
        rows = pool.cheapest_first(np.flatnonzero(pool.free_from <= now))
        if not len(rows):
            return None
    else:
        victims = sorted((v for v in found if v.free_from <= now), key=_cheap)
        if not victims:
            return None
    calls = 0
    # One scratch copy for the whole search: a trial releases its victims on it, places, and grants them back (a
    # copy per trial cost more than the placement on a cluster's books: k8s_round, BENCHMARKS.md); what the engine
    # memoised for the copy stays valid for the nodes a trial did not touch.
    left = snapshot.copy()

    def fits(chosen: Sequence[Victim]) -> Allocation | None:
        nonlocal calls
        calls += 1
        gone = left.release_many([v.job.id for v in chosen])
        try:
            return _grant(left, preemptor, request, config)
        finally:
            for a in reversed(gone):
                left.allocate(a)

    every = snapshot.copy(allocations=False)  # (every candidate gone: released once, on a what-if copy)
    if pool is not None:
        pool.give_back(every, rows)
    else:
        every.release_held([v.held_in(snapshot) for v in victims])
    calls += 1
    everything = _grant(every, preemptor, request, config)
    if everything is None:
        return None  # never preempt for a job that then cannot start
    if fits(()) is not None:
        return None  # it fits as things are (e.g. something ended since the pass): nothing to stop
    best: tuple[tuple[int, float, float], tuple[Victim, ...], Allocation] | None = None
    nodes = _pool_nodes(snapshot, pool, rows, everything, bound) if pool is not None else (
        _nodes(snapshot, victims, everything, bound))  # fmt: skip
    for on_node in nodes:
        node = on_node[0].held_in(snapshot).node_index
        for k in range(1, len(on_node) + 1):
            if best is not None and k > best[0][0]:
                break  # a node with fewer victims won already
            if best is not None and k == best[0][0] and sum(v.gpu_seconds for v in on_node[:k]) > best[0][1]:
                break  # its k cheapest already lose more GPU time: no set of k here is cheaper
            if bound is not None and not bound.could_any(node, on_node, k):
                continue  # no k of them could make room: none is tried (a node of eight 1-GPU pods: 254 sets)
            fit = False
            for chosen in combinations(on_node, k):
                if calls >= budget:
                    break
                if bound is not None and not bound.could(node, chosen):
                    continue
                price = (k, sum(v.gpu_seconds for v in chosen), sum(v.seconds for v in chosen))
                if best is not None and not price < best[0]:
                    continue  # it could not replace the best: not placed (the budget goes further)
                grant = fits(chosen)
                if grant is not None:
                    fit = True
                    best = (price, chosen, grant)
            if fit or calls >= budget:
                break
        if calls >= budget:
            break
    if best is None:
        # Past the budget: pare a node's set down, dropping the costliest first while the preemptor still fits.
        for on_node in nodes:
            kept = list(on_node)
            if len(nodes) > 1 and fits(kept) is None:
                continue  # (one node: its set is every candidate, known to fit)
            for v in sorted(on_node, key=lambda v: (v.gpu_seconds, v.seconds), reverse=True):
                trial = [x for x in kept if x is not v]
                if trial and fits(trial) is not None:
                    kept = trial
            grant = fits(kept)
            assert grant is not None  # the node's whole set fit, and every step kept a fit
            best = ((0, 0.0, 0.0), tuple(kept), grant)
            break
    if best is None:
        return None
    said = {v.job.id: words(preemptor, v, now) for v in best[1]}
    return Choice(preemptor, best[1], best[2], calls, said)


def _nodes(
    snapshot: ClusterSnapshot, victims: Sequence[Victim], everything: Allocation, bound: Bound | None = None
) -> list[list[Victim]]:
    """The candidates grouped by node, fewest then cheapest first, at most PREEMPT_NODES nodes; one machine: one
    group. On a cluster a single preemptor's grant lies on one node, so only victims there can make room for it
    there; the node the preemptor took with every candidate gone comes first among equals. With `bound`, a node
    where even all its candidates gone could not make room is left out (it would only spend the search's budget)."""
    by_node: dict[int, list[Victim]] = {}
    for v in victims:
        by_node.setdefault(v.held_in(snapshot).node_index, []).append(v)
    if len(by_node) == 1:
        return list(by_node.values())
    if bound is not None:
        by_node = {i: vs for i, vs in by_node.items() if bound.could(i, vs) or i == everything.node_index}

    def rank(item: tuple[int, list[Victim]]) -> tuple[int, float, float, int, int]:
        i, vs = item
        return (len(vs), _total([v.gpu_seconds for v in vs]), _total([v.seconds for v in vs]),
                i != everything.node_index, i)  # fmt: skip

    return [vs for _, vs in sorted(by_node.items(), key=rank)[:PREEMPT_NODES]]


def _pool_nodes(
    snapshot: ClusterSnapshot, pool: Pool, rows: npt.NDArray[np.int64], everything: Allocation, bound: Bound | None
) -> list[list[Victim]]:
    """`_nodes` from the columns: the victims of `rows` (in that order) grouped, bounded and ranked per node with
    numpy, and made only for the nodes returned. (Sums add in order, as `_nodes`'s.)"""
    node = pool.node[rows]
    n = len(snapshot)
    count = np.bincount(node, minlength=n)
    present = np.flatnonzero(count)
    if len(present) == 1:
        return [pool.victims(rows)]

    def summed(values: npt.NDArray[np.int64] | npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        out: npt.NDArray[np.float64] = np.bincount(node, weights=values[rows], minlength=n)  # type: ignore[assignment]
        return out

    if bound is not None:
        freed = (summed(column).astype(np.int64)[present] for column in (pool.gpus, pool.cpu, pool.mem))
        present = present[bound.room(present, *freed) | (present == everything.node_index)]
    gpu_s, sec = summed(pool.gpu_seconds)[present], summed(pool.seconds)[present]
    ranked = present[np.lexsort((present, present != everything.node_index, sec, gpu_s, count[present]))]
    ranked = ranked[:PREEMPT_NODES]
    return [pool.victims(rows[node == i]) for i in ranked.tolist()]


def candidates(
    snapshot: ClusterSnapshot, preemptor: Work, running: Sequence[Running], now: float, rules: Rules
) -> Sequence[Victim]:
    """The running jobs `preemptor` may preempt by the rules, protected by their minimum runtime or not (a Pool
    when the rules work them out from columns)."""
    if rules.victims is not None:
        found = rules.victims(preemptor, running, now, snapshot)
        if found is not None:
            return found
    out: list[Victim] = []
    held = snapshot.allocations
    why = rules.whys(preemptor)
    for job in rules.borrowers(running) if rules.borrowers is not None else running:
        grant = held.get(job.id)
        if grant is not None:
            reason = why(job)
            if reason is not None:
                gpu_s, s = cost(job, now)
                out.append(Victim(job, reason, s, gpu_s, rules.min_runtime(job), grant))
    return out


@dataclass(frozen=True)
class Protected:
    """Preemption would help, but not before `at`: the victims it would need are still in their minimum runtime."""

    at: float
    job_ids: tuple[str, ...]
    min_runtime_s: float

    def text(self) -> str:
        """Words for the preemptor's reason (a fixed time: the same every round until something changes)."""
        ids = ", ".join(self.job_ids)
        return (
            f"it may preempt job{'s' if len(self.job_ids) > 1 else ''} {ids} from {clock_text(self.at)}, when "
            f"{'they have' if len(self.job_ids) > 1 else 'it has'} run the minimum runtime of "
            f"{span_text(self.min_runtime_s)} (docs/preemption.md)"
        )


def protected(
    snapshot: ClusterSnapshot,
    preemptor: Work,
    running: Sequence[Running],
    config: PlacementConfig,
    now: float,
    rules: Rules,
    found: Sequence[Victim] | None = None,
) -> Protected | None:
    """When `choose` found nothing: the earliest time preemption would let the preemptor fit, counting the
    candidates still in their minimum runtime as they come out of it (None: it would not help even then). `found`:
    `candidates(...)`, when the caller has them.

    The candidates come out in order; whether the preemptor fits once the first k are out (with those free now)
    only grows with k, so the fewest is found by bisection. On a cluster, a single preemptor of whole GPUs fits on
    one node: the earliest time is the earliest any one node has room (`_protected_on_nodes`), and only that node's
    candidates are named."""
    found = found if found is not None else candidates(snapshot, preemptor, running, now, rules)
    request = preemptor.placing
    on_nodes = len(snapshot) > 1 and preemptor.instances <= 1 and request.whole_gpus
    if on_nodes and isinstance(found, Pool):
        return _protected_in_pool(snapshot, preemptor, request, found, now, config)
    waiting = sorted((v for v in found if v.free_from > now), key=lambda v: v.free_from)
    if not waiting:
        return None
    free = [v for v in found if v.free_from <= now]
    if on_nodes:
        return _protected_on_nodes(snapshot, preemptor, request, free, waiting, config)

    def fits(k: int) -> bool:
        left = snapshot.copy(allocations=False)  # (a what-if copy)
        left.release_held([v.held_in(snapshot) for v in [*free, *waiting[:k]]])
        return _grant(left, preemptor, request, config) is not None

    if not fits(len(waiting)):
        return None
    lo, hi = 1, len(waiting)  # fits(hi); fewer than lo do not fit
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return _protected_by(waiting[:lo])


def _protected_by(chosen: Sequence[Victim]) -> Protected:
    return Protected(chosen[-1].free_from, tuple(v.job.id for v in chosen), max(v.min_runtime_s for v in chosen))


def _protected_on_nodes(
    snapshot: ClusterSnapshot,
    preemptor: Work,
    request: Request,
    free: Sequence[Victim],
    waiting: Sequence[Victim],
    config: PlacementConfig,
) -> Protected | None:
    """`protected` on a cluster: per node, the fewest of its candidates (in the order they come out) that could
    make room (`Bound`); the nodes by that time, each placed in turn (at most PREEMPT_NODES placements) until one
    fits and no node left could be earlier."""
    free_on: dict[int, list[Victim]] = {}
    for v in free:
        free_on.setdefault(v.held_in(snapshot).node_index, []).append(v)
    waiting_on: dict[int, list[Victim]] = {}
    for v in waiting:
        waiting_on.setdefault(v.held_in(snapshot).node_index, []).append(v)
    bound = Bound(snapshot, request)
    options: list[tuple[float, int, int]] = []  # (the time it could first fit, node, how many of its candidates)
    for i, ws in waiting_on.items():
        base = free_on.get(i, [])
        for k in range(1, len(ws) + 1):
            if bound.could(i, [*base, *ws[:k]]):
                options.append((ws[k - 1].free_from, i, k))
                break
    options.sort()
    return _protected_search(snapshot, preemptor, request, options, waiting_on.__getitem__,
                             lambda i: free_on.get(i, []), config)  # fmt: skip


def _protected_in_pool(
    snapshot: ClusterSnapshot, preemptor: Work, request: Request, pool: Pool, now: float, config: PlacementConfig
) -> Protected | None:
    """`_protected_on_nodes` from the columns: each node's fewest waiting candidates that could make room, found
    with running sums per node; Victims made only for the nodes placed."""
    free_from = pool.free_from
    rows = np.flatnonzero(free_from > now)
    if not len(rows):
        return None
    rows = rows[np.argsort(free_from[rows], kind="stable")]  # the order they come out (as `protected` sorts)
    free = np.flatnonzero(free_from <= now)
    n = len(snapshot)
    node = pool.node[rows]
    by_node = np.argsort(node, kind="stable")  # each node's waiting candidates together, in the order they come out
    grouped, nodes = rows[by_node], node[by_node]
    starts = np.flatnonzero(np.r_[True, nodes[1:] != nodes[:-1]])
    first = np.repeat(starts, np.diff(np.r_[starts, len(nodes)]))  # each row's group's first position

    def freed(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        # what the node's free candidates and its first k waiting ones hold, at each of its waiting candidates
        base = np.bincount(pool.node[free], weights=values[free], minlength=n).astype(np.int64)
        run = np.cumsum(values[grouped])
        out: npt.NDArray[np.int64] = base[nodes] + run - np.r_[0, run][first]
        return out

    could = Bound(snapshot, request).room(nodes, freed(pool.gpus), freed(pool.cpu), freed(pool.mem))
    hit = np.flatnonzero(could)
    found_at = hit[np.r_[True, nodes[hit][1:] != nodes[hit][:-1]]] if len(hit) else hit  # each node's first
    at, on, k = free_from[grouped[found_at]], nodes[found_at], found_at - first[found_at] + 1
    options = [(float(at[j]), int(on[j]), int(k[j])) for j in np.lexsort((k, on, at)).tolist()]
    end = dict(zip(starts.tolist(), np.r_[starts[1:], len(nodes)].tolist(), strict=True))
    where = {int(nodes[a]): (a, end[a]) for a in starts.tolist()}
    free_node = pool.node[free]

    def waiting_on(i: int) -> list[Victim]:
        a, b = where[i]
        return pool.victims(grouped[a:b])

    def free_on(i: int) -> list[Victim]:
        return pool.victims(free[free_node == i])

    return _protected_search(snapshot, preemptor, request, options, waiting_on, free_on, config)


def _protected_search(
    snapshot: ClusterSnapshot,
    preemptor: Work,
    request: Request,
    options: Sequence[tuple[float, int, int]],
    waiting_on: Callable[[int], list[Victim]],
    free_on: Callable[[int], list[Victim]],
    config: PlacementConfig,
) -> Protected | None:
    """The nodes by the time they could first make room (`options`: (time, node, how many of its waiting
    candidates), earliest first), each placed in turn until one fits and no node left could be earlier."""
    best: tuple[float, list[Victim]] | None = None
    tries = 0
    for at, i, first in options:
        if (best is not None and at >= best[0]) or tries >= PREEMPT_NODES:
            break
        ws, base = waiting_on(i), free_on(i)
        for k in range(first, len(ws) + 1):
            if (best is not None and ws[k - 1].free_from >= best[0]) or tries >= PREEMPT_NODES:
                break
            tries += 1
            left = snapshot.copy(allocations=False)  # (a what-if copy)
            left.release_held([v.held_in(snapshot) for v in [*base, *ws[:k]]])
            if _grant(left, preemptor, request, config) is not None:
                best = (ws[k - 1].free_from, ws[:k])
                break
    return _protected_by(best[1]) if best is not None else None


def words(preemptor: Work, victim: Victim, now: float) -> str:
    """The reason a victim keeps: by whom, when, and why it was allowed."""
    rule = (
        f"a higher priority than this job's {victim.job.priority}"
        if victim.why == "priority"
        else "its queue was below its guarantee, and this job borrowed above its own queue's"
    )
    who = f"job {preemptor.id} (user {preemptor.user}, priority {preemptor.priority})"
    ran = (
        f" (it had run {span_text(victim.seconds)}, past its minimum runtime of {span_text(victim.min_runtime_s)})"
        if victim.min_runtime_s > 0
        else ""
    )
    return f"preempted by {who} at {clock_text(now)}: {rule}{ran}"
