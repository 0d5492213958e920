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
those pods (1-GPU ones above all) that break the last empty 8-GPU nodes. The margin holds only while free GPU milli
runs out no later than free CPU (`gpu_runs_out_later`: the CPU-aware horizon is not the smaller). Where CPU runs out
first, fewer multi-GPU pods will come than H_gpu promises (the CPU-aware H already shrinks the demand), and a pod
kept off a CPU-rich host lands on a node whose CPU that node's GPUs need: there the margin cost `cpu250p` 0.22 pp
against fgd on a held-out seed. A pod without GPUs keeps the margin of 1 for the same reason (margin 1.5 for every
pod lost to fgd on two of three `cpu300p` seeds; docs/beyond-fgd.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from corral.model.arrays import BoolArray, FloatArray, IntArray
from corral.model.resources import Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement.native import kernels
from corral.placement.scarce_hosts import scarce_hosts
from corral.placement.scarcity import horizon, horizons
from corral.placement.workload import TargetType, TargetWorkload

#: A pod with GPUs keeps off hosts of m while they number at most this times the pods of m to come (docstring).
#: 1.5 and 2.0 were the two values tried (both for every pod at first: each kept every multigpu50p seed above fgd;
#: on cpu300p 2.0 lost all three seeds, 1.5 one); it is the same for every list.
GPU_POD_MARGIN = 1.5


def _at_least(a: TargetType, b: TargetType) -> bool:
    """a needs at least what b needs, on a subset of b's models (so every host of a is a host of b)."""
    models_ok = b.models is None or (a.models is not None and a.models <= b.models)
    return a.cpu_milli >= b.cpu_milli and a.gpu_count >= b.gpu_count and a.gpu_milli >= b.gpu_milli and models_ok


def _covers(r: Request, t: TargetType) -> bool:
    return r.cpu_milli >= t.cpu_milli and r.gpu_count >= t.gpu_count and r.gpu_milli >= t.gpu_milli


def _gang_table(snapshot: ClusterSnapshot, workload: TargetWorkload) -> _Gang:
    """Every multi-GPU type of the workload, with per node and GPU group (types of the same models and milli per
    GPU) the GPUs with room for one GPU of the group, and per type the number of nodes where one pod fits now;
    refreshed only for nodes that changed."""
    key = ("gang-hosts", workload.key)
    table: _Gang | None = snapshot.memo.get(key)
    if table is None:
        types = tuple(t for t in (*workload.types, *workload.tail) if t.gpu_count >= 2 and t.probability > 0)
        # Types share room per (models, milli): openb's multi-GPU types all take whole GPUs, so 13 types (`default`)
        # are one group and 19 (`gpuspec20`) five; room is counted once per group, not once per type.
        groups: dict[tuple[frozenset[str] | None, int], int] = {}
        group = [groups.setdefault((t.models, t.gpu_milli), len(groups)) for t in types]
        g, n = len(groups), len(snapshot)
        masks = (
            np.stack([snapshot.gpu_static_mask(models, 0) for models, _ in groups])
            if groups
            else np.zeros((0, n, snapshot.max_gpus), dtype=np.bool_)
        )
        table = _Gang(
            types,
            np.array(group, dtype=np.int64),
            np.ascontiguousarray(masks),
            np.array([milli for _, milli in groups], dtype=np.int64),
            np.array([t.gpu_count for t in types], dtype=np.int64),
            np.array([t.cpu_milli for t in types], dtype=np.int64),
            np.full(n, -1, dtype=np.int64),
            np.zeros(n, dtype=np.int64),
            np.zeros((g, n), dtype=np.int64),
            np.zeros(len(types), dtype=np.int64),
        )
        snapshot.memo[key] = table
    s = snapshot
    t = table
    kernels().refresh_gang(
        s.version, s.cpu_free, s.gpu_milli_free, t.masks, t.milli, t.cpu, t.count, t.group, t.versions, t.cpu_seen,
        t.room, t.counts,
    )  # fmt: skip
    return table


def _hosts(snapshot: ClusterSnapshot, table: _Gang, i: int, nodes: IntArray) -> BoolArray:
    """Of `nodes`, those where one pod of type i fits now (the table is fresh)."""
    out: BoolArray = (snapshot.cpu_free[nodes] >= table.cpu[i]) & (table.room[table.group[i], nodes] >= table.count[i])
    return out


def _request_gang(table: _Gang, request: Request) -> list[tuple[int, float]]:
    """The multi-GPU types the request does not cover (indices into the table), each with the probability of it and
    of every such type at least as demanding (what its reserve is made of)."""
    gang = [i for i, t in enumerate(table.types) if not _covers(request, t)]
    return [
        (i, sum(table.types[o].probability for o in gang if _at_least(table.types[o], table.types[i]))) for i in gang
    ]


def gpu_runs_out_later(snapshot: ClusterSnapshot, workload: TargetWorkload) -> bool:
    """Whether free CPU runs out before free GPU milli (the CPU-aware horizon is the smaller): then the margin for
    pods with GPUs does not apply (module docstring)."""
    gpu, cpu = horizons(snapshot, workload)
    return cpu < gpu


@dataclass(frozen=True, eq=False)
class _Shape:
    """Per request shape: its gang types (as `_request_gang`) and their floors, as arrays for `kernels.reserve_pass`
    (no Python lists of tuples: the memo counts an entry's bytes by walking it)."""

    scarce: list[int]  # gang types whose hosts are scarce (floor > 0)
    types: IntArray  # the gang types (`_request_gang`), with the probability their reserve is made of and floor
    probability: FloatArray
    floor: IntArray


def kept_hosts(
    snapshot: ClusterSnapshot,
    workload: TargetWorkload,
    request: Request,
    nodes: IntArray,
    cpu: bool = False,
    margin: float = 1.0,
    h: float | None = None,
) -> BoolArray:
    """Of `nodes`, those the request should keep off (see the module docstring; `cpu`: H counts free CPU too;
    `margin`: the reserve is ceil(margin x demand), GPU_POD_MARGIN for a pod with GPUs in fgd-priced; `h`: H, where
    the caller has it)."""
    keep = np.zeros(len(nodes), dtype=np.bool_)
    table = _gang_table(snapshot, workload)
    # The types, their probabilities and floors depend only on the workload and the request's shape: kept per shape.
    key = ("gang-types", workload.key, request.cpu_milli, request.gpu_count, request.gpu_milli)
    shape: _Shape | None = snapshot.memo.get(key)
    if shape is None:
        floors = scarce_hosts(snapshot, workload, table.types).floors.tolist()
        gang = [(i, p, floors[i]) for i, p in _request_gang(table, request)]
        shape = _Shape(
            [i for i, _, f in gang if f],
            np.array([i for i, _, _ in gang], dtype=np.int64),
            np.array([p for _, p, _ in gang], dtype=np.float64),
            np.array([f for _, _, f in gang], dtype=np.int64),
        )
        snapshot.memo[key] = shape
    if not len(shape.types):
        return keep
    if shape.scarce:  # all kept, and left to drain (`placement.scarce_hosts`)
        scarce = scarce_hosts(snapshot, workload, table.types)
        for i in shape.scarce:
            keep |= scarce.nodes[i, nodes] & ~_hosts(snapshot, table, i, nodes)
    # The reserve of each type from H and the counts alone; where a type is at its reserve, the pass over the nodes
    # (on openb `default` seed 42, 7,160 of 8,403 decisions; the others touch no node).
    mh = margin * (horizon(snapshot, workload, cpu) if h is None else h)  # margin x H x p, in the same order as ever
    broken: BoolArray = kernels().reserve_pass(
        nodes, snapshot.cpu_free, table.room, table.counts, shape.types, shape.probability, shape.floor,
        bool(shape.scarce), mh, table.group, table.cpu, table.count, request.cpu_milli, request.gpu_count,
    )  # fmt: skip
    return keep | broken if shape.scarce else broken


@dataclass(frozen=True, eq=False)
class _Gang:
    types: tuple[TargetType, ...]
    group: IntArray  # types: index of the type's group (models, milli per GPU)
    masks: BoolArray  # groups x nodes x GPUs: GPUs of an allowed model
    milli: IntArray  # groups: milli per GPU
    count: IntArray  # types: GPUs per pod
    cpu: IntArray  # types: CPU milli per pod
    versions: IntArray  # nodes: `snapshot.version` when room was computed
    cpu_seen: IntArray  # nodes: free CPU then (what the counts hold, to take a node out of them when it changes)
    room: IntArray  # groups x nodes: GPUs of an allowed model with room for one GPU of the group
    counts: IntArray  # types: nodes where one pod of the type fits now
