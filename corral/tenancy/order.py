"""The order in which waiting work is offered resources without queues: higher priority first, then first come,
first served (with a queues file: `corral.tenancy.fairshare.fair_order`).

Ties on submission time go by id (numeric), so the order is total and the same after a restart.
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.tenancy.model import Work


def queue_key(work: Work) -> tuple[int, float, int, str]:
    numeric = int(work.id) if work.id.isdigit() else 0
    return (-work.priority, work.submitted_at, numeric, work.id)


def queue_order(works: Iterable[Work]) -> list[Work]:
    return sorted(works, key=queue_key)
