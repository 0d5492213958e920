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
"""

from __future__ import annotations

import math

import numpy as np

from corral.model.arrays import BoolArray, IntArray
from corral.model.resources import Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement.scarcity import horizon
from corral.placement.workload import TargetType, TargetWorkload


def _at_least(a: TargetType, b: TargetType) -> bool:
    """a needs at least what b needs, on a subset of b's models (so every host of a is a host of b)."""
    models_ok = b.models is None or (a.models is not None and a.models <= b.models)
    return a.cpu_milli >= b.cpu_milli and a.gpu_count >= b.gpu_count and a.gpu_milli >= b.gpu_milli and models_ok


def _covers(r: Request, t: TargetType) -> bool:
    return r.cpu_milli >= t.cpu_milli and r.gpu_count >= t.gpu_count and r.gpu_milli >= t.gpu_milli


def kept_hosts(snapshot: ClusterSnapshot, workload: TargetWorkload, request: Request, nodes: IntArray) -> BoolArray:
    """Of `nodes`, those the request should keep off (see the module docstring)."""
    keep = np.zeros(len(nodes), dtype=np.bool_)
    gang = [t for t in (*workload.types, *workload.tail) if t.gpu_count >= 2 and t.probability > 0]
    gang = [t for t in gang if not _covers(request, t)]
    if not gang:
        return keep
    h = horizon(snapshot, workload)
    rooms: dict[tuple[int, frozenset[str] | None], IntArray] = {}
    for t in gang:
        reserve = math.ceil(h * sum(o.probability for o in gang if _at_least(o, t)) - 1e-9)
        if reserve <= 0:
            continue
        room = rooms.get((t.gpu_milli, t.models))
        if room is None:  # per node: GPUs of an allowed model with room for one GPU of t
            allowed = snapshot.gpu_static_mask(t.models, 0)
            room = rooms[(t.gpu_milli, t.models)] = ((snapshot.gpu_milli_free >= t.gpu_milli) & allowed).sum(axis=1)
        hosts = (snapshot.cpu_free >= t.cpu_milli) & (room >= t.gpu_count)
        count = int(np.count_nonzero(hosts))
        if count == 0 or count > reserve:
            continue
        # Would the request leave the host unable to take one pod of t? (It takes its GPUs from those with room.)
        after_cpu = snapshot.cpu_free[nodes] - request.cpu_milli
        after_room = room[nodes] - request.gpu_count
        keep |= hosts[nodes] & ((after_cpu < t.cpu_milli) | (after_room < t.gpu_count))
    return keep
