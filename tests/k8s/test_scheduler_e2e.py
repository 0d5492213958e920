"""`corral k8s scheduler` (its own process) against a REAL kube-apiserver, beside a plain kube-scheduler (default
profile) on the same plane: nodes are API objects carrying what corral's device plugin and kubelet publish
(tests/k8s/plane.py).

- every resource style is bound, with its annotations;
- corral's scheduler and kube-scheduler never book one GPU twice;
- a kill -9 of the scheduler while pods stream in books nothing twice after the restart;
- hostile objects get a clear event and hold nothing else up;
- a pending pod gets its PodScheduled condition and at most a few events; it binds as soon as a pod is deleted.

One plane for the module. Skipped where ../shared/k8s/control-plane.sh (or CORRAL_K8S_CONTROL_PLANE) is absent.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client
from typer.testing import CliRunner

from corral.k8s.client import RealKubeApi
from corral.k8s.convert import (
    ANN_ASSIGNMENT,
    ANN_ELASTIC_ASSUMED,
    ANN_ELASTIC_CONTAINER,
    ANN_KETI_UUID,
    ANN_NODE_GPUS,
    Assignment,
    parse_assignment,
)
from corral.k8s.scheduler.core import EVENTS_PER_WINDOW
from tests.k8s.chart import DEPLOY
from tests.k8s.plane import Plane, gpu_node, pod, write_config
from tests.k8s.scheduler_proc import SchedulerProcess

NODES = {"gpu-a": 4, "gpu-b": 4, "gpu-c": 2}
TOTAL = sum(NODES.values())
NAME = "corral"


@dataclass
class Setup:
    plane: Plane
    core: client.CoreV1Api
    scheduler: SchedulerProcess


def default_profile() -> dict[str, Any]:
    """kube-scheduler as it comes: the default profile (default-scheduler), nothing ignored."""
    return {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": "@KUBECONFIG@"}, "leaderElection": {"leaderElect": False}}  # fmt: skip


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    where = tmp_path_factory.mktemp("sched-plane")
    plane = Plane.find(where)
    if plane is None:
        pytest.skip("no control plane here (../shared/k8s/control-plane.sh, openssl, curl, xz)")
    scheduler: SchedulerProcess | None = None
    try:
        kubeconfig = plane.up()
        core = RealKubeApi(kubeconfig=kubeconfig).core
        for name, gpus in NODES.items():
            core.create_node(gpu_node(name, gpus, model="A100" if gpus == 4 else "T4",
                                      memory_mib=81920 if gpus == 4 else 15360))  # fmt: skip
        core.create_node(gpu_node("cpu-1", 0))
        scheduler = SchedulerProcess(kubeconfig, where / "scheduler.log", "--policy", "binpack",
                                     "--batch-window-ms", "5")  # fmt: skip
        scheduler.start()
        plane.scheduler(write_config(where / "kube-scheduler.yaml", default_profile()))
        yield Setup(plane, core, scheduler)
    finally:
        if scheduler is not None:
            scheduler.stop()
        plane.down()


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def ours(name: str, limits: dict[str, str], annotations: dict[str, str] | None = None, **kw: Any) -> dict[str, Any]:
    return pod(name, limits, annotations, scheduler=NAME, **kw)


def pods(core: client.CoreV1Api) -> list[dict[str, Any]]:
    return list(core.api_client.sanitize_for_serialization(core.list_namespaced_pod("default").items))


def bound(core: client.CoreV1Api) -> list[dict[str, Any]]:
    return [p for p in pods(core) if p["spec"].get("nodeName")]


def node_of(core: client.CoreV1Api, name: str) -> str | None:
    node: str | None = core.read_namespaced_pod(name, "default").spec.node_name
    return node


def delete_all(core: client.CoreV1Api) -> None:
    core.delete_collection_namespaced_pod("default", grace_period_seconds=0)
    wait_for("pods to go", lambda: not core.list_namespaced_pod("default").items)


def gpu_use(pods_: list[dict[str, Any]]) -> dict[str, int]:
    """milli-GPU per GPU UUID over corral's assignments."""
    use: dict[str, int] = defaultdict(int)
    for p in pods_:
        a = parse_assignment(p["metadata"].get("annotations"))
        assert a is not None and a.node == p["spec"]["nodeName"], p["metadata"]["name"]
        for s in a.slots:
            use[s.uuid] += s.milli
    return dict(use)


def whole_gpus_per_node(pods_: list[dict[str, Any]]) -> dict[str, int]:
    """nvidia.com/gpu bound per node, every scheduler's pods."""
    out: dict[str, int] = defaultdict(int)
    for p in pods_:
        for c in p["spec"]["containers"]:
            out[p["spec"]["nodeName"]] += int(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
    return dict(out)


def events(core: client.CoreV1Api, name: str, reason: str = "FailedScheduling") -> list[Any]:
    return [e for e in core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
            if e.reason == reason]  # fmt: skip


def condition(core: client.CoreV1Api, name: str) -> Any:
    conds = core.read_namespaced_pod(name, "default").status.conditions or []
    return next((c for c in conds if c.type == "PodScheduled"), None)


def test_every_resource_style_is_bound_with_its_annotations(setup: Setup) -> None:
    core = setup.core
    names = []
    try:
        for f in sorted((DEPLOY / "samples").glob("*.yaml")):
            body = yaml.safe_load(f.read_text())
            body["spec"]["schedulerName"] = NAME
            names.append(body["metadata"]["name"])
            core.create_namespaced_pod("default", body)
        core.create_namespaced_pod("default", ours("no-gpu", {}))
        names.append("no-gpu")
        wait_for("every sample bound", lambda: len(bound(core)) == len(names))
        by_name = {p["metadata"]["name"]: p for p in pods(core)}
        assert set(by_name) == set(names)
        for name, p in by_name.items():
            ann = p["metadata"].get("annotations") or {}
            if name == "no-gpu":
                assert parse_assignment(ann) == Assignment(p["spec"]["nodeName"], {})  # as the extender writes
                continue
            assert ANN_ASSIGNMENT in ann, name
            if name.startswith("elastic"):
                assert ann[ANN_ELASTIC_ASSUMED] == "true" and ANN_ELASTIC_CONTAINER + "cuda" in ann
            if name == "keti-mps":
                assert ann[ANN_KETI_UUID].startswith("GPU-")
        use = gpu_use([p for n, p in by_name.items() if n != "no-gpu"])
        assert max(use.values()) <= 1000
        metrics = setup.scheduler.get("/metrics").text
        assert 'corral_scheduler_binds_total{result="bound"}' in metrics
        assert "corral_scheduler_bind_duration_seconds_bucket" in metrics
        assert "corral_scheduler_batch_size_bucket" in metrics
    finally:
        delete_all(core)


def test_a_waiting_pod_gets_its_reason_and_binds_as_soon_as_a_pod_is_deleted(setup: Setup) -> None:
    core = setup.core
    try:
        for i in range(4):
            core.create_namespaced_pod("default", ours(f"fill-{i}", {"corral.dev/gpu": "2"}))  # 8 of the 10 GPUs
        wait_for("the fill", lambda: len(bound(core)) == 4)
        on_a = [p["metadata"]["name"] for p in bound(core) if p["spec"]["nodeName"] == "gpu-a"]
        assert len(on_a) == 2  # binpack fills gpu-a first
        core.create_namespaced_pod("default", ours("whole-node", {"corral.dev/gpu": "4"}))
        wait_for("the PodScheduled condition", lambda: condition(core, "whole-node") is not None)
        c = condition(core, "whole-node")
        assert (c.status, c.reason) == ("False", "Unschedulable")
        assert c.message.startswith("0/4 nodes fit: "), c.message
        assert "insufficient GPU (need 4 whole GPUs)" in c.message
        wait_for("a FailedScheduling event", lambda: bool(events(core, "whole-node")))
        e = events(core, "whole-node")[0]
        assert e.message == c.message and e.source.component == "corral-scheduler" and e.type == "Warning"
        explained = setup.scheduler.get("/explain/default/whole-node").json()
        assert explained["state"] == "pending" and explained["reason"] == c.message
        assert explained["code"] == "insufficient_gpu"
        assert 'corral_scheduler_pending_pods{reason="insufficient_gpu"} 1.0' in setup.scheduler.get("/metrics").text
        out = CliRunner().invoke(cli_app(), ["explain", "default/whole-node", "--kubeconfig", setup.plane.kubeconfig])
        assert out.exit_code == 0, out.output
        lines = out.output.splitlines()
        assert lines[0].startswith("default/whole-node: pending (Unschedulable, since ")
        assert lines[1] == f"  {c.message}"
        assert lines[2] == "  queue default"  # the pod names no queue: its namespace's
        assert lines[3] == "events:" and "FailedScheduling from corral-scheduler: " + c.message in lines[4]
        core.delete_namespaced_pod(on_a[0], "default", grace_period_seconds=0)
        time.sleep(0.5)
        assert node_of(core, "whole-node") is None  # 2 free on gpu-a, 0 elsewhere... not yet
        for i in range(6):  # capacity comes and goes: an attempt each time, but a few events at most
            core.create_namespaced_pod("default", pod(f"churn-{i}", {}, scheduler="default-scheduler", cpu="10m"))
            core.delete_namespaced_pod(f"churn-{i}", "default", grace_period_seconds=0)
        time.sleep(1)
        assert 1 <= len(events(core, "whole-node")) <= EVENTS_PER_WINDOW
        core.delete_namespaced_pod(on_a[1], "default", grace_period_seconds=0)
        wait_for("the freed node to take it", lambda: node_of(core, "whole-node") == "gpu-a", 10)
    finally:
        delete_all(core)


def cli_app() -> Any:
    from corral.k8s.cli import app

    return app


def test_corral_and_kube_scheduler_never_book_one_gpu_twice(setup: Setup) -> None:
    core = setup.core
    try:
        # kube-scheduler's pods first: corral's books count them (they name no GPU; corral charges free ones)
        for i in range(4):
            core.create_namespaced_pod(
                "default", pod(f"kube-{i}", {"nvidia.com/gpu": "1"}, scheduler="default-scheduler")
            )
        wait_for("kube-scheduler's pods", lambda: len(bound(core)) == 4)
        for i in range(TOTAL):
            core.create_namespaced_pod("default", ours(f"mine-{i}", {"nvidia.com/gpu": "1"}))
        wait_for("corral's to fill the rest", lambda: len(bound(core)) == TOTAL)
        # then more of kube-scheduler's: it counts corral's pods (they ask nvidia.com/gpu) and finds no room
        for i in range(4, 6):
            core.create_namespaced_pod(
                "default", pod(f"kube-{i}", {"nvidia.com/gpu": "1"}, scheduler="default-scheduler")
            )
        time.sleep(2)
        now = bound(core)
        assert len(now) == TOTAL
        assert whole_gpus_per_node(now) == NODES
        mine = [p for p in now if p["spec"]["schedulerName"] == NAME]
        assert len(mine) == TOTAL - 4 and sorted(gpu_use(mine).values()) == [1000] * len(mine)
        assert node_of(core, "kube-4") is None and node_of(core, "kube-5") is None
    finally:
        delete_all(core)


def test_a_kill_9_while_pods_stream_in_books_nothing_twice(setup: Setup) -> None:
    core, sched = setup.core, setup.scheduler
    try:
        for i in range(TOTAL + 2):
            core.create_namespaced_pod("default", ours(f"stream-{i}", {"nvidia.com/gpu": "1"}))
            if i == 3:
                sched.kill()
        sched.start()
        wait_for("the GPUs to fill", lambda: len(bound(core)) >= TOTAL, 60)
        time.sleep(1)  # the two left over must stay pending
        now = bound(core)
        assert len(now) == TOTAL
        assert sorted(gpu_use(now).values()) == [1000] * TOTAL  # each GPU once, none twice
    finally:
        if sched.proc is None or sched.proc.poll() is not None:
            sched.start()
        delete_all(core)


def test_hostile_objects_get_a_clear_event_and_hold_nothing_up(setup: Setup) -> None:
    core = setup.core
    liar = gpu_node("liar", 2)
    liar["metadata"]["name"] = "liar"
    liar["metadata"]["annotations"][ANN_NODE_GPUS] = '[{"index": "zero", "model": 7}]'
    core.create_node(liar)
    try:
        core.create_namespaced_pod("default", ours("bad-count", {"corral.dev/gpu-milli": "500"},
                                                   {"corral.dev/gpu-count": "lots"}))  # fmt: skip
        core.create_namespaced_pod("default", ours("huge", {"corral.dev/gpu": "1"}, {"x.example/blob": "x" * 200_000}))
        core.create_namespaced_pod("default", ours("fine", {"corral.dev/gpu": "1"}))
        wait_for("the good pods bound", lambda: node_of(core, "fine") is not None and node_of(core, "huge") is not None)
        assert node_of(core, "fine") != "liar"
        wait_for("bad-count's event", lambda: bool(events(core, "bad-count")))
        message = events(core, "bad-count")[0].message
        assert message == (
            "pod default/bad-count cannot be scheduled: metadata.annotations[corral.dev/gpu-count]: not a Kubernetes "
            "quantity: 'lots' (examples: 2, 500m, 4Gi, 1e3)"
        )
        assert condition(core, "bad-count").message == message
        wait_for("the liar's event", lambda: bool(events(core, "liar", "CorralIgnoresNode")))
        told = events(core, "liar", "CorralIgnoresNode")[0].message
        assert told.startswith("node liar: metadata.annotations[corral.dev/gpus]: each GPU needs index, model"), told
        assert setup.scheduler.get("/healthz").status_code == 200
    finally:
        core.delete_node("liar")
        delete_all(core)
