"""Hosts kept for the workload's multi-GPU pods while they are running out.

A pod that needs many GPUs and most of a node's CPU (openb `default`: 8 GPUs and 120 cores, which only an entirely
free 8-GPU, 128-core node can take) is rare, so it barely counts in any expectation over the workload, yet once every
node that could host it holds some small pod, it waits or fails however much capacity is free elsewhere. For each
multi-GPU type m of the workload (typical types and the rare tail):

    hosts_m     = nodes where one pod of m fits now (CPU, and m's GPU count of GPUs of an allowed model with room)
    demand_m    = H x (probability of m and of every type at least as demanding, which needs the same hosts)
                  H = pods still to come before the cluster's free GPU milli is used up (`scarcity.horizon`)
    reserve_m   = ceil(demand_m)

While |hosts_m| <= reserve_m, a pod less demanding than m that would leave a host of m unable to take one is
*kept off* those hosts: the policy ranks such nodes below every other feasible node (they stay feasible, so a pod
that fits nowhere else still lands). While hosts are plentiful nothing is kept, so the look-ahead elsewhere is free to
use them; as the cluster fills, H and with it the reserve shrink to nothing.

**A margin for pods with GPUs** (issue 16). demand_m is what the hosts must hold for m's own pods, but by the time
|hosts_m| falls to it, pods with nowhere else to go already land on hosts too, and the last hosts go within a few
percent of arrivals (`multigpu50p` seed 42: the 15 hosts of 8-GPU pods left at arrived 95 % were all gone at 97 %,
against about 8 such pods arriving in between; one more 8-GPU pod failed than under fgd). So a pod with GPUs keeps
off hosts while |hosts_m| <= ceil(GPU_POD_MARGIN x demand_m): it still has every other GPU node to go to, and it is
those pods (1-GPU ones above all) that break the last empty 8-GPU nodes. A pod without GPUs keeps the margin of 1:
kept off a CPU-rich host, it lands on a GPU node and takes CPU that node's GPUs need, which on CPU-heavy lists costs
more than the hosts save (margin 1.5 for every pod lost to fgd on two of three `cpu300p` seeds; docs/beyond-fgd.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from corral.model.arrays import BoolArray, IntArray
from corral.model.resources import Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement.scarce_hosts import scarce_hosts
from corral.placement.scarcity import horizon
from corral.placement.workload import TargetType, TargetWorkload

#: A pod with GPUs keeps off hosts of m while they number at most this times the pods of m to come (docstring).
#: 1.5 was the first value tried after 2.0 (2.0 also kept every multigpu50p seed above fgd, and lost more on
#: cpu300p when applied to every pod); it is the same for every list.
GPU_POD_MARGIN = 1.5


def _at_least(a: TargetType, b: TargetType) -> bool:
    """a needs at least what b needs, on a subset of b's models (so every host of a is a host of b)."""
    models_ok = b.models is None or (a.models is not None and a.models <= b.models)
    return a.cpu_milli >= b.cpu_milli and a.gpu_count >= b.gpu_count and a.gpu_milli >= b.gpu_milli and models_ok


def _covers(r: Request, t: TargetType) -> bool:
    return r.cpu_milli >= t.cpu_milli and r.gpu_count >= t.gpu_count and r.gpu_milli >= t.gpu_milli


def _gang_table(snapshot: ClusterSnapshot, workload: TargetWorkload) -> _Gang:
    """Every multi-GPU type of the workload, with per node the GPUs that have room for one of its GPUs and whether
    one pod of it fits now, and per type the number of such hosts; refreshed only for nodes that changed."""
    key = ("gang-hosts", workload.key)
    table: _Gang | None = snapshot.memo.get(key)
    if table is None:
        types = tuple(t for t in (*workload.types, *workload.tail) if t.gpu_count >= 2 and t.probability > 0)
        n, k = len(snapshot), len(types)
        masks = (
            np.stack([snapshot.gpu_static_mask(t.models, 0) for t in types])
            if types
            else np.zeros((0, n, snapshot.max_gpus), dtype=np.bool_)
        )
        table = _Gang(
            types,
            masks,
            np.array([t.gpu_milli for t in types], dtype=np.int64).reshape(k, 1, 1),
            np.array([[t.gpu_count] for t in types], dtype=np.int64).reshape(k, 1),
            np.array([[t.cpu_milli] for t in types], dtype=np.int64).reshape(k, 1),
            np.full(n, -1, dtype=np.int64),
            np.zeros((k, n), dtype=np.int64),
            np.zeros((k, n), dtype=np.bool_),
            np.zeros(k, dtype=np.int64),
        )
        snapshot.memo[key] = table
    stale = np.flatnonzero(table.versions != snapshot.version)
    if len(stale):
        if table.types:
            room = ((snapshot.gpu_milli_free[stale][None] >= table.milli) & table.masks[:, stale]).sum(axis=2)
            hosts = (snapshot.cpu_free[stale][None] >= table.cpu) & (room >= table.count)
            table.counts[:] += hosts.sum(axis=1) - table.hosts[:, stale].sum(axis=1)
            table.room[:, stale] = room
            table.hosts[:, stale] = hosts
        table.versions[stale] = snapshot.version[stale]
    return table


def _request_gang(table: _Gang, request: Request) -> list[tuple[int, float]]:
    """The multi-GPU types the request does not cover (indices into the table), each with the probability of it and
    of every such type at least as demanding (what its reserve is made of)."""
    gang = [i for i, t in enumerate(table.types) if not _covers(request, t)]
    return [
        (i, sum(table.types[o].probability for o in gang if _at_least(table.types[o], table.types[i]))) for i in gang
    ]


def kept_hosts(
    snapshot: ClusterSnapshot,
    workload: TargetWorkload,
    request: Request,
    nodes: IntArray,
    cpu: bool = False,
    margin: float = 1.0,
) -> BoolArray:
    """Of `nodes`, those the request should keep off (see the module docstring; `cpu`: H counts free CPU too;
    `margin`: the reserve is ceil(margin x demand), GPU_POD_MARGIN for a pod with GPUs in fgd-priced)."""
    keep = np.zeros(len(nodes), dtype=np.bool_)
    table = _gang_table(snapshot, workload)
    # The types and their probabilities depend only on the workload and the request's shape: kept per shape.
    key = ("gang-types", workload.key, request.cpu_milli, request.gpu_count, request.gpu_milli)
    gang: list[tuple[int, float]] | None = snapshot.memo.get(key)
    if gang is None:
        gang = _request_gang(table, request)
        snapshot.memo[key] = gang
    if not gang:
        return keep
    h = horizon(snapshot, workload, cpu)
    scarce = scarce_hosts(snapshot, workload, table.types)  # all kept, and left to drain (`placement.scarce_hosts`)
    after_cpu: IntArray | None = None
    for i, probability in gang:
        reserve = max(math.ceil(margin * h * probability - 1e-9), int(scarce.floors[i]))
        if scarce.floors[i]:
            keep |= scarce.nodes[i, nodes] & ~table.hosts[i, nodes]
        count = int(table.counts[i])
        if reserve <= 0 or count == 0 or count > reserve:
            continue
        t = table.types[i]
        # Would the request leave the host unable to take one pod of t? (It takes its GPUs from those with room.)
        if after_cpu is None:
            after_cpu = snapshot.cpu_free[nodes] - request.cpu_milli
        after_room = table.room[i, nodes] - request.gpu_count
        keep |= table.hosts[i, nodes] & ((after_cpu < t.cpu_milli) | (after_room < t.gpu_count))
    return keep


@dataclass(frozen=True, eq=False)
class _Gang:
    types: tuple[TargetType, ...]
    masks: BoolArray  # types x nodes x GPUs: GPUs of an allowed model
    milli: IntArray  # types x 1 x 1, per GPU
    count: IntArray  # types x 1
    cpu: IntArray  # types x 1
    versions: IntArray  # nodes: `snapshot.version` when room and hosts were computed
    room: IntArray  # types x nodes: GPUs of an allowed model with room for one GPU of the type
    hosts: BoolArray  # types x nodes: one pod of the type fits now
    counts: IntArray  # types: hosts per type
