"""Gangs on `corral k8s scheduler` (its own process) against a REAL kube-apiserver, with the half-bound state made for
real: no Binding is written by the test, the scheduler writes them all, through a proxy (binding_proxy.BindingProxy)
that holds them at a gate or fails chosen members' Bindings.

- kill -9 mid-gang: a 16-member gang's 16 Bindings wait at the gate; k of them are let through (k = 1, 8, 15, checked
  by reading the pods), the scheduler is killed with SIGKILL, the rest are reset unsent, and it is started again.
  With room left, the restarted scheduler binds the other 16 - k beside the bound part (the bound part stays, same
  pods on the same nodes). With the room gone meanwhile (nodes cordoned or deleted), it deletes the bound part once
  the gang has been bound short for --gang-timeout-s, with a CorralGangIncomplete event on each: none stays bound.
- Bindings that fail on purpose: members' Bindings answered 500 unsent, 409 "already assigned" (someone else bound
  the pod to another node), a connection reset unsent, a reset after the bind landed: the gang ends whole, and a pod
  beside it is bound meanwhile. A member whose Binding is refused for good: the gang ends with none bound.
- a PodGroup created after its members: they are bound once it exists, with nothing else changing on the plane.

One plane for the module. Skipped where ../shared/k8s/control-plane.sh (or CORRAL_K8S_CONTROL_PLANE) is absent.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from benchmarks._k8s_plane import Writer
from corral.k8s.convert import parse_assignment
from tests.k8s.binding_proxy import BindingProxy
from tests.k8s.chart import DEPLOY
from tests.k8s.plane import Plane, gpu_node, pod
from tests.k8s.scheduler_proc import SchedulerProcess

NODES = 4
GPUS = 8  # 32 GPUs: a 16-member gang of 1-GPU pods fills node-0 and node-1 (binpack)
SIZE = 16
PG = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/default/podgroups"
TIMEOUT_S = 2


@dataclass
class Setup:
    plane: Plane
    w: Writer
    proxy: BindingProxy
    scheduler: SchedulerProcess  # through the proxy, --gang-timeout-s TIMEOUT_S


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    where = tmp_path_factory.mktemp("gang-kill-plane")
    plane = Plane.find(where)
    if plane is None:
        pytest.skip("no control plane here (../shared/k8s/control-plane.sh, openssl, curl, xz)")
    s: SchedulerProcess | None = None
    try:
        kubeconfig = plane.up()
        w = Writer(kubeconfig)
        [crd] = [d for d in yaml.safe_load_all((DEPLOY / "corral-standalone.yaml").read_text())
                 if d and d["kind"] == "CustomResourceDefinition"]  # fmt: skip
        w.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        wait_for("the PodGroup CRD to be served", lambda: _served(w, PG))
        w.create_nodes(gpu_node(f"node-{i}", GPUS) for i in range(NODES))
        with BindingProxy(kubeconfig) as proxy:
            s = SchedulerProcess(proxy.kubeconfig(where / "proxy-kubeconfig"), where / "scheduler.log",
                                 "--policy", "binpack", "--gang-timeout-s", str(TIMEOUT_S))  # fmt: skip
            s.start()
            yield Setup(plane, w, proxy, s)
    finally:
        if s is not None:
            s.stop()
        plane.down()


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30, show: Callable[[], Any] = str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}: {show()}")


def _served(w: Writer, path: str) -> bool:
    try:
        w.get(path)
        return True
    except RuntimeError:
        return False


def group(w: Writer, name: str, min_member: int) -> None:
    w.request("POST", PG, {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                           "metadata": {"name": name, "namespace": "default"},
                           "spec": {"minMember": min_member}})  # fmt: skip


def member(name: str, gang: str, gpus: int = 1, grace: int = 0) -> dict[str, Any]:
    p = pod(name, {"nvidia.com/gpu": str(gpus)}, scheduler="corral", cpu="100m", memory="128Mi")
    p["spec"]["terminationGracePeriodSeconds"] = grace
    if gang:
        p["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": gang}
    return p


def pods(w: Writer) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in w.pods()}


def bound(w: Writer, prefix: str) -> dict[str, str]:
    """name -> node of the bound pods whose name starts with `prefix`."""
    return {n: p["spec"]["nodeName"] for n, p in pods(w).items() if n.startswith(prefix) and p["spec"].get("nodeName")}


def no_gpu_twice(w: Writer) -> None:
    use: Counter[str] = Counter()
    for p in pods(w).values():
        a = parse_assignment(p["metadata"].get("annotations"))
        if a is not None and p["spec"].get("nodeName"):
            for slot in a.slots:
                use[slot.uuid] += slot.milli
    assert all(v <= 1000 for v in use.values()), use


def set_cordon(w: Writer, node: str, on: bool) -> None:
    obj = w.get(f"/api/v1/nodes/{node}")
    obj["spec"]["unschedulable"] = on
    w.request("PUT", f"/api/v1/nodes/{node}", obj)


def told(w: Writer, reason: str) -> dict[str, str]:
    events = w.get("/api/v1/namespaces/default/events")["items"]
    return {e["involvedObject"]["name"]: e["message"] for e in events if e["reason"] == reason}


def explain(s: SchedulerProcess, name: str) -> dict[str, Any]:
    out: dict[str, Any] = s.get(f"/explain/default/{name}").json()
    return out


@pytest.fixture
def clean(setup: Setup) -> Iterator[Writer]:
    yield setup.w
    setup.proxy.open()
    setup.proxy.script.clear()
    setup.w.delete_pods()
    setup.w.request("DELETE", PG)
    have = {n["metadata"]["name"]: n for n in setup.w.get("/api/v1/nodes")["items"]}
    for i in range(NODES):
        name = f"node-{i}"
        if name not in have:
            setup.w.create_nodes([gpu_node(name, GPUS)])
        elif have[name]["spec"].get("unschedulable"):
            set_cordon(setup.w, name, False)
    setup.w.request("DELETE", "/api/v1/namespaces/default/events")


def kill_mid_gang(setup: Setup, gang: str, k: int, grace: int = 0) -> dict[str, str]:
    """Create a SIZE-member gang, let k of its Bindings through, SIGKILL the scheduler with the other SIZE - k at the
    gate, reset those unsent: the gang is bound k of SIZE. Returns its bound part (name -> node)."""
    w, proxy, s = setup.w, setup.proxy, setup.scheduler
    proxy.hold()
    group(w, gang, SIZE)
    w.create_pods(member(f"{gang}-{i}", gang, grace=grace) for i in range(SIZE))
    wait_for(f"all {SIZE} Bindings at the gate", lambda: proxy.waiting() == SIZE)
    assert bound(w, f"{gang}-") == {}
    proxy.allow(k)
    wait_for(f"{k} members bound", lambda: len(bound(w, f"{gang}-")) == k and proxy.waiting() == SIZE - k)
    s.kill()
    proxy.drop()
    wait_for("the gate empty", lambda: proxy.waiting() == 0)
    part = bound(w, f"{gang}-")
    assert len(part) == k, part
    return part


@pytest.mark.parametrize("k", [1, 8, 15])
def test_after_a_kill_9_mid_gang_the_restarted_scheduler_binds_the_rest_beside_the_bound_part(
    setup: Setup, clean: Writer, k: int
) -> None:
    w, s = clean, setup.scheduler
    gang = f"room{k}"
    part = kill_mid_gang(setup, gang, k)
    uids = {n: p["metadata"]["uid"] for n, p in pods(w).items() if n in part}
    setup.proxy.open()
    s.start()
    wait_for(f"all {SIZE} bound", lambda: len(bound(w, f"{gang}-")) == SIZE)
    got = bound(w, f"{gang}-")
    assert {n: got[n] for n in part} == part  # the bound part stayed where it was: the same pods
    assert {n: p["metadata"]["uid"] for n, p in pods(w).items() if n in part} == uids
    no_gpu_twice(w)
    assert told(w, "CorralGangIncomplete") == {}


@pytest.mark.parametrize(("k", "how", "grace"), [(1, "delete", 0), (8, "cordon", 0), (15, "cordon", 30)])
def test_after_a_kill_9_mid_gang_with_the_room_gone_the_bound_part_is_deleted(
    setup: Setup, clean: Writer, k: int, how: str, grace: int
) -> None:
    """grace 30: the deleted members stay Terminating (no kubelet here); they no longer count towards the gang, and
    are deleted once."""
    w, s = clean, setup.scheduler
    gang = f"gone{k}"
    part = kill_mid_gang(setup, gang, k, grace)
    used = set(part.values())
    for i in range(NODES):  # the room vanishes while the scheduler is down
        node = f"node-{i}"
        if how == "cordon":
            set_cordon(w, node, True)
        elif node not in used:
            w.request("DELETE", f"/api/v1/nodes/{node}")
    setup.proxy.open()
    s.start()

    def deleted() -> bool:
        now = pods(w)
        return all(n not in now or now[n]["metadata"].get("deletionTimestamp") for n in part)

    wait_for("the bound part deleted", deleted, TIMEOUT_S + 30)
    rest = sorted({f"{gang}-{i}" for i in range(SIZE)} - set(part))
    want = (f"gang default/{gang}: {SIZE - k} of {SIZE} members pending, needs {SIZE} that fit together; "
            f"waiting for {k} more")  # fmt: skip
    wait_for("the rest's reason", lambda: explain(s, rest[0]).get("reason") == want, show=lambda: explain(s, rest[0]))
    got = pods(w)
    assert not any(got[n]["spec"].get("nodeName") for n in rest)
    assert set(got) - set(part) == set(rest)
    assert (set(got) & set(part)) == (set(part) if grace else set())  # Terminating, or gone
    msg = told(w, "CorralGangIncomplete")
    assert set(msg) == set(part)
    assert set(msg.values()) == {
        f"gang default/{gang}: {k} of {SIZE} members bound for {TIMEOUT_S} s and the rest cannot be placed; corral "
        "deletes the bound members so that their controller recreates them and the gang is placed again whole"
    }
    events = w.get("/api/v1/namespaces/default/events")["items"]
    assert len([e for e in events if e["reason"] == "CorralGangIncomplete"]) == k  # one each: deleted once


def test_bindings_that_fail_on_purpose_leave_the_gang_whole_and_hold_nothing_up(setup: Setup, clean: Writer) -> None:
    w, proxy = clean, setup.proxy
    proxy.elsewhere = "node-3"  # binpack puts the gang on node-0 and node-1
    proxy.fail("fail-1", "refuse", "refuse")
    proxy.fail("fail-4", "conflict")
    proxy.fail("fail-7", "reset")
    proxy.fail("fail-10", "landed")
    proxy.fail("fail-13", "refuse", "reset")
    proxy.fail("fail-15", "refuse", "reset", "conflict")  # 500, then a reset, then bound elsewhere meanwhile: 409
    group(w, "fail", SIZE)
    w.create_pods(member(f"fail-{i}", "fail") for i in range(SIZE))
    w.create_pods([member("solo", "")])
    wait_for("solo bound", lambda: "solo" in bound(w, "solo"))
    wait_for(f"all {SIZE} bound", lambda: len(bound(w, "fail-")) == SIZE)
    assert {n: proxy.met[n] for n in ("fail-1", "fail-4", "fail-7", "fail-13", "fail-15")} == {
        "fail-1": ["refuse", "refuse", "forwarded"], "fail-4": ["conflict"], "fail-7": ["reset", "forwarded"],
        "fail-13": ["refuse", "reset", "forwarded"], "fail-15": ["refuse", "reset", "conflict"]}  # fmt: skip
    # a reset on a reused connection is sent once more by the client: the API server answers 409 (bound already)
    assert proxy.met["fail-10"] in (["landed"], ["landed", "forwarded"])
    got = bound(w, "fail-")
    assert (got["fail-4"], got["fail-15"]) == ("node-3", "node-3")  # bound by someone else: they count towards it
    no_gpu_twice(w)
    assert told(w, "CorralGangIncomplete") == {}


def test_a_member_whose_binding_is_refused_for_good_leaves_none_of_its_gang_bound(setup: Setup, clean: Writer) -> None:
    w, proxy, s = clean, setup.proxy, setup.scheduler
    proxy.fail("never-2", "refuse*")
    group(w, "never", 4)
    w.create_pods(member(f"never-{i}", "never") for i in range(4))
    wait_for("three bound", lambda: len(bound(w, "never-")) == 3)
    w.create_pods([member("beside", "")])
    wait_for("the pod beside bound", lambda: "beside" in bound(w, "beside"))
    wait_for("the bound part deleted", lambda: set(pods(w)) & {f"never-{i}" for i in range(4)} == {"never-2"},
             TIMEOUT_S + 30)  # fmt: skip
    assert bound(w, "never-") == {}
    msg = told(w, "CorralGangIncomplete")
    assert set(msg) == {"never-0", "never-1", "never-3"}
    assert proxy.met["never-2"][0] == "refuse*"
    want = "gang default/never: 1 of 4 members pending, needs 4 that fit together; waiting for 3 more"
    wait_for("never-2's reason", lambda: explain(s, "never-2").get("reason") == want)


def test_a_gang_whose_pod_group_comes_after_its_members_is_bound_once_it_exists(setup: Setup, clean: Writer) -> None:
    w, s = clean, setup.scheduler
    w.create_pods(member(f"late-{i}", "late") for i in range(3))
    missing = ("gang default/late: PodGroup default/late (scheduling.x-k8s.io/v1alpha1) not found; its members wait "
               "until it exists")  # fmt: skip
    wait_for("the reason", lambda: explain(s, "late-0").get("reason") == missing, show=lambda: explain(s, "late-0"))
    group(w, "late", 3)  # nothing else changes on the plane
    wait_for("all three bound", lambda: len(bound(w, "late-")) == 3)
