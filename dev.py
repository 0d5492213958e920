#!/usr/bin/env python3
"""The project's two commands, runnable on a fresh machine that has only Python and the package registries.

    python3 dev.py run [ARGS...]   install corral into .venv and run `corral ARGS` (default: `corral serve`)
    python3 dev.py test            install corral with its dev tools (and, as root, Debian's chromium for the
                                   dashboard's browser tests), then run ruff, mypy --strict and pytest

`.ci/run` calls `python3 dev.py test`; CI and the README use the same command.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("CORRAL_VENV", ROOT / ".venv"))
BIN = VENV / "bin"
# The main job: the one-machine daemon; on a machine without an NVIDIA driver, with a labelled simulated inventory.
DEFAULT_RUN = ["serve"] if shutil.which("nvidia-smi") else ["serve", "--simulate-gpus", "4xH100-80GB"]


def sh(*cmd: str | Path, env: dict[str, str] | None = None) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    rc = subprocess.call([str(c) for c in cmd], cwd=ROOT, env=env)
    if rc != 0:
        # pytest's "no tests ran" (5) is a failure too: every non-zero code stops here.
        sys.exit(rc)


def together(*cmds: list[str | Path]) -> None:
    """Run `cmds` at once; print each one's output in turn; stop on the first that failed, as `sh` does."""
    running = []
    for cmd in cmds:
        out = tempfile.TemporaryFile()  # noqa: SIM115 - closed below, once read
        running.append((cmd, out, subprocess.Popen([str(c) for c in cmd], cwd=ROOT, stdout=out, stderr=out)))
    failed = 0
    for cmd, out, proc in running:
        rc = proc.wait()
        print("+", " ".join(str(c) for c in cmd), flush=True)
        out.seek(0)
        sys.stdout.buffer.write(out.read())
        sys.stdout.flush()
        out.close()
        failed = failed or rc
    if failed:
        sys.exit(failed)


def ensure_venv(extra: str) -> None:
    stamp = VENV / f".installed-{extra or 'base'}"
    sources = [ROOT / "pyproject.toml"]
    if stamp.exists() and all(stamp.stat().st_mtime >= s.stat().st_mtime for s in sources):
        return
    if not (BIN / "python").exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    target = f".[{extra}]" if extra else "."
    # Editable: a plain path entry in a .pth (pyproject's package-dir), not setuptools' import finder, which cost
    # about 11 ms of every Python start (issue 26, item 7). A venv installed before that change reinstalls here: its
    # stamp is older than pyproject.toml.
    sh(BIN / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", "-e", target)
    lean_script(BIN / "corral")
    stamp.touch()


#: The `corral` command, as pyproject's script names it, without what pip's wrapper adds: its `import re` (for a
#: Windows suffix on argv[0]) costs about 7 ms of CPU, a third of a `corral submit` on the fast path (issue 26, item 7).
LEAN_SCRIPT = """#!{python}
import sys

from corral.cli.fast import main

if __name__ == "__main__":
    sys.exit(main())
"""


def lean_script(script: Path) -> None:
    """Write the venv's `corral` as LEAN_SCRIPT (its interpreter kept), where pip wrote it for corral.cli.fast."""
    try:
        text = script.read_text()
    except OSError:
        return
    first, _, rest = text.partition("\n")
    if not first.startswith("#!") or "from corral.cli.fast import main" not in rest:
        return  # not the entry point this knows: left as pip wrote it
    script.write_text(LEAN_SCRIPT.format(python=first[2:].strip()))


BROWSER = (Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver"))


def ensure_browser() -> None:
    """Debian's chromium and its driver, for the dashboard's browser tests (tests/dashboard): installed with apt where
    they are missing and this runs as root. Where they cannot be, those tests skip, or fail under CI=true."""
    if all(p.exists() for p in BROWSER):
        return
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        print("note: no chromium here and no root apt-get to install it: the dashboard's browser tests cannot run")
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "-q", "--no-install-recommends", "chromium", "chromium-driver"]
    if subprocess.call(install, env=env) != 0:
        subprocess.call([apt, "update", "-q"], env=env)
        subprocess.call(install, env=env)


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in {"run", "test"}:
        print(__doc__)
        sys.exit(2)
    if argv[0] == "run":
        ensure_venv("")
        args = argv[1:] or DEFAULT_RUN
        os.execv(str(BIN / "corral"), [str(BIN / "corral"), *args])
    ensure_venv("dev")
    ensure_browser()
    # ruff, mypy and the placement kernels side by side (each uses one core). The kernels are compiled (about 20 s on
    # a fresh checkout) or loaded from numba's cache once, here, not in whichever test's subprocess happens to import
    # them first, under that test's timeouts.
    together(
        [BIN / "ruff", "check", "corral", "tests", "benchmarks", "dev.py"],
        [BIN / "mypy"],
        [BIN / "python", "-c", "import corral.placement.kernels"],
    )
    # Bytecode is cached (in __pycache__, ignored by git) even where the environment says PYTHONDONTWRITEBYTECODE:
    # without it every xdist worker compiles and assertion-rewrites each test module again (about 8 s of CPU per
    # worker), and every daemon and CLI a test starts compiles corral again.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    sh(BIN / "python", "-m", "pytest", *xdist(argv[1:]), *argv[1:], env=env)


def xdist(args: list[str]) -> list[str]:
    """pytest-xdist's options unless the command line gives its own (`-n 0` runs in one process): two workers per
    core, at most 8 (most tests wait on a daemon, a job or a browser: on 2 cores, 4 workers ran the suite in 228 s,
    2 in 308 s), each module's tests on one worker in order, so that a module-scoped fixture (a live daemon, a
    control plane, a browser) starts once (tests/conftest.py)."""
    if any(a == "-n" or a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist" for a in args):
        return []
    workers = min(2 * len(os.sched_getaffinity(0)), 8)
    return ["-n", str(workers), "--dist", "loadscope"]


if __name__ == "__main__":
    main(sys.argv[1:])
