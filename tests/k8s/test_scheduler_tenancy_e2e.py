"""`corral k8s scheduler --queues` (its own process) against a REAL kube-apiserver: two namespaces' queues, Kueue's
and KAI's queue labels enforced, and serve's no-starvation scenario (a 4-GPU pod behind 1-GPU pods starts at its
reservation, the pods behind it that would delay it wait naming it). One plane, one node of 4 GPUs; kept short.
Skipped where ../shared/k8s/control-plane.sh (or CORRAL_K8S_CONTROL_PLANE) is absent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from benchmarks._k8s_plane import Writer
from tests.k8s.plane import Plane, gpu_node, pod
from tests.k8s.scheduler_proc import SchedulerProcess

QUEUES = """
min_runtime = "0s"
[queues.team-a]
namespaces = ["ns-a"]
guarantee = { gpus = 2 }
[queues.team-b]
namespaces = ["ns-b"]
guarantee = { gpus = 2 }
[queues.small]
limit = { gpus = 1 }
"""


@dataclass
class Setup:
    w: Writer
    scheduler: SchedulerProcess


def wait_for(what: str, check: Callable[[], bool], timeout: float = 20, show: Callable[[], object] = str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}: {show()}")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    where = tmp_path_factory.mktemp("tenancy-plane")
    plane = Plane.find(where)
    if plane is None:
        pytest.skip("no control plane here (../shared/k8s/control-plane.sh, openssl, curl, xz)")
    s: SchedulerProcess | None = None
    try:
        kubeconfig = plane.up()
        w = Writer(kubeconfig)
        for ns in ("ns-a", "ns-b"):
            w.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        w.create_nodes([gpu_node("node-0", 4)])
        queues = where / "queues.toml"
        queues.write_text(QUEUES)
        s = SchedulerProcess(kubeconfig, where / "scheduler.log", "--policy", "binpack", "--queues", str(queues))
        s.start()
        yield Setup(w, s)
    finally:
        if s is not None:
            s.stop()
        plane.down()


def gpu_pod(name: str, ns: str, gpus: int, labels: dict[str, str] | None = None,
            deadline: int | None = None) -> dict[str, Any]:  # fmt: skip
    p = pod(name, {"nvidia.com/gpu": str(gpus)}, scheduler="corral", cpu="100m", memory="128Mi")
    p["metadata"]["namespace"] = ns
    p["metadata"]["labels"] = dict(labels or {})
    if deadline:
        p["spec"]["activeDeadlineSeconds"] = deadline
    return p


def node_of(w: Writer, ns: str, name: str) -> str:
    return str(w.get(f"/api/v1/namespaces/{ns}/pods/{name}")["spec"].get("nodeName") or "")


def condition(w: Writer, ns: str, name: str) -> str:
    p = w.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    conds = (p.get("status") or {}).get("conditions") or []
    return str(next((c.get("message") or "" for c in conds if c.get("type") == "PodScheduled"), ""))


def delete_now(w: Writer, ns: str, names: list[str]) -> None:
    for n in names:
        w.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{n}", {"gracePeriodSeconds": 0})


def test_kueue_and_kai_labels_are_held_to_their_queues_limit(setup: Setup) -> None:
    w = setup.w
    w.create_pods([gpu_pod("k", "ns-a", 1, {"kueue.x-k8s.io/queue-name": "small"})], namespace="ns-a")
    wait_for("k bound", lambda: bool(node_of(w, "ns-a", "k")))
    w.create_pods([gpu_pod("i", "ns-b", 1, {"kai.scheduler/queue": "small"})], namespace="ns-b")
    wait_for(
        "i's condition", lambda: condition(w, "ns-b", "i").startswith("queue small, position 1 of 1; held by limit")
    )
    assert not node_of(w, "ns-b", "i")
    explain = setup.scheduler.get("/explain/ns-b/i").json()
    assert explain["queue"] == "small" and explain["held_by"] == "limit"
    metrics = setup.scheduler.get("/metrics").text
    assert 'corral_scheduler_queue_pending_pods{queue="small"} 1.0' in metrics
    delete_now(w, "ns-a", ["k"])
    wait_for("i bound once k is gone", lambda: bool(node_of(w, "ns-b", "i")))
    delete_now(w, "ns-b", ["i"])


def test_a_4_gpu_pod_behind_1_gpu_pods_starts_at_its_reservation(setup: Setup) -> None:
    w = setup.w
    w.create_pods([gpu_pod(f"run{i}", "ns-b", 1, deadline=3600) for i in range(3)], namespace="ns-b")
    wait_for("3 running", lambda: all(node_of(w, "ns-b", f"run{i}") for i in range(3)))
    w.create_pods([gpu_pod("big", "ns-b", 4)], namespace="ns-b")
    wait_for("big's reservation", lambda: "estimated start" in condition(w, "ns-b", "big"))
    assert condition(w, "ns-b", "big").startswith("queue team-b, position 1 of 1; held by no room; estimated start")
    # a pod that would run past the reservation waits, naming it; the free GPU stays free for big
    w.create_pods([gpu_pod("long", "ns-b", 1, deadline=7200)], namespace="ns-b")
    wait_for("long's condition", lambda: "held by the reservation of pod ns-b/big" in condition(w, "ns-b", "long"),
             show=lambda: (condition(w, "ns-b", "long"), node_of(w, "ns-b", "long"), setup.scheduler.get(
                 "/explain/ns-b/long").json(), [node_of(w, "ns-b", f"run{i}") for i in range(3)]))  # fmt: skip
    assert not node_of(w, "ns-b", "long")
    delete_now(w, "ns-b", [f"run{i}" for i in range(3)])
    wait_for("big bound once the runs end", lambda: bool(node_of(w, "ns-b", "big")))
    assert not node_of(w, "ns-b", "long")  # big took the node first
    delete_now(w, "ns-b", ["big", "long"])


def test_a_second_namespace_gets_its_turn_within_the_first_ones_burst(setup: Setup) -> None:
    w = setup.w
    w.create_pods([gpu_pod(f"a{i}", "ns-a", 1) for i in range(8)], namespace="ns-a")
    wait_for("a's first 4", lambda: sum(bool(node_of(w, "ns-a", f"a{i}")) for i in range(8)) == 4)
    w.create_pods([gpu_pod("b0", "ns-b", 1)], namespace="ns-b")
    delete_now(w, "ns-a", ["a0"])  # one GPU frees: b, below its guarantee and with no usage, goes before a's rest
    wait_for("b0 bound", lambda: bool(node_of(w, "ns-b", "b0")))
    assert sum(bool(node_of(w, "ns-a", f"a{i}")) for i in range(1, 8)) == 3
