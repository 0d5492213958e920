"""Real-GPU check of MPS-enforced sharing through corral's own executor and MPS control (run on a GPU machine).

Two half-GPU jobs with a 4 GiB memory grant each share GPU 0 under a private MPS daemon: one stays inside its grant
and keeps computing, the other allocates past it and must get CUDA out-of-memory. Then, MPS stopped, a whole-GPU
job runs. Prints one line per job and a summary table.

    PYTHONPATH=. python3 scripts/device_mps_check.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from corral.executor.base import LaunchSpec
from corral.executor.local import LocalExecutor
from corral.gpu.discovery import discover_gpus
from corral.gpu.mps import MpsControl

WORK = Path(os.environ.get("OUT", "/tmp/corral-mps-check"))

INSIDE = """
import time, torch
x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize(); t = time.time(); n = 0
while time.time() - t < 6:
    a @ a; n += 1
torch.cuda.synchronize()
print(f"inside grant: 2 GiB held, {n / (time.time() - t):.1f} matmuls/s, still running after the other job's OOM")
"""

BEYOND = """
import time, torch
x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
print("first 2 GiB: ok", flush=True)
time.sleep(1)
try:
    y = torch.empty(6 * 1024**3, dtype=torch.uint8, device="cuda")
    print("another 6 GiB: ALLOCATED (limit not enforced)")
    raise SystemExit(1)
except torch.cuda.OutOfMemoryError as exc:
    print("another 6 GiB: CUDA out of memory, as the 4 GiB grant requires:", str(exc).splitlines()[0][:100])
"""

WHOLE = """
import time, torch
x = torch.empty(20 * 1024**3, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize(); t = time.time(); n = 0
while time.time() - t < 3:
    a @ a; n += 1
torch.cuda.synchronize()
print(f"whole GPU: 20 GiB allocated, {n / (time.time() - t):.1f} matmuls/s, sees {torch.cuda.device_count()} GPU")
"""


def spec(job_id: str, code: str, uuid: str, milli: int, mem: int, pipe: Path | None) -> LaunchSpec:
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LD_LIBRARY_PATH") if k in os.environ}
    return LaunchSpec(
        job_id=job_id,
        command=(sys.executable, "-c", code),
        env=env,
        cwd="/tmp",
        uid=os.getuid(),
        gid=os.getgid(),
        gpu_uuids=(uuid,),
        gpu_milli=milli,
        gpu_memory_mib=mem,
        log_path=WORK / f"{job_id}.log",
        time_limit_s=180,
        mps_pipe_dir=str(pipe) if pipe else None,
    )


def wait(ex: LocalExecutor, ids: set[str]) -> dict[str, int | None]:
    codes: dict[str, int | None] = {}
    while ids - codes.keys():
        for e in ex.poll():
            codes[e.job_id] = e.exit_code
        time.sleep(0.2)
    return codes


def main() -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    gpu = discover_gpus()[0]
    print(f"GPU 0: {gpu.name} {gpu.uuid} {gpu.memory_total_mib} MiB")
    mps = MpsControl(Path("/tmp/corral-mps"))
    pipe = mps.start(gpu.uuid)
    ex = LocalExecutor(grace_s=5)
    t0 = time.time()
    ex.launch(spec("half-inside", INSIDE, gpu.uuid, 500, 4096, pipe))
    ex.launch(spec("half-beyond", BEYOND, gpu.uuid, 500, 4096, pipe))
    codes = wait(ex, {"half-inside", "half-beyond"})
    mps.stop(gpu.uuid)
    ex.launch(spec("whole", WHOLE, gpu.uuid, 1000, 0, None))
    codes.update(wait(ex, {"whole"}))
    ex.close()
    print(f"\n{'job':<12} {'grant':<22} {'exit':>4}  output")
    grants = {"half-inside": "50 % + 4 GiB (MPS)", "half-beyond": "50 % + 4 GiB (MPS)", "whole": "1 whole GPU"}
    for job in ("half-inside", "half-beyond", "whole"):
        text = (WORK / f"{job}.log").read_text().strip().splitlines()
        print(f"{job:<12} {grants[job]:<22} {codes[job]!s:>4}  {text[-1] if text else '(no output)'}")
    print(f"total {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
