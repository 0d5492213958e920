"""The daemon's queues: the configuration (reloaded without a restart), the fair-share usage ledger, and each
round's order and limits.

    start     Queues.open(path, node)         the file, validated (none: one queue without limits, FIFO order)
              rebuild(store, now)             usage ledger from jobs that ended within 20 half-lives
    each job  admit(spec)                     queue resolved (default), exists, caller may submit, priority bound
    each end  charge(job)                     its run added to its account's decayed usage
    each round
              round(waiting, holding, snap)  -> order(entries): priority, fair share, age (fairshare.fair_order)
                                             -> gate: the limits of quota.Gate, checked before a job is placed
    reload    SIGHUP or POST /v1/queues/reload: the new file replaces the old only if valid; else the old stays

Accounts (docs/queues.md): a job is charged to (queue, user). Its weight is the queue's part of the weights of the
queues that have work, times the user's part of the weights of that queue's users with work:
    weight(q, u) = w_q / sum_active w_q' * w_u,q / sum_active_in_q w_u',q
and the order's key is the account's dominant share of decayed usage over that weight (fairshare.fair_order).
"""

from __future__ import annotations

import grp
import logging
import math
import os
import pwd
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from corral.jobs.model import FINAL_STATES, Job, JobSpec
from corral.model.errors import InvalidRequest
from corral.model.resources import Node
from corral.model.snapshot import ClusterSnapshot
from corral.store.base import JobQuery, Store
from corral.tenancy.config import (
    DEFAULT_MIN_RUNTIME_S,
    DEFAULT_QUEUE,
    QueueConfigError,
    QueuesConfig,
    Vector,
    load_queues,
    validate_against_machine,
)
from corral.tenancy.fairshare import (
    RESOURCES,
    Offer,
    UsageLedger,
    amount,
    decayed_capacity,
    dominant_share,
    expected_usage,
    fair_order,
    share_rows,
)
from corral.tenancy.preemption import Rules, span_text
from corral.tenancy.quota import (
    NOT_PREEMPTIBLE,
    ZERO,
    Gate,
    Usage,
    add,
    amount_text,
    ask_text,
    below_guarantee,
    borrowing,
    demand,
    free_of,
    held,
    measure,
    over,
    over_guarantee,
    queue_rows,
)
from corral.tenancy.round import RoundQueues, clock_text

log = logging.getLogger("corral.queues")

#: The label a Marathon app or a Metronome/Chronos job names its queue with.
QUEUE_LABEL = "corral.queue"
#: Finished jobs older than this many half-lives weigh less than 1e-6 of their usage: not read back on a start.
HISTORY_HALF_LIVES = 20


class Forbidden(InvalidRequest):
    """Allowed to nobody but root or an admin (HTTP 403)."""


class Queues:
    def __init__(
        self, node: Node, config: QueuesConfig | None = None, path: Path | None = None,
        min_runtime_s: float = DEFAULT_MIN_RUNTIME_S,
    ) -> None:  # fmt: skip
        """`min_runtime_s`: how long a job runs before it may be preempted, without a queues file (a file says its
        own, `min_runtime`)."""
        self.node = node
        self.path = path
        self.config = config if config is not None else QueuesConfig.single(min_runtime_s)
        #: Fair share and limits apply only with a file; without one the order stays priority, then age.
        self.active = config is not None
        self.capacity = amount(
            sum(1000 for _ in node.gpus), sum(g.memory_mib for g in node.gpus), node.cpu_milli, node.memory_mib
        )
        self._whole_mem = max((g.memory_mib for g in node.gpus), default=0)
        self._gpu_mem = {g.index: g.memory_mib for g in node.gpus}
        self.ledger = UsageLedger(self.config.half_life_s)
        self._groups: dict[tuple[str, int], tuple[str, ...]] = {}
        #: job id -> (entry, its offer, its key for the limits' verdicts), while the entry lives
        self._offers: dict[str, tuple[Any, Offer[Any], tuple[str, str, int, int]]] = {}
        #: A job's projected share by what decides it: its amounts and time limit (not the shape's index, which the
        #: scheduler's ShapeCache may renumber when it prunes).
        self._projected: dict[tuple[int, int, int, int, int, float | None], float] = {}
        self.usage = Usage()  # the last round's holdings (for GET /v1/queues)
        self.queue_of_id: dict[str, str] = {}  # the last round's waiting jobs' queues (for explain)
        self.limited: dict[str, str] = {}  # the last round's jobs held back by a limit, and which
        self.started: set[str] = set()  # the jobs the last round started (no longer waiting)
        self.waiting_accounts: set[Hashable] = set()  # ("user", queue, user) of the last round's waiting jobs
        self._gid_of: dict[str, int] = {}  # each user's primary gid, as their jobs carry it (for group weights)

    # ---------------------------------------------------------------------------------------------- configuration
    @classmethod
    def open(cls, path: Path | None, node: Node) -> Queues:
        """From `path` (None, or a default location that does not exist: one queue); QueueConfigError if bad."""
        if path is None:
            return cls(node)
        config = load_queues(path)
        validate_against_machine(config, capacity_of(node))
        return cls(node, config, path)

    def reload(self, store: Store, now: float) -> QueuesConfig:
        """Read the file again; the new configuration replaces the old only if it is valid (QueueConfigError)."""
        return self.apply(self.read(), store, now)

    def read(self) -> QueuesConfig:
        """The file, read and validated (QueueConfigError), without changing anything: what `apply` takes. Needs no
        lock (the machine does not change), so a large file is not read under the daemon's."""
        if self.path is None:
            raise QueueConfigError("no queues file: start corral serve with --queues FILE")
        if not self.active and not self.path.exists():
            raise QueueConfigError(f"no queues file at {self.path} (or start corral serve with --queues FILE)")
        config = load_queues(self.path)
        validate_against_machine(config, capacity_of(self.node))
        return config

    def apply(self, config: QueuesConfig, store: Store, now: float) -> QueuesConfig:
        """Put a configuration from `read` in place (under the daemon's lock)."""
        half_life_changed = config.half_life_s != self.config.half_life_s
        self.config, self.active = config, True
        self._offers.clear()
        self._projected.clear()
        if half_life_changed:
            self.rebuild(store, now)
        log.info("queues reloaded from %s: %s", self.path, ", ".join(sorted(config.queues)))
        return config

    def is_admin(self, user: str, uid: int, gid: int) -> bool:
        if uid == 0 or user in self.config.admins:
            return True
        return bool(self.config.admin_groups) and bool(set(self.groups_of(user, gid)) & self.config.admin_groups)

    def groups_of(self, user: str, gid: int) -> tuple[str, ...]:
        """The names of a user's Unix groups (primary and supplementary), cached (a reload clears nothing: groups
        change with logins, and a daemon restart picks them up)."""
        key = (user, gid)
        found = self._groups.get(key)
        if found is not None:
            return found
        try:
            gids = os.getgrouplist(user, gid)
        except (KeyError, OSError):
            gids = [gid]
        names = []
        for g in gids:
            try:
                names.append(grp.getgrgid(g).gr_name)
            except KeyError:
                continue
        self._groups[key] = tuple(sorted(set(names)))
        return self._groups[key]

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

    def queue_of(self, job: Job) -> str:
        return job.spec.queue or self.config.default_queue

    # ---------------------------------------------------------------------------------------------- admission
    def admit(self, spec: JobSpec, *, admin: bool = False) -> JobSpec:
        """`spec` with its queue named; InvalidRequest (422) for an unknown queue, Forbidden (403) for a queue the
        user may not submit to or a priority above the bound."""
        # The peers' objects (Marathon apps, Metronome and Chronos jobs) name a queue by a label, so their shapes stay
        # theirs; their labels are their requests' (corral.mesos.model.to_request).
        name = spec.queue or spec.request.labels.get(QUEUE_LABEL) or self.config.default_queue
        queue = self.config.queues.get(name)
        if queue is None:
            known = ", ".join(sorted(self.config.queues))
            raise InvalidRequest("queue", f"no queue {name!r} (queues: {known})")
        admin = admin or self.is_admin(spec.user, spec.uid, spec.gid)  # `admin`: root or an admin acts for the user
        if queue.submitters is not None and not admin:
            groups = {f"@{g}" for g in self.groups_of(spec.user, spec.gid)}
            if spec.user not in queue.submitters and not groups & set(queue.submitters):
                raise Forbidden("queue", f"user {spec.user} may not submit to queue {name!r}")
        priority = spec.request.priority
        if not admin:
            bounds = [
                (queue.max_priority, f"queue {name!r}"),
                (p.max_priority if (p := queue.user(spec.user)) is not None else None, f"user {spec.user} in {name!r}"),
                (p.max_priority if (p := self.config.user(spec.user)) is not None else None, f"user {spec.user}"),
            ]
            if queue.groups or self.config.groups:
                for g in self.groups_of(spec.user, spec.gid):
                    for table, where in ((queue.groups, f" in {name!r}"), (self.config.groups, "")):
                        if (pg := table.get(g)) is not None:
                            bounds.append((pg.max_priority, f"group {g}{where}"))
            for bound, whose in bounds:
                if bound is not None and priority > bound:
                    raise Forbidden(
                        "priority",
                        f"{priority} is above the bound of {whose}, {bound} (only root or an admin may exceed it)",
                    )
        want, n = self._whole_demand(spec), self._instances(spec)
        for cap, whose in (
            (queue.limit, f"queue {name!r}'s limit"),
            (p.limit if (p := queue.user(spec.user)) is not None else None, f"user {spec.user}'s limit in {name!r}"),
            (p.limit if (p := self.config.user(spec.user)) is not None else None, f"user {spec.user}'s limit"),
        ):
            i = over(ZERO, want, cap) if cap is not None else None
            if i is not None and cap is not None:
                raise InvalidRequest(
                    "queue",
                    f"the job asks for {ask_text(i, want[i], n)}, more than {whose} of "
                    f"{amount_text(i, cap.vector()[i])}: it could never start",
                )
        if not spec.preemptible and self.active:
            total = self._whole_demand(spec)
            i = over_guarantee(ZERO, total, queue.guarantee)
            if i is not None:
                guaranteed = queue.guarantee.values()
                has = f"guarantees {amount_text(i, guaranteed[i] or 0)}" if any(guaranteed) else "guarantees none"
                raise InvalidRequest(
                    "preemptible",
                    f"a job that may not be preempted starts only within its queue's guarantee, and queue {name!r} "
                    f"{has} of what it asks ({ask_text(i, total[i], self._instances(spec))}): it could never start "
                    "(docs/preemption.md)",
                )
        return spec if spec.queue == name else replace(spec, queue=name)

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

        def is_borrowing(job: Job) -> bool:
            return borrowing(job.id, self.usage)

        def is_below(job: Job) -> bool:
            spec = self.config.queues.get(self.queue_of(job))
            return spec is not None and below_guarantee(spec, self.usage)

        return Rules(
            borrowing=is_borrowing, below_guarantee=is_below, may_borrow=self.within_guarantee,
            min_runtime=self.min_runtime_of,
        )  # fmt: skip

    def min_runtime_of(self, job: Job) -> float:
        """How long `job` runs after it (re)started before it may be preempted: its queue's `min_runtime`."""
        return self.config.min_runtime(self.queue_of(job))

    def protection_story(self, job: Job, now: float) -> str:
        """`explain`'s sentence on a running job's protection from preemption ("" for one past it, or never
        preemptible)."""
        if not job.spec.preemptible or job.started_at is None or not job.state.holds_resources:
            return ""
        m = self.min_runtime_of(job)
        until = job.started_at + m
        if until <= now:
            return ""
        return f"Protected from preemption until {clock_text(until)} (minimum runtime {span_text(m)})."

    def within_guarantee(self, job: Job) -> bool:
        """Whether `job` would start with its queue still within its guarantee, in each dimension the queue is
        guaranteed (as `quota.measure` counts borrowing). A queue guaranteed nothing has no room for it."""
        q = self.queue_of(job)
        spec = self.config.queues.get(q)
        if spec is None:
            return False
        return over_guarantee(self.usage.queue.get(q, ZERO), self._whole_demand(job.spec), spec.guarantee) is None

    @staticmethod
    def _instances(spec: JobSpec) -> int:
        """How many of its request a job asks for with its gang: a gang's instances, or a gang group's members (a
        Marathon app's instances labelled corral.gang are one job each, and start together)."""
        if spec.gang_group:
            return max(1, spec.gang_size)
        return spec.instances if spec.gang else 1

    def _whole_demand(self, spec: JobSpec) -> Vector:
        """What a job asks for in all: a gang's N instances (a gang group's N members) count N times."""
        return demand(spec.request, self._whole_mem, self._instances(spec))

    # ---------------------------------------------------------------------------------------------- usage
    def held_vector(self, job: Job) -> np.ndarray:
        """What a job holds for fair share: GPUs by their part (milli), every instance of a gang."""
        n = job.spec.instances
        return amount(
            sum(g.milli for g in job.gpus),
            sum(g.memory_mib or (self._gpu_mem.get(g.index, 0) if g.milli >= 1000 else 0) for g in job.gpus),
            job.spec.request.cpu_milli * n,
            job.spec.request.memory_mib * n,
        )

    def charge(self, job: Job) -> None:
        """A job's run has ended: its usage is kept, decayed, from now on."""
        if job.started_at is None or job.finished_at is None:
            return
        a = self.held_vector(job)
        q = self.queue_of(job)
        for account in (("queue", q), ("user", q, job.spec.user)):
            self.ledger.record(account, a, job.started_at, job.finished_at)

    def rebuild(self, store: Store, now: float) -> int:
        """The ledger from the store's finished jobs that ended within HISTORY_HALF_LIVES half-lives; how many."""
        self.ledger = UsageLedger(self.config.half_life_s)
        since = now - HISTORY_HALF_LIVES * self.config.half_life_s
        jobs = store.query(JobQuery(states=FINAL_STATES, ended_after=since))
        counted = 0
        for job in sorted(jobs, key=lambda j: j.finished_at or 0.0):
            if job.started_at is not None and job.finished_at is not None and job.finished_at >= since:
                self.charge(job)
                counted += 1
        return counted

    def usages(self, holding: Sequence[Job], now: float) -> dict[tuple[str, ...], np.ndarray]:
        """Decayed usage per account (queue and (queue, user)), running jobs included."""
        running: dict[tuple[str, ...], list[tuple[np.ndarray, float]]] = {}
        for j in holding:
            if j.started_at is None:
                continue
            q = self.queue_of(j)
            a = self.held_vector(j)
            running.setdefault(("queue", q), []).append((a, j.started_at))
            running.setdefault(("user", q, j.spec.user), []).append((a, j.started_at))
        accounts = {a for a in self.ledger.accounts() if isinstance(a, tuple)} | set(running)
        return {acc: self.ledger.usage(acc, now, running.get(acc, ())) for acc in accounts}

    # ---------------------------------------------------------------------------------------------- a round
    def round(
        self, waiting: Sequence[Job], holding: Sequence[Job], snapshot: ClusterSnapshot, now: float,
        default_time_limit_s: float,
    ) -> RoundQueues | None:  # fmt: skip
        """The order and the gate of one pass; None without a queues file (priority, then age, no limits)."""
        config = self.config
        queue_of = self.queue_of
        self.usage = measure(config, holding, queue_of, lambda j: held(j, self._gpu_mem.__getitem__), self.groups_of)
        queue_of_id = {j.id: queue_of(j) for j in waiting}
        self.queue_of_id = queue_of_id
        started: set[str] = set()
        self.started = started
        if not self.active:
            self.limited = {}
            return None
        usages = self.usages(holding, now)
        cap = decayed_capacity(self.capacity, config.half_life_s)
        h = config.half_life_s
        gate = Gate(config, self.usage, free_of(snapshot), set(queue_of_id.values()), self.groups_of)
        limited: dict[str, str] = {}
        self.limited = limited
        whole_mem = self._whole_mem
        demands: dict[int, Vector] = {}

        def projected(job: Job) -> float:
            r = job.spec.request
            key = (r.gpu_count, r.gpu_milli, r.gpu_memory_mib, r.cpu_milli, r.memory_mib, job.spec.time_limit_s)
            p = self._projected.get(key)
            if p is None:
                gmem = whole_mem if r.whole_gpus else r.gpu_memory_mib
                a = amount(r.gpu_count * r.gpu_milli, r.gpu_count * gmem, r.cpu_milli, r.memory_mib)
                run = job.spec.time_limit_s if job.spec.time_limit_s is not None else default_time_limit_s
                p = dominant_share(expected_usage(a, run, h), cap)
                self._projected[key] = p
            return p

        def order(entries: list[Any]) -> list[Any]:
            offers = []
            cache = self._offers
            for e in entries:
                found = cache.get(e.job.id)
                if found is not None and found[0] is e:
                    offers.append(found[1])
                    continue
                job = e.job
                numeric = int(job.id) if job.id.isdigit() else 0
                q = queue_of_id[job.id]
                o = Offer(e, ("user", q, job.spec.user), job.spec.request.priority,
                          job.submitted_at, (numeric, job.id), projected(job))  # fmt: skip
                cache[job.id] = (e, o, (q, job.spec.user, job.spec.gid, e.shape))
                self._gid_of[job.spec.user] = job.spec.gid
                offers.append(o)
            if len(cache) > 2 * len(entries) + 64:
                live = {e.job.id for e in entries}
                for k in [k for k in cache if k not in live]:
                    del cache[k]
            accounts = {o.account for o in offers}
            self.waiting_accounts = accounts
            active: dict[str, set[str]] = {}
            for account in accounts:
                acc: tuple[str, str, str] = account  # type: ignore[assignment]
                active.setdefault(acc[1], set()).add(acc[2])
            for j in holding:
                active.setdefault(queue_of(j), set()).add(j.spec.user)
                self._gid_of[j.spec.user] = j.spec.gid
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
            return fair_order(offers, shares, weight)

        verdicts = gate.verdicts
        offered = self._offers

        within = self.within_guarantee

        def check(e: Any) -> str | None:
            if not e.job.spec.preemptible and not within(e.job):  # holdings grow with each start of the round
                limited[e.job.id] = NOT_PREEMPTIBLE
                return NOT_PREEMPTIBLE
            key = offered[e.job.id][2]  # (queue, user, gid, shape), made with its offer
            if key in verdicts:  # the common case, inlined: this runs once per queued job every round
                why = verdicts[key]
            else:
                want = demands.get(e.shape)
                if want is None:  # the shape's instances are part of it (scheduler.ShapeCache)
                    want = demands[e.shape] = demand(e.job.spec.request, whole_mem, e.job.spec.instances)
                why = gate.check(*key, want, e.job.spec.instances)
            if why is not None:
                limited[e.job.id] = why
            return why

        def took(e: Any) -> None:
            job = e.job
            started.add(job.id)
            gate.took(
                queue_of_id[job.id], job.spec.user, job.spec.gid,
                demand(job.spec.request, whole_mem, job.spec.instances),
            )  # fmt: skip

        def check_group(members: list[Any]) -> str | None:
            """A gang group's members as one ask: the sum of theirs against every limit (issue 23: three 1-GPU
            members of a queue limited to 2 GPUs never start, though each alone would fit)."""
            first = members[0].job
            total = ZERO
            for m in members:
                total = add(total, demand(m.job.spec.request, whole_mem, m.job.spec.instances))
            q = queue_of_id[first.id]
            spec = config.queues.get(q)
            why: str | None
            if not first.spec.preemptible and (
                spec is None or over_guarantee(self.usage.queue.get(q, ZERO), total, spec.guarantee) is not None
            ):
                why = NOT_PREEMPTIBLE
            else:
                why = gate.check_group(q, first.spec.user, first.spec.gid, total, len(members))
            if why is not None:
                for m in members:
                    limited[m.job.id] = why
            return why

        return RoundQueues(order, check, took, check_group)

    # ---------------------------------------------------------------------------------------------- views
    def queues_view(self) -> list[dict[str, object]]:
        """Each queue, with the jobs the last round left waiting in it and its holdings then."""
        pending = Counter(q for job_id, q in self.queue_of_id.items() if job_id not in self.started)
        return queue_rows(self.config, self.usage, pending)

    def shares_view(self, holding: Sequence[Job], now: float) -> dict[str, Any]:
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


def capacity_of(node: Node) -> Vector:
    mem = sum(g.memory_mib for g in node.gpus)
    return (1000 * len(node.gpus), 1000 * len(node.gpus), mem, node.cpu_milli, node.memory_mib)


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def default_path(state_dir: Path) -> Path:
    """Where `corral serve` looks for the queues file when --queues is not given."""
    return state_dir / "queues.toml"


__all__ = [
    "DEFAULT_QUEUE", "NOT_PREEMPTIBLE", "Forbidden", "QueueConfigError", "Queues", "RoundQueues", "default_path",
    "math", "over_guarantee",
]  # fmt: skip
