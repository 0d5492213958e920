"""The daemon's queues: tenancy's queues (corral.tenancy.queues.Tenancy: the fair-share usage ledger, each round's
order and limits, the preemption rules) with what only serve has: the file (reloaded without a restart), the store's
history, the system's Unix groups, and admission.

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
from collections.abc import Collection, Generator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from corral.daemon.scheduler import running_of, work_of
from corral.jobs.model import FINAL_STATES, Job, JobSpec
from corral.model.errors import InvalidRequest
from corral.model.resources import Node
from corral.model.snapshot import ClusterSnapshot
from corral.queue.config import load_queues
from corral.store.base import JobQuery, Store
from corral.tenancy.config import (
    DEFAULT_MIN_RUNTIME_S,
    DEFAULT_QUEUE,
    QueueConfigError,
    QueuesConfig,
    Vector,
    validate_against_machine,
)
from corral.tenancy.fairshare import UsageLedger, amount
from corral.tenancy.model import Running, Work
from corral.tenancy.preemption import span_text
from corral.tenancy.queues import Tenancy
from corral.tenancy.quota import NOT_PREEMPTIBLE, ZERO, amount_text, ask_text, demand, free_of, over, over_guarantee
from corral.tenancy.round import RoundQueues, clock_text

log = logging.getLogger("corral.queues")

#: The label a Marathon app or a Metronome/Chronos job names its queue with.
QUEUE_LABEL = "corral.queue"
#: Finished jobs older than this many half-lives weigh less than 1e-6 of their usage: not read back on a start.
HISTORY_HALF_LIVES = 20


class Forbidden(InvalidRequest):
    """Allowed to nobody but root or an admin (HTTP 403)."""


class Queues(Tenancy):
    def __init__(
        self, node: Node, config: QueuesConfig | None = None, path: Path | None = None,
        min_runtime_s: float = DEFAULT_MIN_RUNTIME_S,
    ) -> None:  # fmt: skip
        """`min_runtime_s`: how long a job runs before it may be preempted, without a queues file (a file says its
        own, `min_runtime`)."""
        self.node = node
        self.path = path
        gpu_mem = {g.index: g.memory_mib for g in node.gpus}
        super().__init__(
            config if config is not None else QueuesConfig.single(min_runtime_s),
            capacity_vector(node),
            max((g.memory_mib for g in node.gpus), default=0),
            lambda index: gpu_mem.get(index, 0),
            #: Fair share and limits apply only with a file; without one the order stays priority, then age.
            active=config is not None,
        )
        self._groups: dict[tuple[str, int], tuple[str, ...]] = {}

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
        self.forget()
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
        want, n = self._spec_demand(spec), self._instances(spec)
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
            total = self._spec_demand(spec)
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

    def protection_story(self, job: Job, now: float) -> str:
        """`explain`'s sentence on a running job's protection from preemption ("" for one past it, or never
        preemptible)."""
        if not job.spec.preemptible or job.started_at is None or not job.state.holds_resources:
            return ""
        m = self.config.min_runtime(self.queue_of(job))
        until = job.started_at + m
        if until <= now:
            return ""
        return f"Protected from preemption until {clock_text(until)} (minimum runtime {span_text(m)})."

    @staticmethod
    def _instances(spec: JobSpec) -> int:
        """How many of its request a job asks for with its gang: a gang's instances, or a gang group's members (a
        Marathon app's instances labelled corral.gang are one job each, and start together)."""
        if spec.gang_group:
            return max(1, spec.gang_size)
        return spec.instances if spec.gang else 1

    def _spec_demand(self, spec: JobSpec) -> Vector:
        """What a job asks for in all: a gang's N instances (a gang group's N members) count N times."""
        return demand(spec.request, self._whole_mem, self._instances(spec))

    def charge(self, job: Job) -> None:
        """A job's run has ended: its usage is kept, decayed, from now on."""
        self._charge(self.ledger, job)

    def _charge(self, ledger: UsageLedger, job: Job) -> None:
        if job.started_at is None or job.finished_at is None:
            return
        self.record(running_of(job, self.queue_of(job)), job.finished_at, ledger)

    def rebuild(self, store: Store, now: float) -> int:
        """The ledger from the store's finished jobs that ended within HISTORY_HALF_LIVES half-lives; how many."""
        steps = self.rebuilding(store, now)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return int(done.value)

    def rebuilding(self, store: Store, now: float, page: int | None = None) -> Generator[None, None, int]:
        """`rebuild`, `page` jobs at a time (None: all at once), yielding between pages: a restart's catch-up
        (`Daemon.catch_up`) lets the daemon's lock go there. The new ledger replaces the old once every page is
        read, and not at all if the configuration was replaced meanwhile (its reload rebuilt the ledger itself)."""
        config = self.config
        ledger = UsageLedger(config.half_life_s)
        since = now - HISTORY_HALF_LIVES * config.half_life_s
        counted = 0
        after: str | None = None
        while True:
            jobs = store.query(JobQuery(states=FINAL_STATES, ended_after=since, after=after, limit=page))
            for job in sorted(jobs, key=lambda j: j.finished_at or 0.0):
                if job.started_at is not None and job.finished_at is not None and job.finished_at >= since:
                    self._charge(ledger, job)
                    counted += 1
            if page is None or len(jobs) < page:
                break
            after = jobs[-1].id
            yield
        if self.config is config:
            self.ledger = ledger
        return counted

    # ---------------------------------------------------------------------------------------------- a round
    def round(
        self, waiting: Sequence[Job], holding: Sequence[Job], snapshot: ClusterSnapshot, now: float,
        default_time_limit_s: float,
    ) -> RoundQueues | None:  # fmt: skip
        """Tenancy's order and gate of one pass (`plan_queues`) over serve's jobs; None without a queues file."""
        queue_of = self.queue_of
        return self.plan_queues(
            {j.id: queue_of(j) for j in waiting}, self.running(holding), free_of(snapshot), now, default_time_limit_s
        )

    def running(self, holding: Sequence[Job], gone: Collection[str] = ()) -> list[Running]:
        """Serve's jobs that hold resources as tenancy sees them; `gone`: jobs whose exit came and is not yet
        handled (they hold their grant this round, and are no victims)."""
        queue_of = self.queue_of
        out = [running_of(j, queue_of(j)) for j in holding]
        return [replace(r, stopping=True) if r.id in gone else r for r in out] if gone else out

    def work(self, job: Job) -> Work:
        """A queued job as tenancy sees it (the preemption rules and the limits take these)."""
        return work_of(job, self.queue_of(job))

    def shares_view(self, holding: Sequence[Job], now: float) -> dict[str, Any]:
        """sshare's rows (`Tenancy.shares`) over serve's jobs."""
        return self.shares(self.running(holding), now)


def capacity_vector(node: Node) -> np.ndarray:
    """A node's capacity as fair share counts it (fairshare.amount)."""
    return amount(sum(1000 for _ in node.gpus), sum(g.memory_mib for g in node.gpus), node.cpu_milli, node.memory_mib)


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
