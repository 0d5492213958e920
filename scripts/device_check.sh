#!/usr/bin/env bash
# Real-GPU check of corral's NVML discovery, run on a lent GPU machine (python3 there has numpy, typer, rich,
# PyYAML and nvidia-ml-py). Prints what NVML reported, corral's view of it, and a few placements on it.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/corral-device}
mkdir -p "$OUT"
echo "== nvidia-smi"; nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu --format=csv
nvidia-smi topo -m 2>&1 | head -20
echo "== corral discover"; python3 -m corral.cli.main discover
python3 -m corral.cli.main discover --json > "$OUT/discover.json"; cat "$OUT/discover.json"
echo "== placements on the discovered machine"
python3 - <<'PY'
from corral.gpu.discovery import discover_gpus, local_node
from corral.model.resources import Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig, place, render

node = local_node("gpu-host", discover_gpus())
print(f"node: {node.cpu_milli}m CPU, {node.memory_mib} MiB, GPUs {[(g.index, g.model, g.memory_mib) for g in node.gpus]}")
snap = ClusterSnapshot([node])
for req in (
    Request(cpu_milli=1000, gpu_count=1, gpu_milli=300, id="share-30pct"),
    Request(cpu_milli=1000, gpu_count=1, gpu_memory_mib=10240, id="share-10GiB"),
    Request(cpu_milli=1000, gpu_count=1, gpu_milli=1000, id="whole"),
    Request(cpu_milli=1000, gpu_count=1, gpu_memory_mib=200 * 1024, id="too-big"),
):
    try:
        d = place(snap, req, PlacementConfig())
    except Exception as exc:  # bad input is an error naming the field
        print(f"{req.id}: error {exc}")
        continue
    print(f"{req.id}: {render(d.explanation)}")
    if d.allocation is not None:
        snap.allocate(d.allocation)
PY
echo "== tests/gpu on the real driver"; python3 -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tail -3
