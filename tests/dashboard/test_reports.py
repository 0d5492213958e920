"""The reports folder against a user who may write in it (issue 23, finding 2): the daemon, often root, must serve
nothing but the folder's own plain files, even while a link is swapped in and out under it (the old check-then-open
served /etc/shadow in 128 of 4,482 answers). Both ways of opening are tested: openat2 and the O_NOFOLLOW walk."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.dashboard import reports as reports_module
from corral.dashboard.reports import MAX_DEPTH, ReportsFolder

REAL = b"<!DOCTYPE html><h1>the real report</h1>"
SECRET = b"root:$6$secret-hash:19000:0:99999:7:::\n"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file only root can read, outside the reports folder (the test's /etc/shadow)."""
    path = tmp_path / "shadow"
    path.write_bytes(SECRET)
    os.chown(path, 0, 0)
    path.chmod(0o600)
    return path


@pytest.fixture(params=["openat2", "walk"])
def folder(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReportsFolder]:
    root = tmp_path / "reports"
    (root / "run").mkdir(parents=True)
    (root / "run" / "report.html").write_bytes(REAL)
    opened = ReportsFolder(root, use_openat2=request.param == "openat2")
    yield opened
    opened.close()


def test_openat2_is_what_this_kernel_uses(folder: ReportsFolder) -> None:
    assert folder.read("run/report.html") == REAL
    if folder.use_openat2:
        assert reports_module._openat2.available is True  # Linux >= 5.6: no fallback here


def test_a_link_flipped_in_and_out_during_thousands_of_reads_never_leaks(folder: ReportsFolder, secret: Path) -> None:
    run = folder.folder / "run"
    stop = threading.Event()
    flips = 0

    def flip() -> None:
        # rename() over the name: it always exists, as the real report or as a link to the secret
        nonlocal flips
        while not stop.is_set():
            (run / "link.tmp").symlink_to(secret)
            os.replace(run / "link.tmp", run / "report.html")
            (run / "file.tmp").write_bytes(REAL)
            os.replace(run / "file.tmp", run / "report.html")
            flips += 1

    flipper = threading.Thread(target=flip)
    flipper.start()
    answers: dict[bytes | None, int] = {}
    try:
        for _ in range(5000):
            got = folder.read("run/report.html")
            answers[got] = answers.get(got, 0) + 1
            listed = folder.list()
            assert all(r.path == "run/report.html" for r in listed)
    finally:
        stop.set()
        flipper.join()
    assert flips > 0
    assert set(answers) <= {REAL, None}, [a for a in answers if a not in (REAL, None)]
    assert answers.get(REAL, 0) > 0


def test_only_plain_files_of_one_link_beneath_the_folder_are_served(
    folder: ReportsFolder, secret: Path, tmp_path: Path
) -> None:
    root = folder.folder
    (root / "shadow.html").symlink_to(secret)
    os.link(secret, root / "hard.html")  # root may link anything; a user where fs.protected_hardlinks=0 too
    os.mkfifo(root / "fifo.html")  # would block a plain open() for ever
    (root / "dir.html").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "report.html").write_bytes(SECRET)
    (root / "linked").symlink_to(outside)  # a link to a folder: nothing through it
    deep = root.joinpath(*[f"d{i}" for i in range(MAX_DEPTH + 1)])
    deep.mkdir(parents=True)
    (deep.parent / "ok.html").write_bytes(REAL)
    (deep / "deep.html").write_bytes(REAL)
    for wanted in ("shadow.html", "hard.html", "fifo.html", "dir.html", "linked/report.html", "../shadow",
                   "run/../../shadow", "./run/report.html", "run//report.html", "/etc/passwd", "run/report.html\x00",
                   "run/report.htm", "d0/d1/d2/d3/deep.html", ""):  # fmt: skip
        assert folder.read(wanted) is None, wanted
    listed = [r.path for r in folder.list()]
    assert listed == ["d0/d1/d2/ok.html", "run/report.html"]
    assert all(folder.read(path) == REAL for path in listed)
