"""Wire tests: the exact JSON kube-scheduler posts to an extender, over HTTP, and every field of the answers."""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import orjson
import pytest

from corral.k8s.client import KubeApiError
from corral.k8s.convert import ANN_ASSIGNMENT, ANN_ELASTIC_ASSUMED, ANN_KETI_UUID, parse_assignment
from corral.k8s.extender import TOP_RANKED, UNKNOWN_NODE
from corral.k8s.fake import pod_object
from corral.placement import PlacementConfig, place
from tests.k8s.conftest import Cluster, gpu_node

FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
ALL = ["gpu-a", "gpu-b", "gpu-t4", "cpu-1"]


def kube_pod(name: str, limits: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A Pod as kube-scheduler serialises it into ExtenderArgs (full object, camelCase inside)."""
    p = pod_object(name, [{"name": "cuda", "image": "nvidia/cuda:12.4.0-base-ubuntu22.04", "command": ["sleep", "1d"],
                           "resources": {"limits": limits, "requests": {"cpu": "2", "memory": "8Gi"}}}],
                   annotations=annotations)  # fmt: skip
    p["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    p["spec"].update({"restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
                      "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                       "effect": "NoExecute", "tolerationSeconds": 300}]})  # fmt: skip
    p["status"] = {"phase": "Pending", "qosClass": "Burstable"}
    return p


def post(url: str, verb: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{url}/{verb}", content=content, headers={"Content-Type": "application/json"}, timeout=10)


def bind_args(p: dict[str, Any], node: str) -> dict[str, str]:
    m = p["metadata"]
    return {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}


def test_filter_node_names_answers_every_key(served: tuple[str, Cluster]) -> None:
    url, c = served
    p = kube_pod("train", {"corral.dev/gpu": "2"})
    c.api.put_pod(p)
    r = post(url, "filter", {"Pod": p, "Nodes": None, "NodeNames": [*ALL, "ghost"]})
    assert r.status_code == 200
    body = r.json()
    assert set(body) == FILTER_KEYS
    assert body["Nodes"] is None
    assert body["NodeNames"] == ["gpu-a", "gpu-b"]
    assert body["Error"] == ""
    assert body["FailedNodes"] == {"ghost": UNKNOWN_NODE}
    assert body["FailedAndUnresolvableNodes"] == {"gpu-t4": "fewer than 2 eligible GPUs", "cpu-1": "no GPUs"}


def test_filter_full_nodes_mode_returns_node_objects(served: tuple[str, Cluster]) -> None:
    url, c = served
    nodes = [c.api.nodes[n] for n in ALL]
    p = kube_pod("share", {"corral.dev/gpu-memory": "20480"})
    r = post(url, "filter", {"Pod": p, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None})
    body = r.json()
    assert body["NodeNames"] is None
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["gpu-a", "gpu-b"]
    assert body["FailedAndUnresolvableNodes"] == {"gpu-t4": "no GPU with 20480 MiB", "cpu-1": "no GPUs"}


def test_prioritize_gives_the_engines_choice_ten(served: tuple[str, Cluster]) -> None:
    url, c = served
    p = kube_pod("one", {"corral.dev/gpu": "1"})
    r = post(url, "prioritize", {"Pod": p, "Nodes": None, "NodeNames": ALL})
    assert r.status_code == 200
    scores = r.json()
    assert [set(h) for h in scores] == [{"Host", "Score"}] * 4
    assert [h["Host"] for h in scores] == ALL
    assert all(0 <= h["Score"] <= 10 and isinstance(h["Score"], int) for h in scores)
    assert c.state.snapshot is not None
    direct = place(c.state.snapshot.copy(), c.extender.verdict(p).request)
    assert direct.allocation is not None
    best = max(scores, key=lambda h: h["Score"])
    assert best == {"Host": direct.allocation.node, "Score": 10}
    assert {h["Host"]: h["Score"] for h in scores}["cpu-1"] == 0  # cannot take a GPU pod


def test_bind_writes_node_and_assignment_in_one_call_and_never_double_books(served: tuple[str, Cluster]) -> None:
    url, c = served
    pods = [kube_pod(f"w{i}", {"corral.dev/gpu": "1"}) for i in range(2)]
    granted: list[str] = []
    for p in pods:
        c.api.put_pod(p)
        assert post(url, "filter", {"Pod": p, "NodeNames": ["gpu-a"]}).json()["NodeNames"] == ["gpu-a"]
        r = post(url, "bind", bind_args(p, "gpu-a"))
        assert r.status_code == 200
        assert r.json() == {"Error": ""}
        stored = c.api.pods[("default", p["metadata"]["name"])]
        assert stored["spec"]["nodeName"] == "gpu-a"
        a = parse_assignment(stored["metadata"]["annotations"])
        assert a is not None and a.node == "gpu-a"
        granted.extend(s.uuid for s in a.containers["cuda"])
    assert sorted(granted) == ["GPU-gpu-a-0", "GPU-gpu-a-1"]
    calls = [k for k in c.api.calls if k[0] in ("patch_pod_annotations", "create_binding")]
    assert [k[0] for k in calls] == ["create_binding"] * 2  # the assignment travels in the Binding itself
    third = kube_pod("w2", {"corral.dev/gpu": "1"})
    c.api.put_pod(third)
    f = post(url, "filter", {"Pod": third, "NodeNames": ["gpu-a"]}).json()
    assert f["NodeNames"] == []
    assert f["FailedNodes"] == {"gpu-a": "insufficient GPU (need 1 whole GPU)"}
    refused = post(url, "bind", bind_args(third, "gpu-a")).json()
    assert "does not fit on gpu-a" in refused["Error"]


def test_bind_writes_the_peers_annotations(served: tuple[str, Cluster]) -> None:
    url, c = served
    e = kube_pod("elastic", {"elasticgpu.io/gpu-core": "200"})
    k = kube_pod("keti", {"keti.com/mpsgpu": "1"}, {"GPUrequest": "4096"})
    for p in (e, k):
        c.api.put_pod(p)
        assert post(url, "bind", bind_args(p, "gpu-b")).json() == {"Error": ""}
    ann_e = c.api.pods[("default", "elastic")]["metadata"]["annotations"]
    assert ann_e[ANN_ELASTIC_ASSUMED] == "true"
    assert sorted(ann_e["elasticgpu.io/container-cuda"].split(",")) == ["0", "1"]
    ann_k = c.api.pods[("default", "keti")]["metadata"]["annotations"]
    assert ann_k[ANN_KETI_UUID].startswith("GPU-gpu-b-")
    assert json.loads(ann_k[ANN_ASSIGNMENT])["containers"]["cuda"][0]["memory_mib"] == 4096


def test_failed_binding_gives_the_gpus_back(served: tuple[str, Cluster]) -> None:
    url, c = served
    p = kube_pod("unlucky", {"corral.dev/gpu": "2"})
    c.api.put_pod(p)
    c.api.fail_next["create_binding"] = KubeApiError("etcd timeout", 500)
    r = post(url, "bind", bind_args(p, "gpu-a")).json()
    assert r["Error"] == "bind default/unlucky to gpu-a: etcd timeout"
    assert c.state.snapshot is not None and c.state.snapshot.gpu_allocated_milli == 0
    assert post(url, "bind", bind_args(p, "gpu-a")).json() == {"Error": ""}


@pytest.mark.parametrize(
    ("verb", "body", "status", "words"),
    [
        ("filter", b"{not json", 200, "body: not valid JSON"),
        ("filter", [], 200, "ExtenderArgs: expected a JSON object"),
        ("filter", {"Pod": {"metadata": {"name": "x"}, "spec": {"containers": [
            {"name": "c", "resources": {"limits": {"corral.dev/gpu": "1.5"}}}]}}, "NodeNames": ALL}, 200,
         "spec.containers[0].resources[corral.dev/gpu]: must be a whole number, got '1.5'"),
        ("filter", {"Pod": {"spec": {"containers": [{"name": "c", "resources": {"limits": {
            "corral.dev/gpu": "1", "elasticgpu.io/gpu-core": "100"}}}]}}, "NodeNames": ALL}, 200, "mixes GPU"),
        ("filter", {"Pod": {"spec": {}}, "NodeNames": "gpu-a"}, 200, "NodeNames: expected a list"),
        ("filter", {"Pod": kube_pod("x", {}), "NodeNames": ["gpu-a", 7]}, 200, "NodeNames: expected a list of node"),
        ("prioritize", {"Pod": kube_pod("x", {}), "NodeNames": [["gpu-a"]]}, 400, "NodeNames: expected a list of node"),
        ("prioritize", b"\x00\xff", 400, "body: not valid JSON"),
        ("bind", {"PodName": "x"}, 200, "ExtenderBindingArgs.Node: must be a non-empty string"),
        ("bind", {"PodName": "nobody", "PodNamespace": "default", "PodUID": "u", "Node": "gpu-a"}, 200,
         "pods 'nobody' not found"),
        ("preempt", {"Pod": 3}, 400, "Pod: expected a Pod object"),
    ],
)  # fmt: skip
def test_bad_input_gets_a_clear_error_never_a_500(
    served: tuple[str, Cluster], verb: str, body: Any, status: int, words: str
) -> None:
    url, _ = served
    r = post(url, verb, body)
    assert r.status_code == status
    assert words in r.json()["Error"]
    if verb == "filter":
        assert set(r.json()) == FILTER_KEYS
        assert r.json()["NodeNames"] is None


def test_model_this_cluster_lacks_is_unresolvable_on_every_node(served: tuple[str, Cluster]) -> None:
    url, _ = served
    p = kube_pod("h100", {"corral.dev/gpu": "1"}, {"corral.dev/gpu-model": "H100"})
    body = post(url, "filter", {"Pod": p, "NodeNames": ALL}).json()
    assert body["NodeNames"] == []
    assert body["Error"] == ""
    assert set(body["FailedAndUnresolvableNodes"]) == set(ALL)
    assert "unknown GPU model H100" in body["FailedAndUnresolvableNodes"]["gpu-a"]


def test_preempt_keeps_only_nodes_where_the_victims_make_room(served: tuple[str, Cluster]) -> None:
    url, c = served
    hogs = [kube_pod("hog-a", {"corral.dev/gpu": "2"}), kube_pod("hog-b", {"corral.dev/gpu": "1"})]
    for p, node in zip(hogs, ["gpu-a", "gpu-b"], strict=True):
        c.api.put_pod(p)
        assert post(url, "bind", bind_args(p, node)).json() == {"Error": ""}
    urgent = kube_pod("urgent", {"corral.dev/gpu": "2"})
    args = {
        "Pod": urgent,
        "NodeNameToMetaVictims": {
            "gpu-a": {"Pods": [{"UID": hogs[0]["metadata"]["uid"]}], "NumPDBViolations": 0},
            "gpu-t4": {"Pods": [], "NumPDBViolations": 0},
        },
    }
    r = post(url, "preempt", args)
    assert r.status_code == 200
    assert r.json()["NodeNameToMetaVictims"] == {
        "gpu-a": {"Pods": [{"UID": hogs[0]["metadata"]["uid"]}], "NumPDBViolations": 0}
    }
    assert c.state.snapshot is not None and c.state.snapshot.gpu_allocated_milli == 3000  # nothing was evicted
    # Without nodeCacheCapable the victims come as whole Pods; the answer names them by UID all the same. (Another
    # preemptor: for this one hog-a is being evicted already, so it would need no victims now.)
    args = {
        "Pod": kube_pod("urgent-2", {"corral.dev/gpu": "2"}),
        "NodeNameToVictims": {
            "gpu-a": {"Pods": [hogs[0]], "NumPDBViolations": 1},
            "gpu-t4": {"Pods": [], "NumPDBViolations": 0},
        },
    }
    assert post(url, "preempt", args).json()["NodeNameToMetaVictims"] == {
        "gpu-a": {"Pods": [{"UID": hogs[0]["metadata"]["uid"]}], "NumPDBViolations": 1}
    }


def test_pods_without_gpus_stay_off_gpu_nodes(served: tuple[str, Cluster]) -> None:
    url, _ = served
    p = pod_object("web", [{"name": "w", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}])
    scores = {h["Host"]: h["Score"] for h in post(url, "prioritize", {"Pod": p, "NodeNames": ALL}).json()}
    assert scores["cpu-1"] == 10
    assert max(v for k, v in scores.items() if k != "cpu-1") < 10


def test_json_answers_equal_the_readable_ones(small_cluster: Cluster) -> None:
    """The HTTP face writes filter and prioritize answers from per-node fragments; they must say exactly what the
    dict answers say, for any list of names (reordered, partial, unknown, repeated, empty) and any kind of pod."""
    c = small_cluster
    pods = [
        kube_pod("two", {"corral.dev/gpu": "2"}),
        kube_pod("share", {"corral.dev/gpu-milli": "300"}),
        kube_pod("h100", {"corral.dev/gpu": "1"}, {"corral.dev/gpu-model": "H100"}),  # unknown model: an error
        pod_object("web", [{"name": "w", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]),
    ]
    lists = [ALL, ALL[::-1], ["gpu-b"], ["ghost", "gpu-a", "ghost-2"], [], ["gpu-a", "gpu-a"], ALL, ["cpu-1"]]
    for p in pods:
        for names in lists:
            args = {"Pod": p, "NodeNames": names}
            answer = c.extender.filter(args)
            assert orjson.loads(c.extender.filter_json(args)) == answer, (p["metadata"]["name"], names)
            args = {"Pod": p, "NodeNames": answer["NodeNames"] or names}
            assert orjson.loads(c.extender.prioritize_json(args)) == c.extender.prioritize(args)
        full = {"Pod": p, "Nodes": {"metadata": {}, "items": [c.api.nodes[n] for n in ALL]}}
        assert orjson.loads(c.extender.filter_json(full)) == c.extender.filter(full)
    empty = Cluster()  # no nodes known yet
    args = {"Pod": pods[0], "NodeNames": ["gpu-a"]}
    assert orjson.loads(empty.extender.filter_json(args)) == empty.extender.filter(args) == {
        "Nodes": None, "NodeNames": [], "FailedNodes": {},
        "FailedAndUnresolvableNodes": {"gpu-a": "corral knows no nodes yet"}, "Error": "",
    }  # fmt: skip
    assert orjson.loads(empty.extender.prioritize_json(args)) == [{"Host": "gpu-a", "Score": 0}]


def test_node_name_lookups_follow_the_list_asked_about(small_cluster: Cluster) -> None:
    """Lookups are cached per list of names; lists of the same length but other names must not share an answer."""
    c = small_cluster
    p = kube_pod("one", {"corral.dev/gpu": "1"})
    seen = []
    for names in (["gpu-a", "cpu-1"], ["cpu-1", "gpu-a"], ["gpu-b", "cpu-1"], ["gpu-a", "cpu-1"]):
        answer = c.extender.filter({"Pod": p, "NodeNames": names})
        seen.append((answer["NodeNames"], sorted(answer["FailedAndUnresolvableNodes"])))
    assert seen == [(["gpu-a"], ["cpu-1"]), (["gpu-a"], ["cpu-1"]), (["gpu-b"], ["cpu-1"]), (["gpu-a"], ["cpu-1"])]


def test_unknown_routes_and_methods_get_json_errors(served: tuple[str, Cluster]) -> None:
    url, _ = served
    r = httpx.get(f"{url}/filter", timeout=10)
    assert r.status_code == 405
    assert r.headers["allow"] == "POST"
    assert r.json() == {"Error": "GET /filter: method not allowed (allowed: POST)"}
    r = httpx.post(f"{url}/schedule", content=b"{}", timeout=10)
    assert r.status_code == 404
    assert "/schedule: no such endpoint" in r.json()["Error"]
    assert httpx.get(f"{url}/healthz", timeout=10).json() == {"ok": True}
    assert httpx.get(f"{url}/status", timeout=10).json()["nodes"] == 4


def test_prioritize_beyond_the_engines_best_few_still_follows_the_engine() -> None:
    """kube-scheduler may pass none of the nodes the engine ranked first (its own filters dropped them): the engine's
    order over the rest still decides who gets 10."""
    c = Cluster()
    for i in range(TOP_RANKED + 8):
        c.api.put_node(gpu_node(f"g{i:02d}", 1 + i % 4))
    c.sync()
    p = kube_pod("one", {"corral.dev/gpu": "1"})
    ranked = c.extender.verdict(p).order
    assert len(ranked) == TOP_RANKED
    assert c.state.snapshot is not None
    rest = [n for i, n in enumerate(c.state.snapshot.names) if i not in ranked]
    scores = c.extender.prioritize({"Pod": p, "NodeNames": rest})
    assert orjson.loads(c.extender.prioritize_json({"Pod": p, "NodeNames": rest})) == scores
    full = place(c.state.snapshot, c.extender.verdict(p).request, PlacementConfig(top_scores=len(c.state.snapshot)))
    expected = next(n for n, _ in full.explanation.top if n in rest)
    assert [h["Host"] for h in scores if h["Score"] == 10] == [expected]
    assert sorted(h["Score"] for h in scores) == [1] * (len(rest) - 1) + [10]


def test_rebinding_a_bound_pod_changes_nothing_and_never_over_commits(served: tuple[str, Cluster]) -> None:
    """Finding 9: a second bind of a bound pod (to another node) used to patch the assignment before the Binding
    failed with 409 and never undo it; the extender then stopped counting that GPU and put 3 whole-GPU pods on a
    2-GPU node. Now the assignment travels in the Binding (409: nothing lands) and a bound pod is never reserved
    again."""
    url, c = served
    first = kube_pod("first", {"corral.dev/gpu": "1"})
    c.api.put_pod(first)
    assert post(url, "bind", bind_args(first, "gpu-a")).json() == {"Error": ""}
    before = copy.deepcopy(c.api.pods[("default", "first")])
    for node in ("gpu-b", "gpu-a"):
        again = post(url, "bind", bind_args(first, node)).json()
        assert again["Error"] == f"bind default/first to {node}: the pod is already bound to gpu-a"
    assert c.api.pods[("default", "first")]["metadata"]["annotations"] == before["metadata"]["annotations"]
    assert c.api.pods[("default", "first")]["spec"]["nodeName"] == "gpu-a"
    others = [kube_pod(f"other-{i}", {"corral.dev/gpu": "1"}) for i in range(2)]
    answers = []
    for p in others:
        c.api.put_pod(p)
        answers.append(post(url, "bind", bind_args(p, "gpu-a")).json()["Error"])
    assert answers[0] == "" and "does not fit on gpu-a" in answers[1]
    on_a = [p for p in c.api.pods.values() if p["spec"].get("nodeName") == "gpu-a"]
    uuids = [s.uuid for p in on_a for a in [parse_assignment(p["metadata"]["annotations"])] if a
             for s in a.slots]  # fmt: skip
    assert sorted(uuids) == ["GPU-gpu-a-0", "GPU-gpu-a-1"]  # two pods, two GPUs, each once
    assert c.state.snapshot is not None and c.state.snapshot.gpu_allocated_milli == 2000


def test_a_binding_whose_answer_is_lost_keeps_its_gpus_until_the_pod_is_read_back(served: tuple[str, Cluster]) -> None:
    """The Binding landed but its answer did not come back (a timeout, a dropped connection): the extender reads the
    pod back, sees it bound with this very assignment, and keeps counting it."""
    url, c = served
    p = kube_pod("lost", {"corral.dev/gpu": "2"})
    c.api.put_pod(p)
    c.api.lose_answer["create_binding"] = KubeApiError("connection reset")
    assert "connection reset" in post(url, "bind", bind_args(p, "gpu-a")).json()["Error"]
    assert c.api.pods[("default", "lost")]["spec"]["nodeName"] == "gpu-a"
    assert c.state.snapshot is not None and c.state.snapshot.gpu_allocated_milli == 2000
    again = post(url, "bind", bind_args(p, "gpu-b")).json()["Error"]
    assert again == "bind default/lost to gpu-b: the pod is already bound to gpu-a"
    late = kube_pod("late", {"corral.dev/gpu": "1"})
    c.api.put_pod(late)
    assert "does not fit on gpu-a" in post(url, "bind", bind_args(late, "gpu-a")).json()["Error"]


def test_a_bind_for_a_pod_deleted_and_created_again_is_refused(served: tuple[str, Cluster]) -> None:
    """kube-apiserver binds the pod of that name whatever UID the Binding names, so the extender checks it: a bind
    meant for an old pod must not bind (and annotate) its successor."""
    url, c = served
    old = kube_pod("again", {"corral.dev/gpu": "1"})
    c.api.put_pod(old)
    c.api.delete_pod("default", "again")
    new = copy.deepcopy(old)
    new["metadata"]["uid"] = "uid-default-again-2"
    c.api.put_pod(new)
    refused = post(url, "bind", bind_args(old, "gpu-a")).json()["Error"]
    assert "PodUID: 'uid-default-again' is not the UID of pod default/again" in refused
    assert not c.api.pods[("default", "again")]["spec"].get("nodeName")
    assert c.state.snapshot is not None and c.state.snapshot.gpu_allocated_milli == 0
    assert post(url, "bind", bind_args(new, "gpu-a")).json() == {"Error": ""}
