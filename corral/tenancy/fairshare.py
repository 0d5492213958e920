"""Fair share: each account's weighted dominant share of the machine's decayed usage, and the order it gives.

An account is whoever usage is charged to: a user, or a queue (the daemon and the simulator choose). Pure: amounts,
times, weights and capacity in; shares and an order out. No clock is read.

    amount a        = what an allocation holds, per resource: GPU milli, GPU memory MiB, CPU milli, memory MiB
    decay           = usage t seconds ago counts 2^(-t / H) of usage now          (H: the half-life, > 0)
    usage_u(now)    = sum over u's allocations of a * integral over the time it was held of 2^(-(now - s) / H) ds
                    = a * H/ln2 * (2^(-(now - end)/H) - 2^(-(now - start)/H))    per allocation (end = now if running)
    capacity(now)   = C * H/ln2        (the machine's total C held for ever: the most usage can be)
    share_u         = max over resources r with C_r > 0 of usage_u,r / capacity_r      (dominant share, 0..1)
    weighted_u      = share_u / weight_u                                                (the order's key)
    factor_u        = 2^(-U_u / S_u), U_u = share_u / sum of shares, S_u = weight_u / sum of weights
                      (Slurm's classic fair-share factor, shown by `corral queue show`; 1 = no usage, 0.5 = its
                      share exactly, lower = over it; ordering by weighted_u ascending is ordering by it descending)

The order (`fair_order`): by priority (higher first), then by the account's weighted share (lower first), then by age
(older first), then by id. Within one round, the share is projected: as each job is offered, the usage it is expected
to add (its amount over its expected run time, decayed as above) is added to its account's share before that
account's next job is ranked. So a user who submits 1,000 jobs at once does not take a whole round ahead of a user
who submits one: offers interleave as in weighted fair queueing. The projection lives only for the round.

Finished usage is folded into one number per account and resource (`UsageLedger.record`), so the cost of reading a
share does not grow with history: B = sum a * (2^((end - o)/H) - 2^((start - o)/H)) for an origin o, and
usage = H/ln2 * 2^(-(now - o)/H) * B. The origin moves forward before the exponents grow large.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from corral.model.errors import InvalidRequest
from corral.model.resources import Allocation

#: The resources usage is counted in, in this order in every vector.
RESOURCES = ("gpu_milli", "gpu_memory_mib", "cpu_milli", "memory_mib")

FloatArray = np.ndarray  # shape (4,), float64

_LN2 = math.log(2.0)
_REBASE = 64.0  # half-lives past the origin before it moves (2^64: far from float64's range, exact enough)


def amount(gpu_milli: float = 0, gpu_memory_mib: float = 0, cpu_milli: float = 0, memory_mib: float = 0) -> FloatArray:
    """A resource vector in RESOURCES order."""
    return np.array([gpu_milli, gpu_memory_mib, cpu_milli, memory_mib], dtype=np.float64)


def held(allocation: Allocation) -> FloatArray:
    """What an allocation holds: its GPU milli and GPU memory summed over its GPUs, its CPU and memory."""
    return amount(
        sum(g.milli for g in allocation.gpus),
        sum(g.memory_mib for g in allocation.gpus),
        allocation.cpu_milli,
        allocation.memory_mib,
    )


def check_half_life(half_life_s: float) -> float:
    if not isinstance(half_life_s, (int, float)) or isinstance(half_life_s, bool) or not math.isfinite(half_life_s):
        raise InvalidRequest("half_life", f"must be a finite number of seconds, got {half_life_s!r}")
    if half_life_s <= 0:
        raise InvalidRequest("half_life", f"must be > 0 seconds, got {half_life_s}")
    return float(half_life_s)


def running_usage(a: FloatArray, start: float, now: float, half_life_s: float) -> FloatArray:
    """The decayed usage of `a` held from `start` until now."""
    held_for = max(0.0, now - start)
    out: FloatArray = a * ((half_life_s / _LN2) * (1.0 - 2.0 ** (-held_for / half_life_s)))
    return out


def expected_usage(a: FloatArray, seconds: float, half_life_s: float) -> FloatArray:
    """The decayed usage `a` will have added `seconds` from now if held that long (the round's projection)."""
    return running_usage(a, 0.0, max(0.0, seconds), half_life_s)


class UsageLedger:
    """Decayed usage per account. Finished allocations are recorded once; running ones are given at each read."""

    def __init__(self, half_life_s: float, origin: float = 0.0) -> None:
        self.half_life_s = check_half_life(half_life_s)
        self.origin = float(origin)
        self._folded: dict[Hashable, FloatArray] = {}

    def _rebase(self, t: float) -> None:
        shift = (t - self.origin) / self.half_life_s
        if shift <= _REBASE:
            return
        scale = 2.0 ** (-shift)
        for account in self._folded:
            self._folded[account] = self._folded[account] * scale
        self.origin = t

    def record(self, account: Hashable, a: FloatArray, start: float, end: float) -> None:
        """`account` held `a` from `start` to `end` (epoch seconds)."""
        if not (math.isfinite(start) and math.isfinite(end)):
            raise InvalidRequest("usage", f"start and end must be finite, got {start!r}, {end!r}")
        if end <= start:
            return
        self._rebase(end)
        h = self.half_life_s
        weight = 2.0 ** ((end - self.origin) / h) - 2.0 ** ((start - self.origin) / h)
        folded = self._folded.get(account)
        self._folded[account] = a * weight if folded is None else folded + a * weight

    def usage(self, account: Hashable, now: float, running: Iterable[tuple[FloatArray, float]] = ()) -> FloatArray:
        """The decayed usage of `account` at `now`: what it recorded plus what it holds since each start given."""
        h = self.half_life_s
        folded = self._folded.get(account)
        total = amount() if folded is None else folded * ((h / _LN2) * 2.0 ** (-(now - self.origin) / h))
        for a, start in running:
            total = total + running_usage(a, start, now, h)
        return total

    def accounts(self) -> list[Hashable]:
        return list(self._folded)


def decayed_capacity(capacity: FloatArray, half_life_s: float) -> FloatArray:
    """The most decayed usage there can be: the whole machine held for ever."""
    return capacity * (half_life_s / _LN2)


def dominant_share(usage: FloatArray, capacity: FloatArray) -> float:
    """The largest fraction of any resource's capacity that `usage` is (resources with no capacity are skipped)."""
    present = capacity > 0
    if not present.any():
        return 0.0
    return float(np.max(usage[present] / capacity[present]))


@dataclass(frozen=True)
class ShareRow:
    """One account as `corral queue show` prints it (sshare's columns, with corral's names)."""

    account: str
    weight: float
    norm_shares: float  # weight / sum of weights: the part of the machine it is due
    usage: tuple[float, ...]  # decayed usage per resource (RESOURCES order), resource-seconds
    share: float  # dominant share of the decayed capacity, 0..1
    effective_usage: float  # share / sum of shares (0 when nobody used anything)
    factor: float  # 2^(-effective_usage / norm_shares)


def share_rows(
    usages: Mapping[str, FloatArray], weights: Mapping[str, float], capacity: FloatArray, half_life_s: float
) -> list[ShareRow]:
    """sshare's view: every account in `weights` or `usages` (weight 1 unless given), sorted by name."""
    names = sorted(set(usages) | set(weights))
    cap = decayed_capacity(capacity, half_life_s)
    shares = {n: dominant_share(usages.get(n, amount()), cap) for n in names}
    total_share = sum(shares.values())
    total_weight = sum(weights.get(n, 1.0) for n in names) or 1.0
    rows = []
    for n in names:
        w = weights.get(n, 1.0)
        norm = w / total_weight
        effective = shares[n] / total_share if total_share > 0 else 0.0
        factor = 2.0 ** (-effective / norm) if norm > 0 else 0.0
        used = tuple(float(x) for x in usages.get(n, amount()))
        rows.append(ShareRow(n, w, norm, used, shares[n], effective, factor))
    return rows


T = TypeVar("T")


@dataclass(frozen=True)
class Offer(Generic[T]):
    """How `fair_order` sees a queued item."""

    item: T
    account: Hashable
    priority: int
    submitted_at: float
    tie: tuple[int, str]  # (numeric id, id): a total order that is the same after a restart
    projected: float  # the dominant share it adds to its account if offered (see expected_usage)


def fair_order(
    offers: Sequence[Offer[T]], shares: Mapping[Hashable, float], weights: Callable[[Hashable], float]
) -> list[T]:
    """Items by priority, then their account's projected weighted share, then age, then id (see the module doc).

    `shares`: each account's dominant share now (0 if absent); `weights`: an account's weight (> 0)."""
    per_account: dict[Hashable, list[Offer[T]]] = {}
    for o in offers:
        per_account.setdefault(o.account, []).append(o)
    heap: list[tuple[int, float, float, tuple[int, str], int, Hashable]] = []
    cursor: dict[Hashable, int] = {}
    share = {a: float(shares.get(a, 0.0)) for a in per_account}
    weight = {a: float(weights(a)) for a in per_account}
    for n, (account, items) in enumerate(per_account.items()):
        items.sort(key=lambda o: (-o.priority, o.submitted_at, o.tie))
        cursor[account] = 0
        head = items[0]
        heapq.heappush(
            heap, (-head.priority, share[account] / weight[account], head.submitted_at, head.tie, n, account)
        )
    out: list[T] = []
    while heap:
        _, _, _, _, n, account = heapq.heappop(heap)
        items = per_account[account]
        i = cursor[account]
        offer = items[i]
        out.append(offer.item)
        share[account] += offer.projected
        i += 1
        cursor[account] = i
        if i < len(items):
            head = items[i]
            key = (-head.priority, share[account] / weight[account], head.submitted_at, head.tie, n, account)
            heapq.heappush(heap, key)
    return out


#: Priorities a float64 holds exactly (FairRuns compares them as floats; beyond, it orders as fair_order does).
_EXACT = 2.0**53


class _Run(Generic[T]):
    """One account's offers sorted by (priority, age, id), kept across rounds, with their keys as columns."""

    def __init__(self, offers: list[Offer[T]]) -> None:
        self.offers = offers
        self.ids = {id(o) for o in offers}  # (the list keeps each offer alive: no id is reused meanwhile)
        self.items = [o.item for o in offers]
        self.priority = np.array([-o.priority for o in offers], dtype=np.float64)
        self.submitted = np.array([o.submitted_at for o in offers], dtype=np.float64)
        self.projected = np.array([o.projected for o in offers], dtype=np.float64)


def _run_key(o: Offer[T]) -> tuple[int, float, tuple[int, str]]:
    return (-o.priority, o.submitted_at, o.tie)


class FairRuns(Generic[T]):
    """`fair_order` for a long queue asked again every round: the same order, to the last bit, at a fraction of the
    cost (a cluster's 10,000 pending pods a round, issue 25).

    fair_order merges each account's items (sorted by priority, age, id) by the key (priority, projected weighted
    share, age, id, account): each account's keys only grow along its items, so the merge is the sort of all the
    keys. Here each account's sorted items are kept across rounds (only the items that came or went change them),
    and the keys are sorted as columns: an account's projected shares are its share plus the running sum of its
    items' projections (numpy's cumulative sum adds in the same order as fair_order's loop, so every key is the
    same float), over its weight. Items whose (priority, share, age) tie exactly are put in fair_order's order (id,
    then the account's first appearance) by Python's sort. Offers must be the same objects from round to round for
    the runs to be reused (a face caches them); a new object is a new item."""

    def __init__(self) -> None:
        self._runs: dict[Hashable, _Run[T]] = {}

    def order(
        self, offers: Sequence[Offer[T]], shares: Mapping[Hashable, float], weights: Callable[[Hashable], float]
    ) -> list[T]:
        per_account: dict[Hashable, list[Offer[T]]] = {}
        for o in offers:
            per_account.setdefault(o.account, []).append(o)
        runs = self._runs
        now: dict[Hashable, _Run[T]] = {}
        for account, group in per_account.items():
            run = runs.get(account)
            if run is None or len(run.offers) != len(group) or not run.ids.issuperset(map(id, group)):
                run = self._rebuilt(run, group)
            now[account] = run
        self._runs = now  # (accounts with nothing waiting are forgotten)
        if not now:
            return []
        if len(now) == 1:
            return list(next(iter(now.values())).items)
        share = [float(shares.get(a, 0.0)) for a in now]
        weight = [float(weights(a)) for a in now]
        runs_now = list(now.values())
        priority = np.concatenate([r.priority for r in runs_now])
        projected = [r.projected for r in runs_now]
        if (
            not (np.abs(priority) < _EXACT).all()
            or not all(math.isfinite(s) and w > 0 and math.isfinite(w) for s, w in zip(share, weight, strict=True))
            or not all(np.isfinite(p).all() for p in projected)
        ):
            return fair_order(offers, shares, weights)  # (a key numpy would not order as Python does)
        keys = []
        for s, w, p in zip(share, weight, projected, strict=True):
            # the share before each item: s, s + p0, (s + p0) + p1, ... (the loop's additions, in its order)
            before = np.cumsum(np.concatenate(([s], p[:-1]))) if len(p) else p
            keys.append(before / w)
        weighted = np.concatenate(keys)
        submitted = np.concatenate([r.submitted for r in runs_now])
        account_of = np.repeat(np.arange(len(runs_now)), [len(r.offers) for r in runs_now])
        position = np.concatenate([np.arange(len(r.offers)) for r in runs_now])
        order = np.lexsort((position, account_of, submitted, weighted, priority))
        items = [x for r in runs_now for x in r.items]
        out_order = order.tolist()
        # exact ties of (priority, share, age) between accounts: fair_order breaks them by id, then account
        p_, w_, s_ = priority[order], weighted[order], submitted[order]
        same = np.flatnonzero((p_[1:] == p_[:-1]) & (w_[1:] == w_[:-1]) & (s_[1:] == s_[:-1]))
        if len(same):
            offer_at = [o for r in runs_now for o in r.offers]
            n_of = account_of.tolist()
            i = 0
            marks = same.tolist()
            while i < len(marks):
                lo = marks[i]
                hi = lo + 1
                while i + 1 < len(marks) and marks[i + 1] == hi:
                    i += 1
                    hi += 1
                i += 1
                block = out_order[lo : hi + 1]
                out_order[lo : hi + 1] = sorted(block, key=lambda k: (offer_at[k].tie, n_of[k]))
        return [items[k] for k in out_order]

    @staticmethod
    def _rebuilt(run: _Run[T] | None, group: list[Offer[T]]) -> _Run[T]:
        """`group`'s run: the kept run less the offers that left, with the new ones put in their places."""
        if run is None:
            return _Run(sorted(group, key=_run_key))
        here = {id(o) for o in group}
        kept = [o for o in run.offers if id(o) in here]
        new = [o for o in group if id(o) not in run.ids]
        if len(new) * 64 < len(kept):
            for o in new:
                bisect.insort(kept, o, key=_run_key)
        else:  # (the kept offers are one sorted run: the sort merges the new ones into it)
            kept = sorted(kept + new, key=_run_key)
        return _Run(kept)
