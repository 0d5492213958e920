"""corral's own cluster file (YAML or JSON), so users can describe their machines and replay their own cluster.

    nodes:
      - name: gpu-1
        cpu: 64                 # cores, or "64000m"
        memory: 512GiB
        labels: {rack: r1}
        gpus:
          - {model: A100, memory: 80GiB, count: 8}          # or one entry per GPU, with topology:
          - {model: T4, memory: 16GiB, numa: 0, switch: 1, nvlink: [1]}

A `.csv` file is read as the openb trace's node list (sn, cpu_milli, memory_mib, gpu, model).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from corral.model.errors import InvalidRequest
from corral.model.resources import GpuDevice, Node
from corral.model.units import parse_cpu_milli, parse_memory_mib


def load_inventory(path: Path) -> list[Node]:
    if path.suffix == ".csv":
        from corral.sim.openb import load_nodes

        return load_nodes(path)
    return [_node(path, i, item) for i, item in enumerate(load_document_list(path, "nodes"))]


def load_document_list(path: Path, key: str) -> list[Any]:
    """The non-empty list under `key` of a YAML or JSON file (by suffix), or an InvalidRequest naming the file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidRequest(str(path), f"cannot read: {exc.strerror}") from None
    kind = "JSON" if path.suffix == ".json" else "YAML"
    if not text.strip():
        raise InvalidRequest(str(path), "empty file")
    try:
        data = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise InvalidRequest(str(path), f"not valid {kind}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get(key), list) or not data[key]:
        raise InvalidRequest(str(path), f"expected a mapping with a non-empty list under '{key}'")
    items: list[Any] = data[key]
    return items


def _node(path: Path, i: int, item: Any) -> Node:
    where = f"{path}: nodes[{i}]"
    if not isinstance(item, dict) or "name" not in item:
        raise InvalidRequest(where, "each node needs at least a name")
    try:
        gpus: list[GpuDevice] = []
        for j, g in enumerate(item.get("gpus") or []):
            if not isinstance(g, dict) or "model" not in g:
                raise InvalidRequest(f"gpus[{j}]", "each GPU entry needs a model")
            count = int(g.get("count", 1))
            for _ in range(count):
                gpus.append(
                    GpuDevice(
                        index=len(gpus),
                        model=str(g["model"]),
                        memory_mib=parse_memory_mib(g.get("memory", 0), "memory"),
                        uuid=str(g.get("uuid", "")),
                        numa_node=g.get("numa"),
                        pcie_switch=g.get("switch"),
                        nvlink_peers=frozenset(int(p) for p in g.get("nvlink", [])),
                    )
                )
        labels = {str(k): str(v) for k, v in (item.get("labels") or {}).items()}
        return Node(
            str(item["name"]),
            parse_cpu_milli(item.get("cpu", 0), "cpu"),
            parse_memory_mib(item.get("memory", 0), "memory"),
            tuple(gpus),
            labels,
        )
    except InvalidRequest as exc:
        raise InvalidRequest(f"{where}.{exc.field}", exc.message) from None
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(where, f"bad value: {exc}") from None
