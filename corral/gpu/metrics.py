"""Live GPU use: what each GPU's memory is held by, sampled with NVML, and whose processes those are.

    NvmlSampler.sample() -> {uuid: GpuSample(used MiB, utilisation %, processes [(pid, MiB)] or None if unknown)}
    attribute(sample, jobs by pid, owner_of) -> per GPU: MiB per corral job, MiB held by foreign processes

The daemon uses it twice: memory held by processes corral did not start is taken out of what it grants (so a job
never lands on memory somebody else already fills), and, where MPS does not enforce a share, a watchdog compares each
job's use with its grant. A process is a job's when its environment carries that job's CORRAL_JOB_ID or it sits in
the job's process group; the MPS server corral started for a GPU is corral's too. NVML facts a driver does not
answer (NotSupported, a process whose memory is "not available") are unknown, never zero and never a crash.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from corral.gpu.discovery import GpuDiscoveryError, _Asker, _load_nvml, _text

#: The MPS server's command name as /proc/<pid>/comm shows it (truncated to 15 characters by the kernel).
MPS_SERVER_COMM = "nvidia-cuda-mps"


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_mib: int | None  # None: the driver does not say (e.g. some MPS and container set-ups)


@dataclass(frozen=True)
class GpuSample:
    uuid: str
    used_mib: int | None = None
    utilization_pct: int | None = None
    processes: tuple[GpuProcess, ...] | None = None  # None: the driver cannot list them


class GpuSampler(Protocol):
    def sample(self) -> Mapping[str, GpuSample]:
        """The current use of every GPU, by UUID. Raises GpuDiscoveryError when NVML cannot be used."""
        ...


class NvmlSampler:
    """Keeps NVML initialised between samples (an init costs more than a sample)."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nv = nvml
        self._ready = False

    def _init(self) -> ModuleType:
        nv = self._nv or _load_nvml()
        self._nv = nv
        if not self._ready:
            try:
                nv.nvmlInit()
            except nv.NVMLError as exc:
                raise GpuDiscoveryError(f"NVML is not usable here ({exc}); no NVIDIA driver?") from None
            self._ready = True
        return nv

    def sample(self) -> dict[str, GpuSample]:
        nv = self._init()
        ask = _Asker(nv)
        out: dict[str, GpuSample] = {}
        try:
            count = nv.nvmlDeviceGetCount()
            for i in range(count):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = _text(nv.nvmlDeviceGetUUID(h))
                mem = ask(nv.nvmlDeviceGetMemoryInfo, h)
                util = ask(nv.nvmlDeviceGetUtilizationRates, h)
                out[uuid] = GpuSample(
                    uuid=uuid,
                    used_mib=int(mem.used) // (1 << 20) if mem is not None else None,
                    utilization_pct=int(util.gpu) if util is not None else None,
                    processes=_processes(nv, ask, h),
                )
        except nv.NVMLError as exc:  # the driver went away under us: unknown, and say so
            self.close()
            raise GpuDiscoveryError(f"NVML sample failed: {exc}") from None
        return out

    def close(self) -> None:
        if self._ready and self._nv is not None:
            with contextlib.suppress(self._nv.NVMLError):
                self._nv.nvmlShutdown()
        self._ready = False


def _processes(nv: ModuleType, ask: _Asker, handle: Any) -> tuple[GpuProcess, ...] | None:
    """Compute and graphics processes on one GPU; a process in both lists counts once (its largest figure)."""
    lists = [ask(nv.nvmlDeviceGetComputeRunningProcesses, handle)]
    graphics = getattr(nv, "nvmlDeviceGetGraphicsRunningProcesses", None)
    if graphics is not None:
        lists.append(ask(graphics, handle))
    if all(entries is None for entries in lists):
        return None
    used: dict[int, int | None] = {}
    for entries in lists:
        for p in entries or ():
            mib = _mib(getattr(p, "usedGpuMemory", None))
            pid = int(p.pid)
            previous = used.get(pid)
            used[pid] = mib if previous is None else max(previous, mib or 0)
    return tuple(GpuProcess(pid, mib) for pid, mib in sorted(used.items()))


def _mib(raw: object) -> int | None:
    # NVML reports "not available" as None (nvidia-ml-py) or as the 64-bit all-ones value.
    if not isinstance(raw, int) or raw < 0 or raw >= (1 << 63):
        return None
    return raw // (1 << 20)


# ------------------------------------------------------------------------------------------------ attribution
@dataclass(frozen=True)
class ProcessInfo:
    """What /proc says of a process: its process group, CORRAL_JOB_ID (if readable) and command name."""

    pgrp: int | None
    job_id: str | None
    comm: str


def read_process(pid: int, proc: Path = Path("/proc")) -> ProcessInfo | None:
    """None when there is no such process here (gone, or in another PID namespace)."""
    base = proc / str(pid)
    try:
        stat = (base / "stat").read_text(errors="replace")
    except OSError:
        return None
    pgrp: int | None
    try:
        pgrp = int(stat[stat.rindex(")") + 2 :].split()[2])
    except (ValueError, IndexError):
        pgrp = None
    job_id = None
    with contextlib.suppress(OSError):  # another user's environment is unreadable without root
        for item in (base / "environ").read_bytes().split(b"\0"):
            if item.startswith(b"CORRAL_JOB_ID="):
                job_id = item[len(b"CORRAL_JOB_ID=") :].decode(errors="replace")
                break
    comm = ""
    with contextlib.suppress(OSError):
        comm = (base / "comm").read_text(errors="replace").strip()
    return ProcessInfo(pgrp, job_id, comm)


@dataclass
class GpuUse:
    """One GPU's memory by holder: corral jobs (MiB per job id) and everything else."""

    jobs: dict[str, int] = field(default_factory=dict)
    foreign_mib: int = 0
    foreign_pids: list[int] = field(default_factory=list)
    unknown: bool = False  # the driver could not list processes (or their memory): nothing can be attributed
    used_mib: int | None = None  # the whole GPU's used memory, as NVML counts it
    utilization_pct: int | None = None


def attribute(
    samples: Mapping[str, GpuSample],
    job_of_pgrp: Mapping[int, str],
    jobs: set[str],
    mps_gpus: set[str],
    describe: Callable[[int], ProcessInfo | None] = read_process,
) -> dict[str, GpuUse]:
    """Split each GPU's per-process memory between corral's jobs and foreign processes.

    `job_of_pgrp`: the process group (= leader PID) of each running job; `jobs`: ids of jobs that hold resources
    (a CORRAL_JOB_ID naming any other job is a leftover, hence foreign); `mps_gpus`: UUIDs whose MPS server corral
    runs. A process that /proc cannot show (another PID namespace) counts as foreign: its memory is really in use.
    """
    out: dict[str, GpuUse] = {}
    for uuid, s in samples.items():
        use = GpuUse(used_mib=s.used_mib, utilization_pct=s.utilization_pct)
        out[uuid] = use
        if s.processes is None:
            use.unknown = True
            continue
        for p in s.processes:
            info = describe(p.pid)
            owner = None
            if info is not None:
                if info.job_id in jobs:
                    owner = info.job_id
                elif info.pgrp is not None and info.pgrp in job_of_pgrp:
                    owner = job_of_pgrp[info.pgrp]
                elif info.comm == MPS_SERVER_COMM and uuid in mps_gpus:
                    continue  # corral's own MPS server: its memory serves the jobs' grants
            if p.used_mib is None:
                use.unknown = True
                continue
            if owner is not None:
                use.jobs[owner] = use.jobs.get(owner, 0) + p.used_mib
            else:
                use.foreign_mib += p.used_mib
                use.foreign_pids.append(p.pid)
    return out
