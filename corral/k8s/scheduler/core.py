"""The standalone scheduler's loop: informers in, decisions out, Bindings written by a pool.

    watch nodes/pods --Informer--> ClusterState (books: every bound pod, any scheduler's)
                          |
                          +--observed()--> queue: pods with spec.schedulerName == ours and no node, arrival order
                                              |  first arrival wakes the loop; after --batch-window-ms it takes them all
                                              v
                      place_batch(pods, snapshot, config) under the books' lock; every Bind adopted (charged) at once
                              |                                   |
                     Bind: bind pool (--bind-workers)        Wait: unschedulable set + the reason writer
                     token bucket (--qps/--burst),           (PodScheduled condition, FailedScheduling Events,
                     one POST per pod, annotations inside    a few per pod per minute, same token bucket)
                     settle(): bound keeps the charge,
                     refused/unknown gives it back and the pod is read again

A pod that cannot fit waits in the unschedulable set until capacity may have freed: a bound pod deleted or finished,
a node added or changed. Then every waiting pod goes back to the queue at once, in arrival order (no backoff timer).
A Binding that failed is retried after a short delay that grows with each failure of that pod (a webhook that
refuses it for good must not spin the loop).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import re
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from corral.k8s.client import JsonObj, KubeApi, KubeApiError
from corral.k8s.convert import TERMINAL_PHASES, pod_request
from corral.k8s.scheduler.batch import INVALID, Bind, Decision, Pending, Wait, place_batch
from corral.k8s.scheduler.events import event_body, now_iso, pod_ref, short
from corral.k8s.scheduler.evict import Evictions as ApiEvictions
from corral.k8s.scheduler.evict import PdbWatch
from corral.k8s.scheduler.gang import GANG_PARTIAL_SECONDS, GangInfo, GangRef, gang_of, min_member, queue_of
from corral.k8s.scheduler.metrics import SchedulerMetrics
from corral.k8s.scheduler.tenancy import (
    Bound,
    BoundRequests,
    Evictions,
    Face,
    Hold,
    NoEvictions,
    created_at,
    plan_pods,
    queue_for,
    settle,
    started_at,
    time_limit_of,
    victims_of,
)
from corral.k8s.state import ClusterState, Informer, PodRecord
from corral.model.errors import InvalidRequest
from corral.model.resources import Constraint, ConstraintOp, Node
from corral.placement import PlacementConfig
from corral.tenancy.config import DIMENSIONS as DIMENSION_NAMES
from corral.tenancy.config import QueuesConfig
from corral.tenancy.model import Running

log = logging.getLogger("corral.k8s.scheduler")

#: Most pods placed in one batch: a burst of thousands is cut so that the first Bindings travel while the rest place.
BATCH_MAX = 256
#: FailedScheduling events per pod in any EVENT_WINDOW seconds.
EVENTS_PER_WINDOW = 3
EVENT_WINDOW = 60.0
#: A pod's PodScheduled condition is patched when its reason changes, at most once in this many seconds.
CONDITION_EVERY = 10.0
#: ... and when only its place in its queue changed ("position i of n": every waiting pod's, whenever a pod arrives
#: or starts), at most once in one to two times this many (`corral k8s explain` and /explain say it live): a queue
#: of 10,000 pods rewrote 1,000 conditions a second, and that work (the API server's, and the scheduler's own for
#: the watch events it brings back) slowed the rounds on a shared machine (benchmarks/k8s_round_plane.py: a minute
#: still let the writes' bursts stretch one round in ten past 200 ms). Such a change sends no event.
CONDITION_POSITION_EVERY = 300.0
#: The queue position in a waiting pod's words (tenancy.held_text): what differs between two messages that say the
#: same thing about a pod whose place in line moved.
_POSITION = re.compile(r", position \d+ of \d+;")


def _placeless(message: str) -> str:
    """A pod's words without its place in line (", position i of n;" dropped): two messages that differ only in
    the place are the same news."""
    return _POSITION.sub(";", message)


def _move_wait(w: Waiting) -> float:
    """How long after its last write a pod's condition waits when only its place in line moved: one to two
    CONDITION_POSITION_EVERY, spread by the pod's number (a queue's pods all move at once, and their writes, and the
    watch events they bring back, would come due at once)."""
    return CONDITION_POSITION_EVERY * (1 + (w.seq % 64) / 64)


#: What a condition or event message may hold (the API server's events.k8s.io limit is 1 KiB).
#: Delay before a pod whose Binding failed is placed again: this x 2^(failures-1), at most BIND_RETRY_MAX.
BIND_RETRY = 0.05
BIND_RETRY_MAX = 10.0
#: A gang's PodGroup is read again when its copy is older than this (seconds).
GANG_INFO_TTL = 2.0
#: A gang whose PodGroup could not be used (not found yet, invalid, unreadable) has its waiting members placed again
#: (and so its PodGroup read again) after GANG_INFO_TTL, then twice as long each time, at most this (seconds).
GANG_RECHECK_MAX = 60.0


class TokenBucket:
    """A client rate limit: `qps` tokens a second, at most `burst` saved up; acquire() waits for one. Callers that
    come together each get their own slot in the future (the bucket goes into debt), so none waits twice."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if qps <= 0:
            raise InvalidRequest("--qps", f"must be > 0, got {qps:g}")
        if burst < 1:
            raise InvalidRequest("--burst", f"must be >= 1, got {burst}")
        self.qps = float(qps)
        self.burst = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._last = clock()
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """Take a token; the seconds to wait before using it (0: now)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def acquire(self, stop: threading.Event | None = None) -> None:
        wait = self.reserve()
        if wait > 0:
            if stop is not None:
                stop.wait(wait)
            else:
                time.sleep(wait)


@dataclass(eq=False)
class Waiting:
    """A pod of this scheduler without a node, as the scheduler follows it."""

    pending: Pending
    namespace: str
    name: str
    uid: str
    seq: int
    seen: float  # time.monotonic() when first seen
    reason: str = ""
    code: str = ""
    gist: str = ""  # the reason without its place in line (Wait.gist)
    failures: int = 0  # Bindings that failed in a row
    written: str = ""  # the condition message last patched
    written_at: float = -1e9
    since: str = ""  # when its condition first said Unschedulable (lastTransitionTime)
    due: bool = False  # a condition write waits for CONDITION_EVERY to be up
    due_at: float = 0.0  # (until then)
    events: list[float] = field(default_factory=list)  # when its FailedScheduling events were sent
    evented: str = ""  # the last event's message
    #: A pod corral could not read, kept with the cluster's GPU sizes it was read against: read again once those
    #: change (a HAMi percentage of GPU memory needs a GPU of its type to exist). None for a pod that was read.
    unread: tuple[JsonObj, dict[str, int]] | None = None
    tolerations: tuple[Mapping[str, Any], ...] = ()


#: A cordoned node (spec.unschedulable) as the taint Kubernetes gives it.
CORDON = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
_FENCING = ("NoSchedule", "NoExecute")


def fences(obj: JsonObj) -> tuple[Mapping[str, Any], ...]:
    """The taints of a node that keep pods off it (NoSchedule, NoExecute; a cordon counts as one)."""
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        return ()
    taints = spec.get("taints") or []
    out = (
        [t for t in taints if isinstance(t, Mapping) and t.get("effect") in _FENCING]
        if isinstance(taints, list)
        else []
    )
    if spec.get("unschedulable"):
        out.append(CORDON)
    return tuple(out)


def tolerates(tolerations: tuple[Mapping[str, Any], ...], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' rule: a toleration matches a taint's effect (or every effect) and its key (or every key, with
    operator Exists), and its value unless the operator is Exists."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        exists = t.get("operator") == "Exists"
        if not t.get("key"):
            if exists:
                return True
            continue
        if t.get("key") == taint.get("key") and (exists or (t.get("value") or "") == (taint.get("value") or "")):
            return True
    return False


def fenced_off(
    tolerations: tuple[Mapping[str, Any], ...], fenced: Mapping[str, tuple[Mapping[str, Any], ...]]
) -> Constraint | None:
    """The constraint that keeps a pod off the nodes whose taints it does not tolerate (None: it may go anywhere)."""
    names = sorted(n for n, taints in fenced.items() if not all(tolerates(tolerations, t) for t in taints))
    if not names:
        return None
    return Constraint("hostname", ConstraintOp.UNLIKE, "|".join(re.escape(n) for n in names))


_AFFINITY = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"


def affinity_constraints(affinity: Any) -> tuple[Constraint, ...]:
    """A pod's required node affinity as the engine's label constraints: one nodeSelectorTerm, its matchExpressions
    In, NotIn, Exists, DoesNotExist (and matchFields metadata.name In/NotIn). Raises InvalidRequest naming what it
    cannot place by (several terms, which Kubernetes ORs; Gt, Lt): such a pod waits saying so, never placed blind."""
    if not isinstance(affinity, Mapping):
        return ()
    node = affinity.get("nodeAffinity")
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(node, Mapping) else None
    if not isinstance(required, Mapping):
        return ()
    terms = required.get("nodeSelectorTerms") or []
    if not isinstance(terms, list) or not all(isinstance(t, Mapping) for t in terms):
        raise InvalidRequest(f"{_AFFINITY}.nodeSelectorTerms", "must be a list of terms")
    if len(terms) > 1:
        raise InvalidRequest(f"{_AFFINITY}.nodeSelectorTerms",
                             f"{len(terms)} terms (any of which may match): corral's scheduler takes one")  # fmt: skip
    out: list[Constraint] = []
    for term in terms:
        for kind in ("matchExpressions", "matchFields"):
            exprs = term.get(kind) or []
            where = f"{_AFFINITY}.nodeSelectorTerms[0].{kind}"
            if not isinstance(exprs, list):
                raise InvalidRequest(where, "must be a list")
            for i, e in enumerate(exprs):
                e = e if isinstance(e, Mapping) else {}
                key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
                if not isinstance(key, str) or not key or not isinstance(values, list):
                    raise InvalidRequest(f"{where}[{i}]", "needs a key, an operator and a list of values")
                if kind == "matchFields":
                    if key != "metadata.name":
                        raise InvalidRequest(f"{where}[{i}].key", f"{key!r}: only metadata.name is a node field")
                    key = "hostname"  # the engine's name for the node's name
                any_of = "|".join(re.escape(str(v)) for v in values)
                if op == "In":
                    out.append(Constraint(key, ConstraintOp.LIKE, any_of if values else "(?!)"))
                elif op == "NotIn":
                    if values:
                        out.append(Constraint(key, ConstraintOp.UNLIKE, any_of))
                elif op == "Exists" and kind == "matchExpressions":
                    out.append(Constraint(key, ConstraintOp.LIKE, ".*"))
                elif op == "DoesNotExist" and kind == "matchExpressions":
                    out.append(Constraint(key, ConstraintOp.UNLIKE, ".*"))
                else:
                    takes = "In, NotIn, Exists, DoesNotExist" if kind == "matchExpressions" else "In, NotIn"
                    raise InvalidRequest(f"{where}[{i}].operator", f"{op!r}: corral's scheduler takes {takes}")
    return tuple(out)


def pending_of(obj: JsonObj, gpu_memory: Mapping[str, int] | None = None) -> Pending:
    """A pod object -> what the batch step reads; a pod corral cannot read waits with the reason (no exception).
    `gpu_memory`: the cluster's GPUs (ClusterState.gpu_memory), which HAMi's percentages of GPU memory need."""
    from corral.k8s.convert import pod_key, pod_name

    key, name = pod_key(obj), pod_name(obj)
    try:
        ask = pod_request(obj, gpu_memory=gpu_memory)
        spec = obj.get("spec") or {}
        selector = spec.get("nodeSelector")
        extra: tuple[Constraint, ...] = ()
        if selector:
            if not isinstance(selector, Mapping):
                raise InvalidRequest("spec.nodeSelector", "must be an object of label -> value")
            extra = tuple(Constraint(str(k), ConstraintOp.IS, str(v)) for k, v in selector.items())
        extra += affinity_constraints(spec.get("affinity"))
        if extra:
            ask = dataclasses.replace(
                ask, request=dataclasses.replace(ask.request, constraints=(*ask.request.constraints, *extra))
            )
    except InvalidRequest as exc:
        return Pending(key, name, None, f"pod {name} cannot be scheduled: {exc}")
    except Exception as exc:  # anything else a hostile object trips: the pod waits, the rest goes on
        return Pending(key, name, None, f"pod {name} cannot be read: {type(exc).__name__}: {exc}")
    return Pending(key, name, ask)


def warm_up(config: PlacementConfig) -> None:
    """Load what the policy needs (numba's kernels, scipy for fgd-priced's prices) by placing two pods on a small
    snapshot of its own: nothing else is touched, and the first real batch finds it all loaded."""
    from corral.model.resources import GpuDevice, Node, Request
    from corral.model.snapshot import ClusterSnapshot
    from corral.placement import place

    gpus = tuple(GpuDevice(j, "warm-up", 81920, f"warm-up-{j}") for j in range(8))
    s = ClusterSnapshot([Node("gpu", 64000, 262144, gpus, {}), Node("cpu", 64000, 262144, (), {})])
    try:
        for r in (Request(cpu_milli=100, memory_mib=128, gpu_count=1, gpu_milli=1000, id="a"),
                  Request(cpu_milli=100, memory_mib=128, gpu_count=1, gpu_milli=500, id="b"),
                  Request(cpu_milli=100, memory_mib=128, id="c")):  # fmt: skip
            place(s, r, config)
    except Exception:  # a warm-up only: the first batch meets the same fault, and reports it
        log.exception("warming up the engine failed")


#: Node capacities that count a node's GPUs (a device plugin's), checked against its inventory annotation.
GPU_COUNT_RESOURCES = ("corral.dev/gpu", "nvidia.com/gpu")


def gpu_inventory_check(obj: JsonObj, node: Node) -> str:
    """Why a node's GPU inventory (the device plugin's annotation) cannot be believed, "" when it can: it lists more
    GPUs than the node's own capacity of a whole-GPU resource says it has. Placing by the annotation would send pods
    to GPUs that kubelet does not have; the node is left out until the two agree."""
    from corral.k8s.convert import ANN_NODE_GPUS, whole_number

    status = obj.get("status") or {}
    capacity = status.get("allocatable") or status.get("capacity") or {}
    if not node.gpus or not isinstance(capacity, Mapping):
        return ""
    for res in GPU_COUNT_RESOURCES:
        if res not in capacity:
            continue
        try:
            have = whole_number(capacity[res], f"status.allocatable[{res}]")
        except InvalidRequest as exc:
            return f"node {node.name}: {exc}"
        if have < len(node.gpus):
            return (f"node {node.name}: its {ANN_NODE_GPUS} annotation lists {len(node.gpus)} GPUs but its "
                    f"allocatable {res} is {have}; corral places nothing there until they agree")  # fmt: skip
    return ""


class Scheduler:
    """Schedules the pods whose spec.schedulerName is `name`. start() lists, rebuilds the books and starts the loop;
    close() stops it. Everything it writes goes through `limiter`."""

    def __init__(
        self,
        api: KubeApi,
        config: PlacementConfig,
        name: str = "corral",
        qps: float = 50.0,
        burst: int = 100,
        batch_window: float = 0.005,
        bind_workers: int = 16,
        metrics: SchedulerMetrics | None = None,
        queues: QueuesConfig | None = None,
        evictions: Evictions | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.check(qps, burst, batch_window, bind_workers)
        self.api = api
        self.config = config
        self.name = name
        self.batch_window = batch_window
        self.limiter = TokenBucket(qps, burst)
        self.metrics = metrics or SchedulerMetrics()
        self.state = ClusterState(node_check=gpu_inventory_check)
        self.informer = Informer(api, self.state, observer=self)
        self.stop = threading.Event()
        self.ready = threading.Event()
        self._cond = threading.Condition()
        self._active: dict[str, Waiting] = {}  # to place, in arrival order (seq)
        self._unschedulable: dict[str, Waiting] = {}
        self._inflight: dict[str, Waiting] = {}
        self._delayed: list[tuple[float, int, str]] = []  # (when, seq, key): failed Bindings waiting to be retried
        self._known: dict[str, Waiting] = {}  # every pod in one of the above
        self._left: set[str] = set()  # pods deleted or bound elsewhere while being placed
        self._retry = False
        self._seq = itertools.count()
        self._node_seen: dict[str, Any] = {}
        #: Nodes with taints that keep pods off (cordoned ones too): pods that do not tolerate them are not placed there
        self._fenced: dict[str, tuple[Mapping[str, Any], ...]] = {}
        self._node_told: dict[str, str] = {}  # the reason each ignored node was last told of (one event each)
        self._pool = ThreadPoolExecutor(max_workers=bind_workers, thread_name_prefix="corral-bind")
        self._writes: OrderedDict[str, Waiting] = OrderedDict()  # reasons to write, latest per pod
        self._write_cond = threading.Condition()
        self._due: list[tuple[float, int, Waiting]] = []  # conditions to write once CONDITION_EVERY is up
        self._threads: list[threading.Thread] = []
        self._host = socket.gethostname()
        #: The last outcome per pod name, for /explain of a pod that left the queues ("bound to N").
        self._outcomes: OrderedDict[str, str] = OrderedDict()
        #: Gangs: their PodGroups as last read (when, minMember, error), and their bound (or binding) members.
        self.gang_partial_seconds = GANG_PARTIAL_SECONDS
        self._gang_refs: dict[str, GangRef] = {}
        self._gang_info: dict[str, tuple[float, int, str]] = {}
        self._gang_bound: dict[str, dict[str, tuple[str, str]]] = {}  # gang -> pod key -> (namespace, name)
        self._gang_partial: dict[str, float] = {}  # gang -> since when it is bound short of minMember
        self._gang_rewake: set[str] = set()  # gangs woken while members were being placed: woken again after
        self._gang_recheck: dict[str, tuple[float, float]] = {}  # gang with a PodGroup error -> (when, step)
        #: Tenancy (--queues): the face kept across rounds, the bound pods of this scheduler, the last round's words
        #: per waiting pod and its Running records (for the ledger when they end), and how evictions are carried out.
        self.tenancy: Face | None = Face.of(queues, config) if queues is not None else None
        self.evictions: Evictions = evictions if evictions is not None else NoEvictions()
        self.clock = clock
        self._bound: dict[str, Bound] = {}
        self._holds: dict[str, Hold] = {}
        self._running: dict[str, Running] = {}
        self._running_shared = False  # `_running` is the face's (read only) until a pod's end copies it
        #: Preemption through the Eviction API (scheduler/evict.py), once `preempting()` is called: the informer's
        #: pods and a watch of PodDisruptionBudgets feed it; it is then `evictions` too.
        self._evicting: ApiEvictions | None = None
        self._pdbs: PdbWatch | None = None

    @staticmethod
    def check(qps: float, burst: int, batch_window: float, bind_workers: int) -> None:
        """Refuse settings that cannot work, naming the flag (before anything connects)."""
        TokenBucket(qps, burst)
        if bind_workers < 1:
            raise InvalidRequest("--bind-workers", f"must be >= 1, got {bind_workers}")
        if batch_window < 0:
            raise InvalidRequest("--batch-window-ms", f"must be >= 0, got {batch_window * 1000:g}")

    # ------------------------------------------------------------------ life
    def preempting(self) -> ApiEvictions:
        """Preemption on (before start()): victims evicted through the Eviction API, PodDisruptionBudgets watched,
        what victims free held for their preemptor (docs/k8s-scheduler.md, Preemption). The round reads it."""
        if self._evicting is None:
            self._evicting = ApiEvictions(self.api, self.limiter, wake=self._capacity_freed,  # type: ignore[arg-type]
                                          metrics=self.metrics.preemption, host=self._host)  # fmt: skip
            self._pdbs = PdbWatch(self.api, self._evicting)
            self.evictions = self._evicting
        return self._evicting

    def start(self) -> None:
        """List nodes and pods (the books from bound pods' annotations) and start watching and placing."""
        self.informer.prime()
        self.informer.start()
        self.start_loop()

    def start_loop(self) -> None:
        """Start placing (after informer.prime(): the books are whole before the first pod is placed)."""
        if self._pdbs is not None:
            self._pdbs.start()
        for target, name in ((self._loop, "corral-schedule"), (self._writer, "corral-reasons"),
                             (self._gang_watch, "corral-gangs")):  # fmt: skip
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        self.ready.set()

    def close(self) -> None:
        self.stop.set()
        with self._cond:
            self._cond.notify_all()
        with self._write_cond:
            self._write_cond.notify_all()
        self.informer.close()
        if self._pdbs is not None:
            self._pdbs.close()
        if self._evicting is not None:
            self._evicting.close()
        for t in self._threads:
            t.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------------ what the informer tells
    def observed(self, kind: str, event: str, obj: JsonObj) -> None:
        if kind == "nodes":
            self._node_event(event, obj)
            return
        if self._evicting is not None:
            self._evicting.observed(kind, event, obj)  # victims gone, preemptors bound, pods' labels for budgets
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        if not isinstance(meta, dict) or not isinstance(spec, dict) or not isinstance(status, dict):
            return
        from corral.k8s.convert import pod_key

        key = pod_key(obj)
        bound = bool(spec.get("nodeName"))
        running = bound and event != "DELETED" and status.get("phase") not in TERMINAL_PHASES
        self._gang_observed(key, obj, running)
        if self.tenancy is not None:
            self._tenancy_observed(key, obj, running)
        if event == "DELETED" or status.get("phase") in TERMINAL_PHASES:
            self._forget(key)
            if bound:
                self._capacity_freed()
            return
        if bound or meta.get("deletionTimestamp"):
            self._forget(key)
            return
        if spec.get("schedulerName") != self.name or key in self._known:
            return
        self._enqueue(obj, key)

    def listed(self, kind: str, items: list[JsonObj]) -> None:
        if kind == "nodes":
            for obj in items:
                self._node_event("ADDED", obj)
            self._capacity_freed()
            return
        from corral.k8s.convert import pod_key

        if self._evicting is not None:
            self._evicting.listed(kind, items)
        waiting: dict[str, JsonObj] = {}
        seen_bound: set[str] = set()
        holding: set[str] = set()
        for obj in items:
            spec, meta, status = obj.get("spec"), obj.get("metadata"), obj.get("status") or {}
            if not isinstance(spec, dict) or not isinstance(meta, dict) or not isinstance(status, dict):
                continue
            if (
                spec.get("nodeName")
                and status.get("phase") not in TERMINAL_PHASES
                and not meta.get("deletionTimestamp")
            ):
                seen_bound.add(pod_key(obj))
                self._gang_observed(pod_key(obj), obj, True)
            if self.tenancy is not None and spec.get("nodeName") and status.get("phase") not in TERMINAL_PHASES:
                self._tenancy_observed(pod_key(obj), obj, True)
                holding.add(pod_key(obj))  # (terminating ones too: they hold their GPUs until they are gone)
            if spec.get("nodeName") or spec.get("schedulerName") != self.name or meta.get("deletionTimestamp"):
                continue
            if status.get("phase") in TERMINAL_PHASES:
                continue
            waiting[pod_key(obj)] = obj
        with self._cond:
            # a gang's bound members as the list shows them (those deleted while the watch was down are dropped),
            # and those this scheduler is binding now
            for members in self._gang_bound.values():
                for k in [k for k in members if k not in seen_bound and k not in self._inflight]:
                    del members[k]
            gone = [k for k in self._known if k not in waiting and k not in self._inflight]
            # bound pods of ours deleted (or ended) while the watch was down: their runs go into the ledger
            ended = [k for k in self._bound if k not in holding and k not in self._inflight]
        for key in ended if self.tenancy is not None else ():
            self._tenancy_observed(key, {}, False)
        for key in gone:
            self._forget(key)
        for key, obj in waiting.items():
            if key not in self._known:
                self._enqueue(obj, key)
        self._capacity_freed()

    def _node_event(self, event: str, obj: JsonObj) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        why = self.state.ignored.get(name)
        if why and event != "DELETED" and self._node_told.get(name) != why:
            self._node_told[name] = why
            self._pool.submit(self._tell_node, name, why)
        fenced = fences(obj) if event != "DELETED" else ()
        if fenced:
            self._fenced[name] = fenced
        elif self._fenced.pop(name, None) is not None:
            self._capacity_freed()  # uncordoned, a taint removed
        node = self.state.nodes.get(name)
        if event == "DELETED" or node is None:
            self._node_seen.pop(name, None)
            return
        if self._node_seen.get(name) is not node:
            self._node_seen[name] = node
            self._capacity_freed()

    def _gang_observed(self, key: str, obj: JsonObj, bound: bool) -> None:
        """Follow a gang member's bound state (bound members count towards its minMember). A member being deleted
        (Terminating: its bound part deleted by corral, a rolling restart) no longer counts: the gang is placed
        again without it, and corral does not delete it twice."""
        ref = gang_of(obj)
        if ref is None:
            return
        meta = obj.get("metadata") or {}
        if isinstance(meta, Mapping) and meta.get("deletionTimestamp"):
            bound = False
        with self._cond:
            self._gang_refs.setdefault(ref.key, ref)
            members = self._gang_bound.setdefault(ref.key, {})
            if bound:
                if key not in members:
                    members[key] = (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
                    self._gang_wake(ref.key)
            elif members.pop(key, None) is not None:
                self._gang_wake(ref.key)  # its waiting members need more now: their reason changes

    def _tenancy_observed(self, key: str, obj: JsonObj, bound: bool) -> None:
        """Follow a bound pod of this scheduler for the queues: its queue, start and time limit (a Running each
        round); when it ends, its run goes into the fair-share ledger."""
        assert self.tenancy is not None
        spec = obj.get("spec") or {}
        meta = obj.get("metadata") or {}
        with self._cond:
            if not bound:
                b = self._bound.pop(key, None)
                if key in self._running and self._running_shared:  # (the round's own map: copied before a change)
                    self._running, self._running_shared = dict(self._running), False
                run = self._running.pop(key, None)
                if b is not None and run is not None and self.tenancy.tenancy is not None:
                    self.tenancy.tenancy.record(run, self.clock())  # its ledger is the face's
                return
            if spec.get("schedulerName") != self.name:
                return
            stopping = bool(meta.get("deletionTimestamp"))
            b = self._bound.get(key)
            if b is not None:
                if stopping and not b.stopping:
                    self._bound[key] = dataclasses.replace(b, stopping=True)
                return
            try:
                limit = time_limit_of(obj)
            except InvalidRequest:
                limit = None
            cfg = self.tenancy.config
            self._bound[key] = Bound(str(meta.get("namespace") or "default"), str(meta.get("name") or ""),
                                     queue_for(obj, cfg, self.tenancy.by_namespace),
                                     started_at(obj) or self.clock(), limit, stopping)  # fmt: skip

    def _gang_wake(self, gang: str) -> None:
        """Place a gang's waiting members again (a member came, was bound or left). Under self._cond. Members being
        placed now were placed with what was known before: the gang is woken again once they are back (the gangs'
        watch does it), else a change seen mid-batch is lost and its members keep a stale reason."""
        if any(w.pending.gang == gang for w in self._inflight.values()):
            self._gang_rewake.add(gang)
        woke = False
        for k, w in list(self._unschedulable.items()):
            if w.pending.gang == gang:
                del self._unschedulable[k]
                self._active[k] = w
                woke = True
        if woke:
            self._active = dict(sorted(self._active.items(), key=lambda kv: kv[1].seq))
            self._cond.notify()

    def _enqueue(self, obj: JsonObj, key: str) -> None:
        meta = obj.get("metadata") or {}
        p = pending_of(obj, self.state.gpu_memory)
        ref = gang_of(obj)
        p = dataclasses.replace(p, gang=ref.key if ref else "", queue=queue_of(obj))
        if self.tenancy is not None:
            p = self._tenancy_pending(p, obj)
        tol = (obj.get("spec") or {}).get("tolerations") or ()
        tolerations = tuple(t for t in tol if isinstance(t, Mapping)) if isinstance(tol, list) else ()
        w = Waiting(p, str(meta.get("namespace") or "default"), str(meta.get("name") or ""), str(meta.get("uid") or ""),
                    next(self._seq), time.monotonic(), tolerations=tolerations,
                    unread=None if p.ask is not None else (obj, self.state.gpu_memory))  # fmt: skip
        with self._cond:
            if key in self._known:
                return
            self._known[key] = w
            self._active[key] = w
            if ref is not None:
                self._gang_refs.setdefault(ref.key, ref)
                self._gang_wake(ref.key)
            self._cond.notify()

    def _tenancy_pending(self, p: Pending, obj: JsonObj) -> Pending:
        """A pending pod with what the queues read of it: its queue (label, else namespace's), namespace, age and
        time limit (a bad corral.dev/time-limit: the pod cannot be scheduled, saying so)."""
        assert self.tenancy is not None
        meta = obj.get("metadata") or {}
        ns = str(meta.get("namespace") or "default")
        queue = queue_for(obj, self.tenancy.config, self.tenancy.by_namespace)
        try:
            limit = time_limit_of(obj)
        except InvalidRequest as exc:
            return dataclasses.replace(p, ask=None, error=f"pod {p.name} cannot be scheduled: {exc}", queue=queue,
                                       namespace=ns)  # fmt: skip
        # Its age for the queue order: creationTimestamp is to the second, so pods created in one second would tie
        # (and go by UID, at random): within that second, the time this scheduler saw it orders them as they came.
        created = created_at(obj)
        seen = self.clock()
        created = min(max(seen, created), created + 0.999) if created else seen
        return dataclasses.replace(p, queue=queue, namespace=ns, created=created, time_limit_s=limit)

    def _forget(self, key: str) -> None:
        with self._cond:
            if key in self._inflight:
                self._left.add(key)  # being placed: dropped when its batch is done (a Binding's answer decides)
                return
            w = self._known.pop(key, None)
            if w is None:
                return
            self._active.pop(key, None)
            self._unschedulable.pop(key, None)
            self._holds.pop(key, None)
        if self.tenancy is not None:
            self.evictions.bound(key)

    def _capacity_freed(self) -> None:
        with self._cond:
            sizes = self.state.gpu_memory
            for w in self._unschedulable.values():
                if w.unread is not None and w.unread[1] != sizes:  # the GPUs it was read against changed: again
                    p = pending_of(w.unread[0], sizes)
                    old = w.pending
                    w.pending = dataclasses.replace(p, gang=old.gang, queue=old.queue, namespace=old.namespace,
                                                    created=old.created, time_limit_s=old.time_limit_s)  # fmt: skip
                    w.unread = None if p.ask is not None else (w.unread[0], sizes)
            if self._unschedulable:
                self._retry = True
                self._cond.notify()

    # ------------------------------------------------------------------ the loop
    def _take(self) -> list[Waiting]:
        """Wait for pods to place, let the window gather more, and take a batch (arrival order)."""
        with self._cond:
            while not self.stop.is_set():
                now = time.monotonic()
                while self._delayed and self._delayed[0][0] <= now:
                    _, _, key = heapq.heappop(self._delayed)
                    w = self._known.get(key)
                    if w is not None and key not in self._inflight:
                        self._active[key] = w
                if self._active or self._retry:
                    break
                timeout = min(1.0, self._delayed[0][0] - now) if self._delayed else 1.0
                self._cond.wait(timeout)
            if self.stop.is_set():
                return []
        if self.batch_window > 0:
            self.stop.wait(self.batch_window)
        with self._cond:
            if self.tenancy is not None:
                # A round with queues looks at every waiting pod: the order, the limits and the head's reservation
                # are the whole queue's (plan_round is built for it: 10,000 pods a round, BENCHMARKS.md).
                self._retry = False
                merged = list(self._active.values()) + list(self._unschedulable.values())
                merged.sort(key=lambda w: w.seq)
                self._active.clear()
                self._unschedulable.clear()
                for w in merged:
                    self._inflight[w.pending.key] = w
                return merged
            if self._retry:
                self._retry = False
                merged = list(self._active.values()) + list(self._unschedulable.values())
                merged.sort(key=lambda w: w.seq)
                self._unschedulable.clear()
                self._active = {w.pending.key: w for w in merged}
            batch: list[Waiting] = []
            for key in list(itertools.islice(self._active, BATCH_MAX)):
                batch.append(self._active.pop(key))
            gangs = {w.pending.gang for w in batch if w.pending.gang}
            if gangs:  # a gang is placed whole: its other waiting members come into this batch too
                for pool in (self._active, self._unschedulable):
                    for key in [k for k, w in pool.items() if w.pending.gang in gangs]:
                        batch.append(pool.pop(key))
                batch.sort(key=lambda w: w.seq)
            for w in batch:
                self._inflight[w.pending.key] = w
            return batch

    def _loop(self) -> None:
        while not self.stop.is_set():
            batch = self._take()
            if not batch:
                continue
            try:
                self._place(batch)
            except Exception:  # a bug of ours: the pods wait and the loop goes on
                log.exception("placing a batch of %d pods failed", len(batch))
                with self._cond:
                    for w in batch:
                        if self._inflight.pop(w.pending.key, None) is not None:
                            self._later(w)

    def _place(self, batch: list[Waiting]) -> None:
        state = self.state
        started = time.perf_counter()
        binds: list[tuple[Waiting, Bind, PodRecord]] = []
        waits: list[tuple[Waiting, Wait]] = []
        held: list[Waiting] = []
        gangs = self._gang_infos(batch)
        with state.lock:
            todo: list[Waiting] = []
            for w in batch:
                # a pod the books hold (a Binding of it unanswered, or bound and the watch not here yet) is not
                # placed twice: it is looked at again once its view comes
                (held if state.pods.get(w.pending.key) is not None else todo).append(w)
            by_key = {w.pending.key: w for w in todo}
            said: dict[str, str] = {}
            if self._fenced:
                fenced = [self._fenced_pending(w) for w in todo]
                pods = [p for p, _ in fenced]
                said = {p.key: text for p, text in fenced if text}
            else:  # (no node is fenced off: each pod as it is, without a call per pod)
                pods = [w.pending for w in todo]
            if self.tenancy is not None:
                decisions = self._plan(pods, gangs)
            else:
                decisions = (place_batch(pods, state.snapshot, self.config, gangs) if gangs
                             else place_batch(pods, state.snapshot, self.config))  # fmt: skip
            for d in decisions:
                w = by_key[d.pod.key]
                if isinstance(d, Bind):
                    assert d.pod.ask is not None
                    rec = PodRecord(d.pod.key, d.pod.name, d.allocation.node, d.pod.ask.request, d.assignment,
                                    confirmed=False)  # fmt: skip
                    state.adopt(rec)
                    binds.append((w, d, rec))
                    if self.tenancy is not None:
                        with self._cond:
                            self._bound[w.pending.key] = Bound(w.namespace, w.name, w.pending.queue, self.clock(),
                                                               w.pending.time_limit_s)  # fmt: skip
                    if w.pending.gang:
                        with self._cond:
                            self._gang_bound.setdefault(w.pending.gang, {})[w.pending.key] = (w.namespace, w.name)
                else:
                    text = said.get(d.pod.key)
                    if text and text in d.reason:
                        d = dataclasses.replace(d, reason=d.reason.replace(text, "taint not tolerated or cordoned"))
                    waits.append((w, d))
        self.metrics.batch_seconds.observe(time.perf_counter() - started)
        self.metrics.batch_size.observe(len(batch))
        with self._cond:
            for w in held:
                self._inflight.pop(w.pending.key, None)
                if not self._left_while_placed(w):
                    self._later(w)
            told: list[Waiting] = []
            moved: list[Waiting] = []
            inflight, left, known, unschedulable = self._inflight, self._left, self._known, self._unschedulable
            for w, d in waits:
                key = w.pending.key
                inflight.pop(key, None)
                if (key not in left or not self._left_while_placed(w)) and key in known:
                    # With queues every waiting pod is in every round: only a pod whose words changed is told
                    # again (its condition and an event), or thousands of unchanged reasons would be rewritten;
                    # one whose place in line alone moved (all behind a newcomer) is rewritten later (_moved).
                    if self.tenancy is None:
                        told.append(w)
                    elif w.reason != d.reason:
                        (moved if d.gist and w.gist == d.gist else told).append(w)
                    w.reason, w.code, w.gist = d.reason, d.code, d.gist
                    unschedulable[key] = w
        for w, d, rec in binds:
            self._pool.submit(self._bind, w, d, rec)
        if moved:
            told += self._moved(moved)
        for w in told if self.tenancy is not None else [w for w, _ in waits]:
            self._say_why(w)

    def _plan(self, pods: list[Pending], gangs: Mapping[str, GangInfo]) -> list[Decision]:
        """A round with queues (under the books' lock): plan_pods over every waiting pod, the bound pods of this
        scheduler as Running; preemptions handed to the evictions; each waiting pod's hold kept for explain and
        metrics."""
        assert self.tenancy is not None
        state = self.state
        now = self.clock()
        with self._cond:
            bound = dict(self._bound)
        # (no per-round maps of the tens of thousands of bound pods: the face names them and reads their requests
        # only when it needs to)
        r = plan_pods(self.tenancy, pods, state.snapshot, bound, now, gangs, self.evictions, None,
                      BoundRequests(state.pods, bound))  # fmt: skip
        waiting = r.plan is not None and not r.plan.preemptions and r.plan.reasons
        if self._evicting is not None and waiting and r.wake_at is not None:
            # pods wait: the round looks again when the next bound pod's minimum runtime ends (it may be preempted
            # from then; no event of the cluster's would say so)
            self._evicting.wake_after(r.wake_at - now)
        tenancy = self.tenancy.tenancy
        if r.plan is not None and tenancy is not None:
            self._round_views(r.plan.preemptions, bound)
        with self._cond:
            self._holds = r.holds
            if state.snapshot is not None:
                self._running, self._running_shared = r.running, True
        settle(self.tenancy)
        return r.decisions

    def _round_views(self, preemptions: Any, bound: Mapping[str, Bound]) -> None:
        """Carry out the round's preemptions: each one's victims to the evictions (which never block)."""
        for pr in preemptions:
            victims = victims_of(pr, bound)
            for v in pr.victims:
                if v in bound:
                    self.metrics.preemptions.labels(bound[v].queue).inc()
            log.info("preempting %s for %s", ", ".join(f"{bound[v].namespace}/{bound[v].name}" if v in bound else v
                                                        for v in pr.victims), pr.preemptor)  # fmt: skip
            self.evictions.start(pr, victims)

    def _gang_infos(self, batch: list[Waiting]) -> dict[str, GangInfo]:
        """The gangs of a batch: minMember from their PodGroups (read again when older than GANG_INFO_TTL) and how
        many of each are bound or binding."""
        out: dict[str, GangInfo] = {}
        now = time.monotonic()
        for gang in {w.pending.gang for w in batch if w.pending.gang}:
            with self._cond:
                ref = self._gang_refs.get(gang)
                cached = self._gang_info.get(gang)
                held = len(self._gang_bound.get(gang, {}))
            if ref is None:
                continue
            if cached is None or now - cached[0] >= GANG_INFO_TTL:
                group: JsonObj | None = None
                error = ""
                try:
                    group = self.api.get_pod_group(ref.api, ref.namespace, ref.name)
                except KubeApiError as exc:
                    if exc.status != 404:
                        error = f"cannot read PodGroup {ref.key} ({ref.api}): {exc}"
                n, why = min_member(ref, group)
                cached = (now, n, error or why)
                with self._cond:
                    self._gang_info[gang] = cached
                    if cached[2]:  # nothing else tells when the PodGroup is created, mended or readable: look again
                        _, step = self._gang_recheck.get(gang, (0.0, GANG_INFO_TTL / 2))
                        step = min(GANG_RECHECK_MAX, step * 2)
                        self._gang_recheck[gang] = (now + step, step)
                    else:
                        self._gang_recheck.pop(gang, None)
            out[gang] = GangInfo(ref, cached[1], held, cached[2])
        return out

    def _gang_watch(self) -> None:
        while not self.stop.wait(0.5):
            try:
                self._gang_recheck_due()
                self._check_partial()
            except Exception:
                log.exception("checking partly bound gangs failed")

    def _gang_recheck_due(self, now: float | None = None) -> None:
        """Wake the gangs whose PodGroup could not be used once their time to look again has come (their members
        wait in the unschedulable set, and a PodGroup's creation or repair wakes nothing else)."""
        now = time.monotonic() if now is None else now
        with self._cond:
            if not self._gang_recheck:
                return
            waiting = {w.pending.gang for w in self._known.values() if w.pending.gang}
            for gang, (when, step) in list(self._gang_recheck.items()):
                if gang not in waiting:
                    del self._gang_recheck[gang]
                elif now >= when:
                    self._gang_recheck[gang] = (float("inf"), step)  # until it is read again
                    self._gang_wake(gang)

    def _check_partial(self, now: float | None = None) -> None:
        """Delete the bound part of a gang that has been bound short of its minMember, with members still waiting,
        for longer than gang_partial_seconds (a Binding refused for good, a kill -9 mid-gang and the rest no longer
        fits): their controller recreates them and the gang is placed again whole. While members are binding the
        bound part is not deleted (their answers decide), but its clock runs on: a member whose Binding is retried
        and fails again and again (a webhook that times out) must not keep the gang partly bound for ever."""
        now = time.monotonic() if now is None else now
        doomed: list[tuple[str, int, int, list[tuple[str, str]]]] = []
        with self._cond:
            for gang in list(self._gang_rewake):
                if not any(w.pending.gang == gang for w in self._inflight.values()):
                    self._gang_rewake.discard(gang)
                    self._gang_wake(gang)
            if not self._gang_bound:
                return
            waiting: dict[str, int] = {}
            busy: set[str] = set()
            for k, w in self._known.items():
                if w.pending.gang:
                    waiting[w.pending.gang] = waiting.get(w.pending.gang, 0) + 1
                    if k in self._inflight:
                        busy.add(w.pending.gang)
            for gang, members in list(self._gang_bound.items()):
                if not members and gang not in waiting:
                    self._gang_bound.pop(gang, None)
                    self._gang_partial.pop(gang, None)
                    continue
                if gang in busy:
                    continue  # its members binding count as bound: the gang may look whole until they are answered
                info = self._gang_info.get(gang)
                short = info is not None and not info[2] and 0 < len(members) < info[1]
                if not short or gang not in waiting:
                    self._gang_partial.pop(gang, None)
                    continue
                since = self._gang_partial.setdefault(gang, now)
                if now - since >= self.gang_partial_seconds:
                    assert info is not None
                    doomed.append((gang, len(members), info[1], list(members.values())))
                    self._gang_partial.pop(gang, None)
        for gang, bound, need, pods in doomed:
            why = (f"gang {gang}: {bound} of {need} members bound for {self.gang_partial_seconds:g} s and the rest "
                   "cannot be placed; corral deletes the bound members so that their controller recreates them and "
                   "the gang is placed again whole")  # fmt: skip
            log.warning("%s", why)
            for ns, name in pods:
                self._tell_pod(ns, name, "CorralGangIncomplete", why)
                try:
                    self.api.delete_pod(ns, name)
                except KubeApiError as exc:
                    if exc.status != 404:
                        log.warning("gang %s: cannot delete pod %s/%s: %s", gang, ns, name, exc)

    def _tell_pod(self, namespace: str, name: str, reason: str, message: str) -> None:
        body = event_body(namespace, pod_ref(namespace, name), reason, short(message), "Warning", self._host)
        self.limiter.acquire(self.stop)
        try:
            self.api.create_event(namespace, body)
        except KubeApiError as exc:
            log.warning("pod %s/%s: cannot write its event: %s", namespace, name, exc)

    def _left_while_placed(self, w: Waiting) -> bool:
        """Whether the pod was deleted (or bound by someone else) while its batch was placed; forgets it if so.
        Called under self._cond."""
        key = w.pending.key
        if key not in self._left:
            return False
        self._left.discard(key)
        self._known.pop(key, None)
        return True

    def _fenced_pending(self, w: Waiting) -> tuple[Pending, str]:
        """The pod as the batch step reads it, kept off the tainted nodes it does not tolerate, and the words the
        engine will use for that constraint ("" where there is none)."""
        p = w.pending
        if not self._fenced or p.ask is None:
            return p, ""
        off = fenced_off(w.tolerations, dict(self._fenced))
        if off is None:
            return p, ""
        r = p.ask.request
        ask = dataclasses.replace(p.ask, request=dataclasses.replace(r, constraints=(*r.constraints, off)))
        return dataclasses.replace(p, ask=ask), f"constraint not met ({off.attribute} {off.op.value} {off.value})"

    def _later(self, w: Waiting) -> None:
        """Place the pod again after a delay that grows with its failures (under self._cond)."""
        if w.pending.key not in self._known:
            return
        delay = min(BIND_RETRY_MAX, BIND_RETRY * 2 ** max(0, w.failures - 1))
        heapq.heappush(self._delayed, (time.monotonic() + delay, w.seq, w.pending.key))
        self._cond.notify()

    # ------------------------------------------------------------------ binds
    def _bind(self, w: Waiting, d: Bind, rec: PodRecord) -> None:
        self.limiter.acquire(self.stop)
        sent = time.perf_counter()
        outcome = "unknown"
        error = books = ""
        try:
            self.api.create_binding(w.namespace, w.name, w.uid, d.allocation.node, d.annotations)
            outcome = "bound"
        except KubeApiError as exc:
            outcome = "refused" if exc.status is not None and 400 <= exc.status < 500 else "unknown"
            error = str(exc)
            # 409 "already assigned" may answer our own Binding, landed and sent again by the client on a reused
            # connection: the books keep its charge until the pod is read back (_follow), not give it to another pod
            books = "unknown" if exc.status == 409 else outcome
        except Exception as exc:  # the client's own faults: the answer is unknown
            error = f"{type(exc).__name__}: {exc}"
        took = time.perf_counter() - sent
        self.state.settle(rec, books or outcome)
        self.metrics.binds.labels(outcome).inc()
        self.metrics.bind_latency.observe(took)
        if outcome == "bound":
            self.metrics.e2e_latency.observe(time.monotonic() - w.seen)
            self._done(w.pending.key)
            self._outcome(w, f"bound to {d.allocation.node}")
            return
        log.warning("bind %s to %s: %s", w.pending.name, d.allocation.node, error)
        self._follow(w, error)

    def _follow(self, w: Waiting, error: str) -> None:
        """After a Binding that failed or went unanswered: read the pod, so the books follow the API server, and
        place it again (after a short delay) if it still waits."""
        from corral.k8s.convert import pod_key

        key = w.pending.key
        pod: JsonObj | None = None
        try:
            pod = self.api.get_pod(w.namespace, w.name)
        except KubeApiError as exc:
            if exc.status == 404:
                self._done(key, gone=True)
                return
        if pod is not None and pod_key(pod) != key:
            self._done(key, gone=True)  # another pod of that name now: this one is gone
            return
        node = (pod.get("spec") or {}).get("nodeName") if pod is not None else None
        if pod is not None and node:
            self.state.upsert_pod(pod)
            self._done(key)
            self._outcome(w, f"bound to {node}")
            return
        if pod is not None:
            self.state.upsert_pod(pod)  # pending: an unanswered Binding's charge is given back
            if w.pending.gang:
                with self._cond:
                    self._gang_bound.get(w.pending.gang, {}).pop(key, None)
        with self._cond:
            self._inflight.pop(key, None)
            if self._left_while_placed(w):
                return
            w.failures += 1
            w.reason, w.code = f"the Binding failed: {error}", "bind_failed"
            self._later(w)

    def _done(self, key: str, gone: bool = False) -> None:
        """The pod needs nothing more of the scheduler (bound, or `gone`: deleted, its charge dropped)."""
        if gone:
            self.state.forget(key)
        with self._cond:
            self._inflight.pop(key, None)
            self._known.pop(key, None)
            self._left.discard(key)
            self._holds.pop(key, None)
        if self.tenancy is not None:
            self.evictions.bound(key)  # a preemptor's held capacity ends (bound, or gone)

    def _outcome(self, w: Waiting, text: str) -> None:
        with self._cond:
            self._outcomes[w.pending.name] = text
            self._outcomes.move_to_end(w.pending.name)
            while len(self._outcomes) > 10000:
                self._outcomes.popitem(last=False)

    # ------------------------------------------------------------------ why pending
    def _moved(self, moved: list[Waiting]) -> list[Waiting]:
        """Pods whose words changed only in their place in line: no event, and the condition rewritten once
        CONDITION_POSITION_EVERY is up (write_reason's rule), due here without a look by the writer at each pod every
        round (ten thousand pods move when one arrives ahead of them). Returns those the writer must see now: their
        last written words differ in more than the place (a write that failed, or none yet)."""
        now = time.monotonic()
        tell: list[Waiting] = []
        with self._write_cond:
            for w in moved:
                if w.due:
                    continue  # a write is due already: it writes the words of then
                if not w.written or _placeless(short(w.reason)) != _placeless(w.written):
                    tell.append(w)
                    continue
                w.due, w.due_at = True, max(now, w.written_at + _move_wait(w))
                heapq.heappush(self._due, (w.due_at, w.seq, w))
            self._write_cond.notify()
        return tell

    def _say_why(self, w: Waiting) -> None:
        with self._write_cond:
            self._writes[w.pending.key] = w
            self._writes.move_to_end(w.pending.key)
            self._write_cond.notify()

    def _writer(self) -> None:
        """Write pending reasons: the PodScheduled condition when the reason changed (at most every CONDITION_EVERY
        s per pod: a change that comes sooner is written when that time is up) and a FailedScheduling event per
        attempt (at most EVENTS_PER_WINDOW per pod per EVENT_WINDOW)."""
        while not self.stop.is_set():
            event = True
            with self._write_cond:
                while not self._writes and not self.stop.is_set():
                    now = time.monotonic()
                    if self._due and self._due[0][0] <= now:
                        break
                    self._write_cond.wait(min(1.0, self._due[0][0] - now) if self._due else 1.0)
                if self.stop.is_set():
                    return
                if self._writes:
                    _, w = self._writes.popitem(last=False)
                else:
                    _, _, w = heapq.heappop(self._due)
                    w.due = False
                    event = False  # only the condition, written late
            try:
                self.write_reason(w, event)
            except Exception:
                log.exception("writing the reason of %s failed", w.pending.name)

    def write_reason(self, w: Waiting, event: bool = True) -> None:
        with self._cond:
            if w.pending.key not in self._unschedulable:
                return  # placed or gone meanwhile
            message = short(w.reason)
        now = time.monotonic()
        gist = _placeless(message)
        moved = message != w.written and gist == _placeless(w.written)  # only its place in line changed
        every = _move_wait(w) if moved else CONDITION_EVERY
        if message != w.written and now - w.written_at < every:
            with self._write_cond:
                if not w.due or w.written_at + every < w.due_at:  # (a real change is not held to a move's wait)
                    w.due, w.due_at = True, w.written_at + every
                    heapq.heappush(self._due, (w.due_at, w.seq, w))
        elif message != w.written:
            w.since = w.since or now_iso()
            condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                         "lastProbeTime": None, "lastTransitionTime": w.since}  # fmt: skip
            self.limiter.acquire(self.stop)
            try:
                self.api.patch_pod_status(w.namespace, w.name, {"conditions": [condition]})
                w.written, w.written_at = message, now
                self.metrics.conditions.labels("patched").inc()
            except KubeApiError as exc:
                self.metrics.conditions.labels("failed").inc()
                log.warning("pod %s: cannot set its PodScheduled condition: %s", w.pending.name, exc)
        if not event or (message != w.evented and gist == _placeless(w.evented)):
            return  # (its place in line alone changed since its last event: no news for another)
        w.events = [t for t in w.events if now - t < EVENT_WINDOW]
        if len(w.events) >= EVENTS_PER_WINDOW:
            self.metrics.events.labels("suppressed").inc()
            return
        w.events.append(now)
        w.evented = message
        self.limiter.acquire(self.stop)
        try:
            self.api.create_event(w.namespace, self._event(w, message))
            self.metrics.events.labels("sent").inc()
        except KubeApiError as exc:
            self.metrics.events.labels("failed").inc()
            log.warning("pod %s: cannot write its FailedScheduling event: %s", w.pending.name, exc)

    def _tell_node(self, name: str, why: str) -> None:
        """A Warning event on a node corral ignores (cluster-scoped objects' events live in "default")."""
        self.limiter.acquire(self.stop)
        node = {"apiVersion": "v1", "kind": "Node", "name": name}
        body = event_body("default", node, "CorralIgnoresNode", short(why), "Warning", self._host)
        try:
            self.api.create_event("default", body)
        except KubeApiError as exc:
            log.warning("node %s: cannot write its event: %s", name, exc)

    def _event(self, w: Waiting, message: str) -> JsonObj:
        return event_body(w.namespace, pod_ref(w.namespace, w.name, w.uid), "FailedScheduling", message, "Warning",
                     self._host)  # fmt: skip

    # ------------------------------------------------------------------ read views
    def pending_by_reason(self) -> dict[str, int]:
        with self._cond:
            out: dict[str, int] = {}
            if self._active:
                out["queued"] = len(self._active)
            failed = {k for *_, k in self._delayed if k in self._known and k not in self._active}
            failed -= self._inflight.keys()
            if failed:
                out["bind_failed"] = len(failed)
            if self._inflight:
                out["binding"] = len(self._inflight)
            for w in self._unschedulable.values():
                out[w.code] = out.get(w.code, 0) + 1
            return out

    def queue_views(self) -> dict[str, Any]:
        """For /metrics: pending pods per queue, each queue's weighted dominant share and holdings (last round's)."""
        with self._cond:
            depth: dict[str, int] = {}
            for w in self._known.values():  # pods without a node (binding ones too)
                depth[w.pending.queue] = depth.get(w.pending.queue, 0) + 1
            running = list(self._running.values())
        face = self.tenancy
        if face is None:
            return {"pending": depth, "shares": {}, "holdings": {}}
        for q in face.config.queues:
            depth.setdefault(q, 0)
        t = face.tenancy
        if t is None:
            return {"pending": depth, "shares": {}, "holdings": {}}
        with self.state.lock:
            rows = t.shares(running, self.clock())["accounts"]
            holdings = {q: dict(zip(DIMENSION_NAMES, v, strict=True)) for q, v in t.usage.queue.items()}
        shares = {r["queue"]: float(r["dominant_share"]) / max(float(r["norm_shares"]), 1e-12)
                  for r in rows if r["user"] is None}  # fmt: skip
        return {"pending": depth, "shares": shares, "holdings": holdings}

    def explain(self, name: str) -> dict[str, Any]:
        """What the scheduler knows of pod "namespace/name": pending (with the reason), binding, bound, or unknown."""
        with self._cond:
            for w in self._known.values():
                if w.pending.name != name:
                    continue
                key = w.pending.key
                extra: dict[str, Any] = {"queue": w.pending.queue}
                if w.pending.gang:
                    extra["gang"] = w.pending.gang
                hold = self._holds.get(key)
                if hold is not None:
                    extra["position"] = hold.position
                    extra["of"] = hold.of
                    extra["held_by"] = hold.holds
                    if hold.estimated_start is not None:
                        extra["estimated_start"] = hold.estimated_start
                if key in self._inflight:
                    return {"pod": name, "state": "binding", "reason": "", **extra}
                if key in self._unschedulable:
                    code = INVALID if w.pending.ask is None else w.code
                    return {"pod": name, "state": "pending", "code": code, "reason": w.reason, **extra}
                return {"pod": name, "state": "queued", "reason": w.reason, **extra}
            outcome = self._outcomes.get(name)
        if outcome is not None:
            return {"pod": name, "state": "bound", "reason": outcome}
        return {"pod": name, "state": "unknown", "reason": f"corral's scheduler does not know pod {name}"}
