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
from click.testing import CliRunner

from corral.cli import client
from corral.executor.local import job_environment
from corral.jobs import array
from corral.jobs.model import Change, JobSpec, JobState
from corral.model.errors import InvalidRequest
from corral.model.resources import Request
from corral.store import MemoryStore
from corral.store.sqlite import SqliteStore
from tests.api.test_api import ALICE, BOB, ROOT
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
    """The environment the local executor gives the job (what a real process would get)."""
    specs = [s for s in box.fake.launched if s.job_id == job_id]
    assert specs, f"job {job_id} was not launched"
    return job_environment(specs[-1])


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
    # a task held (with its history) reads back the same; changed otherwise (a new name), its spec is written whole
    change = Change(3.0, "alice", "held", "no", "yes")
    held = store.update(jobs[3].id, spec=dataclasses.replace(jobs[3].spec, held_by="alice", history=(change,)))
    renamed = store.update(jobs[4].id, spec=dataclasses.replace(jobs[4].spec, name="other"))
    assert store.get(jobs[3].id) == held and held.spec.array == jobs[3].spec.array
    if isinstance(store, SqliteStore):
        store.close()
        store = SqliteStore(tmp_path / "jobs.db")
        assert store.get(held.id) == held and store.get(renamed.id) == renamed
        sizes = dict(
            conn.execute("SELECT id, LENGTH(spec) FROM jobs WHERE id IN (?, ?)", (int(held.id), int(renamed.id)))
        )
        assert sizes[int(held.id)] < 200 and sizes[int(renamed.id)] > 4000


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


# ------------------------------------------------------------------------------------------------ addressing
def submit_array(box: Box, text: str, peer: tuple[int, int, str] = ALICE, **body: Any) -> list[str]:
    """The ids of the array's tasks, in task order."""
    first = int(box.submit(peer, array=text, **body))
    return [str(first + i) for i in range(array.parse(text).count)]


def test_show_a_task_an_array_and_refusals(box: Box) -> None:
    ids = submit_array(box, "0-4", gpus=4)
    a = ids[0]
    api = box.client()
    task = api.get(f"/v1/jobs/{a}_3").json()
    assert (task["id"], task["array_task_id"], task["array_tasks"]) == (ids[3], 3, None)
    whole = api.get(f"/v1/jobs/{a}").json()
    assert whole["id"] == a and whole["array_tasks"] == {"queued": 5}
    assert api.get(f"/v1/jobs/{a}_[1-2]").json()["detail"] == {
        "field": "job",
        "message": f"{a}_[1-2] names 2 tasks: give one (ID_TASK), or list them with GET /v1/jobs?array={a}_[1-2]",
    }
    missing = api.get(f"/v1/jobs/{a}_9")
    assert missing.status_code == 404
    assert missing.json()["detail"]["message"] == f"no job {a}_9 (the tasks of array {a}: 0-4)"
    other = box.client(BOB).get(f"/v1/jobs/{a}_3")
    assert other.status_code == 404 and other.json()["detail"]["message"] == f"no job {a}_3"
    single = box.submit()
    bad = api.get(f"/v1/jobs/{single}_0")
    assert bad.json()["detail"]["message"] == f"no job {single}_0 ({single} is not a job array)"
    assert api.get("/v1/jobs/12_x").json()["detail"] == {
        "field": "job",
        "message": "'12_x' is not a job id (12), a task (12_7) or a range of tasks (12_[1-5])",
    }
    listed = api.get("/v1/jobs", params={"array": f"{a}_[1-3]", "fields": "id,array_task_id"}).json()
    assert listed == [{"id": ids[t], "array_task_id": t} for t in (1, 2, 3)]
    paged = api.get("/v1/jobs", params={"array": a, "limit": 2})
    assert [j["id"] for j in paged.json()] == ids[:2] and paged.headers["X-Corral-Next-After"] == ids[1]
    nxt = api.get("/v1/jobs", params={"array": a, "limit": 2, "after": ids[1]}).json()
    assert [j["id"] for j in nxt] == ids[2:4]


def test_cancel_an_array_a_task_or_a_range(box: Box) -> None:
    ids = submit_array(box, "0-5")
    a = ids[0]
    api = box.client()
    box.tick()  # 4 start
    one = api.post(f"/v1/jobs/{a}_5/cancel")
    assert one.json()["state"] == "cancelled"
    some = api.post(f"/v1/jobs/{a}_[0-1]/cancel")
    assert some.headers["X-Corral-Changed"] == "2"
    assert some.json()["array_tasks"] == {"running": 2}  # being cancelled: they end when their processes do
    box.tick()
    assert states(box, ids) == ["cancelled", "cancelled", "running", "running", "running", "cancelled"]
    rest = api.post(f"/v1/jobs/{a}/cancel")
    assert rest.headers["X-Corral-Changed"] == "3" and rest.json()["array_tasks"] == {"cancelled": 3, "running": 3}
    box.tick()
    assert states(box, ids) == ["cancelled"] * 6
    bulk = submit_array(box, "0-1")
    done = api.post("/v1/jobs/cancel", json={"ids": [bulk[0], f"{a}_[9]", "7_x"]}).json()
    assert done["cancelled"] == bulk and done["not_found"] == [f"{a}_[9]", "7_x"]
    plain, ranged = submit_array(box, "0-2"), submit_array(box, "0-2")
    assert api.post("/v1/jobs/cancel", json={"ids": [plain[0]]}).json()["cancelled"] == plain  # the array
    some = api.post("/v1/jobs/cancel", json={"ids": [f"{ranged[0]}_[0-1]", "99999"]}).json()
    assert some["cancelled"] == ranged[:2] and some["not_found"] == ["99999"]  # its first task is not the array


def test_explain_an_array_names_its_counts_and_its_first_waiting_task(box: Box) -> None:
    ids = submit_array(box, "0-9%2")
    a = ids[0]
    box.tick()
    box.tick()
    story = box.explain(a)["story"]
    assert story.startswith(
        f"Array {a}: 10 tasks: 8 queued, 2 running. Task {a}_2 (job {ids[2]}) is queued: waiting for its array's "
        f"throttle: array {a} runs at most 2 tasks at once (%2), 2 running"
    )
    assert box.explain(f"{a}_0")["state"] == "running"


def test_hold_release_and_update_an_array_change_its_waiting_tasks(box: Box) -> None:
    ids = submit_array(box, "0-5", gpus=1)
    a = ids[0]
    api = box.client()
    box.tick()  # 4 start, 2 wait
    held = api.post(f"/v1/jobs/{a}/hold")
    assert held.status_code == 200 and held.headers["X-Corral-Changed"] == "2"
    waiting = [box.store.get(i) for i in ids[4:]]
    assert all(j is not None and j.spec.held_by == "alice" for j in waiting)
    assert waiting[0] is not None and waiting[0].reason == f"held by alice (corral release {ids[4]})"
    for i in ids[:4]:
        box.fake.finish(i, 0)
    box.tick()
    assert states(box, ids)[4:] == ["queued", "queued"]  # held: not started on free GPUs
    changed = api.patch(f"/v1/jobs/{a}_[4-5]", json={"priority": 7})
    assert changed.headers["X-Corral-Changed"] == "2"
    task = box.store.get(ids[5])
    assert task is not None and task.spec.request.priority == 7 and task.spec.array is not None
    assert task.spec.array.task == 5 and [c.field for c in task.spec.history] == ["held", "priority"]
    too_high = api.patch(f"/v1/jobs/{a}", json={"priority": 1000})
    assert too_high.status_code == 403
    released = api.post(f"/v1/jobs/{a}/release")
    assert released.headers["X-Corral-Changed"] == "2"
    box.tick()
    assert states(box, ids)[4:] == ["running", "running"]
    assert box.client(BOB).post(f"/v1/jobs/{a}/hold").status_code == 404
    root = box.client(ROOT).post(f"/v1/jobs/{a}/hold")
    assert root.headers["X-Corral-Changed"] == "0"  # none waits any more


# ------------------------------------------------------------------------------------------------ the CLI
def cli(box: Box, monkeypatch: pytest.MonkeyPatch, command: Any, *args: str) -> Any:
    """Run a CLI command with its requests sent to the in-process daemon (as alice)."""
    api = box.client()

    def call(
        _socket: Any, method: str, url: str, describe: Any = None, *, params: Any = None, json: Any = None, **_: Any
    ) -> Any:
        answer = api.request(method, url, params=params, json=json)
        if answer.status_code >= 400:
            raise client.fail((describe or client.error_text)(answer))
        return answer

    monkeypatch.setattr(client, "call", call)
    return CliRunner().invoke(command, list(args))


def test_cli_submit_ps_and_expand(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    done = cli(box, monkeypatch, client.submit_cmd, "--array", "0-5%2", "--name", "sweep", "--", "python", "t.py")
    assert done.exit_code == 0, done.output
    a = done.stdout.strip()
    single = box.submit()
    box.tick()
    table = cli(box, monkeypatch, client.ps_cmd)
    lines = [line.split() for line in table.stdout.splitlines()[1:]]
    assert [line[0] for line in lines] == [f"{a}_[0-5%2]", single]
    assert " ".join(lines[0][3:8]) == "4 queued, 2 running -"  # and GPUS "-"
    expanded = cli(box, monkeypatch, client.ps_cmd, "--expand")
    assert [line.split()[0] for line in expanded.stdout.splitlines()[1:]] == [f"{a}_{t}" for t in range(6)] + [single]
    some = cli(box, monkeypatch, client.ps_cmd, "--array", f"{a}_[4-5]")
    assert [line.split()[0] for line in some.stdout.splitlines()[1:]] == [f"{a}_4", f"{a}_5"]
    refused = cli(box, monkeypatch, client.submit_cmd, "--array", "0-999999999", "--", "x")
    assert refused.exit_code == 2
    assert refused.stderr == "error: --array: task id 999999999 is above the highest task id, 4,000,000\n"


def test_cli_show_cancel_hold_release_update_of_an_array(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = submit_array(box, "0-3", gpus=4)
    a = ids[0]
    box.tick()
    shown = cli(box, monkeypatch, client.show_cmd, a)
    assert f"      array: {a} (--array 0-3): 4 tasks: 3 queued, 1 running\n" in shown.stdout
    task = cli(box, monkeypatch, client.show_cmd, f"{a}_2")
    assert f"      array: task {a}_2 of array {a} (--array 0-3)\n" in task.stdout and f"id: {ids[2]}\n" in task.stdout
    held = cli(box, monkeypatch, client.hold_cmd, a)
    assert held.stdout == f"array {a}: 3 waiting tasks held (corral release {a}); 4 tasks: 3 queued, 1 running\n"
    updated = cli(box, monkeypatch, client.update_cmd, f"{a}_[1-2]", "--name", "renamed")
    assert updated.stdout.startswith(f"array {a}_[1-2]: 2 waiting tasks updated (") and "renamed" in updated.stdout
    released = cli(box, monkeypatch, client.release_cmd, a)
    assert released.stdout == f"array {a}: 3 held tasks released\n"
    one = cli(box, monkeypatch, client.cancel_cmd, f"{a}_3")
    assert one.stdout == f"job {ids[3]}: cancelled (cancelled)\n"
    rest = cli(box, monkeypatch, client.cancel_cmd, a)
    assert rest.stdout == f"array {a}: 3 tasks cancelled or being cancelled; 4 tasks: 1 running, 3 cancelled\n"


def test_cli_logs_and_wait_of_an_array(box: Box, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ids = submit_array(box, "0-1")
    a = ids[0]
    box.tick()
    (tmp_path / "logs").mkdir(exist_ok=True)
    for k, job_id in enumerate(ids):
        (tmp_path / "logs" / f"{job_id}.log").write_text(f"task {k}\n")
    logs = cli(box, monkeypatch, client.logs_cmd, a)
    assert logs.stdout == f"==> {a}_0 <==\ntask 0\n==> {a}_1 <==\ntask 1\n"
    assert cli(box, monkeypatch, client.logs_cmd, f"{a}_1").stdout == "task 1\n"
    follow = cli(box, monkeypatch, client.logs_cmd, "-f", a)
    assert follow.exit_code == 2 and follow.stderr == (
        f"error: --follow: {a} is a job array: follow one task's log (corral logs -f {a}_TASK)\n"
    )
    late = cli(box, monkeypatch, client.wait_cmd, "--timeout", "0", a)
    assert late.exit_code == 124 and late.stderr == f"error: array {a}: 2 tasks: 2 running, after 0 s\n"
    box.fake.finish(ids[0], 0)
    box.fake.finish(ids[1], 3)
    box.tick()
    failed = cli(box, monkeypatch, client.wait_cmd, a)
    assert failed.exit_code == 3
    assert failed.stderr == f"array {a}: 2 tasks: 1 succeeded, 1 failed; task {a}_1 failed: exit code 3\n"
    assert cli(box, monkeypatch, client.wait_cmd, f"{a}_[0]").exit_code == 0


# ------------------------------------------------------------------------------------------------ dependencies
def dep_reason(box: Box, job_id: str) -> str:
    job = box.store.get(job_id)
    assert job is not None
    return job.reason


def test_afterok_on_an_array_waits_for_every_task(box: Box) -> None:
    ids = submit_array(box, "0-2")
    a = ids[0]
    after = box.submit(dependency=f"afterok:{a}")
    any_of = box.submit(dependency=f"afterany:{a}")
    box.tick()
    box.tick()
    assert dep_reason(box, after) == f"waiting for its dependency: array {a} (afterok): 0 of its 3 tasks ended"
    for i in ids[:2]:
        box.fake.finish(i, 0)
    box.tick()
    assert dep_reason(box, after) == f"waiting for its dependency: array {a} (afterok): 2 of its 3 tasks ended"
    assert box.explain(after)["story"] == (
        f"It waits for its dependency (afterok:{a}): array {a} (afterok): 2 of its 3 tasks ended."
    )
    box.fake.finish(ids[2], 0)
    box.tick()
    box.tick()
    assert states(box, [after, any_of]) == ["running", "running"]


def test_afterok_on_an_array_can_never_be_met_once_a_task_failed(box: Box) -> None:
    ids = submit_array(box, "0-2")
    a = ids[0]
    after = box.submit(dependency=f"afterok:{a}")
    notok = box.submit(dependency=f"afternotok:{a}")
    box.tick()
    box.fake.finish(ids[1], 4)
    box.tick()
    assert dep_reason(box, after) == (
        f"its dependency can never be met: array {a}: task {a}_1 failed (afterok needs every task to succeed); it "
        "waits until cancelled (submit with --kill-on-invalid-dep to have such a job cancelled)"
    )
    assert dep_reason(box, notok) == f"waiting for its dependency: array {a} (afternotok): 1 of its 3 tasks ended"
    box.fake.finish(ids[0], 0)
    box.fake.finish(ids[2], 0)
    box.tick()
    box.tick()
    assert states(box, [after, notok]) == ["queued", "running"]


def test_afternotok_on_an_array_that_all_succeeded_never_holds_and_a_task_is_a_job(box: Box) -> None:
    ids = submit_array(box, "5-6")
    a = ids[0]
    notok = box.submit(dependency=f"afternotok:{a}")
    task = box.submit(dependency=f"afterok:{a}_6")
    started = box.submit(dependency=f"after:{a}")
    box.tick()
    box.tick()
    assert dep_reason(box, task) == f"waiting for its dependency: job {a}_6 (afterok) is running"
    assert states(box, [started]) == ["running"]
    box.fake.finish(ids[1], 0)
    box.tick()
    box.tick()
    assert states(box, [task]) == ["running"]
    box.fake.finish(ids[0], 0)
    box.tick()
    assert dep_reason(box, notok).startswith(
        f"its dependency can never be met: array {a}: every task succeeded (afternotok needs one to fail)"
    )


def test_a_dependency_on_a_task_or_array_you_cannot_see_is_refused(box: Box) -> None:
    ids = submit_array(box, "0-2")
    a = ids[0]
    message = "no job {} that you can see (a job may depend on your own jobs; root's on anyone's)"
    for ref in (f"{a}_7", f"{a}_1"):
        peer = ALICE if ref.endswith("7") else BOB
        assert refused(box, {"dependency": f"afterok:{ref}"}, peer) == {
            "field": "dependency",
            "message": message.format(ref),
        }
    assert refused(box, {"dependency": f"afterok:{a}"}, BOB)["message"] == message.format(a)
    assert box.client(ROOT).post("/v1/jobs", json={"command": ["x"], "dependency": f"afterok:{a}_1"}).status_code == 201


def test_a_retried_array_submission_answers_the_same_array(box: Box) -> None:
    api = box.client()
    key = {"Idempotency-Key": "sweep-1"}
    first = api.post("/v1/jobs", json={"command": ["x"], "array": "0-9"}, headers=key)
    again = api.post("/v1/jobs", json={"command": ["x"], "array": "0-9"}, headers=key)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"] and len(box.store.list()) == 10
    other = api.post("/v1/jobs", json={"command": ["x"], "array": "0-8"}, headers=key)
    assert other.status_code == 409


def test_an_id_no_job_can_have_is_still_no_job(box: Box) -> None:
    api = box.client()
    for method, url in (("POST", "/v1/jobs/abc/cancel"), ("POST", "/v1/jobs/abc/hold"), ("GET", "/v1/jobs/0")):
        r = api.request(method, url)
        assert (r.status_code, r.json()["detail"]["message"]) == (404, "no job abc" if "abc" in url else "no job 0")


def test_explain_a_task_held_back_by_the_throttle(box: Box) -> None:
    ids = submit_array(box, "0-2%1")
    box.tick()
    box.tick()
    data = box.explain(f"{ids[0]}_2")
    assert data["reason"] == (
        f"waiting for its array's throttle: array {ids[0]} runs at most 1 task at once (%1), 1 running"
    )
    assert data["story"] == (
        f"It waits for its array's throttle: at most 1 of its tasks run at once, and 1 runs (corral ps --array "
        f"{ids[0]})."
    )


def test_a_container_task_gets_its_array_variables(tmp_path: Path) -> None:
    from tests.executor.test_container import run_with_fake

    env = {"CUDA_VISIBLE_DEVICES": "", "CORRAL_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_ID": "4", "OTHER": "x"}
    args = run_with_fake(tmp_path, "docker", env)
    passed = [args[i + 1] for i, a in enumerate(args) if a == "-e"]
    assert "CORRAL_ARRAY_TASK_ID" in passed and "SLURM_ARRAY_TASK_ID" in passed and "OTHER" not in passed
