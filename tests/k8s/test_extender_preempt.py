"""The extender's preempt narrows kube-scheduler's victims to what is true per GPU (kube-scheduler counts the GPU
resources in total, blind to which GPU a share sits on), and a preemptor tried again before the watch reports its
victims gone is not refused by the stale count (which made kube-scheduler preempt a second set)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from corral.k8s.extender import Extender
from tests.k8s.conftest import Cluster, gpu_node
from tests.k8s.test_extender import bind_args, kube_pod


def with_priority(p: dict[str, Any], priority: int) -> dict[str, Any]:
    p["spec"]["priority"] = priority
    return p


def two_gpu_node(c: Cluster, pods: list[tuple[str, dict[str, str], int]]) -> dict[str, dict[str, Any]]:
    """Node g2 (2 A100) with the given pods (name, limits, priority) bound there by the extender."""
    c.api.put_node(gpu_node("g2", 2))
    c.sync()
    made = {}
    for name, limits, priority in pods:
        p = with_priority(kube_pod(name, limits), priority)
        c.api.put_pod(p)
        assert c.extender.bind(bind_args(p, "g2")) == {"Error": ""}, name
        made[name] = p
    c.sync()
    return made


def gpu_of(c: Cluster, made: dict[str, dict[str, Any]]) -> dict[str, int]:
    s = c.state.snapshot
    assert s is not None
    return {n: s.allocations[p["metadata"]["uid"]].gpus[0].index for n, p in made.items()}


def preempt(ext: Extender, pod: dict[str, Any], victims: list[dict[str, Any]]) -> list[str]:
    args = {"Pod": pod, "NodeNameToMetaVictims": {"g2": {"Pods": [{"UID": v["metadata"]["uid"]} for v in victims],
                                                         "NumPDBViolations": 0}}}  # fmt: skip
    answer = ext.preempt(args)["NodeNameToMetaVictims"]
    return [] if "g2" not in answer else [v["UID"] for v in answer["g2"]["Pods"]]


def test_halves_of_two_gpus_become_both_halves_of_one() -> None:
    c = Cluster()
    made = two_gpu_node(c, [(f"half-{i}", {"corral.dev/gpu-milli": "500"}, 10) for i in range(4)])
    on = defaultdict(list)
    for name, g in gpu_of(c, made).items():
        on[g].append(made[name])
    assert sorted(len(v) for v in on.values()) == [2, 2]
    urgent = with_priority(kube_pod("urgent", {"corral.dev/gpu-milli": "600"}), 1000)
    # kube-scheduler's count: freeing 1000 of the node's 2000 gpu-milli makes room for 600; it picked one per GPU
    chosen = preempt(c.extender, urgent, [on[0][0], on[1][0]])
    assert len(chosen) == 2
    gpus = {g for g, ps in on.items() for p in ps if p["metadata"]["uid"] in chosen}
    assert len(gpus) == 1, "both victims on one GPU"


def test_victims_the_pod_does_not_need_are_spared() -> None:
    c = Cluster()
    made = two_gpu_node(c, [("w0", {"corral.dev/gpu": "1"}, 10), ("w1", {"corral.dev/gpu": "1"}, 20)])
    urgent = with_priority(kube_pod("urgent", {"corral.dev/gpu": "1"}), 1000)
    chosen = preempt(c.extender, urgent, [made["w0"], made["w1"]])
    assert chosen == [made["w0"]["metadata"]["uid"]]  # one GPU is enough; the more important pod stays


def test_pods_of_equal_or_higher_priority_are_never_added() -> None:
    c = Cluster()
    made = two_gpu_node(c, [(f"half-{i}", {"corral.dev/gpu-milli": "500"}, 10 if i % 2 else 5000) for i in range(4)])
    urgent = with_priority(kube_pod("urgent", {"corral.dev/gpu-milli": "600"}), 1000)
    low = [p for p in made.values() if p["spec"]["priority"] == 10]
    by_gpu = gpu_of(c, made)
    assert len({by_gpu[n] for n, p in made.items() if p["spec"]["priority"] == 10}) == 2  # one low half per GPU
    assert preempt(c.extender, urgent, low) == []  # no lower-priority set makes room on one GPU


def test_a_preemptor_tried_again_before_the_watch_sees_its_victims_gone_fits() -> None:
    c = Cluster()
    made = two_gpu_node(c, [("w0", {"corral.dev/gpu": "1"}, 10), ("w1", {"corral.dev/gpu": "1"}, 10)])
    urgent = with_priority(kube_pod("urgent", {"corral.dev/gpu": "1"}), 1000)
    c.api.put_pod(urgent)
    assert c.extender.filter({"Pod": urgent, "NodeNames": ["g2"]})["NodeNames"] == []
    [victim] = preempt(c.extender, urgent, [made["w0"]])
    c.api.delete_pod("default", "w0")  # kube-scheduler deletes it; the watch has not said so yet (no sync)
    assert c.extender.filter({"Pod": urgent, "NodeNames": ["g2"]})["NodeNames"] == ["g2"]
    assert c.extender.bind(bind_args(urgent, "g2")) == {"Error": ""}
    c.sync()
    s = c.state.snapshot
    assert s is not None and victim not in s.allocations and s.gpu_allocated_milli == 2000


def test_one_node_is_answered_and_a_second_preempt_for_the_same_pod_names_no_new_victims() -> None:
    """kube-scheduler deletes the victims and may try the pod again before the watch shows them gone; preempt then
    names nobody new (seen on the real plane: a second pair of halves evicted for one share)."""
    c = Cluster()
    c.api.put_node(gpu_node("g2", 2))
    c.api.put_node(gpu_node("h2", 2))
    c.sync()
    made = {}
    for node in ("g2", "h2"):
        for i in range(2):
            p = with_priority(kube_pod(f"{node}-{i}", {"corral.dev/gpu": "1"}), 10)
            c.api.put_pod(p)
            assert c.extender.bind(bind_args(p, node)) == {"Error": ""}
            made[p["metadata"]["name"]] = p
    c.sync()
    urgent = with_priority(kube_pod("urgent", {"corral.dev/gpu": "2"}), 1000)

    def ask(victims: dict[str, list[str]]) -> dict[str, Any]:
        meta = {n: {"Pods": [{"UID": made[v]["metadata"]["uid"]} for v in vs], "NumPDBViolations": 0}
                for n, vs in victims.items()}  # fmt: skip
        answer: dict[str, Any] = c.extender.preempt({"Pod": urgent, "NodeNameToMetaVictims": meta})
        return dict(answer["NodeNameToMetaVictims"])

    first = ask({"g2": ["g2-0", "g2-1"], "h2": ["h2-0", "h2-1"]})
    [(node, victims)] = first.items()  # one node: the victims named are the ones kube-scheduler deletes
    assert len(victims["Pods"]) == 2
    other = "h2" if node == "g2" else "g2"
    # kube-scheduler's cache has them gone, corral's watch not yet: it offers the other node's pods
    again = ask({other: [f"{other}-0", f"{other}-1"], node: []})
    assert again == {node: {"Pods": [], "NumPDBViolations": 0}}
