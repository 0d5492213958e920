"""Moved to `corral.tenancy.order`; its names stay importable from here for code not yet changed (docs/tenancy.md)."""

from corral.tenancy.order import (
    queue_key as queue_key,
)
from corral.tenancy.order import (
    queue_order as queue_order,
)
