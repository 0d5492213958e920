"""A hostile-input corpus for the extender's HTTP face: whatever arrives at /filter, /prioritize, /bind or /preempt
(malformed bodies, wrong types, null pods, huge, negative or non-numeric quantities, deep JSON, wrong content types,
bytes that are not UTF-8, hostile Node objects in non-nodeCacheCapable mode), the answer is the verb's own shape with
an `Error` that names what was wrong (or an HTTP 4xx with a message), never a 5xx or "corral internal error", and the
log gets one line per refusal, without a traceback. After the corpus the extender still schedules correctly.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from corral.k8s.convert import ANN_NODE_GPUS
from corral.k8s.fake import node_object
from tests.k8s.conftest import Cluster
from tests.k8s.test_extender import ALL, bind_args, kube_pod

Case = tuple[str, str, bytes, str]  # (label, verb, body, content type)

HUGE = ["1e400", "99999999999999999999Gi", "9" * 400, "1e18", "1E999999999", "NaN", "nan", "Infinity", "-Inf",
        "-1", "-0.5", "1.5", "0x10", " ", "", "1e-999999999", "4Gi4", "1Qi", "١٢", "1_000", "+", ".", "1e"]  # fmt: skip
WRONG_TYPES: list[Any] = [None, True, [], {}, [1], {"a": 1}, 1e308, -1, 2**70, 1.5]
RESOURCES = ["corral.dev/gpu", "corral.dev/gpu-milli", "corral.dev/gpu-memory", "elasticgpu.io/gpu-core",
             "elasticgpu.io/gpu-memory", "nvidia.com/gpu", "keti.com/mpsgpu", "cpu", "memory"]  # fmt: skip


_made = itertools.count()


def _pod(limits: dict[str, Any], annotations: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod with these limits (and annotations), each with its own name and UID (no cached verdict answers it)."""
    p = kube_pod(f"hostile-{next(_made)}", {})
    p["spec"]["containers"][0]["resources"] = {"limits": limits}
    if annotations is not None:
        p["metadata"]["annotations"] = annotations
    return p


def _j(body: Any) -> bytes:
    return json.dumps(body, allow_nan=True).encode()


def corpus() -> list[Case]:
    cases: list[Case] = []

    def add(label: str, verb: str, body: Any, ctype: str = "application/json") -> None:
        cases.append((label, verb, body if isinstance(body, bytes) else _j(body), ctype))

    good = kube_pod("ok", {"corral.dev/gpu": "1"})
    deep = b"[" * 100_000 + b"]" * 100_000
    deep_obj = b'{"Pod":' * 5000 + b"{}" + b"}" * 5000
    raw_bodies = {
        "empty": b"", "not json": b"{not json", "nul": b"\x00", "latin-1": b'{"Pod": "\xe9"}', "bad utf-8": b"\xff\xfe",
        "lone surrogate": b'{"Pod": {"metadata": {"name": "\\ud800"}}, "NodeNames": ["\\udfff"]}',
        "NaN literal": b'{"Pod": NaN}', "deep array": deep, "deep object": deep_obj, "trailing": b"{} {}",
        "number": b"1e400", "string": b'"x"', "null": b"null", "true": b"true",
    }  # fmt: skip
    for verb in ("filter", "prioritize", "bind", "preempt"):
        for label, raw in raw_bodies.items():
            add(f"{verb}: {label}", verb, raw)
        for ctype in (
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/xml",
            "application/jsonx",
            "image/png",
        ):
            add(f"{verb}: content type {ctype!r}", verb, {"Pod": good, "NodeNames": ALL}, ctype)
    # filter / prioritize: ExtenderArgs
    for verb in ("filter", "prioritize"):
        for bad in WRONG_TYPES:
            add(f"{verb}: Pod={bad!r}", verb, {"Pod": bad, "NodeNames": ALL})
            add(f"{verb}: NodeNames={bad!r}", verb, {"Pod": good, "NodeNames": bad})
            add(f"{verb}: Nodes={bad!r}", verb, {"Pod": good, "Nodes": bad, "NodeNames": None})
            add(f"{verb}: Nodes.items=[{bad!r}]", verb, {"Pod": good, "Nodes": {"items": [bad]}})
            add(f"{verb}: metadata={bad!r}", verb, {"Pod": {**good, "metadata": bad}, "NodeNames": ALL})
            add(f"{verb}: spec={bad!r}", verb, {"Pod": {**good, "spec": bad}, "NodeNames": ALL})
            add(f"{verb}: containers={bad!r}", verb, {"Pod": {**good, "spec": {"containers": bad}}, "NodeNames": ALL})
            add(
                f"{verb}: resources={bad!r}",
                verb,
                {"Pod": {**good, "spec": {"containers": [{"name": "c", "resources": bad}]}}, "NodeNames": ALL},
            )
            add(f"{verb}: annotations={bad!r}", verb, {"Pod": _pod({"corral.dev/gpu": "1"}, bad), "NodeNames": ALL})
            add(
                f"{verb}: priority={bad!r}",
                verb,
                {"Pod": {**good, "spec": {**good["spec"], "priority": bad}}, "NodeNames": ALL},
            )
        add(f"{verb}: no Pod", verb, {"NodeNames": ALL})
        add(f"{verb}: neither names nor nodes", verb, {"Pod": good})
        add(f"{verb}: 100k unknown names", verb, {"Pod": good, "NodeNames": [f"n{i}" for i in range(100_000)]})
        for res in RESOURCES:
            for q in HUGE:
                add(f"{verb}: {res}={q!r}", verb, {"Pod": _pod({res: q}), "NodeNames": ALL})
            for q in WRONG_TYPES:
                add(f"{verb}: {res}={q!r} (JSON)", verb, {"Pod": _pod({res: q}), "NodeNames": ALL})
        add(
            f"{verb}: float NaN quantity",
            verb,
            b'{"Pod": {"spec": {"containers": [{"name": "c", "resources": '
            b'{"limits": {"cpu": 1e400}}}]}}, "NodeNames": ["gpu-a"]}',
        )
        for ann in (
            "corral.dev/gpu-count",
            "corral.dev/min-gpu-memory",
            "GPUrequest",
            "corral.dev/gpu-behavior",
            "corral.dev/policy",
            "corral.dev/gpu-model",
        ):
            for q in ["1e400", "-3", "0", "99999999999999999999Gi", "", ",", "x" * 10_000]:
                limits = {"keti.com/mpsgpu": "1"} if ann == "GPUrequest" else {"corral.dev/gpu-milli": "300"}
                add(f"{verb}: annotation {ann}={q[:20]!r}", verb, {"Pod": _pod(limits, {ann: q}), "NodeNames": ALL})
        # Hostile Node objects (kube-scheduler sends whole Nodes when the extender is not nodeCacheCapable).
        for field, value in [("cpu", "1e400"), ("memory", "99999999999999999999Gi"), ("cpu", -1), ("cpu", None),
                             ("memory", [1]), ("cpu", "NaN")]:  # fmt: skip
            node = node_object("evil", "8", "32Gi")
            node["status"]["allocatable"][field] = value
            add(f"{verb}: Node allocatable.{field}={value!r}", verb, {"Pod": good, "Nodes": {"items": [node]}})
        for gpus in ['[{"index": 0, "model": "A100", "memory_mib": 1e400}]', '[{"index": 1e400, "model": "A"}]',
                     '[{"index": 0, "model": "A", "memory_mib": 99999999999999999999999}]', "[1]", "{}", "[[]]",
                     '[{"index": 0, "model": "A", "nvlink": 5}]', '[{"index": 0, "model": "A", "numa": "x"}]',
                     '[{"index": -1, "model": "A"}]', '[{"index": 0, "model": ""}]', "null", "x" * 1000,
                     '[{"index": 0, "model": "A"}, {"index": 0, "model": "A"}]', 7]:  # fmt: skip
            node = node_object("evil", "8", "32Gi", {ANN_NODE_GPUS: gpus})  # type: ignore[dict-item]
            add(f"{verb}: Node gpus={str(gpus)[:30]!r}", verb, {"Pod": good, "Nodes": {"items": [node]}})
        node = node_object("evil", "8", "32Gi")
        node["metadata"]["name"] = 7
        add(f"{verb}: Node name 7", verb, {"Pod": good, "Nodes": {"items": [node]}})
        node = node_object("evil", "8", "32Gi", {"corral.dev/gpu-utilization": '[1e400, NaN, -1, "x"]'})
        add(f"{verb}: Node utilization", verb, {"Pod": good, "Nodes": {"items": [node]}})
    # bind: ExtenderBindingArgs
    base = bind_args(good, "gpu-a")
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        for bad in [*WRONG_TYPES, "", "\x00", "a/b", "../../x", "x" * 100_000, "\ud7ff", "é"]:
            add(f"bind: {key}={str(bad)[:20]!r}", "bind", {**base, key: bad})
        add(f"bind: no {key}", "bind", {k: v for k, v in base.items() if k != key})
    add("bind: unknown node", "bind", {**base, "Node": "ghost"})
    # preempt: ExtenderPreemptionArgs
    uid = {"UID": "uid-default-hog"}
    for bad in WRONG_TYPES:
        add(f"preempt: Pod={bad!r}", "preempt", {"Pod": bad, "NodeNameToMetaVictims": {}})
        add(f"preempt: MetaVictims={bad!r}", "preempt", {"Pod": good, "NodeNameToMetaVictims": bad})
        add(f"preempt: Victims={bad!r}", "preempt", {"Pod": good, "NodeNameToVictims": bad})
        add(f"preempt: node victims={bad!r}", "preempt", {"Pod": good, "NodeNameToMetaVictims": {"gpu-a": bad}})
        add(f"preempt: Pods={bad!r}", "preempt", {"Pod": good, "NodeNameToMetaVictims": {"gpu-a": {"Pods": bad}}})
        add(
            f"preempt: a victim={bad!r}",
            "preempt",
            {"Pod": good, "NodeNameToMetaVictims": {"gpu-a": {"Pods": [bad], "NumPDBViolations": 0}}},
        )
        add(
            f"preempt: whole victim={bad!r}",
            "preempt",
            {"Pod": good, "NodeNameToVictims": {"gpu-a": {"Pods": [bad], "NumPDBViolations": 0}}},
        )
        add(f"preempt: UID={bad!r}", "preempt", {"Pod": good, "NodeNameToMetaVictims": {"gpu-a": {"Pods": [
            {"UID": bad}]}}})  # fmt: skip
        add(
            f"preempt: NumPDBViolations={bad!r}",
            "preempt",
            {"Pod": good, "NodeNameToMetaVictims": {"gpu-a": {"Pods": [uid], "NumPDBViolations": bad}}},
        )
    for n in ["x", "1e400", "NaN", -5, 2**70, 1e308]:
        add(
            f"preempt: NumPDBViolations={n!r}",
            "preempt",
            {"Pod": good, "NodeNameToMetaVictims": {"gpu-a": {"Pods": [uid], "NumPDBViolations": n}}},
        )
    for q in HUGE:
        add(
            f"preempt: pod gpu={q!r}",
            "preempt",
            {"Pod": _pod({"corral.dev/gpu": q}), "NodeNameToMetaVictims": {"gpu-a": {"Pods": [uid]}}},
        )
    add("preempt: 10k victims", "preempt", {"Pod": good, "NodeNameToMetaVictims": {
        "gpu-a": {"Pods": [{"UID": f"u{i}"} for i in range(10_000)]}}})  # fmt: skip
    return cases


CORPUS = corpus()


@pytest.fixture
def hostile(served: tuple[str, Any]) -> Iterator[tuple[httpx.Client, Cluster]]:
    url, c = served
    hog = kube_pod("hog", {"corral.dev/gpu": "1"})
    c.api.put_pod(hog)
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.post("/bind", json=bind_args(hog, "gpu-b")).json() == {"Error": ""}
        yield client, c


def test_no_input_gets_an_internal_error_or_a_traceback(
    hostile: tuple[httpx.Client, Cluster], caplog: pytest.LogCaptureFixture
) -> None:
    client, c = hostile
    before = copy.deepcopy(c.state.status())
    bad: list[str] = []
    for label, verb, body, ctype in CORPUS:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="corral"):
            r = client.post(f"/{verb}", content=body, headers={"Content-Type": ctype})
        text = r.text
        records = [rec for rec in caplog.records if rec.name.startswith("corral")]
        if r.status_code >= 500 or "internal error" in text:
            bad.append(f"{label}: {r.status_code} {text[:200]}")
            continue
        if any(rec.exc_info for rec in records) or len(records) > 2:
            bad.append(f"{label}: logged {[rec.getMessage()[:100] for rec in records]} (traceback or many lines)")
        answer = r.json()
        if verb == "prioritize" and r.status_code == 200:
            assert isinstance(answer, list), label
        elif verb == "preempt" and r.status_code == 200:  # a well-formed request: its victims, no Error field
            assert isinstance(answer, dict) and isinstance(answer["NodeNameToMetaVictims"], dict), label
        elif not (isinstance(answer, dict) and isinstance(answer.get("Error"), str)):
            bad.append(f"{label}: no Error field: {text[:200]}")
    assert not bad, f"{len(bad)} of {len(CORPUS)} hostile inputs mishandled:\n" + "\n".join(bad[:40])
    # Nothing the corpus sent changed what the extender holds (the hog it granted stays, nothing else was granted).
    after = c.state.status()
    assert after["gpu_allocated_milli"] == before["gpu_allocated_milli"] == 1000
    assert after["pods"] == before["pods"]


def test_refusals_name_the_field_and_keep_the_verbs_shape(hostile: tuple[httpx.Client, Cluster]) -> None:
    client, c = hostile
    expect = [
        ("filter", {"Pod": _pod({"cpu": "1e400"}), "NodeNames": ALL}, 200, "resources.requests.cpu: too large"),
        ("filter", {"Pod": _pod({"corral.dev/gpu": "99999999999999999999Gi"}), "NodeNames": ALL}, 200,
         "resources.limits[corral.dev/gpu]: too large"),
        ("filter", {"Pod": _pod({"memory": "-1"}), "NodeNames": ALL}, 200, "must not be negative"),
        ("filter", {"Pod": _pod({"cpu": "NaN"}), "NodeNames": ALL}, 200, "not a Kubernetes quantity: 'NaN'"),
        ("prioritize", {"Pod": None, "NodeNames": ALL}, 400, "ExtenderArgs.Pod: expected a Pod object"),
        ("preempt", {"Pod": kube_pod("p", {}), "NodeNameToMetaVictims": {"gpu-a": []}}, 400,
         "NodeNameToMetaVictims[gpu-a]: expected an object with Pods and NumPDBViolations"),
        ("preempt", {"Pod": kube_pod("p", {}), "NodeNameToMetaVictims": {"gpu-a": {"Pods": [{"UID": "u"}],
                     "NumPDBViolations": "x"}}}, 400, "NodeNameToMetaVictims[gpu-a].NumPDBViolations: expected"),
        ("bind", {"PodName": "p", "Node": ["gpu-a"]}, 200, "ExtenderBindingArgs.Node: must be a non-empty string"),
        ("bind", {"PodName": "../x", "Node": "gpu-a"}, 200, "ExtenderBindingArgs.PodName: must be a Kubernetes name"),
    ]  # fmt: skip
    for verb, body, status, words in expect:
        r = client.post(f"/{verb}", content=_j(body), headers={"Content-Type": "application/json"})
        assert (r.status_code, words) == (status, words) and words in r.json()["Error"], (verb, r.text)
    r = client.post("/filter", content=b"\xff\xfe", headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and "body: not valid JSON" in r.json()["Error"]
    assert set(r.json()) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    r = client.post("/filter", content=b"{}", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and "Content-Type: expected application/json, got 'text/plain'" in r.json()["Error"]
    # After all that, scheduling goes on as before.
    p = kube_pod("after", {"corral.dev/gpu": "1"})
    c.api.put_pod(p)
    assert client.post("/filter", json={"Pod": p, "NodeNames": ALL}).json()["NodeNames"] == ["gpu-a", "gpu-b", "gpu-t4"]
    assert client.post("/bind", json=bind_args(p, "gpu-a")).json() == {"Error": ""}
