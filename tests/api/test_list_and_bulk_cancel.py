"""A long queue through the API: `GET /v1/jobs` with filters and paging, and `POST /v1/jobs/cancel` (bulk cancel)."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from corral.api.schemas import JobOut, job_columns, job_row
from corral.cli import client
from corral.daemon.core import Daemon
from corral.executor.fake import FakeExecutor
from corral.gpu.simulated import parse_simulated_inventory
from corral.jobs.model import JobSpec, JobState, Preempted
from corral.model.resources import Request
from corral.placement import PlacementConfig
from corral.store import JobQuery, SqliteStore
from tests.api.test_api import ALICE, BOB, ROOT, World, submit


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def ids(r: Any) -> list[str]:
    assert r.status_code == 200, r.text
    return [j["id"] for j in r.json()]


def fill(world: World) -> tuple[TestClient, TestClient, TestClient]:
    """alice: jobs 1-7 (names a, b in turn; 1 and 2 take both GPUs and run), bob: jobs 8-10 (name a)."""
    alice, bob, root = world.client(ALICE), world.client(BOB), world.client(ROOT)
    for i in range(7):
        submit(alice, gpus=1 if i < 2 else 2, name="ab"[i % 2])
    for _ in range(3):
        submit(bob, gpus=2, name="a")
    world.tick()
    return alice, bob, root


def test_list_filters_by_state_name_since_and_user(world: World) -> None:
    alice, bob, root = fill(world)
    assert ids(alice.get("/v1/jobs")) == [str(i) for i in range(1, 8)]  # the default: own jobs, oldest first
    assert ids(alice.get("/v1/jobs", params={"state": "running"})) == ["1", "2"]
    assert ids(alice.get("/v1/jobs", params=[("state", "running"), ("state", "queued")])) == ids(alice.get("/v1/jobs"))
    assert ids(alice.get("/v1/jobs", params={"state": "Queued,running", "name": "a"})) == ["1", "3", "5", "7"]
    assert ids(alice.get("/v1/jobs", params={"since": 0})) == ids(alice.get("/v1/jobs"))
    assert ids(alice.get("/v1/jobs", params={"since": 4e9})) == []
    assert ids(bob.get("/v1/jobs", params={"name": "b"})) == []
    # A user names only themself; root names anyone, or sees all.
    assert ids(bob.get("/v1/jobs", params={"user": "bob"})) == ["8", "9", "10"]
    other = bob.get("/v1/jobs", params={"user": "alice"})
    assert other.status_code == 403
    assert other.json() == {"detail": {"field": "user", "message": "only root can see or cancel other users' jobs"}}
    assert ids(bob.get("/v1/jobs", params={"all": "true"})) == ["8", "9", "10"]  # all=true is root's only
    assert ids(root.get("/v1/jobs")) == [str(i) for i in range(1, 11)]  # root sees everyone's, as squeue does
    assert ids(root.get("/v1/jobs", params={"name": "a", "state": "queued"})) == ["3", "5", "7", "8", "9", "10"]
    assert ids(root.get("/v1/jobs", params={"user": "bob", "order": "newest"})) == ["10", "9", "8"]
    assert ids(root.get("/v1/jobs", params={"all": "true", "name": "a", "state": "queued"})) == [
        "3", "5", "7", "8", "9", "10",
    ]  # fmt: skip


def test_list_pages_with_a_cursor_and_a_default_limit(world: World) -> None:
    alice, _, root = fill(world)
    first = alice.get("/v1/jobs", params={"limit": 3, "order": "newest"})
    assert ids(first) == ["7", "6", "5"] and first.headers["X-Corral-Next-After"] == "5"
    second = alice.get("/v1/jobs", params={"limit": 3, "order": "newest", "after": "5"})
    assert ids(second) == ["4", "3", "2"]
    last = alice.get("/v1/jobs", params={"limit": 3, "order": "newest", "after": second.headers["X-Corral-Next-After"]})
    assert ids(last) == ["1"] and "X-Corral-Next-After" not in last.headers  # a short page is the last
    # The default limit: 1000 jobs, then a cursor.
    for _ in range(1000):
        world.daemon.store.add(JobSpec(("x",), Request(cpu_milli=100), "alice", 1000, 1000), 0.0)
    page = alice.get("/v1/jobs")
    assert len(page.json()) == 1000 and page.headers["X-Corral-Next-After"] == "1003"
    assert len(alice.get("/v1/jobs", params={"after": "1003"}).json()) == 7
    assert len(root.get("/v1/jobs", params={"all": "true", "limit": 10000}).json()) == 1010


def test_a_listing_as_columns_is_the_rows_a_field_at_a_time(world: World) -> None:
    """`layout=columns` (what `corral ps` reads): the rows' fields, each a list of the page's values in order, with
    the same filters, fields, pages (X-Corral-Next-After) and an array's tasks; an empty page has its fields' empty
    lists."""
    alice, _, root = fill(world)
    array = submit(alice, gpus=1, array="0-3", name="arr")["id"]
    world.tick()

    def as_rows(columns: dict[str, list[Any]]) -> list[dict[str, Any]]:
        return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]

    for who, params in (
        (alice, {}),
        (alice, {"fields": client.PS_FIELDS}),
        (alice, {"limit": 3, "order": "newest", "after": "6"}),
        (alice, {"state": "queued", "fields": "state,id"}),
        (alice, {"array": f"{array}_[1-2]", "fields": "id,array_job_id,array_task_id,array"}),
        (root, {"limit": 4}),
        (alice, {"since": 4e9, "fields": "id,reason"}),
    ):
        rows = who.get("/v1/jobs", params=params)
        columns = who.get("/v1/jobs", params={**params, "layout": "columns"})
        assert columns.status_code == 200, columns.text
        assert as_rows(columns.json()) == rows.json()
        assert columns.headers.get("X-Corral-Next-After") == rows.headers.get("X-Corral-Next-After")
        if rows.json():
            assert list(columns.json()) == list(rows.json()[0])
    empty = alice.get("/v1/jobs", params={"since": 4e9, "fields": "id,reason", "layout": "columns"}).json()
    assert empty == {"id": [], "reason": []}
    tasks = alice.get("/v1/jobs", params={"array": array, "fields": "id,array_task_id", "layout": "columns"}).json()
    assert tasks["array_task_id"] == [0, 1, 2, 3]
    bad = alice.get("/v1/jobs", params={"layout": "grid"})
    assert bad.status_code == 422
    assert bad.json() == {"detail": {"field": "layout", "message": "Input should be 'rows' or 'columns'"}}


def test_list_refuses_what_it_cannot_understand(world: World) -> None:
    alice, _, _ = fill(world)
    for params, field in (
        ({"state": "sleeping"}, "state"),
        ({"limit": -1}, "limit"),
        ({"limit": 10001}, "limit"),
        ({"since": "yesterday"}, "since"),
        ({"since": "nan"}, "since"),
        ({"order": "random"}, "order"),
    ):
        r = alice.get("/v1/jobs", params=params)
        assert r.status_code == 422 and r.json()["detail"]["field"] == field, (params, r.text)
    assert "queued, starting, running" in alice.get("/v1/jobs", params={"state": "x"}).json()["detail"]["message"]
    assert ids(alice.get("/v1/jobs", params={"after": "not-an-id"})) == []


def test_bulk_cancel_by_ids_state_and_name(world: World) -> None:
    alice, bob, root = fill(world)
    r = alice.post("/v1/jobs/cancel", json={"ids": ["3", "1", "8", "99", "3"]})
    # 3 was queued: cancelled; 1 runs: signalled; 8 is bob's and 99 does not exist: not found (the same words).
    assert r.status_code == 200 and r.json() == {
        "cancelled": ["3"], "cancelling": ["1"], "ended": [], "not_found": ["8", "99"],
    }  # fmt: skip
    assert [c[0] for c in world.executor.cancelled] == ["1"]
    assert alice.get("/v1/jobs/1").json()["reason"] == "cancel requested"
    assert alice.post("/v1/jobs/cancel", json={"name": "a", "state": "queued"}).json()["cancelled"] == ["5", "7"]
    by_state = alice.post("/v1/jobs/cancel", json={"state": ["queued"]}).json()
    assert by_state["cancelled"] == ["4", "6"]
    assert bob.get("/v1/jobs", params={"state": "queued"}).json() != []  # bob's jobs were not touched
    again = alice.post("/v1/jobs/cancel", json={"ids": ["3"]}).json()
    assert again == {"cancelled": [], "cancelling": [], "ended": ["3"], "not_found": []}
    # Root: any job by id; with a state or name, root's own unless all or user says otherwise.
    assert root.post("/v1/jobs/cancel", json={"state": "queued"}).json()["cancelled"] == []
    assert root.post("/v1/jobs/cancel", json={"ids": ["8"]}).json()["cancelled"] == ["8"]
    assert root.post("/v1/jobs/cancel", json={"state": "queued", "user": "bob"}).json()["cancelled"] == ["9", "10"]
    assert world.wakes >= 6
    world.tick()
    assert [j["state"] for j in alice.get("/v1/jobs", params={"state": "cancelled"}).json()] == ["cancelled"] * 6


def test_bulk_cancel_refuses_an_empty_or_foreign_selection(world: World) -> None:
    alice, bob, _ = fill(world)
    for body, field in (({}, "request"), ({"state": "asleep"}, "state"), ({"ids": "1"}, "ids")):
        r = alice.post("/v1/jobs/cancel", json=body)
        assert r.status_code == 422 and r.json()["detail"]["field"] == field, (body, r.text)
    assert bob.post("/v1/jobs/cancel", json={"state": "queued", "user": "alice"}).status_code == 403
    assert bob.post("/v1/jobs/cancel", json={"state": "queued", "all": True}).json()["cancelled"] == ["8", "9", "10"]
    assert len(alice.get("/v1/jobs", params={"state": "queued"}).json()) == 5


def test_bulk_cancel_of_thousands_is_one_commit(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    node = parse_simulated_inventory("1xA100-80GB")[0]
    daemon = Daemon(store, FakeExecutor(), node, PlacementConfig(), tmp_path)
    request = Request(cpu_milli=1000, gpu_count=1, gpu_milli=1000)
    for i in range(3000):
        store.add(JobSpec(("x",), request, "alice", 1000, 1000, name=f"n{i % 2}"), float(i))
    daemon.tick()  # job 1 runs; the rest wait
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    outcome = daemon.cancel_many(query=JobQuery(name="n0"), uid=1000)
    commits = [s for s in statements if s.strip().upper() == "COMMIT"]
    assert len(outcome.cancelled) == 1499 and outcome.cancelling == ["1"]
    assert len(commits) == 2  # the queued ones in one write, the running one's reason in another
    store.close()
    raw = sqlite3.connect(tmp_path / "jobs.db")  # durable: another connection sees them
    try:
        counts = dict(raw.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())
    finally:
        raw.close()
    assert counts == {JobState.CANCELLED.value: 1499, JobState.QUEUED.value: 1500, JobState.RUNNING.value: 1}


def test_a_listings_rows_are_jobouts_fields_exactly(world: World) -> None:
    """The list route builds its rows without pydantic (job_row, for speed): the same keys, values and types as
    JobOut, for jobs queued, running on GPUs, ended, preempted, with a dependency, models, a time limit, odd text."""
    alice, _, _ = fill(world)
    submit(alice, gpus=1, gpu_model=["A100"], time_limit="90", name="é", dependency="afterok:1")
    alice.post("/v1/jobs/3/cancel")
    world.tick()
    stored = world.daemon.store.query(JobQuery())
    waiting = [j.id for j in stored if j.state is JobState.QUEUED and j.spec.user == "alice"]
    assert alice.post(f"/v1/jobs/{waiting[0]}/hold").status_code == 200  # held, with a history
    assert alice.patch(f"/v1/jobs/{waiting[0]}", json={"priority": 3}).status_code == 200
    jobs = world.daemon.store.query(JobQuery())
    assert any(j.spec.held_by and j.spec.history for j in jobs)
    odd = dataclasses.replace(jobs[0].spec, name="\udc80odd", command=("é", "\udc80"))  # stored by an older corral
    jobs.append(dataclasses.replace(jobs[0], spec=odd, preempted=Preempted(2, 5.0, "by job 9"), gpu_uuids=("GPU-a",)))
    assert {j.state for j in jobs} >= {JobState.RUNNING, JobState.QUEUED, JobState.CANCELLED}
    for job in jobs:
        row, model = job_row(job), JobOut.of(job).model_dump()
        assert row == model and list(row) == list(model)
        assert [type(v) for v in row.values()] == [type(v) for v in model.values()]
        # a listing's `fields=`: each field built alone (ROW), the same as the whole row's
        alone = job_row(job, list(JobOut.model_fields))
        assert alone == row and list(alone) == list(row)
        assert [type(v) for v in alone.values()] == [type(v) for v in row.values()]
        assert job_row(job, ["state", "id"]) == {"state": row["state"], "id": row["id"]}
    listed = alice.get("/v1/jobs").json()
    assert listed == [JobOut.of(j).model_dump(mode="json") for j in jobs[:-1] if j.spec.user == "alice"]
    # layout=columns: each field built a column at a time (COLUMN), the rows' values and types in the rows' order, as
    # JSON (a command is sent from its tuple)
    columns = orjson.loads(orjson.dumps(job_columns(jobs)))
    assert list(columns) == list(JobOut.model_fields)
    for name, values in columns.items():
        rows = [orjson.loads(orjson.dumps(job_row(j)[name])) for j in jobs]
        assert values == rows and [type(v) for v in values] == [type(v) for v in rows], name
    assert job_columns(jobs, ["id", "state"]) == {"id": [j.id for j in jobs], "state": [j.state.value for j in jobs]}


def test_a_listing_gives_only_the_fields_asked_for(world: World) -> None:
    alice, _, _ = fill(world)
    rows = alice.get("/v1/jobs", params={"fields": "state, id", "limit": 2}).json()
    assert rows == [{"id": "1", "state": "running"}, {"id": "2", "state": "running"}]  # JobOut's order
    full = alice.get("/v1/jobs", params={"limit": 1}).json()[0]
    table = alice.get("/v1/jobs", params={"fields": client.PS_FIELDS, "limit": 1}).json()[0]
    assert table == {k: full[k] for k in client.PS_FIELDS.split(",")}
    bad = alice.get("/v1/jobs", params={"fields": "id,colour,size"})
    assert bad.status_code == 422
    assert bad.json()["detail"]["field"] == "fields"
    assert bad.json()["detail"]["message"].startswith("unknown field 'colour', 'size'; a job's fields: id, name, user,")
    empty = alice.get("/v1/jobs", params={"fields": ","})
    assert empty.status_code == 422
    assert empty.json()["detail"]["message"].startswith("name at least one of a job's fields: id, name,")
