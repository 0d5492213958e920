"""Binding failures injected between `corral k8s scheduler` and a real kube-apiserver (issue 24, tests): the scheduler's
kubeconfig points at a plain-HTTP proxy on loopback (benchmarks/_k8s_proxy.py) that fails every third Binding POST,
in turn refused (not forwarded), lost (forwarded, then answered 500) and dropped (forwarded, connection closed with no
answer). After each wave the books stay exact:

- no GPU is charged twice: the assignments on the API server's bound pods never put more than 1000 milli on a GPU;
- none is leaked: the cluster is filled to exactly its capacity, so a GPU the scheduler wrongly believed taken would
  leave a pod pending for ever; freed GPUs are used again at once;
- a pod beyond capacity waits (Unschedulable) and is not bound.

Skipped where ../shared/k8s/control-plane.sh (or CORRAL_K8S_CONTROL_PLANE) or its tools are absent.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from benchmarks._k8s_plane import RUN_LABEL, SchedulerProcess, Writer, labelled
from benchmarks._k8s_proxy import FailingProxy
from benchmarks.k8s_fidelity import unschedulable
from corral.k8s.convert import parse_assignment
from tests.k8s.plane import Plane, gpu_node, pod

NODES = 6
GPUS = 4  # 24 GPUs


@dataclass
class Setup:
    plane: Plane
    writer: Writer
    proxy: FailingProxy
    scheduler: SchedulerProcess


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    where = tmp_path_factory.mktemp("bindfail-plane")
    plane = Plane.find(where)
    if plane is None:
        pytest.skip("no control plane here (../shared/k8s/control-plane.sh, openssl, curl, xz)")
    scheduler: SchedulerProcess | None = None
    try:
        writer = Writer(plane.up())
        writer.create_nodes(gpu_node(f"node-{i}", GPUS) for i in range(NODES))
        with FailingProxy(plane.kubeconfig, every=3) as proxy:
            scheduler = SchedulerProcess(proxy.kubeconfig(where / "proxy-kubeconfig"), where / "scheduler.log",
                                         "--policy", "binpack")  # fmt: skip
            scheduler.start(wait=True)
            yield Setup(plane, writer, proxy, scheduler)
    finally:
        if scheduler is not None:
            scheduler.stop()
        plane.down()


def wait_for(what: str, check: Callable[[], bool], setup: Setup, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        proc = setup.scheduler.proc
        assert proc is not None and proc.poll() is None, f"the scheduler exited: {setup.scheduler.log_tail()}"
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; scheduler log: {setup.scheduler.log_tail()}")


def gpu_pod(name: str, whole: bool) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1"} if whole else {"corral.dev/gpu-milli": "500"}
    return labelled(pod(name, limits, cpu="100m", memory="128Mi", scheduler="corral"), "bindfail")


def books(setup: Setup) -> tuple[dict[tuple[str, int], int], list[dict[str, Any]], list[dict[str, Any]]]:
    """(GPU milli per (node, GPU) from the bound pods' assignments, bound pods, pending pods), from the API server;
    asserts that every bound GPU pod carries an assignment of its own node."""
    per_gpu: dict[tuple[str, int], int] = defaultdict(int)
    bound, pending = [], []
    for p in setup.writer.pods(label=f"{RUN_LABEL}=bindfail"):
        node = p["spec"].get("nodeName")
        if not node:
            pending.append(p)
            continue
        bound.append(p)
        a = parse_assignment(p["metadata"].get("annotations"))
        assert a is not None and a.node == node, f"pod {p['metadata']['name']} on {node} without its assignment: {a}"
        for s in a.slots:
            per_gpu[(node, s.index)] += s.milli
    over = {k: v for k, v in per_gpu.items() if v > 1000}
    assert not over, f"GPUs charged twice: {over}"
    return per_gpu, bound, pending


def all_bound(setup: Setup, count: int) -> Callable[[], bool]:
    def check() -> bool:
        _, bound, pending = books(setup)
        return len(bound) == count and not pending

    return check


def test_books_stay_exact_while_a_third_of_the_bindings_fail(setup: Setup) -> None:
    w = setup.writer
    # 16 whole GPUs, then 16 shares of 500 milli: exactly the 24 GPUs (the shares can only pair up on the 8 left).
    w.create_pods(gpu_pod(f"whole-{i}", True) for i in range(16))
    wait_for("16 whole-GPU pods bound", all_bound(setup, 16), setup)
    w.create_pods(gpu_pod(f"share-{i}", False) for i in range(16))
    wait_for("the 16 shares bound too: every GPU full", all_bound(setup, 32), setup)
    per_gpu, _, _ = books(setup)
    assert len(per_gpu) == NODES * GPUS and set(per_gpu.values()) == {1000}
    assert {"refuse", "lose", "drop"} <= set(setup.proxy.counts), setup.proxy.counts

    # Beyond capacity: it waits, and nothing is double-booked for it.
    w.create_pods([gpu_pod("extra-0", True)])
    wait_for("extra-0 marked Unschedulable", lambda: any(unschedulable(p) for p in books(setup)[2]), setup)

    # Free three GPUs: two whole ones, and one that two shares held. extra-0 and two new pods take exactly them.
    _, bound, _ = books(setup)
    holders: dict[tuple[str, int], list[str]] = defaultdict(list)
    for p in bound:
        a = parse_assignment(p["metadata"]["annotations"])
        assert a is not None
        for s in a.slots:
            holders[(a.node, s.index)].append(p["metadata"]["name"])
    shared = next(names for names in holders.values() if len(names) == 2)
    gone = [n for n in (p["metadata"]["name"] for p in bound) if n.startswith("whole-")][:2] + shared
    for name in gone:
        w.request("DELETE", f"/api/v1/namespaces/default/pods/{name}?gracePeriodSeconds=0")
    w.create_pods(gpu_pod(f"extra-{i}", True) for i in (1, 2))
    wait_for("extra-0..2 bound on the three freed GPUs", all_bound(setup, 32 - 4 + 3), setup)
    per_gpu, _, _ = books(setup)
    assert len(per_gpu) == NODES * GPUS and set(per_gpu.values()) == {1000}

    # Full again: one more waits.
    w.create_pods([gpu_pod("extra-3", True)])
    wait_for("extra-3 marked Unschedulable", lambda: any(unschedulable(p) for p in books(setup)[2]), setup)
    _, bound, pending = books(setup)
    assert [p["metadata"]["name"] for p in pending] == ["extra-3"] and len(bound) == 31
