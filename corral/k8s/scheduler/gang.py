"""Gangs on the standalone scheduler: all members bound or none. Pure: no I/O, no clock.

    pod label scheduling.x-k8s.io/pod-group: NAME        -> PodGroup scheduling.x-k8s.io/v1alpha1 NS/NAME
    pod annotation scheduling.k8s.io/group-name: NAME    -> PodGroup scheduling.volcano.sh/v1beta1 NS/NAME
                                                              spec.minMember: how many must be bound together
    place_gang(members of one gang in the batch, GangInfo, snapshot)
        -> fewer than minMember (minus those already bound) pending: all wait ("3 of 10 members pending ...")
        -> the members placed by corral's one gang placer (corral.tenancy.gang.place_members: in turn, on a copy,
           up to the first that does not fit); if at least `need` fit, those are Binds (granted on the snapshot),
           else nothing is granted and all wait naming the member that did not fit

A gang whose bound part is short of minMember (a Binding refused, the scheduler killed mid-gang) is completed by the
next batch with `held` = its bound members; the scheduler deletes the bound part if it cannot be completed within
GANG_PARTIAL_SECONDS (core.Scheduler._check_partial), so no gang stays partly bound for longer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.placement import PlacementConfig
from corral.placement.explain import render
from corral.placement.reasons import UNRESOLVABLE_BITS

if TYPE_CHECKING:
    from corral.k8s.scheduler.batch import Decision, Pending
    from corral.model.snapshot import ClusterSnapshot

#: scheduler-plugins' coscheduling: the pod's label, and its PodGroup's API group/version (plural podgroups).
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
POD_GROUP_API = "scheduling.x-k8s.io/v1alpha1"
#: Volcano: the pod's annotation, and its PodGroup's API group/version.
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_API = "scheduling.volcano.sh/v1beta1"
#: Queue labels: corral's own, then Kueue's and KAI's read as aliases; else the pod's namespace.
QUEUE_LABELS = ("corral.dev/queue", "kueue.x-k8s.io/queue-name", "kai.scheduler/queue")
#: The most members a gang may need: a PodGroup asking for more says so (it could never be placed in one batch).
MAX_MIN_MEMBER = 10000
#: A gang partly bound (short of minMember) for longer than this has its bound part deleted.
GANG_PARTIAL_SECONDS = 30.0

#: Metric codes of a gang member that waits.
GANG_INVALID = "gang_invalid"
GANG_INCOMPLETE = "gang_incomplete"
GANG_UNFIT = "gang_unfit"


@dataclass(frozen=True)
class GangRef:
    """Which PodGroup a pod belongs to: `api` (group/version), its namespace and name."""

    api: str
    namespace: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class GangInfo:
    """What the batch needs of one gang: minMember (0 with `error`), and how many members are bound (or binding)."""

    ref: GangRef
    min_member: int
    held: int = 0
    error: str = ""


def gang_of(obj: Mapping[str, Any]) -> GangRef | None:
    """The gang a pod object names (scheduler-plugins' label first, then Volcano's annotation), or None."""
    meta = obj.get("metadata") or {}
    if not isinstance(meta, Mapping):
        return None
    ns = str(meta.get("namespace") or "default")
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    name = labels.get(POD_GROUP_LABEL) if isinstance(labels, Mapping) else None
    if isinstance(name, str) and name:
        return GangRef(POD_GROUP_API, ns, name)
    name = annotations.get(VOLCANO_ANNOTATION) if isinstance(annotations, Mapping) else None
    if isinstance(name, str) and name:
        return GangRef(VOLCANO_API, ns, name)
    return None


def queue_label(meta: Mapping[str, Any]) -> str | None:
    """The queue a pod's labels name (corral.dev/queue, then kueue.x-k8s.io/queue-name, then kai.scheduler/queue)."""
    labels = meta.get("labels") or {}
    if isinstance(labels, Mapping):
        for label in QUEUE_LABELS:
            value = labels.get(label)
            if isinstance(value, str) and value:
                return value
    return None


def queue_of(obj: Mapping[str, Any]) -> str:
    """The queue a pod names (corral.dev/queue, kueue.x-k8s.io/queue-name, kai.scheduler/queue), else its namespace."""
    meta = obj.get("metadata") or {}
    if not isinstance(meta, Mapping):
        return "default"
    return queue_label(meta) or str(meta.get("namespace") or "default")


def min_member(ref: GangRef, group: Mapping[str, Any] | None) -> tuple[int, str]:
    """A PodGroup object's spec.minMember, or (0, why it cannot be used)."""
    what = f"PodGroup {ref.key} ({ref.api})"
    if group is None:
        return 0, f"{what} not found; its members wait until it exists"
    spec = group.get("spec") or {}
    value = spec.get("minMember") if isinstance(spec, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        return 0, f"{what}: spec.minMember must be a whole number, got {value!r}"
    n = int(value)
    if n < 1:
        return 0, f"{what}: spec.minMember must be >= 1, got {n}"
    if n > MAX_MIN_MEMBER:
        return 0, f"{what}: spec.minMember {n} is more than corral places together (at most {MAX_MIN_MEMBER})"
    return n, ""


def _wait(p: Pending, reason: str, code: str, unresolvable: bool) -> Decision:
    from corral.k8s.scheduler.batch import Wait

    return Wait(p, reason, code, unresolvable)


def place_gang(
    members: Sequence[Pending], info: GangInfo, snapshot: ClusterSnapshot | None, config: PlacementConfig
) -> list[Decision]:
    """One decision per member (in `members`' order): Binds for all that go, or Waits for all (but members that
    cannot be read, which wait with their own reason, and members beyond minMember that did not fit)."""
    from corral.k8s.convert import assignment_annotations, make_assignment
    from corral.k8s.scheduler.batch import INVALID, NO_NODES, Bind, primary_code
    from corral.tenancy.gang import place_members

    name = f"gang {info.ref.key}"
    if info.error:
        return [_wait(p, f"{name}: {info.error}", GANG_INVALID, True) for p in members]
    valid = [p for p in members if p.ask is not None]
    out: dict[str, Decision] = {p.key: _wait(p, p.error, INVALID, True) for p in members if p.ask is None}
    need = max(0, info.min_member - info.held)
    head = f"{name}: {len(valid)} of {info.min_member} members pending"
    if info.held:
        head += f", {info.held} bound"
    if len(valid) < need:
        more = need - len(valid)
        reason = f"{head}, needs {info.min_member} that fit together; waiting for {more} more"
        for p in valid:
            out[p.key] = _wait(p, reason, GANG_INCOMPLETE, False)
        return [out[p.key] for p in members]
    if snapshot is None:
        for p in valid:
            out[p.key] = _wait(p, "corral knows no nodes yet", NO_NODES, False)
        return [out[p.key] for p in members]
    # corral's one gang placer (corral.tenancy.gang.place_members): members one after the other on a copy, each
    # seeing the earlier ones' grants, up to the first that does not fit
    found = place_members(snapshot, [p.ask.request for p in valid if p.ask is not None], config, None)
    placed = [(p, d.allocation) for p, d in zip(valid, found.placed, strict=False)]
    first_fail = ""
    unresolvable = False
    if found.fitted < len(valid):
        stuck = valid[found.fitted]
        if found.error is not None:
            first_fail, unresolvable = f"{stuck.name}: {found.error}", True
        elif found.last is not None:
            d = found.last
            first_fail = f"{stuck.name}: {render(d.explanation)}"
            unresolvable = bool(len(d.node_reasons)) and bool((d.node_reasons & UNRESOLVABLE_BITS).all())
    if len(placed) >= need:
        beyond = (f"{name}: beyond minMember and does not fit: "
                  f"{render(found.last.explanation) if found.last is not None else first_fail}")  # fmt: skip
        code = primary_code(found.last.explanation) if found.last is not None else INVALID
        for p in valid[found.fitted :]:
            out[p.key] = _wait(p, beyond, code, False)
        for p, alloc in placed:
            assert p.ask is not None and alloc is not None
            snapshot.allocate(alloc)
            assignment = make_assignment(alloc, snapshot.nodes[alloc.node_index], p.ask)
            out[p.key] = Bind(p, alloc, assignment, assignment_annotations(assignment, p.ask.style))
        return [out[p.key] for p in members]
    reason = f"{head}, needs {need} that fit together; only {len(placed)} fit; {first_fail}"
    for p in valid:
        out[p.key] = _wait(p, reason, GANG_UNFIT, unresolvable)
    return [out[p.key] for p in members]
