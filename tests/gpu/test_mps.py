"""MPS control against a stand-in `nvidia-cuda-mps-control` that records how it was called."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from corral.gpu.mps import MpsControl, MpsError


def stub(tmp_path: Path, exit_code: int = 0) -> Path:
    script = tmp_path / "bin" / "nvidia-cuda-mps-control"
    script.parent.mkdir()
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$* vis=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY '
        f'stdin=$(cat 2>/dev/null | tr -d "\\n")" >> {tmp_path}/calls\n'
        f"exit {exit_code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_start_and_stop_one_daemon_per_gpu(tmp_path: Path) -> None:
    mps = MpsControl(tmp_path / "mps", binary=str(stub(tmp_path)))
    assert mps.available()
    pipe = mps.start("GPU-a")
    assert pipe == tmp_path / "mps" / "GPU-a" / "pipe" and pipe.is_dir()
    assert mps.start("GPU-a") == pipe  # idempotent: no second daemon
    mps.stop_all()
    calls = (tmp_path / "calls").read_text().splitlines()
    root = tmp_path / "mps" / "GPU-a"
    assert calls == [
        f"-d vis=GPU-a pipe={root}/pipe log={root}/log stdin=",
        f" vis=GPU-a pipe={root}/pipe log={root}/log stdin=quit",
    ]
    assert not mps.running


def test_a_daemon_left_by_a_previous_serve_is_reused(tmp_path: Path) -> None:
    script = tmp_path / "bin" / "nvidia-cuda-mps-control"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\necho 'An instance of this daemon is already running' >&2\nexit 1\n")
    script.chmod(0o755)
    mps = MpsControl(tmp_path / "mps", binary=str(script))
    assert mps.start("GPU-a") == tmp_path / "mps" / "GPU-a" / "pipe"
    assert mps.running == {"GPU-a"}


def test_failures_are_clear(tmp_path: Path) -> None:
    with pytest.raises(MpsError, match="nvidia-cuda-mps-control-missing not found: GPU shares cannot be enforced"):
        MpsControl(tmp_path, binary="nvidia-cuda-mps-control-missing").start("GPU-a")
    broken = MpsControl(tmp_path / "mps", binary=str(stub(tmp_path, exit_code=3)))
    with pytest.raises(MpsError, match="could not start MPS for GPU-b"):
        broken.start("GPU-b")
    assert not broken.running
    assert os.path.exists(tmp_path / "calls")
