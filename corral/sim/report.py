"""Plots and self-contained static HTML reports for `corral sim`.

    run report:     allocation.png + fragmentation.png + report.html    (one policy, curves vs arrived %)
    online report:  online.png + online.html                            (allocation % over time, per policy)
    matrix report:  matrix.csv + matrix.md + matrix.png + matrix.html   (policies x pod lists vs published)

Curves are indexed by arrived GPU workload in percent of cluster GPU capacity, x = 0..130 as in the FGD study
(USENIX ATC'23); NaN points are left out of the line. Every writer writes into an existing `out_dir`; HTML pages
reference their images by relative path, so the directory can be moved or served as is.
"""

from __future__ import annotations

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
MATRIX_YLABEL = "GPU allocation at 100 % arrived (%)"
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


# --- HTML ------------------------------------------------------------------------------------------------------


def _td(value: Any) -> str:
    cls = ' class="num"' if _is_number(value) or _is_missing(value) else ""
    return f"<td{cls}>{html.escape(_fmt(value))}</td>"


def _html_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "\n".join("<tr>" + "".join(_td(v) for v in row) + "</tr>" for row in rows)
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"


def _html_img(src: str, alt: str) -> str:
    return f'<img src="{html.escape(src)}" alt="{html.escape(alt)}">'


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


def plot_online(path: Path, series: Mapping[str, tuple[Sequence[float], Sequence[float]]], title: str) -> None:
    """GPU allocation % over time (days) per policy; `series[label] = (seconds, allocation %)`, as a step plot."""
    fig, ax = plt.subplots(figsize=FIGSIZE)
    for label, (seconds, alloc) in series.items():
        x = _values(seconds) / 86400.0
        y = _values(alloc)
        n = min(len(x), len(y))
        ax.step(x[:n], y[:n], where="post", label=label, linewidth=1.3)
    ax.set_xlabel("time (days)")
    ax.set_ylabel(ALLOC_YLABEL)
    ax.set_title(title)
    ax.grid(True, alpha=0.35)
    _legend(ax, loc="best", fontsize="small")
    _save(fig, path)


def _unique(values: Sequence[Any]) -> list[str]:
    seen: dict[str, None] = {}
    for v in values:
        seen.setdefault(str(v), None)
    return list(seen)


def plot_matrix(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Grouped bars per pod list and policy: our mean allocation at 100 % arrived (± std) vs the published figure."""
    workloads = _unique([r.get("workload", "") for r in rows])
    policies = _unique([r.get("policy", "") for r in rows])
    cell: dict[tuple[str, str], Mapping[str, Any]] = {
        (str(r.get("workload", "")), str(r.get("policy", ""))): r for r in rows
    }
    has_published = any(not _is_missing(_as_float(r.get("published_alloc_at_100"))) for r in rows)
    bars_per_policy = 2 if has_published else 1
    slot = 0.8 / max(1, len(policies) * bars_per_policy)

    n_bars = len(workloads) * len(policies) * bars_per_policy
    width = min(16.0, max(FIGSIZE[0], 0.28 * n_bars + 3.0))
    fig, ax = plt.subplots(figsize=(width, FIGSIZE[1] + 0.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    lows: list[float] = []
    highs: list[float] = []
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
            ax.bar(base[ok], ours[ok], slot, yerr=std[ok], color=color, capsize=2, label=policy, edgecolor="white")
            lows.extend((ours[ok] - std[ok]).tolist())
            highs.extend((ours[ok] + std[ok]).tolist())
        okp = ~np.isnan(pub)
        if okp.any():
            ax.bar(base[okp] + slot, pub[okp], slot, color=color, alpha=0.4, hatch="//", edgecolor=color)
            lows.extend(pub[okp].tolist())
            highs.extend(pub[okp].tolist())

    low = min(lows) if lows else 0.0
    high = max(highs) if highs else 100.0
    ax.set_ylim(max(0.0, math.floor(low - 2.0)), max(100.0, math.ceil(high + 0.5)))
    ax.set_xticks(np.arange(len(workloads)))
    ax.set_xticklabels(
        workloads, rotation=20 if len(workloads) > 4 else 0, ha="right" if len(workloads) > 4 else "center"
    )
    ax.set_xlabel("pod list")
    ax.set_ylabel(MATRIX_YLABEL)
    ax.set_title("GPU allocation at 100 % arrived: corral (solid, ± std) vs published (hatched)")
    ax.grid(True, axis="y", alpha=0.35)
    handles, labels = ax.get_legend_handles_labels()
    if has_published:
        handles.append(Patch(facecolor="0.7", alpha=0.6, hatch="//", edgecolor="0.3"))
        labels.append("published")
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    _save(fig, path)


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
        _html_table(["key", "value"], [[k, v] for k, v in summary.items()]),
        "<h2>GPU allocation</h2>",
        _html_img(alloc_png.name, "GPU allocation vs arrived workload"),
        "<h2>GPU fragmentation</h2>",
        _html_img(frag_png.name, "GPU fragmentation vs arrived workload"),
    ]
    page = _write(out_dir / "report.html", _html_page(title, body))
    return [alloc_png, frag_png, page]


def write_online_report(
    out_dir: Path,
    summaries: Mapping[str, Mapping[str, Any]],
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    title: str,
) -> list[Path]:
    """online.png (allocation over time per policy) and online.html (one summary row per policy + the plot)."""
    png = out_dir / "online.png"
    plot_online(png, series, title)
    keys = _unique([k for s in summaries.values() for k in s])
    rows = [[policy, *(s.get(k) for k in keys)] for policy, s in summaries.items()]
    body = [
        _html_table(["policy", *keys], rows),
        _html_img(png.name, "GPU allocation over time"),
    ]
    page = _write(out_dir / "online.html", _html_page(title, body))
    return [png, page]


def _md_cell(value: Any) -> str:
    return _fmt(value).replace("|", "\\|").replace("\n", " ")


def matrix_markdown(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A Markdown table of `columns`: floats to 2 decimals, None/NaN/absent as a dash."""
    lines = [
        "| " + " | ".join(_md_cell(c) for c in columns) + " |",
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
        _html_table(list(columns), [[r.get(c) for c in columns] for r in rows]),
        _html_img(png.name, "GPU allocation at 100 % arrived, corral vs published"),
    ]
    page = _write(out_dir / "matrix.html", _html_page(title, body))
    return [csv_path, md, png, page]
