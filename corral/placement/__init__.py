"""The placement engine: snapshot + request + policy + seed in, an explained Decision out.

    request --> filters (mask + reason bits per node) --> scores (policy, per feasible node)
            --> select (preference class, score, tie-break rank) --> GPU choice --> Decision + Explanation

Pure: no I/O, no clock, randomness only from the generator the caller passes. The daemon, the Kubernetes
extender and the simulator all call `place()`.
"""

from corral.placement.engine import Decision, PlacementConfig, place
from corral.placement.explain import Explanation, render
from corral.placement.reasons import Reason
from corral.placement.registry import get_policy, policy_names, register_policy
from corral.placement.workload import GpuReserve, TargetWorkload

__all__ = [
    "Decision",
    "Explanation",
    "GpuReserve",
    "PlacementConfig",
    "Reason",
    "TargetWorkload",
    "get_policy",
    "place",
    "policy_names",
    "register_policy",
    "render",
]
