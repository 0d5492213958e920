"""kube-scheduler alone against kube-scheduler with corral, on the same REAL control plane in one run.

    PYTHONPATH=. CORRAL_K8S_CONTROL_PLANE=/path/to/control-plane.sh \\
        .venv/bin/python -m benchmarks.k8s_side_by_side [--nodes 500] [--pods 1000] [--gpus 8] [--runs 3]
        [--only plain|corral] [--profile extender.prof] [--percentage N] [--extender-arg=--no-pick]

1. One plane (etcd + kube-apiserver + kube-scheduler v1.34.2, ../shared/k8s/control-plane.sh) holds `--nodes` nodes
   with `--gpus` GPUs each, as corral's device plugin and kubelet publish them (tests/k8s/plane.py).
2. Plain: kube-scheduler with one profile and no extender (the chart's profile without `extenders` and
   `pluginConfig`), counting `nvidia.com/gpu` itself. `--pods` pods asking `nvidia.com/gpu: 1` are created first
   (the scheduler stopped), then the scheduler starts; pods/s = pods / time from the first bind seen to the last (a
   watch on the pods records when each one gets its node).
3. The pods are deleted; the same again with the chart's scheduler configuration and `corral k8s extender` (its own
   process, as the chart runs it, started before the first run: its pod watch runs during the plain runs too), with
   pods for the chart's `corral-scheduler` profile.
4. `--runs` repeats 2-3 alternately (plain, corral, plain, corral, ...) on the same plane and the same extender
   process, so that a change in the machine's load shows in both columns; every run is printed with the load average.

Per run it also prints where the CPU went (seconds of CPU of kube-scheduler since its start, kube-apiserver, etcd and
the extender, from /proc, and their idle CPU per second just before), the API server's requests and watch events,
kube-scheduler's own view (its /metrics: the scheduling algorithm's mean per pod, the mean of each extension point)
and the extender's (its /status: calls, wall and CPU time per verb), so that a change shows where it saved.
`--profile` runs the extender under cProfile, every thread by its own CPU time (benchmarks/_profiled.py), written
when it stops. `--percentage` and `--extender-arg` are for trials (percentageOfNodesToScore for corral's profile, one
more argument for the extender, e.g. `--extender-arg=--no-pick`).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

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


IDLE_SECONDS = 2.0


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cpu_seconds(pid: int | None) -> float:
    """utime + stime of a process so far (0 where it is gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def plane_pids(plane: Plane) -> dict[str, int]:
    pids = {}
    for name in ("scheduler", "apiserver", "etcd"):
        f = plane.where / "run" / f"{name}.pid"
        if f.exists():
            pids[name] = int(f.read_text())
    return pids


_SAMPLE = re.compile(r"^(\w+)(?:\{([^}]*)\})? (\S+)$")


def _metrics_text(plane: Plane, port_offset: int) -> str:
    token = yaml.safe_load(Path(plane.kubeconfig).read_text())["users"][0]["user"]["token"]
    port = int(plane.env["CP_PORT_BASE"]) + port_offset
    return httpx.get(f"https://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"},
                     verify=False, timeout=10).text  # fmt: skip


def apiserver_requests(plane: Plane) -> dict[str, float]:
    """kube-apiserver's requests so far by verb and resource (apiserver_request_total), watches excluded."""
    out: dict[str, float] = {}
    for line in _metrics_text(plane, 43).splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == "apiserver_watch_events_total":
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            key = f"watch events {labels.get('resource') or labels.get('kind')}"
            out[key] = out.get(key, 0.0) + float(m.group(3))
            continue
        if not m or m.group(1) != "apiserver_request_total":
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if labels.get("verb") == "WATCH":
            continue
        key = f"{labels.get('verb')} {labels.get('resource')}" + (
            f"/{labels['subresource']}" if labels.get("subresource") else ""
        )
        out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def scheduler_metrics(plane: Plane) -> dict[str, float]:
    """Means (ms) of kube-scheduler's duration histograms over this scheduler's life: the scheduling algorithm per pod,
    each extension point, and the plugins it timed, from its /metrics."""
    text = _metrics_text(plane, 59)
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        for base in ("scheduler_scheduling_algorithm_duration_seconds",
                     "scheduler_framework_extension_point_duration_seconds",
                     "scheduler_scheduling_attempt_duration_seconds",
                     "scheduler_pod_scheduling_sli_duration_seconds"):  # fmt: skip
            if name in (base + "_sum", base + "_count"):
                point = re.search(r'extension_point="(\w+)"', labels)
                result = re.search(r'result="(\w+)"', labels)
                key = base.removeprefix("scheduler_").removesuffix("_duration_seconds")
                if point:
                    key += ":" + point.group(1)
                if result and not point:
                    key += ":" + result.group(1)
                target = sums if name.endswith("_sum") else counts
                target[key] = target.get(key, 0.0) + float(value)
    return {k: round(1000 * sums[k] / counts[k], 3) for k in sorted(sums) if counts.get(k)}


def extender_verbs(extender: ExtenderProcess | None) -> dict[str, Any]:
    """The extender's time per verb so far (its /status)."""
    if extender is None:
        return {}
    verbs: dict[str, Any] = httpx.get(f"{extender.url}/status", timeout=10).json().get("verbs", {})
    return verbs


def run_one(plane: Plane, core: Any, config: Path, scheduler: str, pods: int, limits: dict[str, str],
            extender: ExtenderProcess | None = None) -> dict[str, Any]:  # fmt: skip
    plane.stop_scheduler()
    for i in range(pods):
        core.create_namespaced_pod("default", pod(f"{scheduler}-{i}", limits, cpu="100m", memory="128Mi",
                                                  scheduler=scheduler))  # fmt: skip
    clock = BindClock(core, pods)
    pids: dict[str, int | None] = {**plane_pids(plane)}
    pids["extender"] = extender.proc.pid if extender is not None and extender.proc is not None else None
    # What the plane and the extender spend doing nothing (leases, the watches' bookmarks): the longer side of the
    # comparison runs longer, and this says how much of its CPU is just that.
    idle0 = {k: cpu_seconds(v) for k, v in pids.items()}
    time.sleep(IDLE_SECONDS)
    cpu0 = {k: cpu_seconds(v) for k, v in pids.items()}
    idle = {k: round((cpu0[k] - idle0[k]) / IDLE_SECONDS, 3) for k, v in pids.items() if v is not None}
    requests0 = apiserver_requests(plane)
    verbs0 = extender_verbs(extender)
    before = load()
    t0 = time.monotonic()
    plane.scheduler(config)  # its CPU counts from its start (its first list of nodes and pods included)
    pids["scheduler"] = plane_pids(plane)["scheduler"]
    cpu0["scheduler"] = 0.0
    ok = clock.wait(600)
    wall = time.monotonic() - t0
    requests = {k: int(n - requests0.get(k, 0)) for k, n in apiserver_requests(plane).items()}
    requests = {k: n for k, n in sorted(requests.items()) if n}
    cpu = {k: round(cpu_seconds(v) - cpu0[k], 2) for k, v in pids.items() if v is not None}
    rate, span = clock.rate()
    verbs = {}
    for verb, t in extender_verbs(extender).items():
        n = t["calls"] - verbs0.get(verb, {}).get("calls", 0)
        if n:
            v_wall = t["wall_s"] - verbs0.get(verb, {}).get("wall_s", 0.0)
            v_cpu = t["cpu_s"] - verbs0.get(verb, {}).get("cpu_s", 0.0)
            verbs[verb] = {"calls": n, "wall_ms": round(1000 * v_wall / n, 3), "cpu_ms": round(1000 * v_cpu / n, 3)}
    return {"scheduler": scheduler, "bound": len(clock.bound), "complete": ok, "pods_per_s": round(rate, 1),
            "span_s": round(span, 3), "load_before": before, "load_after": load(),
            "cpu_s_while_scheduling": cpu, "idle_cpu_per_s": idle, "wall_s_from_start": round(wall, 2),
            "apiserver_requests": requests,
            "extender_verbs": verbs,
            "metrics_ms": scheduler_metrics(plane)}  # fmt: skip


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
    ap.add_argument("--runs", type=int, default=1, help="pairs of runs, alternately plain and corral")
    ap.add_argument("--only", choices=("plain", "corral"), help="run one side only")
    ap.add_argument("--profile", type=Path, help="run the extender under cProfile, written here when it stops")
    ap.add_argument("--percentage", type=int, help="percentageOfNodesToScore for corral's profile (a trial)")
    ap.add_argument("--extender-arg", action="append", default=[], help="one more argument for the extender")
    args = ap.parse_args()
    limits = {"nvidia.com/gpu": "1"}
    with tempfile.TemporaryDirectory(prefix="corral-k8s-bench-") as tmp:
        where = Path(tmp)
        plane = Plane.find(where / "plane")
        if plane is None:
            raise SystemExit("no control plane: set CORRAL_K8S_CONTROL_PLANE to control-plane.sh")
        extender: ExtenderProcess | None = None
        results: list[dict[str, Any]] = []
        try:
            kubeconfig = plane.up()
            core = RealKubeApi(kubeconfig=kubeconfig).core
            t0 = time.monotonic()
            for i in range(args.nodes):
                core.create_node(gpu_node(f"node-{i:04d}", args.gpus), _preload_content=False)
            print(f"{args.nodes} nodes created in {time.monotonic() - t0:.1f} s")
            plain_cfg = chart_scheduler_config(None)
            plain_cfg["profiles"][0]["schedulerName"] = "plain"
            plain_path = write_config(where / "plain.yaml", plain_cfg)
            if args.only != "plain":
                module, env = "corral.cli.main", {}
                if args.profile:
                    module, env = "benchmarks._profiled", {"CORRAL_PROFILE": str(args.profile.resolve())}
                extender = ExtenderProcess(kubeconfig, where / "extender.log", None, "--policy", "binpack",
                                           "--behavior", "preferential", *args.extender_arg, module=module,
                                           env=env)  # fmt: skip
                extender.start()
            for run in range(1, args.runs + 1):
                for side in ("plain", "corral"):
                    if args.only and side != args.only:
                        continue
                    if side == "plain":
                        r = run_one(plane, core, plain_path, "plain", args.pods, limits)
                    else:
                        assert extender is not None
                        corral_cfg = chart_scheduler_config(extender.url)
                        if args.percentage is not None:
                            corral_cfg["profiles"][0]["percentageOfNodesToScore"] = args.percentage
                        cfg = write_config(where / "corral.yaml", corral_cfg)
                        r = run_one(plane, core, cfg, "corral-scheduler", args.pods, limits, extender)
                    r["run"] = run
                    results.append(r)
                    print(orjson.dumps(r).decode())
                    delete_pods(core)
            plain_rates = [r["pods_per_s"] for r in results if r["scheduler"] == "plain"]
            corral_rates = [r["pods_per_s"] for r in results if r["scheduler"] != "plain"]
            print("run | plain pods/s | corral pods/s | corral / plain | load (1 min) before plain, corral")
            for run in range(1, args.runs + 1):
                p = [r for r in results if r["run"] == run and r["scheduler"] == "plain"]
                c = [r for r in results if r["run"] == run and r["scheduler"] != "plain"]
                ratio = f"{c[0]['pods_per_s'] / p[0]['pods_per_s']:.0%}" if p and c else "-"
                print(
                    f"{run} | {p[0]['pods_per_s'] if p else '-'} | {c[0]['pods_per_s'] if c else '-'} | {ratio} | "
                    f"{p[0]['load_before'].split()[0] if p else '-'}, {c[0]['load_before'].split()[0] if c else '-'}"
                )
            if plain_rates and corral_rates:
                print(
                    f"median: plain {statistics.median(plain_rates):.0f} pods/s, corral "
                    f"{statistics.median(corral_rates):.0f} pods/s, corral / plain = "
                    f"{statistics.median(corral_rates) / statistics.median(plain_rates):.0%}"
                )
        finally:
            if extender is not None:
                extender.stop()
            plane.down()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
