"""Moved: the tenancy layer is `corral.tenancy` (docs/tenancy.md). These names stay importable from here while
other branches still import them; new code imports `corral.tenancy`."""

from corral.tenancy.order import queue_key, queue_order

__all__ = ["queue_key", "queue_order"]
