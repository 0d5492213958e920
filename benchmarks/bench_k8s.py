"""The Kubernetes extender over HTTP: latency of filter + prioritize on 5,000 nodes, and pods/s through
filter + prioritize + bind.

    .venv/bin/python -m benchmarks.bench_k8s [--nodes 5000] [--latency-pods 300] [--bind-pods 1000]
        [--write BENCHMARKS.md]

1. A child process serves the extender (uvicorn, the real app) over a fake API server (`corral.k8s.fake`) holding
   `--nodes` nodes (seeded: 60 % with 8 GPUs of A100-80GB or H100-80GB, 40 % without GPUs) and the pods to come.
   The client (this process, one keep-alive HTTP connection) posts what kube-scheduler would: ExtenderArgs with the
   full Pod and all `NodeNames` (nodeCacheCapable).
2. Latency: for `--latency-pods` pods of a seeded mix of resource styles, filter then prioritize (over the nodes the
   filter passed), timed together per pod with `time.perf_counter` (nothing is bound, so the cluster is the same
   for every pod; each pod is new, so the extender decides afresh).
3. Throughput: `--bind-pods` pods one after another through filter, prioritize, bind (to the best score); pods/s
   = pods / wall time of the whole sequence.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
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


def serve(port: int, nodes: int, pods: int, seed: int) -> None:
    """The child process: the extender app over a fake API server that already holds the nodes and pods."""
    import uvicorn

    from corral.k8s.extender import Extender, create_app
    from corral.k8s.fake import FakeKubeApi
    from corral.k8s.state import ClusterState, Informer

    api = FakeKubeApi()
    for n in make_nodes(nodes, seed):
        api.put_node(n)
    for p in make_pods(pods, seed + 1, "lat-") + make_pods(pods, seed + 2, "bind-"):
        api.put_pod(p)
    state = ClusterState()
    Informer(api, state).sync_once()
    gc.collect()
    gc.freeze()  # as `corral k8s extender` does after its first sync: long-lived objects leave the GC's scans
    uvicorn.run(create_app(Extender(state, api)), host="127.0.0.1", port=port, log_level="warning")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(client: httpx.Client, verb: str, body: Any) -> Any:
    # orjson on the client too: kube-scheduler's own (Go) encoding costs little, so the client should not dominate
    r = client.post(f"/{verb}", content=orjson.dumps(body), headers={"Content-Type": "application/json"})
    r.raise_for_status()
    return orjson.loads(r.content)


def run(nodes: int, latency_pods: int, bind_pods: int, seed: int) -> dict[str, Any]:
    port = free_port()
    pods_needed = max(latency_pods, bind_pods)
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_k8s", "--serve", str(port), "--nodes", str(nodes),
         "--pods", str(pods_needed), "--seed", str(seed)],
    )  # fmt: skip
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        deadline = time.monotonic() + 300
        while True:
            try:
                if client.get("/healthz").json().get("ok"):
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or child.poll() is not None:
                raise SystemExit("the extender did not come up")
            time.sleep(0.2)
        names = [n["metadata"]["name"] for n in make_nodes(nodes, seed)]
        for p in make_pods(5, seed + 9, "warm-"):  # warm the code paths (not timed)
            f = post(client, "filter", {"Pod": p, "Nodes": None, "NodeNames": names})
            post(client, "prioritize", {"Pod": p, "Nodes": None, "NodeNames": f["NodeNames"]})
        times = []
        for p in make_pods(pods_needed, seed + 1, "lat-")[:latency_pods]:
            t0 = time.perf_counter()
            f = post(client, "filter", {"Pod": p, "Nodes": None, "NodeNames": names})
            post(client, "prioritize", {"Pod": p, "Nodes": None, "NodeNames": f["NodeNames"]})
            times.append((time.perf_counter() - t0) * 1000)
        pods = make_pods(pods_needed, seed + 2, "bind-")[:bind_pods]
        bound = 0
        t0 = time.perf_counter()
        for p in pods:
            f = post(client, "filter", {"Pod": p, "Nodes": None, "NodeNames": names})
            if not f["NodeNames"]:
                continue
            scores = post(client, "prioritize", {"Pod": p, "Nodes": None, "NodeNames": f["NodeNames"]})
            best = max(scores, key=lambda h: h["Score"])["Host"]
            m = p["metadata"]
            r = post(client, "bind", {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"],
                                      "Node": best})  # fmt: skip
            if r["Error"]:
                raise SystemExit(f"bind failed: {r['Error']}")
            bound += 1
        wall = time.perf_counter() - t0
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
        "bind_pods": len(pods),
        "bound": bound,
        "pods_per_s": len(pods) / wall,
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
    ap.add_argument("--write", type=Path, default=None, help="append the figures to this markdown file")
    ap.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--pods", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve, args.nodes, args.pods, args.seed)
        return
    res = run(args.nodes, args.latency_pods, args.bind_pods, args.seed)
    print(json.dumps(res, indent=2))
    if args.write:
        shown = argv[: argv.index("--write")] if "--write" in argv else argv
        cmd = " ".join(["python -m benchmarks.bench_k8s", *shown])
        text = (
            f"\n## Kubernetes extender over HTTP ({datetime.date.today().isoformat()})\n\n"
            f"Machine: 2-core dev machine ({machine()}). Command: `{cmd}`. Extender (uvicorn, real app) in a child "
            f"process over a fake API server holding {res['nodes']:,} nodes (60 % with 8 GPUs); the client posts "
            "kube-scheduler's ExtenderArgs (full Pod, all NodeNames) over one keep-alive connection.\n\n"
            f"- filter + prioritize over {res['nodes']:,} nodes: p50 {res['p50_ms']:.1f} ms, "
            f"p99 {res['p99_ms']:.1f} ms, max {res['max_ms']:.1f} ms over {res['latency_pods']} pods "
            "(target: p99 at most 20 ms)\n"
            f"- filter + prioritize + bind in sequence: {res['pods_per_s']:.0f} pods/s over {res['bind_pods']:,} "
            f"pods ({res['bound']:,} bound) (target: at least 200 pods/s)\n"
        )
        with args.write.open("a") as fh:
            fh.write(text)


if __name__ == "__main__":
    main(sys.argv[1:])
