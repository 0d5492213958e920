"""The simulator's reports (`corral sim ... --out DIR`) that the administrator shows on the dashboard:
`corral serve --reports DIR`.

Every `.html` file under DIR (at most MAX_DEPTH folders down, MAX_REPORTS files) is listed by its path relative to
DIR. A path asked for is served only if it is one of those: a plain file under DIR once links are resolved, so
neither `..` nor a link out of DIR reaches anything else. The reports are self-contained (images inlined as data:
URIs, no scripts); the dashboard shows them in an `<iframe sandbox>`, and they are served with a CSP that lets them
load nothing and run nothing (REPORT_CSP), so a report from an untrusted trace cannot act for the viewer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MAX_DEPTH = 3
MAX_REPORTS = 500
#: A report's size limit: the simulator's reports with their inlined plots are well under 10 MiB.
MAX_REPORT_BYTES = 32 * 1024 * 1024
#: What a report may do: draw its inline styles and data: images; no scripts, no requests, no forms, framed only by
#: the dashboard itself, in a sandbox even when opened directly.
REPORT_CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'self'; sandbox"
)


@dataclass(frozen=True)
class Report:
    path: str  # relative to the reports folder, with "/"
    size: int
    modified: float


def _inside(root: Path, path: Path) -> bool:
    try:
        path.resolve().relative_to(root)
    except (ValueError, OSError):
        return False
    return True


def list_reports(folder: Path) -> list[Report]:
    """The reports under `folder`, by path."""
    root = folder.resolve()
    found: list[Report] = []
    for current, dirs, files in os.walk(root, followlinks=False):
        depth = len(Path(current).relative_to(root).parts)
        if depth >= MAX_DEPTH:
            dirs[:] = []
        dirs.sort()
        for name in sorted(files):
            if not name.lower().endswith(".html"):
                continue
            path = Path(current) / name
            if not _inside(root, path) or not path.is_file():
                continue
            st = path.stat()
            found.append(Report(path.relative_to(root).as_posix(), st.st_size, st.st_mtime))
            if len(found) >= MAX_REPORTS:
                return sorted(found, key=lambda r: r.path)
    return sorted(found, key=lambda r: r.path)


def find_report(folder: Path, wanted: str) -> Path | None:
    """The file of report `wanted` (a path from list_reports), None for anything that is not one."""
    for report in list_reports(folder):
        if report.path == wanted:
            path = (folder.resolve() / report.path).resolve()
            return path if path.stat().st_size <= MAX_REPORT_BYTES else None
    return None
