"""The order in which waiting jobs are offered resources: higher priority first, then first come, first served.

Ties on submission time go by job id (numeric), so the order is total and the same after a restart.
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.jobs.model import Job


def queue_key(job: Job) -> tuple[int, float, int, str]:
    numeric = int(job.id) if job.id.isdigit() else 0
    return (-job.spec.request.priority, job.submitted_at, numeric, job.id)


def queue_order(jobs: Iterable[Job]) -> list[Job]:
    return sorted(jobs, key=queue_key)
