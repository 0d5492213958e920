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
from corral.model.resources import MILLI_PER_GPU, Allocation, Node, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.placement.engine import validate_against
from corral.placement.filters import fits_node_now
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
from corral.tenancy.reservation import Booking, book

POLICIES = ("fifo", "fifo-backfill", "fair-backfill", "fair-backfill-preempt")

#: At most this many preemption attempts per round, and candidate nodes per attempt (cheapest first): bounds a
#: round's cost on a large cluster.
PREEMPT_ATTEMPTS = 4
PREEMPT_NODES = 64

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


def book_fast(
    snapshot: ClusterSnapshot, request: Request, ends: dict[str, float], config: PlacementConfig
) -> Booking | None:
    """`reservation.book`, with the expected end it starts at found by bisection first.

    `book` tries a placement at every distinct expected end in turn: fine for one machine's few jobs, thousands of
    placements a round for a cluster's. Whether the request fits once the jobs ending by T have left only grows with
    T (free resources only grow), so the first T where it fits is found with log2(ends) placements, and `book` is
    handed ends where every one before that T is moved to the last T where it does not fit: it then places twice,
    at the same T, by the same rule."""
    times = sorted({e for job, e in ends.items() if job in snapshot.allocations})
    if len(times) <= 2:
        return book(snapshot, request, ends, config)

    # The running jobs' holdings as columns, so each probe frees the jobs ending by T with a few vectorised adds
    # instead of one `release` per job (a probe only answers "fits or not": `book` makes the reservation).
    allocs = [(snapshot.allocations[job], e) for job, e in ends.items() if job in snapshot.allocations]
    if any(a.share_owner for a, _ in allocs):
        return book(snapshot, request, ends, config)
    end = np.array([e for _, e in allocs])
    node = np.array([a.node_index for a, _ in allocs], dtype=np.int64)
    cpu = np.array([a.cpu_milli for a, _ in allocs], dtype=np.int64)
    mem = np.array([a.memory_mib for a, _ in allocs], dtype=np.int64)
    tag = np.array([a.tag + 1 for a, _ in allocs], dtype=np.int64)
    grants = [(i, a.node_index, g.index, g.milli, g.memory_mib) for i, (a, _) in enumerate(allocs) for g in a.gpus]
    g_job, g_node, g_gpu, g_milli, g_mem = (np.array([g[c] for g in grants], dtype=np.int64) for c in range(5))

    def fits(i: int) -> bool:
        future = snapshot.copy()
        gone = end <= times[i]
        np.add.at(future.cpu_free, node[gone], cpu[gone])
        np.add.at(future.mem_free, node[gone], mem[gone])
        np.subtract.at(future.tag_counts, (node[gone], tag[gone]), 1)
        if len(grants):
            sel = gone[g_job]
            np.add.at(future.gpu_milli_free, (g_node[sel], g_gpu[sel]), g_milli[sel])
            np.add.at(future.gpu_mem_free, (g_node[sel], g_gpu[sel]), g_mem[sel])
            np.add.at(future.gpu_free_total, g_node[sel], g_milli[sel])
            whole = future.gpu_present & (future.gpu_milli_free == MILLI_PER_GPU)
            future.gpu_full_free = (whole & (future.gpu_mem_free == future.gpu_mem_cap)).sum(axis=1).astype(np.int64)
        future.version += 1
        return place(future, request, config, np.random.default_rng(0)).placed

    if not fits(len(times) - 1):
        return None
    lo, hi = 0, len(times) - 1  # invariant: fits(hi); everything before lo does not fit
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    if lo == 0:
        return book(snapshot, request, ends, config)
    before = times[lo - 1]
    return book(snapshot, request, {job: max(e, before) for job, e in ends.items()}, config)


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
    ) -> None:
        self.policy = check_policy(policy)
        self.round_s = check_round(round_s)
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
        reps: dict[int, Request] = {}
        for k, j in enumerate(self.jobs):
            reps.setdefault(self.shape[k], j.request)
        self.shape_cpu = np.array([reps[i].cpu_milli for i in range(len(reps))], dtype=np.int64)
        self.shape_mem = np.array([reps[i].memory_mib for i in range(len(reps))], dtype=np.int64)
        self.shape_count = np.array([reps[i].gpu_count for i in range(len(reps))], dtype=np.int64)
        self.shape_milli = np.array([reps[i].gpu_milli for i in range(len(reps))], dtype=np.int64)
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

    def start(self, k: int, alloc: Allocation, now: float) -> None:
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
    def may_fit(self, s: int) -> bool:
        """A necessary condition for shape s to fit now: some node has its CPU, memory and enough GPUs with its GPU
        milli free (models and GPU memory are left to `place`). Far cheaper than a failed `place`."""
        sn = self.snapshot
        ok = (sn.cpu_free >= self.shape_cpu[s]) & (sn.mem_free >= self.shape_mem[s])
        count = int(self.shape_count[s])
        if count:
            ok &= np.count_nonzero(sn.gpu_milli_free >= self.shape_milli[s], axis=1) >= count
        return bool(ok.any())

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
        preempt = self.policy == "fair-backfill-preempt"
        attempts = 0
        shapes = len(self.pending_shapes)
        failed: set[int] = set()  # shapes that do not fit on what is free now
        delayed: set[int] = set()  # shapes that fit now but not beside the reservation
        booking: Booking | None = None
        ends = {self.jobs[k].id: float(self.run_start[k]) + self.jobs[k].estimate for k in self.allocs}
        fair = self.fair_shares() if preempt else None
        started = False
        for k in self.order(now):
            s = self.shape[k]
            if s in failed:
                continue
            job = self.jobs[k]
            end = now + job.estimate
            outlives = booking is not None and end > booking.start
            if outlives and s in delayed:
                continue
            alloc = None
            if self.may_fit(s):
                alloc = place(self.snapshot, job.request, self.config, self.rng).allocation
            if alloc is not None and booking is not None and outlives:
                alloc = place(booking.view(), job.request, self.config, self.rng).allocation
                if alloc is None:
                    delayed.add(s)
                    continue
            if alloc is not None:
                self.start(k, alloc, now)
                ends[job.id] = end
                started = True
                if booking is not None:
                    booking.took(alloc, outlives)
                continue
            if (
                preempt
                and booking is None
                and fair is not None
                and job.request.wants_gpu
                and attempts < PREEMPT_ATTEMPTS
                and self.may_preempt(k, fair)
            ):
                attempts += 1
                grant = self.preempt_for(k, fair, now)
                if grant is not None:
                    self.start(k, grant, now)
                    ends[job.id] = end
                    started = True
                    for gone in [j for j in ends if self.index[j] not in self.allocs]:
                        del ends[gone]
                    continue
            failed.add(s)
            if booking is None and job.request.wants_gpu:
                booking = book_fast(self.snapshot, job.request, ends, self.config)
                if booking is not None and math.isnan(self.reserved[k]):
                    self.reserved[k] = booking.start
            if len(failed) == shapes:
                break  # every shape still queued fails now: nothing else can start
        if started:
            self.pending = [k for k in self.pending if k not in self.allocs]

    # ----------------------------------------------------------------------------------------- preemption
    def may_preempt(self, k: int, fair: FloatArray) -> bool:
        """The job's user is below its fair share and stays within it once this job runs."""
        u = int(self.user[k])
        present = self.capacity > 0
        after = float(np.max((self.held_u[u] + self.amount[k])[present] / self.capacity[present]))
        return after <= float(fair[u]) + 1e-12

    def preempt_for(self, k: int, fair: FloatArray, now: float) -> Allocation | None:
        """Preempt the fewest, then cheapest, jobs of borrowing users on one node so that job k fits; its grant.

        Nothing is preempted unless job k fits once they are gone (checked on a copy first)."""
        request = self.jobs[k].request
        borrowing = self.held_shares() > fair + 1e-12
        # Not a job this round started: it is still in `pending` until the round ends, and gains nothing.
        victims = [j for j in self.allocs if borrowing[self.user[j]] and self.run_start[j] < now]
        if not victims:
            return None
        trial = self.snapshot.copy()
        for j in victims:
            trial.release(self.jobs[j].id)
        everything = place(trial, request, self.config, np.random.default_rng(0))
        if everything.allocation is None:
            return None  # not even preempting every borrower would let it start
        by_node: dict[int, list[int]] = {}
        for j in victims:
            by_node.setdefault(self.allocs[j].node_index, []).append(j)

        def cost(j: int) -> float:  # GPU-seconds lost, then run time (CPU-only jobs), if j is preempted now
            ran = now - float(self.run_start[j])
            return float(self.holding[j, 0]) * ran + ran * 1e-6

        fit_nodes = [int(i) for i in np.nonzero(everything.node_reasons == 0)[0] if int(i) in by_node]
        fit_nodes.sort(key=lambda i: (len(by_node[i]), sum(cost(j) for j in by_node[i])))
        work = self.snapshot.copy()
        best: tuple[int, float, int, list[int]] | None = None
        for i in fit_nodes[:PREEMPT_NODES]:
            chosen: list[int] = []
            for j in sorted(by_node[i], key=cost):  # cheapest first, until it fits
                work.release(self.jobs[j].id)
                chosen.append(j)
                if fits_node_now(work, request, i):
                    break
            if not fits_node_now(work, request, i):
                for j in chosen:
                    work.allocate(self.allocs[j])
                continue
            for j in sorted(chosen, key=cost, reverse=True):  # drop any the job does not need after all
                work.allocate(self.allocs[j])
                if fits_node_now(work, request, i):
                    chosen.remove(j)
                else:
                    work.release(self.jobs[j].id)
            key = (len(chosen), sum(cost(j) for j in chosen), i, chosen)
            if best is None or key[:3] < best[:3]:
                best = key
            for j in chosen:
                work.allocate(self.allocs[j])
        if best is None:
            return None
        chosen = best[3]
        check = self.snapshot.copy()
        for j in chosen:
            check.release(self.jobs[j].id)
        decision = place(check, request, self.config, self.rng)
        if decision.allocation is None:
            return None
        for j in chosen:
            self.stop(j, now, finished=False)
        return decision.allocation


def run_fair(
    nodes: Sequence[Node],
    jobs: Sequence[FairJob],
    policy: str,
    config: PlacementConfig,
    half_life_s: float = 3600.0,
    round_s: float = 0.0,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> FairResult:
    """Replay `jobs` under `policy` on a cluster of `nodes` (see the module docstring)."""
    wall = time.perf_counter()
    sim = _Sim(nodes, jobs, policy, config, half_life_s, round_s, seed)
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
