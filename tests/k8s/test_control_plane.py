"""The extender's bind against a REAL kube-apiserver (v1.34.2, with etcd, from ../shared/k8s/control-plane.sh): a
Binding's annotations land on the pod in the same write, a second Binding gets 409 and leaves the first assignment as
it was, and a short seeded random sequence of bind / rebind / delete / finish / restart / relist / concurrent binds,
with the informer's real watch, never over-commits a GPU and ends with the extender counting what is bound.

Skipped where the control plane's script or the tools it needs are absent (set CORRAL_K8S_CONTROL_PLANE to the path
of control-plane.sh when ../shared is not beside the checkout).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.k8s.client import JsonObj, KubeApi, KubeApiError, RealKubeApi
from corral.k8s.convert import ANN_ASSIGNMENT, parse_assignment, pod_request
from corral.k8s.extender import Extender
from corral.k8s.state import ClusterState, Informer
from tests.k8s.conftest import gpu_node
from tests.k8s.sequences import Sequence, counted, truth
from tests.k8s.test_extender import bind_args, kube_pod

ROOT = Path(__file__).resolve().parents[2]


def control_plane_script() -> Path | None:
    given = os.environ.get("CORRAL_K8S_CONTROL_PLANE")
    script = Path(given) if given else ROOT.parent / "shared" / "k8s" / "control-plane.sh"
    if not script.is_file() or not all(shutil.which(t) for t in ("openssl", "curl", "xz")):
        return None
    return script


def free_base() -> int:
    """A CP_PORT_BASE whose ports (+0..+2 etcd, +43 apiserver, +59 scheduler) are free now: below the kernel's
    ephemeral range (32768 and up), where no outgoing connection takes one meanwhile, and, under pytest-xdist, in a
    slice of its own for each worker, so concurrent planes never race for a base."""
    low, high = 20000, 32700
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):
        count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), 1)
        span = (high - low) // count
        low += int(worker[2:]) % count * span
        high = low + span
    rng = random.Random()
    for _ in range(50):
        base = rng.randrange(low, high - 59)
        try:
            for off in (0, 1, 2, 43, 59):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + off))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range for the control plane")


def plane_down(script: Path, where: Path, env: dict[str, str]) -> None:
    """`control-plane.sh down`, after a SIGKILL to what it started: a throwaway plane needs no graceful stop, and
    kube-apiserver's takes seconds of a test worker's time."""
    for pidfile in (where / "run").glob("*.pid"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(pidfile.read_text())
            if str(where).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():  # still the plane's, not a reuse
                os.kill(pid, signal.SIGKILL)
    subprocess.run([str(script), "down", str(where)], env=env, capture_output=True, timeout=60)


class RealBackend:
    """The real API server; events come through the informer's watch threads."""

    def __init__(self, kubeconfig: str) -> None:
        real = RealKubeApi(kubeconfig=kubeconfig)
        self.api: KubeApi = real
        self.core: Any = real.core
        self.informer: Informer | None = None
        self.state = ClusterState()

    def nodes(self) -> list[JsonObj]:
        return self.api.list("nodes")[0]

    def pods(self) -> list[JsonObj]:
        return self.api.list("pods")[0]

    def create_pod(self, pod: JsonObj) -> None:
        body = {k: v for k, v in pod.items() if k != "status"}
        body["metadata"] = {k: v for k, v in pod["metadata"].items() if k != "uid"}  # the API server gives UIDs
        self.core.create_namespaced_pod("default", body)

    def delete_pod(self, name: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        except Exception as exc:  # the client's ApiException: 404 when it is gone already
            if getattr(exc, "status", None) != 404:
                raise

    def finish_pod(self, name: str) -> None:
        try:
            self.core.patch_namespaced_pod_status(name, "default", {"status": {"phase": "Succeeded"}})
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                raise

    def start(self) -> ClusterState:
        if self.informer is not None:
            self.informer.close()
        self.state = ClusterState()
        self.informer = Informer(self.api, self.state, retry_seconds=0.1)
        self.informer.start()
        assert self.informer.wait_synced(30)
        return self.state

    def deliver(self, rng: random.Random | None) -> None:
        if rng is not None:
            return  # the watch delivers on its own time
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and truth(self.pods()) != counted(self.state):
            time.sleep(0.05)

    def relist(self, meanwhile: Callable[[], object] | None = None) -> None:
        since = self.state.epoch()
        pods, _ = self.api.list("pods")
        if meanwhile is not None:
            meanwhile()
        self.state.replace_pods(pods, since)

    def stop(self) -> None:
        if self.informer is not None:
            self.informer.close()


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    script = control_plane_script()
    if script is None:
        pytest.skip("no control plane here (../shared/k8s/control-plane.sh, openssl, curl, xz)")
    where = tmp_path_factory.mktemp("control-plane")
    env = {**os.environ, "CP_PORT_BASE": str(free_base())}
    up = subprocess.run([str(script), "up", str(where)], env=env, capture_output=True, text=True, timeout=120)
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        config = up.stdout.strip().splitlines()[-1]
        api = RealKubeApi(kubeconfig=config)
        for node in (gpu_node("gpu-a", 2), gpu_node("gpu-b", 2), gpu_node("gpu-c", 1, model="T4", memory_mib=46080)):
            api.core.create_node(node)
        yield config
    finally:
        plane_down(script, where, env)


def test_a_bindings_annotations_land_with_it_and_a_second_binding_is_409(kubeconfig: str) -> None:
    api = RealKubeApi(kubeconfig=kubeconfig)
    p = kube_pod("direct", {"corral.dev/gpu": "1"}, {"team": "vision"})
    RealBackend(kubeconfig).create_pod(p)
    uid = api.get_pod("default", "direct")["metadata"]["uid"]
    api.create_binding("default", "direct", uid, "gpu-a", {ANN_ASSIGNMENT: '{"node":"gpu-a"}'})
    pod = api.get_pod("default", "direct")
    assert pod["spec"]["nodeName"] == "gpu-a"
    assert pod["metadata"]["annotations"] == {"team": "vision", ANN_ASSIGNMENT: '{"node":"gpu-a"}'}
    with pytest.raises(KubeApiError) as again:
        api.create_binding("default", "direct", uid, "gpu-b", {ANN_ASSIGNMENT: '{"node":"gpu-b"}'})
    assert again.value.status == 409 and 'already assigned to node "gpu-a"' in str(again.value)
    after = api.get_pod("default", "direct")
    assert after["spec"]["nodeName"] == "gpu-a"
    assert after["metadata"]["annotations"] == pod["metadata"]["annotations"]  # the first assignment, intact
    RealBackend(kubeconfig).delete_pod("direct")


def test_the_extender_refuses_a_rebind_and_keeps_counting_the_gpu(kubeconfig: str) -> None:
    backend = RealBackend(kubeconfig)
    state = backend.start()
    try:
        extender = Extender(state, backend.api)
        pods = [kube_pod(f"whole-{i}", {"corral.dev/gpu": "1"}) for i in range(3)]
        for p in pods:
            backend.create_pod(p)
            p["metadata"]["uid"] = backend.api.get_pod("default", p["metadata"]["name"])["metadata"]["uid"]
        assert extender.bind(bind_args(pods[0], "gpu-a")) == {"Error": ""}
        first = backend.api.get_pod("default", "whole-0")
        again = extender.bind(bind_args(pods[0], "gpu-b"))
        assert again["Error"] == "bind default/whole-0 to gpu-b: the pod is already bound to gpu-a"
        assert backend.api.get_pod("default", "whole-0")["metadata"]["annotations"] == first["metadata"]["annotations"]
        assert extender.bind(bind_args(pods[1], "gpu-a")) == {"Error": ""}
        assert "does not fit on gpu-a" in extender.bind(bind_args(pods[2], "gpu-a"))["Error"]
        on_a = [p for p in backend.pods() if p["spec"].get("nodeName") == "gpu-a"]
        slots = [s.uuid for p in on_a for s in (parse_assignment(p["metadata"]["annotations"]) or _none()).slots]
        assert sorted(slots) == ["GPU-gpu-a-0", "GPU-gpu-a-1"]
    finally:
        for p in pods:
            backend.delete_pod(p["metadata"]["name"])
        backend.stop()


def _none() -> Any:
    raise AssertionError("a bound pod without an assignment")


def test_random_sequences_against_the_real_api_server(kubeconfig: str) -> None:
    backend = RealBackend(kubeconfig)
    try:
        for seed in (1, 2):
            seq = Sequence(backend, seed, prefix="real")
            stats = seq.run(25, compare_every=25)
            assert (stats.over_commits, stats.damaged, stats.mismatches, stats.rebinds_granted) == (0, 0, 0, 0), (
                stats.failures[:5]
            )
            assert stats.bound > 0 and stats.ops["rebind"] > 0
            for p in backend.pods():
                backend.delete_pod(p["metadata"]["name"])
    finally:
        backend.stop()


def test_gpu_memory_counts_survive_the_api_servers_canonical_form(kubeconfig: str) -> None:
    """kube-apiserver stores a count of 30000 as "30k"; kube-scheduler sends that form, and it is still 30000 MiB."""
    backend = RealBackend(kubeconfig)
    p = kube_pod("mem", {"corral.dev/gpu-milli": "400", "corral.dev/gpu-memory": "30000"})
    backend.create_pod(p)
    try:
        stored = backend.api.get_pod("default", "mem")
        assert stored["spec"]["containers"][0]["resources"]["limits"]["corral.dev/gpu-memory"] == "30k"
        request = pod_request(stored).request
        assert (request.gpu_milli, request.gpu_memory_mib) == (400, 30000)
    finally:
        backend.delete_pod("mem")


def test_the_api_server_checks_neither_a_bindings_uid_nor_its_node(kubeconfig: str) -> None:
    """What the fakes copy: kube-apiserver binds the pod of that name whatever UID the Binding names, and to a node
    that does not exist. So the extender checks the UID itself (a pod deleted and created again under the same name
    is another pod) and binds only to nodes it knows."""
    backend = RealBackend(kubeconfig)
    for name in ("other-uid", "no-node"):
        backend.create_pod(kube_pod(name, {}))
    try:
        backend.api.create_binding("default", "other-uid", "6f1f4a52-0000-4000-8000-000000000000", "gpu-a")
        assert backend.api.get_pod("default", "other-uid")["spec"]["nodeName"] == "gpu-a"
        backend.api.create_binding("default", "no-node", "", "no-such-node")
        assert backend.api.get_pod("default", "no-node")["spec"]["nodeName"] == "no-such-node"
    finally:
        for name in ("other-uid", "no-node"):
            backend.delete_pod(name)
