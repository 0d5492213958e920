"""Container jobs: the runtime's `run` line built at launch from the granted GPUs, checked with a fake runtime."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from corral.executor.container import container_command
from corral.model.errors import InvalidRequest


def run_with_fake(tmp_path: Path, runtime: str, env: dict[str, str], pass_env: tuple[str, ...] = ()) -> list[str]:
    """Run the container command with a fake `docker`/`podman` on PATH that prints its arguments, one a line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / runtime
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    argv, extra = container_command(runtime, "pytorch:24.01", ("python", "-c", "print('a b')"), pass_env)
    full = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CORRAL_JOB_ID": "7", **extra, **env}
    done = subprocess.run(argv, env=full, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_docker_gets_the_granted_gpus_by_uuid(tmp_path: Path) -> None:
    args = run_with_fake(tmp_path, "docker", {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b", "HF_HOME": "/h"}, ("HF_HOME",))
    assert args == [
        "run", "--rm", "--init", "--name", "corral-job-7", "--gpus", "device=GPU-a,GPU-b",
        "-e", "CORRAL_JOB_ID", "-e", "HF_HOME", "pytorch:24.01", "python", "-c", "print('a b')",
    ]  # fmt: skip


def test_no_gpu_means_no_gpu_in_the_container(tmp_path: Path) -> None:
    args = run_with_fake(tmp_path, "docker", {"CUDA_VISIBLE_DEVICES": ""})
    assert "--gpus" not in args and args[args.index("NVIDIA_VISIBLE_DEVICES=void") - 1] == "-e"


def test_podman_uses_cdi_and_mps_shares_mount_the_pipe(tmp_path: Path) -> None:
    env = {
        "CUDA_VISIBLE_DEVICES": "GPU-a",
        "CUDA_MPS_PIPE_DIRECTORY": "/state/mps/GPU-a/pipe",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
    }
    args = run_with_fake(tmp_path, "podman", env)
    assert args[args.index("--device") + 1] == "nvidia.com/gpu=GPU-a"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in args and "CUDA_MPS_PIPE_DIRECTORY" in args
    assert args[args.index("-v") + 1] == "/state/mps/GPU-a/pipe:/state/mps/GPU-a/pipe" and "--ipc=host" in args


@pytest.mark.parametrize(
    ("runtime", "image", "env", "field"),
    [("lxc", "x", (), "container_runtime"), ("docker", "", (), "image"), ("docker", "a b", (), "image"),
     ("docker", "--privileged", (), "image"), ("docker", "x", ("A;rm",), "env"), ("docker", "x", ("1A",), "env")],
)  # fmt: skip
def test_bad_input_names_the_field(runtime: str, image: str, env: tuple[str, ...], field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        container_command(runtime, image, ("true",), env)
    assert info.value.field == field


def test_the_script_is_plain_posix_sh() -> None:
    argv, _ = container_command("docker", "x", ("true",))
    assert subprocess.run(["sh", "-n", "-c", argv[2]], check=False).returncode == 0
    assert os.path.exists(argv[0])
