"""corral's extender (`corral k8s extender`, its own process) behind a REAL kube-scheduler (v1.34.2) with the chart's
scheduler configuration, against a real kube-apiserver: nodes are API objects carrying what corral's device plugin
and kubelet publish (tests/k8s/plane.py), pods are the samples in deploy/kubernetes/samples.

- every resource style is bound, with its annotations;
- an unschedulable pod's FailedScheduling event carries corral's explanation;
- killing and restarting the extender while pods stream in books no GPU twice;
- deleting pods frees their GPUs for the next ones.

Skipped where ../shared/k8s/control-plane.sh (or CORRAL_K8S_CONTROL_PLANE) or its tools are absent.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client

from corral.k8s.client import RealKubeApi
from corral.k8s.convert import (
    ANN_ASSIGNMENT,
    ANN_ELASTIC_ASSUMED,
    ANN_ELASTIC_CONTAINER,
    ANN_KETI_UUID,
    parse_assignment,
)
from tests.k8s.chart import DEPLOY
from tests.k8s.extender_proc import ExtenderProcess
from tests.k8s.plane import Plane, chart_scheduler_config, gpu_node, pod, write_config

NODES = {"gpu-a": 4, "gpu-b": 4, "gpu-c": 2}


@dataclass
class Setup:
    plane: Plane
    core: client.CoreV1Api
    extender: ExtenderProcess


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    where = tmp_path_factory.mktemp("e2e-plane")
    plane = Plane.find(where)
    if plane is None:
        pytest.skip("no control plane here (../shared/k8s/control-plane.sh, openssl, curl, xz)")
    extender: ExtenderProcess | None = None
    try:
        kubeconfig = plane.up()
        core = RealKubeApi(kubeconfig=kubeconfig).core
        for name, gpus in NODES.items():
            core.create_node(gpu_node(name, gpus, model="A100" if gpus == 4 else "T4",
                                      memory_mib=81920 if gpus == 4 else 15360))  # fmt: skip
        core.create_node(gpu_node("cpu-1", 0))
        extender = ExtenderProcess(kubeconfig, where / "extender.log")
        extender.start()
        plane.scheduler(write_config(where / "scheduler.yaml", chart_scheduler_config(extender.url)))
        yield Setup(plane, core, extender)
    finally:
        if extender is not None:
            extender.stop()
        plane.down()


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def pods(core: client.CoreV1Api) -> list[dict[str, Any]]:
    return list(core.api_client.sanitize_for_serialization(core.list_namespaced_pod("default").items))


def delete_all(core: client.CoreV1Api) -> None:
    core.delete_collection_namespaced_pod("default", grace_period_seconds=0)
    wait_for("pods to go", lambda: not core.list_namespaced_pod("default").items)


def gpu_use(bound: list[dict[str, Any]]) -> dict[str, int]:
    """milli-GPU per GPU UUID over the bound pods' assignments."""
    use: dict[str, int] = defaultdict(int)
    for p in bound:
        a = parse_assignment(p["metadata"].get("annotations"))
        assert a is not None and a.node == p["spec"]["nodeName"], p["metadata"]["name"]
        for s in a.slots:
            use[s.uuid] += s.milli
    return dict(use)


def test_every_resource_style_is_bound_with_its_annotations(setup: Setup) -> None:
    core = setup.core
    samples = sorted((DEPLOY / "samples").glob("*.yaml"))
    # First, on free nodes, a pod with a preference kube-scheduler scores: filter passes every node that fits, and
    # prioritize ranks them (every other pod here gets corral's pick alone, and kube-scheduler asks no prioritize).
    preferring = pod("preferring", {"corral.dev/gpu": "1"})
    preferring["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "Exists"}]}}
    ]}}  # fmt: skip
    before = httpx.get(f"{setup.extender.url}/status", timeout=5).json()["verbs"]
    core.create_namespaced_pod("default", preferring)
    try:
        names = ["preferring"]
        wait_for(
            "the preferring pod bound", lambda: bool(core.read_namespaced_pod("preferring", "default").spec.node_name)
        )
        verbs = httpx.get(f"{setup.extender.url}/status", timeout=5).json()["verbs"]
        asked = {v: verbs[v]["calls"] - before.get(v, {"calls": 0})["calls"] for v in verbs}
        assert asked["prioritize"] >= 1 and asked["filter"] >= 1  # a retried bind may ask again
        for f in samples:
            body = yaml.safe_load(f.read_text())
            names.append(body["metadata"]["name"])
            core.create_namespaced_pod("default", body)
        core.create_namespaced_pod("default", pod("no-gpu", {}))
        names.append("no-gpu")
        wait_for("every sample bound", lambda: all(p["spec"].get("nodeName") for p in pods(core)))
        after = httpx.get(f"{setup.extender.url}/status", timeout=5).json()["verbs"]
        assert after["prioritize"]["calls"] == verbs["prioritize"]["calls"]  # the picked pods: no prioritize
        by_name = {p["metadata"]["name"]: p for p in pods(core)}
        assert set(by_name) == set(names)
        for name, p in by_name.items():
            ann = p["metadata"].get("annotations") or {}
            if name == "no-gpu":
                continue  # bound, and asks for no GPU
            assert ANN_ASSIGNMENT in ann, name
            if name.startswith("elastic"):
                assert ann[ANN_ELASTIC_ASSUMED] == "true" and ANN_ELASTIC_CONTAINER + "cuda" in ann
            if name == "keti-mps":
                assert ann[ANN_KETI_UUID].startswith("GPU-")
        use = gpu_use([p for n, p in by_name.items() if n != "no-gpu"])
        assert max(use.values()) <= 1000
    finally:
        delete_all(core)


def test_an_unschedulable_pods_event_carries_corrals_explanation(setup: Setup) -> None:
    """A pod the counts allow but no GPU suits (3 T4s: the T4 node has 2, the others are A100s) is refused by corral,
    in corral's words. (A pod that asks more than any node has in total is refused by kube-scheduler's own count,
    "Insufficient corral.dev/gpu", before the extender is asked.)"""
    core = setup.core
    core.create_namespaced_pod("default", pod("three-t4", {"corral.dev/gpu": "3"}, {"corral.dev/gpu-model": "T4"}))
    core.create_namespaced_pod("default", pod("too-big", {"corral.dev/gpu": "6"}))
    try:
        wait_for(
            "FailedScheduling events",
            lambda: failed_scheduling(core, "three-t4") > 0 and failed_scheduling(core, "too-big") > 0,
        )
        expect = {"three-t4": "2 GPU model not in [T4]", "too-big": "4 Insufficient corral.dev/gpu"}
        for name, words in expect.items():
            for e in core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items:
                assert e.reason == "FailedScheduling" and words in e.message, e.message
    finally:
        delete_all(core)


def test_restarting_the_extender_while_pods_stream_in_books_no_gpu_twice(setup: Setup) -> None:
    core, ext = setup.core, setup.extender
    total = sum(NODES.values())  # 10 GPUs: 10 one-GPU pods fill them exactly, the 11th and 12th must wait
    made: list[str] = []

    def stream() -> None:
        for i in range(total + 2):
            core.create_namespaced_pod("default", pod(f"stream-{i}", {"nvidia.com/gpu": "1"}))
            made.append(f"stream-{i}")
            time.sleep(0.15)

    writer = threading.Thread(target=stream)
    writer.start()
    try:
        time.sleep(0.6)
        ext.kill()
        time.sleep(0.5)
        ext.start()
        writer.join()
        wait_for("the GPUs to fill", lambda: sum(bool(p["spec"].get("nodeName")) for p in pods(core)) >= total, 60)
        time.sleep(1)  # the two left over must stay pending
        bound = [p for p in pods(core) if p["spec"].get("nodeName")]
        assert len(bound) == total
        use = gpu_use(bound)
        assert sorted(use.values()) == [1000] * total, use  # each GPU once, none twice
        status = httpx.get(f"{ext.url}/status", timeout=5).json()
        assert status, "the restarted extender reports its state"
    finally:
        writer.join()
        delete_all(core)


def test_deleting_pods_frees_their_gpus(setup: Setup) -> None:
    core = setup.core
    for i in range(4):
        core.create_namespaced_pod("default", pod(f"fill-{i}", {"corral.dev/gpu": "2"}))  # 8 of the 10 GPUs
    try:
        wait_for("the fill", lambda: all(p["spec"].get("nodeName") for p in pods(core)) and len(pods(core)) == 4)
        on_a = [p["metadata"]["name"] for p in pods(core) if p["spec"]["nodeName"] == "gpu-a"]
        core.create_namespaced_pod("default", pod("whole-node", {"corral.dev/gpu": "4"}))
        time.sleep(2)
        assert not core.read_namespaced_pod("whole-node", "default").spec.node_name  # no node has 4 free
        for name in on_a:
            core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        wait_for(
            "the freed node to take it",
            lambda: bool(core.read_namespaced_pod("whole-node", "default").spec.node_name),
            40,
        )
        assert core.read_namespaced_pod("whole-node", "default").spec.node_name == "gpu-a"
    finally:
        delete_all(core)


# ---------------------------------------------------------------------------------------------------- preemption
def priority_classes(core: client.CoreV1Api) -> None:
    sched = client.SchedulingV1Api(core.api_client)
    for name, value in (("e2e-low", 10), ("e2e-high", 1000)):
        try:
            sched.create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                         "metadata": {"name": name}, "value": value})  # fmt: skip
        except client.ApiException as exc:
            if exc.status != 409:
                raise


def failed_scheduling(core: client.CoreV1Api, name: str) -> int:
    """FailedScheduling events written for a pod, each repetition counted (events.k8s.io folds repeats into a
    series; core/v1 shows it as `count` or `series.count`)."""
    n = 0
    for e in core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items:
        if e.reason == "FailedScheduling":
            n += max(e.count or 1, e.series.count if e.series and e.series.count else 1)
    return n


def fill(core: client.CoreV1Api, limits: dict[str, str], count: int) -> set[str]:
    names = {f"low-{i}" for i in range(count)}
    for name in sorted(names):
        core.create_namespaced_pod("default", pod(name, limits, priority="e2e-low", cpu="100m"))
    wait_for("the low-priority fill", lambda: sum(bool(p["spec"].get("nodeName")) for p in pods(core)) == count, 60)
    return names


def test_a_high_priority_pod_preempts_the_fewest_whole_gpu_pods(setup: Setup) -> None:
    core = setup.core
    priority_classes(core)
    low = fill(core, {"corral.dev/gpu": "1"}, sum(NODES.values()))  # every GPU taken
    attempts = setup.plane.scheduler_attempts()
    try:
        core.create_namespaced_pod("default", pod("urgent", {"corral.dev/gpu": "2"}, priority="e2e-high", cpu="100m"))
        wait_for(
            "the preemptor to bind", lambda: bool(core.read_namespaced_pod("urgent", "default").spec.node_name), 40
        )
        left = {p["metadata"]["name"] for p in pods(core)} - {"urgent"}
        assert len(low - left) == 2, f"evicted {sorted(low - left)}"  # two 1-GPU pods free the two GPUs it needs
        use = gpu_use([p for p in pods(core) if p["spec"].get("nodeName")])
        assert sorted(use.values()) == [1000] * sum(NODES.values())
        # one attempt that preempts, one that binds (and one spare for a watch that lags)
        assert setup.plane.scheduler_attempts() - attempts <= 3, "retried beyond kube-scheduler's backoff"
        assert failed_scheduling(core, "urgent") >= 1
    finally:
        delete_all(core)


def test_a_high_priority_share_preempts_the_pods_of_one_gpu(setup: Setup) -> None:
    core = setup.core
    priority_classes(core)
    low = fill(core, {"corral.dev/gpu-milli": "500"}, 2 * sum(NODES.values()))  # two halves on every GPU
    attempts = setup.plane.scheduler_attempts()
    try:
        core.create_namespaced_pod(
            "default", pod("urgent-share", {"corral.dev/gpu-milli": "600"}, priority="e2e-high", cpu="100m")
        )
        wait_for("the share to bind", lambda: bool(core.read_namespaced_pod("urgent-share", "default").spec.node_name),
                 40)  # fmt: skip
        by_name = {p["metadata"]["name"]: p for p in pods(core)}
        evicted = low - set(by_name)
        assert len(evicted) == 2, f"evicted {sorted(evicted)}: {setup.extender.log.read_text()[-3000:]}"
        use = gpu_use([p for p in by_name.values() if p["spec"].get("nodeName")])
        assert max(use.values()) <= 1000 and sorted(use.values()).count(600) == 1
        assert setup.plane.scheduler_attempts() - attempts <= 3, "retried beyond kube-scheduler's backoff"
    finally:
        delete_all(core)


def test_a_pod_that_preemption_cannot_help_is_not_retried_in_a_storm(setup: Setup) -> None:
    core = setup.core
    priority_classes(core)
    fill(core, {"corral.dev/gpu": "1"}, sum(NODES.values()))
    try:
        core.create_namespaced_pod("default", pod("hopeless", {"corral.dev/gpu": "6"}, priority="e2e-high", cpu="100m"))
        wait_for("a FailedScheduling event", lambda: failed_scheduling(core, "hopeless") > 0)
        attempts = setup.plane.scheduler_attempts()
        time.sleep(6)
        # kube-scheduler's own backoff (1 s, doubling to 10 s) allows a handful in 6 s; the storm was ~45 a second
        assert setup.plane.scheduler_attempts() - attempts <= 4
        assert len(pods(core)) == sum(NODES.values()) + 1, "no pod was preempted for nothing"
    finally:
        delete_all(core)
