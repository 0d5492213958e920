"""What a policy sees for one decision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from corral.model.arrays import FloatArray, IntArray
from corral.model.resources import Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement.filters import FitResult
from corral.placement.workload import TargetWorkload


@dataclass(frozen=True, eq=False)
class Context:
    snapshot: ClusterSnapshot
    request: Request
    fit: FitResult
    workload: TargetWorkload
    rng: np.random.Generator


@runtime_checkable
class Policy(Protocol):
    """A placement policy: scores feasible nodes (higher is better) and picks the GPUs on the chosen node.

    Register one with `corral.placement.registry.register_policy` to make it available by name everywhere. A policy
    may also define `notes(ctx, node, gpus) -> list[str]`: sentences on why it chose `node` (and `gpus`), added to
    the decision's explanation (`fgd-priced` says what a share's GPU cost and which nodes it kept free).
    """

    name: str

    def score(self, ctx: Context, nodes: IntArray) -> FloatArray:
        """Scores of the given feasible node indices. Ties go to the node with the smallest rank."""
        ...

    def choose_gpus(self, ctx: Context, node: int) -> list[int]:
        """Indices of `ctx.request.gpu_count` distinct fitting GPUs on `node` (only called for GPU requests)."""
        ...
