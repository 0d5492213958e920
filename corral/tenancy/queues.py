"""The queues between rounds and in one: fair-share usage, each round's order and limits, and who may preempt whom.

    Tenancy(config, capacity, ...)       a face holds one (serve: corral.daemon.queues.Queues, which adds the file,
                                         the store and the Unix groups), or plan_round makes one per call
    each end    record(running, end)     its run added to its account's decayed usage (UsageLedger)
    each round  plan_queues(waiting queues, running, free, now)
                  -> order(entries): priority, fair share, age (fairshare.fair_order)
                  -> gate: the limits of quota.Gate, checked before a job is placed; a gang's members as one ask
                preemption_rules()       borrowers, queues below their guarantee, minimum runtime (preemption.Rules)

Accounts (docs/queues.md): a job is charged to (queue, user). Its weight is the queue's part of the weights of the
queues that have work, times the user's part of the weights of that queue's users with work:
    weight(q, u) = w_q / sum_active w_q' * w_u,q / sum_active_in_q w_u',q
and the order's key is the account's dominant share of decayed usage over that weight (fairshare.fair_order).

Pure: no file, no clock (`now` is an argument), no store; a user's Unix groups come from `groups_of`, which a face
overrides (serve reads the system's; by default a user is in no group).
"""

from __future__ import annotations

from bisect import insort
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from corral.model.holdings import Holdings
from corral.model.snapshot import ClusterSnapshot
from corral.tenancy.config import QueuesConfig, Vector
from corral.tenancy.fairshare import (
    _LN2,
    RESOURCES,
    FairRuns,
    FloatArray,
    Offer,
    UsageLedger,
    amount,
    decayed_capacity,
    dominant_share,
    expected_usage,
    share_rows,
)
from corral.tenancy.model import Running, Work
from corral.tenancy.preemption import Pool, Rules, Victim
from corral.tenancy.quota import (
    COLUMNS_FROM,
    NOT_PREEMPTIBLE,
    ZERO,
    Gate,
    JobColumns,
    Usage,
    add,
    below_guarantee,
    borrowing,
    demand,
    held,
    measure,
    measure_columns,
    over_guarantee,
    queue_rows,
    start_key,
)
from corral.tenancy.round import RoundQueues


class _Store:
    """Every running job `Tenancy._columns` has read, a row each (by the Running object's id; the objects are kept,
    so no id is reused by another object meanwhile)."""

    def __init__(self) -> None:
        self.slot: dict[int, int] = {}
        self.jobs: list[Running] = []
        self.keys: list[tuple[float, int, str]] = []
        self.vec = np.zeros((0, 5), dtype=np.int64)
        self.amt = np.zeros((0, len(amount())), dtype=np.float64)
        self.starts = np.zeros(0, dtype=np.float64)
        self.code = np.zeros(0, dtype=np.int64)
        self.ranked: list[int] = []  # the rows by start key (quota.start_key)
        self.rank = np.zeros(0, dtype=np.int64)  # each row's place in `ranked`
        self.priority = np.zeros(0, dtype=np.int64)
        self.victim = np.zeros(0, dtype=np.bool_)  # preemptible and not being stopped


class Tenancy:
    """One face's queues: the configuration, the usage ledger, and what the last round left (for views)."""

    def __init__(
        self,
        config: QueuesConfig,
        capacity: FloatArray,
        whole_gpu_memory_mib: int,
        gpu_memory_of: Callable[[int], int],
        active: bool = True,
    ) -> None:
        """`capacity`: the machine's or cluster's (fairshare.amount); `whole_gpu_memory_mib`: what a whole GPU is
        counted as holding before it is placed (the largest GPU's); `gpu_memory_of`: a GPU's memory by its index (a
        whole-GPU grant without a memory figure holds all of it). `active` False: no queues file, so the order is
        priority then age, and no limits (serve without --queues)."""
        self.config = config
        self.active = active
        self.capacity = capacity
        self._whole_mem = whole_gpu_memory_mib
        self._gpu_memory_of = gpu_memory_of
        self.ledger = UsageLedger(config.half_life_s)
        #: job id -> (entry, its offer, its key for the limits' verdicts), while the entry lives
        self._offers: dict[str, tuple[Any, Offer[Any], tuple[str, str, int, int]]] = {}
        #: A job's projected share by what decides it: its amounts and time limit (not the shape's index, which the
        #: round's ShapeCache may renumber when it prunes).
        self._projected: dict[tuple[int, int, int, int, int, float | None], float] = {}
        #: fair_order's result from each account's offers kept sorted across rounds (its offers are the cached ones)
        self._fair: FairRuns[Any] = FairRuns()
        self.usage = Usage()  # the last round's holdings (for GET /v1/queues)
        self.queue_of_id: dict[str, str] = {}  # the last round's waiting jobs' queues (for explain)
        self.limited: dict[str, str] = {}  # the last round's jobs held back by a limit, and which
        self.started: set[str] = set()  # the jobs the last round started (no longer waiting)
        self.waiting_accounts: set[Hashable] = set()  # ("user", queue, user) of the last round's waiting jobs
        self._gid_of: dict[str, int] = {}  # each user's primary gid, as their jobs carry it (for group weights)
        #: The last `measure` and the accounts' running amounts, with the running jobs they were made of (their ids
        #: in order, and the configuration): reused while the same jobs run, as most rounds of a cluster see.
        #: (The jobs themselves are kept with their ids, so that no id is reused by another object meanwhile.)
        self._measured: tuple[list[int], QueuesConfig, Usage, list[Running]] | None = None
        #: (the jobs' ids, each account's amounts and rows, the distinct starts and each job's index in them, the jobs)
        self._grouped: (
            tuple[
                list[int], dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]], list[float], np.ndarray, list[Running]
            ]
            | None
        )
        self._grouped = None
        #: The last `_columns`: (quota.JobColumns, each job's fair-share amount, its start, the jobs' ids, their rows
        #: in the store); a round takes the rows of the jobs the last one held and reads only the new ones.
        self._cols: tuple[JobColumns, np.ndarray, np.ndarray, list[int], np.ndarray] | None = None
        self._store = _Store()
        self._ids_of: tuple[tuple[Running, ...], list[int]] | None = None
        self._holdings = Holdings()  # what the preemption candidates hold, as columns kept between rounds
        self._account_numbers: dict[tuple[str, str, int], int] = {}

    def forget(self) -> None:
        """Drop what was kept for earlier rounds (a new configuration)."""
        self._offers.clear()
        self._fair = FairRuns()
        self._projected.clear()
        self._measured = None
        self._grouped = None
        self._cols = None
        self._store = _Store()
        self._ids_of = None
        self._holdings = Holdings()

    def _ids(self, jobs: Sequence[Running]) -> list[int]:
        """The ids of `jobs`, which the caches compare to know the same jobs (in the same order). A face that hands in
        the very same tuple as before (it cannot have changed) gets the same list, made once."""
        last = self._ids_of
        if last is not None and last[0] is jobs:
            return last[1]
        ids = list(map(id, jobs))
        self._ids_of = (jobs, ids) if type(jobs) is tuple else None  # (the tuple keeps its jobs: no id is reused)
        return ids

    def _columns(
        self, holding: Sequence[Running], ids: list[int] | None = None
    ) -> tuple[JobColumns, np.ndarray, np.ndarray]:
        """`holding` as columns: (JobColumns, fair-share amounts (n x 4), starts (NaN: not started)). Each Running
        object is read once into a row of a store that only grows (compacted when mostly stale); a round gathers its
        jobs' rows (a cluster's tens of thousands of jobs, a few new a round). `ids`: the jobs' ids, if made."""
        ids = ids if ids is not None else self._ids(holding)
        last = self._cols
        if last is not None and _same(last[3], ids):
            return last[0], last[1], last[2]
        n = len(holding)
        store = self._store
        if len(store.jobs) > 2 * n + 1024 or len(self._account_numbers) > 4 * n + 1024:
            store = self._store = _Store()
            self._account_numbers = {}
        numbers = self._account_numbers
        slot = store.slot
        rows = np.fromiter(map(slot.get, ids, repeat(-1)), np.int64, n)  # (no Python loop: tens of thousands)
        fresh = np.flatnonzero(rows < 0).tolist()
        if fresh:
            start, k = len(store.jobs), len(fresh)
            vec = np.zeros((k, 5), dtype=np.int64)
            amt = np.zeros((k, len(amount())), dtype=np.float64)
            starts = np.full(k, np.nan)
            code = np.zeros(k, dtype=np.int64)
            priority = np.zeros(k, dtype=np.int64)
            victim = np.zeros(k, dtype=np.bool_)
            memory_of = self._gpu_memory_of
            for r, i in enumerate(fresh):
                j = holding[i]
                slot[ids[i]] = start + r
                store.jobs.append(j)
                vec[r] = held(j, memory_of)
                amt[r] = self.held_vector(j)
                store.keys.append(start_key(j))
                code[r] = numbers.setdefault((j.queue, j.user, j.gid), len(numbers))
                if j.started_at is not None:
                    starts[r] = j.started_at
                priority[r] = j.priority
                victim[r] = j.preemptible and not j.stopping
            store.vec = np.concatenate((store.vec, vec))
            store.priority = np.concatenate((store.priority, priority))
            store.victim = np.concatenate((store.victim, victim))
            store.amt = np.concatenate((store.amt, amt))
            store.starts = np.concatenate((store.starts, starts))
            store.code = np.concatenate((store.code, code))
            rows[fresh] = np.arange(start, start + k)
            if k * 64 < len(store.ranked):  # a few new jobs among many: each put in its place
                for row in range(start, start + k):
                    insort(store.ranked, row, key=store.keys.__getitem__)
            else:  # (the rows already ranked are one sorted run: the sort merges the new ones into it)
                store.ranked = sorted(store.ranked + list(range(start, start + k)), key=store.keys.__getitem__)
            store.rank = np.empty(len(store.ranked), dtype=np.int64)
            store.rank[store.ranked] = np.arange(len(store.ranked))
        # start keys never tie between two jobs (the id is in them), so ordering by rank is their sort
        order = np.argsort(store.rank[rows], kind="stable").astype(np.int64)
        cols = JobColumns(list(holding), store.vec[rows], [], store.code[rows], list(numbers), order)
        out = (cols, store.amt[rows], store.starts[rows])
        self._cols = (*out, ids, rows)
        return out

    def _measure(self, holding: Sequence[Running], ids: list[int] | None = None) -> Usage:
        """quota.measure of `holding`, reused (copied: a round's Gate charges its starts to it) while the same
        Running objects run under the same configuration. Not with a face's own Unix groups (they may change
        between rounds without a job changing)."""
        mine = type(self).groups_of is Tenancy.groups_of
        ids = (ids if ids is not None else self._ids(holding)) if mine else []
        last = self._measured
        if mine and last is not None and last[1] is self.config and _same(last[0], ids):
            u = last[2]
        else:
            if len(holding) >= COLUMNS_FROM:
                u = measure_columns(self.config, self._columns(holding, ids or None)[0], self.groups_of)
            else:
                memory_of = self._gpu_memory_of
                u = measure(self.config, holding, lambda j: held(j, memory_of), self.groups_of)
            self._measured = (ids, self.config, u, list(holding)) if mine else None
        return Usage(dict(u.queue), dict(u.queue_user), dict(u.queue_group), dict(u.user), dict(u.group),
                     dict(u.running), set(u.borrowing_ids), dict(u.queue_of_borrower), dict(u.borrowed),
                     u.borrowing_rows)  # fmt: skip

    def groups_of(self, user: str, gid: int) -> tuple[str, ...]:
        """The names of a user's groups (none here; a face that knows them overrides this)."""
        return ()

    def user_weight(self, queue: str, user: str) -> float:
        """A user's weight among a queue's users: its weight in the queue, times its weight across queues, times the
        weights of its Unix groups (in the queue and across queues); 1 for what the file does not name."""
        spec = self.config.queues.get(queue)
        w = 1.0
        if spec is not None and (p := spec.user(user)) is not None:
            w *= p.weight
        if (p := self.config.user(user)) is not None:
            w *= p.weight
        gid = self._gid_of.get(user)
        if gid is not None and ((spec is not None and spec.groups) or self.config.groups):
            for g in self.groups_of(user, gid):
                for table in ((spec.groups if spec is not None else {}), self.config.groups):
                    if (pg := table.get(g)) is not None:
                        w *= pg.weight
        return w

    # ---------------------------------------------------------------------------------------------- preemption
    def preemption_rules(self) -> Rules:
        """Who may preempt whom with queues (docs/preemption.md, docs/queues.md). Without a queues file: the rules
        without queues (a strictly higher priority preempts lower-priority preemptible jobs).

        victims     = running jobs that are part of their queue's excess above its guarantee (`quota.borrowing`: the
                      latest started of a queue above it), and preemptible
        preemptor   = of a strictly higher priority, or its queue is below its guarantee (`quota.below_guarantee`)
        not preemptible = starts only while its queue stays within its guarantee (`may_borrow`): the price of never
                      being a victim is never borrowing
        Each rule reads the holdings of the round that calls it (`self.usage`), so a reload takes effect at once."""
        if not self.active:
            return Rules(min_runtime=self.min_runtime_of)

        def is_borrowing(job: Running) -> bool:
            return borrowing(job.id, self.usage)

        def is_below(work: Work) -> bool:
            spec = self.config.queues.get(work.queue)
            return spec is not None and below_guarantee(spec, self.usage)

        def borrowers(running: Sequence[Running]) -> list[Running]:
            ids = self.usage.borrowing_ids
            return [j for j in running if j.id in ids]

        def victims(preemptor: Work, running: Sequence[Running], now: float, snapshot: ClusterSnapshot) -> (
            Sequence[Victim] | None
        ):  # fmt: skip
            return self._victims(preemptor, running, now, snapshot, is_below)

        return Rules(
            borrowing=is_borrowing, below_guarantee=is_below, may_borrow=self.within_guarantee,
            min_runtime=self.min_runtime_of, borrowers=borrowers, victims=victims,
        )  # fmt: skip

    def _victims(
        self,
        preemptor: Work,
        running: Sequence[Running],
        now: float,
        snapshot: ClusterSnapshot,
        is_below: Callable[[Work], bool],
    ) -> Pool | None:
        """`preemption.candidates` under these rules from the round's columns: which running jobs may be victims
        (preemptible, not being stopped, borrowing, and outranked or reclaimed from), their run time lost and minimum
        runtime, as numpy columns (a Pool: a Victim is made only for the few a search reads; tens of thousands of
        running pods a round).
        None where the columns do not describe `running` (then the rules are asked job by job)."""
        ids = self._ids(running)
        measured, last = self._measured, self._cols
        if (len(running) < COLUMNS_FROM or measured is None or not _same(measured[0], ids) or last is None
                or not _same(last[3], ids)):  # fmt: skip
            return None
        borrowing = measured[2].borrowing_rows
        if borrowing is None:
            return None
        cols, starts, rows = last[0], last[2], last[4]
        store = self._store
        outranks = store.priority[rows] < preemptor.priority  # (higher_priority: strictly)
        may = store.victim[rows] & borrowing
        # (whether its queue is below its guarantee is asked only when a victim needs it, as Rules.whys does)
        chosen = np.flatnonzero(may if not outranks[may].all() and is_below(preemptor) else may & outranks)
        started = starts[chosen]
        # cost(): max(0, now - started) (0 when not started), times the GPU milli held, over 1000 (the same float
        # operations, element by element)
        seconds = np.where(np.isnan(started), 0.0, np.maximum(0.0, now - np.nan_to_num(started, nan=now)))
        gpu_seconds = seconds * cols.vec[chosen, 0] / 1000
        queue_min = np.array([self.config.min_runtime(q) for q, _, _ in cols.accounts], dtype=np.float64)
        held = snapshot.allocations
        jobs = [running[i] for i in chosen.tolist()]
        found = [held.get(job.id) for job in jobs]
        grants = [g for g in found if g is not None]
        if len(grants) < len(found):  # (one not in the snapshot is no candidate)
            kept = np.array([g is not None for g in found], dtype=np.bool_)
            chosen, seconds, gpu_seconds = chosen[kept], seconds[kept], gpu_seconds[kept]
            jobs = [j for j, g in zip(jobs, found, strict=True) if g is not None]
        return Pool(jobs, grants, outranks[chosen], seconds, gpu_seconds, queue_min[cols.code[chosen]],
                    starts[chosen], self._holdings, snapshot.max_gpus)  # fmt: skip

    def min_runtime_of(self, job: Running) -> float:
        """How long `job` runs after it (re)started before it may be preempted: its queue's `min_runtime`."""
        return self.config.min_runtime(job.queue)

    def within_guarantee(self, work: Work) -> bool:
        """Whether `work` would start with its queue still within its guarantee, in each dimension the queue is
        guaranteed (as `quota.measure` counts borrowing). A queue guaranteed nothing has no room for it."""
        spec = self.config.queues.get(work.queue)
        if spec is None:
            return False
        return over_guarantee(self.usage.queue.get(work.queue, ZERO), self.whole_demand(work), spec.guarantee) is None

    def whole_demand(self, work: Work) -> Vector:
        """What a job asks for in all: a gang's N instances (a gang group's N members) count N times."""
        return demand(work.request, self._whole_mem, work.whole_instances)

    # ---------------------------------------------------------------------------------------------- usage
    def held_vector(self, job: Running) -> np.ndarray:
        """What a job holds for fair share: GPUs by their part (milli), every instance of a gang."""
        n = job.instances
        memory_of = self._gpu_memory_of
        return amount(
            sum(g.milli for g in job.gpus),
            sum(g.memory_mib or (memory_of(g.index) if g.milli >= 1000 else 0) for g in job.gpus),
            job.request.cpu_milli * n,
            job.request.memory_mib * n,
        )

    def record(self, job: Running, finished_at: float, ledger: UsageLedger | None = None) -> None:
        """A run has ended: its usage is kept, decayed, from now on (in `ledger`: a ledger being rebuilt)."""
        if job.started_at is None:
            return
        a = self.held_vector(job)
        for account in (("queue", job.queue), ("user", job.queue, job.user)):
            (self.ledger if ledger is None else ledger).record(account, a, job.started_at, finished_at)

    def usages(
        self, holding: Sequence[Running], now: float, ids: list[int] | None = None
    ) -> dict[tuple[str, ...], np.ndarray]:
        """Decayed usage per account (queue and (queue, user)), running jobs included.

        Each account's running jobs are kept as one array of amounts (rows in `holding`'s order) while the same
        jobs run; their decayed usage is added in that order (a cumulative sum: the same float additions, in the
        same order, as UsageLedger.usage's loop, so every share and every order is the same to the last bit)."""
        ids = ids if ids is not None else self._ids(holding)
        last = self._grouped
        if last is not None and _same(last[0], ids):
            grouped, distinct, which = last[1], last[2], last[3]
        else:
            cols, amounts_all, starts_all = self._columns(holding, ids)
            started = np.flatnonzero(~np.isnan(starts_all))  # (in `holding`'s order)
            # (a cluster's pods start in bursts, to the second: each distinct start's factor is computed once)
            unique, inverse = np.unique(starts_all[started], return_inverse=True)
            distinct, which = unique.tolist(), inverse.reshape(-1)
            amounts = amounts_all[started]
            pairs: dict[tuple[str, str], int] = {}
            pair_of = np.array([pairs.setdefault((q, user), len(pairs)) for q, user, _ in cols.accounts] or [0])
            pair = pair_of[cols.code[started]]
            by_queue: dict[str, list[int]] = {}
            for (q, _), c in pairs.items():
                by_queue.setdefault(q, []).append(c)
            # each account's rows in `holding`'s order (np.flatnonzero keeps it)
            grouped = {("queue", q): (amounts[rows], rows) for q, cs in by_queue.items()
                       if len(rows := np.flatnonzero(np.isin(pair, cs)))}  # fmt: skip
            for (q, user), c in pairs.items():
                rows = np.flatnonzero(pair == c)
                if len(rows):
                    grouped[("user", q, user)] = (amounts[rows], rows)
            self._grouped = (ids, grouped, distinct, which, list(holding))
        ledger = self.ledger
        h = ledger.half_life_s
        scale = h / _LN2
        # running_usage's factor, per job in Python's own float arithmetic (numpy's power may differ by an ulp), once
        # per distinct start a round (its queue's account and its user's share it)
        factors = np.array([scale * (1.0 - 2.0 ** (-max(0.0, now - t) / h)) for t in distinct], dtype=np.float64)
        factors = factors[which] if len(factors) else factors
        out: dict[tuple[str, ...], np.ndarray] = {}
        for acc in {a for a in ledger.accounts() if isinstance(a, tuple)} | set(grouped):
            total = ledger.usage(acc, now)
            found = grouped.get(acc)
            if found is not None:
                amounts_of, rows = found
                # the rows added to the total one by one, in order
                total = np.cumsum(np.vstack((total, amounts_of * factors[rows][:, None])), axis=0)[-1]
            out[acc] = total
        return out

    # ---------------------------------------------------------------------------------------------- a round
    def plan_queues(
        self, waiting: Mapping[str, str], holding: Sequence[Running], free: Vector, now: float,
        default_time_limit_s: float,
    ) -> RoundQueues | None:  # fmt: skip
        """The order and the gate of one pass over the works `waiting` (id -> queue), with `holding` running and
        `free` free (quota.free_of); None without a queues file (priority, then age, no limits)."""
        config = self.config
        ids = self._ids(holding)  # (once a round: the caches below compare them)
        self.usage = self._measure(holding, ids)
        queue_of_id = dict(waiting)
        self.queue_of_id = queue_of_id
        started: set[str] = set()
        self.started = started
        if not self.active:
            self.limited = {}
            return None
        usages = self.usages(holding, now, ids)
        cap = decayed_capacity(self.capacity, config.half_life_s)
        h = config.half_life_s
        gate = Gate(config, self.usage, free, set(queue_of_id.values()), self.groups_of)
        limited: dict[str, str] = {}
        self.limited = limited
        whole_mem = self._whole_mem
        demands: dict[int, Vector] = {}

        def projected(work: Work) -> float:
            r = work.request
            key = (r.gpu_count, r.gpu_milli, r.gpu_memory_mib, r.cpu_milli, r.memory_mib, work.time_limit_s)
            p = self._projected.get(key)
            if p is None:
                gmem = whole_mem if r.whole_gpus else r.gpu_memory_mib
                a = amount(r.gpu_count * r.gpu_milli, r.gpu_count * gmem, r.cpu_milli, r.memory_mib)
                run = work.time_limit_s if work.time_limit_s is not None else default_time_limit_s
                p = dominant_share(expected_usage(a, run, h), cap)
                self._projected[key] = p
            return p

        def order(entries: list[Any]) -> list[Any]:
            offers = []
            cache = self._offers
            for e in entries:
                found = cache.get(e.work.id)
                if found is not None and found[0] is e:
                    offers.append(found[1])
                    continue
                work: Work = e.work
                numeric = int(work.id) if work.id.isdigit() else 0
                q = queue_of_id[work.id]
                o = Offer(e, ("user", q, work.user), work.priority,
                          work.submitted_at, (numeric, work.id), projected(work))  # fmt: skip
                cache[work.id] = (e, o, (q, work.user, work.gid, e.shape))
                self._gid_of[work.user] = work.gid
                offers.append(o)
            if len(cache) > 2 * len(entries) + 64:
                live = {e.work.id for e in entries}
                for k in [k for k in cache if k not in live]:
                    del cache[k]
            accounts = {o.account for o in offers}
            self.waiting_accounts = accounts
            active: dict[str, set[str]] = {}
            for account in accounts:
                acc: tuple[str, str, str] = account  # type: ignore[assignment]
                active.setdefault(acc[1], set()).add(acc[2])
            # the running jobs' accounts: each (queue, user, gid) once, in the order of its last job in `holding`
            # (a user's gid is its last job's, as a walk of every job leaves it)
            cols = self._columns(holding, ids)[0]
            if len(cols.code):
                present, from_end = np.unique(cols.code[::-1], return_index=True)
                last = len(cols.code) - 1 - from_end
                for c in present[np.argsort(last, kind="stable")].tolist():
                    q, user, gid = cols.accounts[c]
                    active.setdefault(q, set()).add(user)
                    self._gid_of[user] = gid
            qw = {q: (config.queues[q].weight if q in config.queues else 1.0) for q in active}
            total_q = sum(qw.values()) or 1.0
            uw: dict[tuple[str, str], float] = {}
            for q, users in active.items():
                ws = {u: self.user_weight(q, u) for u in users}
                total_u = sum(ws.values()) or 1.0
                for u, w in ws.items():
                    uw[(q, u)] = qw[q] / total_q * w / total_u

            def weight(account: Hashable) -> float:
                acc: tuple[str, str, str] = account  # type: ignore[assignment]
                return uw.get((acc[1], acc[2]), 1.0)

            shares: dict[Hashable, float] = {a: dominant_share(usages[a], cap) for a in accounts if a in usages}
            return self._fair.order(offers, shares, weight)

        verdicts = gate.verdicts
        offered = self._offers

        within = self.within_guarantee

        def check(e: Any) -> str | None:
            work: Work = e.work
            if not work.preemptible and not within(work):  # holdings grow with each start of the round
                limited[work.id] = NOT_PREEMPTIBLE
                return NOT_PREEMPTIBLE
            key = offered[work.id][2]  # (queue, user, gid, shape), made with its offer
            if key in verdicts:  # the common case, inlined: this runs once per queued job every round
                why = verdicts[key]
            else:
                want = demands.get(e.shape)
                if want is None:  # the shape's instances are part of it (round.ShapeCache)
                    want = demands[e.shape] = demand(work.request, whole_mem, work.instances)
                why = gate.check(*key, want, work.instances)
            if why is not None:
                limited[work.id] = why
            return why

        def took(e: Any) -> None:
            work: Work = e.work
            started.add(work.id)
            gate.took(queue_of_id[work.id], work.user, work.gid, demand(work.request, whole_mem, work.instances))

        def check_group(members: list[Any]) -> str | None:
            """A gang group's members as one ask: the sum of theirs against every limit (issue 23: three 1-GPU
            members of a queue limited to 2 GPUs never start, though each alone would fit)."""
            first: Work = members[0].work
            total = ZERO
            for m in members:
                total = add(total, demand(m.work.request, whole_mem, m.work.instances))
            q = queue_of_id[first.id]
            spec = config.queues.get(q)
            why: str | None
            if not first.preemptible and (
                spec is None or over_guarantee(self.usage.queue.get(q, ZERO), total, spec.guarantee) is not None
            ):
                why = NOT_PREEMPTIBLE
            else:
                why = gate.check_group(q, first.user, first.gid, total, len(members))
            if why is not None:
                for m in members:
                    limited[m.work.id] = why
            return why

        return RoundQueues(order, check, took, check_group)

    # ---------------------------------------------------------------------------------------------- views
    def queues_view(self) -> list[dict[str, object]]:
        """Each queue, with the jobs the last round left waiting in it and its holdings then."""
        pending = Counter(q for job_id, q in self.queue_of_id.items() if job_id not in self.started)
        return queue_rows(self.config, self.usage, pending)

    def shares(self, holding: Sequence[Running], now: float) -> dict[str, Any]:
        """sshare's rows: every queue, and every user in it (weights as the order uses them), with sprio's factors."""
        usages = self.usages(holding, now)
        h = self.config.half_life_s
        queues = sorted(set(self.config.queues) | {k[1] for k in usages if k[0] == "queue"})
        qrows = share_rows(
            {q: usages.get(("queue", q), amount()) for q in queues},
            {q: (self.config.queues[q].weight if q in self.config.queues else 1.0) for q in queues},
            self.capacity, h,
        )  # fmt: skip
        rows: list[dict[str, Any]] = []
        for qr in qrows:
            rows.append(_row(qr, qr.account, None))
            known = set(usages) | {a for a in self.waiting_accounts if isinstance(a, tuple)}
            users = sorted({k[2] for k in known if k[0] == "user" and k[1] == qr.account})
            weights = {u: self.user_weight(qr.account, u) for u in users}
            used = {u: usages.get(("user", qr.account, u), amount()) for u in users}
            for ur in share_rows(used, weights, self.capacity, h):
                rows.append(_row(ur, qr.account, ur.account))
        return {"half_life_s": h, "resources": list(RESOURCES), "accounts": rows}


def _row(r: Any, queue: str, user: str | None) -> dict[str, Any]:
    return {
        "queue": queue,
        "user": user,
        "weight": r.weight,
        "norm_shares": r.norm_shares,
        "usage": dict(zip(RESOURCES, r.usage, strict=True)),
        "dominant_share": r.share,
        "effective_usage": r.effective_usage,
        "fairshare_factor": r.factor,
    }


def _same(kept: list[int], ids: list[int]) -> bool:
    """Whether two lists of jobs' ids are the same (the very list first: a kept tuple's ids, without a walk)."""
    return kept is ids or kept == ids
