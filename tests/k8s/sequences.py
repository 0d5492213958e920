"""Seeded random sequences of what happens to an extender's pods, with the invariant checked against the API server.

    steps: create a pod, bind it (filter first, then a node filter passed, or any node as a stale scheduler might),
           rebind a bound pod (same or other node), delete a pod, finish a pod, restart the extender (state rebuilt
           from the API server), relist, binds of several pods to one node at once (threads, one maybe deleted
           meanwhile), Bindings that fail (500) or land with their answer lost, and watch events delivered late
    after every step, from the API server's pods (the truth): no GPU gives out more than 1000 milli or more memory than
           it has, no pod holds one GPU twice, every bound GPU pod has an assignment that names its node
    when the events are all delivered: the extender counts exactly what the API server says is bound

A backend is the API server plus a way to deliver its events: `FakeBackend` (corral.k8s.fake, events delivered by the
sequence when it chooses, so late events are part of the sequences) or the real control plane (tests that use it
give their own backend with the informer's watch threads).
"""

from __future__ import annotations

import contextlib
import queue
import random
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from corral.k8s.client import JsonObj, KubeApi, KubeApiError
from corral.k8s.convert import parse_assignment, parse_node_gpus, pod_key, pod_request
from corral.k8s.extender import Extender
from corral.k8s.fake import FakeKubeApi, pod_object
from corral.k8s.state import ClusterState, Informer

#: (limits, annotations, GPU memory per GPU in MiB that a share must be granted) of the pods the sequences create.
#: The memory counts are multiples of 1000 on purpose: kube-apiserver stores "30000" as "30k".
KINDS: list[tuple[dict[str, str], dict[str, str], int]] = [
    ({"corral.dev/gpu": "1"}, {}, 0),
    ({"corral.dev/gpu": "2"}, {}, 0),
    ({"nvidia.com/gpu": "1"}, {}, 0),
    ({"corral.dev/gpu-milli": "300"}, {}, 0),
    ({"corral.dev/gpu-milli": "500"}, {}, 0),
    ({"corral.dev/gpu-milli": "400", "corral.dev/gpu-memory": "30000"}, {}, 30000),
    ({"elasticgpu.io/gpu-core": "40", "elasticgpu.io/gpu-memory": "20000"}, {}, 20000),
    ({"keti.com/mpsgpu": "1"}, {"GPUrequest": "40000"}, 40000),
    ({}, {}, 0),
]
#: The annotation where a sequence's pod keeps the GPU memory it must be granted (for the checks).
ANN_WANTS_MIB = "test.corral.dev/gpu-memory-mib"


class Backend(Protocol):
    api: KubeApi

    def nodes(self) -> list[JsonObj]: ...

    def pods(self) -> list[JsonObj]: ...

    def create_pod(self, pod: JsonObj) -> None: ...

    def delete_pod(self, name: str) -> None: ...

    def finish_pod(self, name: str) -> None: ...

    def start(self) -> ClusterState:
        """A new extender state, synced from the API server (what a restart does)."""
        ...

    def deliver(self, rng: random.Random | None) -> None:
        """Deliver some (rng) or all (None) of the events not yet delivered."""
        ...

    def relist(self, meanwhile: Callable[[], object] | None = None) -> None:
        """List pods again, as an informer does when its watch breaks; `meanwhile` runs between the list's answer
        and the state taking it in (so the list is older than what `meanwhile` did)."""
        ...

    def stop(self) -> None: ...


class FakeBackend:
    """FakeKubeApi, with its pod events queued until the sequence delivers them."""

    def __init__(self, nodes: list[JsonObj]) -> None:
        self.fake = FakeKubeApi()
        self.api: KubeApi = self.fake
        for n in nodes:
            self.fake.put_node(n)
        self.state = ClusterState()
        self.events: queue.Queue[tuple[str, JsonObj] | None] = queue.Queue()

    def nodes(self) -> list[JsonObj]:
        return self.fake.list("nodes")[0]

    def pods(self) -> list[JsonObj]:
        return self.fake.list("pods")[0]

    def create_pod(self, pod: JsonObj) -> None:
        self.fake.put_pod(pod)

    def delete_pod(self, name: str) -> None:
        with contextlib.suppress(KeyError):  # deleted already
            self.fake.delete_pod("default", name)

    def finish_pod(self, name: str) -> None:
        pod = self.fake.pods.get(("default", name))
        if pod is not None:
            done = dict(pod, status={"phase": "Succeeded"})
            self.fake.put_pod(done)

    def start(self) -> ClusterState:
        # A restarted extender lists, then watches from there: events queued for the old one are not its business.
        self.events = self._resubscribe()
        self.state = ClusterState()
        Informer(self.api, self.state).sync_once()
        return self.state

    def deliver(self, rng: random.Random | None) -> None:
        count = self.events.qsize() if rng is None else rng.randint(0, self.events.qsize())
        for _ in range(count):
            item = self.events.get_nowait()
            if item is not None:
                self.state.apply("pods", *item)

    def relist(self, meanwhile: Callable[[], object] | None = None) -> None:
        # An informer whose watch broke: it lists, then watches from the list's version (older events are dropped,
        # later ones, such as what `meanwhile` does, come through the new watch).
        self.events = self._resubscribe()
        since = self.state.epoch()
        pods, _ = self.fake.list("pods")
        if meanwhile is not None:
            meanwhile()
        self.state.replace_pods(pods, since)

    def _resubscribe(self) -> queue.Queue[tuple[str, JsonObj] | None]:
        self.fake.unsubscribe("pods", self.events)
        return self.fake.subscribe("pods")

    def stop(self) -> None:
        pass


@dataclass
class Stats:
    sequences: int = 0
    steps: int = 0
    binds: int = 0
    bound: int = 0
    refused: int = 0
    over_commits: int = 0  # steps after which the API server's pods over-commit a node or a GPU (or hold one twice)
    damaged: int = 0  # steps after which a bound GPU pod has no assignment naming its node
    mismatches: int = 0  # quiescent points where the extender's count differs from the API server's
    rebinds_granted: int = 0  # binds of a bound pod answered with success
    failures: list[str] = field(default_factory=list)
    ops: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, other: Stats) -> None:
        self.sequences += other.sequences
        self.steps += other.steps
        self.binds += other.binds
        self.bound += other.bound
        self.refused += other.refused
        self.over_commits += other.over_commits
        self.damaged += other.damaged
        self.mismatches += other.mismatches
        self.rebinds_granted += other.rebinds_granted
        self.failures += other.failures
        for k, v in other.ops.items():
            self.ops[k] += v


def violations(nodes: list[JsonObj], pods: list[JsonObj]) -> list[tuple[str, str]]:
    """What is wrong with the GPUs the API server's bound pods hold (the truth), as (kind, words): "over-commit" (a
    node's bound pods ask for more GPU than it has, a GPU gives out more than 1000 milli or more memory than it has,
    a whole GPU is shared, a pod holds one GPU twice) or "assignment" (a bound GPU pod without an assignment that
    names its node, or a share granted other GPU memory than its pod asked for)."""
    gpus = {}
    count: dict[str, int] = defaultdict(int)
    for n in nodes:
        name = n["metadata"]["name"]
        for g in parse_node_gpus((n["metadata"].get("annotations") or {}).get("corral.dev/gpus"), name):
            gpus[(name, g.index)] = g.memory_mib
            count[name] += 1
    milli: dict[tuple[str, int], int] = defaultdict(int)
    memory: dict[tuple[str, int], int] = defaultdict(int)
    demand: dict[str, int] = defaultdict(int)
    holders: dict[tuple[str, int], list[tuple[str, int]]] = defaultdict(list)
    out = []
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if not node or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        name = p["metadata"]["name"]
        request = pod_request(p).request
        demand[node] += request.gpu_count * request.gpu_milli
        a = parse_assignment(p["metadata"].get("annotations"))
        if request.gpu_count and (a is None or a.node != node or len(a.slots) != request.gpu_count):
            out.append(("assignment", f"{name} on {node} asks for GPUs but its assignment is {a}"))
            continue
        if a is None:
            continue
        wants_mib = int((p["metadata"].get("annotations") or {}).get(ANN_WANTS_MIB) or 0)
        if any(s.memory_mib != wants_mib for s in a.slots if s.milli < 1000):
            out.append(("assignment", f"{name} asked for {wants_mib} MiB of GPU memory, got {a.slots}"))
        indices = [s.index for s in a.slots]
        if len(set(indices)) != len(indices):
            out.append(("over-commit", f"{name} holds one GPU twice: {indices}"))
        for s in a.slots:
            milli[(node, s.index)] += s.milli
            memory[(node, s.index)] += s.memory_mib if s.milli < 1000 else 0
            holders[(node, s.index)].append((name, s.milli))
    for node, m in demand.items():
        if m > count[node] * 1000:
            out.append(("over-commit", f"the pods on {node} ask for {m} GPU milli, it has {count[node]} GPUs"))
    for gpu, held in holders.items():
        if len(held) > 1 and any(m == 1000 for _, m in held):
            out.append(("over-commit", f"GPU {gpu} is given whole and shared at once: {held}"))
    for gpu, m in milli.items():
        if gpu not in gpus:
            out.append(("over-commit", f"{gpu} granted but no such GPU"))
        elif m > 1000 or memory[gpu] > gpus[gpu]:
            out.append(("over-commit", f"GPU {gpu} over-committed: {m} milli, {memory[gpu]} of {gpus[gpu]} MiB"))
    return out


def counted(state: ClusterState) -> dict[str, tuple[str, tuple[tuple[int, int, int], ...]]]:
    """What the extender counts: pod key -> (node, its GPU grants)."""
    with state.lock:
        s = state.snapshot
        assert s is not None
        return {k: (a.node, tuple((g.index, g.milli, g.memory_mib) for g in a.gpus)) for k, a in s.allocations.items()}


def truth(pods: list[JsonObj]) -> dict[str, tuple[str, tuple[tuple[int, int, int], ...]]]:
    """What the API server says is bound, in the same form."""
    out = {}
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if not node or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        a = parse_assignment(p["metadata"].get("annotations"))
        grants = sorted((s.index, s.milli, s.memory_mib) for s in (a.slots if a else ()))
        out[pod_key(p)] = (node, tuple(grants))
    return out


class Sequence:
    """One seeded sequence of steps over a backend."""

    def __init__(self, backend: Backend, seed: int, prefix: str = "p") -> None:
        self.b = backend
        self.rng = random.Random(seed)
        self.seed = seed
        self.prefix = prefix
        self.made = 0
        self.state = backend.start()
        self.extender = Extender(self.state, backend.api)
        self.node_names = sorted(n["metadata"]["name"] for n in backend.nodes())
        self.stats = Stats(sequences=1)

    # ------------------------------------------------------------------ steps
    def _pending(self) -> list[str]:
        return [p["metadata"]["name"] for p in self.b.pods() if not p["spec"].get("nodeName")]

    def _bound(self) -> list[str]:
        return [p["metadata"]["name"] for p in self.b.pods() if p["spec"].get("nodeName")]

    def create(self, kind: int | None = None) -> str:
        limits, ann, mib = self.rng.choice(KINDS) if kind is None else KINDS[kind]
        ann = {**ann, ANN_WANTS_MIB: str(mib)}
        self.made += 1
        name = f"{self.prefix}{self.seed}-{self.made}"
        resources = {"limits": dict(limits), "requests": {"cpu": "1", "memory": "1Gi"}}
        pod = pod_object(name, [{"name": "main", "image": "x", "resources": resources}], annotations=dict(ann),
                         uid=f"uid-{name}")  # fmt: skip
        self.b.create_pod(pod)
        return name

    def _pod(self, name: str) -> JsonObj | None:
        return next((p for p in self.b.pods() if p["metadata"]["name"] == name), None)

    def bind(self, name: str, node: str | None = None) -> str:
        pod = self._pod(name)
        if pod is None:
            return "gone"
        self.stats.binds += 1
        if node is None:
            f = self.extender.filter({"Pod": pod, "NodeNames": self.node_names})
            passing = f["NodeNames"] or []
            node = (
                self.rng.choice(passing) if passing and self.rng.random() < 0.85 else self.rng.choice(self.node_names)
            )
        meta = pod["metadata"]
        answer = self.extender.bind({"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"],
                                     "Node": node})  # fmt: skip
        if answer["Error"]:
            self.stats.refused += 1
        else:
            self.stats.bound += 1
        return str(answer["Error"])

    def concurrent(self) -> None:
        names = self._pending()
        self.rng.shuffle(names)
        names = names[: self.rng.randint(2, 5)]
        node = self.rng.choice(self.node_names)
        victim = names[0] if names and self.rng.random() < 0.3 else None
        barrier = threading.Barrier(len(names) + (victim is not None))
        errors: list[BaseException] = []

        def run(fn: Callable[[], object]) -> None:
            try:
                barrier.wait(5)
                fn()
            except BaseException as exc:  # reported below: a thread's failure must fail the sequence
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(lambda n=n: self.bind(n, node),)) for n in names]
        if victim is not None:
            threads.append(threading.Thread(target=run, args=(lambda: self.b.delete_pod(victim),)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors

    def restart(self) -> None:
        self.state = self.b.start()
        self.extender = Extender(self.state, self.b.api)

    def step(self) -> str:
        r = self.rng.random()
        pending, bound = self._pending(), self._bound()
        if r < 0.22 or not (pending or bound):
            op = "create"
            self.create()
        elif r < 0.45 and pending:
            op = "bind"
            self.bind(self.rng.choice(pending))
        elif r < 0.55 and bound:
            op = "rebind"
            name = self.rng.choice(bound)
            if not self.bind(name, self.rng.choice(self.node_names)):
                self.stats.rebinds_granted += 1
                self.stats.failures.append(f"seed {self.seed} step {self.stats.steps}: rebind of {name} granted")
        elif r < 0.62 and len(pending) >= 2:
            op = "concurrent binds"
            self.concurrent()
        elif r < 0.70 and (pending or bound):
            op = "delete"
            self.b.delete_pod(self.rng.choice(pending + bound))
        elif r < 0.74 and bound:
            op = "finish"
            self.b.finish_pod(self.rng.choice(bound))
        elif r < 0.78:
            op = "restart"
            self.restart()
        elif r < 0.81:
            op = "relist"
            if self.rng.random() < 0.5:
                # The list is older than a bind: of a pod it shows pending, or of one created after it.
                op = "relist older than a bind"
                name = self.rng.choice(pending) if pending and self.rng.random() < 0.5 else ""
                self.b.relist(lambda: self.bind(name or self.create()))
            else:
                self.b.relist()
        elif r < 0.86 and pending and isinstance(self.b, FakeBackend):
            op = "binding fails"
            self.b.fake.fail_next["create_binding"] = KubeApiError("etcdserver: request timed out", 500)
            self.bind(self.rng.choice(pending))
        elif r < 0.91 and pending and isinstance(self.b, FakeBackend):
            op = "binding answer lost"
            self.b.fake.lose_answer["create_binding"] = KubeApiError("connection reset by peer")
            self.bind(self.rng.choice(pending))
        else:
            op = "deliver events"
        self.b.deliver(self.rng)
        self.stats.ops[op] += 1
        self.stats.steps += 1
        return op

    # ------------------------------------------------------------------ checks
    def check(self, op: str) -> None:
        bad = violations(self.b.nodes(), self.b.pods())
        kinds = {kind for kind, _ in bad}
        self.stats.over_commits += "over-commit" in kinds
        self.stats.damaged += "assignment" in kinds
        if bad:
            self.stats.failures.append(f"seed {self.seed} step {self.stats.steps} ({op}): {bad[:3]}")

    def settle_and_compare(self) -> None:
        self.b.deliver(None)
        want, have = truth(self.b.pods()), counted(self.state)
        if want != have:
            self.stats.mismatches += 1
            diff = {k: (want.get(k), have.get(k)) for k in set(want) | set(have) if want.get(k) != have.get(k)}
            self.stats.failures.append(f"seed {self.seed} step {self.stats.steps}: extender counts {diff}")

    def run(self, steps: int, compare_every: int = 10) -> Stats:
        for i in range(steps):
            op = self.step()
            self.check(op)
            if (i + 1) % compare_every == 0:
                self.settle_and_compare()
        self.settle_and_compare()
        return self.stats


def run_sequences(nodes: Callable[[], list[JsonObj]], seeds: range, steps: int) -> Stats:
    total = Stats()
    for seed in seeds:
        total.add(Sequence(FakeBackend(nodes()), seed).run(steps))
    return total
