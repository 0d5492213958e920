"""Moved to `corral.tenancy.order`; its names stay importable here for code not yet changed (docs/tenancy.md)."""

from corral.tenancy.order import (
    queue_key,
    queue_order,
)

__all__ = [
    "queue_key",
    "queue_order",
]
