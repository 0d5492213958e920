"""The tenancy face of `corral k8s scheduler` (issue 25): pending pod -> Work, bound pod -> Running, books ->
ClusterView, and the seam through which a RoundPlan's preemptions are carried out.

`Evictions` is the contract with corral/k8s/scheduler/evict.py (the Eviction API, PDBs, grace, minimum runtime, the
capacity held for the preemptor). `NoEvictions` is the default: nothing is ever evicted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from corral.model.resources import Allocation
from corral.tenancy.plan import Preemption


class Evictions(Protocol):
    """How the scheduler carries out preemptions. Pod keys are UIDs."""

    def busy(self) -> bool:
        """A preemption is still being carried out: the round plans with preempt=False."""
        ...

    def stopping(self) -> frozenset[str]:
        """Pod keys being evicted: their Running has stopping=True."""
        ...

    def protected(self) -> frozenset[str]:
        """Pod keys that may not be victims now (a PDB allows no disruption): Running.preemptible=False."""
        ...

    def held(self) -> Mapping[str, Allocation]:
        """Preemptor pod key -> the capacity held for it until it binds."""
        ...

    def start(self, preemption: Preemption, victims: Sequence[tuple[str, str, str]]) -> None:
        """Evict `victims` ((uid, namespace, name) each) for `preemption.preemptor`; never blocks."""
        ...

    def bound(self, key: str) -> None:
        """The preemptor `key` was bound (or is gone): its hold ends."""
        ...


class NoEvictions:
    """No preemption: never busy, nothing stopping, protected or held; `start` does nothing."""

    def busy(self) -> bool:
        return False

    def stopping(self) -> frozenset[str]:
        return frozenset()

    def protected(self) -> frozenset[str]:
        return frozenset()

    def held(self) -> Mapping[str, Allocation]:
        return {}

    def start(self, preemption: Preemption, victims: Sequence[tuple[str, str, str]]) -> None:
        return None

    def bound(self, key: str) -> None:
        return None


__all__ = ["Evictions", "NoEvictions"]
