"""Replay: a few hundred pods through filter, prioritize and bind (a fake kube-scheduler picking the best extender
score) against a fake cluster; every assignment must equal what the engine decides directly on the same snapshot."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from corral.k8s.convert import node_from_k8s, parse_assignment, pod_request
from corral.k8s.fake import pod_object
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place
from tests.k8s.conftest import Cluster, gpu_node

STYLES: list[tuple[dict[str, str], dict[str, str]]] = [
    ({"corral.dev/gpu": "1"}, {}),
    ({"corral.dev/gpu": "2"}, {}),
    ({"corral.dev/gpu-milli": "250"}, {}),
    ({"corral.dev/gpu-memory": "20480"}, {}),
    ({"elasticgpu.io/gpu-core": "50", "elasticgpu.io/gpu-memory": "8192"}, {}),
    ({"elasticgpu.io/gpu-core": "100"}, {}),
    ({"nvidia.com/gpu": "4"}, {}),
    ({"keti.com/mpsgpu": "1"}, {"GPUrequest": "4096"}),
    ({}, {}),  # no GPU: the preferential behaviour keeps it off GPU nodes
]


def make_pod(rng: random.Random, i: int) -> dict[str, Any]:
    limits, ann = rng.choice(STYLES)
    requests = {"cpu": str(rng.choice([1, 2, 4, 8])), "memory": f"{rng.choice([2, 8, 32])}Gi"}
    res = {"limits": dict(limits), "requests": requests}
    return pod_object(f"p{i}", [{"name": "main", "resources": res}], annotations=dict(ann))


def fake_kube_scheduler(c: Cluster, pod: dict[str, Any], names: list[str]) -> str | None:
    args = {"Pod": pod, "NodeNames": names}
    f = orjson.loads(c.extender.filter_json(args))  # what the HTTP face sends
    assert f == c.extender.filter(args)  # ... equals the readable form
    assert f["Error"] == ""
    if not f["NodeNames"]:
        return None
    args = {"Pod": pod, "NodeNames": f["NodeNames"]}
    scores = orjson.loads(c.extender.prioritize_json(args))
    assert scores == c.extender.prioritize(args)
    best = max(scores, key=lambda h: h["Score"])
    meta = pod["metadata"]
    args = {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": best["Host"]}
    r = c.extender.bind(args)
    assert r == {"Error": ""}
    return str(best["Host"])


@pytest.mark.parametrize("policy", ["binpack", "spread", "fgd", "fgd-priced"])
def test_replay_matches_the_engine(policy: str) -> None:
    rng = random.Random(7)
    config = PlacementConfig(policy=policy)
    c = Cluster(config)
    for i in range(12):
        c.api.put_node(gpu_node(f"g{i:02d}", rng.choice([1, 2, 4, 8]), model=rng.choice(["A100", "H100"])))
    for i in range(8):
        c.api.put_node(gpu_node(f"c{i:02d}", 0, cpu="32", memory="128Gi"))
    c.sync()
    names = sorted(c.api.nodes)
    ref = ClusterSnapshot([node_from_k8s(c.api.nodes[n]) for n in names])
    placed: list[dict[str, Any]] = []
    outcomes = {"placed": 0, "unplaced": 0}
    for i in range(300):
        if placed and rng.random() < 0.3:
            gone = placed.pop(rng.randrange(len(placed)))
            c.api.delete_pod("default", gone["metadata"]["name"])
            c.state.apply("pods", "DELETED", gone)
            ref.release(gone["metadata"]["uid"])
        pod = make_pod(rng, i)
        c.api.put_pod(pod)
        expected = place(ref, pod_request(pod).request, config)
        node = fake_kube_scheduler(c, pod, names)
        if expected.allocation is None:
            assert node is None, f"pod {i}: the engine placed nothing, the extender chose {node}"
            outcomes["unplaced"] += 1
            continue
        assert node == expected.allocation.node, f"pod {i}: extender {node}, engine {expected.allocation.node}"
        a = parse_assignment(c.api.pods[("default", f"p{i}")]["metadata"]["annotations"])
        assert a is not None
        assert sorted(s.index for s in a.slots) == list(expected.allocation.gpu_indices)
        ref.allocate(expected.allocation)
        placed.append(pod)
        outcomes["placed"] += 1
    assert outcomes["placed"] > 150 and outcomes["unplaced"] > 0  # the cluster filled up and drained on the way
    snap = c.state.snapshot
    assert snap is not None
    assert (snap.gpu_milli_free == ref.gpu_milli_free).all()
    assert (snap.cpu_free == ref.cpu_free).all()
