"""Jobs that name a container image: the command corral runs is the container runtime's `run`.

    container_command("docker", "nvcr.io/nvidia/pytorch:24.01", ("python", "train.py"))
      -> /bin/sh -c SCRIPT corral-container docker IMAGE python train.py
    SCRIPT, at launch (when the executor has set CUDA_VISIBLE_DEVICES to the granted GPUs' UUIDs):
      exec docker run --rm --init --name corral-job-$CORRAL_JOB_ID --gpus '"device=UUID,UUID"' \\
           -e CORRAL_JOB_ID -e CUDA_MPS_... [-e NAME ...] IMAGE python train.py
      no GPU granted: no --gpus at all (and NVIDIA_VISIBLE_DEVICES=void), so the container sees none

The GPUs are decided by the scheduler after submission, so the script reads them from the environment the executor
gives the job; the container process is the job's child in its process group, so cancel and time limits reach
`docker run`, which stops the container (`--init` forwards signals inside). podman takes GPUs through CDI
(`--device nvidia.com/gpu=UUID`). Under MPS the job's pipe directory is mounted at the same path.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.model.errors import InvalidRequest

RUNTIMES = ("docker", "podman")

_SCRIPT = r"""
rt=$1; image=$2; shift 2
set -- "$image" "$@"
gpus=
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  if [ "$rt" = podman ]; then
    old_ifs=$IFS; IFS=,
    for u in $CUDA_VISIBLE_DEVICES; do gpus="$gpus --device nvidia.com/gpu=$u"; done
    IFS=$old_ifs
  else
    gpus="--gpus \"device=$CUDA_VISIBLE_DEVICES\""
  fi
fi
envs="-e CORRAL_JOB_ID"
for name in $(env | sed -n -e 's/^\(CUDA_MPS_[A-Z_]*\)=.*/\1/p' -e 's/^\(CORRAL_ARRAY_[A-Z_]*\)=.*/\1/p' \
  -e 's/^\(SLURM_ARRAY_[A-Z_]*\)=.*/\1/p') $CORRAL_CONTAINER_ENV; do envs="$envs -e $name"; done
mount=
[ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && mount="-v $CUDA_MPS_PIPE_DIRECTORY:$CUDA_MPS_PIPE_DIRECTORY --ipc=host"
[ -z "$gpus" ] && envs="$envs -e NVIDIA_VISIBLE_DEVICES=void"
eval "exec \"\$rt\" run --rm --init --name corral-job-$CORRAL_JOB_ID $gpus $envs $mount \"\$@\""
"""


def container_command(
    runtime: str, image: str, command: Sequence[str], pass_env: Sequence[str] = ()
) -> tuple[tuple[str, ...], dict[str, str]]:
    """The command to launch instead of `command`, and the environment it needs (merge it into the job's).

    `pass_env`: names of the job's environment variables to pass into the container (besides corral's own)."""
    if runtime not in RUNTIMES:
        raise InvalidRequest("container_runtime", f"must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    if not image or any(c.isspace() for c in image) or image.startswith("-"):
        raise InvalidRequest("image", f"not a container image name: {image!r}")
    for name in pass_env:
        if not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise InvalidRequest("env", f"not an environment variable name: {name!r}")
    argv = ("/bin/sh", "-c", _SCRIPT, "corral-container", runtime, image, *command)
    return argv, {"CORRAL_CONTAINER_ENV": " ".join(pass_env)}
