"""Contract suite: dcos-metronome 0.3.0 (the `metronome` package on PyPI), unmodified, against a live `corral serve`.

The client parses every answer into its protobuf models (metronome/models/metronome_pb2.py) and refuses any field
they lack. They predate Metronome's GPUs, secrets, networks, UCR, inline schedules and dependencies, all of which
Metronome itself writes into every job; corral keeps Metronome's shape, so the calls that parse a *job* raise
ParseError after the server has done the work (docs/compat/metronome.md, "The job shape clash", says which fields
and how to get past it; `test_every_object_against_the_clients_models` keeps that list true). Every other call works
as the client intends.

The one shim: the client's generated protobuf code needs protobuf's pure-Python backend, chosen once per process
(tests/conftest.py sets PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION before anything imports protobuf).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import metronome
import pytest
from google.protobuf.descriptor import Descriptor
from google.protobuf.internal import api_implementation
from google.protobuf.json_format import Parse, ParseError
from metronome.models import JobRun, JobSpec, ScheduleSpec

from corral.mesos import metronome as m
from tests.mesos.live import Live, live_corral

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "metronome-job.json"
DOC = ROOT / "docs" / "compat" / "metronome.md"

# Fields Metronome writes into every job that dcos-metronome 0.3.0's JobSpec lacks (the clash, documented).
JOB_CLASH = {"/dependencies", "/schedules", "/run/gpus", "/run/secrets", "/run/networks"}

assert api_implementation.Type() == "python", "protobuf was imported before PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with live_corral(tmp_path_factory.mktemp("metronome")) as running:
        yield running


@pytest.fixture(scope="module")
def client(live: Live) -> metronome.MetronomeClient:
    return metronome.MetronomeClient(live.url + "/metronome", auth_token=live.token)


def spec(doc: dict[str, Any]) -> JobSpec:
    return Parse(json.dumps(doc), JobSpec())


def relaxed_job(client: metronome.MetronomeClient, job_id: str) -> JobSpec:
    """The documented way past the clash: the client's own transport, its model, a parse that skips new fields
    (for jobs without labels or env: the client's generated map fields fail under current protobuf)."""
    answer = client._do_request("GET", f"/v1/jobs/{job_id}")
    return Parse(answer.text, JobSpec(), ignore_unknown_fields=True)


def job_dict(client: metronome.MetronomeClient, job_id: str) -> Any:
    """The other documented way: the client's transport (auth, failover, its errors) and the JSON as a dict."""
    return client._do_request("GET", f"/v1/jobs/{job_id}").json()


def unknown_fields(value: Any, message: Descriptor, path: str = "") -> set[str]:
    """The JSON paths in `value` that the client's protobuf `message` cannot hold (a field it lacks, or an enum value
    it does not know: `path=VALUE`), i.e. what makes its json_format.Parse raise ParseError."""
    found: set[str] = set()
    for key, item in value.items():
        field = message.fields_by_camelcase_name.get(key) or message.fields_by_name.get(key)
        where = f"{path}/{key}"
        if field is None:
            found.add(where)
        elif item is None:
            continue
        elif field.message_type is not None and field.message_type.GetOptions().map_entry:
            continue  # labels, env: string maps
        elif field.message_type is not None and field.message_type.full_name.startswith("google.protobuf."):
            continue  # a wrapped scalar (disk)
        elif field.message_type is not None:
            for element in item if field.is_repeated else [item]:
                found |= unknown_fields(element, field.message_type, where)
        elif field.enum_type is not None and field.enum_type.values_by_name.get(item) is None:
            found.add(f"{where}={item}")
    return found


def wait_for_status(client: metronome.MetronomeClient, job_id: str, run_id: str, want: str) -> JobRun:
    deadline = time.monotonic() + 20
    while True:
        run = client.get_run(job_id, run_id)
        if JobRun.Status.Name(run.status) == want:
            return run
        assert time.monotonic() < deadline, f"run {run_id} still {JobRun.Status.Name(run.status)}, want {want}"
        time.sleep(0.1)


# ------------------------------------------------------------------------------------------------ the flow
def test_ping_and_token_auth(live: Live, client: metronome.MetronomeClient) -> None:
    assert client.ping() == "pong"
    assert client._do_request("GET", "/leader").json() == {"leader": live.url.removeprefix("http://")}
    stranger = metronome.MetronomeClient(live.url + "/metronome", auth_token="not-a-token")
    with pytest.raises(metronome.MetronomeHttpError) as refused:
        stranger.list_schedules("anything")
    assert refused.value.status_code == 401 and refused.value.error_message  # Metronome's {"message"} shape


def test_documented_flow(live: Live, client: metronome.MetronomeClient) -> None:
    """create, get, list, update, schedule CRUD, run, list runs, get a run, stop it, delete: each call through the
    client; the four that parse a job raise ParseError on `run.gpus` after corral has done what was asked."""
    command: dict[str, Any] = {"cpus": 0.1, "mem": 32, "disk": 0, "cmd": "sleep 30"}
    job = {"id": "flow", "description": "contract", "run": command}
    with pytest.raises(ParseError, match='no field named "gpus"'):
        client.create_job(spec(job))
    assert relaxed_job(client, "flow").run.cmd == "sleep 30"  # created, as the 201 said

    with pytest.raises(ParseError, match='no field named "gpus"'):
        client.get_job("flow", active_runs=True, schedules=True, history_summary=True)
    with pytest.raises(ParseError, match='no field named "gpus"'):
        client.list_jobs(active_runs=True, schedules=True, history=True, history_summary=True)
    command["cmd"] = "sleep 31"
    with pytest.raises(ParseError, match='no field named "gpus"'):
        client.update_job("flow", spec(job))
    assert relaxed_job(client, "flow").run.cmd == "sleep 31"  # updated

    # Schedules: the client's ScheduleSpec is Metronome's, field for field.
    made = client.create_schedule("flow", ScheduleSpec(id="nightly", cron="0 2 * * *", timezone="UTC"))
    assert (made.id, made.cron, made.startingDeadlineSeconds, made.enabled) == ("nightly", "0 2 * * *", 900, True)
    assert made.nextRunAt and ScheduleSpec.ConcurrencyPolicy.Name(made.concurrencyPolicy) == "ALLOW"
    assert [s.id for s in client.list_schedules("flow")] == ["nightly"]
    assert client.get_schedule("flow", "nightly").cron == "0 2 * * *"
    changed = client.update_schedule("flow", "nightly", ScheduleSpec(id="nightly", cron="15 3 * * *"))
    assert changed.cron == "15 3 * * *" and client.get_schedule("flow", "nightly").cron == "15 3 * * *"
    assert client.delete_schedule("flow", "nightly").status_code == 200
    assert client.list_schedules("flow") == []
    with pytest.raises(metronome.NotFoundError):
        client.get_schedule("flow", "nightly")

    # Runs.
    run = client.run_job("flow")
    assert re.fullmatch(r"\d{14}[A-Za-z0-9]{5}", run.id) and run.jobId == "flow"
    assert JobRun.Status.Name(run.status) in ("STARTING", "ACTIVE")
    active = wait_for_status(client, "flow", run.id, "ACTIVE")
    assert JobRun.JobRunTask.Status.Name(active.tasks[0].status) in ("TASK_STARTING", "TASK_RUNNING")
    assert [r.id for r in client.list_runs("flow")] == [run.id]
    assert client.stop_run("flow", run.id).status_code == 200
    stopped = wait_for_status(client, "flow", run.id, "FAILED")
    assert stopped.completedAt and JobRun.JobRunTask.Status.Name(stopped.tasks[0].status) == "TASK_KILLED"
    assert client.list_runs("flow") == []

    # corral's own view of the run, asked for explicitly.
    extras = live.http().get(f"/metronome/v1/jobs/flow/runs/{run.id}", params={"corral": "true"}).json()
    assert (extras["trigger"], extras["reason"]) == ("manual", "stopped")

    assert client.delete_job("flow").status_code == 200
    with pytest.raises(metronome.NotFoundError):
        client.get_job("flow")


def test_delete_refuses_active_runs_until_asked_to_stop_them(client: metronome.MetronomeClient) -> None:
    job = {"id": "busy", "run": {"cpus": 0.1, "mem": 32, "disk": 0, "cmd": "sleep 30"}}
    with pytest.raises(ParseError):
        client.create_job(spec(job))
    run = client.run_job("busy")
    with pytest.raises(metronome.MetronomeHttpError) as busy:
        client.delete_job("busy")
    assert (busy.value.status_code, busy.value.error_message) == (409, m.ACTIVE_RUNS)
    assert client.delete_job("busy", stop_current_job_runs=True).status_code == 200
    with pytest.raises(metronome.NotFoundError):
        client.get_run("busy", run.id)


def test_the_older_scheduled_jobs_api_replaces_schedules_where_v1_keeps_them(live: Live) -> None:
    http = live.http()
    run = {"cpus": 0.1, "mem": 32, "disk": 0, "cmd": "true"}
    with_schedule = {"id": "older", "run": run, "schedules": [{"id": "s", "cron": "0 * * * *"}]}
    made = http.post("/metronome/v0/scheduled-jobs", json=with_schedule)
    assert made.status_code == 201 and [s["id"] for s in made.json()["schedules"]] == ["s"]
    kept = http.put("/metronome/v1/jobs/older", json={"id": "older", "run": {**run, "cmd": "sleep 1"}})
    assert kept.status_code == 200 and [s["id"] for s in kept.json()["schedules"]] == ["s"]
    replaced = http.put("/metronome/v0/scheduled-jobs/older", json={"id": "older", "run": run})
    assert replaced.status_code == 200 and replaced.json()["schedules"] == []
    assert replaced.json()["run"]["cmd"] == "true"
    assert http.get("/metronome/v1/jobs/older/schedules").json() == []
    assert http.put("/metronome/v0/scheduled-jobs/nobody", json={"id": "nobody", "run": run}).status_code == 404
    assert http.delete("/metronome/v1/jobs/older").status_code == 200


# ------------------------------------------------------------------------------------------------ shapes
def test_every_object_against_the_clients_models(live: Live, client: metronome.MetronomeClient) -> None:
    """Each object corral answers, field by field against the client's protobuf definitions: runs, run lists and
    schedules fit exactly; a job carries only the documented clash, which Metronome itself writes."""
    http = live.http()
    plain = {"id": "shape", "run": {"cpus": 0.1, "mem": 32, "disk": 0, "cmd": "true"}}
    created = http.post("/metronome/v1/jobs", json=plain)
    assert created.status_code == 201
    assert unknown_fields(created.json(), JobSpec.DESCRIPTOR) == JOB_CLASH

    schedule = http.post("/metronome/v1/jobs/shape/schedules", json={"id": "s", "cron": "0 * * * *"}).json()
    assert unknown_fields(schedule, ScheduleSpec.DESCRIPTOR) == set()
    assert unknown_fields(http.get("/metronome/v1/jobs/shape/schedules/s").json(), ScheduleSpec.DESCRIPTOR) == set()

    run = client.run_job("shape")  # parsed strictly by the client: no corral extras
    done = wait_for_status(client, "shape", run.id, "SUCCESS")
    assert JobRun.JobRunTask.Status.Name(done.tasks[0].status) == "TASK_FINISHED" and done.tasks[0].completedAt
    raw_run = http.get(f"/metronome/v1/jobs/shape/runs/{run.id}").json()
    assert unknown_fields(raw_run, JobRun.DESCRIPTOR) == set()
    assert set(raw_run) == {"id", "jobId", "status", "createdAt", "completedAt", "tasks"}

    # The embeds (Metronome's `embed=`; the client's own activeRuns=true etc. are ignored, as by Metronome).
    ignored = http.get("/metronome/v1/jobs/shape", params={"activeRuns": "true", "history": "true"}).json()
    assert not {"activeRuns", "history"} & set(ignored)
    embedded = http.get(
        "/metronome/v1/jobs/shape", params=[("embed", e) for e in ("activeRuns", "history", "historySummary")]
    ).json()
    assert unknown_fields(embedded, JobSpec.DESCRIPTOR) == JOB_CLASH | {"/activeRuns", "/history", "/historySummary"}
    assert set(embedded["history"]) == {
        "successCount",
        "failureCount",
        "lastSuccessAt",
        "lastFailureAt",
        "successfulFinishedRuns",
        "failedFinishedRuns",
    }
    (finished,) = embedded["history"]["successfulFinishedRuns"]
    assert set(finished) == {"id", "createdAt", "finishedAt", "tasks"} and finished["id"] == run.id

    extras = http.get("/metronome/v1/jobs/shape/runs", params={"corral": "true"})
    assert extras.status_code == 200
    busy = client.run_job("shape")
    active = http.get("/metronome/v1/jobs", params={"embed": "activeRuns", "corral": "true"}).json()
    listed = [r for j in active if j["id"] == "shape" for r in j.get("activeRuns", [])]
    assert all(r["trigger"] == "manual" for r in listed)  # the extras reach embedded runs only when asked for
    plain_runs = http.get("/metronome/v1/jobs", params={"embed": "activeRuns"}).json()
    assert all(
        set(r) <= {"id", "jobId", "status", "createdAt", "completedAt", "tasks"}
        for j in plain_runs
        for r in j.get("activeRuns", [])
    )
    wait_for_status(client, "shape", busy.id, "SUCCESS")
    assert client.delete_job("shape", stop_current_job_runs=True).status_code == 200


def test_newer_enum_values_the_client_does_not_know(live: Live, client: metronome.MetronomeClient) -> None:
    """FORBID (Metronome 0.4) and the IS operator that Metronome echoes for EQ are not in the client's enums."""
    http = live.http()
    doc = {
        "id": "enums",
        "run": {
            "cpus": 0.1,
            "mem": 32,
            "disk": 0,
            "cmd": "true",
            # sim-0: the node of live_corral's simulated GPUs (corral refuses a job that can never be placed)
            "placement": {"constraints": [{"attribute": "@hostname", "operator": "EQ", "value": "sim-0"}]},
        },
    }
    created = http.post("/metronome/v1/jobs", json=doc).json()
    assert unknown_fields(created, JobSpec.DESCRIPTOR) == JOB_CLASH | {"/run/placement/constraints/operator=IS"}
    http.post(
        "/metronome/v1/jobs/enums/schedules", json={"id": "s", "cron": "0 * * * *", "concurrencyPolicy": "FORBID"}
    )
    with pytest.raises(ParseError, match="FORBID"):
        client.get_schedule("enums", "s")
    assert relaxed_job(client, "enums").run.placement.constraints[0].attribute == "@hostname"  # IS skipped
    assert client.delete_job("enums").status_code == 200


# ------------------------------------------------------------------------------------------------ the example
def test_the_example_job_is_accepted_scheduled_run_and_placed_on_a_gpu(
    live: Live, client: metronome.MetronomeClient
) -> None:
    """examples/metronome-job.json through the client's transport (its JobSpec cannot carry gpus or schedules)."""
    doc = json.loads(EXAMPLE.read_text())
    created = client._do_request("POST", "/v1/jobs", data=json.dumps(doc))
    assert created.status_code == 201
    job = job_dict(client, doc["id"])
    assert (job["run"]["cmd"], job["labels"]["team"], job["run"]["gpus"]) == (doc["run"]["cmd"], "ml", 1)
    with pytest.raises(ParseError, match="labels"):  # the client's map fields fail under current protobuf
        Parse(created.text, JobSpec(), ignore_unknown_fields=True)
    with pytest.raises(ParseError, match="FORBID"):  # the schedule is there; its policy is newer than the client
        client.list_schedules(doc["id"])
    (schedule,) = created.json()["schedules"]
    assert (schedule["id"], schedule["timezone"], schedule["concurrencyPolicy"]) == (
        "every-night",
        "Europe/Berlin",
        "FORBID",
    )
    assert schedule["nextRunAt"].endswith(("T00:30:00.000Z", "T01:30:00.000Z"))  # 02:30 in Berlin

    run = client.run_job(doc["id"])
    active = wait_for_status(client, doc["id"], run.id, "ACTIVE")
    task = active.tasks[0].id  # the corral job that runs it
    placed = live.http().get(f"/v1/jobs/{task}").json()
    assert placed["state"] in ("starting", "running") and len(placed["gpus"]) == 1, placed
    assert client.delete_job(doc["id"], stop_current_job_runs=True).status_code == 200


# ------------------------------------------------------------------------------------------------ endpoints
def doc_table() -> list[tuple[str, str, bool]]:
    """The endpoint table of docs/compat/metronome.md: (method, path, served) per row."""
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] in ("GET", "POST", "PUT", "DELETE"):
            status = cells[2].lower()
            assert status in ("served", "not supported"), line
            rows.append((cells[0], cells[1].strip("`"), status == "served"))
    return rows


def test_the_docs_endpoint_table_is_the_code_s() -> None:
    assert doc_table() == [(e.method, e.path, e.served) for e in m.ENDPOINTS]


def test_every_endpoint_not_supported_answers_in_metronomes_shape(
    live: Live, client: metronome.MetronomeClient
) -> None:
    missing = [e for e in m.ENDPOINTS if not e.served]
    assert missing
    for e in missing:
        path = e.path.replace("{file}", "api/v1/jobs.raml")
        with pytest.raises(metronome.MetronomeHttpError) as refused:
            client._do_request(e.method, path)
        assert refused.value.status_code == 501
        assert refused.value.error_message == f"{e.method} {e.path} is not supported by corral"
        raw = live.http().request(e.method, "/metronome" + path)
        assert raw.json() == {"message": refused.value.error_message}


def test_every_served_endpoint_is_routed(live: Live) -> None:
    """No served row falls through to the 404 of an unknown route (a doc row that the code lost)."""
    http = live.http()
    assert (
        http.post(
            "/metronome/v1/jobs", json={"id": "routed", "run": {"cpus": 0.1, "mem": 32, "disk": 0, "cmd": "true"}}
        ).status_code
        == 201
    )
    http.post("/metronome/v1/jobs/routed/schedules", json={"id": "s", "cron": "0 * * * *"})
    for e in m.ENDPOINTS:
        if not e.served:
            continue
        path = (
            e.path.replace("{jobId}", "routed").replace("{scheduleId}", "s").replace("{runId}", "20260101000000aaaaa")
        )
        answer = http.request(e.method, "/metronome" + path, json={} if e.method in ("POST", "PUT") else None)
        assert answer.status_code not in (405, 501) and "no route" not in answer.text, (e, answer.text)
