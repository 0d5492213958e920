"""Cluster state from the API server: watch-driven updates, and a rebuild by listing after a restart."""

from __future__ import annotations

import time
from collections.abc import Callable

from corral.k8s.convert import ANN_NODE_UTILIZATION
from corral.k8s.fake import pod_object
from corral.k8s.state import ClusterState, Informer
from tests.k8s.conftest import Cluster, gpu_node
from tests.k8s.test_extender import bind_args, kube_pod


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.01)


def bind(c: Cluster, name: str, limits: dict[str, str], node: str) -> None:
    p = kube_pod(name, limits)
    c.api.put_pod(p)
    assert c.extender.bind(bind_args(p, node)) == {"Error": ""}


def test_restart_rebuilds_from_annotations_without_double_booking(small_cluster: Cluster) -> None:
    c = small_cluster
    bind(c, "whole", {"corral.dev/gpu": "2"}, "gpu-b")
    bind(c, "share", {"corral.dev/gpu-milli": "500"}, "gpu-b")
    bind(c, "other", {"corral.dev/gpu-milli": "500"}, "gpu-b")
    before = c.state.snapshot
    assert before is not None
    # A restarted extender: nothing but what it lists from the API server.
    fresh = ClusterState()
    Informer(c.api, fresh).sync_once()
    after = fresh.snapshot
    assert after is not None
    assert after.gpu_allocated_milli == before.gpu_allocated_milli == 3000
    assert {k: (a.node, a.gpus) for k, a in after.allocations.items()} == {
        k: (a.node, a.gpus) for k, a in before.allocations.items()
    }
    assert (after.cpu_free == before.cpu_free).all() and (after.gpu_milli_free == before.gpu_milli_free).all()
    # Seeing the same pods again (a second list, or the watch replaying) grants nothing twice.
    Informer(c.api, fresh).sync_once()
    for p in c.api.pods.values():
        fresh.upsert_pod(p)
    assert fresh.snapshot is not None and fresh.snapshot.gpu_allocated_milli == 3000
    assert len(fresh.snapshot.allocations) == 3


def test_watch_keeps_the_state_current(small_cluster: Cluster) -> None:
    c = small_cluster
    informer = Informer(c.api, c.state)
    informer.start()
    try:
        assert informer.wait_synced(10)
        c.api.put_node(gpu_node("gpu-new", 8, model="H100"))
        eventually(lambda: "gpu-new" in c.state.nodes, "the new node")
        bind(c, "job", {"corral.dev/gpu": "4"}, "gpu-new")
        p = c.api.pods[("default", "job")]
        p["status"] = {"phase": "Running"}
        c.api.put_pod(p)
        eventually(lambda: c.state.snapshot is not None and c.state.snapshot.gpu_allocated_milli == 4000, "the bind")
        # the device plugin publishes live utilisation: the snapshot takes it without a rebuild
        node = c.api.nodes["gpu-new"]
        node["metadata"]["annotations"][ANN_NODE_UTILIZATION] = "[0.9,0.1,null,0,0,0,0,0]"
        snap = c.state.snapshot
        c.api.put_node(node)
        eventually(lambda: (c.state.utilization.get("gpu-new") or [None])[0] == 0.9, "utilisation")
        assert c.state.snapshot is snap
        p["status"] = {"phase": "Succeeded"}
        c.api.put_pod(p)
        eventually(lambda: c.state.snapshot is not None and c.state.snapshot.gpu_allocated_milli == 0, "completion")
        bind(c, "again", {"corral.dev/gpu": "1"}, "gpu-new")
        c.api.delete_pod("default", "again")
        eventually(lambda: "uid-default-again" not in c.state.pods, "the delete")
        # an API server restart ends the watch: the informer lists again and carries on
        c.api.close_watches()
        c.api.put_node(gpu_node("gpu-late", 1))
        eventually(lambda: "gpu-late" in c.state.nodes, "a node added after the watch broke")
    finally:
        informer.close()


def test_pods_of_other_schedulers_count_for_cpu_and_memory(small_cluster: Cluster) -> None:
    c = small_cluster
    big = pod_object("db", [{"name": "db", "resources": {"requests": {"cpu": "30", "memory": "100Gi"}}}], node="cpu-1")
    c.api.put_pod(big)
    c.sync()
    web = pod_object("web", [{"name": "w", "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}])
    result = c.extender.filter({"Pod": web, "NodeNames": ["cpu-1"]})
    assert result["FailedNodes"] == {"cpu-1": "insufficient CPU (need 4000m)"}


def test_a_damaged_annotation_is_reported_not_fatal(small_cluster: Cluster) -> None:
    c = small_cluster
    p = kube_pod("broken", {"corral.dev/gpu": "1"})
    p["spec"]["nodeName"] = "gpu-a"
    p["metadata"]["annotations"]["corral.dev/assignment"] = "{oops"
    c.api.put_pod(p)
    c.sync()
    assert any("unreadable assignment" in t for t in c.state.status()["problems"])
    assert "uid-default-broken" in c.state.pods  # still counted for its CPU and memory


def test_a_list_older_than_what_the_state_knows_takes_no_gpu_away(small_cluster: Cluster) -> None:
    """An informer's list can be older than a bind that landed meanwhile: it shows the pod pending, or (asked for
    before the pod was even created) not at all. Kubernetes never unbinds a pod, so neither list frees its GPUs; a
    pod that a list begun after its bind does not show is gone."""
    c = small_cluster
    c.api.put_pod(kube_pod("early", {"corral.dev/gpu": "1"}))
    stale, _ = c.api.list("pods")  # "early" pending
    since = c.state.epoch()
    bind(c, "early", {"corral.dev/gpu": "1"}, "gpu-a")
    bind(c, "late", {"corral.dev/gpu": "1"}, "gpu-a")  # not in the stale list at all
    c.state.replace_pods(stale, since)
    assert c.state.snapshot is not None and c.state.snapshot.gpu_allocated_milli == 2000
    # A watch event from before the bind says the same stale thing: ignored too.
    c.state.upsert_pod(stale[0])
    assert c.state.snapshot.gpu_allocated_milli == 2000
    # A list asked for after the binds, without "late" (deleted meanwhile): "late" is gone, "early" stays.
    since = c.state.epoch()
    c.api.delete_pod("default", "late")
    c.state.replace_pods(c.api.list("pods")[0], since)
    assert c.state.snapshot.gpu_allocated_milli == 1000
    assert sorted(r.name for r in c.state.pods.values()) == ["default/early"]
