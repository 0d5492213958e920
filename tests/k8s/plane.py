"""A real control plane (etcd + kube-apiserver + kube-scheduler v1.34.2 from ../shared/k8s/control-plane.sh) for the
end-to-end tests, and what they put in it: nodes as corral's device plugin and kubelet would publish them, and
kube-scheduler's configuration taken from the chart.

The script is found as in test_control_plane (CORRAL_K8S_CONTROL_PLANE, else ../shared/k8s beside the checkout);
`Plane.find()` is None where it or its tools are absent, and the tests skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import yaml

from corral.k8s.convert import ANN_NODE_GPUS, LABEL_GPU_COUNT, LABEL_GPU_MODEL, node_gpus_annotation
from corral.k8s.deviceplugin import IDS_PER_GPU
from corral.model.resources import GpuDevice
from tests.k8s.chart import documents, plain_manifests
from tests.k8s.test_control_plane import control_plane_script, free_base, plane_down

SCHEDULER = "corral-scheduler"


class Plane:
    def __init__(self, script: Path, where: Path) -> None:
        self.script = script
        self.where = where
        self.env = {**os.environ, "CP_PORT_BASE": str(free_base())}
        self.kubeconfig = ""

    @classmethod
    def find(cls, where: Path) -> Plane | None:
        script = control_plane_script()
        return None if script is None else cls(script, where)

    def _run(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run([str(self.script), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
        assert done.returncode == 0, f"control-plane.sh {args[0]}: {done.stderr[-3000:]}"
        return done.stdout

    def up(self, scheduler_config: Path | None = None) -> str:
        args = ["up", str(self.where)] + ([str(scheduler_config)] if scheduler_config else [])
        self.kubeconfig = self._run(*args).strip().splitlines()[-1]
        return self.kubeconfig

    def scheduler(self, config: Path) -> None:
        self._run("scheduler", str(self.where), str(config))

    def stop_scheduler(self) -> None:
        self._run("stop-scheduler", str(self.where))

    def down(self) -> None:
        plane_down(self.script, self.where, self.env)

    def scheduler_attempts(self) -> float:
        """kube-scheduler's scheduling attempts so far, every result (scheduler_schedule_attempts_total from its
        /metrics, read with the plane's admin token): what a retry storm drives up. FailedScheduling events are no
        count of it, as repeats are folded into an event series whose count is written back only now and then."""
        token = yaml.safe_load(Path(self.kubeconfig).read_text())["users"][0]["user"]["token"]
        port = int(self.env["CP_PORT_BASE"]) + 59
        text = httpx.get(f"https://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"},
                         verify=False, timeout=10).text  # fmt: skip
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("scheduler_schedule_attempts_total{"))  # fmt: skip

    def scheduler_log(self) -> str:
        log = self.where / "logs" / "scheduler.log"
        return log.read_text(errors="replace") if log.exists() else ""


def chart_scheduler_config(extender_url: str | None, extender_timeout: str = "") -> dict[str, Any]:
    """kube-scheduler's configuration as the chart ships it (the ConfigMap in corral.yaml), pointed at an extender
    started by the test; leader election off (one scheduler) and the kubeconfig placeholder control-plane.sh fills.
    Without `extender_url`: the same profile with no extender (and so nothing ignored: the plain baseline)."""
    [cm] = [d for d in documents(plain_manifests()) if d["kind"] == "ConfigMap"]
    config: dict[str, Any] = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    config["leaderElection"] = {"leaderElect": False}
    config["clientConnection"] = {"kubeconfig": "@KUBECONFIG@", "qps": 500, "burst": 1000}
    if extender_url is None:
        del config["extenders"]
        for profile in config["profiles"]:
            profile.pop("pluginConfig", None)
    else:
        config["extenders"][0]["urlPrefix"] = extender_url
        if extender_timeout:
            config["extenders"][0]["httpTimeout"] = extender_timeout
    return config


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def gpu_node(name: str, gpus: int, model: str = "A100", memory_mib: int = 81920, share_slots: int = 10,
             cpu: str = "64", memory: str = "256Gi", nvidia: bool = True) -> dict[str, Any]:  # fmt: skip
    """A Node as it looks with corral's device plugin on it: the inventory annotation and labels the plugin
    publishes, and the extended resources kubelet reports for the plugin's resources (per GPU: corral.dev/gpu 1,
    corral.dev/gpu-milli 1000, elasticgpu.io/gpu-core 100, keti.com/mpsgpu `share_slots`; nvidia.com/gpu 1 from
    NVIDIA's plugin or corral's `--resource nvidia.com/gpu`). Ready, as a kubelet would set it."""
    devices = tuple(GpuDevice(j, model, memory_mib, f"GPU-{name}-{j}") for j in range(gpus))
    per_gpu = {**IDS_PER_GPU, "keti.com/mpsgpu": share_slots}
    if not nvidia:
        per_gpu.pop("nvidia.com/gpu")
    capacity = {"cpu": cpu, "memory": memory, "pods": "110"}
    meta: dict[str, Any] = {"name": name, "labels": {"kubernetes.io/hostname": name}}
    if gpus:
        capacity.update({r: str(n * gpus) for r, n in per_gpu.items()})
        meta["annotations"] = {ANN_NODE_GPUS: node_gpus_annotation(devices)}
        meta["labels"].update({LABEL_GPU_COUNT: str(gpus), LABEL_GPU_MODEL: model})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": meta,
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "ready",
                    "lastHeartbeatTime": "2026-11-26T00:00:00Z",
                    "lastTransitionTime": "2026-11-26T00:00:00Z",
                }
            ],
        },
    }


def pod(name: str, limits: dict[str, str], annotations: dict[str, str] | None = None, priority: str = "",
        cpu: str = "1", memory: str = "1Gi", scheduler: str = SCHEDULER) -> dict[str, Any]:  # fmt: skip
    """A pod for `scheduler`, GPU resources in limits (requests follow them for extended resources)."""
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if limits:
        resources["limits"] = dict(limits)
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "registry.example/none:0", "resources": resources}],
    }
    if priority:
        spec["priorityClassName"] = priority
    meta = {"name": name, "namespace": "default", "annotations": annotations or {}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
