"""Gangs on the standalone scheduler, on corral.k8s.fake (the real plane: test_scheduler_gang_e2e.py).

All members bound or none; hostile PodGroups wait with a clear reason and hold nothing else up; a gang bound short of
its minMember (a Binding refused, a kill -9 mid-gang) is completed, or its bound part deleted within a bounded time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from corral.k8s.client import KubeApiError
from corral.k8s.convert import assignment_annotations, parse_assignment
from corral.k8s.fake import FakeKubeApi
from corral.k8s.scheduler.batch import Bind, Wait, place_batch
from corral.k8s.scheduler.core import Scheduler, pending_of
from corral.k8s.scheduler.gang import (
    POD_GROUP_API,
    VOLCANO_API,
    GangInfo,
    GangRef,
    gang_of,
    min_member,
    queue_of,
)
from corral.k8s.state import ClusterState, Informer
from corral.placement import PlacementConfig
from tests.k8s.conftest import gpu_node
from tests.k8s.test_scheduler_core import gpu_pod, node_of, used_gpus, wait_for

BINPACK = PlacementConfig(policy="binpack")


def member(name: str, group: str, gpus: int = 1, volcano: bool = False, **kw: Any) -> dict[str, Any]:
    p = gpu_pod(name, gpus, **kw)
    if volcano:
        p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = group
    else:
        p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = group
    return p


def pod_group(api: FakeKubeApi, name: str, min_member: Any, volcano: bool = False) -> None:
    version = VOLCANO_API if volcano else POD_GROUP_API
    api.pod_groups[(version, "default", name)] = {
        "apiVersion": version, "kind": "PodGroup", "metadata": {"name": name, "namespace": "default"},
        "spec": {"minMember": min_member},
    }  # fmt: skip


@pytest.fixture
def api() -> FakeKubeApi:
    api = FakeKubeApi()
    api.put_node(gpu_node("n1", 2))
    api.put_node(gpu_node("n2", 2))
    return api


@pytest.fixture
def run(api: FakeKubeApi) -> Iterator[Callable[..., Scheduler]]:
    started: list[Scheduler] = []

    def start(**kw: Any) -> Scheduler:
        partial = kw.pop("partial", None)
        s = Scheduler(api, BINPACK, batch_window=0.001, **kw)
        if partial is not None:
            s.gang_partial_seconds = partial
        s.start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


# ---------------------------------------------------------------------------------------------------- reading pods
def test_a_pod_names_its_gang_by_scheduler_plugins_label_or_volcanos_annotation() -> None:
    assert gang_of(member("a", "g")) == GangRef(POD_GROUP_API, "default", "g")
    assert gang_of(member("b", "v", volcano=True)) == GangRef(VOLCANO_API, "default", "v")
    assert gang_of(gpu_pod("solo")) is None


def test_a_pod_names_its_queue_by_corrals_label_kueues_or_kais_else_its_namespace() -> None:
    p = gpu_pod("q", namespace="team-a")
    assert queue_of(p) == "team-a"
    p["metadata"]["labels"]["kai.scheduler/queue"] = "kai"
    assert queue_of(p) == "kai"
    p["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "kueue"
    assert queue_of(p) == "kueue"
    p["metadata"]["labels"]["corral.dev/queue"] = "mine"
    assert queue_of(p) == "mine"


def test_hostile_pod_groups_are_named_with_what_is_wrong() -> None:
    ref = GangRef(POD_GROUP_API, "default", "g")
    what = "PodGroup default/g (scheduling.x-k8s.io/v1alpha1)"
    assert min_member(ref, None) == (0, f"{what} not found; its members wait until it exists")
    assert min_member(ref, {"spec": {"minMember": 0}}) == (0, f"{what}: spec.minMember must be >= 1, got 0")
    assert min_member(ref, {"spec": {"minMember": 10**9}}) == (
        0, f"{what}: spec.minMember 1000000000 is more than corral places together (at most 10000)")  # fmt: skip
    assert min_member(ref, {"spec": {"minMember": "3"}}) == (
        0, f"{what}: spec.minMember must be a whole number, got '3'")  # fmt: skip
    assert min_member(ref, {"spec": {"minMember": 4}}) == (4, "")


# ---------------------------------------------------------------------------------------------------- batch step
def _books(api: FakeKubeApi) -> ClusterState:
    state = ClusterState()
    Informer(api, state).sync_once()
    return state


def _pending(obj: dict[str, Any]) -> Any:
    import dataclasses

    ref = gang_of(obj)
    return dataclasses.replace(pending_of(obj), gang=ref.key if ref else "", queue=queue_of(obj))


def _info(n: int, held: int = 0) -> dict[str, GangInfo]:
    return {"default/g": GangInfo(GangRef(POD_GROUP_API, "default", "g"), n, held)}


def test_a_gang_short_of_min_member_waits_whole_and_takes_nothing(api: FakeKubeApi) -> None:
    s = _books(api).snapshot
    assert s is not None
    out = place_batch([_pending(member(f"m{i}", "g")) for i in range(3)], s, BINPACK, _info(10))
    assert all(isinstance(d, Wait) for d in out)
    assert isinstance(out[0], Wait)
    assert out[0].reason == ("gang default/g: 3 of 10 members pending, needs 10 that fit together; waiting for 7 "
                             "more")  # fmt: skip
    assert {d.code for d in out if isinstance(d, Wait)} == {"gang_incomplete"}
    assert not s.allocations


def test_a_gang_larger_than_the_cluster_waits_whole_and_holds_nothing_else_up(api: FakeKubeApi) -> None:
    s = _books(api).snapshot
    assert s is not None
    gang = [_pending(member(f"m{i}", "g", 2)) for i in range(3)]  # 6 GPUs asked, 4 here
    out = place_batch([*gang, _pending(gpu_pod("solo", 2))], s, BINPACK, _info(3))
    *waits, solo = out
    assert all(isinstance(d, Wait) for d in waits)
    assert isinstance(waits[0], Wait)
    assert waits[0].reason == ("gang default/g: 3 of 3 members pending, needs 3 that fit together; only 2 fit; "
                               "default/m2: 0/2 nodes fit: 2 insufficient GPU (need 2 whole GPUs)")  # fmt: skip
    assert isinstance(solo, Bind)
    assert set(s.allocations) == {"uid-default-solo"}  # the gang's trial grants were given back


def test_a_gang_that_fits_is_bound_together_and_counts_its_bound_members(api: FakeKubeApi) -> None:
    s = _books(api).snapshot
    assert s is not None
    out = place_batch([_pending(member(f"m{i}", "g")) for i in range(2)], s, BINPACK, _info(4, held=2))
    assert all(isinstance(d, Bind) for d in out)


# ---------------------------------------------------------------------------------------------------- the loop
def test_no_member_is_bound_until_the_gang_is_whole_then_all_are(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    pod_group(api, "g", 4)
    s = run()
    for i in range(3):
        api.put_pod(member(f"m{i}", "g"))
    wait_for("the reason", lambda: s.explain("default/m2").get("code") == "gang_incomplete")
    assert s.explain("default/m0") == {
        "pod": "default/m0", "state": "pending", "code": "gang_incomplete", "queue": "default", "gang": "default/g",
        "reason": "gang default/g: 3 of 4 members pending, needs 4 that fit together; waiting for 1 more"}  # fmt: skip
    assert not [c for c in api.calls if c[0] == "create_binding"]
    api.put_pod(member("m3", "g"))
    wait_for("all four bound", lambda: all(node_of(api, f"m{i}") for i in range(4)), 5)
    assert len(set(used_gpus(api))) == 4


def test_a_volcano_gang_is_placed_whole(api: FakeKubeApi, run: Callable[..., Scheduler]) -> None:
    pod_group(api, "v", 2, volcano=True)
    run()
    for i in range(2):
        api.put_pod(member(f"v{i}", "v", 2, volcano=True))
    wait_for("both bound", lambda: all(node_of(api, f"v{i}") for i in range(2)), 5)


def test_hostile_pod_groups_get_a_condition_and_an_event_and_hold_nothing_up(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    pod_group(api, "zero", 0)
    pod_group(api, "huge", 10**9)
    run()
    api.put_pod(member("z", "zero"))
    api.put_pod(member("h", "huge"))
    api.put_pod(member("lost", "missing"))
    api.put_pod(gpu_pod("solo"))
    wait_for("solo bound", lambda: node_of(api, "solo") is not None, 5)

    def condition(name: str) -> str:
        conds = api.pods[("default", name)]["status"].get("conditions") or []
        return str(next((c["message"] for c in conds if c["type"] == "PodScheduled"), ""))

    wait_for("three conditions", lambda: all(condition(n) for n in ("z", "h", "lost")), 5)
    assert condition("z") == ("gang default/zero: PodGroup default/zero (scheduling.x-k8s.io/v1alpha1): "
                              "spec.minMember must be >= 1, got 0")  # fmt: skip
    assert condition("lost") == ("gang default/missing: PodGroup default/missing (scheduling.x-k8s.io/v1alpha1) "
                                 "not found; its members wait until it exists")  # fmt: skip
    assert "spec.minMember 1000000000 is more than corral places together" in condition("h")
    events = {e["involvedObject"]["name"]: e for _, e in api.events}
    assert events["z"]["reason"] == "FailedScheduling" and events["z"]["message"] == condition("z")
    assert node_of(api, "z") is None and node_of(api, "h") is None


def test_a_refused_binding_of_one_member_is_retried_until_the_gang_is_whole(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    pod_group(api, "g", 4)
    api.fail_next["create_binding"] = KubeApiError("admission webhook said no", 403)
    run()
    for i in range(4):
        api.put_pod(member(f"m{i}", "g"))
    wait_for("all four bound", lambda: all(node_of(api, f"m{i}") for i in range(4)), 5)
    assert sorted(used_gpus(api)) == sorted(set(used_gpus(api)))  # no GPU twice


def _bound_member(api: FakeKubeApi, name: str, node: str, gpu: int) -> None:
    """A member bound by a scheduler that was then killed: its assignment annotation names its GPU."""
    from corral.k8s.convert import Assignment, GpuSlot

    a = Assignment(node, {"main": (GpuSlot(gpu, f"GPU-{node}-{gpu}", 1000, 81920),)})
    p = member(name, "g", node=node, annotations=assignment_annotations(a, "nvidia"))
    api.put_pod(p)


def test_after_a_kill_mid_gang_the_rest_is_placed_beside_the_bound_part(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    pod_group(api, "g", 4)
    _bound_member(api, "m0", "n1", 0)
    _bound_member(api, "m1", "n1", 1)
    api.put_pod(member("m2", "g"))
    api.put_pod(member("m3", "g"))
    run()
    wait_for("the rest bound", lambda: node_of(api, "m2") == "n2" and node_of(api, "m3") == "n2", 5)
    assert len(set(used_gpus(api))) == 4 == len(used_gpus(api))


def test_a_gang_left_partly_bound_that_cannot_be_completed_loses_its_bound_part(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    pod_group(api, "g", 4)
    _bound_member(api, "m0", "n1", 0)
    api.put_pod(gpu_pod("other", 2, scheduler="default-scheduler", node="n2"))  # n2 taken: 1 GPU left for 3
    for i in (1, 2, 3):
        api.put_pod(member(f"m{i}", "g"))
    s = run(partial=0.3)
    wait_for("m0 deleted", lambda: ("default", "m0") not in api.pods, 5)
    [e] = [e for _, e in api.events if e["reason"] == "CorralGangIncomplete"]
    assert e["involvedObject"]["name"] == "m0"
    assert e["message"] == ("gang default/g: 1 of 4 members bound for 0.3 s and the rest cannot be placed; corral "
                            "deletes the bound members so that their controller recreates them and the gang is "
                            "placed again whole")  # fmt: skip
    assert all(node_of(api, f"m{i}") is None for i in (1, 2, 3))
    wait_for("the gang's reason", lambda: "3 of 4 members pending" in s.explain("default/m1")["reason"], 5)
    assert parse_assignment(api.pods[("default", "other")]["metadata"].get("annotations")) is None


def test_the_pod_group_crd_and_its_rbac_ship_with_the_standalone_scheduler() -> None:
    import yaml

    from tests.k8s.chart import DEPLOY

    docs = [d for d in yaml.safe_load_all((DEPLOY / "corral-standalone.yaml").read_text()) if d]
    [crd] = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    assert crd["metadata"]["name"] == "podgroups.scheduling.x-k8s.io"
    assert (crd["spec"]["group"], crd["spec"]["scope"], crd["spec"]["names"]["kind"]) == (
        "scheduling.x-k8s.io", "Namespaced", "PodGroup")  # fmt: skip
    [version] = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" == POD_GROUP_API.split("/")[1]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["minMember"]["type"] == "integer" and spec["minMember"]["minimum"] == 1


def test_gang_members_are_counted_by_their_code_in_the_pending_metric(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    pod_group(api, "g", 3)
    pod_group(api, "zero", 0)
    s = run()
    api.put_pod(member("m0", "g"))
    api.put_pod(member("z", "zero"))
    api.put_pod(member("w0", "wide", 2))
    wait_for("the codes", lambda: s.pending_by_reason() == {"gang_incomplete": 1, "gang_invalid": 2}, 5)


def test_corral_k8s_explain_shows_a_pending_pods_queue_and_gang() -> None:
    from corral.k8s.cli import explain_text

    p = member("m0", "train")
    p["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "research"
    reason = "gang default/train: 1 of 4 members pending, needs 4 that fit together; waiting for 3 more"
    p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                  "message": reason, "lastTransitionTime": "2026-11-28T15:00:00Z"}]  # fmt: skip
    assert explain_text(p, []).splitlines() == [
        "default/m0: pending (Unschedulable, since 2026-11-28T15:00:00Z)",
        f"  {reason}",
        "  queue research, gang default/train (PodGroup scheduling.x-k8s.io/v1alpha1)",
    ]


def test_a_gang_stays_a_gang_on_a_cluster_with_a_tainted_node(api: FakeKubeApi, run: Callable[..., Scheduler]) -> None:
    tainted = gpu_node("n3", 2)
    tainted["spec"] = {"taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]}
    api.put_node(tainted)
    pod_group(api, "g", 3)
    s = run()
    for i in range(2):
        api.put_pod(member(f"m{i}", "g"))
    wait_for("the gang's reason", lambda: s.explain("default/m1").get("code") == "gang_incomplete", 5)
    assert not [c for c in api.calls if c[0] == "create_binding"]
    api.put_pod(member("m2", "g"))
    wait_for("all three bound", lambda: all(node_of(api, f"m{i}") for i in range(3)), 5)
    assert all(node_of(api, f"m{i}") != "n3" for i in range(3))


def test_a_relist_drops_bound_members_deleted_while_the_watch_was_down(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    pod_group(api, "g", 3)
    _bound_member(api, "m0", "n1", 0)
    _bound_member(api, "m1", "n1", 1)
    s = run()
    wait_for("two bound members", lambda: len(s._gang_bound.get("default/g", {})) == 2, 5)
    api.pods.pop(("default", "m1"))  # gone without a watch event (a watch outage)
    s.listed("pods", api.list("pods")[0])
    assert set(s._gang_bound["default/g"]) == {"uid-default-m0"}
    api.put_pod(member("m2", "g"))  # 1 bound + 1 pending < 3: it must not be bound as if m1 were there
    wait_for("its reason", lambda: s.explain("default/m2").get("code") == "gang_incomplete", 5)
    assert node_of(api, "m2") is None


def _partly_bound(api: FakeKubeApi) -> tuple[Scheduler, str]:
    """A scheduler (not started: its clock is the test's) that follows gang g (minMember 4): m0 bound, m1..m3
    waiting. Returns it and m3's key."""
    pod_group(api, "g", 4)
    _bound_member(api, "m0", "n1", 0)
    for i in (1, 2, 3):
        api.put_pod(member(f"m{i}", "g"))
    s = Scheduler(api, BINPACK)
    s.gang_partial_seconds = 2.0
    for obj in api.list("pods")[0]:
        s.observed("pods", "ADDED", obj)
    s._gang_info["default/g"] = (0.0, 4, "")
    return s, "uid-default-m3"


def test_a_members_binding_in_flight_holds_off_the_deletion_but_does_not_restart_the_gangs_clock(
    api: FakeKubeApi,
) -> None:
    s, m3 = _partly_bound(api)
    try:
        s._check_partial(now=100.0)  # bound short, members waiting: the clock starts
        with s._cond:  # m3 is placed and its Binding goes out (a webhook that will time out)
            s._inflight[m3] = s._known[m3]
            s._gang_bound["default/g"][m3] = ("default", "m3")
        s._check_partial(now=101.0)
        s._check_partial(now=102.5)  # past the timeout, but m3's answer may yet make the gang whole
        assert ("default", "m0") in api.pods
        with s._cond:  # refused: m3 waits again (as _follow leaves it)
            s._inflight.pop(m3)
            s._gang_bound["default/g"].pop(m3)
        s._check_partial(now=102.6)  # short since 100.0, not since the Binding's answer
        assert ("default", "m0") not in api.pods
        [e] = [e for _, e in api.events if e["reason"] == "CorralGangIncomplete"]
        assert e["involvedObject"]["name"] == "m0"
    finally:
        s.close()


def test_a_member_being_deleted_no_longer_counts_as_bound_and_wakes_its_gang(api: FakeKubeApi) -> None:
    s, _ = _partly_bound(api)
    try:
        assert set(s._gang_bound["default/g"]) == {"uid-default-m0"}
        with s._cond:  # the gang's waiting members were placed and do not fit
            for k in list(s._active):
                s._unschedulable[k] = s._active.pop(k)
        m0 = dict(api.pods[("default", "m0")])
        m0["metadata"] = {**m0["metadata"], "deletionTimestamp": "2026-11-28T00:00:00Z"}
        s.observed("pods", "MODIFIED", m0)  # Terminating (a grace period): it is going, not bound
        assert s._gang_bound["default/g"] == {}
        assert s._unschedulable == {}  # placed again: "3 of 4 members pending ... waiting for 1 more"
        assert {w.pending.name for w in s._active.values()} == {"default/m1", "default/m2", "default/m3"}
        s._check_partial(now=100.0)
        s._check_partial(now=103.0)
        assert [e for _, e in api.events if e["reason"] == "CorralGangIncomplete"] == []  # not deleted twice
    finally:
        s.close()


def test_a_gang_whose_pod_group_is_created_after_its_members_is_placed_once_it_exists(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    s = run()
    for i in range(2):
        api.put_pod(member(f"m{i}", "late"))
    missing = ("gang default/late: PodGroup default/late (scheduling.x-k8s.io/v1alpha1) not found; its members wait "
               "until it exists")  # fmt: skip
    wait_for("the reason", lambda: s.explain("default/m0").get("reason") == missing, 5)
    pod_group(api, "late", 2)  # nothing else changes: no node, no pod event
    wait_for("both bound", lambda: all(node_of(api, f"m{i}") for i in range(2)), 10)


def test_a_pod_group_that_could_not_be_read_is_read_again(
    api: FakeKubeApi, run: Callable[..., Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    pod_group(api, "g", 2)
    real = api.get_pod_group
    failures = [KubeApiError("get PodGroup default/g: 503: the server is currently unable to handle the request", 503)]

    def flaky(*args: str) -> Any:
        if failures:
            raise failures.pop()
        return real(*args)

    monkeypatch.setattr(api, "get_pod_group", flaky)
    s = run()
    for i in range(2):
        api.put_pod(member(f"m{i}", "g"))
    wait_for("the reason", lambda: "cannot read PodGroup default/g" in s.explain("default/m0").get("reason", ""), 5)
    wait_for("both bound", lambda: all(node_of(api, f"m{i}") for i in range(2)), 10)


def test_a_gang_with_a_pod_group_error_is_looked_at_again_less_and_less_often(api: FakeKubeApi) -> None:
    s = Scheduler(api, BINPACK)
    try:
        api.put_pod(member("m0", "lost"))
        s.observed("pods", "ADDED", api.pods[("default", "m0")])
        steps = []
        for _ in range(8):
            with s._cond:
                batch = list(s._known.values())
            s._gang_infos(batch)
            when, step = s._gang_recheck["default/lost"]
            steps.append(step)
            with s._cond:
                s._gang_info["default/lost"] = (0.0, 0, "x")  # stale: read again in the next batch
        assert steps == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
        s._gang_recheck_due(now=when - 1)
        assert s._gang_recheck["default/lost"][0] == when
        s._gang_recheck_due(now=when)
        assert s._gang_recheck["default/lost"] == (float("inf"), 60.0)
        s.observed("pods", "DELETED", api.pods[("default", "m0")])
        s._gang_recheck_due(now=when)
        assert "default/lost" not in s._gang_recheck  # no member waits: forgotten
    finally:
        s.close()


def test_a_members_binding_answered_409_keeps_its_gpus_until_the_pod_is_read_back(
    api: FakeKubeApi, run: Callable[..., Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Binding that landed but whose answer was lost is sent once more by the client on a reused connection; the
    API server answers that one 409 "already assigned". The GPUs stay charged until the pod is read back: given back
    at the 409, they went to the next pod while the member was bound on them (a GPU used twice)."""
    import threading

    pod_group(api, "g", 4)  # fills n1 and n2 (2 GPUs each)
    real_bind, real_get = api.create_binding, api.get_pod
    landed: list[tuple[Any, ...]] = []
    read_back = threading.Event()

    def bind(namespace: str, name: str, uid: str, node: str, annotations: dict[str, str] | None = None) -> None:
        if name == "m3" and not landed:
            landed.append((namespace, name, uid, node, annotations))  # its watch event is not here yet
            raise KubeApiError(f"pod {namespace}/{name} is already assigned to node {node!r}", 409)
        real_bind(namespace, name, uid, node, annotations)

    def get(namespace: str, name: str) -> Any:
        if name == "m3":
            read_back.wait(10)
        return real_get(namespace, name)

    monkeypatch.setattr(api, "create_binding", bind)
    monkeypatch.setattr(api, "get_pod", get)
    s = run()
    try:
        for i in range(4):
            api.put_pod(member(f"m{i}", "g"))
        wait_for(
            "three bound and m3's 409",
            lambda: landed != [] and sum(bool(node_of(api, f"m{i}")) for i in range(3)) == 3,
            5,
        )
        api.put_pod(gpu_pod("x", 1))
        wait_for("x's reason", lambda: s.explain("default/x").get("state") == "pending", 5)
        assert node_of(api, "x") is None
    finally:
        if landed:
            real_bind(*landed[0])  # the first Binding's effect: m3 on the GPUs the scheduler chose
        read_back.set()
    wait_for("m3 bound", lambda: node_of(api, "m3") is not None, 5)
    assert node_of(api, "x") is None
    assert sorted(used_gpus(api)) == sorted(set(used_gpus(api)))
