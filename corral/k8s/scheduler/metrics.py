"""The standalone scheduler's Prometheus metrics (GET /metrics; every name is in docs/metrics.md).

Counters and histograms are fed where the thing happens (a bind's answer, a batch placed); pending pods by reason are
read from the scheduler's queues at scrape time, so the loop pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from corral.k8s.scheduler.evict import eviction_metrics

#: A Binding's round trip, and a pod's time from first seen to bound: a few ms on a quiet plane, seconds when the rate
#: limit holds writes back.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


class PendingCollector:
    """corral_scheduler_pending_pods{reason}: read from the scheduler at scrape time."""

    def __init__(self, read: Callable[[], Mapping[str, int]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "corral_scheduler_pending_pods",
            "Pods of this scheduler without a node, by why: queued (not placed yet), binding (a Binding in flight), or "
            "the reason the engine gave (insufficient_gpu, gpu_model, ..., invalid: the pod cannot be read)",
            labels=["reason"],
        )
        for reason, count in sorted(self.read().items()):
            family.add_metric([reason], count)
        yield family


#: Holdings' resources as /metrics names them (the queues file's dimensions, in base units).
HOLDING_RESOURCES = {"gpu_milli": "gpu_milli", "gpu_memory": "gpu_memory_mib", "cpus": "cpu_milli",
                     "memory": "memory_mib"}  # fmt: skip


class QueueCollector:
    """With a queues file: corral_scheduler_queue_pending_pods{queue}, corral_scheduler_queue_share{queue} (its
    weighted dominant share: decayed usage over the capacity, divided by its part of the weights) and
    corral_scheduler_queue_holding{queue,resource}, read at scrape time (Scheduler.queue_views)."""

    def __init__(self, read: Callable[[], Mapping[str, Mapping[str, Any]]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        views = self.read()
        pending = GaugeMetricFamily("corral_scheduler_queue_pending_pods",
                                    "Pods of this scheduler without a node, by queue", labels=["queue"])  # fmt: skip
        for q, n in sorted(views.get("pending", {}).items()):
            pending.add_metric([q], n)
        yield pending
        share = GaugeMetricFamily(
            "corral_scheduler_queue_share",
            "Each queue's weighted dominant share: its decayed usage's dominant share of the cluster over its part of "
            "the queues' weights (1: it had exactly its fair part; the queue order serves the lowest first)",
            labels=["queue"],
        )
        for q, v in sorted(views.get("shares", {}).items()):
            share.add_metric([q], v)
        yield share
        holding = GaugeMetricFamily("corral_scheduler_queue_holding",
                                    "What each queue's bound pods hold, by resource (base units)",
                                    labels=["queue", "resource"])  # fmt: skip
        for q, vector in sorted(views.get("holdings", {}).items()):
            for dim, name in HOLDING_RESOURCES.items():
                holding.add_metric([q, name], vector.get(dim, 0))
        yield holding


class SchedulerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.binds = Counter(
            "corral_scheduler_binds",
            "Bindings written, by result: bound, refused (the API server said no), unknown (no answer)",
            ["result"],
            registry=r,
        )
        self.bind_latency = Histogram(
            "corral_scheduler_bind_duration_seconds",
            "One Binding's write, from the request sent to its answer (rate limit wait not included)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e_latency = Histogram(
            "corral_scheduler_pod_scheduling_duration_seconds",
            "From the scheduler first seeing a pod to its Binding's answer",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "corral_scheduler_batch_size", "Pods placed per batch", buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_seconds = Histogram(
            "corral_scheduler_batch_duration_seconds",
            "CPU-side time to place one batch (the engine, under the books' lock)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.events = Counter(
            "corral_scheduler_events",
            "FailedScheduling events: sent, suppressed (over the per-pod limit), failed (the write failed)",
            ["result"],
            registry=r,
        )
        self.preemptions = Counter(
            "corral_scheduler_preemptions",
            "Pods chosen as preemption victims (handed to the evictions), by the victim's queue",
            ["queue"],
            registry=r,
        )
        self.conditions = Counter(
            "corral_scheduler_condition_patches", "PodScheduled condition patches, by result", ["result"], registry=r
        )
        self.preemption = eviction_metrics(r)  # evictions and preemptions by result (corral.k8s.scheduler.evict)
