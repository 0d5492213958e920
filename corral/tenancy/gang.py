"""Gang placement: several requests placed together, all or none. The one gang placer of corral (pure).

    place_members(snapshot, requests, apart, one_node)
        on a copy of the snapshot: place request 0, allocate it, place request 1, ... each seeing the earlier grants
        -> all fit: their allocations, in order
        -> member j does not fit (or is invalid): nothing is granted; j fitted, and the failing decision (or error)
        apart:    what is left of a GPU a member got a share of is held on the copy, so members never share a GPU
        one_node: every member on the node of the first (one job's instances: one supervisor, one machine)

Two callers, one placer:
    place_gang       one job of N instances (`corral serve`: JobSpec.instances; apart, one node): one Allocation for
                     the job (CPU and memory times N, the instances' GPU grants one after the other, instance i's are
                     grants [i*k, (i+1)*k) for k GPUs each)
    round.place_group  a gang group (a Marathon app labelled corral.gang; next, a PodGroup): members are separate
                     jobs or pods, each with its own grant, placed on what is free or on what the head's reservation
                     leaves
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from corral.model.errors import InvalidRequest
from corral.model.resources import MILLI_PER_GPU, Allocation, GpuGrant, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import Decision, PlacementConfig, place, render
from corral.placement.explain import Explanation


def member_id(job_id: str, instance: int) -> str:
    """The id of a gang's instance: "7_0", "7_1" (store ids are numbers, so "_" never occurs in a job's)."""
    return f"{job_id}_{instance}"


@dataclass(frozen=True)
class Members:
    """What `place_members` found: every member's allocation, or how far it got and why it stopped."""

    placed: tuple[Decision, ...]  # the decisions of the members placed, in order (every member's when all fit)
    last: Decision | None  # the last decision made (the failing one when not all fit); None after an error
    error: InvalidRequest | None = None  # the failing member's request can never be placed

    @property
    def fitted(self) -> int:
        return len(self.placed)

    @property
    def allocations(self) -> tuple[Allocation, ...]:
        return tuple(d.allocation for d in self.placed if d.allocation is not None)


def place_members(
    snapshot: ClusterSnapshot,
    requests: Sequence[Request],
    config: PlacementConfig,
    rng: np.random.Generator | int | None,
    *,
    apart: bool = False,
    one_node: bool = False,
) -> Members:
    """Place `requests` one after the other on a copy of `snapshot` (unchanged): all, or up to the first that does
    not fit (see the module)."""
    trial = snapshot.copy()
    out: list[Decision] = []
    node = -1
    decision: Decision | None = None
    for i, one in enumerate(requests):
        try:
            decision = place(trial, one, config, rng)
        except InvalidRequest as exc:
            return Members(tuple(out), None, exc)
        alloc = decision.allocation
        if alloc is None or (one_node and out and alloc.node_index != node):
            return Members(tuple(out), decision)
        trial.allocate(alloc)
        if apart and i + 1 < len(requests):  # the last member has no one after it to keep off its GPUs
            _hold_rest(trial, alloc, one.id)
        node = alloc.node_index
        out.append(decision)
    return Members(tuple(out), decision)


@dataclass(frozen=True)
class GangDecision:
    """Where a gang goes: `allocation` for all N, or None with `fitted` < N and the failing instance's decision."""

    allocation: Allocation | None
    fitted: int
    instances: int
    last: Decision  # the last instance's decision (the failing one when not placed)

    @property
    def explanation(self) -> Explanation:
        return self.last.explanation

    def reason(self) -> str:
        return (
            f"{self.fitted} of {self.instances} instances fit (a gang starts all or none); "
            f"instance {self.fitted + 1}: {render(self.last.explanation)}"
        )

    def unresolvable(self, node: int) -> bool:
        return self.fitted == 0 and self.last.unresolvable(node)


def place_gang(
    snapshot: ClusterSnapshot,
    request: Request,
    instances: int,
    config: PlacementConfig,
    rng: np.random.Generator | int | None,
) -> GangDecision:
    """Place `instances` copies of `request` together on one node of a snapshot copy; `snapshot` is not changed.

    The instances of a gang never share a GPU with each other (each is a worker of its own), which also keeps one
    grant per GPU in the job's allocation, as a snapshot holds. InvalidRequest as `place` raises it."""
    copies = [replace(request, id=member_id(request.id, i)) for i in range(instances)]
    found = place_members(snapshot, copies, config, rng, apart=True, one_node=True)
    if found.error is not None:
        raise found.error
    assert found.last is not None
    if found.fitted < instances:
        return GangDecision(None, found.fitted, instances, found.last)
    node = found.allocations[0]
    combined = Allocation(
        request.id,
        node.node,
        node.node_index,
        request.cpu_milli * instances,
        request.memory_mib * instances,
        tuple(g for a in found.allocations for g in a.gpus),
        node.tag,
        node.share_owner,
    )
    return GangDecision(combined, instances, instances, found.last)


def _hold_rest(trial: ClusterSnapshot, alloc: Allocation, rid: str) -> None:
    """Hold on `trial` what is left of each GPU `alloc` got a share of. A share by memory alone leaves the GPU's
    compute whole (1000 milli): one grant of 1000 milli would claim a whole GPU, which the snapshot refuses for a GPU
    partly held, so the rest is held as 999 milli with the memory plus 1 milli."""
    for g in alloc.gpus:
        rest_milli = int(trial.gpu_milli_free[alloc.node_index, g.index])
        rest_mib = int(trial.gpu_mem_free[alloc.node_index, g.index])
        blocks = [(rest_milli, rest_mib)] if rest_milli < MILLI_PER_GPU else [(rest_milli - 1, rest_mib), (1, 0)]
        for k, (milli, mib) in enumerate(blocks):
            if milli or mib:
                block = GpuGrant(g.index, milli, mib)
                held_id = f"{rid}:rest{g.index}" + (f".{k}" if k else "")
                trial.allocate(Allocation(held_id, alloc.node, alloc.node_index, 0, 0, (block,)))


def merged(alloc: Allocation) -> Allocation:
    """The allocation with grants on one GPU summed (a snapshot holds one grant per GPU per allocation)."""
    per: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for g in alloc.gpus:
        per[g.index][0] += g.milli
        per[g.index][1] += g.memory_mib
    if len(per) == len(alloc.gpus):
        return alloc
    return replace(alloc, gpus=tuple(GpuGrant(i, min(1000, m), mib) for i, (m, mib) in per.items()))


def combined_request(request: Request, instances: int) -> Request:
    """One request standing for a gang when its reservation is planned: N times the CPU, memory and GPUs, on
    distinct GPUs (exact for whole GPUs; for shares a stricter ask, so the reservation is never too early)."""
    if instances == 1:
        return request
    return replace(
        request,
        cpu_milli=request.cpu_milli * instances,
        memory_mib=request.memory_mib * instances,
        gpu_count=request.gpu_count * instances,
    )
