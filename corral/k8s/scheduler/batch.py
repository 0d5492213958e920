"""The batch step: pending pods in arrival order + the books -> decisions. Pure: no I/O, no clock.

    [Pending, ...] (arrival order)  --place() each, on the snapshot-->  [Bind(pod, allocation, annotations) |
                                                                          Wait(pod, reason, code, unresolvable)]

Each pod is placed by the engine's `place()` exactly as `corral sim` places a trace (same snapshot, request, policy
and seed), and a placed pod's allocation is granted on the snapshot at once, so the next pod of the batch sees it.
The caller holds the books' lock around the call and records every Bind (`ClusterState.adopt`) before the lock is let
go: a bind is charged before its Binding travels. Tenancy (issue 25) sits in front of this function: it orders and
filters `pending`; nothing here reads a queue.

Pods of one shape that failed in a batch are not placed again in it: the books only fill up during a batch, so a
request that did not fit does not fit a moment later (thousands of pods of one Job waiting for capacity cost one
engine pass per batch, not one each).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.k8s.convert import Assignment, PodAsk, assignment_annotations, make_assignment
from corral.k8s.scheduler.gang import GangInfo, GangRef, place_gang
from corral.model.errors import InvalidRequest
from corral.model.resources import Allocation, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from corral.placement.explain import Explanation, render
from corral.placement.reasons import UNRESOLVABLE_BITS

#: Metric label (`code`) of a pod corral cannot read (a bad quantity, mixed GPU styles): nothing but an edit helps.
INVALID = "invalid"
#: ... of a pod that waits because corral knows no node yet.
NO_NODES = "no_nodes"
#: ... of a pod whose request names what this cluster does not have at all (a GPU model, that much GPU memory).
IMPOSSIBLE = "impossible"


@dataclass(frozen=True, eq=False)
class Pending:
    """A pod waiting for a node: its key (UID), "namespace/name", and what it asks for (None with `error`)."""

    key: str
    name: str
    ask: PodAsk | None
    error: str = ""
    #: The gang it belongs to (gang.GangRef.key, "" for none) and the queue it names (gang.queue_of).
    gang: str = ""
    queue: str = ""
    #: Tenancy (a queues file): its namespace (the account within its queue), when it was created (epoch seconds,
    #: its age in the queue order), and its time limit (activeDeadlineSeconds or corral.dev/time-limit; None: none).
    namespace: str = ""
    created: float = 0.0
    time_limit_s: float | None = None

    @property
    def id(self) -> str:
        """Its id as tenancy's round cache looks it up (corral.tenancy.round.ShapeCache)."""
        return self.key


@dataclass(frozen=True, eq=False)
class Bind:
    pod: Pending
    allocation: Allocation
    assignment: Assignment
    #: What the Binding carries (convert.assignment_annotations, as the extender's bind writes them).
    annotations: dict[str, str]


@dataclass(eq=False, slots=True)
class Wait:
    """(Not frozen: a round with queues makes one per waiting pod, ten thousand of them, and a frozen dataclass's
    __init__ costs three times as much. Nothing changes one once made.)"""

    pod: Pending
    reason: str  # the engine's explanation, one line
    code: str  # a small fixed set (a Reason's name, INVALID, NO_NODES, IMPOSSIBLE): the pending-pods metric's label
    unresolvable: bool  # no waiting can help (only an edit of the pod or new nodes)
    #: The words without the pod's place in line (a queue's words: the same from round to round while only its
    #: position moves); "" where there is no place in line (the reason is the whole of it).
    gist: str = ""


Decision = Bind | Wait


def _shape(request: Request) -> tuple[Any, ...]:
    """A request without its id: pods of one shape get the same answer from the same books."""
    return (request.cpu_milli, request.memory_mib, request.gpu_count, request.gpu_milli, request.gpu_memory_mib,
            request.gpu_models, request.min_gpu_memory_mib, request.constraints, request.priority,
            request.gpu_behavior, request.policy, request.share_owner)  # fmt: skip


def primary_code(explanation: Explanation) -> str:
    """The reason that rejected most nodes, as a lower-case name (insufficient_gpu, gpu_model, ...)."""
    if not explanation.rejected:
        return NO_NODES if explanation.nodes_evaluated == 0 else "unschedulable"
    reason, _ = max(explanation.rejected, key=lambda rc: rc[1])
    return reason.name.lower()


def place_batch(
    pending: Sequence[Pending],
    snapshot: ClusterSnapshot | None,
    config: PlacementConfig,
    gangs: Mapping[str, GangInfo] | None = None,
) -> list[Decision]:
    """One decision per pod, in `pending`'s order. Placed pods are granted on `snapshot` as they are decided.
    A gang's members (`gangs`: by Pending.gang) are placed together, all or none, where its first member stands."""
    out: list[Decision] = []
    failed: dict[tuple[Any, ...], Wait] = {}
    members: dict[str, list[Pending]] = {}
    for p in pending:
        if p.gang:
            members.setdefault(p.gang, []).append(p)
    decided: dict[str, Decision] = {}
    for p in pending:
        if p.gang:
            if p.gang in members:
                group = members.pop(p.gang)
                info = (gangs or {}).get(p.gang)
                if info is None:  # the caller did not say: a gang of unknown size waits, never placed blind
                    info = GangInfo(GangRef("", "", p.gang), 0, error="its PodGroup is not known yet")
                for g in place_gang(group, info, snapshot, config):
                    decided[g.pod.key] = g
            out.append(decided[p.key])
            continue
        if p.ask is None:
            out.append(Wait(p, p.error, INVALID, True))
            continue
        if snapshot is None:
            out.append(Wait(p, "corral knows no nodes yet", NO_NODES, False))
            continue
        shape = _shape(p.ask.request)
        seen = failed.get(shape)
        if seen is not None:
            out.append(Wait(p, seen.reason, seen.code, seen.unresolvable))
            continue
        try:
            d = place(snapshot, p.ask.request, config, explain_placed=False)
        except InvalidRequest as exc:
            wait = Wait(p, str(exc), IMPOSSIBLE, True)
            failed[shape] = wait
            out.append(wait)
            continue
        alloc = d.allocation
        if alloc is None:
            unresolvable = bool(len(d.node_reasons)) and bool((d.node_reasons & UNRESOLVABLE_BITS).all())
            wait = Wait(p, render(d.explanation), primary_code(d.explanation), unresolvable)
            failed[shape] = wait
            out.append(wait)
            continue
        snapshot.allocate(alloc)
        assignment = make_assignment(alloc, snapshot.nodes[alloc.node_index], p.ask)
        out.append(Bind(p, alloc, assignment, assignment_annotations(assignment, p.ask.style)))
    return out
