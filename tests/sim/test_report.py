"""corral.sim.report: every writer produces its files, HTML is escaped, Markdown/CSV tables are well formed."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from corral.sim.report import (
    matrix_markdown,
    plot_curves,
    plot_matrix,
    plot_online,
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
    page = paths[2].read_text(encoding="utf-8")
    assert '<img src="allocation.png"' in page
    assert '<img src="fragmentation.png"' in page
    assert "93.46" in page and "93.456789" not in page
    assert "8152" in page and "fgd" in page
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "run &lt;b&gt;1&lt;/b&gt;" in page and "<b>1</b>" not in page


def test_plot_online(tmp_path: Path) -> None:
    path = tmp_path / "o.png"
    t = [i * 3600.0 for i in range(200)]
    plot_online(
        path, {"fgd": (t, [min(100.0, i * 0.7) for i in range(200)]), "nan": (t[:3], [1.0, math.nan, 2.0])}, "x"
    )
    assert_png(path)


def test_write_online_report(tmp_path: Path) -> None:
    t = [i * 1800.0 for i in range(100)]
    series = {"fgd": (t, [i * 0.9 for i in range(100)]), EVIL: (t, [i * 0.8 for i in range(100)])}
    summaries: dict[str, dict[str, Any]] = {
        "fgd": {"mean_alloc": 71.23456, "failed": 3},
        EVIL: {"mean_alloc": 60.0, "failed": 7, "extra": None},
    }
    paths = write_online_report(tmp_path, summaries, series, "online")
    assert paths == [tmp_path / "online.png", tmp_path / "online.html"]
    assert_png(paths[0])
    page = paths[1].read_text(encoding="utf-8")
    assert '<img src="online.png"' in page
    assert page.count("<tr>") == 3  # header + one row per policy
    assert "<th>mean_alloc</th>" in page and "<th>extra</th>" in page
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
    assert lines[0] == "| " + " | ".join(COLUMNS) + " |"
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
    assert md.count("\n|") == 2 + len(rows)

    page = paths[3].read_text(encoding="utf-8")
    assert '<img src="matrix.png"' in page
    assert "94.12" in page and "–" in page
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "Matrix &lt;i&gt;x&lt;/i&gt;" in page
