"""Policies by name. `register_policy` lets a user add one without touching the core."""

from __future__ import annotations

from collections.abc import Callable

from corral.model.errors import InvalidRequest
from corral.placement.context import Policy
from corral.placement.scores.bestfit import BestFit
from corral.placement.scores.binpack import Binpack, Spread
from corral.placement.scores.dotprod import DotProd
from corral.placement.scores.fgd import Fgd
from corral.placement.scores.fgd_priced import FgdPriced
from corral.placement.scores.fgd_scarcity import FgdScarcity
from corral.placement.scores.gpu_clustering import GpuClustering
from corral.placement.scores.gpu_packing import GpuPacking
from corral.placement.scores.load import Load
from corral.placement.scores.random import RandomPolicy
from corral.placement.scores.topology import Topology

_REGISTRY: dict[str, Callable[[], Policy]] = {}


def register_policy(name: str, factory: Callable[[], Policy]) -> None:
    if not name or name != name.strip().lower():
        raise InvalidRequest("policy", f"policy names are lower-case and non-empty, got {name!r}")
    _REGISTRY[name] = factory


def policy_names() -> list[str]:
    return sorted(_REGISTRY)


def get_policy(name: str) -> Policy:
    factory = _REGISTRY.get(name.strip().lower())
    if factory is None:
        raise InvalidRequest("policy", f"unknown policy {name!r}; use one of {', '.join(policy_names())}")
    return factory()


for _cls in (Binpack, Spread, RandomPolicy, BestFit, DotProd, GpuPacking, GpuClustering, Fgd, Topology, Load):
    register_policy(_cls.name, _cls)
register_policy(FgdScarcity.name, FgdScarcity)
register_policy(FgdPriced.name, FgdPriced)
