"""Queue ordering: pure functions over pending jobs."""

from corral.queue.order import queue_key, queue_order

__all__ = ["queue_key", "queue_order"]
