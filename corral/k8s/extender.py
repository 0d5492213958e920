"""The kube-scheduler extender: filter, prioritize, bind and preempt, decided by corral's placement engine.

    kube-scheduler --POST /filter {Pod, Nodes|NodeNames}-->  engine: feasible nodes + a reason for every other
                   --POST /prioritize {Pod, NodeNames}---->  engine's order: its choice 10, the rest 9..1, misfits 0
                   --POST /bind {PodName, PodNamespace, PodUID, Node}-->  reserve GPUs, annotate pod, create Binding
                   --POST /preempt {Pod, NodeNameToMetaVictims}-->  nodes where evicting the victims makes room

The JSON keys are kube-scheduler's Go field names (its extender types carry no json tags). A decision made at filter
is kept for the pod until the cluster changes, so prioritize and bind reuse it; bind checks again against the
state of that moment, so two binds never get the same GPU share. Bad input (malformed JSON, invalid quantities,
conflicting requests) gets an `Error` naming the field, never a 500.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import Response

from corral.k8s.client import JsonObj, KubeApi, KubeApiError
from corral.k8s.convert import (
    PodAsk,
    assignment_annotations,
    make_assignment,
    pod_key,
    pod_name,
    pod_request,
)
from corral.k8s.state import ClusterState, PodRecord
from corral.model.errors import AllocationError, InvalidRequest
from corral.model.resources import Allocation, Constraint, ConstraintOp, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.placement.explain import node_reason_text, render
from corral.placement.reasons import UNRESOLVABLE_BITS

log = logging.getLogger("corral.k8s.extender")

MAX_PRIORITY = 10  # kube-scheduler's MaxExtenderPriority
#: How many of the best nodes the engine ranks for prioritize (the rest that fit score 1).
TOP_RANKED = 32
UNKNOWN_NODE = "unknown to corral: the node is not in its cache (yet); is the corral device plugin running there?"


@dataclass(frozen=True)
class Verdict:
    """The engine's answer for one pod over the nodes corral knows, kept between filter, prioritize and bind."""

    generation: int
    request: Request
    ask: PodAsk
    order: tuple[str, ...]  # the best feasible nodes, best first (the engine's selection order), at most TOP_RANKED
    feasible: frozenset[str]  # every node that fits
    failed: Mapping[str, str]  # rejected node -> every reason, in words (waiting or preemption may help)
    unresolvable: Mapping[str, str]  # rejected nodes that can never fit -> reasons
    summary: str  # the one-line explanation
    allocation: Allocation | None  # the engine's own choice over all nodes
    error: str = ""  # the whole request is impossible here (e.g. a GPU model this cluster lacks)


class Extender:
    def __init__(self, state: ClusterState, api: KubeApi | None, config: PlacementConfig | None = None) -> None:
        self.state = state
        self.api = api
        self.config = config or PlacementConfig()
        self._verdicts: OrderedDict[str, Verdict] = OrderedDict()
        self._pods: OrderedDict[str, JsonObj] = OrderedDict()  # recent Pod objects by UID, for bind
        self._names_for: ClusterSnapshot | None = None
        self._names: npt.NDArray[np.object_] = np.array([], dtype=object)
        self._known: frozenset[str] = frozenset()

    # ------------------------------------------------------------------ decisions
    def _remember(self, store: OrderedDict[str, Any], key: str, value: Any) -> None:
        store[key] = value
        store.move_to_end(key)
        while len(store) > 1024:
            store.popitem(last=False)

    def verdict(self, pod: JsonObj) -> Verdict:
        """The engine's answer for a pod (cached while the cluster is unchanged). Raises InvalidRequest."""
        key = pod_key(pod)
        with self.state.lock:
            cached = self._verdicts.get(key)
            if cached is not None and cached.generation == self.state.generation:
                return cached
            ask = pod_request(pod)
            verdict = self._decide(ask)
            self._remember(self._verdicts, key, verdict)
            self._remember(self._pods, key, pod)
            return verdict

    def _decide(self, ask: PodAsk) -> Verdict:
        s = self.state.snapshot
        request = ask.request
        gen = self.state.generation
        if s is None:
            none = "corral knows no nodes yet"
            return Verdict(gen, request, ask, (), frozenset(), {}, {}, none, None, none)
        config = dataclasses.replace(self.config, top_scores=min(len(s), TOP_RANKED))
        try:
            d = place(s, request, config)
        except InvalidRequest as exc:
            # Something this cluster has nowhere (a GPU model, that much GPU memory): no node can ever help.
            return Verdict(gen, request, ask, (), frozenset(), {}, dict.fromkeys(s.names, str(exc)), str(exc), None,
                           str(exc))  # fmt: skip
        names = self._names_array(s)
        bits_all = d.node_reasons
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        # One text per distinct reason mask (a handful), not per node: this runs on every filter over every node.
        for bits in np.unique(bits_all):
            b = int(bits)
            if b == 0:
                continue
            text = node_reason_text(b, d.explanation.labels)
            target = unresolvable if b & UNRESOLVABLE_BITS else failed
            target.update(dict.fromkeys(names[bits_all == bits].tolist(), text))
        feasible = frozenset(names[bits_all == 0].tolist())
        order = tuple(n for n, _ in d.explanation.top)
        return Verdict(gen, request, ask, order, feasible, failed, unresolvable, render(d.explanation), d.allocation)

    def _names_array(self, s: ClusterSnapshot) -> npt.NDArray[np.object_]:
        if self._names_for is not s:
            self._names = np.array(s.names, dtype=object)
            self._known = frozenset(s.names)
            self._names_for = s
        return self._names

    def _best_among(self, v: Verdict, candidates: set[str]) -> str | None:
        """The engine's choice restricted to the nodes kube-scheduler let through."""
        for name in v.order:
            if name in candidates:
                return name
        if not (v.feasible & candidates):
            return None
        s = self.state.snapshot
        assert s is not None
        full = place(s, v.request, dataclasses.replace(self.config, top_scores=len(s)))
        return next((n for n, _ in full.explanation.top if n in candidates), None)

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
    def filter(self, args: Any) -> JsonObj:
        pod, names, node_objs = self._args(args)
        if node_objs is not None:
            for obj in node_objs:
                self.state.upsert_node(obj)
        v = self.verdict(pod)
        if v.error:
            return self._filter_result([], node_objs, {}, dict.fromkeys(names, v.error), "")
        passing = [n for n in names if n in v.feasible]
        wanted = set(names)
        if wanted == self._known:
            failed, failed_unres = dict(v.failed), dict(v.unresolvable)
        else:
            failed = {n: v.failed[n] for n in names if n in v.failed}
            failed_unres = {n: v.unresolvable[n] for n in names if n in v.unresolvable}
            for n in wanted - self._known:
                failed[n] = UNKNOWN_NODE
        return self._filter_result(passing, node_objs, failed, failed_unres, "")

    @staticmethod
    def _filter_result(
        passing: list[str],
        node_objs: list[JsonObj] | None,
        failed: dict[str, str],
        failed_unres: dict[str, str],
        error: str,
    ) -> JsonObj:
        if node_objs is not None:
            keep = set(passing)
            items = [n for n in node_objs if (n.get("metadata") or {}).get("name") in keep]
            nodes: Any = {"metadata": {}, "items": items}
            node_names: Any = None
        else:
            nodes, node_names = None, passing
        return {
            "Nodes": nodes,
            "NodeNames": node_names,
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": failed_unres,
            "Error": error,
        }

    def prioritize(self, args: Any) -> list[JsonObj]:
        pod, names, _ = self._args(args)
        v = self.verdict(pod)
        wanted = set(names)
        ranked = [n for n in v.order if n in wanted]
        if not ranked and v.feasible & wanted:
            best = self._best_among(v, wanted)
            ranked = [best] if best else []
        # The engine's pick gets the top score; the next best keep the engine's order in 9..2; any other node that
        # fits gets 1 and a node that does not fit 0.
        score = {n: max(2, 9 - pos) for pos, n in enumerate(ranked)}
        if ranked:
            score[ranked[0]] = MAX_PRIORITY
        feasible = v.feasible
        return [{"Host": n, "Score": score.get(n, 1 if n in feasible else 0)} for n in names]

    def bind(self, args: Any) -> JsonObj:
        if not isinstance(args, Mapping):
            return {"Error": "ExtenderBindingArgs: expected a JSON object with PodName, PodNamespace, PodUID, Node"}
        name, ns, uid, node = (args.get(k) for k in ("PodName", "PodNamespace", "PodUID", "Node"))
        for key, value in (("PodName", name), ("Node", node)):
            if not isinstance(value, str) or not value:
                return {"Error": f"ExtenderBindingArgs.{key}: must be a non-empty string"}
        ns = ns if isinstance(ns, str) and ns else "default"
        uid = uid if isinstance(uid, str) else ""
        assert isinstance(name, str) and isinstance(node, str)
        try:
            return self._bind(ns, name, uid, node)
        except (InvalidRequest, KubeApiError, AllocationError) as exc:
            return {"Error": f"bind {ns}/{name} to {node}: {exc}"}

    def _bind(self, ns: str, name: str, uid: str, node: str) -> JsonObj:
        key = uid or f"{ns}/{name}"
        pod = self._pods.get(key)
        if pod is None:
            if self.api is None:
                raise InvalidRequest("PodUID", "pod not seen at filter and no API server to read it from")
            pod = self.api.get_pod(ns, name)
        with self.state.lock:
            v = self.verdict(pod)
            s = self.state.snapshot
            if s is None or node not in s.index:
                raise InvalidRequest("Node", f"{node!r} is unknown to corral")
            alloc = self.allocation_on(v, node)
            if alloc is None:
                why = v.failed.get(node) or v.unresolvable.get(node) or "no longer fits"
                raise AllocationError(f"the pod does not fit on {node} now: {why}")
            assignment = make_assignment(alloc, s.nodes[s.index[node]], v.ask)
            rec = PodRecord(pod_key(pod), pod_name(pod), node, v.request, assignment)
            self.state.reserve(rec, alloc)
        ok = False
        try:
            if self.api is not None:
                self.api.patch_pod_annotations(ns, name, assignment_annotations(assignment, v.ask.style))
                self.api.create_binding(ns, name, uid, node)
            ok = True
        finally:
            self.state.settle(rec.key, ok)
            self._verdicts.pop(key, None)
            self._pods.pop(key, None)
        return {"Error": ""}

    def preempt(self, args: Any) -> JsonObj:
        if not isinstance(args, Mapping):
            raise InvalidRequest("ExtenderPreemptionArgs", "expected a JSON object")
        pod = args.get("Pod")
        if not isinstance(pod, Mapping):
            raise InvalidRequest("Pod", "expected a Pod object")
        meta_victims = args.get("NodeNameToMetaVictims")
        full_victims = args.get("NodeNameToVictims")
        victims: dict[str, list[str]] = {}
        pdb: dict[str, int] = {}
        if isinstance(meta_victims, Mapping):
            for node, vs in meta_victims.items():
                victims[node] = [str(p.get("UID", "")) for p in (vs or {}).get("Pods") or []]
                pdb[node] = int((vs or {}).get("NumPDBViolations") or 0)
        elif isinstance(full_victims, Mapping):
            for node, vs in full_victims.items():
                victims[node] = [pod_key(p) for p in (vs or {}).get("Pods") or []]
                pdb[node] = int((vs or {}).get("NumPDBViolations") or 0)
        request = pod_request(dict(pod)).request
        result: dict[str, Any] = {}
        with self.state.lock:
            s = self.state.snapshot
            if s is None:
                return {"NodeNameToMetaVictims": {}}
            for node, uids in victims.items():
                if node not in s.index:
                    continue
                released = [s.release(u) for u in uids if u in s.allocations]
                try:
                    pinned = dataclasses.replace(
                        request, constraints=(*request.constraints, Constraint("hostname", ConstraintOp.IS, node))
                    )
                    fits = place(s, pinned, self.config).placed
                except InvalidRequest:
                    fits = False
                finally:
                    for a in released:
                        s.allocate(a)
                if fits:
                    result[node] = {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb.get(node, 0)}
        return {"NodeNameToMetaVictims": result}

    # ------------------------------------------------------------------ input
    @staticmethod
    def _args(args: Any) -> tuple[JsonObj, list[str], list[JsonObj] | None]:
        if not isinstance(args, Mapping):
            raise InvalidRequest("ExtenderArgs", "expected a JSON object with Pod and NodeNames (or Nodes)")
        pod = args.get("Pod")
        if not isinstance(pod, Mapping):
            raise InvalidRequest("ExtenderArgs.Pod", "expected a Pod object")
        names = args.get("NodeNames")
        nodes = args.get("Nodes")
        if names is not None:
            if not isinstance(names, list) or not set(map(type, names)) <= {str}:
                raise InvalidRequest("ExtenderArgs.NodeNames", "expected a list of node names")
            return dict(pod), names, None
        if isinstance(nodes, Mapping) and isinstance(nodes.get("items"), list):
            items = [n for n in nodes["items"] if isinstance(n, Mapping)]
            return dict(pod), [str((n.get("metadata") or {}).get("name", "")) for n in items], [dict(n) for n in items]
        raise InvalidRequest("ExtenderArgs", "needs NodeNames (nodeCacheCapable) or Nodes.items")


# ---------------------------------------------------------------------------------------------------- HTTP
def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def create_app(extender: Extender) -> FastAPI:
    """The HTTP face: POST /filter, /prioritize, /bind, /preempt (kube-scheduler's verbs), GET /healthz, /status."""
    app = FastAPI(title="corral scheduler extender", docs_url=None, redoc_url=None, openapi_url=None)

    async def body_of(request: HttpRequest) -> Any:
        raw = await request.body()
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest("body", f"not valid JSON: {exc}") from None

    def failed_filter(message: str) -> Response:
        return _json({"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                      "Error": message})  # fmt: skip

    @app.post("/filter")
    async def filter_(request: HttpRequest) -> Response:
        try:
            return _json(extender.filter(await body_of(request)))
        except InvalidRequest as exc:
            return failed_filter(str(exc))
        except Exception as exc:
            log.exception("filter failed")
            return failed_filter(f"corral internal error: {type(exc).__name__}: {exc}")

    @app.post("/prioritize")
    async def prioritize(request: HttpRequest) -> Response:
        # kube-scheduler ignores prioritize errors; a 400 with the reason keeps them visible in its log.
        try:
            return _json(extender.prioritize(await body_of(request)))
        except InvalidRequest as exc:
            return _json({"Error": str(exc)}, 400)
        except Exception as exc:
            log.exception("prioritize failed")
            return _json({"Error": f"corral internal error: {type(exc).__name__}: {exc}"}, 400)

    @app.post("/bind")
    async def bind(request: HttpRequest) -> Response:
        try:
            return _json(extender.bind(await body_of(request)))
        except InvalidRequest as exc:
            return _json({"Error": str(exc)})
        except Exception as exc:
            log.exception("bind failed")
            return _json({"Error": f"corral internal error: {type(exc).__name__}: {exc}"})

    @app.post("/preempt")
    async def preempt(request: HttpRequest) -> Response:
        try:
            return _json(extender.preempt(await body_of(request)))
        except InvalidRequest as exc:
            return _json({"NodeNameToMetaVictims": None, "Error": str(exc)}, 400)
        except Exception as exc:
            log.exception("preempt failed")
            return _json({"NodeNameToMetaVictims": None, "Error": f"corral internal error: {exc}"}, 400)

    @app.get("/healthz")
    async def healthz() -> Response:
        return _json({"ok": extender.state.snapshot is not None})

    @app.get("/status")
    async def status() -> Response:
        return _json(extender.state.status())

    return app
