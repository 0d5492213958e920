"""The daemon's core: events in (submit, cancel, process exits, clock), decisions out (launch, kill, state changes).

    submit(spec)  -> validate against the machine -> store.add (durable) -> acknowledged
    tick(now)     -> executor.poll(): exits (each reported once the job's cgroup is empty), kept in memory until
                     stored -> SUCCEEDED / FAILED / CANCELLED / LOST,
                     or QUEUED again after a back-off; a store that fails keeps them for the next round
                  -> snapshot = the machine minus what STARTING/RUNNING jobs hold
                  -> scheduler.schedule(waiting jobs) -> for each start: QUEUED -> STARTING (grant stored first),
                     launch, pid + start time stored, -> RUNNING
                  -> every waiting job's reason stored, so `explain` can say why it waits
    recover()     -> after a restart, for each STARTING/RUNNING job, what its attempt's supervisor left:
                       an exit record      -> the real outcome (exit code, end time), never run again
                       a live supervisor   -> adopted, watched from now on
                       never started       -> QUEUED again, the attempt not counted
                       started, then gone  -> LOST (leftovers killed), retried by policy

Each job's supervisor, not the daemon, owns its outcome (see corral.executor.local): the daemon is no longer the
job's parent, reads exits from the supervisors' records and never guesses one.

The grant is stored before the process exists and released only when it has exited, so a job that has just started
keeps its reservation, and a cancelled job's GPUs are not handed out while it is still dying.

With a GPU sampler (NVML on a real machine), every round also looks at who holds each GPU's memory:
    memory of processes corral did not start  -> held in the snapshot as a "foreign" grant, so it is never granted
    a job over its GPU memory grant where MPS does not enforce it -> the watchdog warns, or kills it (FAILED, said why)
"""

from __future__ import annotations

import contextlib
import logging
import math
import operator
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from corral.daemon import gang, preemption
from corral.daemon.preemption import PREEMPTING, Rules
from corral.daemon.queues import Forbidden, Queues
from corral.daemon.scheduler import Plan, ShapeCache, work_of
from corral.executor.base import Executor, Exit, Found, Handle, LaunchSpec
from corral.gpu.accounting import UsageMeter
from corral.gpu.discovery import GpuDiscoveryError
from corral.gpu.metrics import GpuSampler, GpuUse, ProcessInfo, attribute, read_process
from corral.gpu.mps import MpsControl, MpsError
from corral.jobs import array, dependency
from corral.jobs.model import (
    FINAL_STATES,
    Change,
    Job,
    JobSpec,
    JobState,
    Preempted,
    check_admissible,
    spec_to_json,
)
from corral.metrics import DaemonMetrics
from corral.model.errors import InvalidRequest
from corral.model.resources import MILLI_PER_GPU, Allocation, GpuGrant, Node, Request, affinity_tag
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place, render
from corral.placement.engine import validate_against
from corral.store.base import JobNotFound, JobQuery, Store, StoreError
from corral.tenancy import ClusterView, Preemption, RoundConfig, Work, plan_round
from corral.tenancy.reservation import DEFAULT_TIME_LIMIT_S, Reservation, expected_end

CANCELLING = "cancel requested"
ACTIVE_STATES = (JobState.QUEUED, JobState.STARTING, JobState.RUNNING)
#: A held job's reason: "held by USER (corral release ID)".
HELD = "held by "
#: The reason of a job the watchdog is killing starts with this; its exit is then a failure with that reason.
OVER_GRANT = "killed by corral: "
#: The reason of a running job past its time limit, while its supervisor stops it (`Daemon._say_over_limit`).
OVER_LIMIT = "ending: past its time limit"
MAX_BACKOFF_S = 300.0
#: Jobs launched per round (each: two durable writes under the daemon's lock, and a supervisor started without it);
#: the pass stops placing once it has this many, and the rest of a burst waits for the next rounds, so 500
#: submissions do not hold the lock for seconds (issue 12).
STARTS_PER_ROUND = 4
#: With `Daemon.quiet_rounds` (the server's loop), a round whose inputs are the last round's (the same job
#: objects waiting and holding, the same GPU sample and queues configuration, nothing started, preempted or ended
#: since) is not run again for this long: 5,000 waiting jobs cost a round 6-17 ms of CPU five times a second, taken
#: from the listings and submissions that share the GIL (issue 26, item 7). What only the clock changes (a running
#: job's minimum runtime passing, a reservation moving) is seen within this time.
QUIET_ROUND_S = 1.0
WATCHDOG_MODES = ("off", "warn", "kill")
#: Jobs read per step of a restart's catch-up (`Daemon.catch_up`): each step holds the daemon's lock once, for
#: milliseconds (about 10-20 ms on the 2-core development machine; 100 ms at a load of 10), however long the history.
RECOVERY_PAGE = 200
#: The ended states a retry starts from (a retry decided but not stored before the daemon stopped).
_RETRIED_FROM = frozenset({JobState.FAILED, JobState.LOST})
#: `explain` of a singleton job reads at most this many jobs of its user and name.
MAX_SINGLETON_LOOK = 1000
log = logging.getLogger("corral.daemon")


def _gpus_text(job: Job) -> str:
    """A job's GPUs for the log: "0,1", "0:300m/10240MiB", or "none"."""
    parts = [
        str(g.index) if g.milli >= 1000 and not g.memory_mib else f"{g.index}:{g.milli}m/{g.memory_mib}MiB"
        for g in job.gpus
    ]
    return ",".join(parts) or "none"


def _ids_text(ids: Sequence[str], most: int = 10) -> str:
    return ", ".join(ids[:most]) + (f" and {len(ids) - most} more" if len(ids) > most else "")


def with_gpus(request: Request, count: int) -> Request:
    """`request` for `count` GPUs: whole GPUs for a job that had none, a share stays a share; 0 drops the GPUs."""
    if count == 0:
        return replace(request, gpu_count=0, gpu_milli=0, gpu_memory_mib=0)
    return replace(request, gpu_count=count, gpu_milli=request.gpu_milli if request.gpu_count else MILLI_PER_GPU)


def text(value: object) -> str:
    """A field's value as a job's history records it ("" for none)."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def held_reason(job: Job) -> str:
    """A held job's reason, as `hold` stores it and every round says it."""
    return f"{HELD}{job.spec.held_by} (corral release {job.id})"


def backoff_s(attempts: int) -> float:
    """Retry delay after the n-th failed attempt: 1, 2, 4, ... seconds, at most 5 minutes."""
    return float(min(MAX_BACKOFF_S, 2.0 ** max(0, attempts - 1)))


@dataclass(frozen=True)
class CancelOutcome:
    """What `Daemon.cancel_many` did, by job id."""

    cancelled: list[str]  # were queued: cancelled now
    cancelling: list[str]  # were starting or running: signalled, cancelled when they exit
    ended: list[str]  # had already ended (or started meanwhile): left alone
    not_found: list[str]  # no such job, or not the caller's


@dataclass(frozen=True)
class Targets:
    """What a reference names (`Daemon.targets`): the jobs, and the array's id when it names a whole array."""

    ref: array.Ref
    jobs: list[Job]
    array_id: str | None

    @property
    def many(self) -> bool:
        """Several jobs, or an array (even of one task): the answer is about all of them."""
        return self.array_id is not None or (self.ref.tasks is not None and self.ref.is_range)


@dataclass(frozen=True)
class _DependencyMemo:
    """A waiting job's dependency verdict, kept from round to round while it waits: worked out again only when a job
    it names changed (or, for a singleton, every round)."""

    ids: tuple[str, ...]
    singleton: bool
    verdict: dependency.Verdict
    reason: str


class Controller(Protocol):
    """Something that keeps jobs coming: schedules, job definitions' runs, services' instances.

    Called under the daemon's lock: `tick` at the start of every round (it may `daemon.submit` jobs whose
    `spec.origin` names it, and `daemon.cancel` them), `job_ended` when a job it made reaches its end for good (no
    retry follows). Controllers keep their own state in the store's documents, so a restart loses nothing.
    """

    def tick(self, daemon: Daemon, now: float) -> None: ...

    def job_ended(self, daemon: Daemon, job: Job) -> None: ...


class Daemon:
    def __init__(
        self,
        store: Store,
        executor: Executor,
        node: Node,
        config: PlacementConfig,
        state_dir: Path,
        clock: Callable[[], float] = time.time,
        seed: int = 0,
        find_process: Callable[[str], tuple[int, int] | None] | None = None,
        mps: MpsControl | None = None,
        sampler: GpuSampler | None = None,
        watchdog: str = "kill",
        sample_every_s: float = 1.0,
        describe: Callable[[int], ProcessInfo | None] = read_process,
        controllers: Sequence[Controller] = (),
        container_runtime: str | None = None,
        default_time_limit_s: float = DEFAULT_TIME_LIMIT_S,
        preempt_grace_s: float = preemption.DEFAULT_GRACE_S,
        preemption_rules: Rules | None = None,
        queues: Queues | None = None,
    ) -> None:
        if not (math.isfinite(preempt_grace_s) and preempt_grace_s >= 0):
            raise InvalidRequest("preempt_grace", f"must be >= 0 seconds, got {preempt_grace_s}")
        if not (math.isfinite(default_time_limit_s) and default_time_limit_s > 0):
            raise InvalidRequest("default_time_limit", f"must be > 0 seconds, got {default_time_limit_s}")
        if watchdog not in WATCHDOG_MODES:
            raise InvalidRequest("gpu_memory_watchdog", f"must be one of {', '.join(WATCHDOG_MODES)}, got {watchdog!r}")
        self.store = store
        self.executor = executor
        self.node = node
        self.config = config
        self.state_dir = state_dir
        self.clock = clock
        self.rng = np.random.default_rng(seed)
        #: Jobs started before supervisors existed and recorded without a PID: finds their process (legacy).
        self.find_process = find_process
        #: Exits handed over by the executor and not yet stored (a failing store keeps them here for later rounds).
        self._exits: dict[str, Exit] = {}
        #: Cancels sent whose "cancel requested" could not be stored: their exits still end them CANCELLED.
        self._cancelling: set[str] = set()
        #: Launched jobs whose RUNNING (pid) could not be stored yet.
        self._unrecorded: dict[str, Handle] = {}
        #: Failed jobs with retries left whose return to the queue could not be stored yet.
        self._requeue: dict[str, tuple[str, float]] = {}
        self._store_failing = False
        #: With MPS, a one-GPU share runs as an MPS client with enforced compute and memory limits; since MPS serves
        #: one Unix user per GPU at a time, such shares carry their user as `share_owner`.
        self.mps = mps
        self._empty = ClusterSnapshot([node])  # the idle machine, for admission checks
        self._admit_lock = threading.Lock()
        #: Live GPU use (None: no sampler, e.g. a simulated inventory): foreign memory and the memory watchdog.
        self.sampler = sampler
        self.watchdog = watchdog
        self.sample_every_s = sample_every_s
        self.describe = describe
        self.gpu_use: dict[str, GpuUse] = {}  # by GPU UUID, from the latest sample
        self._sampled_at = -math.inf
        self._sample_failed = False
        #: Each running job's GPU use (utilisation, peak memory), stored with its end for `corral acct`.
        self.usage = UsageMeter(node, sample_every_s)
        self.controllers: list[Controller] = list(controllers)
        #: "docker" or "podman": how jobs that name a container image run; None: such jobs are refused at admission.
        self.container_runtime = container_runtime
        self._shapes = ShapeCache()  # each queued job's queue key and shape, kept across rounds (a long queue)
        #: How long a job without a time limit is expected to run, when planning the head's reservation.
        self.default_time_limit_s = default_time_limit_s
        #: The last round's reservation for the head of the queue, and its queue order (for `explain`).
        self.reservation: Reservation | None = None
        self.queue_order: list[str] = []
        self.metrics = DaemonMetrics()  # event counters for /metrics (corral.metrics); gauges are read at scrape time
        self.ticked_at = -math.inf  # time.monotonic() at the end of the latest round, for /readyz
        self._noted: set[str] = set()  # placement notes logged once (the same note comes for every such job)
        #: Preemption (corral.daemon.preemption): SIGTERM, this grace, SIGKILL; who may preempt whom.
        self.preempt_grace_s = preempt_grace_s
        #: Who may preempt whom: given, else the queues' (`Queues.preemption_rules`, taken each round).
        self.preemption_rules = preemption_rules
        #: Victims signalled and not yet exited: victim id -> (preemptor id, kill deadline). One preemption at a time.
        self._preempting: dict[str, tuple[str, float]] = {}
        #: The inputs of the latest round that changed nothing (`_same_round`): its time, holding and waiting jobs,
        #: GPU sample and queues configuration; None after a round that started or preempted a job.
        self._quiet: tuple[float, list[Job], list[Job], object, object] | None = None
        #: Whether `tick` leaves out a pass whose inputs did not change (QUIET_ROUND_S): the server's loop sets it;
        #: tests and the simulator, which drive rounds themselves, get every pass.
        self.quiet_rounds = False
        #: Queues, limits and fair share (corral.daemon.queues); one queue without limits when no file is given.
        self.queues = queues if queues is not None else Queues(node)
        #: How jobs are contained, in words (the executor's cgroups, or its "no cgroups: ..." notice; None: not said).
        self.containment: str | None = getattr(executor, "containment", None)
        #: False when the executor falls back to process groups (said at start, in /readyz and `corral gpus`).
        self.contained: bool = bool(getattr(executor, "contained", True))

        #: Ended jobs that waiting jobs depend on: id -> (state, attempts), so a round reads each from the store once.
        self._dependency_ended: dict[str, tuple[JobState, int]] = {}
        #: Each waiting dependent job's last verdict; the jobs they name, as last seen (the Job, or its ended state),
        #: and which waiting jobs name each; the reasons of those that wait. Kept from round to round.
        self._dependency_memo: dict[str, _DependencyMemo] = {}
        self._dependency_seen: dict[str, object] = {}
        self._dependency_by_ref: dict[str, list[str]] = {}
        self._dependency_blocked: dict[str, str] = {}
        #: Dependencies' ids that name arrays or tasks (`_array_ref`), looked up once.
        self._refs: dict[str, tuple[str, array.ArraySpec | None]] = {}

    # ---------------------------------------------------------------------------------------------- requests
    def submit(self, spec: JobSpec, idempotency_key: str | None = None) -> Job:
        """Validate against this machine and store durably; the returned job is acknowledged. `idempotency_key`:
        see `Store.add` (KeyInUse carries the job stored earlier under the key)."""
        spec = self.admit(spec)
        if spec.array is not None:  # one job per task, in one write; the answer is the first task (the array's id)
            return self.store.add_array(spec, self.clock(), idempotency_key=idempotency_key)[0]
        return self.store.add(spec, self.clock(), idempotency_key=idempotency_key)

    def admit(self, spec: JobSpec, *, admin: bool = False, dependencies: bool = True) -> JobSpec:
        """`spec` checked against this machine and its queue (named), as submit and update check it. `admin`: the
        caller is root or an admin (a queue's bounds and submitters do not apply); `dependencies`: check them too."""
        try:
            spec = self.queues.admit(spec, admin=admin)  # its queue named, and allowed (priority bound, who may submit)
            with self._admit_lock:
                validate_against(self._empty, spec.request)
                # Refuse what this machine can never run, even when idle: it would wait for ever.
                empty = place(self._empty, spec.request, self.config, 0)
                whole = gang.place_gang(self._empty, spec.request, spec.instances, self.config, 0)
            if not empty.placed and all(empty.unresolvable(i) for i in range(len(self._empty))):
                raise InvalidRequest("request", f"can never run on this machine: {render(empty.explanation)}")
            if spec.dependency and dependencies:
                self.check_dependency(spec)
            if spec.instances > 1:
                if not getattr(self.executor, "runs_gangs", False):
                    raise InvalidRequest("instances", "this daemon's executor runs one process per job: no gangs")
                if whole.allocation is None:
                    raise InvalidRequest("instances", f"can never run on this machine, even idle: {whole.reason()}")
        except InvalidRequest as exc:
            log.info("refused a job of %s (uid %d): %s: %s", spec.user, spec.uid, exc.field, exc.message)
            self.metrics.refused.labels(exc.field).inc()
            raise
        return spec

    # ---------------------------------------------------------------------------------------------- hold, update
    def _waiting(self, job_id: str, uid: int | None, what: str) -> Job:
        job = self.store.get(job_id)
        if job is None or (uid is not None and job.spec.uid != uid):
            raise JobNotFound(job_id)
        if job.state is not JobState.QUEUED:
            raise InvalidRequest("state", f"job {job_id} is {job.state.value}: only a waiting job can be {what}")
        return job

    def _respec(self, job: Job, spec: JobSpec, fields: Mapping[str, object] | None = None) -> Job:
        """Store a waiting job's changed spec; its cached dependency verdict is worked out again next round."""
        done = self.store.update(job.id, expect_version=job.version, spec=spec, **(fields or {}))
        self._dependency_memo.pop(job.id, None)
        return done

    def hold(self, job_id: str, by: str, uid: int | None = None) -> Job:
        """Hold a waiting job: it is not offered to the scheduler until released. `uid` None: root or an admin (any
        job); otherwise the owner's own. Holding a held job changes nothing."""
        job = self._waiting(job_id, uid, "held")
        change = self._held(job, by)
        return job if change is None else self._respec(job, *change)

    def _held(self, job: Job, by: str) -> tuple[JobSpec, dict[str, object]] | None:
        if job.spec.held_by:
            return None
        change = Change(self.clock(), by, "held", "no", "yes")
        spec = replace(job.spec, held_by=by, history=(*job.spec.history, change))
        return spec, {"reason": f"{HELD}{by} (corral release {job.id})"}  # held_reason of the held job

    def release(self, job_id: str, by: str, uid: int | None = None) -> Job:
        """Release a held job. A hold by root or an admin (anyone but the owner) is released only by root or an
        admin. Releasing a job that is not held changes nothing."""
        job = self._waiting(job_id, uid, "released")
        change = self._released(job, by, uid)
        return job if change is None else self._respec(job, *change)

    def _released(self, job: Job, by: str, uid: int | None) -> tuple[JobSpec, dict[str, object]] | None:
        if not job.spec.held_by:
            return None
        if uid is not None and job.spec.held_by != job.spec.user:
            raise Forbidden("job", f"job {job.id} was held by {job.spec.held_by}: only root or an admin may release it")
        change = Change(self.clock(), by, "held", "yes", "no")
        spec = replace(job.spec, held_by="", history=(*job.spec.history, change))
        return spec, ({"reason": ""} if job.reason.startswith(HELD) else {})

    def update(self, job_id: str, changes: Mapping[str, object], by: str, uid: int | None = None) -> Job:
        """Change a waiting job: `changes` maps priority, time_limit_s, queue, gpus and name to their new values. The
        changed job is checked as a submission is (`admit`; its dependencies are unchanged). `uid` None: root or an
        admin, beyond the owner's bounds."""
        job = self._waiting(job_id, uid, "updated")
        change = self._updated(job, changes, by, uid, {})
        return job if change is None else self._respec(job, *change)

    def _updated(
        self, job: Job, changes: Mapping[str, object], by: str, uid: int | None, admitted: dict[str, JobSpec]
    ) -> tuple[JobSpec, dict[str, object]] | None:
        """`admitted`: specs admitted already, by their JSON without the array's task (an array's tasks share one
        spec: it is admitted once, not once a task)."""
        spec, request = job.spec, job.spec.request
        new: dict[str, object] = {}
        if "priority" in changes:
            request = replace(request, priority=int(changes["priority"]))  # type: ignore[call-overload]
        if "gpus" in changes:
            request = with_gpus(request, int(changes["gpus"]))  # type: ignore[call-overload]
        if request != spec.request:
            new["request"] = request
        for name in ("time_limit_s", "queue", "name"):
            if name in changes:
                new[name] = changes[name]
        changed = replace(spec, **new)  # type: ignore[arg-type]
        key = spec_to_json(replace(changed, array=None, history=(), held_by=""))
        updated = admitted.get(key)
        if updated is None:
            check_admissible(changed)
            updated = admitted[key] = self.admit(changed, admin=uid is None, dependencies=False)
        if changed.array is not None:
            updated = array.task_spec(updated, changed.array.job_id, changed.array.task)
        updated = replace(updated, history=spec.history, held_by=spec.held_by)
        now = self.clock()
        history = [
            Change(now, by, name, text(getattr(spec, name)), text(getattr(updated, name)))
            for name in ("name", "queue", "time_limit_s")
            if getattr(spec, name) != getattr(updated, name)
        ]
        for name, old_value, new_value in (
            ("priority", spec.request.priority, updated.request.priority),
            ("gpus", spec.request.gpu_count, updated.request.gpu_count),
        ):
            if old_value != new_value:
                history.append(Change(now, by, name, str(old_value), str(new_value)))
        if not history:
            return None
        return replace(updated, history=(*spec.history, *history)), {}

    # ---------------------------------------------------------------------------------------------- arrays
    def tasks(self, array_id: str) -> list[Job]:
        """Every task of the array `array_id` (ids array_id, array_id + 1, ...), in task order; [] for no array.
        Those not ended from the store's memory copy, the ended ones from one query."""
        head = self.store.get(array_id)
        if head is None or head.spec.array is None or head.spec.array.job_id != head.id:
            return []
        count = head.spec.array.spec.count
        first, end = int(array_id), int(array_id) + count
        active = [j for j in self.store.list(ACTIVE_STATES) if first <= int(j.id) < end]
        if len(active) == count:
            return active
        before = str(first - 1) if first > 1 else None  # ids are consecutive: a page of the store from the array's id
        ended = self.store.query(JobQuery(states=FINAL_STATES, after=before, limit=count - len(active)))
        return sorted([*active, *(j for j in ended if int(j.id) < end)], key=lambda j: int(j.id))

    def targets(self, ref_text: str, uid: int | None) -> Targets:
        """The jobs `ID`, `ID_TASK` or `ID_[RANGES]` names (corral.jobs.array.parse_ref): an array's id names every
        task. `uid` None: root (anyone's); otherwise only that user's (another's answers "no job", as for a job)."""
        try:
            ref = array.parse_ref(ref_text)
        except InvalidRequest:
            if "_" in ref_text:  # meant as a task or a range: say what the forms are
                raise
            raise JobNotFound(ref_text) from None  # an id no job can have: as before arrays, "no job X"
        head = self.store.get(ref.job_id)
        if head is None or (uid is not None and head.spec.uid != uid):
            raise JobNotFound(ref.text)
        a = head.spec.array
        whole = a is not None and a.job_id == head.id
        if ref.tasks is None:
            return Targets(ref, self.tasks(head.id) if whole else [head], head.id if whole else None)
        if a is None or not whole:
            raise JobNotFound(f"{ref.text} ({head.id} is not a job array)")
        jobs: list[Job] = []
        for task in ref.tasks:
            job_id = array.task_job_id(head.spec, head.id, task)
            job = None if job_id is None else self.store.get(job_id)
            if job is None:
                raise JobNotFound(f"{head.id}_{task} (the tasks of array {head.id}: {a.spec.text})")
            jobs.append(job)
        return Targets(ref, jobs, None)

    def _many(
        self,
        job_ids: Sequence[str],
        change: Callable[[Job], tuple[JobSpec, dict[str, object]] | None],
    ) -> list[Job]:
        """Apply `change` to every waiting job of `job_ids` (an array's tasks) in one durable write; the others
        (started, ended) are left alone. Returns the jobs changed."""
        writes: dict[str, dict[str, object]] = {}
        wanted = set(job_ids)
        for job in self.store.list([JobState.QUEUED]):  # the memory copy: no read of the store a job
            if job.id not in wanted:
                continue
            done = change(job)
            if done is not None:
                writes[job.id] = {"spec": done[0], **done[1]}
        changed = self.store.update_many(writes) if writes else []
        for job in changed:
            self._dependency_memo.pop(job.id, None)
        return changed

    def hold_many(self, job_ids: Sequence[str], by: str, uid: int | None = None) -> list[Job]:
        """`hold` of every waiting job among `job_ids` (an array's tasks: corral hold ID of an array)."""
        return self._many(job_ids, lambda job: self._held(job, by))

    def release_many(self, job_ids: Sequence[str], by: str, uid: int | None = None) -> list[Job]:
        return self._many(job_ids, lambda job: self._released(job, by, uid))

    def update_many(
        self, job_ids: Sequence[str], changes: Mapping[str, object], by: str, uid: int | None = None
    ) -> list[Job]:
        admitted: dict[str, JobSpec] = {}
        return self._many(job_ids, lambda job: self._updated(job, changes, by, uid, admitted))

    def check_dependency(self, spec: JobSpec) -> None:
        """A job may depend on jobs that exist and that its submitter may see: their own, or anyone's for root (a
        user learns nothing of another user's jobs, not even that an id is taken). Since they exist, they are older
        than the job: no cycle can be made. singleton needs a name, the one it keeps to a job at a time."""
        if any(d.kind is dependency.Kind.SINGLETON for d in spec.dependency) and not spec.name:
            raise InvalidRequest(
                dependency.FIELD, "singleton needs a name (--name): one job of that name and user runs at a time"
            )
        for job_id in dependency.job_ids(spec.dependency):
            other = self.store.get(job_id.partition("_")[0])  # an array's task (12_3): its array's, and that task
            if other is not None and "_" in job_id and self._array_ref(job_id)[0] == job_id:
                other = None  # the array has no such task
            if other is None or not (spec.uid == 0 or other.spec.uid == spec.uid):
                raise InvalidRequest(
                    dependency.FIELD,
                    f"no job {job_id} that you can see (a job may depend on your own jobs; root's on anyone's)",
                )

    def cancel(self, job_id: str, uid: int | None = None) -> Job:
        """Cancel a job. `uid` None = root (any job); otherwise only the submitter's own jobs."""
        job = self.store.get(job_id)
        if job is None:
            raise InvalidRequest("job", f"no job {job_id}")
        if uid is not None and job.spec.uid != uid:
            raise InvalidRequest("job", f"job {job_id} is not yours")
        if job.state is JobState.QUEUED:
            done = self.store.transition(job_id, JobState.CANCELLED, expect=[JobState.QUEUED], reason="cancelled")
            log.info("job %s of %s cancelled while queued", job_id, job.spec.user)
            self.metrics.job_ended(JobState.CANCELLED, "cancelled")
            self._tell_ended(done)
            return done
        if job.state.holds_resources and job_id in self._exits:
            raise StoreError(
                f"job {job_id} has already ended, but the job store cannot record it yet; nothing to cancel"
            )
        if job.state.holds_resources:
            self.executor.cancel(job_id)
            self._cancelling.add(job_id)  # its exit ends it CANCELLED, stored or not
            try:
                return self.store.update(job_id, reason=CANCELLING)
            except StoreError as exc:
                raise StoreError(
                    f"job {job_id}: the cancel was sent to the job, but it could not be recorded ({exc}); the job "
                    "ends as cancelled once the store works again"
                ) from exc
        raise InvalidRequest("job", f"job {job_id} already ended ({job.state.value})")

    # ---------------------------------------------------------------------------------------------- the loop
    def tick(self, unlocked: Callable[[], contextlib.AbstractContextManager[object]] | None = None) -> list[str]:
        """One round: collect exits, schedule, launch. Returns the ids started.

        With `quiet_rounds` (the server's loop), exits, controllers, time limits and GPU samples are seen as always,
        but the scheduling pass is left out when its inputs are those of the last pass, which changed nothing (see
        QUIET_ROUND_S).

        `unlocked`: a context in which the daemon's lock is released (the server's loop passes one). The round then
        starts its jobs' supervisors outside the lock: everything is decided and stored (STARTING, with the grant)
        under it, and only the process launches, which take milliseconds each, happen without it, so API calls
        and cancels are not held up by them. A cancel that arrives meanwhile is sent once the launch is done."""
        now = self.clock()
        for ended in self.executor.poll():
            self._exits[ended.job_id] = ended
        self._flush(now)
        self._say_ending()
        for controller in self.controllers:
            try:
                controller.tick(self, now)
            except Exception:  # one controller's fault must not stop scheduling
                log.exception("controller %s failed", type(controller).__name__)
        holding = self.store.list([JobState.STARTING, JobState.RUNNING])
        self._say_over_limit(holding, now)
        self._sample(holding, now)
        self.usage.observe(holding, self.gpu_use, now)
        if self.watchdog != "off":
            self._watch_memory(holding)
        queued = self.store.list([JobState.QUEUED])
        if self.quiet_rounds and self._same_round(holding, queued, now):
            self.ticked_at = time.monotonic()
            return []
        snapshot = self.snapshot(holding)
        # Jobs whose dependencies do not hold yet are not offered: neither scheduled nor counted in a queue's order.
        waiting, blocked = self._dependencies(queued, holding)
        on_hold = {j.id: held_reason(j) for j in queued if j.spec.held_by}
        if on_hold:  # held: not offered, whatever its dependencies say
            blocked.update(on_hold)
            waiting = [j for j in waiting if j.id not in on_hold]
        waiting, throttled = array.throttle(waiting, holding)  # an array's %N: the tasks beyond it are not offered
        blocked.update(throttled)
        owner = self._share_owner if self.mps is not None else None
        ends = {j.id: expected_end(j.started_at, j.spec.time_limit_s, self.default_time_limit_s, now) for j in holding}
        # Victims of a preemption end by their kill deadline: the head's reservation then holds what they free for
        # the preemptor, so backfill does not take it during the grace period.
        self._preempting = {v: p for v, p in self._preempting.items() if v in ends}
        for victim, (_, deadline) in self._preempting.items():
            ends[victim] = min(ends[victim], max(now, deadline))
        # One round of tenancy (corral.tenancy.plan_round, docs/tenancy.md): the queues' order and limits, the pass
        # (backfill behind the head's reservation, gangs), the head's preemption. The daemon carries it out.
        queue_of = self.queues.queue_of

        def work(job: Job) -> Work:
            return work_of(job, queue_of(job), owner(job) if owner is not None else "")

        decided = plan_round(
            RoundConfig(self.config, max_starts=STARTS_PER_ROUND, default_time_limit_s=self.default_time_limit_s),
            waiting, self.queues.running(holding, gone=self._exits), ClusterView(snapshot, ends), self.queues, now,
            work_of=work, cache=self._shapes, rng=self.rng, preempt=not self._preempting, rules=self.preemption_rules,
        )  # fmt: skip
        plan = Plan(
            list(decided.starts), dict(decided.reasons), set(decided.unresolvable), 0, decided.unplaced,
            decided.reservations[0] if decided.reservations else None, list(decided.order),
        )  # fmt: skip
        self._preempt(decided.preemptions, holding, now)
        self._say_preempting(plan)
        self.reservation, self.queue_order = plan.reservation, plan.order
        self.metrics.round(self.config.policy, placed=len(plan.starts), unplaced=plan.unplaced)
        foreign = self.foreign_text()
        plan.waiting.update(blocked)
        # before any launch: the lock may be let go there
        self._store_reasons(queued if blocked else waiting, plan.waiting, foreign, now)
        busy = {u for j in holding for u in j.gpu_uuids}
        prepared: list[tuple[Job, LaunchSpec]] = []
        for start in plan.starts:
            for note in start.notes:  # e.g. Marathon's "undefined" behaviour warns on every GPU-node placement
                cause = re.sub(r"\d+", "#", note)  # the note's words without its figures (fgd-priced's vary per job)
                if cause not in self._noted:  # once per cause: each job's reason keeps its own note
                    self._noted.add(cause)
                    log.warning("job %s: %s (said once; later jobs carry it in their reason)", start.job_id, note)
            ready = self._prepare(start.job_id, start.allocation, now, "; ".join(start.notes))
            if ready is not None:
                prepared.append(ready)
        if prepared and unlocked is not None:
            with unlocked():
                launched = [(job, spec, self._try_launch(spec)) for job, spec in prepared]
        else:
            launched = [(job, spec, self._try_launch(spec)) for job, spec in prepared]
        started = []
        for job, spec, outcome in launched:
            if self._launched(job, spec, outcome, now):
                started.append(job.id)
                busy.update(spec.gpu_uuids)
        self._stop_idle_mps(busy)
        quiet = not prepared and not decided.preemptions
        self._quiet = (now, list(holding), queued, self.gpu_use, self.queues.config) if quiet else None
        self.ticked_at = time.monotonic()
        return started

    def _same_round(self, holding: list[Job], queued: list[Job], now: float) -> bool:
        """Whether a scheduling pass now would see what the last one saw, which changed nothing: the same job
        objects (the store's copies are replaced, never changed, on every write) waiting and holding, the same GPU
        sample and queues configuration, no exit, preemption or write waiting to be stored; within QUIET_ROUND_S."""
        last = self._quiet
        if last is None or not 0 <= now - last[0] < QUIET_ROUND_S:
            return False
        if self._exits or self._preempting or self._unrecorded or self._requeue or self._store_failing:
            return False
        _, was_holding, was_queued, gpu_use, config = last
        return (
            gpu_use is self.gpu_use
            and config is self.queues.config
            and len(was_holding) == len(holding)
            and len(was_queued) == len(queued)
            and all(map(operator.is_, was_holding, holding))
            and all(map(operator.is_, was_queued, queued))
        )

    def _say_ending(self) -> None:
        """Jobs the executor holds although their supervisor is gone (their cgroup still has processes, being
        killed): their reason says so until the exit comes, and their grant stays theirs until then. A reason that
        already says the job is ending (a cancel, a preemption, the watchdog's kill) is left as it is."""
        ending = getattr(self.executor, "ending", None)
        if ending is None:
            return
        with contextlib.suppress(StoreError):  # a failing store: said in a later round
            for job_id, why in ending().items():
                job = self.store.get(job_id)
                if job is None or not job.state.holds_resources or job.reason == why:
                    continue
                if job.reason.startswith((CANCELLING, PREEMPTING, OVER_GRANT)):
                    continue
                self.store.update(job_id, reason=why)
                log.warning("job %s: %s", job_id, why)

    def _say_over_limit(self, holding: list[Job], now: float) -> None:
        """Running jobs past their time limit: their supervisor is stopping them (SIGTERM, then the whole cgroup
        killed after the grace period); until the cgroup is empty they hold their grant, and their reason says why."""
        for i, job in enumerate(holding):
            limit, started = job.spec.time_limit_s, job.started_at
            if job.state is not JobState.RUNNING or limit is None or started is None or now < started + limit:
                continue
            if job.reason.startswith(("ending", CANCELLING, PREEMPTING, OVER_GRANT)):  # OVER_LIMIT is an "ending" too
                continue
            why = (
                f"{OVER_LIMIT} ({preemption.span_text(limit)}): its processes are being stopped; its GPUs go to the "
                "next job once none of them runs"
            )
            with contextlib.suppress(StoreError):  # a failing store: said in a later round
                holding[i] = self.store.update(job.id, reason=why)

    # ---------------------------------------------------------------------------------------------- dependencies
    def _dependencies(self, queued: list[Job], holding: Sequence[Job]) -> tuple[list[Job], dict[str, str]]:
        """(the queued jobs whose dependencies hold, {id: reason} of those that wait for theirs). A dependency that
        can never be met cancels its job when it asked for that (--kill-on-invalid-dep), and its dependents see that
        in this same pass: every job depends on older jobs only, and the queue is read oldest first.

        Cost per round: a look-up per job named (an ended job's state is read from the store once, then kept while
        a waiting job names it), a verdict only for the jobs whose named jobs changed (and singletons), and nothing
        for a queue without dependencies. 5,000 waiting jobs, chained or all on one: about 3 ms a round, less than
        5,000 waiting jobs without dependencies (docs/dependencies.md)."""
        dependent = [j for j in queued if j.spec.dependency]
        if not dependent:
            self._dependency_ended, self._dependency_memo, self._dependency_seen = {}, {}, {}
            self._dependency_by_ref, self._dependency_blocked = {}, {}
            return queued, {}
        known: dict[str, Job] = {j.id: j for j in holding}
        known.update((j.id, j) for j in queued)
        ended = self._dependency_ended
        kept: dict[str, tuple[JobState, int]] = {}

        def one(job_id: str) -> tuple[JobState, int] | None:
            job = known.get(job_id)
            if job is not None:
                return job.state, job.attempts
            found = kept.get(job_id) or ended.get(job_id)
            if found is None:
                got = self.store.get(job_id)
                if got is None:
                    return None
                found = (got.state, got.attempts)
            if found[0].final and job_id not in self._requeue:  # a failure whose retry is not stored yet: not ended
                kept[job_id] = found
            return found

        arrays: dict[str, dependency.ArrayState] = {}  # this round's: 1,000 jobs on one array read its tasks once

        def state_of(ref: str) -> tuple[JobState, int] | dependency.ArrayState | None:
            found = arrays.get(ref)
            if found is None:
                got = self._ref_state(ref, one)
                if not isinstance(got, dependency.ArrayState):
                    return got
                found = arrays[ref] = got
            return found

        memo, blocked, by_ref, seen = (
            self._dependency_memo,
            self._dependency_blocked,
            self._dependency_by_ref,
            self._dependency_seen,
        )
        dirty: set[str] = set()
        if len(memo) != len(dependent) or any(j.id not in memo for j in dependent):  # jobs came or went
            waiting_ids = {j.id for j in dependent}
            for gone in [i for i in memo if i not in waiting_ids]:
                del memo[gone]
                blocked.pop(gone, None)
            for j in dependent:
                if j.id not in memo:
                    dirty.add(j.id)
                    deps = j.spec.dependency
                    has_single = any(d.kind is dependency.Kind.SINGLETON for d in deps)
                    memo[j.id] = _DependencyMemo(tuple(dependency.job_ids(deps)), has_single, dependency.READY, "")
            by_ref = {}
            for i, entry in memo.items():
                for ref in entry.ids:
                    by_ref.setdefault(ref, []).append(i)
            seen = {ref: seen.get(ref) for ref in by_ref}
            self._dependency_by_ref, self._dependency_seen = by_ref, seen
        # A job named that waits or runs is seen as its Job (stored jobs are immutable: the same object, the same
        # state; compared by identity), one that ended as its kept (state, attempts).
        for ref in by_ref:
            plain = "_" not in ref and not self._array_ref(ref)[1]  # a job (an array's state is worked out)
            now_seen: object = (known.get(ref) if plain else None) or state_of(ref)
            was = seen[ref]
            if now_seen is not was and now_seen != was:
                seen[ref] = now_seen
                dirty.update(by_ref[ref])
        dirty.update(i for i, entry in memo.items() if entry.singleton)  # its words name the job ahead, read anew
        singles: dict[tuple[int, str], Job] | None = None  # (uid, name) -> the job ahead: running, else oldest queued
        # Oldest first: every job names older jobs only, so one cancelled here is seen by its dependents after it.
        order = sorted(dirty, key=int)
        k = 0
        while k < len(order):
            job_id = order[k]
            k += 1
            job = known.get(job_id)
            if job is None or job.state is not JobState.QUEUED:
                continue
            entry = memo[job_id]
            single = ""
            if entry.singleton:
                if singles is None:
                    singles = {}
                    for j in [*holding, *queued]:
                        singles.setdefault((j.spec.uid, j.spec.name), j)
                ahead = singles.get((job.spec.uid, job.spec.name))
                if ahead is not None and ahead.id != job.id:
                    single = f"job {ahead.id} (singleton: same user and name) is {ahead.state.value}"
            v = dependency.verdict(job.spec.dependency, state_of, single)
            if v.status is dependency.Status.NEVER and job.spec.kill_on_invalid_dep:
                done = self._cancel_invalid(job, v)
                if done is not None:
                    known[job_id] = done
                    blocked.pop(job_id, None)
                    del memo[job_id]
                    later = [i for i in by_ref.get(job_id, ()) if i in memo and i not in dirty]
                    dirty.update(later)
                    order[k:] = sorted([*order[k:], *later], key=int)
                    continue
            reason = dependency.waiting_reason(v) if v.status is not dependency.Status.READY else ""
            memo[job_id] = replace(entry, verdict=v, reason=reason)
            if reason:
                blocked[job_id] = reason
            else:
                blocked.pop(job_id, None)
        self._dependency_ended = kept
        ready = [j for j in queued if j.id not in blocked and known[j.id].state is JobState.QUEUED]
        return ready, blocked

    def _cancel_invalid(self, job: Job, v: dependency.Verdict) -> Job | None:
        """--kill-on-invalid-dep: a job whose dependency can never be met is cancelled (None: the store failed)."""
        try:
            done = self.store.transition(
                job.id, JobState.CANCELLED, expect=[JobState.QUEUED], reason=dependency.cancelled_reason(v)
            )
        except (StoreError, InvalidRequest):
            return None
        log.info("job %s of %s cancelled: its dependency can never be met: %s", job.id, job.spec.user, v.text)
        self.metrics.job_ended(JobState.CANCELLED, "cancelled")
        self._tell_ended(done)
        return done

    def dependency_verdict(self, job: Job) -> dependency.Verdict:
        """What `explain` says of a waiting job's dependencies now (a few look-ups; the round's reason says so too)."""

        def one(job_id: str) -> tuple[JobState, int] | None:
            other = self.store.get(job_id)
            return None if other is None else (other.state, other.attempts)

        def state_of(ref: str) -> tuple[JobState, int] | dependency.ArrayState | None:
            return self._ref_state(ref, one)

        single = ""
        if any(d.kind is dependency.Kind.SINGLETON for d in job.spec.dependency):
            same = self.store.query(
                JobQuery(
                    states=(JobState.QUEUED, JobState.STARTING, JobState.RUNNING), uid=job.spec.uid,
                    name=job.spec.name, limit=MAX_SINGLETON_LOOK,
                )
            )  # fmt: skip
            ahead = [o for o in same if o.id != job.id and (o.state.holds_resources or int(o.id) < int(job.id))]
            if ahead:
                first = min(ahead, key=lambda o: (not o.state.holds_resources, int(o.id)))
                single = f"job {first.id} (singleton: same user and name) is {first.state.value}"
        return dependency.verdict(job.spec.dependency, state_of, single)

    def _array_ref(self, ref: str) -> tuple[str, array.ArraySpec | None]:
        """A dependency's id as a job id and, when it names a whole array, that array's spec: "12_3" -> ("15", None)
        (the task's job), "12" -> ("12", its ArraySpec) for an array, ("12", None) for a job. Kept: ids never change
        meaning (a job never becomes an array), so each is looked up once."""
        found = self._refs.get(ref)
        if found is not None:
            return found
        out: tuple[str, array.ArraySpec | None] = (ref, None)
        if "_" in ref:
            with contextlib.suppress(InvalidRequest):
                named = self.targets(ref, None).jobs
                out = (named[0].id, None) if len(named) == 1 else out
        else:
            head = self.store.get(ref)
            if head is not None and head.spec.array is not None and head.spec.array.job_id == head.id:
                out = (ref, head.spec.array.spec)
        if out != (ref, None) or self.store.get(ref) is not None:  # an id not (yet) known is looked up again
            self._refs[ref] = out
        return out

    def _ref_state(
        self, ref: str, one: Callable[[str], tuple[JobState, int] | None]
    ) -> tuple[JobState, int] | dependency.ArrayState | None:
        """A dependency's id as `dependency.verdict` reads it: a job's (state, attempts) through `one`, or an array's
        `ArrayState` from each of its tasks' (a look-up per task: the round's `one` reads ended tasks once)."""
        job_id, spec = self._array_ref(ref)
        if spec is None:
            return one(job_id)
        first, ended, started, succeeded, bad = int(job_id), 0, 0, 0, ""
        for i, task in enumerate(spec.tasks):
            found = one(str(first + i))
            if found is None:
                continue
            state, attempts = found
            started += state is not JobState.QUEUED or attempts > 0
            if state.final and str(first + i) not in self._requeue:
                ended += 1
                succeeded += state is JobState.SUCCEEDED
                if not bad and state is not JobState.SUCCEEDED:
                    bad = f"task {job_id}_{task} {dependency.ENDED_WORDS[state]}"
        return dependency.ArrayState(spec.count, ended, started, succeeded, bad)

    # ---------------------------------------------------------------------------------------------- preemption
    def _preempt(self, preemptions: Sequence[Preemption], holding: Sequence[Job], now: float) -> None:
        """The round's preemptions (corral.tenancy.preemption, chosen by plan_round for the first job in queue order
        that waits): each victim's reason and preemption record are stored, then it gets SIGTERM (the executor sends
        SIGKILL after the grace). Its exit sends it back to the queue (`_requeue_preempted`)."""
        jobs = {j.id: j for j in holding}
        for p in preemptions:
            for victim in p.victims:
                job = jobs[victim]
                text = p.words[victim]
                count = (job.preempted.count if job.preempted is not None else 0) + 1
                try:  # durable before the signal: a restarted daemon reads from the reason that the exit is one
                    self.store.update(job.id, reason=PREEMPTING + text, preempted=Preempted(count, now, text))
                except StoreError:
                    log.warning("job %s: its preemption could not be stored; not preempted", job.id)
                    return
                self.executor.cancel(job.id, grace_s=self.preempt_grace_s)
                self._preempting[job.id] = (p.preemptor, now + self.preempt_grace_s)
                self.metrics.preemptions.labels(p.why[victim]).inc()
                self.metrics.preempted_gpu_seconds.inc(p.gpu_seconds.get(victim, 0.0))
                log.info("job %s of %s %s (grace %g s)", job.id, job.spec.user, text, self.preempt_grace_s)

    def _say_preempting(self, plan: Plan) -> None:
        """A preemptor's reason names the jobs being stopped for it (no times: the words stay put every round)."""
        for_whom: dict[str, list[str]] = {}
        for victim, (preemptor_id, _) in self._preempting.items():
            for_whom.setdefault(preemptor_id, []).append(victim)
        for preemptor_id, victims in for_whom.items():
            if preemptor_id in plan.waiting:
                ids = sorted(victims, key=lambda i: (len(i), i))
                plan.waiting[preemptor_id] += (
                    f"; preempting job{'s' if len(ids) > 1 else ''} {_ids_text(ids)} for it "
                    f"(SIGTERM, then SIGKILL after {self.preempt_grace_s:g} s)"
                )

    def _requeue_preempted(self, job: Job, ended: Exit, now: float) -> None:
        """A preempted job has exited: back to the queue, its attempts kept, no retry used, not a failure."""
        how = (
            "exit code 0"
            if ended.succeeded
            else (f"killed by signal {ended.signal}" if ended.signal is not None else f"exit code {ended.exit_code}")
        )
        text = job.reason.removeprefix(PREEMPTING)
        record = job.preempted or Preempted(1, now, text)  # None only for a job preempted by an older corral
        self.store.transition(
            job.id,
            JobState.QUEUED,
            expect=[JobState.RUNNING],
            not_before=now,
            gpus=(),
            gpu_uuids=(),
            pid=None,
            pid_start_time=None,
            reason=f"{text}; it stopped ({how}) and is queued again (attempts kept, no retry used)",
            # the record keeps how it stopped: the queued job's reason is soon its place in the queue
            preempted=replace(record, reason=f"{record.reason}; it stopped ({how})"),
        )
        self._preempting.pop(job.id, None)
        log.info("job %s of %s preempted: stopped (%s), queued again", job.id, job.spec.user, how)

    def _store_reasons(self, waiting: Sequence[Job], planned: Mapping[str, str], foreign: str, now: float) -> None:
        """Every waiting job's reason, in one durable write for the round however many changed."""
        reasons: dict[str, dict[str, object]] = {}
        for job in waiting:  # a look-up per job: the words were made once per shape
            if job.not_before > now:
                continue  # its reason already says what failed and when it retries
            reason = planned.get(job.id)
            if reason is None:
                continue
            if foreign and job.spec.request.wants_gpu:
                reason = f"{reason}; {foreign}"
            if reason != job.reason:
                reasons[job.id] = {"reason": reason}
        if reasons:
            self.store.update_many(reasons)

    def _mps_share(self, request: Request) -> bool:
        return self.mps is not None and request.gpu_count == 1 and not request.whole_gpus

    def _share_owner(self, job: Job) -> str:
        """The user an MPS share is tied to (MPS serves one Unix user per GPU at a time); "" for other requests."""
        return job.spec.user if self._mps_share(job.spec.request) else ""

    def snapshot(self, holding: Iterable[Job]) -> ClusterSnapshot:
        """The machine minus what jobs hold, minus GPU memory that processes corral did not start fill."""
        snap = ClusterSnapshot([self.node])
        for job in holding:
            r = job.spec.request
            owner = job.spec.user if self._mps_share(r) else ""
            alloc = Allocation(job.id, self.node.name, 0, r.cpu_milli, r.memory_mib, job.gpus, affinity_tag(r), owner)
            snap.allocate(alloc if job.spec.instances == 1 else gang.held(job, self.node.name, owner))
        for dev in self.node.gpus:
            use = self.gpu_use.get(dev.uuid)
            if use is None:
                continue
            if use.utilization_pct is not None:
                snap.set_gpu_utilization(0, dev.index, use.utilization_pct / 100)
            if use.foreign_mib <= 0:
                continue
            # Held as a share of the GPU: the memory it uses, and 1 milli of compute, so a whole-GPU job never lands
            # on a GPU somebody else is using (how much compute it takes is not known). Capped at what is free.
            memory = min(use.foreign_mib, int(snap.gpu_mem_free[0, dev.index]))
            milli = min(1, int(snap.gpu_milli_free[0, dev.index]))
            if memory > 0 or milli > 0:
                grant = GpuGrant(dev.index, milli, memory)
                snap.allocate(Allocation(f"foreign:{dev.index}", self.node.name, 0, 0, 0, (grant,)))
        return snap

    def foreign_text(self) -> str:
        """Words for the GPU memory processes corral did not start hold, '' when none."""
        held = [
            f"GPU {dev.index}: {use.foreign_mib} MiB (pid {', '.join(map(str, use.foreign_pids[:3]))})"
            for dev in self.node.gpus
            if (use := self.gpu_use.get(dev.uuid)) is not None and use.foreign_mib > 0
        ]
        return f"GPU memory held by processes corral did not start: {'; '.join(held)}" if held else ""

    # ---------------------------------------------------------------------------------------------- live GPU use
    def _sample(self, holding: list[Job], now: float) -> None:
        if self.sampler is None or now - self._sampled_at < self.sample_every_s:
            return
        self._sampled_at = now
        try:
            samples = self.sampler.sample()
        except GpuDiscoveryError as exc:
            if not self._sample_failed:
                log.warning("cannot sample GPU use (%s): foreign memory and the watchdog wait until it works", exc)
            self._sample_failed = True
            self.gpu_use = {}
            return
        self._sample_failed = False
        groups = {j.pid: j.id for j in holding if j.pid is not None}
        running_mps = set(self.mps.running) if self.mps is not None else set()
        self.gpu_use = attribute(samples, groups, {j.id for j in holding}, running_mps, self.describe)

    def _watch_memory(self, holding: list[Job]) -> None:
        """A job using more GPU memory than its grant, where MPS does not cap it: warn, or kill it."""
        for job in holding:
            if job.state is not JobState.RUNNING or job.reason.startswith((CANCELLING, OVER_GRANT, PREEMPTING)):
                continue
            if self._mps_share(job.spec.request) and self.mps is not None and self.mps.available():
                continue  # MPS enforces its memory limit
            over = []
            for grant, uuid in zip(job.gpus, job.gpu_uuids, strict=False):
                use = self.gpu_use.get(uuid)
                used = use.jobs.get(job.id, 0) if use is not None else 0
                if grant.memory_mib > 0 and used > grant.memory_mib:
                    over.append(f"GPU {grant.index}: {used} MiB used, {grant.memory_mib} MiB granted")
            if not over:
                continue
            what = f"over its GPU memory grant ({'; '.join(over)})"
            if self.watchdog == "kill":
                log.warning("job %s is %s: killing it", job.id, what)
                self.metrics.watchdog.labels("kill").inc()
                self.store.update(job.id, reason=f"{OVER_GRANT}{what}")
                self.executor.cancel(job.id, grace_s=2.0)
            elif f"warning: {what}" != job.reason:
                log.warning("job %s is %s", job.id, what)
                self.metrics.watchdog.labels("warn").inc()
                self.store.update(job.id, reason=f"warning: {what}")

    def _stop_idle_mps(self, busy: set[str]) -> None:
        """Stop the MPS daemon of every GPU that no job holds any more (`busy`: UUIDs still held)."""
        if self.mps is None or not self.mps.running:
            return
        for uuid in sorted(self.mps.running - busy):
            self.mps.stop(uuid)

    def _prepare(self, job_id: str, alloc: Allocation, now: float, notes: str = "") -> tuple[Job, LaunchSpec] | None:
        """QUEUED -> STARTING with its grant and attempt stored, and the LaunchSpec; None if it cannot start now."""
        uuids = tuple(self.node.gpus[g.index].uuid for g in alloc.gpus)
        queued = self.store.get(job_id)
        if queued is None:
            return None
        try:  # one write: the attempt number names the supervisor's record, so it is stored before the launch
            job = self.store.transition(
                job_id,
                JobState.STARTING,
                expect=[JobState.QUEUED],
                gpus=alloc.gpus,
                gpu_uuids=uuids,
                reason=notes,
                attempts=queued.attempts + 1,
                started_at=now,
            )
        except InvalidRequest:  # cancelled meanwhile
            return None
        r = job.spec.request
        pipe = None
        # A gang's shares are not put under MPS (one pipe per job here); the memory watchdog guards them.
        if self.mps is not None and self._mps_share(r) and job.spec.instances == 1 and self.mps.available():
            try:
                pipe = str(self.mps.start(uuids[0]))
            except MpsError as exc:
                self._ended(job, JobState.FAILED, now, exit_code=None, reason=f"could not start: {exc}")
                return None
        script = _script_fields(job)
        spec = LaunchSpec(
            job_id=job_id,
            command=job.spec.command,
            env=job.spec.env,
            corral_env={**array.environment(job.spec), **script.pop("slurm_env", {})},
            cwd=job.spec.cwd,
            uid=job.spec.uid,
            gid=job.spec.gid,
            gpu_uuids=uuids,
            gpu_milli=r.gpu_milli if r.wants_gpu else 0,
            gpu_memory_mib=r.gpu_memory_mib,
            log_path=self.log_path(job_id),
            time_limit_s=job.spec.time_limit_s,
            mps_pipe_dir=pipe,
            attempt=job.attempts,
            cpu_milli=r.cpu_milli,  # per process (a gang's instance each): its cgroup's cpu.max, memory.max
            memory_mib=r.memory_mib,
            **script,
        )
        return job, spec

    def _try_launch(self, spec: LaunchSpec) -> Handle | OSError | ValueError:
        """The executor's launch; its refusal as a value. Touches no daemon state: it may run without the lock."""
        try:
            return self.executor.launch(spec)
        except (OSError, ValueError) as exc:
            return exc

    def _launched(self, job: Job, spec: LaunchSpec, outcome: Handle | OSError | ValueError, now: float) -> bool:
        """Record a launch's outcome (under the lock again): RUNNING with its pid, or FAILED with why."""
        if not isinstance(outcome, Handle):
            self._ended(job, JobState.FAILED, now, exit_code=None, reason=f"could not start: {outcome}")
            self.executor.forget(job.id, job.attempts)
            return False
        self._unrecorded[job.id] = outcome
        self._record_start(outcome)
        log.info("job %s of %s started (pid %d, GPUs %s)", job.id, job.spec.user, outcome.pid, _gpus_text(job))
        self.metrics.job_started(job, now)
        current = self.store.get(job.id)
        if job.id in self._cancelling or (current is not None and current.reason == CANCELLING):
            self.executor.cancel(job.id)  # cancelled while it was being launched, before the executor knew it
        return True

    def _record_start(self, handle: Handle) -> None:
        """STARTING -> RUNNING with the job's pid; kept for a later round if the store fails (the job runs anyway,
        under its supervisor, and its exit is handled whether or not this was stored)."""
        with contextlib.suppress(InvalidRequest):  # InvalidRequest: it has ended meanwhile (its exit stored first)
            self.store.transition(
                handle.job_id,
                JobState.RUNNING,
                expect=[JobState.STARTING],
                pid=handle.pid,
                pid_start_time=handle.start_time,
            )
        del self._unrecorded[handle.job_id]

    def log_path(self, job_id: str) -> Path:
        return self.state_dir / "logs" / f"{job_id}.log"

    def _flush(self, now: float) -> None:
        """Store what earlier rounds could not: starts, exits, returns to the queue. Stops at the first StoreError
        (the store is failing: the rest waits, in memory, for the next round)."""
        try:
            for handle in list(self._unrecorded.values()):
                self._record_start(handle)
            for job_id, ended in list(self._exits.items()):
                try:
                    self._finish(ended, now)
                except InvalidRequest as exc:  # a bug, not a store failure: never let it block the other exits
                    log.error("job %s: its exit %s cannot be stored: %s", job_id, ended, exc)
                del self._exits[job_id]
            for job_id, (reason, wait) in list(self._requeue.items()):
                self._retry(job_id, reason, wait, now)
        except StoreError as exc:
            if not self._store_failing:
                log.error(
                    "the job store fails (%s): %d exits kept in memory until it works again", exc, len(self._exits)
                )
            self._store_failing = True
            return
        if self._store_failing:
            log.warning("the job store works again: every exit kept in memory is stored")
        self._store_failing = False

    def _finish(self, ended: Exit, now: float) -> None:
        """Store a job's exit. Raises StoreError when the store fails; the caller keeps the exit and tries again."""
        job = self.store.get(ended.job_id)
        if job is None or not job.state.holds_resources:
            self._cancelling.discard(ended.job_id)
            return
        if job.state is JobState.STARTING:  # its start was never stored (the daemon died, or the store failed)
            job = self.store.transition(job.id, JobState.RUNNING, expect=[JobState.STARTING])
        when = now if ended.ended_at is None else min(now, ended.ended_at)
        cancelled = job.reason == CANCELLING or job.id in self._cancelling
        if cancelled:
            self._ended(job, JobState.CANCELLED, when, ended.exit_code, "cancelled")
        elif job.reason.startswith(OVER_GRANT):
            self._ended(job, JobState.FAILED, when, ended.exit_code, job.reason)
        elif job.reason.startswith(PREEMPTING):  # before `ended.cancelled`: the cancel was the preemption's SIGTERM
            self._requeue_preempted(job, ended, when)
        elif ended.cancelled:  # cancelled by a daemon that died before it could record the cancel
            self._ended(job, JobState.CANCELLED, when, ended.exit_code, "cancelled")
        elif ended.exit_code == 0 and ended.signal is None and not ended.timed_out:
            self._ended(job, JobState.SUCCEEDED, when, 0, "exit code 0")
        elif ended.oom_killed:
            how = f"killed by signal {ended.signal}" if ended.signal is not None else f"exit code {ended.exit_code}"
            why = (
                f"out of memory: the kernel killed a process of the job at its memory limit "
                f"({job.spec.request.memory_mib} MiB, the request's memory); {how}"
            )
            self._ended(job, JobState.FAILED, when, ended.exit_code, why)
        elif ended.unknown:
            why = "lost: the job's supervisor ended without recording its exit (exit code unknown)"
            self._ended(job, JobState.LOST, when, None, why)
        else:
            if ended.timed_out:
                why = f"time limit of {job.spec.time_limit_s:g} s reached"
            elif ended.signal is not None:
                why = f"killed by signal {ended.signal}"
            else:
                why = f"exit code {ended.exit_code}"
            self._ended(job, JobState.FAILED, when, ended.exit_code, why)
        self._cancelling.discard(job.id)
        self.executor.forget(job.id, job.attempts)  # stored: the supervisor's record has done its work

    def _ended(self, job: Job, state: JobState, now: float, exit_code: int | None, reason: str) -> None:
        done = self.store.transition(
            job.id, state, finished_at=now, exit_code=exit_code, reason=reason, usage=self.usage.usage_of(job)
        )
        self.queues.charge(done)  # its run counts in its account's fair share from now on
        log.info("job %s of %s ended: %s (%s)", job.id, job.spec.user, state.value, reason)
        self.metrics.job_ended(state, reason)
        # `failures`, not `attempts`: a preempted attempt uses up no retry
        if not (state in (JobState.FAILED, JobState.LOST) and done.failures <= job.spec.retries):
            self._tell_ended(done)
            return
        wait = backoff_s(done.failures)
        why = f"{reason}; retry {done.failures} of {job.spec.retries} in {wait:g} s"
        # The outcome is stored; if its return to the queue is not, `_retry` keeps it for later rounds (or a restart).
        with contextlib.suppress(StoreError):
            self._retry(job.id, why, now + wait, now)

    def _retry(self, job_id: str, reason: str, not_before: float, now: float) -> None:
        self._requeue.pop(job_id, None)
        try:
            self.store.transition(
                job_id,
                JobState.QUEUED,
                expect=[JobState.FAILED, JobState.LOST],
                not_before=not_before,
                gpus=(),
                gpu_uuids=(),
                pid=None,
                pid_start_time=None,
                reason=reason,
            )
        except StoreError:
            self._requeue[job_id] = (reason, not_before)
            raise
        except InvalidRequest:
            pass  # requeued already

    def _tell_ended(self, job: Job) -> None:
        """A job has ended for good: the controller that made it (if any) hears of it."""
        if not job.spec.origin:
            return
        for controller in self.controllers:
            try:
                controller.job_ended(self, job)
            except Exception:
                log.exception("controller %s failed on the end of job %s", type(controller).__name__, job.id)

    # ---------------------------------------------------------------------------------------------- restart
    def recover(self) -> None:
        """After a restart, all at once: `recover_live`, then every step of `catch_up`."""
        self.recover_live()
        for _ in self.catch_up():
            pass

    def recover_live(self) -> None:
        """After a restart: each STARTING/RUNNING job gets the outcome its supervisor recorded, is adopted while its
        supervisor lives, goes back to the queue if it never started, and is LOST (retried by policy) only when
        its supervisor is gone without a record. Costs what the jobs holding resources cost (a few), not the
        history: what grows with the history is `catch_up`'s."""
        now = self.clock()
        keep: set[tuple[str, int]] = set()
        for job in self.store.list([JobState.STARTING, JobState.RUNNING]):
            keep.add((job.id, job.attempts))
            found = self.executor.reattach(job.id, job.attempts) if job.attempts > 0 else None
            if found is not None and found.found is Found.ENDED and found.exit is not None:
                self._exits[job.id] = found.exit  # stored just below, or kept for later rounds
            elif found is not None and found.found is Found.ALIVE:
                if job.state is JobState.STARTING and found.handle is not None:
                    self._unrecorded[job.id] = found.handle
                if job.reason.startswith(PREEMPTING):
                    self._resume_preemption(job, now)
            elif found is not None and found.found is Found.GONE:
                self._ended(job, JobState.LOST, now, None, "lost: its supervisor was gone when the daemon restarted")
            elif self._adopt_bare(job):
                continue
            elif job.state is JobState.STARTING:
                # The daemon stopped between storing STARTING and starting the supervisor: nothing ran.
                self.store.transition(job.id, JobState.LOST, attempts=max(0, job.attempts - 1), finished_at=now)
                self._retry(job.id, "the daemon restarted before the job started; queued again", now, now)
            else:
                self._ended(job, JobState.LOST, now, None, "lost: the process was gone when the daemon restarted")
        self.executor.sweep(keep)
        self._flush(now)

    def catch_up(self, page: int = RECOVERY_PAGE) -> Iterator[None]:
        """The rest of a restart, `page` jobs at a time, yielding between pages: failed and lost jobs whose retry
        was decided but not stored go back to the queue, and the queues' fair-share ledger is rebuilt from the
        jobs that ended (corral.daemon.queues). Its cost grows with the store's history (a daemon with 100,000 ended
        jobs read them all, holding the lock for seconds, before it answered anyone: issue 26, item 7), so
        `corral serve` answers first and runs these steps in its loop, taking the lock for each step and letting
        it go between them; its first round comes after the last step, so no decision is made on a partial
        ledger. Ends at once on a fresh store."""
        now = self.clock()
        after: str | None = None
        while True:
            # a retry decided, then the daemon stopped before storing it
            jobs = self.store.query(JobQuery(states=_RETRIED_FROM, after=after, limit=page))
            for job in jobs:
                if job.failures <= job.spec.retries and job.id not in self._requeue:
                    wait = backoff_s(job.failures)
                    self._retry(job.id, f"{job.reason}; retry {job.failures} of {job.spec.retries}", now + wait, now)
            if len(jobs) < page:
                break
            after = jobs[-1].id
            yield
        if self.queues.active:
            counted = yield from self.queues.rebuilding(self.store, now, page)
            log.info("queues from %s: %s; usage of %d finished jobs", self.queues.path,
                     ", ".join(self.queues.config.queues), counted)  # fmt: skip

    def _resume_preemption(self, job: Job, now: float) -> None:
        """After a restart, a victim still alive: its SIGTERM may never have been sent (the daemon died between
        storing the preemption and signalling), so it is sent again with what is left of the grace (a second cancel
        restarts the supervisor's timer from there, so the SIGKILL comes about when it was due)."""
        at = job.preempted.at if job.preempted is not None else now
        deadline = at + self.preempt_grace_s
        self.executor.cancel(job.id, grace_s=max(0.0, deadline - now))
        self._preempting[job.id] = ("", deadline)

    def _adopt_bare(self, job: Job) -> bool:
        """A job started before supervisors existed: adopted by PID and start time (its exit code stays unknown)."""
        pid, start = job.pid, job.pid_start_time
        if (pid is None or start is None) and self.find_process is not None:
            found = self.find_process(job.id)
            if found is not None:
                pid, start = found
        if pid is None or start is None or not self.executor.adopt(job.id, pid, start, job.spec.time_limit_s):
            return False
        if job.state is JobState.STARTING:
            self.store.transition(job.id, JobState.RUNNING, pid=pid, pid_start_time=start)
        return True

    # ---------------------------------------------------------------------------------------------- bulk cancel
    def cancel_many(
        self,
        job_ids: Collection[str] | None = None,
        query: JobQuery | None = None,
        uid: int | None = None,
        *,
        whole_arrays: bool = False,
    ) -> CancelOutcome:
        """Cancel many jobs at once: the queued ones in one durable store write, the running ones signalled (their
        reasons in one more write), so 20,000 jobs cost two commits, not 20,000.

        Which jobs: `job_ids`, or every job `query` selects (its paging ignored), or the ids that `query` also
        selects when both are given. `uid` None = root (any job); otherwise only that user's own jobs: another
        user's job counts as not found, as `cancel` says "no job N" for it. `whole_arrays`: an array's id among
        `job_ids` stands for every task (`corral cancel 12`), not only its first."""
        if job_ids is None and query is None:
            raise InvalidRequest("request", "say which jobs to cancel: ids, a state or a name")
        scope = replace(query or JobQuery(), after=None, limit=None, newest_first=False)
        if uid is not None:
            scope = replace(scope, uid=uid)
        missing: list[str] = []
        if job_ids is None:
            found = self.store.query(scope)
        else:
            named: dict[str, Job] = {}
            for job_id in dict.fromkeys(job_ids):
                job = self.store.get(job_id)
                if job is not None and scope.matches(job):
                    named[job.id] = job
                    a = job.spec.array
                    if whole_arrays and a is not None and a.job_id == job.id:
                        named.update((t.id, t) for t in self.tasks(job.id) if scope.matches(t))
                else:
                    missing.append(job_id)
            found = list(named.values())
        queued = [j.id for j in found if j.state is JobState.QUEUED]
        cancelled = self.store.transition_many(queued, JobState.CANCELLED, expect=[JobState.QUEUED], reason="cancelled")
        gone = {j.id for j in cancelled}
        if cancelled:  # one line for a bulk cancel, however many jobs
            log.info("%d queued jobs cancelled: %s", len(cancelled), _ids_text([j.id for j in cancelled]))
            self.metrics.ended.labels(JobState.CANCELLED.value, "cancelled").inc(len(cancelled))
        # As `cancel`: a job whose exit is in hand but not yet stored has ended; its real outcome stands.
        running = [j for j in found if j.state.holds_resources and j.id not in self._exits]
        for job in running:
            self.executor.cancel(job.id)
            self._cancelling.add(job.id)  # its exit ends it CANCELLED, stored or not (as `cancel`)
        signalled = {j.id: {"reason": CANCELLING} for j in running if j.reason != CANCELLING}
        if signalled:
            self.store.update_many(signalled)
        for done in cancelled:
            self._tell_ended(done)
        signalled_ids = {j.id for j in running}
        ended = [j.id for j in found if j.id not in gone and j.id not in signalled_ids]
        return CancelOutcome([j.id for j in cancelled], [j.id for j in running], ended, missing)


def _script_fields(job: Job) -> dict[str, Any]:
    """A launch's batch-script fields (corral.jobs.batch): the stored text, --output and --error as files."""
    s = job.spec
    if s.script is None and not s.output and not s.error:
        return {}
    from corral.jobs.batch import launch_path

    a = s.array  # an array's task: %A is the array's id, %a the task's (outside an array: the job id, and empty)
    ids = {"array_job": a.job_id or None, "task": str(a.task)} if a is not None else {}

    def path(pattern: str) -> str | None:
        return launch_path(pattern, job=job.id, user=s.user, name=s.name, cwd=s.cwd, **ids) if pattern else None

    fields: dict[str, Any] = {
        "script": None if s.script is None else s.script.text, "output": path(s.output), "error": path(s.error),
    }  # fmt: skip
    if s.script is not None and s.script.dialect == "sbatch":  # what an sbatch script reads of its job (Slurm's)
        fields["slurm_env"] = slurm_environment(job)
    return fields


def slurm_environment(job: Job) -> dict[str, str]:
    """Slurm's names for a job from an #SBATCH script, so that such scripts run unchanged (docs/batch-scripts.md);
    the submitter's own SLURM_* of these names (a submission from inside a Slurm job) are replaced."""
    return {
        "SLURM_JOB_ID": job.id, "SLURM_JOBID": job.id, "SLURM_JOB_NAME": job.spec.name,
        "SLURM_SUBMIT_DIR": job.spec.cwd, "SLURM_JOB_USER": job.spec.user,
    }  # fmt: skip
