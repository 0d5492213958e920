"""A simulated GPU inventory for machines without GPUs (tests, demos): `4xH100-80GB`, `2x8xA100-80GB,1x2xT4-16GB`.

Each group is `[NODES x] GPUS x MODEL-MEMORY GB`. Simulated nodes get 8 cores and 64 GiB per GPU (at least 8 cores
and 32 GiB) and UUIDs starting with `SIM-`, so nobody mistakes them for real devices.
"""

from __future__ import annotations

import re

from corral.model.errors import InvalidRequest
from corral.model.resources import GpuDevice, Node

_GROUP = re.compile(r"^(?:(\d+)x)?(\d+)x([A-Za-z0-9_.]+)-(\d+)(?:GB|G|GiB)$")


def parse_simulated_inventory(spec: str) -> list[Node]:
    nodes: list[Node] = []
    for group in (g.strip() for g in spec.split(",")):
        m = _GROUP.match(group)
        if not m:
            raise InvalidRequest(
                "simulate-gpus",
                f"cannot read {group!r}; write [NODES x] GPUS x MODEL-MEMORY GB, e.g. 4xH100-80GB",
            )
        count_nodes = int(m.group(1) or 1)
        count_gpus, model, mem_gb = int(m.group(2)), m.group(3), int(m.group(4))
        if count_nodes < 1 or count_gpus < 1 or mem_gb < 1:
            raise InvalidRequest("simulate-gpus", f"counts and memory must be >= 1 in {group!r}")
        for _ in range(count_nodes):
            i = len(nodes)
            name = f"sim-{i}"
            gpus = tuple(
                GpuDevice(index=j, model=model, memory_mib=mem_gb * 1024, uuid=f"SIM-GPU-{i}-{j}")
                for j in range(count_gpus)
            )
            nodes.append(
                Node(
                    name,
                    max(8, 8 * count_gpus) * 1000,
                    max(32, 64 * count_gpus) * 1024,
                    gpus,
                    {"simulated": "true"},
                )
            )
    return nodes
