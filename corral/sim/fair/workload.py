"""Jobs with users from a trace's pods.

    pods (creation, deletion, request) -> sorted by (creation, name)
    user of each pod  = a seeded draw over `users` names, P(rank k) ~ 1 / k^zipf   (a few users submit most pods)
    duration          = deletion - creation (the trace's own run time)
    estimate          = ceil(duration x U(1, overestimate))   the user's time limit, what backfill plans with

openb has no users, so they are drawn. Users over-ask time limits (a job rarely runs its whole limit), so backfill
plans with an estimate at least the real duration: `overestimate` 1 plans with the real one, which flatters backfill.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from corral.model.errors import InvalidRequest
from corral.model.resources import Request
from corral.sim.openb import TracePod


@dataclass(frozen=True, slots=True)
class FairJob:
    id: str
    user: str
    request: Request  # its id is the job's
    arrival: int  # seconds
    duration: int  # seconds it runs once started (from scratch after a preemption)
    estimate: int  # seconds: the user's time limit, >= duration


def check_users(users: int, zipf: float, overestimate: float) -> None:
    if users < 1:
        raise InvalidRequest("--users", f"must be 1 or more, got {users}")
    if not math.isfinite(zipf) or zipf < 0:
        raise InvalidRequest("--zipf", f"must be a finite exponent >= 0 (0: every user equally likely), got {zipf}")
    if not math.isfinite(overestimate) or overestimate < 1:
        raise InvalidRequest(
            "--overestimate", f"must be >= 1 (time limits are at least the real run time), got {overestimate}"
        )


def user_names(users: int) -> list[str]:
    width = len(str(users))
    return [f"u{i + 1:0{width}d}" for i in range(users)]


def make_jobs(
    pods: Sequence[TracePod], users: int = 50, zipf: float = 1.1, overestimate: float = 2.0, seed: int = 0
) -> list[FairJob]:
    """Jobs in arrival order (creation time, then name), each with a drawn user and time limit."""
    check_users(users, zipf, overestimate)
    for p in pods:
        if p.creation_time is None or p.deletion_time is None:
            where = f" (line {p.line})" if p.line else ""
            raise InvalidRequest(
                p.name, f"a fairness replay needs creation_time and deletion_time{where}; this pod lacks one"
            )
    ordered = sorted(pods, key=lambda p: (p.creation_time or 0, p.name))
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, users + 1, dtype=np.float64) ** zipf
    drawn = rng.choice(users, size=len(ordered), p=weights / weights.sum())
    factors = rng.uniform(1.0, overestimate, size=len(ordered))
    names = user_names(users)
    seen: dict[str, int] = {}
    jobs = []
    for p, u, f in zip(ordered, drawn.tolist(), factors.tolist(), strict=True):
        k = seen.get(p.name, 0) + 1
        seen[p.name] = k
        job_id = p.name if k == 1 else f"{p.name}#{k}"
        created = p.creation_time or 0
        duration = (p.deletion_time or 0) - created
        estimate = max(duration, math.ceil(duration * f))
        jobs.append(FairJob(job_id, names[u], dataclasses.replace(p.request, id=job_id), created, duration, estimate))
    return jobs


def offered_load(jobs: Sequence[FairJob], capacity_milli: int) -> float:
    """GPU work asked for within the arrival window over the GPU capacity of that window: above 1 the queue must
    grow. Work = GPU demand x the part of its run that falls before the last arrival, as if it started at once (a
    months-long service counts only while others arrive, not for months)."""
    if not jobs or capacity_milli <= 0:
        return 0.0
    first = min(j.arrival for j in jobs)
    last = max(j.arrival for j in jobs)
    if last <= first:
        return math.inf
    work = sum(j.request.gpu_demand_milli * min(j.duration, last - j.arrival) for j in jobs)
    return work / (capacity_milli * (last - first))
