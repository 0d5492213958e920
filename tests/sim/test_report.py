"""corral.sim.report: every writer produces its files, HTML is escaped and self-contained, Markdown/CSV tables are
well formed, summaries carry units."""

from __future__ import annotations

import base64
import csv
import math
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from corral.sim.report import (
    matrix_figure,
    matrix_markdown,
    plot_curves,
    plot_matrix,
    plot_online,
    time_unit,
    write_matrix_report,
    write_online_report,
    write_run_report,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EVIL = "<script>alert(1)</script>"


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), path
    assert len(data) > 5_000, (path, len(data))


#: Attributes through which a page can make the browser fetch something.
URL_ATTRIBUTES = {"src", "href", "srcset", "action", "formaction", "poster", "data", "background", "xlink:href"}


class _Page(HTMLParser):
    """Every URL-bearing attribute, the inline styles, and the table cells of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self.styles: list[str] = []
        self.rows: list[list[str]] = []
        self._in_style = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in URL_ATTRIBUTES:
                self.urls.append((tag, name, value or ""))
            if name == "style" and value:
                self.styles.append(value)
        if tag == "style":
            self._in_style = True
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._in_style = False
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.styles.append(data)
        if self._cell is not None:
            self._cell.append(data)


def parse_page(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def assert_self_contained(path: Path, images: int) -> _Page:
    """No src/href (or any other fetch) to anything but a data: URI or an in-page anchor; `images` PNGs inlined."""
    page = parse_page(path)
    outside = [(t, a, v[:60]) for t, a, v in page.urls if not (v.startswith("data:") or v.startswith("#"))]
    assert not outside, f"{path.name} references outside itself: {outside}"
    assert not any(re.search(r"url\(|@import", s) for s in page.styles), f"{path.name}: a stylesheet fetches"
    pngs = [v for t, a, v in page.urls if t == "img" and a == "src" and v.startswith("data:image/png;base64,")]
    assert len(pngs) == images, (path.name, len(pngs))
    for uri in pngs:
        assert base64.b64decode(uri.split(",", 1)[1]).startswith(PNG_SIGNATURE)
    return page


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def curve(scale: float = 1.0, nan_from: int | None = None) -> list[float]:
    values = [min(100.0, x * scale) - 0.02 * max(0, x - 80) ** 2 / 10 for x in range(131)]
    if nan_from is not None:
        values[nan_from:] = [math.nan] * (131 - nan_from)
    return values


def test_plot_curves_with_published_and_nan(tmp_path: Path) -> None:
    path = tmp_path / "c.png"
    plot_curves(
        path,
        {"fgd": curve(), "bestfit": curve(0.95, nan_from=120), "all-nan": [math.nan] * 131},
        "GPU allocation (%)",
        "t",
        published={"fgd": curve(0.99), "bestfit": [math.nan, *curve(0.97)[1:]]},
    )
    assert_png(path)


def test_plot_curves_empty_series(tmp_path: Path) -> None:
    path = tmp_path / "empty.png"
    plot_curves(path, {}, "y", "nothing")
    assert_png(path)


def test_write_run_report(tmp_path: Path) -> None:
    summary: dict[str, Any] = {
        "policy": "fgd",
        "alloc_at_100": 93.456789,
        "pods": 8152,
        "note": EVIL,
        EVIL: "key too",
        "missing": None,
    }
    paths = write_run_report(tmp_path, summary, curve(), [v / 10 for v in curve(nan_from=125)], "run <b>1</b>")
    assert paths == [tmp_path / "allocation.png", tmp_path / "fragmentation.png", tmp_path / "report.html"]
    assert_png(paths[0])
    assert_png(paths[1])
    assert_self_contained(paths[2], images=2)
    page = paths[2].read_text(encoding="utf-8")
    assert "93.46" in page and "93.456789" not in page
    assert "8152" in page and "fgd" in page
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "run &lt;b&gt;1&lt;/b&gt;" in page and "<b>1</b>" not in page


def test_run_report_summary_has_units(tmp_path: Path) -> None:
    summary: dict[str, Any] = {
        "pod_list": "default", "policy": "fgd", "seed": 42, "tune": 1.3, "nodes": 2, "gpus": 16, "pods": 40,
        "failed_pods": 3, "failed_gpu_pods": 2, "failed_pods_without_gpu": 1, "alloc_at_100": 93.5,
        "alloc_at_130": 95.1, "frag_at_100": 4.2, "final_alloc": 95.1, "wall_seconds": 0.4,
    }  # fmt: skip
    write_run_report(tmp_path, summary, curve(), curve(0.1), "run")
    rows = {r[0]: r[1:] for r in parse_page(tmp_path / "report.html").rows[1:]}
    assert rows["alloc_at_100"] == ["93.50", "%"]
    assert rows["frag_at_100"][1] == "%" and rows["final_alloc"][1] == "%"
    assert rows["pods"] == ["40", "pods"] and rows["failed_gpu_pods"][1] == "pods"
    assert rows["gpus"] == ["16", "GPUs"] and rows["nodes"][1] == "nodes"
    assert rows["wall_seconds"] == ["0.40", "s"]
    numeric = [k for k, (value, _unit) in rows.items() if is_number(value) and k != "seed"]
    assert numeric and all(rows[k][1] for k in numeric), {k: rows[k] for k in numeric if not rows[k][1]}


def test_plot_online(tmp_path: Path) -> None:
    path = tmp_path / "o.png"
    t = [i * 3600.0 for i in range(200)]
    plot_online(
        path, {"fgd": (t, [min(100.0, i * 0.7) for i in range(200)]), "nan": (t[:3], [1.0, math.nan, 2.0])}, "x"
    )
    assert_png(path)


def test_plot_online_with_the_arrival_window_and_time_units(tmp_path: Path) -> None:
    path = tmp_path / "w.png"
    t = [float(i) for i in range(0, 600, 5)] + [86400.0 * d for d in range(1, 40)]
    plot_online(path, {"fgd": (t, [min(90.0, 0.5 * i) for i in range(len(t))])}, "x", arrivals_end=300.0)
    assert_png(path)
    assert time_unit(600) == ("minutes", 60.0)
    assert time_unit(5 * 3600) == ("hours", 3600.0)
    assert time_unit(40 * 86400) == ("days", 86400.0)


def test_write_online_report(tmp_path: Path) -> None:
    t = [i * 1800.0 for i in range(100)]
    series = {"fgd": (t, [i * 0.9 for i in range(100)]), EVIL: (t, [i * 0.8 for i in range(100)])}
    summaries: dict[str, dict[str, Any]] = {
        "fgd": {"alloc_mean_pct": 71.23456, "placed": 3, "delay_p99_s": 12.0},
        EVIL: {"alloc_mean_pct": 60.0, "placed": 7, "delay_p99_s": 0.0, "extra": None},
    }
    paths = write_online_report(tmp_path, summaries, series, "online")
    assert paths == [tmp_path / "online.png", tmp_path / "online.html"]
    assert_png(paths[0])
    parsed = assert_self_contained(paths[1], images=1)
    assert parsed.rows[0] == ["policy", "alloc_mean_pct (%)", "placed (pods)", "delay_p99_s (s)", "extra"]
    page = paths[1].read_text(encoding="utf-8")
    assert page.count("<tr>") == 3  # header + one row per policy
    assert "71.23" in page and "60.00" in page and "–" in page
    assert "<script>" not in page and "&lt;script&gt;" in page


ROWS: list[dict[str, Any]] = [
    {"workload": "default", "policy": "fgd", "alloc_at_100_mean": 94.123, "alloc_at_100_std": 0.3,
     "published_alloc_at_100": 94.0, "seeds": 10},
    {"workload": "default", "policy": "bestfit", "alloc_at_100_mean": 88.5, "alloc_at_100_std": 0.5,
     "published_alloc_at_100": None, "seeds": 10},
    {"workload": "gpushare100", "policy": "fgd", "alloc_at_100_mean": 92.0, "alloc_at_100_std": math.nan,
     "published_alloc_at_100": 91.7, "seeds": 10},
    {"workload": "gpushare100", "policy": "bestfit", "alloc_at_100_mean": None, "alloc_at_100_std": None,
     "published_alloc_at_100": 85.2, "seeds": 0},
]  # fmt: skip
COLUMNS = ["workload", "policy", "alloc_at_100_mean", "alloc_at_100_std", "published_alloc_at_100", "seeds"]


def test_matrix_markdown() -> None:
    md = matrix_markdown(ROWS, COLUMNS)
    lines = md.strip().split("\n")
    assert len(lines) == 2 + len(ROWS)
    assert lines[0] == (
        "| workload | policy | alloc_at_100_mean (%) | alloc_at_100_std (%) | published_alloc_at_100 (%) "
        "| seeds (runs) |"
    )
    assert lines[1].count("|") == len(COLUMNS) + 1 and set(lines[1]) <= set("|-:")
    assert lines[2] == "| default | fgd | 94.12 | 0.30 | 94.00 | 10 |"
    assert lines[3] == "| default | bestfit | 88.50 | 0.50 | – | 10 |"
    assert lines[4] == "| gpushare100 | fgd | 92.00 | – | 91.70 | 10 |"
    assert lines[5] == "| gpushare100 | bestfit | – | – | 85.20 | 0 |"


def test_matrix_markdown_escapes_pipes_and_missing_keys() -> None:
    md = matrix_markdown([{"a": "x|y"}], ["a", "b"])
    assert md.strip().split("\n")[2] == "| x\\|y | – |"


def test_plot_matrix(tmp_path: Path) -> None:
    path = tmp_path / "m.png"
    plot_matrix(path, ROWS)
    assert_png(path)
    empty = tmp_path / "e.png"
    plot_matrix(empty, [])
    assert empty.read_bytes().startswith(PNG_SIGNATURE)


def test_matrix_plot_starts_at_zero_and_names_the_pod_lists() -> None:
    import matplotlib.pyplot as plt

    # as `corral sim matrix` writes its rows: the pod list under pod_list
    rows = [{**{k: v for k, v in r.items() if k != "workload"}, "pod_list": r["workload"]} for r in ROWS]
    fig = matrix_figure(rows)
    try:
        ax = fig.axes[0]
        low, high = ax.get_ylim()
        assert low == 0.0 and high >= 100.0
        assert "%" in ax.get_ylabel()
        assert "default" in ax.get_title() and "gpushare100" in ax.get_title()
        assert [t.get_text() for t in ax.get_xticklabels()] == ["default", "gpushare100"]
    finally:
        plt.close(fig)


def test_write_matrix_report(tmp_path: Path) -> None:
    rows = [*ROWS, {**ROWS[0], "workload": EVIL}]
    paths = write_matrix_report(tmp_path, rows, COLUMNS, "Matrix <i>x</i>")
    assert paths == [tmp_path / n for n in ("matrix.csv", "matrix.md", "matrix.png", "matrix.html")]
    assert_png(paths[2])

    with paths[0].open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == COLUMNS
        back = list(reader)
    assert len(back) == len(rows)
    assert back[0]["workload"] == "default" and float(back[0]["alloc_at_100_mean"]) == 94.123
    assert back[1]["published_alloc_at_100"] == ""
    assert back[2]["alloc_at_100_std"] == ""
    assert back[4]["workload"] == EVIL

    md = paths[1].read_text(encoding="utf-8")
    assert md.startswith("# Matrix <i>x</i>\n\n| workload |")
    assert "| alloc_at_100_mean (%) |" in md
    assert md.count("\n|") == 2 + len(rows)

    parsed = assert_self_contained(paths[3], images=1)
    assert parsed.rows[0][2:] == ["alloc_at_100_mean (%)", "alloc_at_100_std (%)", "published_alloc_at_100 (%)",
                                  "seeds (runs)"]  # fmt: skip
    page = paths[3].read_text(encoding="utf-8")
    assert "94.12" in page and "–" in page
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "Matrix &lt;i&gt;x&lt;/i&gt;" in page
