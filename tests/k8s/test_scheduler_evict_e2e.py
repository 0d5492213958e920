"""Preemption end to end: `corral k8s scheduler --queues` (its own process) on a real kube-apiserver, the kubelet
and team-a's controller played by benchmarks/k8s_reclaim.py's Cluster.

- two namespaces' queues, one below its guarantee: it reclaims it by preemption; no pod is evicted within its
  minimum runtime, none twice (issue 25's row; benchmarks/k8s_reclaim.py measures it);
- a PodDisruptionBudget that allows no disruption keeps its pods from being victims: the preemptor waits; once the
  budget allows one, the pod is evicted.

One plane for the module. Skipped where ../shared/k8s/control-plane.sh (or CORRAL_K8S_CONTROL_PLANE) is absent.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from benchmarks._k8s_plane import SchedulerProcess, Writer
from benchmarks.k8s_reclaim import GPUS, NODES, Cluster, namespaces, queues_file, reclaim
from tests.k8s.plane import Plane, gpu_node

MIN_RUNTIME = 4.0


@dataclass
class Setup:
    plane: Plane
    w: Writer
    scheduler: SchedulerProcess


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    where = tmp_path_factory.mktemp("reclaim-plane")
    plane = Plane.find(where)
    if plane is None:
        pytest.skip("no control plane here (../shared/k8s/control-plane.sh, openssl, curl, xz)")
    sched: SchedulerProcess | None = None
    try:
        w = Writer(plane.up())
        namespaces(w)
        w.create_nodes(gpu_node(f"gpu-{i}", GPUS) for i in range(NODES))
        (where / "queues.toml").write_text(queues_file(MIN_RUNTIME))
        sched = SchedulerProcess(plane.kubeconfig, where / "scheduler.log", "--policy", "binpack",
                                 "--queues", str(where / "queues.toml"))  # fmt: skip
        sched.start(wait=True)
        yield Setup(plane, w, sched)
    finally:
        if sched is not None:
            sched.stop()
        plane.down()


def clean(w: Writer) -> None:
    for ns in ("team-a", "team-b"):
        w.delete_pods(namespace=ns)


def test_a_queue_below_its_guarantee_reclaims_it_and_no_pod_is_evicted_twice_within_its_minimum_runtime(
    setup: Setup,
) -> None:
    try:
        r = reclaim(setup.w, "e2e", MIN_RUNTIME)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{setup.scheduler.log_tail()}") from None
    finally:
        clean(setup.w)
    assert r["evictions_first"] == 6, r  # b's 6 GPUs, one victim each
    assert r["evicted_twice_by_uid"] == 0 and r["evicted_within_min_runtime"] == [], r
    assert r["names_evicted_twice"] == 3 and r["names_evicted_twice_within"] == [], r  # re-created, then again
    assert r["second_waited_after_rebind_s"] >= MIN_RUNTIME, r
    m = setup.scheduler.metrics()
    assert m['corral_scheduler_evictions_total{result="evicted"}'] == r["evictions"]
    assert m['corral_scheduler_preemption_results_total{result="bound"}'] == r["evictions"]


def test_a_budget_that_allows_no_disruption_keeps_its_pods_until_it_allows_one(setup: Setup) -> None:
    w = setup.w
    c = Cluster(w, "pdb", recreate=False)
    pdb = "/apis/policy/v1/namespaces/team-a/poddisruptionbudgets"
    try:
        c.create("team-a", [f"a-{i}" for i in range(NODES * GPUS)])
        full = c.wait("team-a on every GPU", lambda s: s.bound_in("team-a") == NODES * GPUS)
        w.request("POST", pdb, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                "metadata": {"name": "keep-a", "namespace": "team-a"},
                                "spec": {"minAvailable": 8, "selector": {"matchLabels": {}}}})  # fmt: skip
        status = {"disruptionsAllowed": 0, "currentHealthy": 8, "desiredHealthy": 8, "expectedPods": 8,
                  "observedGeneration": 1}  # fmt: skip
        w.request("PUT", f"{pdb}/keep-a/status", {**w.get(f"{pdb}/keep-a"), "status": status})
        past = full + MIN_RUNTIME + 0.5
        c.wait("team-a past its minimum runtime", lambda s: time.monotonic() > past, timeout=MIN_RUNTIME + 5)
        c.create("team-b", ["b-0"])
        c.wait("b-0's reason", lambda s: "insufficient GPU" in condition(w, "team-b", "b-0"))
        c.wait("a few rounds", lambda s: time.monotonic() > past + 2, timeout=10)
        assert c.seen.evictions() == []  # every candidate is under the budget: nobody is evicted, no loop
        assert condition(w, "team-b", "b-0")
        allow = {**status, "disruptionsAllowed": 1}
        w.request("PUT", f"{pdb}/keep-a/status", {**w.get(f"{pdb}/keep-a"), "status": allow})
        c.wait("b-0 bound", lambda s: s.bound_in("team-b") == 1)
        assert len(c.seen.evictions()) == 1
    finally:
        c.close()
        w.request("DELETE", f"{pdb}/keep-a", ok=(200, 404))
        clean(w)


def condition(w: Writer, namespace: str, name: str) -> str:
    p = w.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    conds = (p.get("status") or {}).get("conditions") or []
    return str(next((c.get("message") or "" for c in conds if c.get("type") == "PodScheduled"), ""))
