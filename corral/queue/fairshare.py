"""Moved to `corral.tenancy.fairshare`; its names stay importable here for code not yet changed (docs/tenancy.md)."""

from corral.tenancy.fairshare import (
    RESOURCES,
    Offer,
    ShareRow,
    UsageLedger,
    amount,
    check_half_life,
    decayed_capacity,
    dominant_share,
    expected_usage,
    fair_order,
    held,
    running_usage,
    share_rows,
)

__all__ = [
    "RESOURCES",
    "Offer",
    "ShareRow",
    "UsageLedger",
    "amount",
    "check_half_life",
    "decayed_capacity",
    "dominant_share",
    "expected_usage",
    "fair_order",
    "held",
    "running_usage",
    "share_rows",
]
