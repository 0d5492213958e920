"""kube-scheduler alone against kube-scheduler with corral, on the same REAL control plane in one run.

    PYTHONPATH=. CORRAL_K8S_CONTROL_PLANE=/path/to/control-plane.sh \\
        .venv/bin/python -m benchmarks.k8s_side_by_side [--nodes 500] [--pods 1000] [--gpus 8]

1. One plane (etcd + kube-apiserver + kube-scheduler v1.34.2, ../shared/k8s/control-plane.sh) holds `--nodes` nodes
   with `--gpus` GPUs each, as corral's device plugin and kubelet publish them (tests/k8s/plane.py).
2. Plain: kube-scheduler with one profile and no extender, counting `nvidia.com/gpu` itself. `--pods` pods asking
   `nvidia.com/gpu: 1` are created first (the scheduler stopped), then the scheduler starts; pods/s = pods / time
   from the first bind seen to the last (a watch on the pods records when each one gets its node).
3. The pods are deleted; the same again with the chart's scheduler configuration and `corral k8s extender` (its own
   process, as the chart runs it), with pods for the chart's `corral-scheduler` profile.

Both runs see the same plane, the same machine and, as far as it goes, the same load (printed before each run).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from corral.k8s.client import RealKubeApi
from tests.k8s.extender_proc import ExtenderProcess
from tests.k8s.plane import Plane, chart_scheduler_config, gpu_node, pod, write_config


class BindClock:
    """Watches the pods of a namespace and records when each one is first seen with a node."""

    def __init__(self, core: Any, expect: int) -> None:
        self.core = core
        self.expect = expect
        self.bound: dict[str, float] = {}
        self.done = threading.Event()
        self._stop = False
        listed = core.list_namespaced_pod("default", _preload_content=False)
        self.rv = orjson.loads(listed.data)["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop and not self.done.is_set():
            resp = self.core.list_namespaced_pod("default", watch=True, resource_version=self.rv,
                                                 timeout_seconds=60, _preload_content=False)  # fmt: skip
            buf = b""
            for chunk in resp.stream(65536):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not line:
                        continue
                    ev = orjson.loads(line)
                    obj = ev["object"]
                    self.rv = obj["metadata"].get("resourceVersion", self.rv)
                    if ev["type"] in ("ADDED", "MODIFIED") and obj["spec"].get("nodeName"):
                        self.bound.setdefault(obj["metadata"]["name"], time.monotonic())
                        if len(self.bound) >= self.expect:
                            self.done.set()
                            resp.close()
                            return

    def wait(self, timeout: float) -> bool:
        return self.done.wait(timeout)

    def rate(self) -> tuple[float, float]:
        """(pods/s from the first bind to the last, seconds)"""
        times = sorted(self.bound.values())
        span = times[-1] - times[0] if len(times) > 1 else float("nan")
        return (len(times) - 1) / span, span


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run_one(plane: Plane, core: Any, config: Path, scheduler: str, pods: int, limits: dict[str, str]) -> dict[str, Any]:
    plane.stop_scheduler()
    for i in range(pods):
        core.create_namespaced_pod("default", pod(f"{scheduler}-{i}", limits, cpu="100m", memory="128Mi",
                                                  scheduler=scheduler))  # fmt: skip
    clock = BindClock(core, pods)
    before = load()
    plane.scheduler(config)
    ok = clock.wait(600)
    rate, span = clock.rate()
    return {"scheduler": scheduler, "bound": len(clock.bound), "complete": ok, "pods_per_s": rate, "span_s": span,
            "load_before": before, "load_after": load()}  # fmt: skip


def delete_pods(core: Any) -> None:
    core.delete_collection_namespaced_pod("default", grace_period_seconds=0)
    deadline = time.monotonic() + 120
    while core.list_namespaced_pod("default", limit=1).items and time.monotonic() < deadline:
        time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-k8s-bench-") as tmp:
        where = Path(tmp)
        plane = Plane.find(where / "plane")
        if plane is None:
            raise SystemExit("no control plane: set CORRAL_K8S_CONTROL_PLANE to control-plane.sh")
        extender: ExtenderProcess | None = None
        try:
            kubeconfig = plane.up()
            core = RealKubeApi(kubeconfig=kubeconfig).core
            t0 = time.monotonic()
            for i in range(args.nodes):
                core.create_node(gpu_node(f"node-{i:04d}", args.gpus), _preload_content=False)
            print(f"{args.nodes} nodes created in {time.monotonic() - t0:.1f} s")
            plain_cfg = chart_scheduler_config(None)
            plain_cfg["profiles"][0]["schedulerName"] = "plain"
            plain = run_one(plane, core, write_config(where / "plain.yaml", plain_cfg), "plain", args.pods,
                            {"nvidia.com/gpu": "1"})  # fmt: skip
            print(plain)
            delete_pods(core)
            extender = ExtenderProcess(kubeconfig, where / "extender.log", None, "--policy", "binpack",
                                       "--behavior", "preferential")  # fmt: skip
            extender.start()
            corral = run_one(plane, core, write_config(where / "corral.yaml", chart_scheduler_config(extender.url)),
                             "corral-scheduler", args.pods, {"nvidia.com/gpu": "1"})  # fmt: skip
            print(corral)
            ratio = corral["pods_per_s"] / plain["pods_per_s"]
            print(f"corral / plain = {ratio:.0%}")
        finally:
            if extender is not None:
                extender.stop()
            plane.down()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
