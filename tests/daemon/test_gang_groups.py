"""Gang groups in the scheduling pass (a Marathon app's instances with corral.gang): jobs sharing
`JobSpec.gang_group` start together or not at all, once all `gang_size` of them are queued."""

from __future__ import annotations

from dataclasses import replace

from corral.daemon.scheduler import schedule
from corral.jobs.model import Job, JobSpec, JobState, spec_from_json, spec_to_json
from corral.model.resources import Allocation, GpuBehavior, GpuGrant, Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig
from tests.builders import cluster, node

CONFIG = PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)


def member(jid: int, group: str = "", size: int = 0, t: float = 0.0) -> Job:
    req = Request(cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=1000)
    spec = JobSpec(("true",), req, "alice", 1000, 1000, gang_group=group, gang_size=size)
    return Job(str(jid), spec, JobState.QUEUED, submitted_at=t)


def box(gpus: int, held: int = 0) -> ClusterSnapshot:
    s = cluster(node("box").gpus(gpus).cpu(32).mem(128))
    for i in range(held):
        s.allocate(Allocation(f"other{i}", "box", 0, 0, 0, (GpuGrant(i, 1000, 80 * 1024),)))
    return s


def test_a_group_that_fits_starts_whole_each_member_on_its_own_gpu() -> None:
    plan = schedule(box(4), [member(i, "/web#1", 3, t=i) for i in (1, 2, 3)], CONFIG, 10)
    assert sorted(s.job_id for s in plan.starts) == ["1", "2", "3"]
    assert sorted(g for s in plan.starts for g in s.allocation.gpu_indices) == [0, 1, 2]


def test_a_group_that_does_not_fit_whole_starts_none_and_is_the_head() -> None:
    s = box(4, held=2)
    jobs = [member(i, "/web#1", 3, t=i) for i in (1, 2, 3)]
    plan = schedule(s, jobs, CONFIG, 10, ends={"other0": 100.0, "other1": 200.0})
    assert plan.starts == []
    assert s.gpu_full_free[0] == 2  # nothing granted
    assert {plan.waiting[j.id][:33] for j in jobs} == {"gang: 2 of 3 instances fit (the a"}
    assert "instance 3: 0/1 nodes fit" in plan.waiting["1"]
    assert plan.reservation is not None and plan.reservation.job_id == "1"  # booked for 3 GPUs
    assert len(plan.reservation.allocation.gpu_indices) == 3


def test_a_group_waits_until_all_its_members_are_queued() -> None:
    plan = schedule(box(4), [member(1, "/web#1", 3), member(2, "/web#1", 3)], CONFIG, 10)
    assert plan.starts == [] and plan.placements == 0
    assert plan.waiting == dict.fromkeys(("1", "2"), "gang: 2 of 3 instances queued; they start together once all are")


def test_other_jobs_are_placed_as_before_around_a_waiting_group() -> None:
    jobs = [member(1, "/web#1", 3, t=1), member(2, "/web#1", 3, t=2), member(3, "/web#1", 3, t=3), member(4, t=4)]
    plan = schedule(box(4, held=2), jobs, CONFIG, 10)  # no expected ends: no reservation holds job 4 back
    assert [s.job_id for s in plan.starts] == ["4"]


def test_the_group_is_stored_only_when_set() -> None:
    plain = member(1).spec
    assert "gang" not in spec_to_json(plain)
    grouped = replace(plain, gang_group="/web#7", gang_size=3)
    assert spec_from_json(spec_to_json(grouped)) == grouped
