"""Quotas: what each queue, user and group holds, the limits a waiting job must respect, and who is borrowing.

    demand(job)   = (GPUs, GPU milli, GPU memory MiB, CPU milli, memory MiB) it asks for, every instance of a gang
                    counted; a whole GPU counts the largest GPU's memory of the machine (its real GPU is not known
                    before it is placed). GPUs count by their part, in milli: a 0.5 share is half a GPU (the `gpus`
                    dimension and `gpu_milli` are one measure; the file may write either)
    held(job)     = the same, from what a running job was granted

A waiting job may start (`Gate.check`, before it is placed) only if, with its demand added:
    queue  <= the queue's limit, and <= its guarantee + its borrow limit
    (queue, user), (queue, group), user, group  <= their limits (a job counts for every group its user is in)
    borrowing: the part of its demand above its queue's guarantee fits in what is lendable:
        lendable = free now - sum over OTHER queues that have waiting jobs of max(0, guarantee - in use)
    i.e. a queue borrows idle capacity only; what another queue with work is guaranteed is not lent.

Borrowing jobs (`borrowing`): a queue's running jobs in the order they started; each one whose start put the
queue's holdings above its guarantee in a dimension it is guaranteed (any, for a queue guaranteed nothing), and
every later one, is borrowing (the latest-started jobs
are the excess: stopping them brings the queue back to its guarantee and loses the least run time). The preemption
branch reclaims only these (`borrowing(job_id, usage)`), and only for a queue that is `below_guarantee`.
Pure: jobs, a configuration and the machine's free amounts in; verdicts and words out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from corral.model.resources import MILLI_PER_GPU, Request
from corral.model.snapshot import ClusterSnapshot
from corral.tenancy.config import DIMENSIONS, Amounts, QueuesConfig, QueueSpec, Vector, vector_value
from corral.tenancy.model import Running

ZERO: Vector = (0, 0, 0, 0, 0)
#: A user's Unix groups by name: (user, primary gid) -> names.
GroupsOf = Callable[[str, int], tuple[str, ...]]


def demand(request: Request, whole_gpu_memory_mib: int, instances: int = 1) -> Vector:
    """What a job asks for in all: `instances` copies of `request` (a gang counts every instance). GPUs count by
    their part (milli), so a 0.5 share is half a GPU of a `gpus` limit."""
    gmem = whole_gpu_memory_mib if request.whole_gpus else request.gpu_memory_mib
    milli = request.gpu_count * request.gpu_milli * instances
    return (
        milli,
        milli,
        request.gpu_count * gmem * instances,
        request.cpu_milli * instances,
        request.memory_mib * instances,
    )


def held(job: Running, gpu_memory_of: Callable[[int], int]) -> Vector:
    """What a running job holds (a whole-GPU grant without a memory figure holds all of that GPU's memory); a gang's
    grants are every instance's, and its CPU and memory its request's times its instances."""
    r = job.request
    n = job.instances
    gmem = sum(g.memory_mib or (gpu_memory_of(g.index) if g.milli >= MILLI_PER_GPU else 0) for g in job.gpus)
    milli = sum(g.milli for g in job.gpus)
    return (milli, milli, gmem, r.cpu_milli * n, r.memory_mib * n)


def add(a: Vector, b: Vector) -> Vector:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4])


def free_of(snapshot: ClusterSnapshot) -> Vector:
    """What is free on the machine now, as a quota vector (GPUs by their free part, in milli)."""
    present = snapshot.gpu_present
    milli = int(snapshot.gpu_milli_free[present].sum())
    return (
        milli,
        milli,
        int(snapshot.gpu_mem_free[present].sum()),
        int(snapshot.cpu_free.sum()),
        int(snapshot.mem_free.sum()),
    )


def amount_text(i: int, value: int) -> str:
    dim = DIMENSIONS[i]
    if dim == "gpus":  # milli: "1 GPU", "1.8 GPUs", "0.5 GPUs"
        return f"{value / MILLI_PER_GPU:g} GPU{'s' if value != MILLI_PER_GPU else ''}"
    if dim == "gpu_milli":
        return f"{value / MILLI_PER_GPU:g} GPUs of compute ({value} milli)"
    if dim in ("gpu_memory", "memory"):
        what = "GPU memory" if dim == "gpu_memory" else "memory"
        return f"{value / 1024:g} GiB of {what}" if value % 1024 == 0 else f"{value} MiB of {what}"
    return f"{value / 1000:g} CPUs"


def ask_text(i: int, total: int, instances: int = 1) -> str:
    """What a job asks for in dimension `i`: "1 GPU", or a gang's whole ask, "3 instances x 1 GPU = 3 GPUs"."""
    if instances <= 1:
        return amount_text(i, total)
    return f"{instances} instances x {amount_text(i, total // instances)} = {amount_text(i, total)}"


def over(used: Vector, want: Vector, bound: Amounts) -> int | None:
    """The first dimension in which `used + want` passes `bound` (and `want` adds to it), or None."""
    for i, b in enumerate(bound.values()):
        if b is not None and want[i] > 0 and used[i] + want[i] > b:
            return i
    return None


@dataclass
class Usage:
    """What queues, users and groups hold now: running jobs, plus those a round starts (`charge`)."""

    queue: dict[str, Vector] = field(default_factory=dict)
    queue_user: dict[tuple[str, str], Vector] = field(default_factory=dict)
    queue_group: dict[tuple[str, str], Vector] = field(default_factory=dict)
    user: dict[str, Vector] = field(default_factory=dict)
    group: dict[str, Vector] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)  # jobs per queue
    borrowing_ids: set[str] = field(default_factory=set)
    queue_of_borrower: dict[str, str] = field(default_factory=dict)  # borrowing job id -> its queue
    borrowed: dict[str, Vector] = field(default_factory=dict)  # per queue: what it holds above its guarantee
    #: measure_columns': which of the measured jobs (in the order given) borrow, as a mask (None: not measured so)
    borrowing_rows: npt.NDArray[np.bool_] | None = None

    def charge(self, queue: str, user: str, groups: Iterable[str], v: Vector) -> None:
        self.queue[queue] = add(self.queue.get(queue, ZERO), v)
        self.queue_user[(queue, user)] = add(self.queue_user.get((queue, user), ZERO), v)
        self.user[user] = add(self.user.get(user, ZERO), v)
        for g in groups:
            self.queue_group[(queue, g)] = add(self.queue_group.get((queue, g), ZERO), v)
            self.group[g] = add(self.group.get(g, ZERO), v)
        self.running[queue] = self.running.get(queue, 0) + 1


def measure(
    config: QueuesConfig,
    running: Sequence[Running],
    held_of: Callable[[Running], Vector],
    groups_of: GroupsOf,
) -> Usage:
    """The holdings of `running` jobs (each charged to its `queue`), and which of them are borrowing (see the module
    doc). A cluster's tens of thousands of jobs are summed as columns (`measure_columns`), one machine's few one by
    one (`_measure_jobs`): the same Usage either way."""
    if len(running) >= COLUMNS_FROM:
        return measure_columns(config, JobColumns.of(running, held_of), groups_of)
    return _measure_jobs(config, sorted(running, key=start_key), held_of, groups_of)


#: From how many running jobs `measure` sums columns rather than job by job.
COLUMNS_FROM = 512


def start_key(j: Running) -> tuple[float, int, str]:
    """The order `measure` charges jobs in: by start, then numeric id, then id."""
    return (j.started_at or 0.0, int(j.id) if j.id.isdigit() else 0, j.id)


@dataclass
class JobColumns:
    """Running jobs as columns, in one order: each one's quota vector (`held`), start key and account, the account a
    number into `accounts` ((queue, user, gid)). A face keeps them between rounds (Tenancy._columns)."""

    jobs: list[Running]
    vec: npt.NDArray[np.int64]  # n x 5
    keys: list[tuple[float, int, str]]  # (may be empty when `order` is given)
    code: npt.NDArray[np.int64]  # n
    accounts: list[tuple[str, str, int]]
    order: npt.NDArray[np.int64] | None = None  # the rows in start order (by their keys), when the maker knows it

    @classmethod
    def of(cls, running: Sequence[Running], held_of: Callable[[Running], Vector]) -> JobColumns:
        n = len(running)
        numbers: dict[tuple[str, str, int], int] = {}
        code = np.fromiter((numbers.setdefault((j.queue, j.user, j.gid), len(numbers)) for j in running), np.int64, n)
        vec = np.array([held_of(j) for j in running], dtype=np.int64).reshape(n, 5)
        return cls(list(running), vec, [start_key(j) for j in running], code, list(numbers))


def _guarantee(config: QueuesConfig, q: str) -> tuple[Vector, list[int]]:
    """A queue's guarantee as a vector and the dimensions it is guaranteed (none: a queue guaranteed nothing, or
    not in the file, borrows all it holds)."""
    spec = config.queues.get(q)
    if spec is None:
        return ZERO, []
    return spec.guarantee.vector(), [i for i, x in enumerate(spec.guarantee.values()) if x is not None]


def _measure_jobs(
    config: QueuesConfig, by_start: Sequence[Running], held_of: Callable[[Running], Vector], groups_of: GroupsOf
) -> Usage:
    usage = Usage()
    guarantees: dict[str, tuple[Vector, list[int]]] = {}  # per queue, once
    for job in by_start:
        q = job.queue
        v = held_of(job)
        usage.charge(q, job.user, groups_of(job.user, job.gid), v)
        found = guarantees.get(q)
        if found is None:
            found = guarantees[q] = _guarantee(config, q)
        g, dims = found
        after = usage.queue[q]
        if q in usage.borrowed or any(after[i] > g[i] and v[i] > 0 for i in (dims or range(5))):
            usage.borrowing_ids.add(job.id)
            usage.queue_of_borrower[job.id] = q
            over_g = tuple(max(0, after[i] - g[i]) for i in range(5))
            usage.borrowed[q] = (over_g[0], over_g[1], over_g[2], over_g[3], over_g[4])
    return usage


_JOB_ID = attrgetter("id")


def measure_columns(config: QueuesConfig, cols: JobColumns, groups_of: GroupsOf) -> Usage:
    """`_measure_jobs` over columns: per account the jobs' vectors added with np.add.at (integers: exact in any
    order), and per queue the first job in start order whose start put it above its guarantee found on the queue's
    cumulative sum; that job and every later one of the queue borrow. The maps list their accounts in the order the
    job-by-job sum first meets them."""
    keys = cols.keys
    order = cols.order
    if order is None:
        order = np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)
    vec = cols.vec[order]
    code = cols.code[order]
    sums = np.zeros((len(cols.accounts), 5), dtype=np.int64)
    np.add.at(sums, code, vec)
    counts = np.bincount(code, minlength=len(cols.accounts))
    present, first_row = np.unique(code, return_index=True)
    met = [int(c) for c in present[np.argsort(first_row, kind="stable")]]
    usage = Usage()
    usage.borrowing_rows = np.zeros(len(cols.jobs), dtype=np.bool_)
    queue_codes: dict[str, list[int]] = {}
    for c in met:
        q, user, gid = cols.accounts[c]
        row = [int(x) for x in sums[c]]
        t: Vector = (row[0], row[1], row[2], row[3], row[4])
        usage.queue[q] = add(usage.queue.get(q, ZERO), t)
        usage.queue_user[(q, user)] = add(usage.queue_user.get((q, user), ZERO), t)
        usage.user[user] = add(usage.user.get(user, ZERO), t)
        for g in groups_of(user, gid):
            usage.queue_group[(q, g)] = add(usage.queue_group.get((q, g), ZERO), t)
            usage.group[g] = add(usage.group.get(g, ZERO), t)
        usage.running[q] = usage.running.get(q, 0) + int(counts[c])
        queue_codes.setdefault(q, []).append(c)
    jobs = cols.jobs
    for q, cs in queue_codes.items():
        rows = np.flatnonzero(np.isin(code, cs))  # the queue's jobs, in start order
        mine = vec[rows]
        cum = np.cumsum(mine, axis=0)
        guarantee, dims = _guarantee(config, q)
        d = dims or list(range(5))
        g_arr = np.array(guarantee, dtype=np.int64)
        over_now = ((cum[:, d] > g_arr[d]) & (mine[:, d] > 0)).any(axis=1)
        if not over_now.any():
            continue
        first = int(np.argmax(over_now))
        usage.borrowing_rows[order[rows[first:]]] = True
        # (a cluster's borrowers are thousands: their ids read with C-level maps)
        borrowers = list(map(_JOB_ID, map(jobs.__getitem__, order[rows[first:]].tolist())))
        usage.borrowing_ids.update(borrowers)
        usage.queue_of_borrower.update(zip(borrowers, repeat(q)))
        over_g = np.maximum(0, cum[-1] - g_arr)
        usage.borrowed[q] = (int(over_g[0]), int(over_g[1]), int(over_g[2]), int(over_g[3]), int(over_g[4]))
    return usage


def borrowing(job_id: str, usage: Usage) -> bool:
    """Whether a running job is part of its queue's excess above its guarantee (reclaimable by preemption)."""
    return job_id in usage.borrowing_ids


def below_guarantee(queue: QueueSpec, usage: Usage) -> bool:
    """Whether `queue` holds less than its guarantee in some dimension it is guaranteed (> 0): its waiting jobs may
    reclaim what others borrow."""
    used = usage.queue.get(queue.name, ZERO)
    return any(g is not None and g > 0 and used[i] < g for i, g in enumerate(queue.guarantee.values()))


#: Why a job that may not be preempted waits (docs/preemption.md): it may not borrow.
NOT_PREEMPTIBLE = "not preemptible: it starts only within its queue's guarantee"


def over_guarantee(used: Vector, want: Vector, guarantee: Amounts) -> int | None:
    """The first dimension in which `used + want` goes over `guarantee`, or None: within it. As `measure` counts
    borrowing, only the dimensions a queue is guaranteed count, and a queue guaranteed nothing has no room at all
    (then: the first dimension `want` asks for)."""
    bound = guarantee.values()
    if all(b is None or b == 0 for b in bound):
        return next((i for i, w in enumerate(want) if w), 0)
    return next((i for i, b in enumerate(bound) if b is not None and used[i] + want[i] > b), None)


class Gate:
    """One round's limit checks: `check` before a job is placed, `took` after it starts (holdings grow)."""

    def __init__(
        self,
        config: QueuesConfig,
        usage: Usage,
        free: Vector,
        waiting_queues: Iterable[str],
        groups_of: GroupsOf,
    ) -> None:
        self.config = config
        self.usage = usage
        self.free = free
        self.waiting_queues = set(waiting_queues)
        self.groups_of = groups_of
        #: (queue, user, gid, shape) -> why such a job waits, or None; (queue, "", -1, shape): the queue's part
        self.verdicts: dict[tuple[str, str, int, int], str | None] = {}
        self._lendable: dict[str, Vector] = {}
        self._tops: dict[str, Amounts] = {}

    def lendable(self, queue: str) -> Vector:
        """Free now, less what other queues with waiting jobs are guaranteed and do not hold."""
        found = self._lendable.get(queue)
        if found is not None:
            return found
        out = list(self.free)
        for name in self.waiting_queues:
            spec = self.config.queues.get(name)
            if name == queue or spec is None or spec.guarantee.empty:
                continue
            used = self.usage.queue.get(name, ZERO)
            for i, g in enumerate(spec.guarantee.vector()):
                out[i] -= max(0, g - used[i])
        made: Vector = (out[0], out[1], out[2], out[3], out[4])
        self._lendable[queue] = made
        return made

    def check(self, queue: str, user: str, gid: int, shape: int, want: Vector, instances: int = 1) -> str | None:
        """Why a job of `user` in `queue` asking `want` in all (of request shape `shape`; `instances` of a gang, each
        asking `want / instances`) may not start now, or None.

        Two caches, both cleared by a start: the queue's verdict per shape, and the user's and groups' per user and
        shape; only what differs is computed, and words are made only for a job that is held back."""
        key = (queue, user, gid, shape)
        verdicts = self.verdicts
        if key in verdicts:
            return verdicts[key]
        qkey = (queue, "", -1, shape)
        if qkey in verdicts:
            verdict = verdicts[qkey]
        else:
            verdict = verdicts[qkey] = self._check_queue(queue, want, instances)
        if verdict is None:
            verdict = self._check_principals(queue, user, gid, want, instances)
        verdicts[key] = verdict
        return verdict

    def _top(self, spec: QueueSpec) -> Amounts:
        """What a queue may hold with what it borrows: its guarantee plus its borrow limit, per dimension set."""
        found = self._tops.get(spec.name)
        if found is None:
            g = spec.guarantee.vector()
            found = Amounts(*(None if b is None else g[k] + b for k, b in enumerate(spec.borrow_limit.values())))
            self._tops[spec.name] = found
        return found

    def check_group(self, queue: str, user: str, gid: int, want: Vector, instances: int) -> str | None:
        """As `check`, for a gang group's members together (`want`: all of them), without the per-shape caches."""
        return self._check_queue(queue, want, instances) or self._check_principals(queue, user, gid, want, instances)

    def _check_queue(self, queue: str, want: Vector, instances: int = 1) -> str | None:
        spec = self.config.queues.get(queue)
        if spec is None:
            return (
                f"queue '{queue}' does not exist (any more): the job waits until the queues file names it again "
                "(`corral queue reload`), or is cancelled"
            )
        used = self.usage.queue.get(queue, ZERO)
        i = over(used, want, spec.limit)
        if i is not None:
            return self._words(f"queue '{queue}'", spec.limit, used, want, i, instances)
        g = spec.guarantee.vector()
        if not spec.borrow_limit.empty:
            top = self._top(spec)
            i = over(used, want, top)
            if i is not None:
                return (
                    f"borrowing: queue '{queue}' may hold at most {amount_text(i, top.vector()[i])} (its guarantee "
                    f"plus its borrow limit); {amount_text(i, used[i])} in use, the job asks for "
                    f"{ask_text(i, want[i], instances)}"
                )
        excess = [max(0, used[k] + want[k] - g[k]) - max(0, used[k] - g[k]) for k in range(5)]
        if any(excess):
            lend = self.lendable(queue)
            for k in range(5):
                if excess[k] > 0 and excess[k] > lend[k] and lend[k] < self.free[k]:
                    return (
                        f"borrowing: queue '{queue}' is above its guarantee and the machine has no idle capacity it "
                        f"may borrow ({amount_text(k, max(0, lend[k]))} lendable of {amount_text(k, self.free[k])} "
                        "free: the rest is guaranteed to other queues with waiting jobs)"
                    )
        return None

    def _check_principals(self, queue: str, user: str, gid: int, want: Vector, instances: int = 1) -> str | None:
        spec = self.config.queues[queue]
        usage = self.usage
        p = spec.user(user)
        if p is not None:
            held_now = usage.queue_user.get((queue, user), ZERO)
            i = over(held_now, want, p.limit)
            if i is not None:
                return self._words(f"user {user}'s limit in queue '{queue}'", p.limit, held_now, want, i, instances)
        groups = self.groups_of(user, gid) if (spec.groups or self.config.groups) else ()
        for grp in groups:
            g = spec.groups.get(grp)
            if g is not None:
                held_now = usage.queue_group.get((queue, grp), ZERO)
                i = over(held_now, want, g.limit)
                if i is not None:
                    return self._words(f"group {grp}'s limit in queue '{queue}'", g.limit, held_now, want, i, instances)
        p = self.config.user(user)
        if p is not None:
            held_now = usage.user.get(user, ZERO)
            i = over(held_now, want, p.limit)
            if i is not None:
                return self._words(f"user {user}'s limit", p.limit, held_now, want, i, instances)
        for grp in groups:
            g = self.config.groups.get(grp)
            if g is not None:
                held_now = usage.group.get(grp, ZERO)
                i = over(held_now, want, g.limit)
                if i is not None:
                    return self._words(f"group {grp}'s limit", g.limit, held_now, want, i, instances)
        return None

    @staticmethod
    def _words(what: str, bound: Amounts, used: Vector, want: Vector, i: int, instances: int = 1) -> str:
        limit = amount_text(i, bound.vector()[i])
        held_now = f"{amount_text(i, used[i])} in use, the job asks for {ask_text(i, want[i], instances)}"
        if what.startswith("queue"):
            return f"{what} is at its limit of {limit} ({held_now})"
        return f"{what} of {limit} is reached ({held_now})"

    def took(self, queue: str, user: str, gid: int, want: Vector) -> None:
        """A job started: its holdings count from now on (and what was decided before no longer holds)."""
        self.usage.charge(queue, user, self.groups_of(user, gid), want)
        f = self.free
        self.free = (f[0] - want[0], f[1] - want[1], f[2] - want[2], f[3] - want[3], f[4] - want[4])
        self.verdicts.clear()
        self._lendable.clear()


def _id_order(job_id: str) -> tuple[int, str]:
    return (int(job_id) if job_id.isdigit() else 0, job_id)


def shown(v: Vector) -> dict[str, int | float]:
    """A vector as `GET /v1/queues` shows it: `gpus` in GPUs (1.8), the rest in base units."""
    return {dim: vector_value(dim, x) for dim, x in zip(DIMENSIONS, v, strict=True)}


def queue_rows(config: QueuesConfig, usage: Usage, pending: Mapping[str, int]) -> list[dict[str, object]]:
    """Each queue as `GET /v1/queues` shows it (see docs/queues.md)."""
    rows: list[dict[str, object]] = []
    for name, spec in sorted(config.queues.items()):
        used = usage.queue.get(name, ZERO)
        rows.append(
            {
                "name": name,
                "default": name == config.default_queue,
                "weight": spec.weight,
                "max_priority": spec.max_priority,
                "guarantee": spec.guarantee.as_dict(),
                "limit": spec.limit.as_dict(),
                "borrow_limit": spec.borrow_limit.as_dict(),
                "in_use": shown(used),
                "borrowing": shown(usage.borrowed.get(name, ZERO)),
                # the running jobs that are its excess (ids only): what preemption may reclaim
                "borrowing_jobs": sorted((j for j, q in usage.queue_of_borrower.items() if q == name), key=_id_order),
                "below_guarantee": below_guarantee(spec, usage),
                "pending": pending.get(name, 0),
                "running": usage.running.get(name, 0),
            }
        )
    for name in sorted(set(pending) - set(config.queues)):  # jobs of a queue a reload removed
        rows.append({"name": name, "missing": True, "pending": pending[name], "running": usage.running.get(name, 0)})
    return rows
