"""Gangs: one job, N instances, each its own process with its own grant; all start or none, and they end as one.

    placement (pure)   corral.tenancy.gang.place_gang (the one gang placer): all N instances on one node, or none
    the snapshot       held(job): one allocation for the job (CPU and memory times N, every instance's grants), so
                       ClusterSnapshot releases exactly what the gang held
    processes          GangExecutor wraps the executor: the daemon sees one job; under it, instance i of job 7 runs
                       as "7_i" (its own supervisor, record and log; CORRAL_JOB_ID=7, CORRAL_INSTANCE=i,
                       CORRAL_INSTANCES=N, CUDA_VISIBLE_DEVICES its own GPUs)
                       -> one instance ends other than with exit 0: the others are stopped (SIGTERM, grace, SIGKILL)
                       -> all ended: one Exit for the job (exit 0 if all did, else the first failure's), so the job
                          succeeds, fails, retries (as one) or is preempted (as one) by the daemon's usual rules
                       -> after a restart: the instances' records are read; alive ones are watched, and a gang that
                          was only partly started is stopped and reported gone (retried by policy)

The daemon stores one job (one id, one state, one attempt count); `Job.pid` is instance 0's. The number of
instances is the job's (`JobSpec.instances`): the wrapper asks the store through `instances_of`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from corral.executor.base import Executor, Exit, Found, Handle, LaunchSpec, Reattached
from corral.jobs.model import Job
from corral.model.resources import Allocation, affinity_tag
from corral.tenancy.gang import GangDecision, combined_request, member_id, merged, place_gang

#: Most instances one job may ask for.
MAX_INSTANCES = 64
#: Grace when one instance failed and the others are stopped.
STOP_GRACE_S = 10.0


def split_member(executor_id: str) -> tuple[str, int] | None:
    head, sep, tail = executor_id.rpartition("_")
    return (head, int(tail)) if sep and tail.isdigit() and head else None


def held(job: Job, node: str, owner: str) -> Allocation:
    """What a gang holds, as one snapshot allocation named by the job."""
    r = job.spec.request
    n = job.spec.instances
    alloc = Allocation(job.id, node, 0, r.cpu_milli * n, r.memory_mib * n, job.gpus, affinity_tag(r), owner)
    return merged(alloc)


# ------------------------------------------------------------------------------------------------ processes
@dataclass
class _Gang:
    job_id: str
    attempt: int
    instances: int
    live: set[int] = field(default_factory=set)
    exits: dict[int, Exit] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)  # instances in the order they ended
    stopping: bool = False  # one failed (or a cancel came): the others are being stopped
    cancelled: bool = False  # the daemon cancelled the job


class GangExecutor:
    """An Executor that runs a job of N instances as N processes and reports them as one job (see the module)."""

    runs_gangs = True  # the daemon admits gangs only over an executor that says so

    def __init__(self, inner: Executor, instances_of: Callable[[str], int], stop_grace_s: float = STOP_GRACE_S) -> None:
        self.inner = inner
        self.instances_of = instances_of
        self.stop_grace_s = stop_grace_s
        self._gangs: dict[str, _Gang] = {}
        self._lock = threading.Lock()
        self._pending: list[Exit] = []  # gang exits decided outside poll (after a restart)

    # -------------------------------------------------------------------------------------- launch
    def launch(self, spec: LaunchSpec) -> Handle:
        n = self.instances_of(spec.job_id)
        if n <= 1:
            return self.inner.launch(spec)
        if len(spec.gpu_uuids) % n:
            raise ValueError(f"job {spec.job_id}: {len(spec.gpu_uuids)} GPUs cannot be split among {n} instances")
        k = len(spec.gpu_uuids) // n
        gang = _Gang(spec.job_id, spec.attempt, n)
        handles: list[Handle] = []
        try:
            for i in range(n):
                log = spec.log_path if i == 0 else instance_log(spec.log_path, i)
                one = replace(
                    spec,
                    job_id=member_id(spec.job_id, i),
                    gpu_uuids=spec.gpu_uuids[i * k : (i + 1) * k],
                    log_path=log,
                    instance=i,
                    instances=n,
                )
                handles.append(self.inner.launch(one))
                gang.live.add(i)
        except BaseException:
            for i in gang.live:  # all or none: the started ones are killed, their exits dropped by `poll`
                self.inner.cancel(member_id(spec.job_id, i), grace_s=0)
            gang.stopping = gang.cancelled = True
            gang.instances = len(gang.live)
            with self._lock:
                self._gangs[f"aborted:{spec.job_id}"] = gang
            raise
        with self._lock:
            self._gangs[spec.job_id] = gang
        return Handle(spec.job_id, handles[0].pid, handles[0].start_time)

    # -------------------------------------------------------------------------------------- exits
    def poll(self) -> list[Exit]:
        out: list[Exit] = []
        with self._lock:
            out.extend(self._pending)
            self._pending.clear()
        for ended in self.inner.poll():
            member = split_member(ended.job_id)
            if member is None:
                out.append(ended)
                continue
            gang_exit = self._member_ended(member[0], member[1], ended)
            if gang_exit is not None:
                out.append(gang_exit)
        return out

    def _member_ended(self, job_id: str, instance: int, ended: Exit) -> Exit | None:
        with self._lock:
            aborted = self._gangs.get(f"aborted:{job_id}")
            if aborted is not None and instance in aborted.live:
                aborted.live.discard(instance)
                self.inner.forget(member_id(job_id, instance), aborted.attempt)
                if not aborted.live:
                    del self._gangs[f"aborted:{job_id}"]
                return None
            gang = self._gangs.get(job_id)
            if gang is None:
                return None
            gang.live.discard(instance)
            gang.exits[instance] = ended
            gang.order.append(instance)
            stop = not ended.succeeded and not gang.stopping
            if stop:
                gang.stopping = True
            others = sorted(gang.live)
        if stop:  # one failed: the rest are stopped (SIGTERM, grace, SIGKILL)
            for i in others:
                self.inner.cancel(member_id(job_id, i), grace_s=self.stop_grace_s)
        with self._lock:
            if gang.live or len(gang.exits) < gang.instances:
                return None
            del self._gangs[job_id]
        return aggregate(gang)

    def cancel(self, job_id: str, grace_s: float = 10.0) -> None:
        with self._lock:
            gang = self._gangs.get(job_id)
            if gang is not None:
                gang.stopping = gang.cancelled = True
                live = sorted(gang.live)
        if gang is None:
            self.inner.cancel(job_id, grace_s)
            return
        for i in live:
            self.inner.cancel(member_id(job_id, i), grace_s)

    # -------------------------------------------------------------------------------------- the rest
    def adopt(self, job_id: str, pid: int, start_time: int, time_limit_s: float | None = None) -> bool:
        return self.inner.adopt(job_id, pid, start_time, time_limit_s)

    @property
    def containment(self) -> str | None:
        return getattr(self.inner, "containment", None)

    @property
    def contained(self) -> bool:
        return bool(getattr(self.inner, "contained", True))

    def ending(self) -> dict[str, str]:
        """The inner executor's held-while-ending jobs, an instance's under its job's id (see LocalExecutor)."""
        inner = getattr(self.inner, "ending", None)
        found: dict[str, str] = {}
        for member_id_, why in (inner() if inner is not None else {}).items():
            member = split_member(member_id_)
            found[member_id_ if member is None else member[0]] = why
        return found

    def running(self) -> set[str]:
        inner = self.inner.running()
        with self._lock:
            gangs = {g.job_id for key, g in self._gangs.items() if not key.startswith("aborted:")}
        return {i for i in inner if split_member(i) is None} | gangs

    def reattach(self, job_id: str, attempt: int) -> Reattached:
        n = self.instances_of(job_id)
        if n <= 1:
            return self.inner.reattach(job_id, attempt)
        found = [self.inner.reattach(member_id(job_id, i), attempt) for i in range(n)]
        kinds = [f.found for f in found]
        if all(k is Found.NEVER_STARTED for k in kinds):
            return Reattached(Found.NEVER_STARTED)
        gang = _Gang(job_id, attempt, n)
        for i, f in enumerate(found):
            if f.found is Found.ALIVE:
                gang.live.add(i)
            elif f.found is Found.ENDED and f.exit is not None:
                gang.exits[i] = f.exit
                gang.order.append(i)
        broken = any(k in (Found.GONE, Found.NEVER_STARTED) for k in kinds)
        if broken:
            # Partly started, or an instance vanished: the rest cannot run as a gang; stopped now, reported gone.
            for i in sorted(gang.live):
                self.inner.cancel(member_id(job_id, i), grace_s=0)
            if gang.live:
                gang.stopping = gang.cancelled = True
                with self._lock:
                    self._gangs[f"aborted:{job_id}"] = gang
            return Reattached(Found.GONE)
        if not gang.live:
            return Reattached(Found.ENDED, exit=aggregate(gang))
        failed = any(not e.succeeded for e in gang.exits.values())
        if failed:
            gang.stopping = True
            for i in sorted(gang.live):
                self.inner.cancel(member_id(job_id, i), grace_s=self.stop_grace_s)
        with self._lock:
            self._gangs[job_id] = gang
        first = next((f.handle for f in found if f.found is Found.ALIVE and f.handle is not None), None)
        return Reattached(Found.ALIVE, None if first is None else replace(first, job_id=job_id))

    def forget(self, job_id: str, attempt: int) -> None:
        n = self.instances_of(job_id)
        if n <= 1:
            self.inner.forget(job_id, attempt)
            return
        for i in range(n):
            self.inner.forget(member_id(job_id, i), attempt)

    def sweep(self, keep: set[tuple[str, int]]) -> None:
        more = {(member_id(j, i), a) for j, a in keep for i in range(self.instances_of(j)) if self.instances_of(j) > 1}
        with self._lock:  # an aborted gang's instances are still dying: their records stay until their exits come
            more |= {(member_id(g.job_id, i), g.attempt) for g in self._gangs.values() for i in g.live}
        self.inner.sweep(keep | more)

    def close(self) -> None:
        closer = getattr(self.inner, "close", None)
        if closer is not None:
            closer()


def instance_log(log_path: Path, instance: int) -> Path:
    """Instance 0 writes the job's log; instance i (i > 0) writes "<id>.<i>.log" beside it."""
    return log_path.with_name(f"{log_path.stem}.{instance}{log_path.suffix}")


def aggregate(gang: _Gang) -> Exit:
    """One exit for the gang: exit 0 when every instance exited 0; else the first failure's (the cause), not the
    exits of the instances stopped because of it. `cancelled` when the daemon cancelled the job."""
    ends = [e.ended_at for e in gang.exits.values() if e.ended_at is not None]
    last = max(ends) if ends else None
    failures: Sequence[Exit] = [gang.exits[i] for i in gang.order if not gang.exits[i].succeeded]
    if not failures:
        return Exit(gang.job_id, 0, None, False, False, last)
    cause = failures[0]
    return Exit(gang.job_id, cause.exit_code, cause.signal, cause.timed_out, gang.cancelled or cause.cancelled, last)


#: The placement names serve's code and tests import from here (corral.tenancy.gang holds them).
__all__ = ["GangDecision", "GangExecutor", "combined_request", "held", "member_id", "place_gang", "split_member"]
