"""What `explain` says about a waiting job beyond its reason: where it stands in the queue, which running jobs hold
what it waits for and when they should end, the head's reservation and its estimated start.

Built from the last round's queue order and reservation (kept by the daemon) and the jobs holding resources now;
pure, so the API route calls it without the daemon's lock. Other users' names are not shown (as in /v1/gpus): their
jobs appear by number, GPUs and expected end only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from corral.jobs.model import Job
from corral.tenancy.reservation import Reservation, expected_end
from corral.tenancy.round import clock_text

#: Holders listed in the answer (the text names the first three); the rest are counted.
MAX_HOLDERS = 20


@dataclass(frozen=True)
class Holder:
    job: str
    owner: str | None  # None: another user's job (not shown to this caller)
    gpus: tuple[int, ...]
    expected_end: float  # epoch seconds
    expected_end_from: str  # "time limit" | "default time limit" (the job has none)


@dataclass(frozen=True)
class WaitStory:
    position: int | None  # 1-based, in the last round's queue order; None before the job's first round
    queued: int  # jobs in that order
    holders: list[Holder]
    reservation: Reservation | None  # the head's reservation (this job's own, or the one it must not delay)
    estimated_start: float | None  # this job's, when it holds the reservation
    default_time_limit_s: float
    text: str


def _gpus(indices: Sequence[int]) -> str:
    return f"GPU{'s' if len(indices) != 1 else ''} {', '.join(map(str, indices))}" if indices else "no GPU"


def wait_story(
    job: Job,
    holding: Sequence[Job],
    order: Sequence[str],
    reservation: Reservation | None,
    default_time_limit_s: float,
    now: float,
    viewer_uid: int | None,
    queue: QueueStory | None = None,
) -> WaitStory:
    """The story of queued `job`. `viewer_uid`: the caller (None = root, who sees every owner); `queue`: its place
    in its queue and the limit holding it back (with a queues file), told instead of the bare position."""
    try:
        position: int | None = order.index(job.id) + 1
    except ValueError:
        position = None
    mine = reservation is not None and reservation.job_id == job.id
    if mine and reservation is not None:
        wanted = set(reservation.waits_for)
        chosen = [j for j in holding if j.id in wanted]
    elif job.spec.request.wants_gpu:
        chosen = [j for j in holding if j.gpus]
    else:
        chosen = list(holding)
    holders = sorted(
        (
            Holder(
                j.id,
                j.spec.user if viewer_uid is None or j.spec.uid == viewer_uid else None,
                tuple(g.index for g in j.gpus),
                expected_end(j.started_at, j.spec.time_limit_s, default_time_limit_s, now),
                "time limit" if j.spec.time_limit_s is not None else "default time limit",
            )
            for j in chosen
        ),
        key=lambda h: (h.expected_end, h.job),
    )
    sentences = []
    if queue is not None and queue.text:
        sentences.append(queue.text)
    elif position is not None:
        sentences.append(f"Position {position} of {len(order)} in the queue.")
    if holders:
        named = [
            f"job {h.job} ({h.owner or 'another user'}, {_gpus(h.gpus)}, expected to end by "
            f"{clock_text(h.expected_end)}"
            + (f", the default time limit of {default_time_limit_s:g} s" if h.expected_end_from != "time limit" else "")
            + ")"
            for h in holders[:3]
        ]
        more = f" and {len(holders) - 3} more" if len(holders) > 3 else ""
        sentences.append(f"Held by {', '.join(named)}{more}.")
    if reservation is not None and mine:
        sentences.append(
            f"Reserved for it: {_gpus(reservation.allocation.gpu_indices)} from {clock_text(reservation.start)} "
            "(estimated start, if running jobs end by their time limits); jobs behind it start first only if they "
            "do not delay it."
        )
    elif reservation is not None:
        sentences.append(
            f"The head of the queue, job {reservation.job_id}, holds a reservation "
            f"({_gpus(reservation.allocation.gpu_indices)} from {clock_text(reservation.start)}): this job starts "
            "before then only if it ends by then or fits beside it; only the head gets an estimated start."
        )
    return WaitStory(
        position,
        len(order),
        holders[:MAX_HOLDERS],
        reservation,
        reservation.start if mine and reservation is not None else None,
        default_time_limit_s,
        " ".join(sentences),
    )


@dataclass(frozen=True)
class QueueStory:
    queue: str
    position: int | None  # 1-based among the jobs of its queue, in the last round's order
    queued: int  # jobs of its queue in that order
    ahead: int | None  # jobs ahead of it across the machine
    limit: str | None  # the limit that held it back in the last round, if any
    text: str


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def queue_story(
    job_id: str, queue: str, order: Sequence[str], queue_of: Mapping[str, str], limit: str | None
) -> QueueStory:
    """Where a queued job stands in its queue (docs/queues.md), and the limit that holds it back."""
    position: int | None = None
    ahead: int | None = None
    mine = 0
    for n, other in enumerate(order):
        if queue_of.get(other) == queue:
            mine += 1
        if other == job_id:
            position, ahead = mine, n
    sentences = []
    if position is not None and ahead is not None:
        sentences.append(
            f"{_ordinal(position)} of {mine} in queue '{queue}'; {ahead} job{'s' if ahead != 1 else ''} ahead across "
            "the machine."
        )
    if limit is not None:
        sentences.append(f"Held back by a limit: {limit}.")
    return QueueStory(queue, position, mine, ahead, limit, " ".join(sentences))
