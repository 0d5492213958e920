"""Dependencies between ordinary jobs (issue 26, item 3): `--dependency afterok:ID[:ID],afterany:ID,afternotok:ID,
after:ID,singleton` and `--kill-on-invalid-dep`.

In-process: the API over a daemon core with the fake executor and a test clock (tests/api/test_read_views.py's Box,
4 simulated H100s), so each job ends when the test says, with the exit code it says. Every reason and explain story
is checked word for word. The same through the real CLI with real `sleep` and `false`:
tests/cli/test_dependencies_live.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.cli.views import show_lines
from corral.daemon.core import Daemon
from corral.executor.fake import FakeExecutor
from corral.gpu.simulated import parse_simulated_inventory
from corral.jobs import dependency
from corral.jobs.dependency import Dependency, Kind
from corral.jobs.model import JobSpec, JobState
from corral.model.errors import InvalidRequest
from corral.model.resources import Request
from corral.placement import PlacementConfig
from corral.store.sqlite import SqliteStore
from tests.api.test_api import ALICE, BOB, ROOT
from tests.api.test_read_views import Box

NEVER_TAIL = "; it waits until cancelled (submit with --kill-on-invalid-dep to have such a job cancelled)"


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


def state(box: Box, job_id: str) -> JobState:
    job = box.store.get(job_id)
    assert job is not None
    return job.state


def reason(box: Box, job_id: str) -> str:
    job = box.store.get(job_id)
    assert job is not None
    return job.reason


def refused(box: Box, body: dict[str, Any], peer: tuple[int, int, str] = ALICE) -> dict[str, Any]:
    r = box.client(peer).post("/v1/jobs", json={"command": ["x"], **body})
    assert r.status_code == 422, r.text
    return dict(r.json()["detail"])


# ------------------------------------------------------------------------------------------------ the words
def test_parse_reads_slurms_text_and_writes_it_back() -> None:
    deps = dependency.parse("afterok:3:4, afterany:5,afternotok:6,after:7,singleton")
    assert deps == (
        Dependency(Kind.AFTEROK, ("3", "4")),
        Dependency(Kind.AFTERANY, ("5",)),
        Dependency(Kind.AFTERNOTOK, ("6",)),
        Dependency(Kind.AFTER, ("7",)),
        Dependency(Kind.SINGLETON),
    )
    assert dependency.text(deps) == "afterok:3:4,afterany:5,afternotok:6,after:7,singleton"
    assert dependency.parse("") == () and dependency.parse("AFTEROK:3:3") == (Dependency(Kind.AFTEROK, ("3",)),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("afterfoo:1", "unknown kind 'afterfoo:1': give afterok:ID[:ID...], afterany:ID, afternotok:ID, after:ID or "
         "singleton"),
        ("aftercorr:1", "unknown kind 'aftercorr:1': give afterok:ID[:ID...], afterany:ID, afternotok:ID, after:ID "
         "or singleton"),
        ("afterok", "afterok needs a job id (afterok:ID)"),
        ("afterok:", "afterok needs a job id (afterok:ID)"),
        ("afterok:abc", "afterok: 'abc' is not a job id (a number such as 12)"),
        ("afterok:0", "afterok: '0' is not a job id (a number such as 12)"),
        ("afterok:-1", "afterok: '-1' is not a job id (a number such as 12)"),
        ("after:3+10", "after:3+10: a delay after the job (+minutes) is not supported"),
        ("afterok:1?afterany:2", "'?' (any one of them) is not supported: every clause must hold (join with ',')"),
        ("singleton:3", "singleton takes no job ids"),
        ("afterok:" + ":".join(str(i) for i in range(1, 1003)), "at most 1000 job ids in all"),
    ],
)  # fmt: skip
def test_bad_dependencies_are_422s_naming_the_field(box: Box, text: str, message: str) -> None:
    assert refused(box, {"dependency": text}) == {"field": "dependency", "message": message}
    assert box.client(ALICE).get("/v1/jobs").json() == []  # nothing was made


def test_a_huge_dependency_text_is_refused_before_it_is_read(box: Box) -> None:
    detail = refused(box, {"dependency": "afterok:1:" + "1" * 20_000})
    assert detail["field"] == "dependency" and "16384 characters" in detail["message"]


def test_a_dependency_only_on_jobs_the_submitter_can_see(box: Box) -> None:
    """Decided: users may depend on their own jobs, root on anyone's (Slurm allows any job its user can see; a user
    here sees only their own). An id that does not exist and another user's id get the same answer, so the answer
    tells nothing of other users' jobs."""
    bobs = box.submit(BOB)
    mine = box.submit(ALICE)
    for job_id in (bobs, "999"):
        assert refused(box, {"dependency": f"afterok:{mine}:{job_id}"}) == {
            "field": "dependency",
            "message": f"no job {job_id} that you can see (a job may depend on your own jobs; root's on anyone's)",
        }
    roots = box.submit(ROOT, dependency=f"afterok:{bobs}:{mine}")
    job = box.client(ROOT).get(f"/v1/jobs/{roots}").json()
    assert job["dependency"] == f"afterok:{bobs}:{mine}"


def test_singleton_needs_a_name(box: Box) -> None:
    assert refused(box, {"dependency": "singleton"}) == {
        "field": "dependency",
        "message": "singleton needs a name (--name): one job of that name and user runs at a time",
    }


# ------------------------------------------------------------------------------------------------ the round
def test_afterok_waits_for_success_then_starts(box: Box) -> None:
    first = box.submit()
    second = box.submit(dependency=f"afterok:{first}")
    box.tick()
    assert state(box, first) is JobState.RUNNING and state(box, second) is JobState.QUEUED
    assert reason(box, second) == f"waiting for its dependency: job {first} (afterok) is queued"  # as the round began
    box.tick()
    assert reason(box, second) == f"waiting for its dependency: job {first} (afterok) is running"
    explained = box.explain(second)
    assert explained["story"] == f"It waits for its dependency (afterok:{first}): job {first} (afterok) is running."
    assert explained["position"] is None  # not in the queue's order yet
    box.fake.finish(first, 0)
    box.tick()
    assert state(box, second) is JobState.RUNNING


def test_afterok_on_a_failed_job_waits_for_ever_and_says_so(box: Box) -> None:
    first = box.submit()
    second = box.submit(dependency=f"afterok:{first}")
    box.tick()
    box.fake.finish(first, 3)
    box.tick()
    box.tick()
    assert state(box, second) is JobState.QUEUED
    never = f"its dependency can never be met: job {first} failed (afterok needs it to succeed)"
    assert reason(box, second) == never + NEVER_TAIL
    assert box.explain(second)["story"] == (
        f"It waits for its dependency (afterok:{first}): job {first} failed (afterok needs it to succeed). It can "
        "never start: cancel it (a job submitted with --kill-on-invalid-dep is cancelled by the daemon)."
    )


def test_kill_on_invalid_dep_cancels_it_and_its_own_dependents_in_one_round(box: Box) -> None:
    first = box.submit()
    second = box.submit(dependency=f"afterok:{first}", kill_on_invalid_dep=True)
    third = box.submit(dependency=f"afterok:{second}", kill_on_invalid_dep=True)
    box.tick()
    box.client(ALICE).post(f"/v1/jobs/{first}/cancel")
    box.tick()
    assert state(box, first) is JobState.CANCELLED
    assert state(box, second) is JobState.CANCELLED and state(box, third) is JobState.CANCELLED
    assert reason(box, second) == (
        f"cancelled: its dependency can never be met: job {first} was cancelled (afterok needs it to succeed) "
        "(--kill-on-invalid-dep)"
    )
    assert reason(box, third) == (
        f"cancelled: its dependency can never be met: job {second} was cancelled (afterok needs it to succeed) "
        "(--kill-on-invalid-dep)"
    )


def test_afternotok_afterany_and_after(box: Box) -> None:
    ok, bad = box.submit(), box.submit()
    on_ok_fail = box.submit(dependency=f"afternotok:{ok}", kill_on_invalid_dep=True)
    on_bad_fail = box.submit(dependency=f"afternotok:{bad}")
    on_any = box.submit(dependency=f"afterany:{ok}:{bad}")
    box.tick()
    box.tick()
    assert (
        reason(box, on_any)
        == f"waiting for its dependency: job {ok} (afterany) is running; job {bad} (afterany) is running"
    )
    box.fake.finish(ok, 0)
    box.fake.finish(bad, 1)
    box.tick()
    assert state(box, on_ok_fail) is JobState.CANCELLED
    assert reason(box, on_ok_fail) == (
        f"cancelled: its dependency can never be met: job {ok} succeeded (afternotok needs it to fail) "
        "(--kill-on-invalid-dep)"
    )
    assert state(box, on_bad_fail) is JobState.RUNNING and state(box, on_any) is JobState.RUNNING


def test_after_waits_for_the_start_only(box: Box) -> None:
    big = box.submit(gpus=4)
    blocker = box.submit(gpus=4)  # waits for the first to end
    follower = box.submit(dependency=f"after:{blocker}")
    box.tick()
    assert reason(box, follower) == f"waiting for its dependency: job {blocker} (after) has not started"
    box.fake.finish(big, 0)
    box.tick()
    assert state(box, blocker) is JobState.RUNNING
    box.tick()
    assert state(box, follower) is JobState.RUNNING


def test_a_failure_with_retries_left_has_not_ended(box: Box) -> None:
    first = box.submit(retries=1)
    second = box.submit(dependency=f"afterok:{first}", kill_on_invalid_dep=True)
    box.tick()
    box.fake.finish(first, 1)
    box.tick()
    assert state(box, first) is JobState.QUEUED and state(box, second) is JobState.QUEUED
    assert reason(box, second) == f"waiting for its dependency: job {first} (afterok) is queued"
    box.clock.t += 10  # past the retry's back-off
    box.tick()
    box.fake.finish(first, 0)
    box.tick()
    assert state(box, second) is JobState.RUNNING


def test_singleton_runs_one_job_of_a_name_at_a_time(box: Box) -> None:
    a = box.submit(name="train", dependency="singleton")
    b = box.submit(name="train", dependency="singleton")
    other = box.submit(name="eval", dependency="singleton")
    bobs = box.submit(BOB, name="train", dependency="singleton")
    box.tick()
    box.tick()
    assert [state(box, i) for i in (a, b, other, bobs)] == [
        JobState.RUNNING, JobState.QUEUED, JobState.RUNNING, JobState.RUNNING
    ]  # fmt: skip
    assert reason(box, b) == f"waiting for its dependency: job {a} (singleton: same user and name) is running"
    assert box.explain(b)["story"] == (
        f"It waits for its dependency (singleton): job {a} (singleton: same user and name) is running."
    )
    box.fake.finish(a, 1)  # however it ends
    box.tick()
    assert state(box, b) is JobState.RUNNING


def test_show_lists_the_dependency(box: Box) -> None:
    first = box.submit()
    second = box.submit(dependency=f"afterok:{first},afterany:{first}", kill_on_invalid_dep=True)
    job = box.client(ALICE).get(f"/v1/jobs/{second}").json()
    assert (job["dependency"], job["kill_on_invalid_dep"]) == (f"afterok:{first},afterany:{first}", True)
    assert ("dependency", f"afterok:{first},afterany:{first} (cancelled if it can never be met)") in show_lines(job)


def test_dependencies_survive_a_restart(tmp_path: Path) -> None:
    node = parse_simulated_inventory("4xH100-80GB")[0]
    path = tmp_path / "jobs.db"
    store = SqliteStore(path)
    daemon = Daemon(store, FakeExecutor(), node, PlacementConfig(), tmp_path)

    def spec(deps: str = "", kill: bool = False) -> JobSpec:
        return JobSpec(("x",), Request(cpu_milli=1000, memory_mib=1024), "alice", 1000, 1000, name="n",
                       dependency=dependency.parse(deps), kill_on_invalid_dep=kill)  # fmt: skip

    first = daemon.submit(spec())
    second = daemon.submit(spec(f"afterok:{first.id},singleton", kill=True))
    store.close()
    store = SqliteStore(path)
    again = Daemon(store, FakeExecutor(), node, PlacementConfig(), tmp_path)
    job = store.get(second.id)
    assert job is not None and job.spec.dependency == second.spec.dependency and job.spec.kill_on_invalid_dep
    again.tick()
    again.tick()
    assert store.get(first.id).state is JobState.RUNNING  # type: ignore[union-attr]
    assert store.get(second.id).reason == (  # type: ignore[union-attr]
        f"waiting for its dependency: job {first.id} (afterok) is running; job {first.id} (singleton: same user and "
        "name) is running"
    )
    store.close()


def test_a_job_with_no_visible_dependency_is_refused_by_the_core_too(tmp_path: Path) -> None:
    node = parse_simulated_inventory("4xH100-80GB")[0]
    daemon = Daemon(SqliteStore(tmp_path / "j.db"), FakeExecutor(), node, PlacementConfig(), tmp_path)
    spec = JobSpec(("x",), Request(cpu_milli=1000, memory_mib=1024), "alice", 1000, 1000,
                   dependency=dependency.parse("afterany:7"))  # fmt: skip
    with pytest.raises(InvalidRequest, match="dependency: no job 7 that you can see"):
        daemon.submit(spec)
