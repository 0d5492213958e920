"""Tenancy: who goes next and who must make room. Pure, below the faces, as corral.placement is for placement.

model.py        Work (waiting) and Running: what any face (serve, sim fair, the k8s scheduler) hands in
config.py       the queues file: guarantees, limits, borrow limits, weights, priority bounds, min_runtime
order.py        priority, then age (no queues file)
fairshare.py    weighted DRF fair share of decayed usage, and the order it gives
quota.py        holdings, borrowers, and the gate a waiting job passes (a gang counted whole)
queues.py       Tenancy: the ledger between rounds, and each round's order, gate and preemption rules
reservation.py  the head's reservation and the view backfill must fit in
gang.py         the one gang placer: members placed together, all or none
round.py        the pass: in order, placed, the head reserved, backfill, gangs
preemption.py   the fewest and cheapest borrowers past their minimum runtime
plan.py         plan_round: all of it, once per round (docs/tenancy.md)
"""

from corral.tenancy.model import Running, Work
from corral.tenancy.plan import ClusterView, Preemption, RoundConfig, RoundPlan, plan_round, tenancy_for

__all__ = ["ClusterView", "Preemption", "RoundConfig", "RoundPlan", "Running", "Work", "plan_round", "tenancy_for"]
