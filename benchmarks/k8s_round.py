"""One round of `corral k8s scheduler --queues` at a cluster's scale, in process (issue 25: <= 200 ms).

    PYTHONPATH=. python -m benchmarks.k8s_round [--nodes 5000] [--pending 10000] [--rounds 5] [--profile FILE]

The books: `--nodes` nodes of 8 A100s (as the device plugin publishes them), read by ClusterState; 39,900 pods of
this scheduler bound (one GPU each; 100 nodes keep one GPU free), spread over 4 queues (namespaces team-0..3, each
guaranteed a quarter) so that team-0 holds twice its quarter (a borrower) and team-3 half of its quarter. Pending:
`--pending` pods over the 4 queues (their namespaces), of 1, 2, 4 and 8 GPUs (4:3:2:1), each with a time limit.
A round is the scheduler's `_plan` less its locking: the copy of the bound pods, `plan_pods` (queue order by weighted
DRF, limits, the pass with the head's reservation, preemption planning, each waiting pod's words) and `settle` (the
face's records kept from the collector's full scans once made, as the scheduler does). It is timed as the scheduler
runs it: the first round (every
pod converted once: ShapeCache), then `--rounds` more over the same pod objects (the pods' Works cached), each
round's binds given back after it so that every round sees the same books. Preemption is planned (team-3 is below
its guarantee, team-0 borrows) unless --no-preempt (the scheduler without an evictions implementation).
The pending pods are as an API server makes them in a burst: random UIDs, creation times to the second, BURST a
second (so the queue order breaks ties of age by UID, as on a plane).

`--trickle`: the real plane's steady state (k8s_round_plane): the first round's binds stay bound (the cluster is
then full), and one more pod arrives before each round; with `--recent` every round also works out when preemption
would first help.

`--whole`: the whole scheduler's round rather than `_plan`'s: a `Scheduler` (its API a stub that accepts every
Binding and write) over the same books, every pending pod one of its waiting pods, each round its own `_take` and
`_place` (what its `corral_scheduler_batch_duration_seconds` times, and the bookkeeping of each pod's words after
it), as `--trickle`; the writes a round asks for are carried out between rounds, untimed, as its writer thread would.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import datetime
import gc
import os
import platform
import random
import statistics
import time
import uuid
from typing import Any

from corral.k8s.convert import ANN_NODE_GPUS, node_gpus_annotation
from corral.k8s.fake import node_object, pod_object
from corral.k8s.scheduler.batch import Bind, Pending
from corral.k8s.scheduler.core import pending_of
from corral.k8s.scheduler.tenancy import (
    Bound,
    BoundRequests,
    Face,
    NoEvictions,
    collector_for_rounds,
    plan_pods,
    settle,
)
from corral.k8s.state import ClusterState
from corral.model.resources import Allocation, GpuDevice, GpuGrant
from corral.placement import PlacementConfig
from corral.tenancy.config import parse_queues

GPUS = 8
QUEUES = 4
#: Pods created a second in the pending burst (a real plane's: 10,000 pods in about 14 s, k8s_round_plane)
BURST = 700
NOW = 1_800_000_000.0


def queues_file(queues: int, gpus_total: int) -> str:
    share = gpus_total // queues
    out = ['min_runtime = "5m"']
    for q in range(queues):
        out.append(f'[queues.team-{q}]\nnamespaces = ["team-{q}"]\nguarantee = {{ gpus = {share} }}')
    return "\n".join(out) + "\n"


def build(nodes: int, pending: int) -> tuple[ClusterState, dict[str, Bound], list[Pending], Face]:
    objs = []
    for n in range(nodes):
        gpus = tuple(GpuDevice(j, "A100", 81920, f"GPU-n{n}-{j}") for j in range(GPUS))
        objs.append(node_object(f"n{n}", "128", "1024Gi", {ANN_NODE_GPUS: node_gpus_annotation(gpus)}))
    state = ClusterState()
    state.replace_nodes(objs)
    s = state.snapshot
    assert s is not None
    face = Face.of(parse_queues(queues_file(QUEUES, nodes * GPUS)), PlacementConfig(policy="binpack"))
    bound: dict[str, Bound] = {}
    # who holds what: team-0 twice its quarter, team-1 and team-2 their quarter, team-3 the rest
    quarter = nodes * GPUS // QUEUES
    weights = [2 * quarter, quarter, quarter]
    k = 0
    for n in range(nodes):
        for j in range(GPUS - (1 if n < 100 else 0)):
            q = next((i for i, w in enumerate(weights) if k < sum(weights[: i + 1])), QUEUES - 1)
            key = f"bound-{k}"
            i = s.index[f"n{n}"]
            s.allocate(Allocation(request_id=key, node=f"n{n}", node_index=i, cpu_milli=1000, memory_mib=4096,
                                  gpus=(GpuGrant(j, 1000, 81920),), tag=0, share_owner=""))  # fmt: skip
            bound[key] = Bound(f"team-{q}", key, f"team-{q}", NOW - 3600 + (k % 3000), 4 * 3600.0)
            k += 1
    sizes = (1, 1, 1, 1, 2, 2, 2, 4, 4, 8)
    pods: list[Pending] = []
    rng = random.Random(7)
    for i in range(pending):
        # as the API server makes them: a random UID, the creation time to the second (a burst: BURST a second)
        uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        created = NOW - (pending - i) // BURST
        pods.append(pending_pod(state, f"p{i}", i % QUEUES, sizes[i % len(sizes)], uid, created, 3600.0 * (1 + i % 4)))
    return state, bound, pods, face


class Accepting(NoEvictions):
    """Evictions that carry nothing out but let the round plan preemption (as kpreempt's does)."""


def pending_pod(state: ClusterState, name: str, q: int, gpus: int, uid: str, created: float, limit: float) -> Pending:
    """A pending pod of team-`q` asking for `gpus` whole GPUs, one CPU and 4 GiB, with a time limit, as the scheduler
    reads it."""
    resources = {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"nvidia.com/gpu": str(gpus)}}
    obj = pod_object(name, [{"name": "main", "resources": resources}], namespace=f"team-{q}", uid=uid)
    p = pending_of(obj, state.gpu_memory)
    return Pending(p.key, p.name, p.ask, queue=f"team-{q}", namespace=f"team-{q}", created=created, time_limit_s=limit)


def arrive(state: ClusterState, pods: list[Pending], i: int, now: float) -> None:
    """One more pending pod (the i-th trickled: one GPU, an hour), created at `now`."""
    pods.append(pending_pod(state, f"t{i}", i % QUEUES, 1, f"trickle-{i}", now, 3600.0))


def one_round(state: ClusterState, bound: dict[str, Bound], pods: list[Pending], face: Face, preempt: bool = True,
              now: float = NOW, churn: bool = False, keep: bool = False) -> tuple[float, int]:  # fmt: skip
    """The scheduler's `_plan` less its locks: the copy of the bound pods, plan_pods, the collector's settling.

    Without `churn` the round's binds are given back (every round sees the same books). With it they stay bound
    (and leave `pods`), and as many GPUs of the oldest bound pods of the borrowing queue end (their runs go into
    the fair-share ledger, as the scheduler records them): the next round sees a changed running set, as a
    scheduler does when pods come and go. With `keep` they stay bound and nothing ends (a full cluster)."""
    t0 = time.perf_counter()
    now_bound = dict(bound)
    r = plan_pods(face, pods, state.snapshot, now_bound, now, None, Accepting() if preempt else NoEvictions(), None,
                  BoundRequests(state.pods, now_bound))  # fmt: skip
    settle(face)
    took = time.perf_counter() - t0
    starts = [d for d in r.decisions if isinstance(d, Bind)]
    snapshot = state.snapshot
    assert snapshot is not None
    if not churn and not keep:
        for d in starts:  # given back: every round sees the same books
            snapshot.release(d.allocation.request_id)
        return took, len(starts)
    gone = {d.pod.key for d in starts}
    pods[:] = [p for p in pods if p.key not in gone]
    freed = 0
    for d in starts:
        p = d.pod
        bound[p.key] = Bound(p.namespace, p.name, p.queue, now, p.time_limit_s)
        freed += len(d.allocation.gpus)
    if keep:
        return took, len(starts)
    tenancy = face.tenancy
    for key in [k for k, b in bound.items() if b.queue == "team-0"]:
        if freed <= 0:
            break
        alloc = snapshot.release(key)
        run = r.running.get(key)
        if run is not None and tenancy is not None:
            tenancy.record(run, now)
        del bound[key]
        freed -= len(alloc.gpus)
    return took, len(starts)


def whole_rounds(a: argparse.Namespace) -> None:
    """`--whole`: the scheduler's own rounds (see the module)."""
    from corral.k8s.fake import FakeKubeApi
    from corral.k8s.scheduler.core import Scheduler, TokenBucket, Waiting

    t0 = time.perf_counter()
    state, bound, pods, _ = build(a.nodes, a.pending)
    if a.recent:
        bound = {k: dataclasses.replace(b, started_at=NOW - 60 - i % 180) for i, (k, b) in enumerate(bound.items())}
    clock = [NOW]
    s = Scheduler(FakeKubeApi(), PlacementConfig(policy="binpack"), batch_window=0.0,
                  evictions=Accepting() if not a.no_preempt else None,
                  queues=parse_queues(queues_file(QUEUES, a.nodes * GPUS)), clock=lambda: clock[0])  # fmt: skip
    api: Any = s.api
    api.create_binding = api.patch_pod_status = api.create_event = lambda *_, **__: None  # every call accepted
    s.limiter = TokenBucket(1e9, 10**9)
    s.state = state
    s._bound = dict(bound)

    def waiting(p: Pending, seq: int) -> None:
        w = Waiting(p, p.namespace, p.name.split("/")[-1], p.key, seq, 0.0)
        s._active[p.key] = w
        s._known[p.key] = w

    for i, p in enumerate(pods):
        waiting(p, i)
    print(f"built: {a.nodes} nodes, {len(bound)} bound pods, {len(pods)} pending in {QUEUES} queues "
          f"({time.perf_counter() - t0:.1f} s)")  # fmt: skip
    gc.collect()
    gc.freeze()
    collector_for_rounds()
    writes = 0

    def one() -> tuple[float, int]:
        nonlocal writes
        started = time.perf_counter()
        batch = s._take()
        s._place(batch)
        took = time.perf_counter() - started
        while s._writes:  # the writer thread's share, between rounds
            _, w = s._writes.popitem(last=False)
            s.write_reason(w)
            writes += 1
        return took, len(batch)

    first, n = one()
    print(f"first round (every pod converted): {first * 1000:.0f} ms over {n} pods")
    times, before = [], _batch_seconds(s)
    for i in range(a.rounds):
        clock[0] = NOW + 1.0 + i
        extra: list[Pending] = []
        arrive(state, extra, i, clock[0])
        waiting(extra[0], 10**6 + i)
        took, n = one()
        times.append(took)
    after = _batch_seconds(s)
    metric = (after[0] - before[0]) / max(1.0, after[1] - before[1])
    each = ", ".join(f"{t * 1000:.0f}" for t in times)
    print(f"whole rounds (_take + _place, a full cluster and a pod arriving each round): median "
          f"{statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms over {n} pods ({each} ms); "
          f"the scheduler's batch duration: mean {metric * 1000:.0f} ms; {writes} writes asked for in all")  # fmt: skip
    s._pool.shutdown(wait=False)


def _batch_seconds(s: Any) -> tuple[float, float]:
    """(sum, count) of the scheduler's corral_scheduler_batch_duration_seconds."""
    out = {m.name: m.value for fam in s.metrics.batch_seconds.collect() for m in fam.samples}
    return out.get("corral_scheduler_batch_duration_seconds_sum", 0.0), out.get(
        "corral_scheduler_batch_duration_seconds_count", 0.0)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pending", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", default="")
    ap.add_argument("--churn", action="store_true", help="binds stay and as many GPUs of old pods end, each round")
    ap.add_argument("--recent", action="store_true",
                    help="every bound pod started in the last 4 minutes: all within their minimum runtime")  # fmt: skip
    ap.add_argument(
        "--trickle",
        action="store_true",
        help="binds stay (the cluster is then full) and one pod arrives before each round (a plane's)",
    )
    ap.add_argument("--whole", action="store_true", help="the whole scheduler's round (_take + _place), as --trickle")
    ap.add_argument("--no-preempt", action="store_true", help="plan no preemption (NoEvictions: no evictions seam)")
    a = ap.parse_args()
    if a.whole:
        whole_rounds(a)
        print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load "
              f"{os.getloadavg()[0]:.1f}; {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")  # fmt: skip
        return
    t0 = time.perf_counter()
    state, bound, pods, face = build(a.nodes, a.pending)
    if a.recent:  # (no victim may go yet: each round says when preemption would first help)
        bound = {k: dataclasses.replace(b, started_at=NOW - 60 - i % 180) for i, (k, b) in enumerate(bound.items())}
    print(f"built: {a.nodes} nodes, {len(bound)} bound pods, {len(pods)} pending in {QUEUES} queues "
          f"({time.perf_counter() - t0:.1f} s)")  # fmt: skip
    preempt = not a.no_preempt
    gc.collect()  # as the scheduler does once its books are read (corral/k8s/cli.py)
    gc.freeze()
    collector_for_rounds()
    first, n = one_round(state, bound, pods, face, preempt, keep=a.trickle)
    print(f"first round (every pod converted): {first * 1000:.0f} ms, {n} binds")
    times = []
    prof = cProfile.Profile() if a.profile else None
    for i in range(a.rounds):
        if prof:
            prof.enable()
        now = NOW + 2.0 * (i + 1) if a.churn or a.trickle else NOW
        if a.trickle:
            arrive(state, pods, i, now)
        took, n = one_round(state, bound, pods, face, preempt, now, a.churn, keep=a.trickle)
        if prof:
            prof.disable()
        times.append(took)
    if prof:
        prof.dump_stats(a.profile)
    kind = (
        ("with" if preempt else "without")
        + (", 100 pods' churn a round" if a.churn else "")
        + (", a full cluster and a pod arriving each round" if a.trickle else "")
        + (", every victim protected" if a.recent else "")
    )
    each = ", ".join(f"{t * 1000:.0f}" for t in times)
    print(f"rounds ({kind} preemption planning): median {statistics.median(times) * 1000:.0f} ms, "
          f"max {max(times) * 1000:.0f} ms, {n} binds each ({each} ms)")  # fmt: skip
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}; {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")  # fmt: skip


if __name__ == "__main__":
    main()
