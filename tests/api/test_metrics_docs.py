"""docs/metrics.md lists exactly the metrics corral exposes, and every query of the Grafana dashboard in
deploy/grafana/corral.json names one of them."""

from __future__ import annotations

import json
import re
import threading
import types
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from corral.k8s.scheduler.metrics import PendingCollector, QueueCollector, SchedulerMetrics
from corral.metrics import DevicePluginMetrics, ExtenderCollector, ExtenderMetrics, Joined, render_daemon, render_text
from tests.daemon.test_gpu_use import World

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "metrics.md"
DASHBOARD = ROOT / "deploy" / "grafana" / "corral.json"
#: PromQL words that look like names but are not metrics.
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def exposed(text: str) -> dict[str, str]:
    """Name as queried -> type: counters with their `_total`, histograms by their base name."""
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):  # prometheus_client's creation time of each counter and histogram
            continue
        name = f"{family.name}_total" if family.type == "counter" else family.name
        found[name] = family.type
    return found


def every_metric(tmp_path: Path) -> dict[str, str]:
    """What the four faces expose (the daemon as root sees it: per-job series included; the standalone scheduler with
    a pod pending)."""
    daemon = World(tmp_path).d
    extender = ExtenderMetrics()
    state = types.SimpleNamespace(lock=threading.Lock(), snapshot=None, pods={})
    text = render_daemon(daemon, jobs=True) + render_text(Joined(extender.registry, ExtenderCollector(state)))
    text += render_text(DevicePluginMetrics())
    scheduler = SchedulerMetrics()
    views: dict[str, dict[str, Any]] = {"pending": {"q": 1}, "shares": {"q": 0.5}, "holdings": {"q": {"gpu_milli": 1}}}
    text += render_text(Joined(scheduler.registry, PendingCollector(lambda: {"insufficient_gpu": 1}),
                               QueueCollector(lambda: views)))  # fmt: skip
    return exposed(text.decode())


def documented() -> set[str]:
    """The names in the first column of docs/metrics.md's tables."""
    return set(re.findall(r"^\| `([A-Za-z_:][A-Za-z0-9_:]*)` \|", DOCS.read_text(), flags=re.MULTILINE))


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana `label_values(metric, label)`) reads."""
    e = re.sub(r"label_values\(\s*([^,)]*)(,[^)]*)?\)", r"\1", expr)
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', e)  # strings (label values)
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # range selectors
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)  # label lists
    names = set()
    for m in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", e):
        if m.group() in KEYWORDS or e[m.end() :].lstrip().startswith("("):  # a function's name
            continue
        names.add(m.group())
    return names


def queried(known: dict[str, str], name: str) -> str | None:
    """The exposed metric a queried series name belongs to (a histogram's _bucket/_sum/_count), None if none."""
    if name in known:
        return name
    for suffix in HISTOGRAM_SERIES:
        base = name.removesuffix(suffix)
        if base != name and known.get(base) == "histogram":
            return base
    return None


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel.get("targets", [])]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def test_docs_list_exactly_the_exposed_metrics(tmp_path: Path) -> None:
    known = every_metric(tmp_path)
    docs = documented()
    assert sorted(set(known) - docs) == [], "exposed but not in docs/metrics.md"
    assert sorted(docs - set(known)) == [], "in docs/metrics.md but not exposed"


def test_every_dashboard_query_names_an_exposed_metric(tmp_path: Path) -> None:
    known = every_metric(tmp_path)
    exprs = dashboard_queries()
    used = {name for expr in exprs for name in metric_names(expr)}
    assert len(used) >= 20, sorted(used)  # the parser really found the board's metrics
    unknown = sorted(name for name in used if queried(known, name) is None)
    assert unknown == [], f"dashboard queries name metrics nobody exposes: {unknown}"
    # every panel queries something, and the board covers the measures the issue asks for
    assert {queried(known, n) for n in used} >= {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "corral_gpu_granted_milli",
        "corral_gpu_granted_memory_mib",
        "corral_job_gpu_milli",
        "corral_jobs",
        "corral_scheduling_latency_seconds",
        "corral_schedule_attempts_total",
        "corral_jobs_ended_total",
        "corral_gpu_fragmentation_ratio",
        "corral_gpu_memory_watchdog_actions_total",
    }


def test_the_query_parser_reads_names_not_labels_functions_or_durations() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, verb) (rate(corral_x_bucket{verb="bind", a=~"$b"}[$__rate_interval])))'
        " / on (node) group_left corral_y offset 5m and typo_metric * 1000"
    )
    assert metric_names(expr) == {"corral_x_bucket", "corral_y", "typo_metric"}
    assert metric_names("label_values(corral_info, instance)") == {"corral_info"}
    known = {"corral_x": "histogram", "corral_y": "gauge"}
    assert [queried(known, n) for n in ("corral_x_bucket", "corral_y", "typo_metric")] == ["corral_x", "corral_y", None]
