"""The fairness report: one table row per queue policy, three plots, one self-contained HTML page.

    fairness.csv / fairness.json / fairness.md   the table (JSON adds the run's settings and per-user service)
    jobs.csv                                     per policy and job: user, size, arrival, start, end, runs, waste
    allocation.png  jct.png  users.png           GPU allocation over time; JCT p50/p99 by size; users' service
    fairness.html                                the table and the plots, images inlined (data: URIs)

HTML and plots reuse corral/sim/report.py's helpers, so this page looks and parses like the other sim reports.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from corral.sim.fair.metrics import BUCKETS, bucket, fairness, per_bucket, summarize
from corral.sim.fair.replay import FairResult
from corral.sim.report import FIGSIZE, _html_img, _html_page, _html_table, _legend, _save, _write, plot_online

#: The table's columns, and their headers with units.
COLUMNS: dict[str, str] = {
    "policy": "policy",
    "finished": "finished (jobs)",
    "unfinished": "never finished (jobs)",
    "alloc_arriving_pct": "GPU allocation, mean while jobs arrive (%)",
    "alloc_mean_pct": "GPU allocation, mean while contended (%)",
    "jain": "Jain's index over users",
    "preemptions": "preemptions",
    "wasted_gpu_h": "GPU time wasted by preemption (GPU-hours)",
    "wait_p50_s": "wait p50 (s)",
    "wait_p99_s": "wait p99 (s)",
    **{f"jct_p50_{b}_s": f"JCT p50, {b} (s)" for b in BUCKETS},
    **{f"jct_p99_{b}_s": f"JCT p99, {b} (s)" for b in BUCKETS},
    "largest_wait_max_s": "longest wait of the largest jobs (s)",
    "contended_s": "queue last empty after (s)",
    "wall_s": "replay wall time (s)",
}

#: The shorter table of the Markdown summary (README, docs): the columns where policies differ most.
SHORT = (
    "policy",
    "alloc_arriving_pct",
    "alloc_mean_pct",
    "contended_s",
    "jain",
    "jct_p50_1 GPU_s",
    "jct_p99_1 GPU_s",
    "jct_p50_8 GPUs_s",
    "jct_p99_8 GPUs_s",
    "largest_wait_max_s",
    "preemptions",
    "wasted_gpu_h",
    "wall_s",
)


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.0f}"
    return str(value)


def markdown(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] = SHORT) -> str:
    lines = [
        "| " + " | ".join(COLUMNS[c] for c in columns) + " |",
        "|" + "|".join("---" if c == "policy" else "---:" for c in columns) + "|",
    ]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot_jct(path: Path, results: Mapping[str, FairResult]) -> None:
    """Grouped bars: per size bucket, each policy's JCT p50 (solid) and p99 (light), log scale."""
    fig, ax = plt.subplots(figsize=(FIGSIZE[0] * 1.3, FIGSIZE[1]))
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    width = 0.8 / max(1, len(results))
    x = np.arange(len(BUCKETS))
    for i, (policy, r) in enumerate(results.items()):
        stats = per_bucket(r)
        p50 = np.array([stats[b]["p50"] for b in BUCKETS])
        p99 = np.array([stats[b]["p99"] for b in BUCKETS])
        pos = x - 0.4 + width * (i + 0.5)
        color = colors[i % len(colors)]
        # a bucket without finished jobs (NaN) or with JCT 0 has no bar on a log axis
        ax.bar(pos, np.where(p99 > 0, p99, np.nan), width, color=color, alpha=0.35, edgecolor=color)
        ax.bar(pos, np.where(p50 > 0, p50, np.nan), width, color=color, label=policy)
    ax.set_yscale("log")
    ax.set_xticks(x)
    counts = per_bucket(next(iter(results.values()))) if results else {}
    ax.set_xticklabels([f"{b}\n({int(counts[b]['count']) if counts else 0} jobs)" for b in BUCKETS])
    ax.set_ylabel("job completion time (s): p50 solid, p99 light")
    ax.set_title("Job completion time by job size")
    ax.grid(True, axis="y", alpha=0.35)
    _legend(ax, loc="upper left", fontsize="small")
    _save(fig, path)


def plot_users(path: Path, results: Mapping[str, FairResult]) -> None:
    """Each user's service x_u (received / max-min fair entitlement) per policy; users by jobs submitted."""
    fig, ax = plt.subplots(figsize=(FIGSIZE[0] * 1.3, FIGSIZE[1]))
    for policy, r in results.items():
        index, x = fairness(r)
        counts = np.bincount([r.users.index(j.user) for j in r.jobs], minlength=len(r.users))  # the heavy users first
        order = np.argsort(-counts, kind="stable")
        ax.plot(
            np.arange(len(order)),
            x[order],
            marker="o",
            markersize=3,
            linewidth=1.0,
            label=f"{policy} (J = {index:.3f})",
        )
    ax.axhline(1.0, color="0.4", linestyle=":", linewidth=1.0)
    ax.set_yscale("log")
    ax.set_xlabel("users, most jobs submitted first")
    ax.set_ylabel("received / fair entitlement (1 = fair)")
    ax.set_title("Users' dominant-share service while contended (Jain's index J in the legend)")
    ax.grid(True, alpha=0.35)
    _legend(ax, loc="best", fontsize="small")
    _save(fig, path)


def write_jobs(path: Path, results: Mapping[str, FairResult]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(
            ["policy", "job", "user", "size", "arrival_s", "duration_s", "time_limit_s", "first_start_s",
             "completion_s", "runs", "wasted_gpu_s"]
        )  # fmt: skip
        for policy, r in results.items():
            for k, j in enumerate(r.jobs):
                start = "" if math.isnan(r.first_start[k]) else int(r.first_start[k])
                done = "" if math.isnan(r.completion[k]) else int(r.completion[k])
                lost = round(float(r.lost_gpu_milli_s[k]) / 1000.0, 3)
                w.writerow(
                    [policy, j.id, j.user, bucket(j.request), j.arrival, j.duration, j.estimate, start, done,
                     int(r.runs[k]), lost]
                )  # fmt: skip
    return path


def write_report(
    out_dir: Path, results: Mapping[str, FairResult], settings: Mapping[str, Any], title: str
) -> list[dict[str, Any]]:
    """Every file of the report into `out_dir`; returns the table's rows."""
    rows = [summarize(r) for r in results.values()]
    with (out_dir / "fairness.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else list(COLUMNS))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()})
    users = {p: dict(zip(r.users, [None if math.isnan(v) else float(v) for v in fairness(r)[1]], strict=True))
             for p, r in results.items()}  # fmt: skip
    clean = [{k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in r.items()} for r in rows]
    doc = {"settings": dict(settings), "table": clean, "user_service": users}
    (out_dir / "fairness.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    _write(out_dir / "fairness.md", f"# {title}\n\n{markdown(rows)}\n{markdown(rows, list(COLUMNS))}")
    write_jobs(out_dir / "jobs.csv", results)
    series = {
        p: (r.times.tolist(), (100.0 * r.allocated_milli / max(r.capacity_milli, 1)).tolist())
        for p, r in results.items()
    }
    ends = [float(max(j.arrival for j in r.jobs)) for r in results.values() if r.jobs]
    plot_online(out_dir / "allocation.png", series, "GPU allocation over time", max(ends) if ends else None)
    plot_jct(out_dir / "jct.png", results)
    plot_users(out_dir / "users.png", results)
    settings_rows = [[k, v] for k, v in settings.items()]
    body = [
        "<h2>Settings</h2>",
        _html_table(["setting", "value"], settings_rows),
        "<h2>Policies compared</h2>",
        _html_table([COLUMNS[c] for c in COLUMNS], [[r.get(c) for c in COLUMNS] for r in rows]),
        "<h2>GPU allocation over time</h2>",
        _html_img(out_dir / "allocation.png", "GPU allocation over time per policy"),
        "<h2>Job completion time by size</h2>",
        _html_img(out_dir / "jct.png", "JCT p50 and p99 by job size per policy"),
        "<h2>Fairness between users</h2>",
        "<p>x_u = the dominant-share time a user received over its max-min fair entitlement of what was allocated, "
        "while jobs waited; Jain's index J = (sum x)^2 / (n sum x^2). See docs/sim-fairness.md.</p>",
        _html_img(out_dir / "users.png", "users' service per policy"),
    ]
    _write(out_dir / "fairness.html", _html_page(title, body))
    return rows
