"""Preemption on `corral k8s scheduler` (corral.k8s.scheduler.evict): the state machine against a fake API (the hold,
a budget's 429, the grace period, the deadline, pods keyed by UID), the books' hold on a round's snapshot, and on a
real kube-apiserver (tests/k8s/plane.py) the Eviction API refused by a PodDisruptionBudget and allowed by one, the
"kubelet" emulated by the test (a pod with a deletionTimestamp deleted with grace 0)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.k8s.client import JsonObj, KubeApiError
from corral.k8s.scheduler.evict import (
    COOLDOWN,
    HOLD_MARGIN,
    REFUSED_FOR,
    Budget,
    Evictions,
    PdbWatch,
    selects,
)
from corral.k8s.scheduler.wire import PDBS
from corral.model.resources import Allocation, GpuGrant
from corral.tenancy.plan import Preemption

GPU = 1000


class NoLimit:
    def acquire(self, stop: threading.Event | None = None) -> None:
        return None


class FakeEvictApi:
    """Records evictions and events; `answers` maps a pod name to the error its eviction gets."""

    def __init__(self) -> None:
        self.evicted: list[tuple[str, str, str]] = []
        self.events: list[JsonObj] = []
        self.answers: dict[str, KubeApiError] = {}

    def evict_pod(self, namespace: str, name: str, uid: str = "") -> None:
        self.evicted.append((namespace, name, uid))
        if name in self.answers:
            raise self.answers[name]

    def create_event(self, namespace: str, event: JsonObj) -> None:
        self.events.append(event)

    def said(self, reason: str) -> list[tuple[str, str]]:
        return [(e["involvedObject"]["name"], e["message"]) for e in self.events if e["reason"] == reason]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pod_obj(name: str, uid: str, node: str = "gpu-a", labels: dict[str, str] | None = None, grace: int | None = 30,
            deleting: bool = False, namespace: str = "default") -> JsonObj:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid, "labels": labels or {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-28T17:00:00Z"
    spec: dict[str, Any] = {"nodeName": node} if node else {}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"metadata": meta, "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


def pdb_obj(name: str, selector: dict[str, Any] | None, allowed: int, version: str = "1", generation: int = 1,
            observed: int = 1, namespace: str = "default") -> JsonObj:  # fmt: skip
    return {"metadata": {"name": name, "namespace": namespace, "generation": generation, "resourceVersion": version},
            "spec": {"selector": selector},
            "status": {"disruptionsAllowed": allowed, "observedGeneration": observed}}  # fmt: skip


def alloc(key: str, gpus: tuple[int, ...] = (0, 1), node_: str = "gpu-a") -> Allocation:
    return Allocation(key, node_, 0, 1000, 1024, tuple(GpuGrant(j, GPU, 81920) for j in gpus), len(gpus))


def preemption(key: str, victims: dict[str, str]) -> Preemption:
    return Preemption(key, tuple(victims), alloc(key), victims, {v: "" for v in victims})


@pytest.fixture
def fake() -> FakeEvictApi:
    return FakeEvictApi()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make(fake: FakeEvictApi, clock: Clock, wakes: list[int] | None = None) -> Evictions:
    ev = Evictions(fake, NoLimit(), wake=(lambda: wakes.append(1)) if wakes is not None else (lambda: None),
                   clock=clock, threads=False)  # fmt: skip
    ev.listed("pods", [pod_obj("v1", "u-v1", labels={"app": "batch"}), pod_obj("v2", "u-v2", grace=60),
                       pod_obj("boss", "u-boss", node=""), pod_obj("other", "u-other")])  # fmt: skip
    return ev


VICTIMS = [("u-v1", "default", "v1"), ("u-v2", "default", "v2")]


def test_a_preemption_evicts_its_victims_holds_what_they_free_and_ends_when_the_preemptor_binds(
    fake: FakeEvictApi, clock: Clock
) -> None:
    wakes: list[int] = []
    ev = make(fake, clock, wakes)
    assert not ev.busy() and ev.held() == {} and ev.stopping() == frozenset()
    ev.start(preemption("u-boss", {"u-v1": "guarantee", "u-v2": "priority"}), VICTIMS)
    assert fake.evicted == []  # start() only queues: the worker sends
    assert ev.busy() and ev.held() == {"u-boss": alloc("u-boss")}
    assert ev.stopping() == {"u-v1", "u-v2"}
    ev.drain()
    # each eviction carries the victim's UID (a pod re-created under that name is not evicted by mistake)
    assert fake.evicted == [("default", "v1", "u-v1"), ("default", "v2", "u-v2")]
    assert fake.said("Preempting") == [("boss", "corral preempts 2 pod(s) for this pod on gpu-a: default/v1, "
                                                "default/v2; what they free is held for it")]  # fmt: skip
    assert fake.said("Preempted") == [
        ("v1", "preempted by pod default/boss (its queue is below its guarantee and this pod's queue borrows above "
               "its own): evicted through the Eviction API with its own grace period"),
        ("v2", "preempted by pod default/boss (it has a higher priority): evicted through the Eviction API with its "
               "own grace period"),
    ]  # fmt: skip
    assert ev.reason("u-boss") == ("preempting: waiting for 2 evicted pod(s) to terminate (default/v1, default/v2); "
                                   "what they free on gpu-a is held for this pod")  # fmt: skip
    # terminating: the victims keep their resources (a deletionTimestamp); the hold stands
    ev.observed("pods", "MODIFIED", pod_obj("v1", "u-v1", deleting=True))
    assert not ev.ready("u-boss") and ev.victims_of("u-boss") == ("u-v1", "u-v2")
    ev.observed("pods", "DELETED", pod_obj("v1", "u-v1", deleting=True))
    assert not ev.ready("u-boss") and ev.victims_of("u-boss") == ("u-v2",)
    wakes.clear()
    ev.observed("pods", "DELETED", pod_obj("v2", "u-v2", deleting=True))
    assert ev.ready("u-boss") and wakes and ev.reason("u-boss") == ""
    assert ev.busy() and ev.held() == {"u-boss": alloc("u-boss")}  # held after the victims are gone, until it binds
    ev.bound("u-boss")
    assert not ev.busy() and ev.held() == {} and ev.stopping() == frozenset()  # no cool-down after a success
    assert ev.preemptions.labels("bound")._value.get() == 1
    assert ev.evictions.labels("evicted")._value.get() == 2


def test_a_preemptor_bound_elsewhere_or_deleted_ends_its_hold(fake: FakeEvictApi, clock: Clock) -> None:
    ev = make(fake, clock)
    ev.start(preemption("u-boss", {"u-v1": "priority"}), VICTIMS[:1])
    ev.observed("pods", "MODIFIED", pod_obj("boss", "u-boss", node="gpu-b"))
    assert not ev.busy() and ev.held() == {}
    ev.start(preemption("u-other", {"u-v2": "priority"}), VICTIMS[1:])
    ev.observed("pods", "DELETED", pod_obj("other", "u-other", node=""))
    assert not ev.busy() and ev.reason("u-other") == ""  # deleted: nobody to tell, no cool-down


def test_a_budgets_429_ends_the_preemption_names_the_budget_and_evicts_nothing_else(
    fake: FakeEvictApi, clock: Clock
) -> None:
    ev = make(fake, clock)
    # the budget's status allowed one when the round planned: the API server refuses anyway (a race)
    ev.listed(PDBS, [pdb_obj("batch-pdb", {"matchLabels": {"app": "batch"}}, allowed=1, version="7")])
    assert ev.protected() == frozenset()
    fake.answers["v1"] = KubeApiError("evict pod default/v1: 429: Cannot evict pod as it would violate the pod's "
                                      "disruption budget.", 429)  # fmt: skip
    ev.start(preemption("u-boss", {"u-v1": "guarantee", "u-v2": "guarantee"}), VICTIMS)
    ev.drain()
    assert fake.evicted == [("default", "v1", "u-v1")]  # v2 is not evicted for a preemption that cannot complete
    assert ev.held() == {} and ev.stopping() == frozenset()
    assert ev.reason("u-boss") == (
        "preemption stopped: the eviction of default/v1 was refused by PodDisruptionBudget default/batch-pdb, which "
        "allows no disruption now (evict pod default/v1: 429: Cannot evict pod as it would violate the pod's "
        "disruption budget.); corral tries again once the budget allows one"
    )
    assert fake.said("PreemptionStopped") == [("boss", ev.reason("u-boss"))]
    assert ev.evictions.labels("refused")._value.get() == 1 and ev.preemptions.labels("refused")._value.get() == 1
    # the budget counts as allowing none until its status changes; no preemption for a cool-down
    assert ev.protected() == {"u-v1"}
    assert ev.busy()
    clock.now += COOLDOWN
    assert not ev.busy()
    ev.observed(PDBS, "MODIFIED", pdb_obj("batch-pdb", {"matchLabels": {"app": "batch"}}, allowed=1, version="7"))
    assert ev.protected() == {"u-v1"}  # the same version: still refused
    ev.observed(PDBS, "MODIFIED", pdb_obj("batch-pdb", {"matchLabels": {"app": "batch"}}, allowed=1, version="8"))
    assert ev.protected() == {"u-v1"}  # the refused pod itself, for a while
    clock.now += REFUSED_FOR
    assert ev.protected() == frozenset()


def test_a_preemptor_that_cannot_get_its_victims_does_not_evict_others_in_a_loop(
    fake: FakeEvictApi, clock: Clock
) -> None:
    """Kueue #3779, Volcano #4949: a round after round planner that picks any victim not protected nor stopping; every
    candidate is under a budget whose stale status allowed a disruption. One eviction is refused, then none is sent
    again, however many rounds pass, until the budget's status changes."""
    ev = make(fake, clock)
    ev.listed("pods", [pod_obj(f"w{i}", f"u-w{i}", labels={"app": "batch"}) for i in range(4)]
              + [pod_obj("boss", "u-boss", node="")])  # fmt: skip
    ev.listed(PDBS, [pdb_obj("batch-pdb", {"matchLabels": {"app": "batch"}}, allowed=1, version="3")])
    for name in ("w0", "w1", "w2", "w3"):
        fake.answers[name] = KubeApiError("429: Cannot evict pod", 429)
    for _ in range(50):
        if not ev.busy():
            free = [f"u-w{i}" for i in range(4) if f"u-w{i}" not in ev.protected() | ev.stopping()]
            if free:
                ev.start(preemption("u-boss", {free[0]: "guarantee"}), [(free[0], "default", free[0][2:])])
        ev.drain()
        clock.now += COOLDOWN / 3
    assert len(fake.evicted) == 1
    assert ev.protected() == {"u-w0", "u-w1", "u-w2", "u-w3"}
    # budgets the scheduler cannot read (no RBAC): the refused pod is not picked again for REFUSED_FOR, and each
    # other is tried at most once in that time, after a cool-down each: a few evictions a minute, never a storm
    blind = make(fake, clock)
    blind.listed("pods", [pod_obj(f"w{i}", f"u-w{i}", labels={"app": "batch"}) for i in range(4)]
                 + [pod_obj("boss", "u-boss", node="")])  # fmt: skip
    fake.evicted.clear()
    began = clock.now
    for _ in range(60):
        if not blind.busy():
            free = [f"u-w{i}" for i in range(4) if f"u-w{i}" not in blind.protected() | blind.stopping()]
            if free:
                blind.start(preemption("u-boss", {free[0]: "guarantee"}), [(free[0], "default", free[0][2:])])
        blind.drain()
        clock.now += 1
    assert len(fake.evicted) <= (clock.now - began) / COOLDOWN + 1
    assert len({e[2] for e in fake.evicted}) == len(fake.evicted)  # none twice in the minute


def test_budgets_protect_the_bound_pods_they_cover_when_they_allow_no_disruption(
    fake: FakeEvictApi, clock: Clock
) -> None:
    wakes: list[int] = []
    ev = make(fake, clock, wakes)
    ev.listed("pods", [pod_obj("a", "u-a", labels={"app": "x", "tier": "1"}), pod_obj("b", "u-b", labels={"app": "y"}),
                       pod_obj("c", "u-c", labels={"app": "x"}, namespace="other"),
                       pod_obj("p", "u-p", node="", labels={"app": "x"}),
                       pod_obj("d", "u-d", labels={"app": "x"}, deleting=True)])  # fmt: skip
    ev.listed(PDBS, [pdb_obj("x", {"matchLabels": {"app": "x"}}, allowed=0)])
    # bound, same namespace, matching, not already going
    assert ev.protected() == {"u-a"}
    assert ev.budgets_of("default", {"app": "x"}) == ["default/x"]
    wakes.clear()
    ev.observed(PDBS, "MODIFIED", pdb_obj("x", {"matchLabels": {"app": "x"}}, allowed=1, version="2"))
    assert ev.protected() == frozenset() and wakes  # a pod may be preempted now: the round looks again
    # a budget the API server has not processed yet (observedGeneration behind) refuses evictions: protected
    ev.observed(PDBS, "MODIFIED", pdb_obj("x", {"matchLabels": {"app": "x"}}, allowed=1, version="3", generation=2))
    assert ev.protected() == {"u-a"}
    ev.observed(PDBS, "DELETED", pdb_obj("x", {"matchLabels": {"app": "x"}}, allowed=0, version="4"))
    assert ev.protected() == frozenset()
    ev.observed(PDBS, "ADDED", pdb_obj("all", {}, allowed=0, version="5"))  # an empty selector: every pod
    assert ev.protected() == {"u-a", "u-b"}
    ev.observed("pods", "ADDED", pod_obj("e", "u-e"))
    assert ev.protected() == {"u-a", "u-b", "u-e"}
    ev.observed("pods", "DELETED", pod_obj("e", "u-e"))
    assert ev.protected() == {"u-a", "u-b"}


def test_label_selectors_as_kubernetes_reads_them() -> None:
    labels = {"app": "x", "tier": "1"}
    assert selects({}, labels) and not selects(None, labels)
    assert selects({"matchLabels": {"app": "x"}}, labels) and not selects({"matchLabels": {"app": "y"}}, labels)
    assert selects({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["1", "2"]}]}, labels)
    assert not selects({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["1"]}]}, labels)
    assert selects({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, labels)
    assert selects({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, labels)
    assert not selects({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, labels)
    assert not selects({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}, labels)
    b = Budget.of(pdb_obj("b", {}, allowed=2, generation=3, observed=3))
    assert b.allows and b.key == "default/b"
    assert not Budget.of({"metadata": {"name": "fresh", "generation": 1}, "spec": {}}).allows  # no status yet


def test_the_hold_ends_at_the_victims_grace_period_plus_a_margin(fake: FakeEvictApi, clock: Clock) -> None:
    wakes: list[int] = []
    ev = make(fake, clock, wakes)
    ev.start(preemption("u-boss", {"u-v1": "priority", "u-v2": "priority"}), VICTIMS)  # v2's grace is 60 s
    ev.drain()
    ev.observed("pods", "MODIFIED", pod_obj("v2", "u-v2", grace=60, deleting=True))
    ev.observed("pods", "DELETED", pod_obj("v1", "u-v1", deleting=True))
    clock.now += 60 + HOLD_MARGIN - 0.5
    ev.tick()
    assert ev.busy() and ev.held()
    wakes.clear()
    clock.now += 1
    ev.tick()
    assert ev.held() == {} and wakes
    assert ev.reason("u-boss") == ("preemption stopped: 1 evicted pod(s) still terminating past the deadline "
                                   "(default/v2); what was held for this pod is free again")  # fmt: skip
    ev.drain()
    assert fake.said("PreemptionStopped") == [("boss", ev.reason("u-boss"))]
    assert ev.stopping() == {"u-v2"}  # still going: never a victim again
    assert ev.busy()  # a cool-down
    clock.now += COOLDOWN
    assert not ev.busy()
    assert ev.preemptions.labels("timeout")._value.get() == 1
    # a preemptor that does not bind on what was held once its victims are gone: the same deadline
    ev.observed("pods", "ADDED", pod_obj("v3", "u-v3"))
    ev.start(preemption("u-other", {"u-v3": "priority"}), [("u-v3", "default", "v3")])
    ev.drain()
    ev.observed("pods", "DELETED", pod_obj("v3", "u-v3", deleting=True))
    assert ev.ready("u-other")
    clock.now += 30 + HOLD_MARGIN
    assert ev.held() == {}
    assert ev.reason("u-other") == ("preemption stopped: this pod did not bind on what was held for it before the "
                                    "deadline")  # fmt: skip


def test_a_victim_already_gone_counts_as_gone_and_other_failures_end_the_preemption(
    fake: FakeEvictApi, clock: Clock
) -> None:
    ev = make(fake, clock)
    fake.answers["v1"] = KubeApiError('evict pod default/v1: 404: pods "v1" not found', 404)
    ev.start(preemption("u-boss", {"u-v1": "priority"}), VICTIMS[:1])
    ev.drain()
    assert ev.ready("u-boss") and ev.evictions.labels("gone")._value.get() == 1
    ev.bound("u-boss")
    fake.answers["v2"] = KubeApiError("evict pod default/v2: 500: etcd is down", 500)
    ev.start(preemption("u-boss", {"u-v2": "priority"}), VICTIMS[1:])
    ev.drain()
    assert ev.held() == {}
    assert ev.reason("u-boss") == "preemption stopped: the eviction of default/v2 failed: evict pod default/v2: 500: " \
                                  "etcd is down"  # fmt: skip


def test_pods_are_known_by_uid_a_pod_recreated_under_a_victims_name_is_a_new_pod(
    fake: FakeEvictApi, clock: Clock
) -> None:
    ev = make(fake, clock)
    ev.start(preemption("u-boss", {"u-v1": "priority"}), VICTIMS[:1])
    ev.drain()
    ev.observed("pods", "DELETED", pod_obj("v1", "u-v1", deleting=True))
    ev.observed("pods", "ADDED", pod_obj("v1", "u-v1-again"))  # its controller re-created it: a new UID
    assert ev.stopping() == frozenset()
    assert ev.ready("u-boss")


def test_after_a_restart_pods_found_terminating_hold_preemption_back_until_gone(
    fake: FakeEvictApi, clock: Clock
) -> None:
    """A kill -9 mid-preemption loses the hold; the victims it had evicted are found terminating. No preemption is
    planned while they go (it would evict others for what they are freeing), at most their grace + margin."""
    ev = Evictions(fake, NoLimit(), clock=clock, threads=False)
    ev.listed("pods", [pod_obj("v1", "u-v1", grace=10, deleting=True), pod_obj("v2", "u-v2", grace=10, deleting=True),
                       pod_obj("boss", "u-boss", node="")])  # fmt: skip
    assert ev.busy() and ev.stopping() == {"u-v1", "u-v2"}
    ev.observed("pods", "DELETED", pod_obj("v1", "u-v1", deleting=True))
    assert ev.busy()
    ev.listed("pods", [pod_obj("boss", "u-boss", node="")])  # a relist: v2 gone too
    assert not ev.busy()
    # one stuck terminating (a finalizer, a node gone) holds preemption back only until its grace + margin
    ev2 = Evictions(fake, NoLimit(), clock=clock, threads=False)
    ev2.listed("pods", [pod_obj("stuck", "u-stuck", grace=10, deleting=True)])
    clock.now += 10 + HOLD_MARGIN
    assert not ev2.busy() and ev2.stopping() == {"u-stuck"}
    # pods that start terminating later, under the watch, are not a restart's
    ev2.observed("pods", "MODIFIED", pod_obj("later", "u-later", deleting=True))
    assert not ev2.busy()


def test_the_round_is_woken_when_a_minimum_runtime_ends(fake: FakeEvictApi, clock: Clock) -> None:
    wakes: list[int] = []
    ev = make(fake, clock, wakes)
    ev.wake_after(30)
    ev.wake_after(20)  # the soonest wins
    clock.now += 19
    ev.tick()
    assert wakes == []
    clock.now += 1
    ev.tick()
    assert wakes == [1]
    clock.now += 30
    ev.tick()
    assert wakes == [1]  # once


def test_start_never_waits_for_the_rate_limit(fake: FakeEvictApi) -> None:
    gate = threading.Event()

    class Slow:
        def acquire(self, stop: threading.Event | None = None) -> None:
            gate.wait(10)

    ev = Evictions(fake, Slow(), threads=True)
    try:
        ev.listed("pods", [pod_obj("v1", "u-v1"), pod_obj("boss", "u-boss", node="")])
        began = time.monotonic()
        ev.start(preemption("u-boss", {"u-v1": "priority"}), VICTIMS[:1])
        assert time.monotonic() - began < 5 and fake.evicted == []
        gate.set()
        wait_for("the eviction", lambda: fake.evicted == [("default", "v1", "u-v1")])
    finally:
        gate.set()
        ev.close()


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# ---------------------------------------------------------------------------------------------------- real plane
@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    from tests.k8s.plane import Plane

    where = tmp_path_factory.mktemp("evict-plane")
    p = Plane.find(where)
    if p is None:
        pytest.skip("no control plane here (../shared/k8s/control-plane.sh, openssl, curl, xz)")
    try:
        kubeconfig = p.up()
        yield p, kubeconfig
    finally:
        p.down()


def test_on_a_real_api_server_a_budget_refuses_an_eviction_and_another_allows_one(
    plane: tuple[Any, str], tmp_path: Path
) -> None:
    from kubernetes import client

    from corral.k8s.client import RealKubeApi
    from corral.k8s.scheduler.wire import connect
    from tests.k8s.plane import gpu_node, pod

    _, kubeconfig = plane
    core = RealKubeApi(kubeconfig=kubeconfig).core
    policy = client.PolicyV1Api(core.api_client)
    core.create_node(gpu_node("evict-a", 4))
    api = connect(kubeconfig)
    made: list[JsonObj] = []
    for name, app in (("guarded", "guarded"), ("free", "free"), ("boss", "")):
        body = pod(name, {"corral.dev/gpu": "1"}, scheduler="corral")
        body["spec"]["terminationGracePeriodSeconds"] = 30  # evicted pods stay Terminating until the "kubelet" acts
        body["metadata"]["labels"] = {"app": app} if app else {}
        created = core.create_namespaced_pod("default", body)
        if name != "boss":
            api.create_binding("default", name, created.metadata.uid, "evict-a")
            # Running and Ready, as a kubelet would say: the API server ignores budgets for pods still Pending
            api.patch_pod_status("default", name, {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-28T17:00:00Z"}]})  # fmt: skip
        made.append(core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, "default")))
    uid = {p["metadata"]["name"]: p["metadata"]["uid"] for p in made}
    for name, allowed in (("guarded", 0), ("free", 1)):
        policy.create_namespaced_pod_disruption_budget("default", {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": f"{name}-pdb"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": name}}}})  # fmt: skip
        # no controller-manager: the test writes what the disruption controller would
        policy.patch_namespaced_pod_disruption_budget_status(f"{name}-pdb", "default", {"status": {
            "disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1 - allowed, "expectedPods": 1,
            "observedGeneration": 1}})  # fmt: skip

    # the official client's fallback (a kubeconfig with an exec plugin) reads budgets and evicts alike
    real = RealKubeApi(kubeconfig=kubeconfig)
    assert sorted(b["metadata"]["name"] for b in real.list(PDBS)[0]) == ["free-pdb", "guarded-pdb"]
    with pytest.raises(KubeApiError) as refused:
        real.evict_pod("default", "guarded", uid["guarded"])
    assert refused.value.status == 429
    wakes: list[int] = []
    ev = Evictions(api, NoLimit(), wake=lambda: wakes.append(1))  # type: ignore[arg-type]
    watch = PdbWatch(api, ev)
    stop = threading.Event()

    def follow_pods() -> None:
        items, version = api.list("pods")
        ev.listed("pods", items)
        for event, obj in api.watch("pods", version, stop):
            ev.observed("pods", event, obj)

    follower = threading.Thread(target=follow_pods, daemon=True)
    follower.start()
    watch.start()
    try:
        assert watch.synced.wait(30)
        wait_for("the budgets and pods", lambda: ev.protected() == {uid["guarded"]} and uid["boss"] in ev._pods)
        # refused: the guarded pod's budget allows no disruption (as if the round had planned before it saw that)
        ev.start(preemption(uid["boss"], {uid["guarded"]: "guarantee"}), [(uid["guarded"], "default", "guarded")])
        wait_for("the refusal", lambda: ev.reason(uid["boss"]).startswith("preemption stopped"))
        assert ev.reason(uid["boss"]).startswith(
            "preemption stopped: the eviction of default/guarded was refused by PodDisruptionBudget "
            "default/guarded-pdb, which allows no disruption now (evict pod default/guarded: 429: Cannot evict pod as "
            "it would violate the pod's disruption budget."
        )
        assert core.read_namespaced_pod("guarded", "default").metadata.deletion_timestamp is None
        assert ev.evictions.labels("refused")._value.get() == 1
        # allowed: the free pod's budget allows one; it goes Terminating (grace 30 s) and keeps its place
        ev._quiet_until = -1e18  # past the cool-down (tested above with a clock)
        ev.start(preemption(uid["boss"], {uid["free"]: "guarantee"}), [(uid["free"], "default", "free")])
        wait_for("the eviction", lambda: core.read_namespaced_pod("free", "default").metadata.deletion_timestamp
                 is not None)  # fmt: skip
        got = core.read_namespaced_pod("free", "default")
        assert got.metadata.deletion_grace_period_seconds == 30  # the pod's own grace period
        assert ev.held() == {uid["boss"]: alloc(uid["boss"])} and uid["free"] in ev.stopping()
        assert not ev.ready(uid["boss"])
        pdb = policy.read_namespaced_pod_disruption_budget("free-pdb", "default")
        assert pdb.status.disruptions_allowed == 0  # the API server took the one disruption it allowed
        # the "kubelet": the pod's containers are done, it deletes the pod with grace 0
        core.delete_namespaced_pod("free", "default", grace_period_seconds=0)
        wait_for("the victim gone", lambda: ev.ready(uid["boss"]))
        events = core.list_namespaced_event("default").items
        said = {(e.involved_object.name, e.reason) for e in events}
        assert {("free", "Preempted"), ("boss", "Preempting"), ("boss", "PreemptionStopped")} <= said
        ev.bound(uid["boss"])
        assert not ev.busy()
    finally:
        stop.set()
        watch.close()
        ev.close()
        core.delete_collection_namespaced_pod("default", grace_period_seconds=0)


def test_the_scheduler_feeds_its_evictions_pods_and_budgets(plane: tuple[Any, str]) -> None:
    """Scheduler.preempting(): its informer's pods and a watch of budgets reach the evictions (in process, on the
    real plane); a budget that allows no disruption protects the bound pods it covers, a terminating pod is stopping,
    and `/metrics` carries the preemption counters."""
    from kubernetes import client

    from corral.k8s.client import RealKubeApi
    from corral.k8s.scheduler.core import Scheduler
    from corral.k8s.scheduler.wire import connect
    from corral.placement import PlacementConfig
    from tests.k8s.plane import gpu_node, pod

    _, kubeconfig = plane
    core = RealKubeApi(kubeconfig=kubeconfig).core
    policy = client.PolicyV1Api(core.api_client)
    core.create_node(gpu_node("feed-a", 2))
    sched = Scheduler(connect(kubeconfig), PlacementConfig(policy="binpack"), name="corral-feed")
    ev = sched.preempting()
    assert sched.preempting() is ev
    try:
        for name in ("kept", "going"):
            body = pod(name, {"corral.dev/gpu": "1"}, scheduler="corral-feed")
            body["metadata"]["labels"] = {"app": name}
            body["spec"]["terminationGracePeriodSeconds"] = 30
            core.create_namespaced_pod("default", body)
        sched.start()
        wait_for("both bound", lambda: all(core.read_namespaced_pod(n, "default").spec.node_name
                                           for n in ("kept", "going")))  # fmt: skip
        uid = {n: core.read_namespaced_pod(n, "default").metadata.uid for n in ("kept", "going")}
        policy.create_namespaced_pod_disruption_budget("default", {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "kept-pdb"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "kept"}}}})  # fmt: skip
        wait_for("the budget protects its pod", lambda: ev.protected() == {uid["kept"]})
        core.delete_namespaced_pod("going", "default")  # grace 30 s: Terminating, no kubelet to end it
        wait_for("the terminating pod is stopping", lambda: ev.stopping() == {uid["going"]})
        assert ev.metrics is sched.metrics.preemption  # its counters are the scheduler's /metrics
    finally:
        sched.close()
        policy.delete_namespaced_pod_disruption_budget("kept-pdb", "default")
        core.delete_collection_namespaced_pod("default", grace_period_seconds=0)
        core.delete_node("feed-a")


def test_the_queues_round_holds_what_victims_free_and_binds_the_preemptor_on_exactly_it(
    fake: FakeEvictApi, clock: Clock
) -> None:
    """plan_pods (the scheduler's round with queues) with these evictions: queue b reclaims its guarantee from a's
    borrowers; while they terminate, one by one, nothing else gets what they free; the preemptor binds on exactly
    what was held once they are all gone."""
    from corral.k8s.scheduler.batch import Bind, Wait
    from corral.k8s.scheduler.core import pending_of
    from corral.k8s.scheduler.tenancy import Bound, Face, plan_pods, victims_of
    from corral.k8s.state import ClusterState
    from corral.model.resources import GpuBehavior
    from corral.placement import PlacementConfig
    from corral.tenancy.config import parse_queues
    from tests.k8s.plane import gpu_node
    from tests.k8s.plane import pod as pod_body

    queues = parse_queues('min_runtime = "5m"\n[queues.a]\nnamespaces = ["team-a"]\nguarantee = { gpus = 1 }\n'
                          '[queues.b]\nnamespaces = ["team-b"]\nguarantee = { gpus = 3 }\n')  # fmt: skip
    face = Face.of(queues, PlacementConfig(policy="binpack", gpu_behavior=GpuBehavior.UNRESTRICTED))
    state = ClusterState()
    state.replace_nodes([gpu_node("gpu-a", 4)])
    ev = Evictions(fake, NoLimit(), clock=clock, threads=False)
    bound: dict[str, Bound] = {}
    objs: dict[str, JsonObj] = {}

    def submit(ns: str, name: str, gpus: int) -> str:
        body = pod_body(name, {"nvidia.com/gpu": str(gpus)})
        body["metadata"].update(namespace=ns, uid=f"u-{name}")
        objs[f"u-{name}"] = body
        ev.observed("pods", "ADDED", body)
        return f"u-{name}"

    def round_() -> dict[str, Any]:
        pending = [dataclasses.replace(pending_of(o), queue=ns_queue[o["metadata"]["namespace"]],
                                       namespace=o["metadata"]["namespace"], created=clock.now)
                   for k, o in objs.items() if k not in bound]  # fmt: skip
        assert state.snapshot is not None
        r = plan_pods(face, pending, state.snapshot, bound, clock.now, evictions=ev)
        for d in r.decisions:
            if isinstance(d, Bind):
                o = objs[d.pod.key]
                bound[d.pod.key] = Bound(o["metadata"]["namespace"], o["metadata"]["name"], d.pod.queue, clock.now)
                ev.observed("pods", "MODIFIED", {**o, "spec": {**o["spec"], "nodeName": "gpu-a"}})
        for pr in r.plan.preemptions if r.plan is not None else ():
            ev.start(pr, victims_of(pr, bound))  # as Scheduler._round_views
        ev.drain()
        return {d.pod.key: d for d in r.decisions}

    def gone(key: str) -> None:
        assert state.snapshot is not None
        state.snapshot.release(key)
        del bound[key], objs[key]
        ev.observed("pods", "DELETED", pod_obj(key[2:], key, deleting=True))

    ns_queue = {"team-a": "a", "team-b": "b"}
    for i in range(4):
        submit("team-a", f"a{i}", 1)
        round_()
        clock.now += 1
    assert len(bound) == 4
    clock.now += 600
    boss = submit("team-b", "boss", 3)
    round_()
    assert sorted(e[1] for e in fake.evicted) == ["a1", "a2", "a3"]
    held = ev.held()[boss]
    gone("u-a1")  # one victim gone, two still terminating
    small = submit("team-a", "small", 1)
    got = round_()
    assert isinstance(got[small], Wait) and isinstance(got[boss], Wait)
    assert got[boss].reason.startswith("preempting: waiting for 2 evicted pod(s) to terminate")
    gone("u-a2")
    gone("u-a3")
    got = round_()
    assert isinstance(got[boss], Bind) and got[boss].allocation == dataclasses.replace(held, request_id=boss)
    assert isinstance(got[small], Wait) and not ev.busy()
    assert len(fake.evicted) == 3
