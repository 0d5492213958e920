"""The extender's view of the cluster: nodes from Node objects, allocations from Pod objects, one ClusterSnapshot.

    list nodes + pods  --replace-->  ClusterState  <--apply(event)--  watch nodes / pods (Informer threads)
                                        |  bind: reserve() before the Binding travels, so a second pod never gets
                                        |        the same GPU share; settle() with the Binding's answer; a pod
                                        v        already bound or being bound is never reserved again
                                  ClusterSnapshot (allocations keyed by pod UID)

Every pod that occupies a node counts (its CPU and memory), GPU pods also with the GPUs their `corral.dev/assignment`
annotation names. A pod's allocation is keyed by its UID, so the same pod seen twice (bind, then the watch event
of that bind, or a relist after a restart) is granted once: that is how a restarted extender rebuilds its state
without double booking. The snapshot is rebuilt only when the set of nodes or what they are changes; live GPU
utilisation updates it in place.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from corral.k8s.client import JsonObj, KubeApi, KubeApiError
from corral.k8s.convert import (
    TERMINAL_PHASES,
    Assignment,
    allocation_of,
    gpu_memory_by_model,
    hami_uuids,
    node_from_k8s,
    node_utilization,
    parse_assignment,
    pod_key,
    pod_name,
    pod_request,
)
from corral.model.errors import AllocationError, InvalidRequest
from corral.model.resources import Allocation, Node, Request
from corral.model.snapshot import ClusterSnapshot

log = logging.getLogger("corral.k8s.state")


@dataclass(frozen=True)
class PodRecord:
    key: str
    name: str
    node: str
    request: Request
    assignment: Assignment | None
    #: False for a bind of ours that the API server has not confirmed: in flight, or one whose answer was lost.
    confirmed: bool = True
    #: When the state learnt that the pod is bound (ClusterState.epoch()): a list begun before that cannot show it.
    epoch: int = 0
    #: GPU UUIDs another scheduler's record names for a pod without corral's assignment (HAMi's, convert.hami_uuids).
    named: tuple[str, ...] = ()


def unassigned_allocation(s: ClusterSnapshot, request: Request, node: str, i: int,
                          named: tuple[int, ...] = ()) -> Allocation:  # fmt: skip
    """The allocation of a GPU pod on node index `i` whose GPUs corral did not name (bound by another scheduler):
    the GPUs the other scheduler's record names (`named`, indices: HAMi's) where they all take the pod, else whole
    GPUs from the wholly free ones, lowest index first, and a share on the GPUs with the most room that still take
    it. Where too few are free the pod is charged those there are (the caller notes it), never a GPU twice."""
    from corral.model.resources import MILLI_PER_GPU, GpuGrant, affinity_tag

    free = s.gpu_milli_free[i]
    mem = s.gpu_mem_free[i]
    cap = s.gpu_mem_cap[i]
    count = int(s.gpu_count[i])
    whole = request.gpu_milli == MILLI_PER_GPU
    if whole:
        candidates = [j for j in range(count) if free[j] == MILLI_PER_GPU and mem[j] == cap[j]]
    else:
        room = [j for j in range(count) if free[j] >= request.gpu_milli and mem[j] >= request.gpu_memory_mib]
        candidates = sorted((j for j in room if free[j] > 0 or mem[j] > 0), key=lambda j: (-int(free[j]), j))
    if len(named) == request.gpu_count and len(set(named)) == len(named) and set(named) <= set(candidates):
        candidates = list(named)
    grants = tuple(
        GpuGrant(j, request.gpu_milli, int(cap[j]) if whole else request.gpu_memory_mib)
        for j in sorted(candidates[: request.gpu_count])
    )
    return Allocation(request_id=request.id, node=node, node_index=i, cpu_milli=request.cpu_milli,
                      memory_mib=request.memory_mib, gpus=grants, tag=affinity_tag(request),
                      share_owner="")  # fmt: skip


class BindConflict(AllocationError):
    """The pod is already bound (or being bound): Kubernetes never moves a bound pod, so neither does corral."""


class ClusterState:
    """Nodes, pods on nodes, and the snapshot the engine decides on. Guard every use with `lock`."""

    def __init__(self, node_check: Callable[[JsonObj, Node], str] | None = None) -> None:
        #: Says why a node that converts must still be ignored ("" when it may be used): the standalone scheduler's
        #: check that the GPU inventory annotation agrees with the node's own capacity.
        self.node_check = node_check
        #: Nodes ignored, by name: why (for the scheduler's events on them).
        self.ignored: dict[str, str] = {}
        self.lock = threading.RLock()
        self.nodes: dict[str, Node] = {}
        self.utilization: dict[str, list[float | None]] = {}
        self.pods: dict[str, PodRecord] = {}
        self.snapshot: ClusterSnapshot | None = None
        #: GPU model -> the largest memory of a GPU of it here (pod_request's gpu_memory: HAMi's percentages)
        self.gpu_memory: dict[str, int] = {}
        #: Bumped on every change that can alter a decision (cached decisions compare it).
        self.generation = 0
        #: Problems seen in the cluster's own objects (a damaged annotation, a pod the snapshot refused):
        #: kept for /status and logs, never raised into a scheduling answer.
        self.problems: list[str] = []
        #: Pods whose bind is in flight: their reservation survives a relist that does not show them bound yet.
        self._reserved: set[str] = set()
        #: "namespace/name" -> key (UID) of the pod of that name as the last view showed it, pending ones included:
        #: bind asks it whether the pod filter saw is still the pod of that name (`current`).
        self._names: dict[str, str] = {}
        self._epoch = 0

    # ------------------------------------------------------------------ nodes
    def _rebuild(self) -> None:
        self.gpu_memory = gpu_memory_by_model(self.nodes.values())
        if not self.nodes:
            self.snapshot = None
            self.generation += 1
            return
        names = sorted(self.nodes)
        self.snapshot = ClusterSnapshot([self.nodes[n] for n in names])
        for name in names:
            self._apply_utilization(name)
        for rec in self.pods.values():
            self._grant(rec)
        self.generation += 1

    def _apply_utilization(self, name: str) -> None:
        s = self.snapshot
        if s is None or name not in s.index:
            return
        i = s.index[name]
        values = self.utilization.get(name, [])
        for j in range(int(s.gpu_count[i])):
            s.set_gpu_utilization(i, j, values[j] if j < len(values) else None)

    def _node(self, obj: JsonObj) -> Node | None:
        """The node as corral uses it; None (and why, in `ignored`) where it cannot be used."""
        name = str(((obj.get("metadata") if isinstance(obj, dict) else None) or {}).get("name", ""))
        try:
            node = node_from_k8s(obj)
            why = self.node_check(obj, node) if self.node_check is not None else ""
        except InvalidRequest as exc:
            why = str(exc)
        if why:
            if self.ignored.get(name) != why:
                self._problem(f"node ignored: {why}")
            self.ignored[name] = why
            return None
        self.ignored.pop(name, None)
        return node

    def upsert_node(self, obj: JsonObj) -> None:
        node = self._node(obj)
        if node is None:
            return
        with self.lock:
            util = node_utilization(obj)
            changed_util = self.utilization.get(node.name) != util
            self.utilization[node.name] = util
            if self.nodes.get(node.name) != node:
                self.nodes[node.name] = node
                self._rebuild()
            elif changed_util:
                self._apply_utilization(node.name)
                self.generation += 1

    def remove_node(self, name: str) -> None:
        self.ignored.pop(name, None)
        with self.lock:
            if self.nodes.pop(name, None) is not None:
                self.utilization.pop(name, None)
                self._rebuild()

    def replace_nodes(self, objs: list[JsonObj]) -> None:
        with self.lock:
            self.nodes.clear()
            self.utilization.clear()
            self.ignored.clear()
            for obj in objs:
                node = self._node(obj)
                if node is None:
                    continue
                self.nodes[node.name] = node
                self.utilization[node.name] = node_utilization(obj)
            self._rebuild()

    # ------------------------------------------------------------------ pods
    # A pod's views, as the API server shows it: "bound" (spec.nodeName set, not finished), "pending" (no node yet),
    # or "gone" (finished, or unreadable). Kubernetes never unbinds a pod, so a pending view of a pod corral knows
    # bound is older than what corral knows (a watch event or a list that was already travelling when the Binding
    # landed): it is ignored, and the pod keeps its GPUs until it is deleted or finishes.
    def _grant(self, rec: PodRecord) -> bool:
        s = self.snapshot
        if s is None or rec.node not in s.index:
            return False  # granted when its node appears
        i = s.index[rec.node]
        try:
            if rec.assignment is None and rec.request.gpu_count:
                # A GPU pod bound by another scheduler (kube-scheduler, HAMi's) names no GPUs: charge free ones of its
                # node, so that two schedulers on one plane never count the same GPU free.
                node = self.nodes.get(rec.node)
                index = {g.uuid: g.index for g in node.gpus} if node is not None else {}
                named = tuple(index[u] for u in rec.named if u in index)
                alloc = unassigned_allocation(s, rec.request, rec.node, i, named)
                if len(alloc.gpus) < rec.request.gpu_count:
                    self._problem(f"pod {rec.name} on {rec.node}: asks for {rec.request.gpu_count} GPU(s) but only "
                                  f"{len(alloc.gpus)} are free there; charged those")  # fmt: skip
            else:
                alloc = allocation_of(rec.request, rec.assignment, rec.node, i)
            s.allocate(alloc)
        except AllocationError as exc:
            self._problem(f"pod {rec.name} on {rec.node} not counted: {exc}")
            return False
        return True

    def _view(self, obj: JsonObj, known: PodRecord | None = None) -> tuple[str, PodRecord | None]:
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        meta = obj.get("metadata") or {}
        if not isinstance(spec, dict) or not isinstance(status, dict) or not isinstance(meta, dict):
            return "gone", None
        if status.get("phase") in TERMINAL_PHASES:
            return "gone", None
        node = spec.get("nodeName")
        if not node:
            # Pending: holds nothing. An annotation without a node is no grant either: corral writes its assignment
            # only with the Binding, so a pending pod that carries one got it from someone else.
            return "pending", None
        try:
            assignment = parse_assignment(meta.get("annotations"))
        except InvalidRequest as exc:
            self._problem(f"pod {pod_name(obj)}: {exc}")
            assignment = None
        if assignment is not None and assignment.node != node:
            self._problem(f"pod {pod_name(obj)}: assignment names {assignment.node} but the pod runs on {node}")
            assignment = None
        if known is not None and known.node == node and known.assignment == assignment:
            # The same grant seen again (the watch event of corral's own Binding, a status update): what a bound pod
            # asks for does not change, so it is not read again (the pod's full read is most of an event's cost).
            return "bound", PodRecord(known.key, known.name, known.node, known.request, assignment, named=known.named)
        try:
            request = pod_request(obj, min_cpu_milli=0, gpu_memory=self.gpu_memory).request
        except InvalidRequest as exc:
            self._problem(f"pod {pod_name(obj)} on {node}: {exc}")
            return "gone", None
        named = hami_uuids(meta.get("annotations")) if assignment is None and request.gpu_count else ()
        return "bound", PodRecord(pod_key(obj), pod_name(obj), str(node), request, assignment, named=named)

    def upsert_pod(self, obj: JsonObj) -> None:
        """Follow one view of a pod (a watch event, or the pod read back after a bind)."""
        key = pod_key(obj)
        view, rec = self._view(obj, self.pods.get(key))
        with self.lock:
            self._names[pod_name(obj)] = key
            old = self.pods.get(key)
            if rec is None:
                if old is None:
                    return
                if view == "gone" or (not old.confirmed and key not in self._reserved):
                    self._drop(key)
                return  # pending, but known bound (the view is stale) or a bind of ours in flight
            rec = dataclasses.replace(rec, epoch=self._next_epoch())
            if old is not None and old.node == rec.node and old.assignment == rec.assignment:
                if not old.confirmed:
                    self.pods[key] = rec  # our bind, confirmed by the API server: same grant
                return  # already counted (e.g. the watch event of our own bind)
            if old is not None:
                self._drop(key)
            self.pods[key] = rec
            self._grant(rec)
            self.generation += 1

    def remove_pod(self, obj: JsonObj) -> None:
        with self.lock:
            key = pod_key(obj)
            name = pod_name(obj)
            if self._names.get(name) == key:
                del self._names[name]
            self._drop(key)

    def current(self, name: str, key: str) -> bool:
        """Whether the last view of pod `name` ("namespace/name") was the pod `key` (not deleted since, and not
        replaced by another pod of that name)."""
        with self.lock:
            return self._names.get(name) == key

    def _drop(self, key: str) -> None:
        self.pods.pop(key, None)
        s = self.snapshot
        if s is not None and key in s.allocations:
            s.release(key)
        self.generation += 1

    def epoch(self) -> int:
        """A mark to take before listing pods: `replace_pods(items, since=mark)` keeps what was learnt after it."""
        with self.lock:
            return self._epoch

    def _next_epoch(self) -> int:
        self._epoch += 1
        return self._epoch

    def replace_pods(self, objs: list[JsonObj], since: int | None = None) -> None:
        """Follow a full list of pods (an informer's list, or a restart); `since` is the epoch() taken before the
        list was asked for (None: the list is taken to be newer than anything the state knows)."""
        with self.lock:
            records: dict[str, PodRecord] = {}
            pending: set[str] = set()
            self._names = {pod_name(obj): pod_key(obj) for obj in objs}
            for obj in objs:
                view, rec = self._view(obj)
                if rec is not None:
                    records[rec.key] = rec
                elif view == "pending":
                    pending.add(pod_key(obj))
            for key, old in self.pods.items():
                if key in records:
                    continue
                # A bind in flight keeps its reservation; a pod known bound that the list shows pending keeps its
                # grant (the list is older than the Binding), and so does one learnt bound after the list was asked
                # for (the list may not show it at all). Any other pod missing from the list is gone.
                if (
                    key in self._reserved
                    or (old.confirmed and key in pending)
                    or (since is not None and old.confirmed and old.epoch > since)
                ):
                    records[key] = old
            self.pods = records
            s = self.snapshot
            if s is None:
                self._rebuild()
                return
            # The nodes are as they were: grant the pods into the same snapshot instead of building it again (at
            # 5,000 nodes the build is a good part of a restart's rebuilding of the books)
            for key in list(s.allocations):
                s.release(key)
            for rec in records.values():
                self._grant(rec)
            self.generation += 1

    # ------------------------------------------------------------------ bind
    def reserve(self, rec: PodRecord, alloc: Allocation) -> None:
        """Grant a bind's allocation now, before its Binding travels, so that no other bind gets the same GPU share.
        Raises BindConflict if the pod is already bound or being bound, AllocationError if it no longer fits."""
        with self.lock:
            if self.snapshot is None:
                raise AllocationError("no nodes known")
            self.check_unbound(rec.key, rec.name)
            self.snapshot.allocate(alloc)
            self.pods[rec.key] = rec
            self._reserved.add(rec.key)
            self.generation += 1

    def adopt(self, rec: PodRecord) -> None:
        """Record a bind in flight whose allocation the caller has already granted on the snapshot (the scheduler's
        batch step places and grants under this lock): reserve() without the second grant. Settle it as any other."""
        with self.lock:
            self.pods[rec.key] = rec
            self._reserved.add(rec.key)
            self.generation += 1

    def check_unbound(self, key: str, name: str) -> None:
        """Raise BindConflict if the pod is bound (or a bind of it is in flight or unanswered)."""
        with self.lock:
            held = self.pods.get(key)
            if held is None:
                return
            if key in self._reserved:
                raise BindConflict(f"a bind of pod {name} to {held.node} is already in flight")
            if not held.confirmed:
                raise BindConflict(f"a bind of pod {name} to {held.node} went unanswered; waiting to see the pod")
            raise BindConflict(f"pod {name} is already bound to {held.node}")

    def forget(self, key: str) -> None:
        """The pod is gone (read back as 404): drop what it held, unless a bind of it is in flight."""
        with self.lock:
            if key in self.pods and key not in self._reserved:
                self._drop(key)

    def settle(self, rec: PodRecord, outcome: str) -> None:
        """The Binding's answer: "bound" keeps the grant, "refused" gives it back, "unknown" (no answer: the Binding
        may or may not have landed) keeps it unconfirmed until the pod's next view or list says which."""
        with self.lock:
            self._reserved.discard(rec.key)
            if self.pods.get(rec.key) is not rec:
                return  # a view of the pod came first (bound by someone else, deleted): that is the truth now
            if outcome == "bound":
                self.pods[rec.key] = dataclasses.replace(rec, confirmed=True, epoch=self._next_epoch())
            elif outcome == "refused":
                self._drop(rec.key)

    def held(self, key: str) -> PodRecord | None:
        """The pod's record (bound, or a bind of ours in flight), None when it holds nothing."""
        with self.lock:
            return self.pods.get(key)

    def in_flight(self, key: str) -> bool:
        with self.lock:
            return key in self._reserved

    # ------------------------------------------------------------------ events
    def apply(self, kind: str, event: str, obj: JsonObj) -> None:
        if kind == "nodes":
            if event == "DELETED":
                self.remove_node(str((obj.get("metadata") or {}).get("name", "")))
            else:
                self.upsert_node(obj)
        elif event == "DELETED":
            self.remove_pod(obj)
        else:
            self.upsert_pod(obj)

    def _problem(self, text: str) -> None:
        log.warning(text)
        self.problems = [*self.problems[-99:], text]

    def status(self) -> dict[str, Any]:
        with self.lock:
            s = self.snapshot
            return {
                "nodes": len(self.nodes),
                "gpus": 0 if s is None else s.total_gpus,
                "pods": len(self.pods),
                "gpu_pods": sum(1 for p in self.pods.values() if p.assignment and p.assignment.slots),
                "gpu_allocated_milli": 0 if s is None else s.gpu_allocated_milli,
                "generation": self.generation,
                "problems": list(self.problems[-20:]),
            }


class Observer(Protocol):
    """Told of every change an Informer applies to the state, after it is applied (the standalone scheduler's queue)."""

    def observed(self, kind: str, event: str, obj: JsonObj) -> None: ...

    def listed(self, kind: str, items: list[JsonObj]) -> None: ...


class Informer:
    """Keeps a ClusterState current: list, then watch from that version; list again when the watch breaks.

    `observer` (optional) hears every event and every list after the state has taken it. `prime()` lists both kinds
    once, in the caller's thread, nodes first: the books are whole before anything is placed, and the watches then
    start from those lists' versions instead of listing a second time (at 50,000 pods a list is seconds)."""

    def __init__(
        self, api: KubeApi, state: ClusterState, retry_seconds: float = 2.0, observer: Observer | None = None
    ) -> None:
        self.api = api
        self.state = state
        self.retry_seconds = retry_seconds
        self.observer = observer
        self.stop = threading.Event()
        self.synced = {"nodes": threading.Event(), "pods": threading.Event()}
        self._threads: list[threading.Thread] = []
        self._versions: dict[str, str] = {}

    def sync_once(self) -> None:
        """List nodes and pods and replace the state (what a restart does)."""
        nodes, _ = self.api.list("nodes")
        self.state.replace_nodes(nodes)
        since = self.state.epoch()
        pods, _ = self.api.list("pods")
        self.state.replace_pods(pods, since)

    def prime(self) -> None:
        """List nodes and pods into the state (and the observer), nodes first; start() then watches from there.
        The pods' list is asked for at once, beside the nodes': at 50,000 pods the API server takes seconds to answer
        it, time the nodes' list and their conversion need not wait for."""
        # Tens of thousands of records are made here and kept: the collector's passes over them while they are made
        # find nothing to free
        enabled = gc.isenabled()
        gc.disable()
        since = self.state.epoch()
        got: dict[str, Any] = {}

        def fetch() -> None:
            try:
                got["pods"] = self.api.list("pods")
            except BaseException as exc:  # handed to the caller below
                got["error"] = exc

        pods = threading.Thread(target=fetch, name="corral-list-pods", daemon=True)
        pods.start()
        try:
            self._list("nodes")
            pods.join()
            if "error" in got:
                raise got["error"]
            self._list("pods", got["pods"], since)
        finally:
            if enabled:
                gc.enable()

    def _list(self, kind: str, listed: tuple[list[JsonObj], str] | None = None, since: int | None = None) -> str:
        if listed is None:
            since = self.state.epoch()
        items, version = listed if listed is not None else self.api.list(kind)
        if kind == "nodes":
            self.state.replace_nodes(items)
        else:
            self.state.replace_pods(items, since)
        if self.observer is not None:
            self.observer.listed(kind, items)
        self._versions[kind] = version
        self.synced[kind].set()
        return version

    def start(self) -> None:
        for kind in ("nodes", "pods"):
            t = threading.Thread(target=self._run, args=(kind,), name=f"corral-watch-{kind}", daemon=True)
            t.start()
            self._threads.append(t)

    def wait_synced(self, timeout: float) -> bool:
        return all(e.wait(timeout) for e in self.synced.values())

    def close(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=5)

    def _run(self, kind: str) -> None:
        apply = self.state.apply
        observer = self.observer
        while not self.stop.is_set():
            try:
                version = self._versions.pop(kind, None)
                if version is None:
                    version = self._list(kind)
                    self._versions.pop(kind, None)
                for event, obj in self.api.watch(kind, version, self.stop):
                    apply(kind, event, obj)
                    if observer is not None:
                        observer.observed(kind, event, obj)
            except KubeApiError as exc:
                log.warning("watch %s: %s; listing again", kind, exc)
                self.stop.wait(self.retry_seconds if exc.status != 410 else 0)
            except Exception:  # a watch thread must survive anything the client throws
                log.exception("watch %s failed; listing again", kind)
                self.stop.wait(self.retry_seconds)
