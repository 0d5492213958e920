"""Why a node was rejected. One bit per reason so a node keeps every dimension that failed.

The order of the enum is the order in which a node's *primary* reason is picked (the one counted in the
one-line explanation, so the counts add up to the nodes evaluated): reasons that no amount of waiting can fix come
first, then the resource shortfalls in Marathon's funnel order, then the scarce-GPU declines, which as in Marathon
are reported only when everything else fit.
"""

from __future__ import annotations

from enum import Enum

import numpy as np
import numpy.typing as npt


class Reason(Enum):
    # value = bit position
    CONSTRAINT = 0
    NO_GPUS = 1
    GPU_MODEL = 2
    GPU_MEMORY = 3
    TOO_FEW_GPUS = 4
    CPU_CAPACITY = 5
    MEMORY_CAPACITY = 6
    INSUFFICIENT_CPU = 7
    INSUFFICIENT_MEMORY = 8
    INSUFFICIENT_GPU = 9
    DECLINED_SCARCE = 10
    GPU_RESERVE = 11

    @property
    def bit(self) -> int:
        return 1 << self.value

    @property
    def resolvable(self) -> bool:
        """Could waiting (others finishing) or preemption make the node fit?"""
        return self not in UNRESOLVABLE


UNRESOLVABLE = frozenset(
    {
        Reason.CONSTRAINT,
        Reason.NO_GPUS,
        Reason.GPU_MODEL,
        Reason.GPU_MEMORY,
        Reason.TOO_FEW_GPUS,
        Reason.CPU_CAPACITY,
        Reason.MEMORY_CAPACITY,
    }
)
UNRESOLVABLE_BITS = sum(r.bit for r in UNRESOLVABLE)
ORDER: tuple[Reason, ...] = tuple(Reason)


def reasons_of(bits: int) -> list[Reason]:
    """Every reason set in a node's bitmask, in priority order."""
    return [r for r in ORDER if bits & r.bit]


def primary_reasons(bits: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Per node the value of its lowest set bit (the primary reason), -1 where the node fits."""
    out: npt.NDArray[np.int64] = _LOWEST_BIT[bits & -bits]
    return out


# Lowest set bit (a power of two, or 0) -> its position, -1 for 0.
_LOWEST_BIT = np.full(1 << len(ORDER), -1, dtype=np.int64)
for _r in ORDER:
    _LOWEST_BIT[_r.bit] = _r.value
