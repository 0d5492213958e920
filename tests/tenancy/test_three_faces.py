"""One workload, three faces, the same decisions (issue 25 item 1).

    serve      an in-process Daemon over simulated GPUs and a fake executor, ticked at every event (its queues file:
               one queue per user, each guaranteed half the machine)
    sim fair   corral.sim.fair.replay, policy fair-backfill-preempt (users' fair share: half the machine each)
    batch      a plain loop over corral.tenancy.plan_round, as a batch scheduler would call it (`batch_face`)
    k8s        `corral k8s scheduler`'s round (corral.k8s.scheduler.tenancy.plan_pods) on pod objects and books read
               from a fake API server, in process: namespaces u1, u2 (their queues), evictions carried out at once
               and the preemptor bound on the capacity held for it in the next round at that instant (`k8s_face`)

The workload makes each rule decide once: four 1-GPU jobs of u1 fill the box; u2's 2-GPU job reclaims its half by
preempting u1's two latest (the cheapest, fewest borrowers); u2's 4-GPU job is the head and gets a reservation; a
short job of u2 backfills before it without delaying it; the preempted jobs run again after the head. Each face
reports, per job, when it first started, how many times it started (the victims: twice) and each head's first
reservation; they must agree. serve and the plan_round loop also report the queue order at each instant: the same.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.daemon.core import Daemon
from corral.daemon.queues import Queues
from corral.executor.fake import FakeExecutor
from corral.gpu.simulated import parse_simulated_inventory
from corral.jobs.model import JobSpec, JobState
from corral.model.resources import Allocation, GpuBehavior, Node, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig
from corral.sim.fair.replay import run_fair
from corral.sim.fair.workload import FairJob
from corral.store import MemoryStore
from corral.tenancy import ClusterView, RoundConfig, Running, Work, plan_round, tenancy_for
from corral.tenancy.config import parse_queues

CONFIG = PlacementConfig(policy="binpack", gpu_behavior=GpuBehavior.UNRESTRICTED)
T0 = 1_000_000.0  # serve's clock at time 0 of the workload
HALF_LIFE_S = 3600.0
MAX_INSTANTS = 1000  # a face that has not finished the workload by then is stuck: the test fails, it does not hang
MIN_RUNTIME_S = 5  # a run is not preempted in its first 5 s (light's victims have run 7 and 8 s)
USERS = {"u1": (2001, 2001), "u2": (2002, 2002)}
QUEUES = f"""
half_life = "{int(HALF_LIFE_S)}s"
min_runtime = "{MIN_RUNTIME_S}s"
[queues.u1]
guarantee = {{ gpus = 2 }}
[queues.u2]
guarantee = {{ gpus = 2 }}
"""


@dataclass(frozen=True)
class Item:
    name: str
    user: str
    gpus: int
    arrival: int
    duration: int
    limit: int  # its time limit (what backfill plans with), at least its duration

    @property
    def request(self) -> Request:
        return Request(id=self.name, cpu_milli=1000, memory_mib=1024, gpu_count=self.gpus, gpu_milli=1000)


WORKLOAD = (
    Item("h1", "u1", 1, 0, 1000, 1000),
    Item("h2", "u1", 1, 1, 1000, 1000),
    Item("h3", "u1", 1, 2, 1000, 1000),
    Item("h4", "u1", 1, 3, 1000, 1000),
    Item("light", "u2", 2, 10, 100, 100),  # u2 is below its half: preempts u1's two latest, h4 and h3
    Item("big", "u2", 4, 20, 50, 50),  # the head: waits for the whole box, reserved when h1, h2 end
    Item("short", "u2", 1, 21, 30, 30),  # ends long before the reservation: backfills once light is done
)


@dataclass(frozen=True)
class Decisions:
    first_start: dict[str, float]  # workload time of each job's first start
    starts: dict[str, int]  # how many times each job started (2: preempted once)
    reserved: dict[str, float]  # each head's first reservation: when (workload time) it was promised to start
    #: The queue order of the round at each instant (serve's first round there), for the faces that report one.
    orders: dict[int, tuple[str, ...]] = dataclasses.field(default_factory=dict, compare=False)


def node() -> Node:
    return parse_simulated_inventory("4xA100-80GB")[0]


# ------------------------------------------------------------------------------------------------ the faces
def serve_face(tmp_path: Path, workload: Sequence[Item]) -> Decisions:
    """corral serve's daemon, ticked at every instant something arrives or ends (twice: a preemption's victims exit
    on SIGTERM, and their exit frees what the preemptor then starts on)."""
    box = node()
    clock = [T0]
    path = tmp_path / "queues.toml"
    path.write_text(QUEUES)
    store = MemoryStore()
    executor = FakeExecutor()
    queues = Queues.open(path, box)
    daemon = Daemon(store, executor, box, CONFIG, tmp_path, clock=lambda: clock[0], queues=queues)
    by_id: dict[str, Item] = {}
    first: dict[str, float] = {}
    starts: dict[str, int] = {}
    reserved: dict[str, float] = {}
    orders: dict[int, tuple[str, ...]] = {}
    ends: list[tuple[int, str, int]] = []  # (workload time, job id, its start number)
    arrivals = sorted(workload, key=lambda i: (i.arrival, i.name))
    a = 0
    for _ in range(MAX_INSTANTS):
        if a == len(arrivals) and not ends:
            break
        t = min(([arrivals[a].arrival] if a < len(arrivals) else []) + ([ends[0][0]] if ends else []))
        clock[0] = T0 + t
        while ends and ends[0][0] <= t:
            _, jid, run = heapq.heappop(ends)
            job = store.get(jid)
            if job is not None and job.state is JobState.RUNNING and starts[by_id[jid].name] == run:
                executor.finish(jid, 0)
        while a < len(arrivals) and arrivals[a].arrival <= t:
            item = arrivals[a]
            uid, gid = USERS[item.user]
            spec = JobSpec(("x",), dataclasses.replace(item.request, id=""), item.user, uid, gid,
                           time_limit_s=float(item.limit), queue=item.user)  # fmt: skip
            by_id[daemon.submit(spec).id] = item
            a += 1
        for k in range(3):  # exits, then what they free
            for jid in daemon.tick():
                item = by_id[jid]
                first.setdefault(item.name, float(t))
                starts[item.name] = starts.get(item.name, 0) + 1
                heapq.heappush(ends, (t + item.duration, jid, starts[item.name]))
            r = daemon.reservation
            if k == 0:  # the round the other faces make at this instant (the later ones see the exits it caused)
                orders[t] = tuple(by_id[i].name for i in daemon.queue_order)
                if r is not None:
                    reserved.setdefault(by_id[r.job_id].name, r.start - T0)
    return Decisions(first, starts, reserved, orders)


def sim_face(workload: Sequence[Item]) -> Decisions:
    jobs = [FairJob(i.name, i.user, i.request, i.arrival, i.duration, i.limit) for i in workload]
    r = run_fair([node()], jobs, "fair-backfill-preempt", CONFIG, half_life_s=HALF_LIFE_S, min_runtime_s=MIN_RUNTIME_S)
    return Decisions(
        {j.id: float(r.first_start[k]) for k, j in enumerate(r.jobs)},
        {j.id: int(r.runs[k]) for k, j in enumerate(r.jobs)},
        {
            j.id: float(r.first_reservation[k])
            for k, j in enumerate(r.jobs)
            if r.first_reservation[k] == r.first_reservation[k]
        },
    )


def batch_face(workload: Sequence[Item], plan: Callable[..., object] = plan_round) -> Decisions:
    """A batch scheduler over tenancy: at every instant something arrives or ends, one `plan_round`; its starts
    are bound at once, its preemptions stop their victims at once (back to the queue) and bind the preemptor.

    This is where `corral k8s scheduler`'s batch (issue 25 item 2) joins as the third face proper: its pods become
    the `Work` and `Running` below (namespace -> queue, PodGroup -> gang) and the same assertions hold."""
    config = RoundConfig(CONFIG, parse_queues(QUEUES, "queues.toml"))
    snapshot = ClusterSnapshot([node()])
    tenancy = tenancy_for(config, snapshot)
    items = {i.name: i for i in workload}
    waiting: dict[str, Work] = {}
    running: dict[str, tuple[Running, Allocation, int]] = {}  # name -> record, grant, start number
    first: dict[str, float] = {}
    starts: dict[str, int] = {}
    reserved: dict[str, float] = {}
    orders: dict[int, tuple[str, ...]] = {}
    ends: list[tuple[int, str, int]] = []
    arrivals = sorted(workload, key=lambda i: (i.arrival, i.name))
    a = 0

    def start(name: str, alloc: Allocation, t: int) -> None:
        i = items[name]
        snapshot.allocate(alloc)
        starts[name] = starts.get(name, 0) + 1
        first.setdefault(name, float(t))
        running[name] = (Running(name, i.request, float(t), alloc.gpus, i.user, i.user), alloc, starts[name])
        heapq.heappush(ends, (t + i.duration, name, starts[name]))
        del waiting[name]

    def stop(name: str, t: int, requeue: bool) -> None:
        record, _, _ = running.pop(name)
        snapshot.release(name)
        tenancy.record(record, float(t))
        if requeue:
            i = items[name]
            waiting[name] = Work(name, i.request, i.user, i.user, submitted_at=float(i.arrival),
                                 time_limit_s=float(i.limit), not_before=float(t))  # fmt: skip

    for _ in range(MAX_INSTANTS):
        if a == len(arrivals) and not ends:
            break
        t = min(([arrivals[a].arrival] if a < len(arrivals) else []) + ([ends[0][0]] if ends else []))
        while ends and ends[0][0] <= t:
            _, name, run = heapq.heappop(ends)
            if name in running and running[name][2] == run:
                stop(name, t, requeue=False)
        while a < len(arrivals) and arrivals[a].arrival <= t:
            i = arrivals[a]
            waiting[i.name] = Work(i.name, i.request, i.user, i.user, submitted_at=float(i.arrival),
                                   time_limit_s=float(i.limit))  # fmt: skip
            a += 1
        expected = {n: (r.started_at or 0.0) + items[n].limit for n, (r, _, _) in running.items()}
        result = plan_round(
            config, list(waiting.values()), [r for r, _, _ in running.values()], ClusterView(snapshot, expected),
            tenancy, float(t),
        )  # fmt: skip
        orders[t] = result.order
        for res in result.reservations:
            reserved.setdefault(res.job_id, res.start)
        for s in result.starts:
            start(s.job_id, s.allocation, t)
        for p in result.preemptions:
            for victim in p.victims:
                stop(victim, t, requeue=True)
            start(p.preemptor, p.allocation, t)
    return Decisions(first, starts, reserved, orders)


def k8s_face(workload: Sequence[Item]) -> Decisions:
    """`corral k8s scheduler`'s round over pods: each item a pod of namespace = its user (the queue of that name),
    activeDeadlineSeconds = its limit, created at its arrival; the books from a fake API server's node of the same
    4 GPUs. A round's Binds are bound at once; its preemptions go to the evictions, whose victims are deleted at once
    (recreated by their controller, same name and creation time), and the next round at that instant binds the
    preemptor on the capacity held for it, as the scheduler does once its victims are gone."""
    from corral.k8s.convert import ANN_NODE_GPUS, node_gpus_annotation
    from corral.k8s.fake import FakeKubeApi, node_object
    from corral.k8s.scheduler.batch import Bind
    from corral.k8s.scheduler.core import pending_of
    from corral.k8s.scheduler.tenancy import (
        Bound,
        Face,
        NoEvictions,
        created_at,
        plan_pods,
        time_limit_of,
        victims_of,
    )
    from corral.k8s.state import ClusterState, Informer
    from corral.model.resources import GpuDevice
    from corral.tenancy.plan import Preemption

    box = node()
    api = FakeKubeApi()
    gpus = tuple(GpuDevice(g.index, g.model, g.memory_mib, f"GPU-{g.index}") for g in box.gpus)
    api.put_node(node_object("box", str(box.cpu_milli // 1000), f"{box.memory_mib}Mi",
                             {ANN_NODE_GPUS: node_gpus_annotation(gpus)}))  # fmt: skip
    state = ClusterState()
    Informer(api, state).sync_once()
    face = Face.of(parse_queues(QUEUES, "queues.toml"), CONFIG)
    items = {i.name: i for i in workload}

    def pod(i: Item) -> dict[str, Any]:
        limits = {"nvidia.com/gpu": str(i.gpus)}
        p: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": i.name, "namespace": i.user, "uid": i.name, "labels": {}, "annotations": {},
                          "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(i.arrival))},
             "spec": {"schedulerName": "corral", "priority": 0, "activeDeadlineSeconds": i.limit,
                      "containers": [{"name": "main", "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                                    "limits": limits}}]},
             "status": {"phase": "Pending"}}  # fmt: skip
        return p

    class Evict(NoEvictions):
        def __init__(self) -> None:
            self.todo: list[Preemption] = []
            self.holds: dict[str, Allocation] = {}

        def start(self, preemption: Preemption, victims: Sequence[tuple[str, str, str]]) -> None:
            self.todo.append(preemption)

        def held(self) -> dict[str, Allocation]:
            return self.holds

        def bound(self, key: str) -> None:
            self.holds.pop(key, None)

    ev = Evict()
    waiting: dict[str, dict[str, Any]] = {}
    bound: dict[str, Bound] = {}
    first: dict[str, float] = {}
    starts: dict[str, int] = {}
    reserved: dict[str, float] = {}
    orders: dict[int, tuple[str, ...]] = {}
    ends: list[tuple[int, str, int]] = []
    arrivals = sorted(workload, key=lambda i: (i.arrival, i.name))
    a = 0

    def stop(name: str, t: int, requeue: bool) -> None:
        b = bound.pop(name)
        with state.lock:
            assert state.snapshot is not None
            alloc = state.snapshot.release(name)
        i = items[name]
        assert face.tenancy is not None
        face.tenancy.record(Running(name, i.request, b.started_at, alloc.gpus, i.user, i.user), float(t))
        if requeue:
            waiting[name] = pod(i)

    def round_(t: int, first_round: bool = True) -> tuple[str, ...]:
        pend = []
        for obj in waiting.values():
            p = pending_of(obj, state.gpu_memory)
            pend.append(dataclasses.replace(p, queue=str(obj["metadata"]["namespace"]),
                                            namespace=str(obj["metadata"]["namespace"]),
                                            created=created_at(obj), time_limit_s=time_limit_of(obj)))  # fmt: skip
        with state.lock:
            r = plan_pods(face, pend, state.snapshot, bound, float(t), None, ev)
        # (the round the other faces make at this instant: a later one binds the preemptor, as serve's later ticks)
        for res in r.plan.reservations if r.plan is not None and first_round else ():
            reserved.setdefault(res.job_id, res.start)
        for pr in r.plan.preemptions if r.plan is not None else ():  # carried out as the scheduler does
            ev.start(pr, victims_of(pr, bound))
        for d in r.decisions:
            if isinstance(d, Bind):
                name = d.pod.key
                del waiting[name]
                ev.bound(name)
                bound[name] = Bound(items[name].user, name, items[name].user, float(t), float(items[name].limit))
                starts[name] = starts.get(name, 0) + 1
                first.setdefault(name, float(t))
                heapq.heappush(ends, (t + items[name].duration, name, starts[name]))
        return r.plan.order if r.plan is not None else ()

    for _ in range(MAX_INSTANTS):
        if a == len(arrivals) and not ends:
            break
        t = min(([arrivals[a].arrival] if a < len(arrivals) else []) + ([ends[0][0]] if ends else []))
        while ends and ends[0][0] <= t:
            _, name, run = heapq.heappop(ends)
            if name in bound and starts[name] == run:
                stop(name, t, requeue=False)
        while a < len(arrivals) and arrivals[a].arrival <= t:
            waiting[arrivals[a].name] = pod(arrivals[a])
            a += 1
        orders[t] = round_(t)
        while ev.todo:  # the victims go; the preemptor is bound on what was held for it, in the next round
            p = ev.todo.pop(0)
            for victim in p.victims:
                stop(victim, t, requeue=True)
            ev.holds[p.preemptor] = p.allocation
            round_(t, first_round=False)
    return Decisions(first, starts, reserved, orders)


# ------------------------------------------------------------------------------------------------ the test
EXPECTED = Decisions(
    first_start={"h1": 0, "h2": 1, "h3": 2, "h4": 3, "light": 10, "big": 1001, "short": 110},
    starts={"h1": 1, "h2": 1, "h3": 2, "h4": 2, "light": 1, "big": 1, "short": 1},
    # light, the head at 10 until it preempts; big, when h1 and h2 end (light ends at 110); h3, behind big
    reserved={"light": 1001, "big": 1001, "h3": 1051},
)


def test_serve_sim_fair_and_a_plain_plan_round_make_the_same_decisions(tmp_path: Path) -> None:
    sim = sim_face(WORKLOAD)
    batch = batch_face(WORKLOAD)
    serve = serve_face(tmp_path, WORKLOAD)
    k8s = k8s_face(WORKLOAD)
    assert sim == EXPECTED, "sim fair"
    assert batch == EXPECTED, "plan_round"
    assert k8s == EXPECTED, "corral k8s scheduler"
    assert k8s.orders == batch.orders
    assert serve == EXPECTED, "corral serve"
    assert serve.orders == batch.orders  # the same queue order at every instant (fair share, then age)
    # u2 has used less: its job first; then the accounts alternate as each offer adds its projected usage
    assert batch.orders[21] == ("big", "h3", "short", "h4")


def test_without_the_preemptor_the_three_faces_still_agree_and_nobody_is_preempted(tmp_path: Path) -> None:
    workload = [i for i in WORKLOAD if i.name != "light"]
    sim = sim_face(workload)
    assert sim.starts == {i.name: 1 for i in workload}
    batch = batch_face(workload)
    serve = serve_face(tmp_path, workload)
    k8s = k8s_face(workload)
    assert batch == sim and serve == sim and k8s == sim
    assert k8s.orders == batch.orders
    assert serve.orders == batch.orders
