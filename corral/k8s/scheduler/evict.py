"""Preemption carried out on the cluster: victims evicted through the Eviction API, PodDisruptionBudgets honoured, the
freed capacity held for the preemptor until it binds (the `Evictions` seam of corral.k8s.scheduler.tenancy).

    plan_round -> Preemption(preemptor, victims, allocation, why)
        | start(): a Hold (preemptor -> the allocation it gets), its victims queued; returns at once
        v
    eviction worker (a thread of its own, the scheduler's token bucket): POST pods/NAME/eviction per victim,
    policy/v1, the pod's own terminationGracePeriodSeconds (none sent), its UID as a precondition
        200/201  -> the victim is stopping: it keeps its resources in the books until it is gone (deleted)
        404/409  -> already gone, or another pod of that name now: counted as gone
        429      -> a disruption budget allows no disruption now: the preemption ends there (no other victim is
                    evicted for it), the budget counts as allowing none until its status changes, and no preemption
                    starts for COOLDOWN s; the preemptor waits and its reason names the budget
        other    -> the preemption ends with the error (same cool-down)
    every victim gone -> the hold is ready: the round places the preemptor on exactly the held allocation
    the hold ends: the preemptor bound (bound()), deleted, or bound elsewhere; or the deadline (the victims' longest
    grace period + HOLD_MARGIN) passes

While a hold lives, `busy()` is True (one preemption at a time: plan_round(preempt=False)) and the round grants the
held allocation on its snapshot under the preemptor's key (tenancy.plan_pods), so no other pod fits there, neither
while the victims terminate nor after. `stopping()` names the victims being evicted and every bound pod with a
deletionTimestamp (no second eviction of a pod already going); `protected()` names the bound pods a budget covers
that allows no disruption now (the planner never picks them). Beyond the seam plan_pods reads `victims_of` (released
on its view: what they hold is the preemptor's), `ready` (every victim gone: the preemptor binds) and `reason`; the
scheduler asks `wake_after` to look again when the next bound pod's minimum runtime ends.

Minimum runtime is the planner's (Running.started_at, from the pod's bind): a pod its controller re-creates after an
eviction is a new pod (a new UID) and counts from its own bind; nothing here is keyed by a pod's name.

Pods and budgets come from the scheduler's informer (`observed`/`listed`, for pods) and a watch of its own
(`PdbWatch`, for policy/v1 PodDisruptionBudgets). Everything written (evictions, events) goes through the worker,
never the placement loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter

from corral.k8s.client import JsonObj, KubeApiError
from corral.k8s.convert import TERMINAL_PHASES
from corral.k8s.scheduler.events import event_body, pod_ref, short
from corral.k8s.scheduler.wire import PDBS
from corral.model.resources import Allocation
from corral.tenancy.plan import Preemption

log = logging.getLogger("corral.k8s.scheduler.evict")

#: Seconds a hold outlives its victims' longest grace period: the preemptor binds within it once they are gone.
HOLD_MARGIN = 30.0
#: Seconds no preemption starts after one was refused or failed (a budget's 429): no storm of evictions elsewhere.
COOLDOWN = 10.0
#: Seconds a pod whose eviction was refused (429) is not picked again, whatever the budgets known say (a budget
#: the scheduler may not read, a status not seen yet).
REFUSED_FOR = 60.0
#: Kubernetes' default terminationGracePeriodSeconds.
DEFAULT_GRACE = 30.0
#: How often the worker looks at the holds' deadlines and the watch of budgets retries.
TICK = 0.5
RETRY = 2.0
_WHY = {
    "guarantee": "its queue is below its guarantee and this pod's queue borrows above its own",
    "priority": "it has a higher priority",
}


class EvictApi(Protocol):
    """What evictions call (WireKubeApi has them all)."""

    def evict_pod(self, namespace: str, name: str, uid: str = "") -> None: ...

    def create_event(self, namespace: str, event: JsonObj) -> None: ...


class ListWatchApi(Protocol):
    def list(self, kind: str, field_selector: str = "") -> tuple[list[JsonObj], str]: ...

    def watch(self, kind: str, resource_version: str, stop: threading.Event) -> Any: ...


class Limiter(Protocol):
    def acquire(self, stop: threading.Event | None = None) -> None: ...


# ---------------------------------------------------------------------------------------------------- budgets
def selects(selector: Any, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector against a pod's labels (policy/v1: an empty selector selects every pod of the
    namespace; a missing one, none). An operator not known selects nothing (never protects blindly)."""
    if not isinstance(selector, Mapping):
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(str(k)) != str(v):
            return False
    for e in selector.get("matchExpressions") or []:
        if not isinstance(e, Mapping):
            return False
        key, op, values = str(e.get("key", "")), e.get("operator"), [str(v) for v in e.get("values") or []]
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget as evictions read it."""

    namespace: str
    name: str
    selector: Any
    allows: bool  # its status allows a disruption now (and the API server has processed its spec)
    version: str

    @classmethod
    def of(cls, obj: JsonObj) -> Budget:
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        spec = obj.get("spec") or {}
        observed = int(status.get("observedGeneration") or 0)
        allowed = int(status.get("disruptionsAllowed") or 0)
        return cls(str(meta.get("namespace") or "default"), str(meta.get("name") or ""), spec.get("selector"),
                   allowed > 0 and observed >= int(meta.get("generation") or 0),
                   str(meta.get("resourceVersion") or ""))  # fmt: skip

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class _Pod:
    namespace: str
    name: str
    labels: Mapping[str, str]
    grace: float
    bound: bool
    deleting: bool


def _pod(obj: JsonObj) -> _Pod | None:
    meta, spec = obj.get("metadata"), obj.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        return None
    labels = meta.get("labels")
    grace = spec.get("terminationGracePeriodSeconds")
    return _Pod(str(meta.get("namespace") or "default"), str(meta.get("name") or ""),
                labels if isinstance(labels, dict) else {},
                float(grace) if isinstance(grace, int | float) and grace >= 0 else DEFAULT_GRACE,
                bool(spec.get("nodeName")), bool(meta.get("deletionTimestamp")))  # fmt: skip


# ---------------------------------------------------------------------------------------------------- holds
@dataclass
class Hold:
    """One preemption being carried out: what the preemptor gets, and the victims still to go."""

    preemptor: str
    name: str  # "namespace/name" of the preemptor
    allocation: Allocation
    why: Mapping[str, str]
    victims: dict[str, tuple[str, str]]  # uid -> (namespace, name), those not gone yet
    queued: list[str]  # victims whose eviction is not sent yet, in order
    deadline: float
    evicted: set[str] = field(default_factory=set)  # evictions the API server took

    @property
    def ready(self) -> bool:
        """Every victim is gone: the preemptor may bind on the allocation."""
        return not self.victims

    def waiting_text(self) -> str:
        names = ", ".join(f"{ns}/{n}" for ns, n in sorted(self.victims.values()))
        return f"preempting: waiting for {len(self.victims)} evicted pod(s) to terminate ({names}); what they free " \
               f"on {self.allocation.node} is held for this pod"  # fmt: skip


@dataclass(frozen=True)
class EvictionMetrics:
    evictions: Counter
    preemptions: Counter


def eviction_metrics(registry: CollectorRegistry) -> EvictionMetrics:
    """The scheduler's preemption counters, on its registry (SchedulerMetrics makes them; docs/metrics.md)."""
    return EvictionMetrics(
        Counter(
            "corral_scheduler_evictions",
            "Evictions sent for preemption, by result: evicted (the API server took it), refused (a disruption "
            "budget allows none now: 429), gone (the pod was already gone), failed (any other answer)",
            ["result"],
            registry=registry,
        ),
        Counter(
            "corral_scheduler_preemption_results",
            "Preemptions by how they ended: started, bound (the preemptor bound on what was held for it), refused "
            "(an eviction refused), failed, timeout (the hold's deadline passed), gone (the preemptor left)",
            ["result"],
            registry=registry,
        ),
    )


class Evictions:
    """The `Evictions` seam carried out through the Eviction API (see the module). `wake` is called when the round
    should look again (a hold ended or became ready, a budget changed). `threads` False: no worker thread (tests call
    `drain()` and `tick()`)."""

    def __init__(
        self,
        api: EvictApi,
        limiter: Limiter,
        wake: Callable[[], None] = lambda: None,
        metrics: EvictionMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        threads: bool = True,
        margin: float = HOLD_MARGIN,
        cooldown: float = COOLDOWN,
        host: str = "",
    ) -> None:
        self.api = api
        self.limiter = limiter
        self.wake = wake
        self.clock = clock
        self.margin = margin
        self.cooldown = cooldown
        self.host = host
        self.stop = threading.Event()
        self._lock = threading.Condition()
        self._jobs: deque[Callable[[], None]] = deque()
        self._holds: dict[str, Hold] = {}
        self._victim_of: dict[str, str] = {}  # victim uid -> preemptor key
        self._pods: dict[str, _Pod] = {}  # uid -> the pod, every pod the informer shows (pending ones for names)
        self._going: set[str] = set()  # bound pods with a deletionTimestamp (kept as they come: a round reads it)
        #: Pods already terminating at the first list (a restart's: perhaps the victims of a hold it lost), until gone
        #: or past their grace + margin: no preemption meanwhile, so that a restart does not evict others for them
        self._inherited: dict[str, float] = {}
        self._first_list = True
        self._budgets: dict[str, Budget] = {}  # "namespace/name" -> budget
        self._refused: dict[str, str] = {}  # budget key -> its version when an eviction was refused under it
        self._refused_pods: dict[str, float] = {}  # pod uid -> until when it is not picked (its eviction was refused)
        self._protected: frozenset[str] | None = frozenset()  # None: to compute again
        self._ended: dict[str, str] = {}  # preemptor key -> why its last preemption ended short
        self._quiet_until = -1e18
        self._wake_at = float("inf")  # wake_after's
        self.metrics = metrics if metrics is not None else eviction_metrics(CollectorRegistry(auto_describe=False))
        self.evictions = self.metrics.evictions
        self.preemptions = self.metrics.preemptions
        self._thread: threading.Thread | None = None
        if threads:
            self._thread = threading.Thread(target=self._work, name="corral-evictions", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self.stop.set()
        with self._lock:
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # ------------------------------------------------------------------ the seam
    def busy(self) -> bool:
        self._expire()
        with self._lock:
            now = self.clock()
            if self._inherited:
                self._inherited = {u: t for u, t in self._inherited.items() if t > now}
            return bool(self._holds) or now < self._quiet_until or bool(self._inherited)

    def stopping(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._going | self._victim_of.keys())

    def protected(self) -> frozenset[str]:
        with self._lock:
            if self._protected is None:
                self._protected = self._compute_protected()
            if self._refused_pods:
                now = self.clock()
                self._refused_pods = {u: t for u, t in self._refused_pods.items() if t > now}
                return self._protected | self._refused_pods.keys()
            return self._protected

    def held(self) -> Mapping[str, Allocation]:
        self._expire()
        with self._lock:
            return {k: h.allocation for k, h in self._holds.items()}

    def start(self, preemption: Preemption, victims: Sequence[tuple[str, str, str]]) -> None:
        now = self.clock()
        with self._lock:
            key = preemption.preemptor
            if key in self._holds or not victims:
                return
            me = self._pods.get(key)
            name = f"{me.namespace}/{me.name}" if me is not None else key
            grace = max((self._pods[u].grace if u in self._pods else DEFAULT_GRACE) for u, _, _ in victims)
            hold = Hold(key, name, preemption.allocation, dict(preemption.why),
                        {uid: (ns, n) for uid, ns, n in victims}, [uid for uid, _, _ in victims],
                        now + grace + self.margin)  # fmt: skip
            self._holds[key] = hold
            self._ended.pop(key, None)
            for uid, _, _ in victims:
                self._victim_of[uid] = key
            names = ", ".join(f"{ns}/{n}" for _, ns, n in victims)
            self.preemptions.labels("started").inc()
            self._post(lambda: self._evict_next(key))
        ns, pod = name.split("/", 1) if "/" in name else ("default", name)
        self._say(ns, pod, "Preempting",
                  f"corral preempts {len(victims)} pod(s) for this pod on {preemption.allocation.node}: {names}; "
                  "what they free is held for it", "Normal")  # fmt: skip

    def bound(self, key: str) -> None:
        with self._lock:
            hold = self._holds.get(key)
            if hold is None:
                return
            self._drop(hold)
            self.preemptions.labels("bound").inc()
        self.wake()

    # ------------------------------------------------------------------ beyond the seam: what the round also reads
    def ready(self, key: str) -> bool:
        """The preemptor's hold has every victim gone: it binds on exactly `held()[key]`."""
        with self._lock:
            hold = self._holds.get(key)
            return hold is not None and hold.ready

    def reason(self, key: str) -> str:
        """Why the preemptor waits, as far as its preemption goes ("" when nothing to say)."""
        with self._lock:
            hold = self._holds.get(key)
            if hold is not None:
                return "" if hold.ready else hold.waiting_text()
            return self._ended.get(key, "")

    def names(self, uid: str) -> tuple[str, str] | None:
        """(namespace, name) of a pod the informer showed, None for one it does not know (gone)."""
        with self._lock:
            pod = self._pods.get(uid)
            return None if pod is None else (pod.namespace, pod.name)

    def release(self, key: str, why: str) -> None:
        """End the preemptor's hold short (what was held for it cannot be had: `why` becomes its reason)."""
        with self._lock:
            hold = self._holds.get(key)
            if hold is not None:
                self._end(hold, "failed", f"preemption stopped: {why}")
        self.wake()

    def wake_after(self, seconds: float) -> None:
        """Have the round look again in `seconds` (a bound pod's minimum runtime ends then: a pod that waits may
        preempt it from that time, and nothing else would wake the round). The soonest asked for wins."""
        with self._lock:
            self._wake_at = min(self._wake_at, self.clock() + max(0.0, seconds))

    def victims_of(self, key: str) -> tuple[str, ...]:
        """The victims of the preemptor's hold still in the books (their allocations are part of what is held)."""
        with self._lock:
            hold = self._holds.get(key)
            return tuple(hold.victims) if hold is not None else ()

    # ------------------------------------------------------------------ what the informers tell
    def observed(self, kind: str, event: str, obj: JsonObj) -> None:
        if kind == PDBS:
            self._budget_event(event, obj)
            return
        if kind != "pods":
            return
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "") if isinstance(meta, dict) else ""
        if not uid:
            return
        status = obj.get("status") or {}
        gone = event == "DELETED" or (isinstance(status, dict) and status.get("phase") in TERMINAL_PHASES)
        woke = False
        with self._lock:
            old = self._pods.get(uid)
            if gone:
                self._pods.pop(uid, None)
                self._going.discard(uid)
                self._inherited.pop(uid, None)
                woke = self._gone(uid)
            else:
                pod = _pod(obj)
                if pod is None:
                    return
                self._pods[uid] = pod
                if pod.bound and pod.deleting:
                    self._going.add(uid)
                hold = self._holds.get(uid)
                if hold is not None and pod.bound:  # the preemptor bound (by us, or by someone else)
                    self._drop(hold)
                    self.preemptions.labels("bound").inc()
                    woke = True
                if self._budgets and (old is None or old.bound != pod.bound or old.labels != pod.labels
                                      or old.deleting != pod.deleting):  # fmt: skip
                    self._protected = None
            if gone and old is not None and self._budgets:
                self._protected = None
        if woke:
            self.wake()

    def listed(self, kind: str, items: list[JsonObj]) -> None:
        if kind == PDBS:
            with self._lock:
                self._budgets = {}
                for obj in items:
                    b = Budget.of(obj)
                    self._budgets[b.key] = b
                self._protected = None
            self.wake()
            return
        if kind != "pods":
            return
        seen: dict[str, _Pod] = {}
        for obj in items:
            meta = obj.get("metadata") or {}
            status = obj.get("status") or {}
            uid = str(meta.get("uid") or "") if isinstance(meta, dict) else ""
            if not uid or (isinstance(status, dict) and status.get("phase") in TERMINAL_PHASES):
                continue
            pod = _pod(obj)
            if pod is not None:
                seen[uid] = pod
        woke = False
        with self._lock:
            for uid in [u for u in self._pods if u not in seen]:
                woke = self._gone(uid) or woke
            self._pods = seen
            self._going = {u for u, p in seen.items() if p.bound and p.deleting}
            if self._first_list:
                self._first_list = False
                self._inherited = {u: self.clock() + seen[u].grace + self.margin for u in self._going}
            else:
                self._inherited = {u: t for u, t in self._inherited.items() if u in seen}
            self._protected = None
            for key in [k for k, h in self._holds.items() if k in seen and seen[k].bound]:
                self._drop(self._holds[key])
                self.preemptions.labels("bound").inc()
                woke = True
        if woke:
            self.wake()

    def _gone(self, uid: str) -> bool:
        """A pod left (under the lock): a victim's share of a hold is free, a preemptor's hold ends. True: wake."""
        key = self._victim_of.pop(uid, None)
        if key is not None:
            hold = self._holds.get(key)
            if hold is not None:
                hold.victims.pop(uid, None)
                if uid in hold.queued:
                    hold.queued.remove(uid)
                return hold.ready
        hold = self._holds.get(uid)
        if hold is not None:
            self._end(hold, "gone", f"the preemptor {hold.name} was deleted")
            return True
        return False

    def _budget_event(self, event: str, obj: JsonObj) -> None:
        b = Budget.of(obj)
        with self._lock:
            old = self._budgets.get(b.key)
            if event == "DELETED":
                self._budgets.pop(b.key, None)
                self._refused.pop(b.key, None)
            else:
                self._budgets[b.key] = b
                if self._refused.get(b.key) not in (None, b.version):
                    del self._refused[b.key]  # its status changed since the refusal: believed again
            self._protected = None
            # the round looks again when a budget may let a pod be preempted now (not at every status write)
            freed = old is not None and (event == "DELETED" or (b.allows and not old.allows))
        if freed:
            self.wake()

    def _compute_protected(self) -> frozenset[str]:
        """Bound pods covered by a budget that allows no disruption now (under the lock)."""
        blocking = [b for b in self._budgets.values() if not b.allows or b.key in self._refused]
        if not blocking:
            return frozenset()
        by_ns: dict[str, list[Budget]] = {}
        for b in blocking:
            by_ns.setdefault(b.namespace, []).append(b)
        return frozenset(uid for uid, p in self._pods.items()
                         if p.bound and not p.deleting and p.namespace in by_ns
                         and any(selects(b.selector, p.labels) for b in by_ns[p.namespace]))  # fmt: skip

    def budgets_of(self, namespace: str, labels: Mapping[str, str]) -> list[str]:
        """The budgets ("namespace/name") that cover a pod of `namespace` with `labels`."""
        with self._lock:
            return sorted(b.key for b in self._budgets.values()
                          if b.namespace == namespace and selects(b.selector, labels))  # fmt: skip

    # ------------------------------------------------------------------ holds ending
    def _drop(self, hold: Hold) -> None:
        """Forget a hold (under the lock); victims still going stay `stopping` through their deletionTimestamp."""
        self._holds.pop(hold.preemptor, None)
        for uid in list(hold.victims):
            if self._victim_of.get(uid) == hold.preemptor:
                del self._victim_of[uid]

    def _end(self, hold: Hold, result: str, why: str) -> None:
        """A hold ends short (under the lock): its reason kept for the preemptor, a Warning event, a cool-down."""
        self._drop(hold)
        self.preemptions.labels(result).inc()
        if result != "gone":
            self._ended[hold.preemptor] = why
            self._quiet_until = self.clock() + self.cooldown
            ns, name = hold.name.split("/", 1) if "/" in hold.name else ("default", hold.name)
            self._post(lambda: self._event(ns, name, "PreemptionStopped", why, "Warning"))
        log.info("preemption for %s ended: %s", hold.name, why)

    def _expire(self) -> None:
        now = self.clock()
        ended = False
        with self._lock:
            if now >= self._wake_at:
                self._wake_at = float("inf")
                ended = True
            for hold in [h for h in self._holds.values() if now >= h.deadline]:
                left = ", ".join(f"{ns}/{n}" for ns, n in sorted(hold.victims.values()))
                if hold.victims:
                    why = (f"preemption stopped: {len(hold.victims)} evicted pod(s) still terminating past the "
                           f"deadline ({left}); what was held for this pod is free again")  # fmt: skip
                else:
                    why = "preemption stopped: this pod did not bind on what was held for it before the deadline"
                self._end(hold, "timeout", why)
                ended = True
        if ended:
            self.wake()

    # ------------------------------------------------------------------ the worker
    def _post(self, job: Callable[[], None]) -> None:
        """Queue I/O for the worker (under or outside the lock)."""
        with self._lock:
            self._jobs.append(job)
            self._lock.notify()

    def drain(self) -> None:
        """Run every queued job now, in this thread (tests without the worker)."""
        while True:
            with self._lock:
                if not self._jobs:
                    return
                job = self._jobs.popleft()
            job()

    def tick(self) -> None:
        self._expire()

    def _work(self) -> None:
        while not self.stop.is_set():
            with self._lock:
                if not self._jobs:
                    self._lock.wait(TICK)
                job = self._jobs.popleft() if self._jobs else None
            try:
                if job is not None:
                    job()
                self._expire()
            except Exception:  # a bug of ours: the worker must live on
                log.exception("an eviction job failed")

    def _evict_next(self, key: str) -> None:
        """Send the next victim's eviction of the preemptor's hold; queue the one after."""
        with self._lock:
            hold = self._holds.get(key)
            if hold is None or not hold.queued:
                return
            uid = hold.queued.pop(0)
            ns, name = hold.victims.get(uid, ("", ""))
            if not name:
                self._post(lambda: self._evict_next(key))
                return
            why = hold.why.get(uid, "priority")
            by = hold.name
        self.limiter.acquire(self.stop)
        result, error = "evicted", ""
        try:
            self.api.evict_pod(ns, name, uid)
        except KubeApiError as exc:
            error = str(exc)
            result = "gone" if exc.status in (404, 409) else "refused" if exc.status == 429 else "failed"
        except Exception as exc:  # the client's own faults: this preemption ends
            error, result = f"{type(exc).__name__}: {exc}", "failed"
        self.evictions.labels(result).inc()
        woke = False
        with self._lock:
            hold = self._holds.get(key)
            if result == "evicted":
                if hold is not None:
                    hold.evicted.add(uid)
                    self._post(lambda: self._evict_next(key))
            elif result == "gone":
                if hold is not None:
                    hold.victims.pop(uid, None)
                    self._victim_of.pop(uid, None)
                    woke = hold.ready
                    self._post(lambda: self._evict_next(key))
            elif hold is not None:
                if result == "refused":
                    pod = self._pods.get(uid)
                    budgets = sorted(b.key for b in self._budgets.values()
                                     if pod is not None and b.namespace == pod.namespace
                                     and selects(b.selector, pod.labels))  # fmt: skip
                    for b in budgets:
                        self._refused[b] = self._budgets[b].version
                    self._refused_pods[uid] = self.clock() + REFUSED_FOR
                    self._protected = None
                    named = f"PodDisruptionBudget {', '.join(budgets)}" if budgets else "a PodDisruptionBudget"
                    why_ = (f"preemption stopped: the eviction of {ns}/{name} was refused by {named}, which allows "
                            f"no disruption now ({error}); corral tries again once the budget allows one")  # fmt: skip
                else:
                    why_ = f"preemption stopped: the eviction of {ns}/{name} failed: {error}"
                self._end(hold, result, why_)
                woke = True
        if result == "evicted":
            self._event(ns, name, "Preempted", f"preempted by pod {by} ({_WHY.get(why, why)}): evicted through the "
                        f"Eviction API with its own grace period", "Normal")  # fmt: skip
        else:
            if error:
                log.warning("evict %s/%s for %s: %s", ns, name, by, error)
        if woke:
            self.wake()

    def _say(self, namespace: str, name: str, reason: str, message: str, type_: str) -> None:
        self._post(lambda: self._event(namespace, name, reason, message, type_))

    def _event(self, namespace: str, name: str, reason: str, message: str, type_: str) -> None:
        body = event_body(namespace, pod_ref(namespace, name), reason, short(message), type_, self.host)
        self.limiter.acquire(self.stop)
        try:
            self.api.create_event(namespace, body)
        except KubeApiError as exc:
            log.warning("pod %s/%s: cannot write its %s event: %s", namespace, name, reason, exc)


class PdbWatch:
    """policy/v1 PodDisruptionBudgets across namespaces, listed then watched, into `Evictions` (an informer of its
    own: the scheduler's informers follow nodes and pods). A cluster where the scheduler may not read them (no RBAC)
    is logged once; the API server still refuses an eviction a budget forbids (429)."""

    def __init__(self, api: ListWatchApi, evictions: Evictions, retry: float = RETRY) -> None:
        self.api = api
        self.evictions = evictions
        self.retry = retry
        self.stop = threading.Event()
        self.synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._told = ""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="corral-watch-pdbs", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                items, version = self.api.list(PDBS)
                self.evictions.listed(PDBS, items)
                self.synced.set()
                self._told = ""
                for event, obj in self.api.watch(PDBS, version, self.stop):
                    self.evictions.observed(PDBS, event, obj)
            except KubeApiError as exc:
                if str(exc) != self._told:
                    self._told = str(exc)
                    log.warning("PodDisruptionBudgets: %s; trying again", exc)
                self.stop.wait(0 if exc.status == 410 else self.retry * (5 if exc.status in (401, 403, 404) else 1))
            except Exception:
                log.exception("watching PodDisruptionBudgets failed")
                self.stop.wait(self.retry)
