"""MPS control: one private MPS control daemon per GPU, so shares of a GPU get enforced compute and memory limits.

    start(uuid)  CUDA_VISIBLE_DEVICES=<uuid> CUDA_MPS_PIPE_DIRECTORY=<state>/mps/<uuid>/pipe
                 CUDA_MPS_LOG_DIRECTORY=<state>/mps/<uuid>/log  nvidia-cuda-mps-control -d
    clients      set the same CUDA_MPS_PIPE_DIRECTORY, plus CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
                 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (the executor does this from the grant)
    stop(uuid)   echo quit | nvidia-cuda-mps-control  (same environment)

The GPU's compute mode is left as it is (a real H200 showed a private daemon works in the default mode). MPS serves
one Unix user per GPU at a time: clients of a second user wait until the first user's server has exited.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from corral.model.errors import CorralError

CONTROL = "nvidia-cuda-mps-control"


class MpsError(CorralError):
    pass


class MpsControl:
    def __init__(self, root: Path, binary: str = CONTROL) -> None:
        self.root = root
        self.binary = binary
        self.running: set[str] = set()

    def available(self) -> bool:
        return shutil.which(self.binary) is not None

    def pipe_dir(self, uuid: str) -> Path:
        return self.root / uuid / "pipe"

    def _env(self, uuid: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            CUDA_VISIBLE_DEVICES=uuid,
            CUDA_MPS_PIPE_DIRECTORY=str(self.pipe_dir(uuid)),
            CUDA_MPS_LOG_DIRECTORY=str(self.root / uuid / "log"),
        )
        return env

    def start(self, uuid: str) -> Path:
        """Start the control daemon for one GPU (idempotent); returns the pipe directory clients must use."""
        if uuid in self.running:
            return self.pipe_dir(uuid)
        if not self.available():
            raise MpsError(f"{self.binary} not found: GPU shares cannot be enforced with MPS on this machine")
        for sub in ("pipe", "log"):
            (self.root / uuid / sub).mkdir(parents=True, exist_ok=True)
        for folder in (self.root, self.root / uuid, self.pipe_dir(uuid), self.root / uuid / "log"):
            folder.chmod(0o755)  # jobs of any user reach the pipes (the daemon's umask is 077)
        done = subprocess.run(  # umask 022: the pipes it creates must be reachable by jobs of any user
            [self.binary, "-d"], env=self._env(uuid), capture_output=True, text=True, timeout=30, umask=0o022
        )
        said = f"{done.stdout} {done.stderr}".lower()
        if done.returncode != 0 and "already running" in said:
            # a daemon of a previous corral serve (its jobs were re-adopted): keep using it
            self.running.add(uuid)
            return self.pipe_dir(uuid)
        if done.returncode != 0:
            raise MpsError(f"could not start MPS for {uuid}: {(done.stderr or done.stdout).strip() or done.returncode}")
        self.running.add(uuid)
        return self.pipe_dir(uuid)

    def stop(self, uuid: str) -> None:
        if uuid not in self.running:
            return
        subprocess.run([self.binary], input="quit\n", env=self._env(uuid), capture_output=True, text=True, timeout=30)
        self.running.discard(uuid)

    def stop_all(self) -> None:
        for uuid in sorted(self.running):
            self.stop(uuid)
