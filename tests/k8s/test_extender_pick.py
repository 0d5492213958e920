"""The extender's fast path behind kube-scheduler (docs/kubernetes.md, "Throughput"): filter answers only the node
corral picks (so kube-scheduler skips prioritize and its own scoring), and bind follows the pod and allocation filter
saw instead of reading the pod and deciding again, where that is safe."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest

from corral.k8s.convert import parse_assignment
from corral.k8s.extender import Extender, create_app, kube_preferences
from corral.k8s.state import Informer
from corral.placement import place
from tests.k8s.conftest import Cluster, Served, small
from tests.k8s.test_extender import ALL, bind_args, kube_pod, post

PREFERRED_AFFINITY = {
    "nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 50, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}}
        ]
    }
}


@pytest.fixture
def picking() -> Cluster:
    """small_cluster's nodes (gpu-a: 2 A100, gpu-b: 4 A100, gpu-t4: 1 T4, cpu-1: none), with pick on."""
    return small(pick=True)


def engine_choice(c: Cluster, pod: dict[str, Any]) -> str:
    assert c.state.snapshot is not None
    d = place(c.state.snapshot.copy(), c.extender.verdict(pod).request)
    assert d.allocation is not None
    return d.allocation.node


def test_filter_answers_the_node_prioritize_would_score_highest_and_nothing_else(picking: Cluster) -> None:
    c = picking
    p = kube_pod("one", {"corral.dev/gpu": "1"})
    answer = c.extender.filter({"Pod": p, "NodeNames": ALL})
    assert answer == {"Nodes": None, "NodeNames": [engine_choice(c, p)], "FailedNodes": {},
                      "FailedAndUnresolvableNodes": {}, "Error": ""}  # fmt: skip
    # the same node the ranked answer (pick off) gives the top score among the nodes kube-scheduler sent
    ranked = Extender(c.state, c.api)
    for names in (ALL, ["gpu-b", "gpu-t4", "cpu-1"], ["cpu-1", "gpu-t4"]):
        scores = ranked.prioritize({"Pod": p, "NodeNames": names})
        best = max(scores, key=lambda h: h["Score"])["Host"]
        assert c.extender.filter({"Pod": p, "NodeNames": names})["NodeNames"] == [best]
    # nothing fits: every node with its reason, as without pick (kube-scheduler's event and preemption need them)
    big = kube_pod("big", {"corral.dev/gpu": "8"})
    failed = c.extender.filter({"Pod": big, "NodeNames": ALL})
    assert failed["NodeNames"] == [] and set(failed["FailedNodes"]) | set(failed["FailedAndUnresolvableNodes"]) == set(
        ALL
    )


def test_pods_with_preferences_kube_scheduler_scores_get_every_node_that_fits(picking: Cluster) -> None:
    c = picking
    plain = kube_pod("plain", {"corral.dev/gpu": "1"})
    spread = copy.deepcopy(plain)
    spread["metadata"]["uid"] = "uid-spread"
    spread["spec"]["topologySpreadConstraints"] = [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {}}
    ]
    affine = copy.deepcopy(plain)
    affine["metadata"]["uid"] = "uid-affine"
    affine["spec"]["affinity"] = PREFERRED_AFFINITY
    hard = copy.deepcopy(plain)  # DoNotSchedule is a filter kube-scheduler applies itself: no scores to add
    hard["metadata"]["uid"] = "uid-hard"
    hard["spec"]["topologySpreadConstraints"] = [{**spread["spec"]["topologySpreadConstraints"][0],
                                                  "whenUnsatisfiable": "DoNotSchedule"}]  # fmt: skip
    assert [kube_preferences(p) for p in (plain, spread, affine, hard)] == [False, True, True, False]
    fitting = ["gpu-a", "gpu-b", "gpu-t4"]
    for p in (spread, affine):
        assert c.extender.filter({"Pod": p, "NodeNames": ALL})["NodeNames"] == fitting
    assert len(c.extender.filter({"Pod": hard, "NodeNames": ALL})["NodeNames"]) == 1


def test_bind_follows_the_pod_filter_saw_while_the_watch_shows_that_very_pod(picking: Cluster) -> None:
    c = picking
    p = kube_pod("fast", {"corral.dev/gpu": "1"})
    c.api.put_pod(p)
    c.sync()  # the watch has seen the pod
    [node] = c.extender.filter({"Pod": p, "NodeNames": ALL})["NodeNames"]
    assert c.extender.bind(bind_args(p, node)) == {"Error": ""}
    assert not [k for k in c.api.calls if k[0] == "get_pod"]  # no read: the watch vouches for the pod
    stored = c.api.pods[("default", "fast")]
    a = parse_assignment(stored["metadata"]["annotations"])
    assert stored["spec"]["nodeName"] == node and a is not None and a.node == node


def test_a_pod_recreated_after_its_filter_is_read_and_refused(picking: Cluster) -> None:
    """The pod filter saw is not the pod of that name any more (deleted and created again): bind reads the API
    server, as kube-apiserver would bind the new pod whatever UID the Binding names."""
    c = picking
    old = kube_pod("again", {"corral.dev/gpu": "1"})
    c.api.put_pod(old)
    c.sync()
    [node] = c.extender.filter({"Pod": old, "NodeNames": ALL})["NodeNames"]
    c.api.delete_pod("default", "again")
    new = copy.deepcopy(old)
    new["metadata"]["uid"] = "uid-default-again-2"
    c.api.put_pod(new)
    c.sync()  # the watch shows the new pod under that name
    refused = c.extender.bind(bind_args(old, node))["Error"]
    assert "PodUID: 'uid-default-again' is not the UID of pod default/again" in refused
    assert ("get_pod", "default", "again") in c.api.calls
    assert not c.api.pods[("default", "again")]["spec"].get("nodeName")
    assert c.state.snapshot is not None and c.state.snapshot.gpu_allocated_milli == 0


def test_bind_reserves_filters_allocation_and_decides_again_only_when_it_was_taken(picking: Cluster) -> None:
    """kube-scheduler filters the next pods while earlier binds travel, so by bind time the cluster has changed:
    bind takes filter's GPUs if they are still free (no second engine pass) and decides again where another bind
    took them, never handing out one GPU twice."""
    c = picking
    decided: list[str] = []
    decide = c.extender._decide

    def counting(ask: Any) -> Any:
        decided.append(ask.request.id)
        return decide(ask)

    c.extender._decide = counting  # type: ignore[method-assign]
    pods = [kube_pod(f"w{i}", {"corral.dev/gpu": "1"}) for i in range(2)]
    first, other = kube_pod("first", {"corral.dev/gpu": "1"}), kube_pod("other", {"corral.dev/gpu": "1"})
    for p in [*pods, first, other]:
        c.api.put_pod(p)
    c.sync()
    assert c.extender.filter({"Pod": first, "NodeNames": ALL})["NodeNames"] == ["gpu-t4"]  # binpack: the fullest
    assert c.extender.bind(bind_args(first, "gpu-t4")) == {"Error": ""}
    for p in pods:  # both filtered before either binds: the engine picks the same GPU for both
        assert c.extender.filter({"Pod": p, "NodeNames": ALL})["NodeNames"] == ["gpu-a"]
    a0, a1 = c.extender.verdict(pods[0]).allocation, c.extender.verdict(pods[1]).allocation
    assert a0 is not None and a1 is not None and a0.gpus == a1.gpus
    assert c.extender.filter({"Pod": other, "NodeNames": ["gpu-b"]})["NodeNames"] == ["gpu-b"]
    assert c.extender.bind(bind_args(other, "gpu-b")) == {"Error": ""}  # the cluster changes meanwhile
    assert len(decided) == 4
    assert c.extender.bind(bind_args(pods[0], "gpu-a")) == {"Error": ""}
    assert len(decided) == 4  # filter's GPU, still free, reserved as it was: no second engine pass
    assert c.extender.bind(bind_args(pods[1], "gpu-a")) == {"Error": ""}
    assert len(decided) == 5  # its GPU went to the first: decided again, on another GPU
    held = [parse_assignment(c.api.pods[("default", p["metadata"]["name"])]["metadata"]["annotations"]) for p in pods]
    assert [a.node for a in held if a] == ["gpu-a", "gpu-a"]
    uuids = [s.uuid for a in held if a for s in a.slots]
    assert len(uuids) == len(set(uuids)) == 2


def test_status_shows_the_time_each_verb_took(picking: Cluster) -> None:
    c = picking
    p = kube_pod("timed", {"corral.dev/gpu": "1"})
    c.api.put_pod(p)
    Informer(c.api, c.state).sync_once()
    with Served(create_app(c.extender)) as url:
        [node] = post(url, "filter", {"Pod": p, "NodeNames": ALL}).json()["NodeNames"]
        assert post(url, "bind", bind_args(p, node)).json() == {"Error": ""}
        verbs = httpx.get(f"{url}/status", timeout=10).json()["verbs"]
    assert {v: t["calls"] for v, t in verbs.items() if t["calls"]} == {"filter": 1, "bind": 1}
    assert all(t["wall_s"] > 0 and t["cpu_s"] >= 0 for t in verbs.values() if t["calls"])
