"""The real-user tests' own machinery (tests/daemon/realusers.py): a checkout, or a venv's python, that other users
cannot reach (a clone under /root, a venv linked into root's pyenv) is run through a view they can, and where none
can be made the test says why: a skip on a developer's machine, a failure under CI=true."""

from __future__ import annotations

import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon import realusers
from tests.daemon.realusers import NEEDS_ROOT, PROBE, ROOT, Reach, Unreachable, build_view, can_run, interpreters, probe


@pytest.fixture
def traversable() -> Iterator[Path]:
    """A folder other users may traverse (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="corral-view-test-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(not can_run(), reason=NEEDS_ROOT)
def test_a_checkout_and_python_others_cannot_reach_run_through_a_view(tmp_path: Path, traversable: Path) -> None:
    hidden = tmp_path / "hidden"  # under root's private tmp, and private itself
    hidden.mkdir(mode=0o700)
    for part in ("corral", "tests"):
        shutil.copytree(ROOT / part, hidden / "checkout" / part, ignore=shutil.ignore_patterns("__pycache__"))
    (hidden / "bin").mkdir()
    python = hidden / "bin" / "python"
    python.symlink_to(Path(sys.executable).resolve())

    before = probe(str(python), hidden / "checkout")
    assert before == f"{python}: Permission denied"

    view = build_view(hidden / "checkout", Path(sysconfig.get_paths()["purelib"]), [str(python), *interpreters()],
                      traversable)  # fmt: skip
    assert view.root == traversable / "src" and view.python == str(traversable / "venv" / "bin" / "python")
    assert probe(view.python, view.root) is None
    # the test's argv, this process's python and files, mapped onto the view
    assert view.argv([*PROBE, "sock", "post"]) == [view.python, str(view.root / "tests/daemon/trust_probe.py"),
                                                   "sock", "post"]  # fmt: skip


@pytest.mark.skipif(not can_run(), reason=NEEDS_ROOT)
def test_a_view_without_an_interpreter_others_can_run_names_what_was_tried(tmp_path: Path, traversable: Path) -> None:
    hidden = tmp_path / "python"
    hidden.symlink_to(Path(sys.executable).resolve())
    (tmp_path / "site").mkdir()
    with pytest.raises(Unreachable, match=f"^{hidden}: {traversable}/venv/bin/python: Permission denied$"):
        build_view(ROOT, tmp_path / "site", [str(hidden)], traversable)


def test_a_checkout_nobody_else_can_run_skips_here_and_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realusers, "_reach", Unreachable("/x/python: Permission denied"))
    said = "other users cannot run this checkout's python: /x/python: Permission denied"
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=said):
        realusers.reach()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=said):
        realusers.reach()


def test_a_reachable_checkout_is_used_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    here = Reach(sys.executable, ROOT)
    monkeypatch.setattr(realusers, "_reach", here)
    assert realusers.user_env()["PYTHONPATH"] == str(ROOT)
    assert here.argv([*PROBE, "x"]) == [*PROBE, "x"]
