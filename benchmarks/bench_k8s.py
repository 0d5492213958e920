"""The Kubernetes extender over HTTP: latency of filter + prioritize on 5,000 nodes, and pods/s through
filter + prioritize + bind.

    .venv/bin/python -m benchmarks.bench_k8s [--nodes 5000] [--latency-pods 300] [--bind-pods 1000]
        [--write BENCHMARKS.md]

1. A child process serves the extender (uvicorn, the real app) over a fake API server (`corral.k8s.fake`) holding
   `--nodes` nodes (seeded: 60 % with 8 GPUs of A100-80GB or H100-80GB, 40 % without GPUs) and the pods to come.
   The client (this process) posts what kube-scheduler would: ExtenderArgs with the full Pod and all `NodeNames`
   (nodeCacheCapable), over one keep-alive connection as kube-scheduler's Go client keeps one. The client is the
   standard library's `http.client`: it adds little of its own per request (as a Go client would), while a richer
   Python client (httpx) costs about 1 ms per request itself, which would be measuring the client, not the extender.
   It still encodes every request and decodes every answer in full, as kube-scheduler does.
2. Latency: for `--latency-pods` pods of a seeded mix of resource styles, filter then prioritize (over the nodes the
   filter passed), timed together per pod with `time.perf_counter` (nothing is bound, so the cluster is the same
   for every pod; each pod is new, so the extender decides afresh).
3. Throughput: `--bind-pods` pods one after another through filter, prioritize, bind (to the best score); pods/s
   = pods / wall time of the whole sequence. Every bind changes the cluster, so every pod is decided afresh.

Besides wall time, the extender process's own CPU time per pod is reported (from /proc): on a machine shared with
other work, wall time varies with the load; CPU time much less.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import http.client
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import time
from operator import itemgetter
from pathlib import Path
from typing import Any

import orjson

STYLES: list[tuple[dict[str, str], dict[str, str]]] = [
    ({"corral.dev/gpu": "1"}, {}),
    ({"corral.dev/gpu": "2"}, {}),
    ({"corral.dev/gpu-milli": "300"}, {}),
    ({"corral.dev/gpu-memory": "20480"}, {}),
    ({"elasticgpu.io/gpu-core": "50", "elasticgpu.io/gpu-memory": "8192"}, {}),
    ({"nvidia.com/gpu": "1"}, {}),
    ({"keti.com/mpsgpu": "1"}, {"GPUrequest": "4096"}),
    ({}, {}),
]


HEADING = "## Kubernetes extender over HTTP"


def make_pods(count: int, seed: int, prefix: str) -> list[dict[str, Any]]:
    from corral.k8s.fake import pod_object

    rng = random.Random(seed)
    pods = []
    for i in range(count):
        limits, ann = rng.choice(STYLES)
        res = {"limits": dict(limits), "requests": {"cpu": str(rng.choice([1, 2, 4])), "memory": "8Gi"}}
        pods.append(pod_object(f"{prefix}{i}", [{"name": "main", "resources": res}], annotations=dict(ann)))
    return pods


def make_nodes(count: int, seed: int) -> list[dict[str, Any]]:
    from corral.k8s.convert import ANN_NODE_GPUS, node_gpus_annotation
    from corral.k8s.fake import node_object
    from corral.model.resources import GpuDevice

    rng = random.Random(seed)
    nodes = []
    for i in range(count):
        ann = {}
        if rng.random() < 0.6:
            model = rng.choice(["A100", "H100"])
            gpus = tuple(GpuDevice(j, model, 81920, f"GPU-{i:05d}-{j}", numa_node=j // 4) for j in range(8))
            ann = {ANN_NODE_GPUS: node_gpus_annotation(gpus)}
        nodes.append(node_object(f"node-{i:05d}", "96", "768Gi", ann))
    return nodes


def serve(port: int, nodes: int, pods: int, seed: int, policy: str = "binpack", workload: str = "auto") -> None:
    """The child process: the extender app over a fake API server that already holds the nodes and pods."""
    import uvicorn

    from corral.k8s.extender import Extender, create_app
    from corral.k8s.fake import FakeKubeApi
    from corral.k8s.state import ClusterState, Informer
    from corral.placement import PlacementConfig
    from corral.placement.learned import WorkloadLearner

    api = FakeKubeApi()
    for n in make_nodes(nodes, seed):
        api.put_node(n)
    for p in make_pods(pods, seed + 1, "lat-") + make_pods(pods, seed + 2, "bind-"):
        api.put_pod(p)
    state = ClusterState()
    Informer(api, state).sync_once()
    gc.collect()
    gc.freeze()  # as `corral k8s extender` does after its first sync: long-lived objects leave the GC's scans
    learner = WorkloadLearner() if workload == "auto" else None  # as `corral k8s extender --workload auto|default`
    app = create_app(Extender(state, api, PlacementConfig(policy=policy), learner=learner))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Client:
    """One keep-alive HTTP/1.1 connection to the extender, JSON both ways (orjson: cheap, as Go's encoding is)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        payload = None if body is None else orjson.dumps(body)
        self.conn.request(method, path, payload, {"Content-Type": "application/json"})
        r = self.conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise SystemExit(f"{method} {path}: HTTP {r.status}: {data[:300]!r}")
        return orjson.loads(data)

    def post(self, verb: str, body: Any) -> Any:
        return self.call("POST", f"/{verb}", body)

    def wait_ready(self, child: subprocess.Popen[bytes], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            try:
                if self.call("GET", "/healthz").get("ok"):
                    return
            except OSError:
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            if time.monotonic() > deadline or child.poll() is not None:
                raise SystemExit("the extender did not come up")
            time.sleep(0.2)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process `pid` (Linux /proc), None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def per_pod_ms(before: float | None, after: float | None, pods: int) -> float | None:
    return None if before is None or after is None or not pods else (after - before) / pods * 1000


def run(
    nodes: int, latency_pods: int, bind_pods: int, seed: int, policy: str = "binpack", workload: str = "auto"
) -> dict[str, Any]:
    port = free_port()
    pods_needed = max(latency_pods, bind_pods)
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_k8s", "--serve", str(port), "--nodes", str(nodes),
         "--pods", str(pods_needed), "--seed", str(seed), "--policy", policy,
         "--workload", workload],
    )  # fmt: skip
    try:
        client = Client(port)
        client.wait_ready(child, 300)
        names = [n["metadata"]["name"] for n in make_nodes(nodes, seed)]
        latency = make_pods(pods_needed, seed + 1, "lat-")[:latency_pods]
        pods = make_pods(pods_needed, seed + 2, "bind-")[:bind_pods]
        for p in make_pods(5, seed + 9, "warm-"):  # warm the code paths (not timed)
            f = client.post("filter", {"Pod": p, "Nodes": None, "NodeNames": names})
            client.post("prioritize", {"Pod": p, "Nodes": None, "NodeNames": f["NodeNames"]})
        gc.collect()
        gc.freeze()  # the client's own long-lived objects (pods, names) leave the collector's scans
        times = []
        cpu0 = cpu_seconds(child.pid)
        for p in latency:
            t0 = time.perf_counter()
            f = client.post("filter", {"Pod": p, "Nodes": None, "NodeNames": names})
            client.post("prioritize", {"Pod": p, "Nodes": None, "NodeNames": f["NodeNames"]})
            times.append((time.perf_counter() - t0) * 1000)
        cpu1 = cpu_seconds(child.pid)
        bound = 0
        t0 = time.perf_counter()
        for p in pods:
            f = client.post("filter", {"Pod": p, "Nodes": None, "NodeNames": names})
            if not f["NodeNames"]:
                continue
            scores = client.post("prioritize", {"Pod": p, "Nodes": None, "NodeNames": f["NodeNames"]})
            best = max(scores, key=itemgetter("Score"))["Host"]
            m = p["metadata"]
            r = client.post("bind", {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"],
                                     "Node": best})  # fmt: skip
            if r["Error"]:
                raise SystemExit(f"bind failed: {r['Error']}")
            bound += 1
        wall = time.perf_counter() - t0
        cpu2 = cpu_seconds(child.pid)
        learned = client.call("GET", "/status")["workload"]
    finally:
        child.terminate()
        child.wait(timeout=30)
    times.sort()
    return {
        "nodes": nodes,
        "latency_pods": latency_pods,
        "p50_ms": statistics.median(times),
        "p99_ms": times[min(len(times) - 1, round(0.99 * (len(times) - 1)))],
        "max_ms": times[-1],
        "server_cpu_ms_per_pod": per_pod_ms(cpu0, cpu1, latency_pods),
        "bind_pods": len(pods),
        "bound": bound,
        "pods_per_s": len(pods) / wall,
        "bind_server_cpu_ms_per_pod": per_pod_ms(cpu1, cpu2, len(pods)),
        "load_average": os.getloadavg()[0],
        "workload": learned,
    }


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs; Python {platform.python_version()}"


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--latency-pods", type=int, default=300)
    ap.add_argument("--bind-pods", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policy", default="binpack", help="the extender's policy (`corral k8s extender --policy`)")
    ap.add_argument(
        "--workload", default="auto", choices=("auto", "default"), help="the extender's --workload (auto: learned)"
    )
    ap.add_argument(
        "--write", type=Path, default=None, help="write the figures into this markdown file (replacing this section)"
    )
    ap.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--pods", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve, args.nodes, args.pods, args.seed, args.policy, args.workload)
        return
    res = run(args.nodes, args.latency_pods, args.bind_pods, args.seed, args.policy, args.workload)
    print(json.dumps(res, indent=2))
    if args.write:
        shown = argv[: argv.index("--write")] if "--write" in argv else argv
        write_section(args.write, markdown_section(res, shown))


def markdown_section(res: dict[str, Any], argv: list[str]) -> str:
    cmd = " ".join(["python -m benchmarks.bench_k8s", *argv])

    def cpu(key: str) -> str:
        return "n/a" if res[key] is None else f"{res[key]:.2f} ms"

    def verdict(ok: bool, miss: str) -> str:
        return "met" if ok else f"**not met**: {miss}"

    p99 = verdict(res["p99_ms"] <= 20, f"{res['p99_ms'] - 20:.1f} ms over")
    rate = verdict(res["pods_per_s"] >= 200, f"{200 - res['pods_per_s']:.0f} pods/s short")
    return (
        f"{HEADING} ({datetime.date.today().isoformat()})\n\n"
        f"Machine: 2-core dev machine, shared with other work, load average {res['load_average']:.1f} at the end of "
        f"the run ({machine()}). Command: `{cmd}`. The extender (uvicorn, the real app) runs in a child process over "
        f"a fake API server holding {res['nodes']:,} nodes (60 % with 8 GPUs); the client (`http.client`, one "
        "keep-alive connection, orjson) posts kube-scheduler's ExtenderArgs (full Pod, all NodeNames) and decodes "
        "every answer in full.\n\n"
        f"- filter + prioritize over {res['nodes']:,} nodes: p50 {res['p50_ms']:.1f} ms, "
        f"p99 {res['p99_ms']:.1f} ms, max {res['max_ms']:.1f} ms over {res['latency_pods']} pods; extender CPU "
        f"{cpu('server_cpu_ms_per_pod')} per pod. Target p99 at most 20 ms: "
        f"{p99}.\n"
        f"- filter + prioritize + bind in sequence: {res['pods_per_s']:.0f} pods/s over {res['bind_pods']:,} pods "
        f"({res['bound']:,} bound); extender CPU {cpu('bind_server_cpu_ms_per_pod')} per pod. Target at least "
        f"200 pods/s: {rate}.\n"
    )


def write_section(path: Path, section: str) -> None:
    """Replace this benchmark's section of `path` (from its heading to the next `## `), else append it."""
    text = path.read_text() if path.exists() else ""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith(HEADING)), None)
    if start is None:
        path.write_text(text.rstrip("\n") + "\n\n" + section if text else section)
        return
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = "".join(lines[end:])
    path.write_text("".join(lines[:start]) + section + ("\n" + tail if tail else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
