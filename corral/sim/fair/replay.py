"""The fairness replay: jobs arrive, wait in a queue, start when a round lets them, end or are preempted.

    events at one instant: departures, then arrivals (a job no node can ever hold is rejected at arrival)
    a round (after every instant with events, or at the next multiple of `round_s`):
      fifo                   queue in arrival order; start jobs until the first that does not fit (it blocks all)
      fifo-backfill          arrival order; the first GPU job that does not fit (the head) gets a reservation
                             (corral.tenancy.reservation.book over the running jobs' expected ends = start + time
                             limit); a job behind it starts if it fits now and ends (now + its time limit) by the
                             reservation's start, or fits beside it: the rule of corral/daemon/scheduler.py
      fair-backfill          the same over corral.tenancy.fairshare.fair_order: users' decayed dominant shares
                             (half-life `half_life_s`), projected within the round, then age
      fair-backfill-preempt  as fair-backfill; in addition a job that does not fit, met before the head, whose user
                             is below its fair share (and stays within it once started), may preempt jobs of users
                             above theirs: the fewest, then cheapest (least GPU-seconds lost), on one node, checked on
                             a copy first; victims go back to the queue and later restart from scratch

A user's fair share (for preemption) is 1 / the number of users with work (running or queued); a user borrows when
the dominant share of the cluster it holds now is above that. Every policy places with the same engine and config.

A round visits jobs in order, but a request shape that did not fit now fails for all its jobs in that round (free
resources only shrink within a round), and the round ends once every queued shape has failed: the cost per round
grows with the shapes queued, not the jobs (as corral/daemon/scheduler.py's ShapeCache).
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from corral.model.arrays import FloatArray, IntArray
from corral.model.errors import InvalidRequest
from corral.model.resources import MILLI_PER_GPU, Allocation, Node
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.placement.engine import validate_against
from corral.sim.fair.workload import FairJob
from corral.tenancy.fairshare import (
    Offer,
    UsageLedger,
    amount,
    check_half_life,
    decayed_capacity,
    dominant_share,
    expected_usage,
    fair_order,
    held,
)
from corral.tenancy.model import Running, Work
from corral.tenancy.preemption import Rules, choose
from corral.tenancy.reservation import FastBooker, Reservation
from corral.tenancy.round import ShapeCache, schedule

POLICIES = ("fifo", "fifo-backfill", "fair-backfill", "fair-backfill-preempt")

#: At most this many preemption attempts per round (tenancy's planner bounds the nodes per attempt): bounds a
#: round's cost on a large cluster.
PREEMPT_ATTEMPTS = 4

PROGRESS_EVERY = 2000  # events between progress callbacks


def check_policy(name: str) -> str:
    if name not in POLICIES:
        raise InvalidRequest("--policies", f"unknown queue policy {name!r}; known: {', '.join(POLICIES)}")
    return name


def check_round(round_s: float) -> float:
    if not math.isfinite(round_s) or round_s < 0:
        raise InvalidRequest(
            "--round", f"must be 0 (a round after every event) or a positive number of s, got {round_s}"
        )
    return float(round_s)


@dataclass(frozen=True)
class FairResult:
    policy: str
    jobs: tuple[FairJob, ...] = field(repr=False)
    users: tuple[str, ...]
    capacity: FloatArray  # GPU milli, GPU memory MiB, CPU milli, memory MiB of the cluster
    first_start: FloatArray  # per job (arrival order), NaN if it never started
    completion: FloatArray  # per job, NaN if it never finished
    runs: IntArray  # per job: how many times it started
    lost_gpu_milli_s: FloatArray  # per job: GPU milli x seconds of runs that preemption threw away
    used_gpu_milli_s: FloatArray  # per job: GPU milli x seconds of all its runs (lost ones included)
    rejected: FloatArray = field(repr=False)  # per job: 1 if no node can ever hold it
    first_reservation: FloatArray = field(repr=False)  # per job: its first reservation's start as the head, or NaN
    times: FloatArray = field(repr=False)  # sample times (after every instant with events, and every round)
    allocated_milli: IntArray = field(repr=False)  # cluster GPU milli allocated at each sample
    held_share: FloatArray = field(repr=False)  # samples x users: dominant share of the cluster each user holds
    demand_share: FloatArray = field(repr=False)  # samples x users: ... of what it holds plus what it has queued
    queued: IntArray = field(repr=False)  # jobs waiting at each sample
    preemptions: int = 0
    rounds: int = 0
    wall_seconds: float = 0.0

    @property
    def capacity_milli(self) -> int:
        return int(self.capacity[0])


class _Sim:
    def __init__(
        self,
        nodes: Sequence[Node],
        jobs: Sequence[FairJob],
        policy: str,
        config: PlacementConfig,
        half_life_s: float,
        round_s: float,
        seed: int,
        min_runtime_s: float = 0.0,
    ) -> None:
        self.policy = check_policy(policy)
        self.round_s = check_round(round_s)
        # Who may preempt whom: the candidates handed to the planner are the borrowers, and the preemptor is below
        # its fair share (both checked here); no priorities; a run is protected for its first `min_runtime_s`.
        self.rules = Rules(below_guarantee=_anyone, min_runtime=lambda _: min_runtime_s)
        self.half_life_s = check_half_life(half_life_s)
        self.jobs = sorted(jobs, key=lambda j: (j.arrival, j.id))
        n = len(self.jobs)
        self.snapshot = ClusterSnapshot(nodes)
        self.empty = ClusterSnapshot(nodes)  # never allocated: whether a shape can ever fit
        sn = self.snapshot
        gpu_mem = int(np.where(sn.gpu_present, sn.gpu_mem_cap, 0).sum())
        self.capacity = amount(sn.total_gpus * MILLI_PER_GPU, gpu_mem, int(sn.cpu_cap.sum()), int(sn.mem_cap.sum()))
        self.config = config
        self.rng = np.random.default_rng(seed)
        self.users = sorted({j.user for j in self.jobs})
        uid = {u: i for i, u in enumerate(self.users)}
        self.user = np.array([uid[j.user] for j in self.jobs], dtype=np.int64)
        self.index = {j.id: k for k, j in enumerate(self.jobs)}
        shapes: dict[Hashable, int] = {}
        self.shape = [shapes.setdefault(j.request.placement_key(), len(shapes)) for j in self.jobs]
        # What each job holds, as fair share counts it (GPU milli, GPU memory, CPU, memory); the GPU memory of a
        # whole GPU is not known before placement, so demand counts it once the job holds it.
        self.amount = np.array(
            [amount(j.request.gpu_demand_milli, 0, j.request.cpu_milli, j.request.memory_mib) for j in self.jobs]
        ).reshape(n, 4)
        decayed = decayed_capacity(self.capacity, self.half_life_s)
        self.offers = [
            Offer(
                k,
                int(self.user[k]),
                0,
                float(j.arrival),
                (k, j.id),
                dominant_share(expected_usage(self.amount[k], float(j.estimate), self.half_life_s), decayed),
            )
            for k, j in enumerate(self.jobs)
        ]
        self.ledger = UsageLedger(self.half_life_s)
        self.decayed = decayed
        u = len(self.users)
        self.held_u = np.zeros((u, 4))
        self.holding = np.zeros((n, 4))  # what each running job holds (zeros when it does not run)
        # Each job as tenancy sees it (made once: the round's ShapeCache keeps its key and shape by the object).
        self.works = [
            Work(j.id, j.request, user=j.user, submitted_at=float(j.arrival), time_limit_s=float(j.estimate))
            for j in self.jobs
        ]
        self.shapes_seen = ShapeCache()
        self.booker = FastBooker()  # the head's reservation, the running jobs' columns kept between rounds
        self.pending_u = np.zeros((u, 4))
        self.run_start = np.full(n, np.nan)
        self.first_start = np.full(n, np.nan)
        self.reserved = np.full(n, np.nan)  # the start of the first reservation a job got as the head
        self.completion = np.full(n, np.nan)
        self.runs = np.zeros(n, dtype=np.int64)
        self.lost = np.zeros(n)
        self.used = np.zeros(n)
        self.rejected = np.zeros(n)
        self.allocs: dict[int, Allocation] = {}
        self.pending: list[int] = []  # job indices, ascending = arrival order
        self.pending_shapes: dict[int, int] = {}  # shape -> jobs of it queued
        self.departures: list[tuple[int, int, int]] = []  # heap of (end, job, run number)
        self.fits_ever: dict[int, bool] = {}
        self.preemptions = 0
        self.rounds = 0

    # ----------------------------------------------------------------------------------------- state changes
    def enqueue(self, k: int) -> None:
        bisect.insort(self.pending, k)
        s = self.shape[k]
        self.pending_shapes[s] = self.pending_shapes.get(s, 0) + 1
        self.pending_u[self.user[k]] += self.amount[k]

    def _dequeued(self, k: int) -> None:
        s = self.shape[k]
        left = self.pending_shapes[s] - 1
        if left:
            self.pending_shapes[s] = left
        else:
            del self.pending_shapes[s]
        self.pending_u[self.user[k]] -= self.amount[k]

    def start(self, k: int, alloc: Allocation, now: float, allocated: bool = False) -> None:
        """Job k runs from now on `alloc` (`allocated`: the round already granted it in the snapshot)."""
        if not allocated:
            self.snapshot.allocate(alloc)
        self.allocs[k] = alloc
        self._dequeued(k)
        self.holding[k] = held(alloc)
        self.held_u[self.user[k]] += self.holding[k]
        self.run_start[k] = now
        if math.isnan(self.first_start[k]):
            self.first_start[k] = now
        self.runs[k] += 1
        heapq.heappush(self.departures, (int(now) + self.jobs[k].duration, k, int(self.runs[k])))

    def stop(self, k: int, now: float, finished: bool) -> None:
        job = self.jobs[k]
        self.snapshot.release(job.id)
        del self.allocs[k]
        a = self.holding[k].copy()
        self.holding[k] = 0.0
        self.held_u[self.user[k]] -= a
        began = float(self.run_start[k])
        self.run_start[k] = np.nan
        self.ledger.record(int(self.user[k]), a, began, now)
        gpu_s = a[0] * (now - began)
        self.used[k] += gpu_s
        if finished:
            self.completion[k] = now
        else:
            self.lost[k] += gpu_s
            self.preemptions += 1
            self.enqueue(k)

    def arrive(self, k: int) -> None:
        s = self.shape[k]
        ok = self.fits_ever.get(s)
        if ok is None:
            try:
                validate_against(self.empty, self.jobs[k].request)
                ok = place(self.empty, self.jobs[k].request, self.config, np.random.default_rng(0)).placed
            except InvalidRequest:  # a GPU model or GPU memory this cluster lacks
                ok = False
            self.fits_ever[s] = ok
        if ok:
            self.enqueue(k)
        else:
            self.rejected[k] = 1.0

    # ----------------------------------------------------------------------------------------- shares
    def fair_shares(self) -> FloatArray:
        """Each user's fair share now: 1 / the users with work (running or queued), 0 for the others."""
        active = (self.held_u.any(axis=1)) | (self.pending_u.any(axis=1))
        count = int(np.count_nonzero(active))
        out: FloatArray = np.where(active, 1.0 / max(count, 1), 0.0)
        return out

    def held_shares(self) -> FloatArray:
        present = self.capacity > 0
        out: FloatArray = np.max(self.held_u[:, present] / self.capacity[present], axis=1)
        return out

    def decayed_shares(self, now: float) -> dict[Hashable, float]:
        """Users' dominant shares of decayed usage (finished runs in the ledger, running ones added here)."""
        running = ~np.isnan(self.run_start)
        usage = np.zeros_like(self.held_u)
        if running.any():
            ks = np.nonzero(running)[0]
            h = self.half_life_s
            factor = (h / math.log(2.0)) * (1.0 - np.exp2(-(now - self.run_start[ks]) / h))
            np.add.at(usage, self.user[ks], self.holding[ks] * factor[:, None])
        users = {int(self.user[k]) for k in self.pending}
        return {u: dominant_share(self.ledger.usage(u, now) + usage[u], self.decayed) for u in users}

    # ----------------------------------------------------------------------------------------- rounds
    def order(self, now: float) -> list[int]:
        if self.policy.startswith("fair"):
            return fair_order([self.offers[k] for k in self.pending], self.decayed_shares(now), lambda _: 1.0)
        return list(self.pending)

    def round(self, now: float) -> None:
        if not self.pending:
            return
        self.rounds += 1
        if self.policy == "fifo":
            for k in list(self.pending):
                decision = place(self.snapshot, self.jobs[k].request, self.config, self.rng)
                if decision.allocation is None:
                    break  # the head blocks everything behind it
                self.start(k, decision.allocation, now)
            self.pending = [k for k in self.pending if k not in self.allocs]
            return
        order = self.order(now)
        ends = {self.jobs[k].id: float(self.run_start[k]) + self.jobs[k].estimate for k in self.allocs}
        # The round is tenancy's (corral.tenancy.round, as serve's): the order is this replay's (arrival, or users'
        # fair shares); grants go into the snapshot as they are decided.
        plan = schedule(
            self.snapshot, [self.works[k] for k in order], self.config, now, self.rng, cache=self.shapes_seen,
            ends=ends, ordered=True, words=False, booker=self.booker, prefilter=True,
        )  # fmt: skip
        for st in plan.starts:
            self.start(self.index[st.job_id], st.allocation, now, allocated=True)
        r = plan.reservation
        if r is not None and math.isnan(self.reserved[self.index[r.job_id]]):
            self.reserved[self.index[r.job_id]] = r.start
        if self.policy == "fair-backfill-preempt":
            self.preempt(order, plan.reservation, now)
        self.pending = [k for k in self.pending if k not in self.allocs]

    # ----------------------------------------------------------------------------------------- preemption
    def may_preempt(self, k: int, fair: FloatArray) -> bool:
        """The job's user is below its fair share and stays within it once this job runs."""
        u = int(self.user[k])
        present = self.capacity > 0
        after = float(np.max((self.held_u[u] + self.amount[k])[present] / self.capacity[present]))
        return after <= float(fair[u]) + 1e-12

    def preempt(self, order: Sequence[int], head: Reservation | None, now: float) -> None:
        """After the round: the waiting GPU jobs up to the head (the job the round reserved for), in order, whose user
        is below its fair share (and stays within it once the job runs), may preempt jobs of users above theirs, at
        most PREEMPT_ATTEMPTS a round and one per shape: tenancy's planner (corral.tenancy.preemption.choose) picks
        the fewest, then cheapest (least GPU-seconds lost), checked on a copy first. Victims go back to the queue and
        later restart from scratch; the preemptor starts at once on what they free."""
        fair = self.fair_shares()
        attempts = 0
        tried: set[int] = set()
        for k in order:
            if attempts >= PREEMPT_ATTEMPTS:
                break
            job = self.jobs[k]
            s = self.shape[k]
            if k in self.allocs or s in tried or not job.request.wants_gpu:
                if head is not None and job.id == head.job_id:
                    break
                continue
            if self.may_preempt(k, fair):
                attempts += 1
                tried.add(s)
                self.preempt_for(k, fair, now)
            if head is not None and job.id == head.job_id:
                break  # jobs behind the head wait for its reservation

    def preempt_for(self, k: int, fair: FloatArray, now: float) -> bool:
        """Preempt for job k the jobs tenancy's planner chooses among those of users above their fair share."""
        borrowing = self.held_shares() > fair + 1e-12
        # Not a job this round started: it gains nothing.
        running = [
            Running(self.jobs[j].id, self.jobs[j].request, float(self.run_start[j]), self.allocs[j].gpus,
                    user=self.users[int(self.user[j])])
            for j in self.allocs
            if borrowing[self.user[j]] and self.run_start[j] < now
        ]  # fmt: skip
        if not running:
            return False
        choice = choose(self.snapshot, self.works[k], running, self.config, now, self.rules)
        if choice is None:
            return False
        for v in choice.victims:
            self.stop(self.index[v.job.id], now, finished=False)
        self.start(k, choice.allocation, now)
        return True


def _anyone(_: Work) -> bool:
    return True


def run_fair(
    nodes: Sequence[Node],
    jobs: Sequence[FairJob],
    policy: str,
    config: PlacementConfig,
    half_life_s: float = 3600.0,
    round_s: float = 0.0,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    min_runtime_s: float = 0.0,
) -> FairResult:
    """Replay `jobs` under `policy` on a cluster of `nodes` (see the module docstring). `min_runtime_s`: a run may
    not be preempted before it has run this long (serve's `min_runtime`; 0, the default, protects none)."""
    wall = time.perf_counter()
    sim = _Sim(nodes, jobs, policy, config, half_life_s, round_s, seed, min_runtime_s)
    n = len(sim.jobs)
    times: list[float] = []
    allocated: list[int] = []
    held_rows: list[FloatArray] = []
    demand_rows: list[FloatArray] = []
    queued: list[int] = []
    present = sim.capacity > 0

    def sample(now: float) -> None:
        times.append(now)
        allocated.append(sim.snapshot.gpu_allocated_milli)
        held_rows.append(np.max(sim.held_u[:, present] / sim.capacity[present], axis=1))
        demand = np.max((sim.held_u + sim.pending_u)[:, present] / sim.capacity[present], axis=1)
        demand_rows.append(np.minimum(demand, 1.0))
        queued.append(len(sim.pending))

    a = 0
    due: float | None = None
    done = 0
    while True:
        te = math.inf
        if a < n:
            te = float(sim.jobs[a].arrival)
        if sim.departures:
            te = min(te, float(sim.departures[0][0]))
        if due is not None and due < te:
            sim.round(due)
            sample(due)
            due = None
            continue
        if te == math.inf:
            break
        now = te
        while sim.departures and sim.departures[0][0] <= now:
            _, k, run = heapq.heappop(sim.departures)
            if run == sim.runs[k] and k in sim.allocs:  # else: preempted since, a stale end
                sim.stop(k, now, finished=True)
                done += 1
        while a < n and sim.jobs[a].arrival <= now:
            sim.arrive(a)
            a += 1
            done += 1
        if sim.pending:
            d = now if sim.round_s == 0 else math.ceil(now / sim.round_s) * sim.round_s
            due = d if due is None else min(due, d)
        if due is not None and due <= now:
            sim.round(now)
            due = None
        sample(now)
        if progress is not None and done // PROGRESS_EVERY != (done - 1) // PROGRESS_EVERY:
            progress(done, 2 * n)
    if progress is not None:
        progress(2 * n, 2 * n)
    users = len(sim.users)
    return FairResult(
        policy=policy,
        jobs=tuple(sim.jobs),
        users=tuple(sim.users),
        capacity=sim.capacity,
        first_start=sim.first_start,
        completion=sim.completion,
        runs=sim.runs,
        lost_gpu_milli_s=sim.lost,
        used_gpu_milli_s=sim.used,
        rejected=sim.rejected,
        first_reservation=sim.reserved,
        times=np.array(times, dtype=np.float64),
        allocated_milli=np.array(allocated, dtype=np.int64),
        held_share=np.array(held_rows).reshape(len(times), users),
        demand_share=np.array(demand_rows).reshape(len(times), users),
        queued=np.array(queued, dtype=np.int64),
        preemptions=sim.preemptions,
        rounds=sim.rounds,
        wall_seconds=time.perf_counter() - wall,
    )
