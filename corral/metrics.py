"""Prometheus metrics of `corral serve` (every name, type and label is in docs/metrics.md).

    event counters (DaemonMetrics)    fed by one-line hooks in corral.daemon.core: schedule attempts, starts and
                                      their scheduling latency, ends by state and cause, refusals, watchdog actions
    state gauges (DaemonCollector)    read at scrape time from what the daemon already keeps: the inventory, the
                                      jobs holding GPUs and waiting (the store), the latest NVML sample

    GET /metrics -> Exposition(daemon, jobs=root?) -> prometheus_client's text format

Gauges are read at scrape time, not kept up to date by the daemon, so the scheduling loop pays nothing for them and a
scrape never disagrees with the store. Each daemon has a registry of its own (never prometheus_client's global one):
tests and the simulator run many daemons in one process.

Where the DCGM exporter or HAMi has a name for a measure, the same name and labels are used, so dashboards built for
them read corral too: DCGM's `DCGM_FI_DEV_*` per GPU (labels gpu, UUID, device, modelName, Hostname), HAMi's
`GPUDevice*` per GPU and `vGPU*Allocated` per job (labels nodeid/nodename, deviceuuid, deviceidx, zone="vGPU").
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

if TYPE_CHECKING:
    from corral.daemon.core import Daemon
    from corral.jobs.model import Job, JobState

#: Scheduling latency (submit to start) buckets, in seconds: a free machine starts a job within a round (0.2 s), a
#: busy one makes jobs wait minutes to days.
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
#: HAMi's `zone` label on every series of its scheduler.
HAMI_ZONE = "vGPU"
#: A job's queue, for the `queue` label: where it came from. corral has one queue ordered by priority; what made a job
#: (a plain `corral submit`, a Metronome/Chronos job's run, a Marathon app's instance) is what tells work apart.
DEFAULT_QUEUE = "default"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def queue_of(job: Job) -> str:
    """`default` for `corral submit`, else the kind of definition that made it (`origin` = "<kind>:<name>[:<run>]")."""
    return job.spec.origin.partition(":")[0] or DEFAULT_QUEUE


def end_cause(state: JobState, reason: str) -> str:
    """A job attempt's end as a small fixed set of causes (the reason's words vary per job: not a label)."""
    from corral.daemon.core import OVER_GRANT  # the daemon's words; imported late (core imports this module)

    value = state.value
    if value == "succeeded":
        return "completed"
    if value == "cancelled":
        return "cancelled"
    if value == "lost":
        return "lost"
    for prefix, cause in (
        (OVER_GRANT, "gpu_memory_watchdog"),
        ("could not start", "could_not_start"),
        ("time limit", "time_limit"),
        ("killed by signal", "signal"),
        ("exit code", "exit_code"),
    ):
        if reason.startswith(prefix):
            return cause
    return "other"


class DaemonMetrics:
    """The daemon's event counters, in a registry of its own. Each method is one hook in corral.daemon.core."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.attempts = Counter(
            "corral_schedule_attempts",
            "Placement decisions the scheduler made, by policy and result (placed, unschedulable); one per job "
            "placed and one per request shape that could not be placed in a round",
            ["policy", "result"],
            registry=r,
        )
        self.latency = Histogram(
            "corral_scheduling_latency_seconds",
            "Time from a job's submission to its first start (retries are not counted again)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.started = Counter("corral_jobs_started", "Job attempts started", registry=r)
        self.ended = Counter(
            "corral_jobs_ended",
            "Job attempts that ended, by state and cause (failures by reason: exit_code, signal, time_limit, "
            "gpu_memory_watchdog, could_not_start, lost)",
            ["state", "cause"],
            registry=r,
        )
        self.refused = Counter(
            "corral_jobs_refused", "Submissions refused at admission, by reason", ["reason"], registry=r
        )
        self.watchdog = Counter(
            "corral_gpu_memory_watchdog_actions",
            "Jobs the GPU memory watchdog acted on for using more GPU memory than granted (action: kill or warn)",
            ["action"],
            registry=r,
        )
        self.preemptions = Counter(
            "corral_preemptions",
            "Running jobs preempted (SIGTERM, grace, SIGKILL, queued again), by reason: priority (a higher priority "
            "class) or guarantee (the preemptor's queue was below its guarantee)",
            ["reason"],
            registry=r,
        )
        self.preempted_gpu_seconds = Counter(
            "corral_preempted_gpu_seconds",
            "GPU-seconds of run time lost by preempted jobs (their GPUs, shares as fractions, times how long they ran)",
            registry=r,
        )

    def round(self, policy: str, placed: int, unplaced: int) -> None:
        """One scheduling pass: `placed` jobs, and `unplaced` request shapes that could not be placed. (Not engine
        calls: a job that backfills past the head's reservation is placed twice, now and beside the reservation.)"""
        if placed:
            self.attempts.labels(policy, "placed").inc(placed)
        if unplaced:
            self.attempts.labels(policy, "unschedulable").inc(unplaced)

    def job_started(self, job: Job, now: float) -> None:
        self.started.inc()
        if job.attempts <= 1:
            self.latency.observe(max(0.0, now - job.submitted_at))

    def job_ended(self, state: JobState, reason: str) -> None:
        self.ended.labels(state.value, end_cause(state, reason)).inc()


class DaemonCollector:
    """The daemon's state as gauges, read at scrape time. `jobs`: also the per-job series (job ids and users)."""

    def __init__(self, daemon: Daemon, jobs: bool) -> None:
        self.daemon = daemon
        self.jobs = jobs

    def collect(self) -> Iterator[Metric]:
        from corral.jobs.model import JobState
        from corral.placement.reference import reference_fragmentation
        from corral.placement.workload import DEFAULT_WORKLOAD

        d = self.daemon
        node = d.node
        active = d.store.list([JobState.QUEUED, JobState.STARTING, JobState.RUNNING])
        holding = [j for j in active if j.state.holds_resources]

        info = GaugeMetricFamily(
            "corral_info",
            "The daemon: version, policy, GPU behaviour (always 1)",
            labels=["version", "policy", "gpu_behavior"],
        )
        from corral import __version__

        info.add_metric([__version__, d.config.policy, d.config.gpu_behavior.value], 1)
        yield info

        dcgm = ["gpu", "UUID", "device", "modelName", "Hostname"]
        hami = ["nodeid", "deviceuuid", "deviceidx", "zone"]
        util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilisation (%), as sampled by NVML", labels=dcgm)
        used = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "GPU memory used (MiB), as sampled by NVML", labels=dcgm)
        free = GaugeMetricFamily("DCGM_FI_DEV_FB_FREE", "GPU memory free (MiB), as sampled by NVML", labels=dcgm)
        total = GaugeMetricFamily("DCGM_FI_DEV_FB_TOTAL", "GPU memory in all (MiB)", labels=dcgm)
        foreign = GaugeMetricFamily(
            "corral_gpu_foreign_memory_mib", "GPU memory held by processes corral did not start (MiB)", labels=dcgm
        )
        milli = GaugeMetricFamily(
            "corral_gpu_granted_milli", "Compute granted to jobs on the GPU (1000 = the whole GPU)", labels=dcgm
        )
        mem = GaugeMetricFamily("corral_gpu_granted_memory_mib", "GPU memory granted to jobs (MiB)", labels=dcgm)
        shares = GaugeMetricFamily("corral_gpu_jobs", "Jobs holding a share of the GPU", labels=dcgm)
        h_mem_limit = GaugeMetricFamily("GPUDeviceMemoryLimit", "GPU memory in all (bytes; HAMi)", labels=hami)
        h_mem = GaugeMetricFamily("GPUDeviceMemoryAllocated", "GPU memory granted (bytes; HAMi)", labels=hami)
        h_core_limit = GaugeMetricFamily("GPUDeviceCoreLimit", "GPU compute in all (100 %; HAMi)", labels=hami)
        h_core = GaugeMetricFamily("GPUDeviceCoreAllocated", "GPU compute granted (%; HAMi)", labels=hami)
        h_shared = GaugeMetricFamily("GPUDeviceSharedNum", "Jobs sharing the GPU (HAMi)", labels=hami)
        granted_milli: Tally[int] = Tally()
        granted_mem: Tally[int] = Tally()
        holders: Tally[int] = Tally()
        for job in holding:
            for g in job.gpus:
                granted_milli[g.index] += g.milli
                granted_mem[g.index] += g.memory_mib
                holders[g.index] += 1
        for dev in node.gpus:
            labels = [str(dev.index), dev.uuid, f"nvidia{dev.index}", dev.model, node.name]
            hlabels = [node.name, dev.uuid, str(dev.index), HAMI_ZONE]
            use = d.gpu_use.get(dev.uuid)
            if use is not None and use.utilization_pct is not None:
                util.add_metric(labels, use.utilization_pct)
            if use is not None and use.used_mib is not None:
                used.add_metric(labels, use.used_mib)
                if dev.memory_mib:
                    free.add_metric(labels, max(0, dev.memory_mib - use.used_mib))
            if use is not None and not use.unknown:
                foreign.add_metric(labels, use.foreign_mib)
            total.add_metric(labels, dev.memory_mib)
            milli.add_metric(labels, granted_milli[dev.index])
            mem.add_metric(labels, granted_mem[dev.index])
            shares.add_metric(labels, holders[dev.index])
            h_mem_limit.add_metric(hlabels, dev.memory_mib * 2**20)
            h_mem.add_metric(hlabels, granted_mem[dev.index] * 2**20)
            h_core_limit.add_metric(hlabels, 100)
            h_core.add_metric(hlabels, granted_milli[dev.index] / 10)
            h_shared.add_metric(hlabels, holders[dev.index])
        yield from (util, used, free, total, foreign, milli, mem, shares)
        yield from (h_mem_limit, h_mem, h_core_limit, h_core, h_shared)

        gpus = GaugeMetricFamily("corral_gpus", "GPUs of the machine, by model", labels=["modelName"])
        for model, count in sorted(Tally(dev.model for dev in node.gpus).items()):
            gpus.add_metric([model], count)
        yield gpus
        capacity = GaugeMetricFamily("corral_node_capacity", "The machine's resources", labels=["resource"])
        capacity.add_metric(["cpu_milli"], node.cpu_milli)
        capacity.add_metric(["memory_mib"], node.memory_mib)
        capacity.add_metric(["gpu_milli"], 1000 * len(node.gpus))
        yield capacity
        granted = GaugeMetricFamily("corral_node_granted", "Resources granted to jobs", labels=["resource"])
        granted.add_metric(["cpu_milli"], sum(j.spec.request.cpu_milli for j in holding))
        granted.add_metric(["memory_mib"], sum(j.spec.request.memory_mib for j in holding))
        granted.add_metric(["gpu_milli"], sum(granted_milli.values()))
        yield granted

        # Fragmentation (the FGD study's measure, as the simulator reports it): idle GPU compute that the typical
        # workload cannot use, in milli-GPU and as a share of all the machine's GPU compute.
        frag_milli = 0.0
        if node.gpus:
            # One machine's F in plain Python (`placement.reference`, the study's F in the same float order): the
            # compiled kernels would cost the daemon numba's start and 50 MB for one gauge.
            snapshot, workload = d.snapshot(holding), d.config.workload or DEFAULT_WORKLOAD
            frag_milli = sum(reference_fragmentation(snapshot, workload, i) for i in range(len(snapshot)))
        frag = GaugeMetricFamily(
            "corral_gpu_fragmentation_milli", "Idle GPU compute the target workload cannot use (milli-GPU)"
        )
        frag.add_metric([], frag_milli)
        yield frag
        rate = GaugeMetricFamily(
            "corral_gpu_fragmentation_ratio",
            "Fragmented GPU compute as a share of all the machine's GPU compute (0..1)",
        )
        rate.add_metric([], frag_milli / (1000 * len(node.gpus)) if node.gpus else 0.0)
        yield rate

        queue = GaugeMetricFamily(
            "corral_jobs",
            "Jobs waiting or holding resources, by state, queue and user",
            labels=["state", "queue", "user"],
        )
        counts = Tally((j.state.value, queue_of(j), j.spec.user) for j in active)
        for state in (JobState.QUEUED, JobState.STARTING, JobState.RUNNING):  # zeros too: a board shows an empty queue
            if not any(key[0] == state.value for key in counts):
                queue.add_metric([state.value, DEFAULT_QUEUE, ""], 0)
        for (state_name, q, user), count in sorted(counts.items()):
            queue.add_metric([state_name, q, user], count)
        yield queue

        if self.jobs:
            yield from self._jobs(holding)

    def _jobs(self, holding: Iterable[Job]) -> Iterator[Metric]:
        """Per job: what it holds (job ids and users: shown to root only, see docs/metrics.md)."""
        d, node = self.daemon, self.daemon.node
        labels = ["job", "user", "queue"]
        gpu_labels = [*labels, "gpu", "UUID"]
        hami = ["podnamespace", "nodename", "podname", "containeridx", "deviceuuid", "zone"]
        cpu = GaugeMetricFamily("corral_job_cpu_milli", "CPU granted to the job (milli-cores)", labels=labels)
        ram = GaugeMetricFamily("corral_job_memory_mib", "Memory granted to the job (MiB)", labels=labels)
        milli = GaugeMetricFamily(
            "corral_job_gpu_milli", "GPU compute granted to the job (1000 = a GPU)", labels=gpu_labels
        )
        mem = GaugeMetricFamily("corral_job_gpu_memory_mib", "GPU memory granted to the job (MiB)", labels=gpu_labels)
        used = GaugeMetricFamily(
            "corral_job_gpu_memory_used_mib", "GPU memory the job's processes use (MiB), as sampled", labels=gpu_labels
        )
        h_mem = GaugeMetricFamily("vGPUMemoryAllocated", "GPU memory granted to the job (bytes; HAMi)", labels=hami)
        h_core = GaugeMetricFamily("vGPUCoreAllocated", "GPU compute granted to the job (%; HAMi)", labels=hami)
        for job in holding:
            r = job.spec.request
            base = [job.id, job.spec.user, queue_of(job)]
            cpu.add_metric(base, r.cpu_milli)
            ram.add_metric(base, r.memory_mib)
            for g, uuid in zip(job.gpus, job.gpu_uuids, strict=False):
                at = [*base, str(g.index), uuid]
                milli.add_metric(at, g.milli)
                mem.add_metric(at, g.memory_mib)
                use = d.gpu_use.get(uuid)
                if use is not None and not use.unknown:
                    used.add_metric(at, use.jobs.get(job.id, 0))
                pod = [job.spec.user, node.name, job.id, "0", uuid, HAMI_ZONE]
                h_mem.add_metric(pod, g.memory_mib * 2**20)
                h_core.add_metric(pod, g.milli / 10)
        yield from (cpu, ram, milli, mem, used, h_mem, h_core)


class Exposition:
    """What one scrape shows: the event counters, the state gauges, and (`jobs`) the per-job series."""

    def __init__(self, daemon: Daemon, jobs: bool) -> None:
        self.counters = daemon.metrics.registry
        self.state = DaemonCollector(daemon, jobs)

    def collect(self) -> Iterator[Metric]:
        yield from self.counters.collect()
        yield from self.state.collect()


def render_daemon(daemon: Daemon, jobs: bool) -> bytes:
    """The daemon's metrics in Prometheus' text format."""
    return generate_latest(Exposition(daemon, jobs))


# ---------------------------------------------------------------------------------------------- Kubernetes faces
#: Latency buckets of the extender's verbs, in seconds: a filter takes under a millisecond on a warm cache, a bind
#: waits on the API server.
VERB_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class ExtenderMetrics:
    """The extender's counters: requests per verb and status, their latency, and decisions by outcome. Per node, the
    GPUs granted are read from the cluster state at scrape time (`ExtenderCollector`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter(
            "corral_extender_requests", "Requests per verb, by HTTP status code", ["verb", "code"], registry=r
        )
        self.latency = Histogram(
            "corral_extender_request_duration_seconds",
            "Time to answer a verb, from the body read to the answer made",
            ["verb"],
            buckets=VERB_BUCKETS,
            registry=r,
        )
        self.decisions = Counter(
            "corral_extender_decisions",
            "Decisions by verb and outcome: filter fits / unschedulable, bind bound / refused; any verb: invalid (bad "
            "input, refused naming the field) or error (a fault of corral's)",
            ["verb", "outcome"],
            registry=r,
        )
        # Which target workload fgd and fgd-priced use, set by the extender at its start and at each adoption.
        self.workload_source = Gauge(
            "corral_extender_workload_source",
            "1 for the target workload fgd and fgd-priced use now: default (the engine's generic one), learned (from "
            "the pods seen), given (--workload FILE)",
            ["source"],
            registry=r,
        )
        self.workload_types = Gauge(
            "corral_extender_workload_types", "Typical task types of the workload in use", registry=r
        )
        self.workload_pods = Gauge(
            "corral_extender_workload_pods_seen", "Pods the workload learner has counted (once per UID)", registry=r
        )
        self.workload_rebuilds = Gauge(
            "corral_extender_workload_rebuilds", "Learned workloads adopted since the start", registry=r
        )

    def answered(self, verb: str, status: int, seconds: float) -> None:
        self.requests.labels(verb, str(status)).inc()
        self.latency.labels(verb).observe(seconds)


class ExtenderCollector:
    """At scrape time, from the extender's cluster state: per node the GPUs and GPU compute granted to pods, and per
    pod and container its grant on each GPU (HAMi's names: namespaces and pod names, no more than `kubectl get pods`
    shows)."""

    def __init__(self, state: Any) -> None:
        self.state = state  # corral.k8s.state.ClusterState (its lock guards the snapshot)

    def collect(self) -> Iterator[Metric]:
        import numpy as np

        capacity = GaugeMetricFamily(
            "corral_node_gpu_milli_capacity", "GPU compute of the node (milli-GPU)", labels=["node"]
        )
        granted = GaugeMetricFamily(
            "corral_node_gpu_milli_granted", "GPU compute granted to pods on the node (milli-GPU)", labels=["node"]
        )
        busy = GaugeMetricFamily("corral_node_gpus_granted", "GPUs of the node with any share granted", labels=["node"])
        hami = ["podnamespace", "nodename", "podname", "containeridx", "deviceuuid", "zone"]
        pod_mem = GaugeMetricFamily(
            "vGPUMemoryAllocated", "GPU memory granted to the container (bytes; HAMi)", labels=hami
        )
        pod_core = GaugeMetricFamily("vGPUCoreAllocated", "GPU compute granted to the container (%; HAMi)", labels=hami)
        with self.state.lock:
            s = self.state.snapshot
            if s is not None:
                present = s.gpu_present
                used = np.where(present, 1000 - s.gpu_milli_free, 0)
                for i, name in enumerate(s.names):
                    capacity.add_metric([name], 1000 * int(s.gpu_count[i]))
                    granted.add_metric([name], int(used[i].sum()))
                    busy.add_metric([name], int((used[i] > 0).sum()))
            for rec in self.state.pods.values():  # per pod: what its assignment grants, container by container
                if rec.assignment is None:
                    continue
                namespace, _, pod = rec.name.partition("/")
                for container, slots in rec.assignment.containers.items():
                    for slot in slots:
                        at = [namespace, rec.node, pod, container, slot.uuid, HAMI_ZONE]
                        pod_mem.add_metric(at, slot.memory_mib * 2**20)
                        pod_core.add_metric(at, slot.milli / 10)
        yield from (capacity, granted, busy, pod_mem, pod_core)


class Joined:
    """Several collectors (or registries) as one, for `generate_latest`."""

    def __init__(self, *parts: Any) -> None:
        self.parts = parts

    def collect(self) -> Iterator[Metric]:
        for part in self.parts:
            yield from part.collect()


class DevicePluginMetrics:
    """The device plugin's: Allocate and PreStartContainer calls by resource and outcome; devices advertised and
    healthy are read from the plugins at scrape time."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.calls = Counter(
            "corral_device_plugin_allocations",
            "kubelet's Allocate and PreStartContainer calls per resource, by outcome (ok, refused)",
            ["resource", "call", "outcome"],
            registry=self.registry,
        )
        self.plugins: list[Any] = []  # corral.k8s.deviceplugin.CorralDevicePlugin, added as they are made

    def collect(self) -> Iterator[Metric]:
        advertised = GaugeMetricFamily(
            "corral_device_plugin_devices", "Device IDs advertised to kubelet per resource", labels=["resource"]
        )
        healthy = GaugeMetricFamily(
            "corral_device_plugin_devices_healthy", "Healthy device IDs advertised per resource", labels=["resource"]
        )
        gpus = GaugeMetricFamily(
            "corral_device_plugin_gpus_healthy",
            "GPUs (1) healthy or (0) not, per resource",
            labels=["resource", "UUID"],
        )
        for plugin in list(self.plugins):
            per = plugin.per_gpu
            good = [uuid for uuid, h in dict(plugin.health).items() if h == "Healthy"]
            advertised.add_metric([plugin.resource], per * len(plugin.gpus))
            healthy.add_metric([plugin.resource], per * len(good))
            for g in plugin.gpus:
                gpus.add_metric([plugin.resource, g.uuid], 1 if g.uuid in good else 0)
        yield from self.registry.collect()
        yield from (advertised, healthy, gpus)


def render_text(collector: Any) -> bytes:
    """Any collector (or `Joined` collectors) in Prometheus' text format."""
    return generate_latest(collector)
