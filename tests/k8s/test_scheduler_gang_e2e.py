"""Gangs on `corral k8s scheduler` (its own process) against a REAL kube-apiserver with the shipped PodGroup CRD:

- a gang short of its minMember binds none, then all once it is whole;
- hostile PodGroups (minMember 0 refused by the CRD; 1e9; a gang larger than the cluster; a missing PodGroup) wait
  with a clear condition and hold nothing else up;
- Bindings that fail on purpose (a proxy refuses, loses or drops every third) never leave a gang partly bound, and
  no GPU is charged twice;
- after a kill -9 mid-gang (two of four Bindings written), the restarted scheduler binds the rest beside them, or,
  where the rest cannot fit, deletes the bound part within --gang-timeout-s.

One plane for the module. Skipped where ../shared/k8s/control-plane.sh (or CORRAL_K8S_CONTROL_PLANE) is absent.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from benchmarks._k8s_plane import Writer
from benchmarks._k8s_proxy import FailingProxy
from corral.k8s.convert import Assignment, GpuSlot, assignment_annotations, parse_assignment
from tests.k8s.chart import DEPLOY
from tests.k8s.plane import Plane, gpu_node, pod
from tests.k8s.scheduler_proc import SchedulerProcess

NODES = 4
GPUS = 2  # 8 GPUs
PG = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/default/podgroups"
PODS = "/api/v1/namespaces/default/pods"
TIMEOUT_S = 3
VOLCANO_PG = "/apis/scheduling.volcano.sh/v1beta1/namespaces/default/podgroups"
#: Volcano's PodGroup CRD as far as corral reads it (group, version, kind; spec.minMember): Volcano ships its own.
VOLCANO_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "podgroups.scheduling.volcano.sh"},
    "spec": {"group": "scheduling.volcano.sh", "scope": "Namespaced",
             "names": {"kind": "PodGroup", "plural": "podgroups", "singular": "podgroup"},
             "versions": [{"name": "v1beta1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
}  # fmt: skip


@dataclass
class Setup:
    plane: Plane
    w: Writer
    scheduler: SchedulerProcess  # --scheduler-name corral, straight to the API server
    flaky: SchedulerProcess  # --scheduler-name corral-flaky, through a proxy failing every third Binding
    proxy: FailingProxy


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    where = tmp_path_factory.mktemp("gang-plane")
    plane = Plane.find(where)
    if plane is None:
        pytest.skip("no control plane here (../shared/k8s/control-plane.sh, openssl, curl, xz)")
    started: list[SchedulerProcess] = []
    try:
        kubeconfig = plane.up()
        w = Writer(kubeconfig)
        [crd] = [d for d in yaml.safe_load_all((DEPLOY / "corral-standalone.yaml").read_text())
                 if d and d["kind"] == "CustomResourceDefinition"]  # fmt: skip
        w.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        w.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", VOLCANO_CRD)
        wait_for("the CRDs to be served", lambda: _served(w, PG) and _served(w, VOLCANO_PG), 30)
        w.create_nodes(gpu_node(f"node-{i}", GPUS) for i in range(NODES))
        with FailingProxy(kubeconfig, every=3) as proxy:
            s = SchedulerProcess(kubeconfig, where / "scheduler.log", "--policy", "binpack", "--gang-timeout-s",
                                 str(TIMEOUT_S))  # fmt: skip
            flaky = SchedulerProcess(proxy.kubeconfig(where / "proxy-kubeconfig"), where / "flaky.log",
                                     "--policy", "binpack", "--scheduler-name", "corral-flaky")  # fmt: skip
            for p in (s, flaky):
                p.start()
                started.append(p)
            yield Setup(plane, w, s, flaky, proxy)
    finally:
        for p in started:
            p.stop()
        plane.down()


def _served(w: Writer, path: str) -> bool:
    try:
        w.get(path)
        return True
    except RuntimeError:
        return False


def group(w: Writer, name: str, min_member: int) -> None:
    body = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"minMember": min_member}}  # fmt: skip
    w.request("POST", PG, body)


def member(name: str, gang: str, gpus: int = 1, scheduler: str = "corral") -> dict[str, Any]:
    p = pod(name, {"nvidia.com/gpu": str(gpus)}, scheduler=scheduler, cpu="100m", memory="128Mi")
    if gang:
        p["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": gang}
    return p


def pods(w: Writer) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in w.pods()}


def bound(w: Writer, prefix: str) -> list[str]:
    return sorted(n for n, p in pods(w).items() if n.startswith(prefix) and p["spec"].get("nodeName"))


def condition(p: dict[str, Any]) -> str:
    conds = (p.get("status") or {}).get("conditions") or []
    return str(next((c.get("message") or "" for c in conds if c.get("type") == "PodScheduled"), ""))


def no_gpu_twice(w: Writer) -> None:
    use: Counter[str] = Counter()
    for p in pods(w).values():
        a = parse_assignment(p["metadata"].get("annotations"))
        if a is not None and p["spec"].get("nodeName"):
            for slot in a.slots:
                use[slot.uuid] += slot.milli
    assert all(v <= 1000 for v in use.values()), use


@pytest.fixture
def clean(setup: Setup) -> Iterator[Writer]:
    yield setup.w
    setup.w.delete_pods()
    setup.w.request("DELETE", PG)


def test_a_gang_short_of_min_member_binds_none_then_all(setup: Setup, clean: Writer) -> None:
    w = clean
    group(w, "four", 4)
    w.create_pods(member(f"four-{i}", "four") for i in range(3))
    reason = "gang default/four: 3 of 4 members pending, needs 4 that fit together; waiting for 1 more"
    wait_for("the reason on all three", lambda: all(condition(p) == reason for n, p in pods(w).items()), 30)
    assert bound(w, "four-") == []
    w.create_pods([member("four-3", "four")])
    wait_for("all four bound", lambda: len(bound(w, "four-")) == 4, 30)
    no_gpu_twice(w)


def test_hostile_pod_groups_get_a_clear_reason_and_hold_nothing_up(setup: Setup, clean: Writer) -> None:
    w = clean
    with pytest.raises(RuntimeError, match="422"):  # the CRD refuses minMember 0
        group(w, "zero", 0)
    group(w, "huge", 10**9)
    group(w, "wide", 5)  # 5 members of 2 GPUs: 10 GPUs, the cluster has 8
    w.create_pods([member("huge-0", "huge"), member("lost-0", "missing"),
                   *(member(f"wide-{i}", "wide", 2) for i in range(5))])  # fmt: skip
    w.create_pods([member("solo", "")])
    wait_for("solo bound", lambda: bound(w, "solo") == ["solo"], 30)
    wait_for("the reasons", lambda: all(condition(p) for n, p in pods(w).items() if n != "solo"), 30)
    # a condition is rewritten at most every 10 s: the first may still say "1 of 5 members pending"
    wait_for("the whole gang's reason", lambda: "5 of 5 members" in condition(pods(w)["wide-0"]), 30)
    got = pods(w)
    assert condition(got["huge-0"]) == ("gang default/huge: PodGroup default/huge (scheduling.x-k8s.io/v1alpha1): "
                                        "spec.minMember 1000000000 is more than corral places together (at most "
                                        "10000)")  # fmt: skip
    assert condition(got["lost-0"]) == ("gang default/missing: PodGroup default/missing (scheduling.x-k8s.io/"
                                        "v1alpha1) not found; its members wait until it exists")  # fmt: skip
    assert re.fullmatch(
        r"gang default/wide: 5 of 5 members pending, needs 5 that fit together; only [34] fit; "
        r"default/wide-\d: 0/4 nodes fit: .*",
        condition(got["wide-0"]),
    ), condition(got["wide-0"])
    assert [n for n, p in got.items() if p["spec"].get("nodeName")] == ["solo"]
    events = w.get("/api/v1/namespaces/default/events")["items"]
    assert {e["involvedObject"]["name"] for e in events if e["reason"] == "FailedScheduling"} >= {
        "huge-0", "lost-0", "wide-0"}  # fmt: skip


def test_failing_bindings_never_leave_a_gang_partly_bound(setup: Setup, clean: Writer) -> None:
    w = clean
    for g in range(2):
        group(w, f"flaky{g}", 4)
        before = setup.proxy.counts.copy()
        w.create_pods(member(f"flaky{g}-{i}", f"flaky{g}", scheduler="corral-flaky") for i in range(4))
        wait_for(f"gang {g} whole", lambda g=g: len(bound(w, f"flaky{g}-")) == 4, 60)  # type: ignore[misc]
        no_gpu_twice(w)
        assert sum((setup.proxy.counts - before).values()) >= 4
    assert setup.proxy.counts["refuse"] + setup.proxy.counts["lose"] + setup.proxy.counts["drop"] >= 2


def _bind(w: Writer, name: str, node: str, gpu: int) -> None:
    """A Binding as the killed scheduler wrote it: its node and its assignment annotations."""
    a = Assignment(node, {"main": (GpuSlot(gpu, f"GPU-{node}-{gpu}", 1000, 81920),)})
    body = {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": "default", "annotations": assignment_annotations(a, "nvidia")},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
    w.request("POST", f"{PODS}/{name}/binding", body)


def test_after_a_kill_9_mid_gang_the_rest_binds_beside_the_bound_part(setup: Setup, clean: Writer) -> None:
    w, s = clean, setup.scheduler
    s.kill()
    try:
        group(w, "half", 4)
        w.create_pods(member(f"half-{i}", "half") for i in range(4))
        _bind(w, "half-0", "node-0", 0)  # two of four Bindings went out before the kill
        _bind(w, "half-1", "node-0", 1)
    finally:
        s.start()
    wait_for("all four bound", lambda: len(bound(w, "half-")) == 4, 30)
    no_gpu_twice(w)
    assert all(pods(w)[f"half-{i}"]["spec"]["nodeName"] != "node-0" for i in (2, 3))


def test_after_a_kill_9_mid_gang_a_rest_that_cannot_fit_loses_the_bound_part(setup: Setup, clean: Writer) -> None:
    w, s = clean, setup.scheduler
    s.kill()
    try:
        group(w, "stuck", 4)
        w.create_pods([member("stuck-0", "stuck"), member("stuck-1", "stuck"),
                       member("stuck-2", "stuck", 4), member("stuck-3", "stuck", 4)])  # fmt: skip
        _bind(w, "stuck-0", "node-0", 0)
        _bind(w, "stuck-1", "node-0", 1)
    finally:
        s.start()
    wait_for("the bound part deleted", lambda: not {"stuck-0", "stuck-1"} & set(pods(w)), TIMEOUT_S + 30)
    got = pods(w)
    assert not any(p["spec"].get("nodeName") for p in got.values())
    events = w.get("/api/v1/namespaces/default/events")["items"]
    told = {e["involvedObject"]["name"]: e["message"] for e in events if e["reason"] == "CorralGangIncomplete"}
    assert told["stuck-0"] == (f"gang default/stuck: 2 of 4 members bound for {TIMEOUT_S} s and the rest cannot be "
                               "placed; corral deletes the bound members so that their controller recreates them "
                               "and the gang is placed again whole")  # fmt: skip
    wait_for("the rest's reason", lambda: "2 of 4 members pending" in condition(pods(w)["stuck-2"]), 30)


def test_a_volcano_gang_named_by_annotation_is_bound_whole(setup: Setup, clean: Writer) -> None:
    w = clean
    w.request("POST", VOLCANO_PG, {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                                   "metadata": {"name": "vc", "namespace": "default"},
                                   "spec": {"minMember": 3}})  # fmt: skip
    try:
        pods_ = [member(f"vc-{i}", "") for i in range(3)]
        for p in pods_:
            p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = "vc"
        w.create_pods(pods_[:2])
        want = "gang default/vc: 2 of 3 members pending, needs 3 that fit together; waiting for 1 more"
        wait_for("the reason", lambda: all(condition(p) == want for p in pods(w).values()), 30)
        w.create_pods(pods_[2:])
        wait_for("all three bound", lambda: len(bound(w, "vc-")) == 3, 30)
    finally:
        w.request("DELETE", VOLCANO_PG)
