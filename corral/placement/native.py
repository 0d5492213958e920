"""The compiled kernels (`placement.kernels`), imported on first use.

Importing numba costs about 0.3 s and 50 MB, and loading the kernels from its on-disk cache about 0.5 s more (the
first time on a checkout, compiling them takes several seconds). Only processes that score with F or the fill (fgd,
fgd-scarcity, fgd-priced, the simulator's fragmentation curve) need them: `corral serve` on its binpack default
never pays. A process that wants the load out of its first decision (a benchmark's timed replay, the extender's
first request) calls `kernels()` at start.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def kernels() -> ModuleType:
    """`corral.placement.kernels`, imported (its kernels compiled or loaded) the first time."""
    module = sys.modules.get("corral.placement.kernels")
    return module if module is not None else importlib.import_module("corral.placement.kernels")
