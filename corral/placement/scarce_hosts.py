"""A floor under the reserve of `placement.reserve` for multi-GPU types whose hosts are few (issue 16).

The reserve keeps ceil(margin x H x p_m) hosts of a multi-GPU type m, H the pods still to come before the free
capacity is used up. That count is right for a cluster that only fills (the offline replays), and wrong in two ways
for one that runs, where pods also leave:

* H counts the arrivals until the cluster is full, but in a running cluster pods leave and m's pods keep coming:
  whatever H says, m needs somewhere to run for as long as it has a probability above zero.
* A pod that breaks a host of m keeps it broken for its whole run, which the engine does not know and which in the
  traces runs from minutes to months. Where m has 39 hosts, two lost to months-long pods cost it 5 %; where it has
  three, they cost it two thirds.

`corral sim fair` on every 16th openb node (76 nodes, 3 of them the only hosts of the 8-GPU, 120-core pods): on the
empty cluster H x p x 1.5 = 0.34, so the reserve was 1 of 3 hosts, and the first two 1-GPU pods (running 131 and
145 days) went to the other two, where fgd-scarcity's look-ahead likes them (CPU-rich nodes strand nothing). The
8-GPU jobs then shared the last host: the longest waited 226,000 s, against fgd's 129,000 s.

So a type whose hosts are *scarce*, few in absolute terms and a small part of the cluster's GPU nodes, keeps all of
them, and lets those that were broken drain:

    static_hosts_m = nodes where one pod of m fits when the node is empty (CPU, m's GPU count of allowed models)
    scarce         = static_hosts_m <= SCARCE_HOSTS and <= SCARCE_SHARE x nodes with GPUs
    reserve_m      = max(ceil(margin x H x p_m), |static_hosts_m| if scarce else 0)
    kept off       = (as before) a host of m the pod would break, while |hosts_m| <= reserve_m
                     + if scarce, a static host of m that is not a host now (a pod there delays its draining)

for every pod less demanding than m. Kept nodes stay feasible and only rank last, so a pod that fits nowhere else
still lands on one (the cluster is never held idle for a pod that may not come). The drain rule matters once the
cluster is contended: every host is then broken by pods that had nowhere else to go, and without it fgd-scarcity's
look-ahead refills a CPU-rich G3 node with 1-GPU pods each time part of it frees (same run: with the floor alone the
longest wait was 169,000 s, with both 129,000 s, fgd's figure; that is seed 42: on seed 43 the waits were longer
than without either rule, see BENCHMARKS.md "fgd-priced online: the largest jobs").

The whole openb cluster has 39 hosts of the 8-GPU, 120-core pods, and no multi-GPU type of any of the 15 offline
lists has 1..4 hosts there: no type is scarce, and the offline replays are unchanged. Uses the inventory and the
workload's types only, never the trace's future.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from corral.model.arrays import BoolArray, IntArray
from corral.model.snapshot import ClusterSnapshot
from corral.placement.workload import TargetType, TargetWorkload

#: At most this many hosts in all: losing one costs the type at least a quarter of where it can run.
SCARCE_HOSTS = 4
#: And at most this part of the nodes with GPUs: keeping them all off-limits costs other pods little room. (On a
#: cluster of a few 8-GPU nodes every node is a host, and keeping them all would only reorder them.)
SCARCE_SHARE = 0.1


def static_host_mask(snapshot: ClusterSnapshot, t: TargetType) -> BoolArray:
    """Nodes where one pod of `t` fits when the node is empty: enough CPU, and `t`'s GPU count of GPUs of an
    allowed model (an empty GPU has room for any share)."""
    room = snapshot.gpu_static_mask(t.models, 0).sum(axis=1)
    out: BoolArray = (snapshot.cpu_cap >= t.cpu_milli) & (room >= t.gpu_count)
    return out


@dataclass(frozen=True, eq=False)
class ScarceHosts:
    """Per multi-GPU type of the reserve (its `types`): the hosts it keeps whatever the reserve says, and which
    nodes those are (all False for a type whose hosts are not scarce)."""

    floors: IntArray  # types
    nodes: BoolArray  # types x nodes: could host one pod of the type when empty, for a scarce type


def scarce_hosts(snapshot: ClusterSnapshot, workload: TargetWorkload, types: tuple[TargetType, ...]) -> ScarceHosts:
    """The floors and nodes of the module docstring; static per inventory and workload, so computed once."""
    key = ("scarce-hosts", workload.key)
    out: ScarceHosts | None = snapshot.memo.get(key)
    if out is None:
        gpu_nodes = int(np.count_nonzero(snapshot.gpu_present.any(axis=1)))
        masks = [static_host_mask(snapshot, t) for t in types]
        counts = [int(np.count_nonzero(m)) for m in masks]
        scarce = [0 < c <= SCARCE_HOSTS and c <= SCARCE_SHARE * gpu_nodes for c in counts]
        out = ScarceHosts(
            np.array([c if ok else 0 for c, ok in zip(counts, scarce, strict=True)], dtype=np.int64),
            np.array([m & ok for m, ok in zip(masks, scarce, strict=True)], dtype=np.bool_).reshape(
                len(types), len(snapshot)
            ),
        )
        snapshot.memo[key] = out
    return out
