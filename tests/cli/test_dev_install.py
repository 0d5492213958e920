"""dev.py's install: the `corral` command runs corral.cli.fast without pip's wrapper and its `import re` (about 7 ms
of CPU of a `corral submit`), and an editable install is a plain path entry, not an import finder run at every start
(issue 26, item 7)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]

PIPS = """#!/some/venv/bin/python
# -*- coding: utf-8 -*-
import re
import sys
from corral.cli.fast import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""


def dev() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dev", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_command_pip_wrote_is_written_lean(tmp_path: Path) -> None:
    script = tmp_path / "corral"
    script.write_text(PIPS)
    dev().lean_script(script)
    text = script.read_text()
    assert text.startswith("#!/some/venv/bin/python\n")
    assert "import re" not in text and "from corral.cli.fast import main" in text


def test_a_command_for_another_entry_is_left_as_pip_wrote_it(tmp_path: Path) -> None:
    script = tmp_path / "corral"
    script.write_text(PIPS.replace("corral.cli.fast", "corral.cli.main"))
    dev().lean_script(script)
    assert script.read_text() == PIPS.replace("corral.cli.fast", "corral.cli.main")
    dev().lean_script(tmp_path / "absent")  # nothing to do, no error


def test_the_lean_command_submits_on_the_fast_path_without_re(tmp_path: Path) -> None:
    from tests.cli.test_fast import FakeDaemon, http

    script = tmp_path / "corral"
    script.write_text(PIPS.replace("/some/venv/bin/python", sys.executable))
    dev().lean_script(script)
    daemon = FakeDaemon(tmp_path / "s", [http("201 Created", b'{"id": "7"}')])
    try:
        done = subprocess.run(
            [sys.executable, "-S", "-X", "importtime", str(script), "submit", "--", "true"],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT), "CORRAL_SOCKET": str(tmp_path / "s")},
        )  # fmt: skip
    finally:
        daemon.close()
    assert (done.returncode, done.stdout) == (0, "7\n"), done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    assert "corral.cli.fast" in imported
    assert not imported & {"re", "click", "typing", "dataclasses"}


def test_the_editable_install_is_a_path_entry() -> None:
    """setuptools writes a plain .pth line (the checkout) for a package-dir of "" = ".", not its finder."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["tool"]["setuptools"]["package-dir"] == {"": "."}
    assert config["project"]["scripts"]["corral"] == "corral.cli.fast:main"
