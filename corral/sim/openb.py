"""Loaders for the Alibaba openb GPU trace (cluster-trace-gpu-v2023) and the FGD study's exact order files.

Conversion from the trace's columns into corral's model happens here and nowhere else.
"""

from __future__ import annotations

import csv
import gzip
from dataclasses import dataclass
from pathlib import Path

from corral.model.errors import InvalidRequest
from corral.model.resources import MILLI_PER_GPU, GpuDevice, Node, Request
from corral.placement.workload import TargetWorkload

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


class TraceError(InvalidRequest):
    """Bad trace input, located by file, line and column."""

    def __init__(self, path: Path, line: int, column: str, message: str) -> None:
        super().__init__(f"{path}:{line}:{column}", message)


def _int(path: Path, line: int, row: dict[str, str], column: str) -> int:
    text = (row.get(column) or "").strip()
    try:
        value = int(text)
    except ValueError:
        raise TraceError(path, line, column, f"not a whole number: {text!r}") from None
    if value < 0:
        raise TraceError(path, line, column, f"must be >= 0, got {value}")
    return value


def _rows(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None:
            raise TraceError(path, 1, "header", "empty file")
        missing = [c for c in required if c not in reader.fieldnames]
        if missing:
            raise TraceError(path, 1, "header", f"missing column(s) {', '.join(missing)}")
        rows = [(i + 2, row) for i, row in enumerate(reader)]
    if not rows:
        raise TraceError(path, 2, "-", "no data rows")
    return rows


def load_nodes(path: Path) -> list[Node]:
    nodes = []
    for line, row in _rows(path, NODE_COLUMNS):
        count = _int(path, line, row, "gpu")
        model = (row.get("model") or "").strip()
        if count and not model:
            raise TraceError(path, line, "model", "a node with GPUs needs a GPU model")
        gpus = tuple(GpuDevice(index=j, model=model) for j in range(count))
        nodes.append(
            Node(
                row["sn"].strip(),
                _int(path, line, row, "cpu_milli"),
                _int(path, line, row, "memory_mib"),
                gpus,
            )
        )
    return nodes


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    request: Request
    gpu_spec: str = ""  # as written in the trace (the study keys its target workload by this string)
    creation_time: int | None = None  # seconds; None where the list has no times (multigpu lists)
    deletion_time: int | None = None
    line: int = 0  # line of the source file, for error messages


def load_pods(path: Path) -> list[TracePod]:
    pods = []
    for line, row in _rows(path, POD_COLUMNS):
        name = row["name"].strip()
        count = _int(path, line, row, "num_gpu")
        milli = min(_int(path, line, row, "gpu_milli"), MILLI_PER_GPU) if count else 0
        spec = (row.get("gpu_spec") or "").strip()
        models = frozenset(s for s in spec.split("|") if s) if count and spec else None
        try:
            req = Request(
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpu_count=count,
                gpu_milli=milli,
                gpu_models=models,
                id=name,
            )
        except InvalidRequest as exc:
            raise TraceError(path, line, exc.field, exc.message) from None
        times = [
            _int(path, line, row, col) if (row.get(col) or "").strip() else None
            for col in ("creation_time", "deletion_time")
        ]
        if times[0] is not None and times[1] is not None and times[1] < times[0]:
            raise TraceError(path, line, "deletion_time", f"{times[1]} is before creation_time {times[0]}")
        pods.append(TracePod(name, req, spec if count else "", times[0], times[1], line))
    return pods


@dataclass(frozen=True)
class Order:
    node_rank: dict[str, int]
    pods: list[str]  # arrival order; "<name>-tuned-<k>" is a resampled copy of <name>


def load_order(path: Path) -> Order:
    ranks: dict[str, int] = {}
    pods: list[str] = []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        for line_no, line in enumerate(fh, 1):
            kind, _, rest = line.strip().partition(" ")
            if kind == "NODE":
                rank, _, name = rest.partition("-")
                ranks[name] = int(rank)
            elif kind == "POD":
                pods.append(rest.split(" ", 1)[1])
            elif kind:
                raise TraceError(path, line_no, "kind", f"expected NODE or POD, got {kind!r}")
    return Order(ranks, pods)


def target_workload(pods: list[TracePod]) -> TargetWorkload:
    """The study's target workload: typical pods of the untuned list, keyed by the trace's own spec strings."""
    return TargetWorkload.from_shapes(
        (p.request.cpu_milli, p.request.gpu_milli, p.request.gpu_count, p.gpu_spec) for p in pods
    )


def base_name(pod: str) -> str:
    head, sep, _ = pod.rpartition("-tuned-")
    return head if sep else pod
