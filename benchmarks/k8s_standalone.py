"""corral's standalone scheduler (`corral k8s scheduler`) against plain kube-scheduler on one REAL plane (issue 24).

    PYTHONPATH=. CORRAL_K8S_CONTROL_PLANE=../shared/k8s/control-plane.sh \\
        python -m benchmarks.k8s_standalone [--what throughput,latency,restart] [--runs 2] [--only plain|corral]
        [--profile scheduler.prof] [--write BENCHMARKS.md]

One plane (etcd 3.5.16, kube-apiserver and kube-scheduler v1.34.2 from ../shared/k8s/control-plane.sh, no kubelets;
nodes of 8 GPUs as corral's device plugin and kubelet publish them, tests/k8s/plane.py). Each side is a scheduler of
its own name: plain kube-scheduler (the chart's profile without the extender, counting `nvidia.com/gpu` itself) and
`corral k8s scheduler --policy binpack` (its own process, as the chart runs it).

throughput  For each (nodes, pods, QPS/burst) of the issue's table: the pods (`nvidia.com/gpu: 1`, 100m CPU, 128Mi)
            are created first (16 writers at once) with no scheduler running, then the side's scheduler is started;
            pods/s = pods / (last bind - the scheduler process's start), so its start-up (imports, first lists) counts.
            A watch on the run's label records each bind. Runs alternate plain, corral, plain, corral, ...; every run
            prints the load average before it and where the CPU went (the scheduler's own, the API server's, etcd's).
            Cases: 2,000 pods on 400 nodes and 5,000 pods on 2,000 nodes at client QPS 5,000 / burst 10,000 (neither
            held by its rate limit), and 2,000 on 400 at the default QPS 50 / burst 100.
latency     The scheduler running and idle, free capacity; `--latency-pods` pods created at 50 pods/s (one every
            20 ms, on schedule); per pod, the time from sending its create to seeing it bound; p50, p99, max.
restart     5,000 nodes and 50,000 pods already bound (created with spec.nodeName and corral's assignment annotation,
            10 per node: 4 of one whole GPU, 4 sharing two GPUs at 500 milli, 2 without GPUs; 2 GPUs of each node
            free), one new pod pending; the scheduler starts: seconds from its process start to that pod's bind,
            and which GPU it got (a GPU already in use would mean the books were not rebuilt).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from benchmarks._k8s_plane import BindWatch, SchedulerProcess, Writer, labelled, plain_config
from benchmarks.k8s_side_by_side import cpu_seconds, load, plane_pids
from corral.k8s.convert import (
    ANN_ASSIGNMENT,
    Assignment,
    GpuSlot,
    assignment_annotations,
    parse_assignment,
)
from tests.k8s.plane import Plane, gpu_node, pod, write_config

GPUS = 8
GPU_MEMORY = 81920
CORRAL = "corral"
PLAIN = "plain"
#: (label, nodes, pods, qps, burst) of the issue's throughput table
CASES = (
    ("2,000 pods / 400 nodes, QPS 5,000 / burst 10,000", 400, 2000, 5000, 10000),
    ("5,000 pods / 2,000 nodes, QPS 5,000 / burst 10,000", 2000, 5000, 5000, 10000),
    ("2,000 pods / 400 nodes, QPS 50 / burst 100", 400, 2000, 50, 100),
)


@dataclass
class Bench:
    plane: Plane
    writer: Writer
    where: Path
    policy: str
    profile: Path | None
    extra: list[str]
    nodes: int = 0
    runs: int = 0
    results: list[dict[str, Any]] = field(default_factory=list)

    def grow(self, nodes: int) -> None:
        """Nodes node-0000.. node-<nodes - 1>: the missing ones created, any beyond deleted."""
        if nodes == self.nodes:
            return
        t = time.monotonic()
        if nodes > self.nodes:
            make = (gpu_node(f"node-{i:04d}", GPUS, memory_mib=GPU_MEMORY) for i in range(self.nodes, nodes))
            self.writer.create_nodes(make)
        else:
            with ThreadPoolExecutor(self.writer.threads) as pool:
                list(pool.map(lambda i: self.writer.request("DELETE", f"/api/v1/nodes/node-{i:04d}"),
                              range(nodes, self.nodes)))  # fmt: skip
        print(f"nodes {self.nodes} -> {nodes} in {time.monotonic() - t:.1f} s", flush=True)
        self.nodes = nodes

    def next_run(self, side: str) -> str:
        self.runs += 1
        return f"{side}-{self.runs}"

    # ---------------------------------------------------------------------------------------------- schedulers
    def start(self, side: str, qps: float, burst: int) -> tuple[float, SchedulerProcess | None]:
        """Start the side's scheduler; (the monotonic time just before its process began, the corral process)."""
        if side == PLAIN:
            cfg = write_config(self.where / f"plain-{qps:g}.yaml", plain_config(PLAIN, qps, burst))
            t0 = time.monotonic()
            self.plane.scheduler(cfg)
            return t0, None
        module, env = "corral.cli.main", {}
        if self.profile is not None:
            module, env = "benchmarks._profiled", {"CORRAL_PROFILE": str(self.profile.resolve())}
        proc = SchedulerProcess(self.plane.kubeconfig, self.where / "scheduler.log", "--policy", self.policy,
                                "--qps", f"{qps:g}", "--burst", str(burst), *self.extra, module=module,
                                env=env)  # fmt: skip
        proc.start()
        return proc.started, proc

    def stop(self, side: str, proc: SchedulerProcess | None) -> None:
        if side == PLAIN:
            self.plane.stop_scheduler()
        elif proc is not None:
            proc.stop()

    def pids(self, proc: SchedulerProcess | None) -> dict[str, int | None]:
        pids: dict[str, int | None] = {k: v for k, v in plane_pids(self.plane).items()}
        if proc is not None:
            pids["scheduler"] = proc.pid
        return pids

    # ---------------------------------------------------------------------------------------------- throughput
    def throughput(self, side: str, label: str, pods: int, qps: float, burst: int) -> dict[str, Any]:
        run = self.next_run(side)
        name = CORRAL if side == CORRAL else PLAIN
        objs = [labelled(pod(f"{run}-{i:05d}", {"nvidia.com/gpu": "1"}, cpu="100m", memory="128Mi",
                             scheduler=name), run) for i in range(pods)]  # fmt: skip
        t = time.monotonic()
        self.writer.create_pods(objs)
        created_s = time.monotonic() - t
        watch = BindWatch(self.writer, run, pods)
        base = {k: cpu_seconds(v) for k, v in plane_pids(self.plane).items()}
        before = load()
        t0, proc = self.start(side, qps, burst)
        ok = watch.wait(900)
        pids = self.pids(proc)
        cpu = {k: round(cpu_seconds(v) - base.get(k, 0.0), 2) for k, v in pids.items() if k != "scheduler"}
        cpu["scheduler"] = round(cpu_seconds(pids.get("scheduler")), 2)
        after = load()
        watch.close()
        self.stop(side, proc)
        times = sorted(watch.bound.values())
        last = times[-1] if times else float("nan")
        r = {
            "case": label, "side": side, "run": run, "bound": len(times), "pods": pods, "complete": ok,
            "pods_per_s": round(len(times) / (last - t0), 1) if times else 0.0,
            "from_start_s": round(last - t0, 2) if times else None,
            "first_bind_s": round(times[0] - t0, 2) if times else None,
            "pods_per_s_first_to_last": round((len(times) - 1) / (last - times[0]), 1) if len(times) > 1 else None,
            "load_before": before, "load_after": after, "cpu_s": cpu, "create_s": round(created_s, 1),
        }  # fmt: skip
        self.writer.delete_pods(label=f"corral.dev/bench-run={run}")
        return r

    # ---------------------------------------------------------------------------------------------- latency
    def latency(self, side: str, pods: int, rate: float) -> dict[str, Any]:
        run = self.next_run(side)
        name = CORRAL if side == CORRAL else PLAIN
        _, proc = self.start(side, 5000, 10000)
        if proc is not None:
            proc.wait_ready()
        watch = BindWatch(self.writer, run, pods)
        sent: dict[str, float] = {}
        before = load()
        path = "/api/v1/namespaces/default/pods"

        def create(i: int) -> None:
            obj = labelled(pod(f"{run}-{i:05d}", {"nvidia.com/gpu": "1"}, cpu="100m", memory="128Mi",
                               scheduler=name), run)  # fmt: skip
            sent[obj["metadata"]["name"]] = time.monotonic()
            self.writer.request("POST", path, obj)

        start = time.monotonic() + 0.2
        with ThreadPoolExecutor(8) as pool:
            for i in range(pods):
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                pool.submit(create, i)
        ok = watch.wait(120)
        watch.close()
        self.stop(side, proc)
        lat = sorted(1000 * (watch.bound[n] - sent[n]) for n in watch.bound if n in sent)
        r = {
            "case": f"latency, {rate:g} pods/s arriving", "side": side, "run": run, "pods": pods, "bound": len(lat),
            "complete": ok, "p50_ms": round(_pct(lat, 50), 1), "p99_ms": round(_pct(lat, 99), 1),
            "max_ms": round(lat[-1], 1) if lat else None, "load_before": before, "load_after": load(),
        }  # fmt: skip
        self.writer.delete_pods(label=f"corral.dev/bench-run={run}")
        return r

    # ---------------------------------------------------------------------------------------------- restart
    def fill_bound(self, nodes: int, per_node: int = 10) -> float:
        """`per_node` pods on each node, bound already, with corral's assignment annotations; returns seconds."""
        t = time.monotonic()

        def objs() -> Any:
            for k in range(nodes):
                node = f"node-{k:04d}"
                for j in range(per_node):
                    yield bound_pod(node, j)

        n = self.writer.create_pods(objs())
        secs = time.monotonic() - t
        print(f"{n} bound pods created in {secs:.1f} s ({n / secs:.0f}/s)", flush=True)
        return secs

    def restart(self, side: str, nodes: int) -> dict[str, Any]:
        run = self.next_run(side)
        name = CORRAL if side == CORRAL else PLAIN
        new = labelled(pod(f"{run}-new", {"nvidia.com/gpu": "1"}, cpu="100m", memory="128Mi", scheduler=name), run)
        self.writer.create_pods([new])
        watch = BindWatch(self.writer, run, 1)
        before = load()
        t0, proc = self.start(side, 5000, 10000)
        ok = watch.wait(300)
        pids = self.pids(proc)
        sched_cpu = round(cpu_seconds(pids.get("scheduler")), 2)
        watch.close()
        self.stop(side, proc)
        got = self.writer.request("GET", f"/api/v1/namespaces/default/pods/{run}-new")
        gpus = []
        a = parse_assignment(got["metadata"].get("annotations"))
        if a is not None:
            gpus = [s.index for s in a.slots]
        r = {
            "case": f"restart: {nodes:,} nodes, {10 * nodes:,} bound pods", "side": side, "run": run, "complete": ok,
            "first_bind_s": round(watch.bound[f"{run}-new"] - t0, 2) if ok else None,
            "node": watch.nodes.get(f"{run}-new"), "gpus": gpus,
            "gpu_already_used": any(g < 6 for g in gpus), "scheduler_cpu_s": sched_cpu,
            "load_before": before, "load_after": load(),
        }  # fmt: skip
        self.writer.request("DELETE", f"/api/v1/namespaces/default/pods/{run}-new?gracePeriodSeconds=0")
        return r


def bound_pod(node: str, j: int) -> dict[str, Any]:
    """Pod j (0..9) of `node`, bound there: 0-3 one whole GPU each (GPUs 0-3), 4-7 500 milli (two on GPU 4, two on
    GPU 5), 8-9 no GPU; GPUs 6 and 7 stay free."""
    uuid = f"GPU-{node}-"
    if j < 4:
        limits, slot, style = {"nvidia.com/gpu": "1"}, GpuSlot(j, f"{uuid}{j}", 1000, GPU_MEMORY), "nvidia"
    elif j < 8:
        g = 4 + (j - 4) // 2
        limits, slot, style = {"corral.dev/gpu-milli": "500"}, GpuSlot(g, f"{uuid}{g}", 500, 0), "corral"
    else:
        limits, slot, style = {}, None, ""
    ann = assignment_annotations(Assignment(node, {"main": (slot,)}), style) if slot is not None else {}
    obj = pod(f"b-{node}-{j}", limits, annotations=ann, cpu="1", memory="2Gi", scheduler=CORRAL)
    obj["spec"]["nodeName"] = node
    assert slot is None or ANN_ASSIGNMENT in obj["metadata"]["annotations"]
    return obj


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    k = min(len(values) - 1, max(0, round(p / 100 * len(values) + 0.5) - 1))
    return values[k]


def machine() -> str:
    from benchmarks.bench_engine import cpu_name, memory_gib

    return f"{cpu_name()}, {os.cpu_count()} logical CPUs, {memory_gib()}; Python {platform.python_version()}"


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| what | run | side | load (1 min) before | result | scheduler CPU s | apiserver CPU s |",
             "|---|---|---|---:|---|---:|---:|"]  # fmt: skip
    for r in results:
        if "pods_per_s" in r:
            res = f"{r['pods_per_s']} pods/s ({r['bound']}/{r['pods']} in {r['from_start_s']} s from start)"
        elif "p99_ms" in r:
            res = f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, max {r['max_ms']} ms ({r['bound']}/{r['pods']})"
        else:
            res = f"first new bind {r['first_bind_s']} s after start (GPU {r['gpus']})"
        cpu = r.get("cpu_s", {})
        sched = cpu.get("scheduler", r.get("scheduler_cpu_s", "-"))
        lines.append(f"| {r['case']} | {r['run']} | {r['side']} | {r['load_before'].split()[0]} | {res} | "
                     f"{sched} | {cpu.get('apiserver', '-')} |")  # fmt: skip
    summary = []
    for label, *_ in CASES:
        p = [r["pods_per_s"] for r in results if r["case"] == label and r["side"] == PLAIN]
        c = [r["pods_per_s"] for r in results if r["case"] == label and r["side"] == CORRAL]
        if p and c:
            summary.append(f"- {label}: median plain {statistics.median(p):.0f}, corral {statistics.median(c):.0f} "
                           f"pods/s: corral / plain = {statistics.median(c) / statistics.median(p):.2f}x")  # fmt: skip
    return "\n".join([*lines, "", *summary]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--what", default="throughput,latency,restart")
    ap.add_argument("--runs", type=int, default=2, help="runs per side and case, alternately plain and corral")
    ap.add_argument("--cases", default="0,2,1", help="which throughput cases (0: 2,000/400, 1: 5,000/2,000, 2: QPS 50)")
    ap.add_argument("--only", choices=(PLAIN, CORRAL))
    ap.add_argument("--policy", default="binpack")
    ap.add_argument("--latency-pods", type=int, default=1000)
    ap.add_argument("--restart-nodes", type=int, default=5000, help="restart: nodes, 10 bound pods each")
    ap.add_argument("--profile", type=Path, help="run the corral scheduler under cProfile (benchmarks/_profiled.py)")
    ap.add_argument("--scheduler-arg", action="append", default=[], help="one more argument for corral's scheduler")
    ap.add_argument("--json", type=Path, help="append every run's result here, one JSON object a line")
    ap.add_argument("--write", type=Path, help="append the table to this file (BENCHMARKS.md)")
    args = ap.parse_args()
    what = set(args.what.split(","))
    sides = [s for s in (PLAIN, CORRAL) if args.only in (None, s)]
    with tempfile.TemporaryDirectory(prefix="corral-k8s-standalone-") as tmp:
        where = Path(tmp)
        plane = Plane.find(where / "plane")
        if plane is None:
            raise SystemExit("no control plane: set CORRAL_K8S_CONTROL_PLANE to control-plane.sh")
        try:
            kubeconfig = plane.up()
            bench = Bench(plane, Writer(kubeconfig), where, args.policy, args.profile, args.scheduler_arg)
            started = datetime.datetime.now(datetime.UTC)

            def record(r: dict[str, Any]) -> None:
                r["utc"] = datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S")
                bench.results.append(r)
                print(orjson.dumps(r).decode(), flush=True)
                if args.json:
                    with args.json.open("ab") as fh:
                        fh.write(orjson.dumps(r) + b"\n")

            if "throughput" in what:
                for c in (int(x) for x in args.cases.split(",")):
                    label, nodes, pods, qps, burst = CASES[c]
                    bench.grow(nodes)
                    for _ in range(args.runs):
                        for side in sides:
                            record(bench.throughput(side, label, pods, qps, burst))
            if "latency" in what:
                bench.grow(400)
                for side in sides:
                    record(bench.latency(side, args.latency_pods, 50.0))
            if "restart" in what:
                bench.grow(args.restart_nodes)
                # the nodes of the throughput cases hold nothing now; every node gets its 10 bound pods
                bench.fill_bound(args.restart_nodes)
                for side in sides:
                    record(bench.restart(side, args.restart_nodes))
            text = f"Run {started:%Y-%m-%d %H:%M} UTC on {machine()}.\n\n" + table(bench.results)
            print(text)
            if args.write:
                with args.write.open("a") as fh:
                    fh.write(text)
        finally:
            plane.down()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
