"""Errors of the resource model.

A rejection (a node that does not fit) is data and lives in an explanation; these exceptions are failures: the
caller gave something that can never be valid, or asked the snapshot to break one of its invariants.
"""

from __future__ import annotations


class CorralError(Exception):
    """Base of every error corral raises on purpose."""


class InvalidRequest(CorralError, ValueError):
    """A request, node or setting is malformed. `field` names what was wrong, `message` says what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class AllocationError(CorralError):
    """An allocate/release would break a snapshot invariant (over-commit, a share granted twice, unknown id)."""
