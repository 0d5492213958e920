"""The kube-scheduler extender: filter, prioritize, bind and preempt, decided by corral's placement engine.

    kube-scheduler --POST /filter {Pod, Nodes|NodeNames}-->  engine: feasible nodes + a reason for every other; with
                                                             `pick`, only the best of them (no prioritize follows)
                   --POST /prioritize {Pod, NodeNames}---->  engine's order: its choice 10, the rest 9..1, misfits 0
                   --POST /bind {PodName, PodNamespace, PodUID, Node}-->  the pod (filter's, or read), reserve GPUs,
                                                                           create the Binding carrying the assignment
                   --POST /preempt {Pod, NodeNameToMetaVictims}-->  the best node and the fewest lower-priority victims
                                                                    that make room there per GPU

The JSON keys are kube-scheduler's Go field names (its extender types carry no json tags). A decision made at filter
is kept for the pod until the cluster changes (keyed by pod UID and the state's generation), so prioritize and bind
reuse it; bind reserves filter's allocation if it is still free, else decides again, against the state of that moment,
so two binds never get the same GPU share. Bind follows the API server: the pod is the one filter saw only while the
watch shows that very pod, else it is read (a bound pod is refused: Kubernetes never moves one), the node and the
assignment land in one write (a refused Binding leaves the pod as it was), and after a refused or unanswered Binding
the pod is read back so that the state counts what the API server holds. Bad input (malformed JSON, invalid or huge
quantities, wrong types, conflicting requests, a wrong content type) gets the verb's refusal naming the field, logged
as one line, never a 500.

The hot path (every pod, every node kube-scheduler sends, two requests per pod with `pick`, three without) works on
the snapshot's node indices:

    NodeNames --NodeTable.lookup (cached: the full list, the list filter just passed)--> indices
    Verdict.bits[indices] --> passing / one group per distinct reason --> JSON joined from per-node fragments

so no per-request Python loop runs over thousands of names. `filter`/`prioritize` return plain dicts (the readable
form, used in-process); `filter_json`/`prioritize_json` write the same answers as bytes for the HTTP face, and the
tests check that the two agree.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from corral.k8s.client import JsonObj, KubeApi, KubeApiError
from corral.k8s.convert import (
    PodAsk,
    assignment_annotations,
    make_assignment,
    pod_key,
    pod_name,
    pod_request,
)
from corral.k8s.state import BindConflict, ClusterState, PodRecord
from corral.metrics import CONTENT_TYPE as METRICS_TYPE
from corral.metrics import ExtenderCollector, ExtenderMetrics, Joined, render_text
from corral.model.arrays import IntArray
from corral.model.errors import AllocationError, InvalidRequest
from corral.model.resources import Allocation, Constraint, ConstraintOp, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.placement.engine import validate_against
from corral.placement.explain import node_reason_text, render
from corral.placement.learned import WorkloadLearner, summary
from corral.placement.reasons import UNRESOLVABLE_BITS

log = logging.getLogger("corral.k8s.extender")

MAX_PRIORITY = 10  # kube-scheduler's MaxExtenderPriority
#: How many of the best nodes the engine ranks for prioritize (the rest that fit score 1).
TOP_RANKED = 32
UNKNOWN_NODE = "unknown to corral: the node is not in its cache (yet); is the corral device plugin running there?"
#: Verdicts kept, the most recent ones (filter and prioritize use those of the current generation; bind also tries an
#: older one's allocation, see _bind).
VERDICTS_KEPT = 256
#: How long after a preempt the preemptor's victims are read back from the API server when it is tried again.
EVICTION_WATCH_SECONDS = 30.0

ObjArray = npt.NDArray[np.object_]
_NO_NODES: IntArray = np.zeros(0, dtype=np.int64)
_SCORE_TAILS = tuple(b',"Score":%d}' % s for s in range(MAX_PRIORITY + 1))


def check_names(names: list[Any]) -> None:
    if not set(map(type, names)) <= {str}:
        raise InvalidRequest("ExtenderArgs.NodeNames", "expected a list of node names")


#: A Kubernetes object name (a DNS subdomain, RFC 1123): what a pod, namespace or node may be called, so anything
#: else in a bind is refused before it reaches a URL of the API server.
_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
MAX_UID = 128
#: The most NumPDBViolations taken at face value (kube-scheduler counts them in an int64; none is near this).
MAX_PDB_VIOLATIONS = 2**31


def _victims(args: Mapping[str, Any]) -> tuple[dict[str, list[str]], dict[str, int]]:
    """ExtenderPreemptionArgs' victims as {node: [pod key]} and {node: NumPDBViolations}, checked field by field.

    Victims come as MetaPods (`{"UID": ...}`) when the extender is nodeCacheCapable, else as whole Pods (keyed as
    everywhere else: UID, else namespace/name)."""
    meta = args.get("NodeNameToMetaVictims")
    field = "NodeNameToMetaVictims" if meta is not None else "NodeNameToVictims"
    by_node = meta if meta is not None else args.get("NodeNameToVictims")
    if by_node is None:
        return {}, {}
    if not isinstance(by_node, Mapping):
        raise InvalidRequest(field, "expected an object of node name -> victims")
    victims: dict[str, list[str]] = {}
    pdb: dict[str, int] = {}
    for node, vs in by_node.items():
        where = f"{field}[{node}]"
        vs = {} if vs is None else vs
        if not isinstance(vs, Mapping):
            raise InvalidRequest(where, "expected an object with Pods and NumPDBViolations")
        pods = vs.get("Pods") or []
        if not isinstance(pods, list):
            raise InvalidRequest(f"{where}.Pods", "expected a list of pods")
        keys = []
        for i, p in enumerate(pods):
            if not isinstance(p, Mapping):
                raise InvalidRequest(f"{where}.Pods[{i}]", "expected a pod object")
            if meta is None:
                keys.append(pod_key(p))
                continue
            uid = p.get("UID")
            if not isinstance(uid, str) or not uid:
                raise InvalidRequest(f"{where}.Pods[{i}].UID", "expected a non-empty string")
            keys.append(uid)
        n = vs.get("NumPDBViolations")
        n = 0 if n is None else n
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_PDB_VIOLATIONS:
            raise InvalidRequest(f"{where}.NumPDBViolations", f"expected a whole number 0..{MAX_PDB_VIOLATIONS}")
        victims[str(node)] = keys
        pdb[str(node)] = n
    return victims, pdb


@dataclass(frozen=True, eq=False)
class Lookup:
    """Requested node names as snapshot indices."""

    idx: IntArray  # per requested name, in request order: its index, -1 where corral does not know it
    known: IntArray  # `idx` without the unknown ones
    unknown: tuple[str, ...]


class NodeTable:
    """The snapshot's node names as indices and as JSON fragments, built once per set of node names.

    kube-scheduler asks about the same few lists over and over (every node it has, then the ones filter passed), so
    the last two lookups are kept: comparing two lists of names is one C loop, mapping them is a Python one.
    """

    def __init__(self, names: list[str]) -> None:
        self.names = list(names)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.name_array: ObjArray = np.array(self.names, dtype=object)
        self.quoted: ObjArray = np.array([orjson.dumps(n) for n in self.names], dtype=object)
        self._hosts: ObjArray | None = None
        self._recent: list[tuple[list[str], Lookup]] = []

    def __len__(self) -> int:
        return len(self.names)

    @property
    def hosts(self) -> ObjArray:
        """hosts[i, s]: node i's HostPriority with score s, as JSON (built at the first prioritize)."""
        if self._hosts is None:
            table = np.empty((len(self.names), len(_SCORE_TAILS)), dtype=object)
            for i, quoted in enumerate(self.quoted.tolist()):
                head = b'{"Host":' + quoted
                table[i] = [head + tail for tail in _SCORE_TAILS]
            self._hosts = table
        return self._hosts

    def lookup(self, names: list[str]) -> Lookup:
        for seen, found in self._recent:
            if seen == names:
                if seen is not self._recent[0][0]:
                    self.remember(seen, found)
                return found
        check_names(names)
        get = self.index.get
        idx: IntArray = np.array([get(n, -1) for n in names], dtype=np.int64)
        if len(idx) and idx.min() < 0:
            found = Lookup(idx, idx[idx >= 0], tuple(n for n, i in zip(names, idx.tolist(), strict=True) if i < 0))
        else:
            found = Lookup(idx, idx, ())
        self.remember(list(names), found)
        return found

    def remember(self, names: list[str], found: Lookup) -> None:
        self._recent = [(names, found), *self._recent[:1]]


@dataclass(frozen=True, eq=False)
class Verdict:
    """The engine's answer for one pod over the nodes corral knows, kept between filter, prioritize and bind."""

    generation: int
    request: Request
    ask: PodAsk
    table: NodeTable | None  # the snapshot's nodes (None: corral knows no nodes)
    bits: IntArray  # per snapshot node: the engine's reason bits, 0 where the pod fits (empty with `error`)
    fits: npt.NDArray[np.int8]  # per snapshot node: 1 where the pod fits (prioritize's base score)
    order: tuple[int, ...]  # the best feasible nodes (snapshot indices), best first, at most TOP_RANKED
    texts: Mapping[int, str]  # every distinct nonzero value of `bits` -> its reasons in words
    summary: str  # the one-line explanation
    allocation: Allocation | None  # the engine's own choice over all nodes
    error: str = ""  # the whole request is impossible here (e.g. a GPU model this cluster lacks)
    snapshot: ClusterSnapshot | None = None  # the snapshot `allocation` was made on

    def reason(self, node: int) -> str:
        """Why the pod does not fit on node index `node` ("" where it fits)."""
        if self.error:
            return self.error
        return self.texts.get(int(self.bits[node]), "")


@dataclass(frozen=True, eq=False)
class Group:
    """Rejected nodes that share one reason."""

    text: str
    unresolvable: bool
    idx: IntArray  # snapshot indices
    extra: tuple[str, ...] = ()  # names corral does not know


@dataclass(frozen=True, eq=False)
class FilterAnswer:
    table: NodeTable | None
    passing: IntArray  # snapshot indices of the nodes that fit, in request order
    groups: tuple[Group, ...]

    def _names(self, g: Group) -> list[str]:
        known: list[str] = [] if self.table is None else self.table.name_array[g.idx].tolist()
        return known + list(g.extra)

    def as_dict(self, node_objs: list[JsonObj] | None) -> JsonObj:
        failed: dict[str, str] = {}
        failed_unres: dict[str, str] = {}
        for g in self.groups:
            (failed_unres if g.unresolvable else failed).update(dict.fromkeys(self._names(g), g.text))
        passing: list[str] = [] if self.table is None else self.table.name_array[self.passing].tolist()
        nodes: Any = None
        node_names: Any = passing
        if node_objs is not None:
            keep = set(passing)
            nodes = {"metadata": {}, "items": [n for n in node_objs if (n.get("metadata") or {}).get("name") in keep]}
            node_names = None
        return {"Nodes": nodes, "NodeNames": node_names, "FailedNodes": failed,
                "FailedAndUnresolvableNodes": failed_unres, "Error": ""}  # fmt: skip

    def as_json(self) -> bytes:
        """The NodeNames answer as JSON, joined from the per-node fragments: one join per reason, not per node."""
        parts: dict[bool, list[bytes]] = {False: [], True: []}
        for g in self.groups:
            keys: list[bytes] = [] if self.table is None else self.table.quoted[g.idx].tolist()
            keys.extend(orjson.dumps(n) for n in g.extra)
            if keys:
                value = b":" + orjson.dumps(g.text)
                parts[g.unresolvable].append((value + b",").join(keys) + value)
        passing: list[bytes] = [] if self.table is None else self.table.quoted[self.passing].tolist()
        return b"".join((
            b'{"Nodes":null,"NodeNames":[', b",".join(passing),
            b'],"FailedNodes":{', b",".join(parts[False]),
            b'},"FailedAndUnresolvableNodes":{', b",".join(parts[True]),
            b'},"Error":""}',
        ))  # fmt: skip


def kube_preferences(pod: Mapping[str, Any]) -> bool:
    """Whether the pod states preferences that kube-scheduler's own scoring weighs (preferred node affinity,
    preferred pod affinity or anti-affinity, a topology spread constraint with ScheduleAnyway): for such a pod
    filter passes every node that fits, so that kube-scheduler adds its scores to corral's at prioritize."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return False
    affinity = spec.get("affinity")
    if isinstance(affinity, Mapping):
        for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
            terms = affinity.get(kind)
            if isinstance(terms, Mapping) and terms.get("preferredDuringSchedulingIgnoredDuringExecution"):
                return True
    spread = spec.get("topologySpreadConstraints")
    return isinstance(spread, list) and any(
        isinstance(c, Mapping) and c.get("whenUnsatisfiable") == "ScheduleAnyway" for c in spread
    )


class Extender:
    """kube-scheduler's verbs over corral's state and engine.

    `pick`: filter answers only the node corral picks among those that fit (the engine's best of the ones
    kube-scheduler sent) instead of all of them. With one node left kube-scheduler skips scoring altogether: no
    prioritize round trip and none of its own score plugins, for every pod, which is most of an extender's cost per
    pod (docs/kubernetes.md, "Throughput"). The pick is the node prioritize would have scored highest; with the
    chart's weight it was the node kube-scheduler chose anyway. Pods with preferences of their own that
    kube-scheduler scores (`kube_preferences`) still get every node that fits, and prioritize.
    """

    def __init__(
        self,
        state: ClusterState,
        api: KubeApi | None,
        config: PlacementConfig | None = None,
        pick: bool = False,
        learner: WorkloadLearner | None = None,
    ) -> None:
        self.state = state
        self.api = api
        self.config = config or PlacementConfig()
        self.pick = pick
        #: Learns the target workload (fgd, fgd-priced) from the pods seen; None: `config.workload` stays as given
        #: (a file's, or the engine's DEFAULT_WORKLOAD).
        self.learner = learner
        self._verdicts: OrderedDict[str, Verdict] = OrderedDict()
        self._pods: OrderedDict[str, JsonObj] = OrderedDict()  # recent Pod objects by UID, for bind
        self._table_for: ClusterSnapshot | None = None
        self._table: NodeTable | None = None
        #: Victims named at preempt, by preemptor: {preemptor key: (when, [(victim key, "ns/name")])}. kube-scheduler
        #: deletes them and tries the preemptor again, often before the watch tells corral they are gone.
        self._evicting: OrderedDict[str, tuple[float, list[tuple[str, str]]]] = OrderedDict()
        self.metrics = ExtenderMetrics()  # GET /metrics (corral.metrics); a counter's inc is a lock and an add
        _update_workload_gauges(self.metrics, self)
        log.info("%s", summary(self.config.workload, self.workload_source))

    # ------------------------------------------------------------------ decisions
    @staticmethod
    def _remember(store: OrderedDict[str, Any], key: str, value: Any, keep: int) -> None:
        store[key] = value
        store.move_to_end(key)
        while len(store) > keep:
            store.popitem(last=False)

    def verdict(self, pod: JsonObj, fresh: bool = False) -> Verdict:
        """The engine's answer for a pod (cached while the cluster is unchanged). Raises InvalidRequest.

        The cache is keyed by the pod's UID, which any caller may put in a body; `fresh` (bind) reuses a cached
        verdict only if it was made for what this pod asks for, so a bind always decides on the pod it binds."""
        key = pod_key(pod)
        if key in self._evicting and not fresh:  # bind (fresh) reads them back before it takes the state's lock
            self._see_evictions(key)
        with self.state.lock:
            cached = self._verdicts.get(key)
            ask = pod_request(pod, gpu_memory=self.state.gpu_memory) if fresh else None
            if cached is not None and cached.generation == self.state.generation and (ask is None or ask == cached.ask):
                return cached
            ask = ask or pod_request(pod, gpu_memory=self.state.gpu_memory)
            if self.learner is not None:
                self._learn(key, ask.request)
            verdict = self._decide(ask)
            # Verdicts of older generations stay (the most recent VERDICTS_KEPT): filter/prioritize never use them
            # again, but bind tries their allocation first, and with pick kube-scheduler filters the next pods
            # while the binds of the previous ones travel.
            self._remember(self._verdicts, key, verdict, VERDICTS_KEPT)
            self._remember(self._pods, key, pod, 1024)
            return verdict

    @property
    def workload_source(self) -> str:
        """Where the workload in use comes from: "learned", "default" (the engine's), or "given" (a file's)."""
        if self.config.workload is None:
            return "default"
        return "learned" if self.learner is not None else "given"

    def _learn(self, key: str, request: Request) -> None:
        """Count the pod (once per key) and, when the learner adopts a new workload, decide with it from now on.
        Called under the state's lock. A new workload makes the engine rebuild its per-workload caches, which is why
        the learner adopts one only every so many pods and only when it moved."""
        assert self.learner is not None
        s = self.state.snapshot
        if s is not None:
            # A pod no node of this cluster can ever serve (a GPU model or GPU memory it has nowhere, more GPUs than
            # any node) is not part of the workload it serves: counted, its type would only dilute the others. Not
            # remembered either, so it counts once the cluster has such a node.
            try:
                validate_against(s, request)
            except InvalidRequest:
                return
            if request.gpu_count > s.max_gpus:
                return
        if self.learner.observe(key, request, time.monotonic()):
            self.config = dataclasses.replace(self.config, workload=self.learner.workload)
            log.info("%s (from %d pods)", summary(self.config.workload, "learned"), self.learner.pods)
            _update_workload_gauges(self.metrics, self)

    def workload_status(self) -> dict[str, Any]:
        """/status's "workload": its source, and the learner's account when it learns."""
        out: dict[str, Any] = {"source": self.workload_source}
        w = self.config.workload
        if w is not None:
            out.update(types=len(w.types), tail=len(w.tail))
        if self.learner is not None:
            out["learner"] = self.learner.describe()
        return out

    def _see_evictions(self, preemptor: str) -> None:
        """Read back the victims named for this preemptor that the state still holds, and forget those the API
        server no longer has. Without this, a preemptor tried again before the watch delivers the deletions is
        refused by a stale count, and kube-scheduler preempts a second set of pods for it."""
        entry = self._evicting.get(preemptor)
        if entry is None or self.api is None:
            return
        when, victims = entry
        held = [(k, n) for k, n in victims if self.state.held(k) is not None]
        if not held or time.monotonic() - when > EVICTION_WATCH_SECONDS:
            self._evicting.pop(preemptor, None)
            return
        for key, name in held:
            ns, _, pod = name.partition("/")
            try:
                uid = str((self.api.get_pod(ns, pod).get("metadata") or {}).get("uid") or "")
            except KubeApiError as exc:
                if exc.status != 404:
                    continue  # unknown: the watch will tell
                uid = ""
            if uid != key:  # gone, or another pod of that name now
                self.state.forget(key)

    def _decide(self, ask: PodAsk) -> Verdict:
        s = self.state.snapshot
        request = ask.request
        gen = self.state.generation
        none = np.zeros(0, dtype=np.int8)
        if s is None:
            text = "corral knows no nodes yet"
            return Verdict(gen, request, ask, None, _NO_NODES, none, (), {}, text, None, text)
        table = self.table(s)
        config = dataclasses.replace(self.config, top_scores=min(len(s), TOP_RANKED))
        try:
            d = place(s, request, config)
        except InvalidRequest as exc:
            # Something this cluster has nowhere (a GPU model, that much GPU memory): no node can ever help.
            return Verdict(gen, request, ask, table, _NO_NODES, none, (), {}, str(exc), None, str(exc))
        bits = d.node_reasons.astype(np.int64, copy=False)
        # One text per distinct reason mask (a handful), not per node.
        present = np.flatnonzero(np.bincount(bits))  # reason masks are small (one bit per Reason)
        texts = {b: node_reason_text(b, d.explanation.labels) for b in present.tolist() if b}
        order = tuple(s.index[n] for n, _ in d.explanation.top)
        fits = (bits == 0).astype(np.int8)
        return Verdict(gen, request, ask, table, bits, fits, order, texts, render(d.explanation), d.allocation,
                       snapshot=s)  # fmt: skip

    def table(self, s: ClusterSnapshot) -> NodeTable:
        """The NodeTable of snapshot `s` (kept while the node names stay the same)."""
        if self._table_for is not s:
            if self._table is None or self._table.names != s.names:
                self._table = NodeTable(s.names)
            self._table_for = s
        assert self._table is not None
        return self._table

    def _best_among(self, v: Verdict, member: npt.NDArray[np.bool_]) -> int | None:
        """The engine's choice restricted to the nodes kube-scheduler let through (none of its best few were)."""
        with self.state.lock:
            s = self.state.snapshot
            if s is None or v.table is None or s.names != v.table.names:
                return None
            full = place(s, v.request, dataclasses.replace(self.config, top_scores=len(s)))
            return next((s.index[n] for n, _ in full.explanation.top if member[s.index[n]]), None)

    def _pick(self, v: Verdict, passing: IntArray) -> int | None:
        """The engine's best node among `passing` (snapshot indices): the first of its ranked few that is there,
        else a ranking of all nodes (kube-scheduler sent none of the best few)."""
        member = np.zeros(len(v.bits), dtype=np.bool_)
        member[passing] = True
        best = next((i for i in v.order if member[i]), None)
        return best if best is not None else self._best_among(v, member)

    def allocation_on(self, verdict: Verdict, node: str) -> Allocation | None:
        """The engine's allocation for the pod on one given node (GPU choice by the same policy)."""
        if verdict.allocation is not None and verdict.allocation.node == node:
            return verdict.allocation
        s = self.state.snapshot
        if s is None or node not in s.index:
            return None
        pinned = dataclasses.replace(
            verdict.request, constraints=(*verdict.request.constraints, Constraint("hostname", ConstraintOp.IS, node))
        )
        return place(s, pinned, self.config).allocation

    # ------------------------------------------------------------------ verbs
    def _filter(self, args: Any) -> tuple[FilterAnswer, list[JsonObj] | None]:
        pod, names, node_objs = self._args(args)
        if node_objs is not None:
            for obj in node_objs:
                self.state.upsert_node(obj)
        v = self.verdict(pod)
        table = v.table
        if table is None:
            check_names(names)
            return FilterAnswer(None, _NO_NODES, (Group(v.error, True, _NO_NODES, tuple(names)),)), node_objs
        look = table.lookup(names)
        if v.error:
            return FilterAnswer(table, _NO_NODES, (Group(v.error, True, look.known, look.unknown),)), node_objs
        bits = v.bits[look.known]
        passing = look.known[bits == 0]
        if self.pick and len(passing) > 1 and not kube_preferences(pod):
            best = self._pick(v, passing)
            if best is not None:
                # Only the node kube-scheduler is to bind: the others need no reason (with a node found it reports
                # none of them), and an answer of one name is the least JSON to write and to read.
                return FilterAnswer(table, np.array([best], dtype=np.int64), ()), node_objs
        groups = []
        for b, text in v.texts.items():
            mask = bits == b
            if mask.any():
                groups.append(Group(text, bool(b & UNRESOLVABLE_BITS), look.known[mask]))
        if look.unknown:
            groups.append(Group(UNKNOWN_NODE, False, _NO_NODES, look.unknown))
        # kube-scheduler's prioritize comes next with the nodes that passed: have their lookup ready.
        table.remember(table.name_array[passing].tolist(), Lookup(passing, passing, ()))
        return FilterAnswer(table, passing, tuple(groups)), node_objs

    def filter(self, args: Any) -> JsonObj:
        """ExtenderFilterResult for ExtenderArgs (raises InvalidRequest on bad input)."""
        answer, node_objs = self._filter(args)
        self.metrics.decisions.labels("filter", "fits" if len(answer.passing) else "unschedulable").inc()
        return answer.as_dict(node_objs)

    def filter_json(self, args: Any) -> bytes:
        """`filter`'s answer as JSON bytes."""
        answer, node_objs = self._filter(args)
        self.metrics.decisions.labels("filter", "fits" if len(answer.passing) else "unschedulable").inc()
        return answer.as_json() if node_objs is None else orjson.dumps(answer.as_dict(node_objs))

    def _prioritize(self, args: Any) -> tuple[list[str], NodeTable | None, Lookup | None, npt.NDArray[np.int8]]:
        """(names, the node table, their lookup, score per name in request order)."""
        pod, names, _ = self._args(args)
        v = self.verdict(pod)
        table = v.table
        if table is None or v.error:
            check_names(names)
            return names, None, None, np.zeros(len(names), dtype=np.int8)
        look = table.lookup(names)
        member = np.zeros(len(table), dtype=np.bool_)
        member[look.known] = True
        ranked = [i for i in v.order if member[i]]
        if not ranked and v.fits[look.known].any():
            best = self._best_among(v, member)
            ranked = [best] if best is not None else []
        # The engine's pick gets the top score; the next best keep the engine's order in 9..2; any other node that
        # fits gets 1 and a node that does not fit 0.
        score = v.fits
        if ranked:
            score = score.copy()
            score[ranked] = [max(2, 9 - pos) for pos in range(len(ranked))]
            score[ranked[0]] = MAX_PRIORITY
        if look.unknown:
            return names, table, look, np.where(look.idx >= 0, score[np.maximum(look.idx, 0)], 0).astype(np.int8)
        return names, table, look, score[look.idx]

    def prioritize(self, args: Any) -> list[JsonObj]:
        """HostPriorityList for ExtenderArgs (raises InvalidRequest on bad input)."""
        names, _, _, scores = self._prioritize(args)
        return [{"Host": n, "Score": s} for n, s in zip(names, scores.tolist(), strict=True)]

    def prioritize_json(self, args: Any) -> bytes:
        """`prioritize`'s answer as JSON bytes, joined from per-node fragments."""
        names, table, look, scores = self._prioritize(args)
        if table is None or look is None or look.unknown:
            return orjson.dumps([{"Host": n, "Score": s} for n, s in zip(names, scores.tolist(), strict=True)])
        return b"[" + b",".join(table.hosts[look.idx, scores].tolist()) + b"]"

    def bind(self, args: Any) -> JsonObj:
        if not isinstance(args, Mapping):
            raise InvalidRequest(
                "ExtenderBindingArgs", "expected a JSON object with PodName, PodNamespace, PodUID, Node"
            )
        name, ns, uid, node = (args.get(k) for k in ("PodName", "PodNamespace", "PodUID", "Node"))
        for key, value in (("PodName", name), ("Node", node)):
            if not isinstance(value, str) or not value:
                raise InvalidRequest(f"ExtenderBindingArgs.{key}", "must be a non-empty string")
        for key, value in (("PodNamespace", ns), ("PodUID", uid)):
            if value is not None and not isinstance(value, str):
                raise InvalidRequest(f"ExtenderBindingArgs.{key}", "must be a string")
        ns = ns or "default"
        uid = uid or ""
        assert isinstance(name, str) and isinstance(node, str) and isinstance(ns, str) and isinstance(uid, str)
        for key, value in (("PodName", name), ("PodNamespace", ns), ("Node", node)):
            if not _K8S_NAME.fullmatch(value):
                raise InvalidRequest(
                    f"ExtenderBindingArgs.{key}", "must be a Kubernetes name (at most 253 of a-z, 0-9, '-' and '.')"
                )
        if len(uid) > MAX_UID:
            raise InvalidRequest("ExtenderBindingArgs.PodUID", f"longer than {MAX_UID} characters")
        try:
            bound = self._bind(ns, name, uid, node)
        except (InvalidRequest, KubeApiError, AllocationError) as exc:
            message = f"bind {ns}/{name} to {node}: {exc}"
            log.warning("bind refused: %s", _short(message))
            bound = {"Error": message}
        self.metrics.decisions.labels("bind", "refused" if bound.get("Error") else "bound").inc()
        return bound

    def _pod_for_bind(self, ns: str, name: str, uid: str) -> JsonObj:
        """The pod a bind follows (its node, annotations and requests are the truth the bind must follow): the pod
        filter saw when the watch's last view of that name is that very pod (same UID, not deleted since), else the
        API server's pod read now. Without an API server, the pod filter saw.

        The watch is the API server's own account, so a pod recreated under the same name, or deleted, is read
        again; a pod bound meanwhile is refused by the Binding itself (409) and read back. The read costs the API
        server a quorum read from etcd for every pod, which no plain kube-scheduler makes: it was a quarter of the
        API server's and etcd's CPU per pod with corral (docs/kubernetes.md, "Throughput")."""
        with self.state.lock:
            seen = self._pods.get(uid) if uid else None
        if (
            seen is not None
            and pod_name(seen) == f"{ns}/{name}"
            and self.state.current(f"{ns}/{name}", uid)
            and self.state.held(uid) is None  # bound, or a bind of it unanswered: what the API server says counts
        ):
            return seen
        if self.api is not None:
            pod = self.api.get_pod(ns, name)
            real = str((pod.get("metadata") or {}).get("uid") or "")
            if uid and real and uid != real:
                # kube-apiserver does not check a Binding's UID: the pod of that name is another one (recreated).
                raise InvalidRequest("PodUID", f"{uid!r} is not the UID of pod {ns}/{name} (it is {real!r})")
            return pod
        seen = self._pods.get(uid or f"{ns}/{name}")
        if seen is None:
            raise InvalidRequest("PodUID", "pod not seen at filter and no API server to read it from")
        return seen

    def _bind(self, ns: str, name: str, uid: str, node: str) -> JsonObj:
        pod = self._pod_for_bind(ns, name, uid)
        key = pod_key(pod)
        bound_to = (pod.get("spec") or {}).get("nodeName")
        if bound_to:
            # Kubernetes never moves a bound pod (a second Binding gets 409): refuse before reserving anything, and
            # make sure the pod is counted where it is.
            self.state.upsert_pod(pod)
            raise BindConflict(f"the pod is already bound to {bound_to}")
        if key in self._evicting:
            self._see_evictions(key)  # API reads: not under the state's lock
        with self.state.lock:
            held = self.state.held(key)
            if held is not None and not held.confirmed and not self.state.in_flight(key):
                self.state.upsert_pod(pod)  # an earlier bind whose answer was lost; the pod just read is pending
            self.state.check_unbound(key, pod_name(pod))
            s = self.state.snapshot
            if s is None or node not in s.index:
                raise InvalidRequest("Node", f"{node!r} is unknown to corral")
            rec: PodRecord | None = None
            cached = self._verdicts.get(key)
            if (
                cached is not None
                and cached.allocation is not None
                and cached.allocation.node == node
                and cached.snapshot is s  # the same nodes as then (no node changed since)
                and (self._pods.get(key) is pod or pod_request(pod, gpu_memory=self.state.gpu_memory) == cached.ask)
            ):
                # The allocation filter chose, reserved as it is if its GPUs are still free (reserve checks every
                # share under the lock). Other binds land between a pod's filter and its bind, so the cached
                # decision is almost never of the current generation; deciding afresh cost a full engine pass over
                # every node for every bind, to find the same GPUs in nearly every case.
                v = cached
                rec = self._reserve(pod, key, s, v, cached.allocation, may_fail=True)
            if rec is None:
                v = self.verdict(pod, fresh=True)
                alloc = self.allocation_on(v, node)
                if alloc is None:
                    why = v.reason(s.index[node]) or "no longer fits"
                    raise AllocationError(f"the pod does not fit on {node} now: {why}")
                rec = self._reserve(pod, key, s, v, alloc)
            assert rec is not None and rec.assignment is not None
            assignment = rec.assignment
        outcome = "unknown"
        try:
            if self.api is not None:
                # One write: the node and the assignment land together, or neither does (a refused Binding leaves
                # the pod, and whatever assignment it had, as it was).
                self.api.create_binding(ns, name, uid, node, assignment_annotations(assignment, v.ask.style))
            outcome = "bound"
        except KubeApiError as exc:
            outcome = "refused" if exc.status is not None and 400 <= exc.status < 500 else "unknown"
            raise
        finally:
            with self.state.lock:  # the caches are shared with concurrent binds, which change them under the lock
                self.state.settle(rec, outcome)
                self._verdicts.pop(key, None)
                self._pods.pop(key, None)
            if outcome != "bound":
                self._follow(ns, name, key)
        return {"Error": ""}

    def _reserve(
        self, pod: JsonObj, key: str, s: ClusterSnapshot, v: Verdict, alloc: Allocation, may_fail: bool = False
    ) -> PodRecord | None:
        """Reserve `alloc` for the pod (under the state's lock); None where `may_fail` and it no longer fits."""
        node = alloc.node
        assignment = make_assignment(alloc, s.nodes[s.index[node]], v.ask)
        rec = PodRecord(key, pod_name(pod), node, v.request, assignment, confirmed=False)
        try:
            self.state.reserve(rec, alloc)
        except BindConflict:
            raise
        except AllocationError:
            if may_fail:
                return None
            raise
        return rec

    def _follow(self, ns: str, name: str, key: str) -> None:
        """After a Binding that failed or went unanswered, read the pod back so the state follows what the API
        server holds (bound elsewhere, bound by this very Binding, pending, or gone)."""
        if self.api is None:
            return
        try:
            pod = self.api.get_pod(ns, name)
        except KubeApiError as exc:
            if exc.status == 404:
                self.state.forget(key)  # deleted meanwhile
            else:  # unknown: the reservation stays unconfirmed until a view of the pod or a list decides
                log.warning("bind %s/%s: cannot read the pod back (%s); its GPUs stay reserved until it is seen", ns,
                            name, exc)  # fmt: skip
            return
        if pod_key(pod) == key:
            self.state.upsert_pod(pod)

    def preempt(self, args: Any) -> JsonObj:
        """ExtenderPreemptionResult: the one candidate node where the fewest lower-priority pods make room for the pod
        per GPU, with those pods; no node where no such set exists.

        kube-scheduler counts the GPU resources itself (the chart ignores only the GPU-memory resources, which no
        device plugin advertises), so its candidates and victims are right in total but blind to which GPU each
        share sits on: two halves of different GPUs free "1000 gpu-milli" and no room for a 600 share. Starting from
        its victims, corral adds lower-priority pods of the node until the pod fits per GPU, then reprieves every
        victim the pod does not need, most important first. kube-scheduler takes the returned sets as they are
        (it looks each UID up among the node's pods).

        Only the best node is returned (kube-scheduler's own order: fewest PDB violations, then the least important
        most important victim, the lowest sum of priorities, the fewest victims), so the victims named are the ones
        kube-scheduler deletes. When the same pod comes back before the watch has shown them gone, they count as
        gone: the node where they were needs no new victims, and no second set is preempted for one pod."""
        if not isinstance(args, Mapping):
            raise InvalidRequest("ExtenderPreemptionArgs", "expected a JSON object")
        pod = args.get("Pod")
        if not isinstance(pod, Mapping):
            raise InvalidRequest("Pod", "expected a Pod object")
        victims, pdb = _victims(args)
        request = pod_request(dict(pod), gpu_memory=self.state.gpu_memory).request
        preemptor = pod_key(dict(pod))
        best: tuple[tuple[int, int, int, int], str, list[str]] | None = None
        with self.state.lock:
            s = self.state.snapshot
            if s is None:
                return {"NodeNameToMetaVictims": {}}
            entry = self._evicting.get(preemptor)
            fresh = entry is not None and time.monotonic() - entry[0] <= EVICTION_WATCH_SECONDS
            going = tuple(k for k, _ in entry[1] if k in s.allocations) if entry is not None and fresh else ()
            for node, keys in victims.items():
                if node not in s.index:
                    continue
                chosen = self._fewest_victims(s, request, node, keys, going)
                if chosen is None:
                    continue
                prios = [self._priority(k) for k in chosen]
                rank = (pdb.get(node, 0), max(prios, default=-(2**31)), sum(prios), len(chosen))
                if best is None or rank < best[0]:
                    best = (rank, node, chosen)
            if best is None:
                log.info("preempt %s: no node", pod_name(dict(pod)))
                return {"NodeNameToMetaVictims": {}}
            _, node, chosen = best
            named = [(k, self.state.pods[k].name) for k in chosen if k in self.state.pods]
        if named:
            self._remember(self._evicting, preemptor, (time.monotonic(), named + (entry[1] if entry else [])),
                           VERDICTS_KEPT)  # fmt: skip
        log.info("preempt %s: %s with %d victims", pod_name(dict(pod)), node, len(chosen))
        return {"NodeNameToMetaVictims": {node: {"Pods": [{"UID": k} for k in chosen],
                                                 "NumPDBViolations": pdb.get(node, 0)}}}  # fmt: skip

    def _priority(self, key: str) -> int:
        rec = self.state.pods.get(key)
        return rec.request.priority if rec is not None else 0

    def _fewest_victims(
        self,
        s: ClusterSnapshot,
        request: Request,
        node: str,
        given: list[str],
        going: tuple[str, ...] = (),
    ) -> list[str] | None:
        """A set of pods on `node` of lower priority than `request` whose release lets it fit there, no member of
        which can be spared (None: not even all of them make room). Victims corral does not know (not bound in its
        state yet) are kept as kube-scheduler chose them; `going` (being deleted for this pod) count as gone.
        Called under the state's lock."""
        gone = [k for k in going if k in s.allocations and s.allocations[k].node == node]
        given = [k for k in given if k not in gone]
        pinned = dataclasses.replace(
            request, constraints=(*request.constraints, Constraint("hostname", ConstraintOp.IS, node))
        )

        def fits(keys: list[str]) -> bool:
            released = [s.release(k) for k in [*gone, *keys]]
            try:
                return place(s, pinned, self.config).placed
            except InvalidRequest:
                return False
            finally:
                for a in released:
                    s.allocate(a)

        priority = self._priority

        def gpu_milli(key: str) -> int:
            return sum(g.milli for g in s.allocations[key].gpus)

        unknown = [k for k in given if k not in s.allocations]
        lower = [
            k for k, a in s.allocations.items() if a.node == node and priority(k) < request.priority and k not in gone
        ]
        chosen = [k for k in given if k in s.allocations]
        if not fits(chosen):
            if not fits(lower):
                return None
            # least important first, and among equals the pods holding most GPU: room with few evictions
            for k in sorted((k for k in lower if k not in chosen), key=lambda k: (priority(k), -gpu_milli(k))):
                chosen.append(k)
                if fits(chosen):
                    break
        # reprieve: most important first, and among equals the ones holding least GPU
        for k in sorted(chosen, key=lambda k: (-priority(k), gpu_milli(k))):
            rest = [v for v in chosen if v != k]
            if fits(rest):
                chosen = rest
        return chosen + unknown

    # ------------------------------------------------------------------ input
    @staticmethod
    def _args(args: Any) -> tuple[JsonObj, list[str], list[JsonObj] | None]:
        if not isinstance(args, Mapping):
            raise InvalidRequest("ExtenderArgs", "expected a JSON object with Pod and NodeNames (or Nodes)")
        pod = args.get("Pod")
        if not isinstance(pod, Mapping):
            raise InvalidRequest("ExtenderArgs.Pod", "expected a Pod object")
        if not isinstance(pod.get("metadata") or {}, Mapping):
            raise InvalidRequest("ExtenderArgs.Pod.metadata", "expected an object")
        names = args.get("NodeNames")
        nodes = args.get("Nodes")
        if names is not None:
            if not isinstance(names, list):
                raise InvalidRequest("ExtenderArgs.NodeNames", "expected a list of node names")
            # Each name is checked to be a string where it is first looked up (`check_names`): kube-scheduler sends
            # the same few lists over and over, and a list equal to one already checked needs no second look.
            return dict(pod), names, None
        if isinstance(nodes, Mapping) and isinstance(nodes.get("items"), list):
            items = [n for n in nodes["items"] if isinstance(n, Mapping)]
            return dict(pod), [str((n.get("metadata") or {}).get("name", "")) for n in items], [dict(n) for n in items]
        raise InvalidRequest("ExtenderArgs", "needs NodeNames (nodeCacheCapable) or Nodes.items")


# ---------------------------------------------------------------------------------------------------- HTTP
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Handler = Callable[[bytes], tuple[int, bytes]]


#: The largest body read. kube-scheduler's biggest is a filter with whole Node objects (nodeCacheCapable off): about
#: 10 KiB a node, so 64 MiB is several thousand nodes; a bigger body is refused before it is read on.
MAX_BODY = 64 * 1024 * 1024
_JSON_TYPES = {b"", b"application/json"}
#: Verbs that wait on the API server, run in threads; kube-scheduler binds asynchronously, many pods at once.
BLOCKING_VERBS = frozenset({"/bind"})
#: Binds in flight at once (kube-scheduler's client allows about as many concurrent requests to the API server).
BIND_THREADS = 16


def _loads(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)  # refuses bytes that are not UTF-8, NaN/Infinity, and nesting beyond 1024 levels
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest("body", f"not valid JSON: {exc}") from None


def _json_type(headers: list[tuple[bytes, bytes]]) -> str | None:
    """None when the body may be read as JSON (kube-scheduler says application/json; no type is taken as JSON too),
    else the type that came."""
    for key, value in headers:
        if key.lower() == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            if media in _JSON_TYPES or media.endswith(b"+json"):
                return None
            return value.decode("latin-1")
    return None


def _failed_filter(message: str) -> bytes:
    return orjson.dumps({"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                         "Error": message})  # fmt: skip


class ExtenderApp:
    """The HTTP face, a bare ASGI app: POST /filter, /prioritize, /bind, /preempt (kube-scheduler's verbs), GET
    /healthz, /status and /metrics (Prometheus; docs/metrics.md).

    Four fixed routes with JSON in and out need no framework: request validation happens in the Extender (each
    error names its field), and a framework's per-request machinery cost more than the verbs' own work.
    """

    def __init__(self, extender: Extender, health_only_ports: frozenset[int] | None = None) -> None:
        self.extender = extender
        #: Local ports that serve only GET /healthz and /status (the pod's address, for probes and the Service):
        #: the verbs take no credentials, so they are not on an address other pods reach.
        self.health_only_ports = health_only_ports or frozenset()
        self._pool = ThreadPoolExecutor(max_workers=BIND_THREADS, thread_name_prefix="corral-bind")
        #: per verb: [calls, seconds of wall time, seconds of the serving thread's CPU] (/status shows the means):
        #: where an extender's time per pod goes, measured where it is spent
        self._spent: dict[str, list[float]] = {}
        self._cluster = ExtenderCollector(extender.state)  # per node GPUs granted, read at scrape time
        # Each verb's refusal in its own shape: filter's and bind's `Error` fail the pod in kube-scheduler (a 200
        # keeps the reason in its event); kube-scheduler ignores prioritize errors, and preempt has no Error field,
        # so those two answer 400 with the reason, which keeps it visible in kube-scheduler's log.
        self.refusals: dict[str, Callable[[int, str], tuple[int, bytes]]] = {
            "/filter": lambda status, e: (200 if status == 400 else status, _failed_filter(e)),
            "/prioritize": lambda status, e: (status, orjson.dumps({"Error": e})),
            "/bind": lambda status, e: (200 if status == 400 else status, orjson.dumps({"Error": e})),
            "/preempt": lambda status, e: (status, orjson.dumps({"NodeNameToMetaVictims": None, "Error": e})),
        }
        self.routes: dict[tuple[str, str], Handler] = {
            ("POST", "/filter"): self._guarded("filter", extender.filter_json),
            ("POST", "/prioritize"): self._guarded("prioritize", extender.prioritize_json),
            ("POST", "/bind"): self._guarded("bind", lambda args: orjson.dumps(extender.bind(args))),
            ("POST", "/preempt"): self._guarded("preempt", lambda args: orjson.dumps(extender.preempt(args))),
            ("GET", "/healthz"): lambda _: (200, orjson.dumps({"ok": extender.state.snapshot is not None})),
            ("GET", "/status"): lambda _: (
                200,
                orjson.dumps({**extender.state.status(), "verbs": self.timings(), "workload": self._workload()}),
            ),
            ("GET", "/metrics"): lambda _: (200, render_text(Joined(extender.metrics.registry, self._cluster))),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        handler = self.routes.get((method, path))
        server = scope.get("server")
        if server and server[1] in self.health_only_ports and method == "POST":
            handler = None  # 404 below: no verb here
        chunks = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= MAX_BODY:
                chunks.append(chunk)
            more = message.get("more_body", False)
        headers = [(b"content-type", METRICS_TYPE.encode() if path == "/metrics" else b"application/json")]
        ctype = _json_type(scope.get("headers") or [])
        if handler is not None and size > MAX_BODY:
            status, body = self.refusals[path](413, f"body: larger than {MAX_BODY} bytes")
        elif handler is not None and ctype is not None and method == "POST":
            status, body = self.refusals[path](415, f"Content-Type: expected application/json, got {ctype!r}")
        elif handler is not None:
            raw = b"".join(chunks)
            if path in BLOCKING_VERBS:
                # bind waits on the API server (a read, then the Binding): in a thread, so that binds arriving
                # together travel together and filter/prioritize keep answering meanwhile. The state's lock keeps
                # two binds from taking the same GPU.
                status, body = await asyncio.get_running_loop().run_in_executor(self._pool, handler, raw)
            else:
                status, body = handler(raw)
        elif method == "POST" and server and server[1] in self.health_only_ports:
            why = f"{path}: not served on this address (read-only: /healthz, /status; verbs are beside kube-scheduler)"
            status, body = 404, orjson.dumps({"Error": why})
        elif any(p == path for _, p in self.routes):
            allowed = ", ".join(m for m, p in self.routes if p == path)
            status, body = 405, orjson.dumps({"Error": f"{method} {path}: method not allowed (allowed: {allowed})"})
            headers.append((b"allow", allowed.encode()))
        else:
            known = ", ".join(sorted({p for _, p in self.routes}))
            status, body = 404, orjson.dumps({"Error": f"{path}: no such endpoint (known: {known})"})
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _guarded(self, verb: str, answer: Callable[[Any], bytes]) -> Handler:
        """A verb's handler: its answer, or, for bad input, the verb's own refusal naming the field (one log line);
        a fault of ours (a bug: no input should reach it) is refused the same way, with its traceback logged."""
        refusal = self.refusals[f"/{verb}"]
        spent = self._spent.setdefault(verb, [0, 0.0, 0.0])
        metrics = self.extender.metrics

        def handle(raw: bytes) -> tuple[int, bytes]:
            wall, cpu = time.perf_counter(), time.thread_time()
            status = 500
            try:
                status, body = answered(raw)
                return status, body
            finally:
                took = time.perf_counter() - wall
                # += on a list item is not atomic across bind threads; a count lost now and then is no harm here
                spent[0] += 1
                spent[1] += took
                spent[2] += time.thread_time() - cpu
                metrics.answered(verb, status, took)

        def answered(raw: bytes) -> tuple[int, bytes]:
            try:
                return 200, answer(_loads(raw))
            except InvalidRequest as exc:
                log.warning("%s refused: %s", verb, _short(str(exc)))
                metrics.decisions.labels(verb, "invalid").inc()
                return refusal(400, str(exc))
            except Exception as exc:
                log.exception("%s failed", verb)
                metrics.decisions.labels(verb, "error").inc()
                return refusal(500, f"corral internal error: {type(exc).__name__}: {exc}")

        return handle

    def _workload(self) -> dict[str, Any]:
        with self.extender.state.lock:  # the learner is updated under it
            return self.extender.workload_status()

    def timings(self) -> dict[str, dict[str, float]]:
        """Per verb since the start: calls, and seconds of wall time and of CPU (the serving thread's) of their
        handling, from the body read to the answer made (HTTP and the server's own work not included)."""
        return {
            verb: {"calls": int(n), "wall_s": round(w, 6), "cpu_s": round(c, 6)}
            for verb, (n, w, c) in self._spent.items()
        }


#: Where the extender's target workload comes from (`Extender.workload_source`), one gauge series each.
WORKLOAD_SOURCES = ("default", "learned", "given")


def _update_workload_gauges(metrics: ExtenderMetrics, extender: Extender) -> None:
    """/metrics: which target workload the engine uses and what the learner has seen. Set at the start and at each
    adoption; the counts are read at scrape time."""
    source = extender.workload_source
    for s in WORKLOAD_SOURCES:
        metrics.workload_source.labels(s).set(1 if s == source else 0)
    metrics.workload_types.set_function(lambda: len(w.types) if (w := extender.config.workload) is not None else 0)
    learner = extender.learner
    metrics.workload_pods.set_function(lambda: learner.pods if learner is not None else 0)
    metrics.workload_rebuilds.set_function(lambda: learner.rebuilds if learner is not None else 0)


def _short(text: str, limit: int = 300) -> str:
    """One log line: at most `limit` characters, control characters escaped (the text may quote a hostile body)."""
    text = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def create_app(extender: Extender, health_only_ports: frozenset[int] | None = None) -> ExtenderApp:
    """The extender's ASGI app (served by uvicorn); connections to `health_only_ports` get no verbs."""
    return ExtenderApp(extender, health_only_ports)
