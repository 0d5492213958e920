"""Plots and self-contained static HTML reports for `corral sim`.

    run report:     allocation.png + fragmentation.png + report.html    (one policy, curves vs arrived %)
    online report:  online.png + online.html                            (allocation % over time, per policy)
    matrix report:  matrix.csv + matrix.md + matrix.png + matrix.html   (policies x pod lists vs published)

Curves are indexed by arrived GPU workload in percent of cluster GPU capacity, x = 0..130 as in the FGD study
(USENIX ATC'23); NaN points are left out of the line. Every writer writes into an existing `out_dir`. HTML pages
carry their images inline (data: URIs) and reference nothing else, so one page can be mailed, attached to an issue
or opened from an archive on its own; the PNGs are written beside them too, for slides and Markdown.

Every number in a summary carries its unit (%, s, pods, GPUs, ...): `unit_of(key)` knows the keys the simulator
writes, and tables name the unit in the header (wide tables) or beside the value (key/value tables).
"""

from __future__ import annotations

import base64
import csv
import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import numpy.typing as npt

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

ARRIVED_XLABEL = "arrived GPU workload (% of cluster GPU capacity)"
ALLOC_YLABEL = "GPU allocation (% of cluster GPUs)"
FRAG_YLABEL = "GPU fragmentation (% of cluster GPUs)"
MATRIX_YLABEL = "GPU allocation at 100 % arrived (% of cluster GPUs, axis from 0)"
MISSING = "–"
DPI = 110
FIGSIZE = (8.0, 4.5)

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: left; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; height: auto; display: block; margin: 1em 0; }
""".strip()


# --- formatting ------------------------------------------------------------------------------------------------


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    return isinstance(value, float | np.floating) and math.isnan(float(value))


def _fmt(value: Any) -> str:
    """Floats to 2 decimals, None/NaN as a dash, everything else via str()."""
    if _is_missing(value):
        return MISSING
    if isinstance(value, float | np.floating):
        return f"{float(value):.2f}"
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)


def _as_float(value: Any) -> float:
    """A finite-or-NaN float: None and non-numbers become NaN."""
    if value is None or isinstance(value, bool) or not _is_number(value):
        return math.nan
    return float(value)


def _values(seq: Sequence[float]) -> npt.NDArray[np.float64]:
    return np.array([_as_float(v) for v in seq], dtype=np.float64)


# --- units -----------------------------------------------------------------------------------------------------

#: Units of the keys `corral sim` writes whose names do not say it (the rules in `unit_of` cover the rest).
UNITS: dict[str, str] = {
    "pods": "pods",
    "placed": "pods",
    "rejected": "pods",
    "never_placed": "pods",
    "delayed_pods": "pods",
    "failed_pods": "pods",
    "failed_gpu_pods": "pods",
    "failed_pods_without_gpu": "pods",
    "failed_pods_without_gpu_mean": "pods",
    "gpus": "GPUs",
    "nodes": "nodes",
    "seeds": "runs",
    "tune": "× GPU capacity",
    "wall_seconds": "s",
    "wall_seconds_mean": "s",
    "final_alloc": "%",
}

#: Keys that are names or identifiers, not measures: no unit.
UNITLESS = frozenset({"policy", "pod_list", "workload", "behavior", "seed", "order", "label"})


def unit_of(key: str) -> str:
    """The unit of a summary or matrix key ('' for names and identifiers)."""
    if key in UNITS:
        return UNITS[key]
    if key in UNITLESS:
        return ""
    if key.endswith("_pct") or key.startswith(("alloc_", "frag_", "published_", "diff_")):
        return "%"  # allocation and fragmentation, ours, published or their difference: % of cluster GPUs
    if key.endswith(("_s", "_seconds")):
        return "s"
    return ""


def _with_unit(key: str) -> str:
    unit = unit_of(key)
    return f"{key} ({unit})" if unit and unit != key else key  # "pods", not "pods (pods)"


# --- HTML ------------------------------------------------------------------------------------------------------


def _td(value: Any) -> str:
    cls = ' class="num"' if _is_number(value) or _is_missing(value) else ""
    return f"<td{cls}>{html.escape(_fmt(value))}</td>"


def _html_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "\n".join("<tr>" + "".join(_td(v) for v in row) + "</tr>" for row in rows)
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"


def _html_img(png: Path, alt: str) -> str:
    """The PNG at `png`, inlined: the page references no file beside it."""
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'


def _summary_table(summary: Mapping[str, Any]) -> str:
    """Key, value and unit of every entry: 'alloc_at_100 | 93.46 | %'."""
    return _html_table(["key", "value", "unit"], [[k, v, unit_of(str(k))] for k, v in summary.items()])


def _html_page(title: str, body: Sequence[str]) -> str:
    t = html.escape(title)
    parts = "\n".join(body)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{t}</title>\n<style>\n{_CSS}\n</style>\n</head>\n"
        f"<body>\n<h1>{t}</h1>\n{parts}\n</body>\n</html>\n"
    )


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --- plots -----------------------------------------------------------------------------------------------------


def _save(fig: Figure, path: Path) -> None:
    try:
        fig.tight_layout()
        fig.savefig(path, dpi=DPI, format="png", bbox_inches="tight")
    finally:
        plt.close(fig)


def _legend(ax: Axes, **kwargs: Any) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, **kwargs)


def plot_curves(
    path: Path,
    series: Mapping[str, Sequence[float]],
    ylabel: str,
    title: str,
    published: Mapping[str, Sequence[float]] | None = None,
) -> None:
    """One metric against arrived % (x = index, 0..130); solid lines for `series`, dashed for `published`."""
    fig, ax = plt.subplots(figsize=FIGSIZE)
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    color_of: dict[str, str] = {}
    for i, (label, values) in enumerate(series.items()):
        y = _values(values)
        color_of[label] = colors[i % len(colors)]
        ax.plot(np.arange(len(y)), y, label=label, color=color_of[label], linewidth=1.6)
    for j, (label, values) in enumerate((published or {}).items()):
        y = _values(values)
        color = color_of.get(label, colors[(len(series) + j) % len(colors)])
        ax.plot(np.arange(len(y)), y, label=f"{label} (published)", color=color, linestyle="--", linewidth=1.2)
    ax.axvline(100, color="0.4", linestyle=":", linewidth=1.0)
    ax.set_xlim(0, 130)
    ax.set_xlabel(ARRIVED_XLABEL)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.35)
    _legend(ax, loc="best", fontsize="small")
    _save(fig, path)


def time_unit(span_seconds: float) -> tuple[str, float]:
    """A readable unit for a time axis spanning `span_seconds`: (name, seconds per unit)."""
    if span_seconds <= 2 * 3600:
        return "minutes", 60.0
    if span_seconds <= 2 * 86400:
        return "hours", 3600.0
    return "days", 86400.0


def _online_panel(
    ax: Axes, series: Mapping[str, tuple[Sequence[float], Sequence[float]]], end: float | None, title: str
) -> None:
    starts = [float(_values(t)[0]) for t, _ in series.values() if len(t)]
    ends = [float(_values(t)[-1]) for t, _ in series.values() if len(t)]
    t0 = min(starts) if starts else 0.0
    t1 = end if end is not None else (max(ends) if ends else 1.0)
    unit, per = time_unit(t1 - t0)
    for label, (seconds, alloc) in series.items():
        x = (_values(seconds) - t0) / per
        y = _values(alloc)
        n = min(len(x), len(y))
        ax.step(x[:n], y[:n], where="post", label=label, linewidth=1.3)
    if end is not None:
        ax.set_xlim(0.0, max((t1 - t0) / per, 1e-9))
    ax.set_ylim(bottom=0.0)
    ax.set_xlabel(f"time since the first arrival ({unit})")
    ax.set_ylabel(ALLOC_YLABEL)
    ax.set_title(title, fontsize="medium")
    ax.grid(True, alpha=0.35)


def plot_online(
    path: Path,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    title: str,
    arrivals_end: float | None = None,
) -> None:
    """GPU allocation % over time per policy; `series[label] = (seconds, allocation %)`, as a step plot.

    With `arrivals_end` (the last arrival, in the series' seconds) a first panel shows the time while work arrives,
    where policies differ, and a second the whole replay: long runtimes otherwise squash the first into one line.
    """
    if arrivals_end is None:
        fig, ax = plt.subplots(figsize=FIGSIZE)
        _online_panel(ax, series, None, title)
        _legend(ax, loc="best", fontsize="small")
    else:
        fig, (near, whole) = plt.subplots(1, 2, figsize=(FIGSIZE[0] * 1.6, FIGSIZE[1]))
        starts = [float(_values(t)[0]) for t, _ in series.values() if len(t)]
        t0 = min(starts) if starts else 0.0
        # the arrival window and as much again, so the drain after the last arrival shows too
        _online_panel(near, series, t0 + 2.0 * max(arrivals_end - t0, 1.0), "while work arrives (and as long again)")
        _online_panel(whole, series, None, "the whole replay, until the last departure")
        _legend(near, loc="best", fontsize="small")
        fig.suptitle(title)
    _save(fig, path)


def _unique(values: Sequence[Any]) -> list[str]:
    seen: dict[str, None] = {}
    for v in values:
        seen.setdefault(str(v), None)
    return list(seen)


def _pod_list(row: Mapping[str, Any]) -> str:
    """A matrix row's pod list: `corral sim matrix` calls it pod_list, the study's result files workload."""
    return str(row.get("pod_list", row.get("workload", "")))


def matrix_title(workloads: Sequence[str]) -> str:
    """The matrix plot's title: what is measured, and on which pod lists (wrapped to a few per line)."""
    names = list(workloads) or ["(none)"]
    lines = [", ".join(names[i : i + 4]) for i in range(0, len(names), 4)]
    return "GPU allocation at 100 % arrived, corral (solid, ± std) vs published (hatched)\npod lists: " + (
        ",\n".join(lines)
    )


def matrix_figure(rows: Sequence[Mapping[str, Any]]) -> Figure:
    """Grouped bars per pod list and policy: our mean allocation at 100 % arrived (± std) vs the published figure.

    The y axis starts at 0 so that bar lengths compare honestly; the policies' differences (often a few points
    near 90 %) are written on the bars instead of being magnified by a cut axis.
    """
    workloads = _unique([_pod_list(r) for r in rows])
    policies = _unique([r.get("policy", "") for r in rows])
    cell: dict[tuple[str, str], Mapping[str, Any]] = {(_pod_list(r), str(r.get("policy", ""))): r for r in rows}
    has_published = any(not _is_missing(_as_float(r.get("published_alloc_at_100"))) for r in rows)
    bars_per_policy = 2 if has_published else 1
    slot = 0.8 / max(1, len(policies) * bars_per_policy)

    n_bars = len(workloads) * len(policies) * bars_per_policy
    width = min(16.0, max(FIGSIZE[0], 0.28 * n_bars + 3.0))
    fig, ax = plt.subplots(figsize=(width, FIGSIZE[1] + 1.0))
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    highs: list[float] = []
    label_size = "x-small" if n_bars <= 24 else 5
    for p_i, policy in enumerate(policies):
        color = colors[p_i % len(colors)]
        ours = np.full(len(workloads), math.nan)
        std = np.zeros(len(workloads))
        pub = np.full(len(workloads), math.nan)
        for w_i, workload in enumerate(workloads):
            row = cell.get((workload, policy))
            if row is None:
                continue
            ours[w_i] = _as_float(row.get("alloc_at_100_mean"))
            s = _as_float(row.get("alloc_at_100_std"))
            std[w_i] = 0.0 if math.isnan(s) else s
            pub[w_i] = _as_float(row.get("published_alloc_at_100"))
        base = np.arange(len(workloads)) - 0.4 + slot * (p_i * bars_per_policy + 0.5)
        ok = ~np.isnan(ours)
        if ok.any():
            bars = ax.bar(
                base[ok], ours[ok], slot, yerr=std[ok], color=color, capsize=2, label=policy, edgecolor="white"
            )
            ax.bar_label(bars, fmt="%.1f", fontsize=label_size, rotation=90, padding=5)
            highs.extend((ours[ok] + std[ok]).tolist())
        okp = ~np.isnan(pub)
        if okp.any():
            published = ax.bar(base[okp] + slot, pub[okp], slot, color=color, alpha=0.4, hatch="//", edgecolor=color)
            ax.bar_label(published, fmt="%.1f", fontsize=label_size, rotation=90, padding=5, color="0.35")
            highs.extend(pub[okp].tolist())

    high = max(highs) if highs else 100.0
    # Room above the tallest bar for its value label; never below the 100 % line.
    ax.set_ylim(0.0, max(100.0, math.ceil(high)) + 12.0)
    ax.axhline(100.0, color="0.4", linestyle=":", linewidth=1.0)
    ax.set_xticks(np.arange(len(workloads)))
    ax.set_xticklabels(
        workloads, rotation=20 if len(workloads) > 4 else 0, ha="right" if len(workloads) > 4 else "center"
    )
    ax.set_xlabel("pod list")
    ax.set_ylabel(MATRIX_YLABEL)
    ax.set_title(matrix_title(workloads), fontsize="medium")
    ax.grid(True, axis="y", alpha=0.35)
    handles, labels = ax.get_legend_handles_labels()
    if has_published:
        handles.append(Patch(facecolor="0.7", alpha=0.6, hatch="//", edgecolor="0.3"))
        labels.append("published")
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return fig


def plot_matrix(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """matrix_figure(rows), saved as a PNG at `path`."""
    _save(matrix_figure(rows), path)


# --- reports ---------------------------------------------------------------------------------------------------


def write_run_report(
    out_dir: Path, summary: Mapping[str, Any], alloc: Sequence[float], frag: Sequence[float], title: str
) -> list[Path]:
    """allocation.png, fragmentation.png and report.html (summary table + both plots) for one replay run."""
    label = str(summary.get("policy", "corral"))
    alloc_png = out_dir / "allocation.png"
    frag_png = out_dir / "fragmentation.png"
    plot_curves(alloc_png, {label: alloc}, ALLOC_YLABEL, f"{title}: GPU allocation")
    plot_curves(frag_png, {label: frag}, FRAG_YLABEL, f"{title}: GPU fragmentation")
    body = [
        "<h2>Summary</h2>",
        _summary_table(summary),
        "<h2>GPU allocation</h2>",
        _html_img(alloc_png, "GPU allocation vs arrived workload"),
        "<h2>GPU fragmentation</h2>",
        _html_img(frag_png, "GPU fragmentation vs arrived workload"),
    ]
    page = _write(out_dir / "report.html", _html_page(title, body))
    return [alloc_png, frag_png, page]


def write_online_report(
    out_dir: Path,
    summaries: Mapping[str, Mapping[str, Any]],
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    title: str,
    arrivals_end: float | None = None,
) -> list[Path]:
    """online.png (allocation over time per policy) and online.html (one summary row per policy + the plot)."""
    png = out_dir / "online.png"
    plot_online(png, series, title, arrivals_end)
    keys = _unique([k for s in summaries.values() for k in s])
    rows = [[policy, *(s.get(k) for k in keys)] for policy, s in summaries.items()]
    body = [
        _html_table(["policy", *(_with_unit(k) for k in keys)], rows),
        _html_img(png, "GPU allocation over time"),
    ]
    page = _write(out_dir / "online.html", _html_page(title, body))
    return [png, page]


def _md_cell(value: Any) -> str:
    return _fmt(value).replace("|", "\\|").replace("\n", " ")


def matrix_markdown(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A Markdown table of `columns` (headers with their units): floats to 2 decimals, None/NaN/absent as a dash."""
    lines = [
        "| " + " | ".join(_md_cell(_with_unit(c)) for c in columns) + " |",
        "|" + "|".join("---:" if any(_is_number(r.get(c)) for r in rows) else "---" for c in columns) + "|",
    ]
    lines.extend("| " + " | ".join(_md_cell(r.get(c)) for c in columns) + " |" for r in rows)
    return "\n".join(lines) + "\n"


def _csv_cell(value: Any) -> Any:
    return "" if _is_missing(value) else value


def write_matrix_report(
    out_dir: Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str], title: str
) -> list[Path]:
    """matrix.csv (full precision, blanks for None/NaN), matrix.md, matrix.png and matrix.html."""
    csv_path = out_dir / "matrix.csv"
    with csv_path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({c: _csv_cell(r.get(c)) for c in columns})
    md = _write(out_dir / "matrix.md", f"# {title}\n\n{matrix_markdown(rows, columns)}")
    png = out_dir / "matrix.png"
    plot_matrix(png, rows)
    body = [
        _html_table([_with_unit(c) for c in columns], [[r.get(c) for c in columns] for r in rows]),
        _html_img(png, "GPU allocation at 100 % arrived, corral vs published"),
    ]
    page = _write(out_dir / "matrix.html", _html_page(title, body))
    return [csv_path, md, png, page]
