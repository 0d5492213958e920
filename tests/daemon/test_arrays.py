"""Job arrays (issue 26, item 2): `--array 0-99%8`, `1,3,5-7`, `0-99:2`; each task's variables; `%N`; addressing
`ID`, `ID_TASK`, `ID_[RANGE]`; arrays in dependencies; hold, release and update of an array.

In-process: the API over a daemon core with the fake executor and a test clock (tests/api/test_read_views.py's Box,
4 simulated H100s), so each task ends when the test says. Every message is checked word for word.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from corral.jobs import array
from corral.jobs.model import JobSpec, JobState
from corral.model.errors import InvalidRequest
from corral.model.resources import Request
from corral.store import MemoryStore
from corral.store.sqlite import SqliteStore
from tests.api.test_api import ALICE
from tests.api.test_read_views import Box


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


def states(box: Box, ids: list[str]) -> list[str]:
    out = []
    for job_id in ids:
        job = box.store.get(job_id)
        assert job is not None
        out.append(job.state.value)
    return out


def refused(box: Box, body: dict[str, Any], peer: tuple[int, int, str] = ALICE) -> dict[str, Any]:
    r = box.client(peer).post("/v1/jobs", json={"command": ["x"], **body})
    assert r.status_code == 422, r.text
    return dict(r.json()["detail"])


def launched_env(box: Box, job_id: str) -> dict[str, str]:
    specs = [s for s in box.fake.launched if s.job_id == job_id]
    assert specs, f"job {job_id} was not launched"
    return dict(specs[-1].env)


# ------------------------------------------------------------------------------------------------ the words
def test_parse_reads_slurms_forms() -> None:
    a = array.parse("0-99%8")
    assert (a.count, a.first, a.last, a.step, a.throttle, a.text) == (100, 0, 99, 1, 8, "0-99%8")
    b = array.parse("1,3,5-7")
    assert b.tasks == (1, 3, 5, 6, 7) and b.step == 1 and b.throttle == 0
    c = array.parse("0-99:2")
    assert c.tasks == tuple(range(0, 100, 2)) and c.step == 2 and c.count == 50
    assert array.parse(" 3, 1,1-2 ").tasks == (1, 2, 3)  # sorted, each once, spaces dropped


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0-999999999", "task id 999999999 is above the highest task id, 4,000,000"),
        ("0-3999999", "0-3999999 has more than 100,000 tasks (at most 100,000 an array)"),
        ("0-99999,100000-200000", "0-99999,100000-200000 has more than 100,000 tasks (at most 100,000 an array)"),
        ("", "empty: give 0-99, 1,3,5-7, 0-99:2 (a step), with %N to run at most N at once"),
        (
            "a-b",
            "'a-b' is not a task id or range: give 0-99, 1,3,5-7, 0-99:2 (a step), with %N to run at most N at once",
        ),
        ("5-1", "5-1: the range ends before it starts"),
        ("0-9:0", "0-9:0: the step must be 1..4,000,000"),
        ("0-9%0", "%0: at most 1..100,000 tasks at once"),
        ("0-9%x", "%x: after % give how many tasks may run at once (a number)"),
    ],
)
def test_bad_arrays_are_422s_naming_the_field_and_the_bound(box: Box, text: str, message: str) -> None:
    assert refused(box, {"array": text}) == {"field": "array", "message": message}


def test_an_array_of_a_billion_tasks_is_refused_at_once(box: Box) -> None:
    assert refused(box, {"array": "0-4000000:1,0-4000000:1"}) == {
        "field": "array",
        "message": "0-4000000:1,0-4000000:1 has more than 100,000 tasks (at most 100,000 an array)",
    }
    assert box.store.list() == []


def test_refs() -> None:
    assert array.parse_ref("12") == array.Ref("12", None, "12")
    assert array.parse_ref("12_7") == array.Ref("12", (7,), "12_7")
    r = array.parse_ref("12_[1-3,7]")
    assert r.tasks == (1, 2, 3, 7) and r.is_range
    with pytest.raises(InvalidRequest, match="'12_x' is not a job id"):
        array.parse_ref("12_x")


# ------------------------------------------------------------------------------------------------ submission
def test_an_array_is_one_submission_of_consecutive_jobs_each_with_its_variables(box: Box) -> None:
    r = box.client().post("/v1/jobs", json={"command": ["x"], "array": "1,3,5-7", "name": "sweep"})
    assert r.status_code == 201, r.text
    head = r.json()
    first = int(head["id"])
    assert (head["array_job_id"], head["array_task_id"], head["array"]) == (str(first), 1, "1,3,5-7")
    jobs = box.store.list()
    assert [j.id for j in jobs] == [str(first + i) for i in range(5)]
    assert [array.ids_of(j) for j in jobs] == [(str(first), t) for t in (1, 3, 5, 6, 7)]
    assert all(j.spec.name == "sweep" for j in jobs)
    box.tick()  # 4 starts a round
    box.tick()
    env = launched_env(box, str(first + 3))
    assert {k: v for k, v in env.items() if "ARRAY" in k} == {
        "CORRAL_ARRAY_JOB_ID": str(first),
        "CORRAL_ARRAY_TASK_ID": "6",
        "CORRAL_ARRAY_TASK_COUNT": "5",
        "CORRAL_ARRAY_TASK_MIN": "1",
        "CORRAL_ARRAY_TASK_MAX": "7",
        "CORRAL_ARRAY_TASK_STEP": "1",
    }


def test_slurm_names_for_a_job_from_an_sbatch_script() -> None:
    spec = JobSpec(
        ("x",), Request(cpu_milli=1000), "alice", 1000, 1000, array=array.ArrayTask("12", 4, array.parse("0-8:2"))
    )
    assert array.environment(spec)["CORRAL_ARRAY_TASK_STEP"] == "2"
    assert "SLURM_ARRAY_JOB_ID" not in array.environment(spec)
    # batch adds `script` to the spec (its dialect says #SBATCH or #CORRAL); read whichever shape it has
    sbatch = dataclasses.replace(spec)
    object.__setattr__(sbatch, "script", {"text": "#!/bin/sh\n", "dialect": "sbatch"})
    env = array.environment(sbatch)
    assert {k: v for k, v in env.items() if k.startswith("SLURM_")} == {
        "SLURM_ARRAY_JOB_ID": "12",
        "SLURM_ARRAY_TASK_ID": "4",
        "SLURM_ARRAY_TASK_COUNT": "5",
        "SLURM_ARRAY_TASK_MIN": "0",
        "SLURM_ARRAY_TASK_MAX": "8",
        "SLURM_ARRAY_TASK_STEP": "2",
    }
    corral = dataclasses.replace(spec)
    object.__setattr__(corral, "script", {"text": "#!/bin/sh\n", "dialect": "corral"})
    assert not any(k.startswith("SLURM_") for k in array.environment(corral))


def test_ids_of_for_output_patterns() -> None:
    spec = JobSpec(
        ("x",), Request(cpu_milli=1000), "alice", 1000, 1000, array=array.ArrayTask("12", 4, array.parse("0-8"))
    )
    assert array.ids_of(spec) == ("12", 4)
    assert array.ids_of(dataclasses.replace(spec, array=None)) == (None, None)
    assert array.ids_of({"array_job_id": "12", "array_task_id": 4}) == ("12", 4)
    assert array.ids_of({"array_job_id": "", "array_task_id": None}) == (None, None)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_the_store_keeps_an_array_compactly_and_reads_it_back(tmp_path: Path, kind: str) -> None:
    spec = JobSpec(
        ("python", "sweep.py"), Request(cpu_milli=1000), "alice", 1000, 1000, name="sweep", env={"BIG": "x" * 4000},
        array=array.ArrayTask("", 0, array.parse("0-999")),
    )  # fmt: skip
    store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "jobs.db")
    single = store.add(dataclasses.replace(spec, array=None), 1.0)
    jobs = store.add_array(spec, 2.0)
    assert [j.id for j in jobs] == [str(int(single.id) + 1 + i) for i in range(1000)]
    assert jobs[7].spec.array == array.ArrayTask(jobs[0].id, 7, array.parse("0-999"))
    if isinstance(store, SqliteStore):
        store.close()
        store = SqliteStore(tmp_path / "jobs.db")
        # the spec once, each task a stub of a few bytes: 4 KB of environment is not written 1,000 times
        import sqlite3

        conn = sqlite3.connect(tmp_path / "jobs.db")
        sizes = conn.execute("SELECT MAX(LENGTH(spec)) FROM jobs WHERE id > ?", (int(single.id),)).fetchone()
        assert sizes[0] < 100
    again = store.list([JobState.QUEUED])
    assert [j.spec for j in again[1:]] == [j.spec for j in jobs]
    assert store.get(jobs[999].id) == jobs[999]
    # a task's spec written whole (a hold) reads back the same
    held = store.update(jobs[3].id, spec=dataclasses.replace(jobs[3].spec, held_by="alice"))
    assert store.get(jobs[3].id) == held and held.spec.array == jobs[3].spec.array


# ------------------------------------------------------------------------------------------------ %N
def test_the_throttle_keeps_at_most_n_tasks_running(box: Box) -> None:
    first = int(box.submit(array="0-9%2"))
    ids = [str(first + i) for i in range(10)]
    box.tick()
    assert states(box, ids).count("running") == 2
    box.tick()
    assert states(box, ids).count("running") == 2
    reason = box.store.get(ids[5])
    assert reason is not None and reason.reason == (
        f"waiting for its array's throttle: array {first} runs at most 2 tasks at once (%2), 2 running"
    )
    box.fake.finish(ids[0], 0)
    box.tick()
    assert states(box, ids)[:4] == ["succeeded", "running", "running", "queued"]
    for i in range(1, 10):
        box.fake.finish(ids[i], 0)
        box.tick()
    box.tick()
    assert states(box, ids) == ["succeeded"] * 10


def test_throttle_is_pure_and_single_jobs_pass() -> None:
    assert array.throttle_reason("7", 1, 1) == (
        "waiting for its array's throttle: array 7 runs at most 1 task at once (%1), 1 running"
    )
