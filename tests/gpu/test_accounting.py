"""Each running job's GPU use from the daemon's samples (corral.gpu.accounting): the mean utilisation and the peak
memory of what NVML said, a failed sample never counted twice, what an unknown process list means for a whole GPU
and for a share, and the made-up figures of simulated GPUs, marked as such."""

from __future__ import annotations

from corral.gpu.accounting import UsageMeter, simulated_sample
from corral.gpu.metrics import GpuUse
from corral.jobs.model import Job, JobSpec, JobState
from corral.jobs.usage import Usage
from corral.model.resources import GpuDevice, GpuGrant, Node, Request

REAL = Node("n", 64000, 512 * 1024, tuple(GpuDevice(i, "H100", 81920, f"GPU-{i}") for i in range(4)))
SIM = Node("s", 64000, 512 * 1024, tuple(GpuDevice(i, "H100", 81920, f"SIM-GPU-0-{i}") for i in range(4)))


def job(job_id: str, node: Node, *grants: GpuGrant, state: JobState = JobState.RUNNING) -> Job:
    spec = JobSpec(
        ("true",), Request(cpu_milli=1000, gpu_count=len(grants), gpu_milli=1000 if grants else 0), "alice", 1000, 1000
    )
    uuids = tuple(node.gpus[g.index].uuid for g in grants)
    return Job(job_id, spec, state, submitted_at=0.0, started_at=0.0, gpus=grants, gpu_uuids=uuids)


def use(
    util: int | None, jobs: dict[str, int] | None = None, *, used: int | None = None, unknown: bool = False
) -> GpuUse:
    return GpuUse(jobs=dict(jobs or {}), utilization_pct=util, used_mib=used, unknown=unknown)


def test_mean_utilisation_and_peak_memory_over_the_samples() -> None:
    meter = UsageMeter(REAL, every_s=1.0)
    two = job("7", REAL, GpuGrant(0, 1000, 81920), GpuGrant(1, 1000, 81920))
    meter.observe([two], {"GPU-0": use(80, {"7": 1000}), "GPU-1": use(60, {"7": 3000})}, now=10.0)
    meter.observe([two], {"GPU-0": use(20, {"7": 5000}), "GPU-1": use(40, {"7": 500})}, now=11.0)
    assert meter.usage_of(two) == Usage(samples=2, gpu_util_pct=50.0, gpu_mem_peak_mib=5500, simulated=False)


def test_a_gangs_shares_of_one_gpu_count_its_figures_once() -> None:
    meter = UsageMeter(REAL, every_s=1.0)
    gang = job("5", REAL, GpuGrant(0, 500, 40960), GpuGrant(0, 500, 40960), GpuGrant(1, 300, 10240))
    meter.observe([gang], {"GPU-0": use(80, {"5": 7000}), "GPU-1": use(20, used=500, unknown=True)}, now=1.0)
    assert meter.usage_of(gang) == Usage(1, 50.0, 7000, False)  # GPU 0 once; GPU 1's memory unknown (a share)


def test_a_sample_not_taken_is_not_counted_again_and_rounds_in_between_are_skipped() -> None:
    meter = UsageMeter(REAL, every_s=1.0)
    one = job("7", REAL, GpuGrant(0, 1000, 81920))
    sample = {"GPU-0": use(90, {"7": 100})}
    meter.observe([one], sample, now=10.0)
    meter.observe([one], {"GPU-0": use(0, {"7": 1})}, now=10.5)  # within a second of the last: not a sample
    meter.observe([one], sample, now=12.0)  # the same attribution again: NVML failed in between
    meter.observe([one], {}, now=13.0)  # nothing known
    assert meter.usage_of(one) == Usage(1, 90.0, 100, False)


def test_unknown_processes_a_whole_gpu_is_its_holders_a_share_is_unknown() -> None:
    meter = UsageMeter(REAL, every_s=1.0)
    whole = job("1", REAL, GpuGrant(0, 1000, 81920))
    share = job("2", REAL, GpuGrant(1, 300, 10240))
    other = job("3", REAL, GpuGrant(2, 1000, 81920))
    meter.observe(
        [whole, share, other],
        {
            "GPU-0": use(70, used=40000, unknown=True),
            "GPU-1": use(30, used=9000, unknown=True),
            "GPU-2": use(None, {"9": 100}),  # listed, and none of its processes: it holds nothing there
        },
        now=1.0,
    )
    assert meter.usage_of(whole) == Usage(1, 70.0, 40000, False)
    assert meter.usage_of(share) == Usage(1, 30.0, None, False)  # the GPU's utilisation; its memory unknown
    assert meter.usage_of(other) == Usage(1, None, 0, False)


def test_jobs_without_gpus_or_samples_and_jobs_that_left_have_no_usage() -> None:
    meter = UsageMeter(REAL, every_s=1.0)
    cpu = job("1", REAL)
    fresh = job("2", REAL, GpuGrant(0, 1000, 81920))
    assert meter.usage_of(cpu) is None and meter.usage_of(fresh) is None
    meter.observe([fresh], {"GPU-0": use(50, {"2": 10})}, now=1.0)
    assert meter.usage_of(fresh) is not None
    meter.observe([], {"GPU-0": use(50)}, now=2.0)  # back in the queue (preempted): its attempt's figures go
    assert meter.usage_of(fresh) is None
    starting = job("3", REAL, GpuGrant(1, 1000, 81920), state=JobState.STARTING)
    meter.observe([starting], {"GPU-1": use(99, {"3": 5})}, now=3.0)
    assert meter.usage_of(starting) is None  # not running yet: its GPU's figures are not its own


def test_simulated_gpus_give_steady_made_up_figures_marked_simulated() -> None:
    meter = UsageMeter(SIM, every_s=1.0)
    one = job("42", SIM, GpuGrant(0, 1000, 81920))
    for t in range(10):
        meter.observe([one], {}, now=float(t))
    usage = meter.usage_of(one)
    assert usage is not None and usage.simulated and usage.samples == 10
    assert usage.gpu_util_pct is not None and 30 <= usage.gpu_util_pct <= 95
    assert usage.gpu_mem_peak_mib == simulated_sample(one, one.gpus, {0: 81920}, 0)[1]
    assert 0.4 * 81920 <= usage.gpu_mem_peak_mib <= 0.9 * 81920
    again = UsageMeter(SIM)
    for t in range(10):
        again.observe([one], {}, now=float(t))
    assert again.usage_of(one) == usage  # the same job, the same figures
    short = job("43", SIM, GpuGrant(1, 500, 40960))
    made = UsageMeter(SIM).usage_of(short)  # ended before its first sample: one made-up sample
    assert made is not None and made.samples == 1 and made.simulated
    assert made.gpu_mem_peak_mib is not None and made.gpu_mem_peak_mib <= 40960
