"""Contract suite: chronos-python 1.2.1 (the `chronos` module), unmodified, against a live `corral serve`.

One daemon for the module; the tests run in file order and build on each other, as a user's session would: add the
example job (a schedule and a GPU) and its dependent, list, search, run, job stats, graph, metrics, update, kill
tasks, delete. Every call goes through the real client; corral's own API (`/v1/jobs`) only checks what the client
did. `CALLS` counts the client's calls and how many answered as they should.

Also: the client's two ways to authenticate, no corral-only field in Chronos' job objects, and every Chronos
endpoint corral does not serve answering 501 in Chronos' error shape, walked from docs/compat/chronos.md's table.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import chronos
import httpx
import pytest

from corral.api.chronos import ENDPOINTS
from tests.api.test_serve import wait_for
from tests.mesos.live import Live, live_corral

ROOT = Path(__file__).resolve().parents[2]
JOB = json.loads((ROOT / "examples/chronos-job.json").read_text())
DEPENDENT = json.loads((ROOT / "examples/chronos-dependent.json").read_text())
TRAIN, EVALUATE = JOB["name"], DEPENDENT["name"]

#: Chronos 3's JobSerializer, field for field (mesos/chronos src/main/scala/.../utils/JobSerializer.scala); a job
#: has `container` when it names one, and `parents` (dependent) or `schedule` + `scheduleTimeZone` (scheduled).
CHRONOS_FIELDS = {
    "name", "command", "shell", "executor", "executorFlags", "taskInfoData", "retries", "owner", "ownerName",
    "description", "successCount", "errorCount", "lastSuccess", "lastError", "cpus", "disk", "mem", "disabled",
    "softError", "dataProcessingJobType", "errorsSinceLastSuccess", "fetch", "uris", "environmentVariables",
    "arguments", "highPriority", "runAsUser", "concurrent", "maxCompletionTime", "constraints",
}  # fmt: skip
#: Fields the patched GPU build (Chronos PR #810) added, shown only when the job sets them.
POSTED_EXTENSIONS = {"gpus"}

CALLS: dict[str, list[bool]] = {}  # client method -> one entry per call: answered as it should


class Counted:
    """The real client, with each call tallied in CALLS (an unexpected exception counts as a failed call)."""

    def __init__(self, client: chronos.ChronosClient) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            ok = False
            try:
                result = method(*args, **kwargs)
                ok = True
                return result
            finally:
                CALLS.setdefault(name, []).append(ok)

        return call

    def refused(self, name: str, *args: Any) -> str:
        """A call that must fail: what the client logged of the answer (it raises only "No remaining Chronos servers
        to try" once every server has failed); the call counts as passed when it fails."""
        seen = Recorder()
        logging.getLogger("chronos").addHandler(seen)
        try:
            with pytest.raises(chronos.ChronosAPIError, match="No remaining Chronos servers"):
                getattr(self._client, name)(*args)
        finally:
            logging.getLogger("chronos").removeHandler(seen)
        CALLS.setdefault(name, []).append(True)
        return "\n".join(seen.messages)


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with live_corral(tmp_path_factory.mktemp("chronos")) as running:
        yield running


def server(live: Live) -> str:
    """chronos-python builds `proto://SERVER + path`: the mount goes into the server string."""
    return live.url.removeprefix("http://") + "/chronos"


@pytest.fixture(scope="module")
def client(live: Live) -> Counted:
    """The token the way the client's own `extra_headers` carries it: DC/OS' `Authorization: token=...`."""
    return Counted(chronos.connect(server(live), extra_headers={"Authorization": f"token={live.token}"}))


def listed(client: Counted) -> dict[str, Any]:
    return {j["name"]: j for j in client.list()}


def corral_jobs(live: Live, name: str) -> list[dict[str, Any]]:
    """corral's own record of the job's tasks (its corral jobs, from corral's own API), oldest first."""
    with live.http() as http:
        jobs = http.get("/v1/jobs").json()
    return [j for j in jobs if j["origin"].startswith(f"chronos:{name}:")]


def wait_succeeded(client: Counted, name: str, count: int) -> dict[str, Any]:
    wait_for(f"{name} to succeed {count} time(s)", lambda: listed(client)[name]["successCount"] >= count)
    job: dict[str, Any] = listed(client)[name]
    return job


# ------------------------------------------------------------------------------------------------ the flow
def test_add_with_a_schedule_and_a_gpu_runs_on_a_gpu(client: Counted, live: Live) -> None:
    assert client.add(JOB) is None  # 204
    # The schedule started in the past: its missed periods collapse into one run now, as in Chronos.
    shown = wait_succeeded(client, TRAIN, 1)
    (task,) = corral_jobs(live, TRAIN)
    assert task["state"] == "succeeded" and [g["milli"] for g in task["gpus"]] == [1000]
    assert (shown["schedule"].split("/")[0], shown["scheduleTimeZone"], shown["gpus"]) == ("R", "Europe/Berlin", 1)
    assert (shown["cpus"], shown["mem"], shown["disk"], shown["maxCompletionTime"]) == (1, 2048, 1024, 3600)


def test_add_a_dependent_that_runs_after_each_parent_success(client: Counted, live: Live) -> None:
    assert client.add(DEPENDENT) is None  # parents: chronos-python posts it to /dependency
    assert client.run(TRAIN) is None  # a success of the parent after the child exists
    wait_succeeded(client, TRAIN, 2)
    shown = wait_succeeded(client, EVALUATE, 1)
    assert shown["parents"] == [TRAIN] and "schedule" not in shown
    (task,) = corral_jobs(live, EVALUATE)
    assert task["state"] == "succeeded" and len(task["gpus"]) == 1


def test_list_shows_chronos_fields_and_nothing_else(client: Counted) -> None:
    jobs = listed(client)
    assert set(jobs) == {TRAIN, EVALUATE}
    for name, job in jobs.items():
        kind = {"parents"} if name == EVALUATE else {"schedule", "scheduleTimeZone"}
        assert set(job) == CHRONOS_FIELDS | kind | POSTED_EXTENSIONS, name
    train = jobs[TRAIN]
    assert train["environmentVariables"] == JOB["environmentVariables"] and train["owner"] == JOB["owner"]
    assert (train["successCount"], train["errorCount"], train["lastError"]) == (2, 0, "")
    assert train["lastSuccess"].endswith("Z") and train["runAsUser"]


def test_search(client: Counted) -> None:
    assert {j["name"] for j in client.search(name="NIGHTLY")} == {TRAIN, EVALUATE}  # Chronos matches lower case
    assert [j["name"] for j in client.search(name="evaluate")] == [EVALUATE]
    assert [j["name"] for j in client.search(command="training for")] == [TRAIN]
    assert client.search(name="evaluate", command="training for") == []  # both terms must match
    assert client.search(name="nothing-like-it") == []


def test_job_stats_are_the_run_times_of_corral_s_runs(client: Counted, live: Live) -> None:
    stat = client.job_stat(TRAIN)
    assert set(stat) == {"histogram", "taskStatHistory"}
    hist = stat["histogram"]
    assert list(hist) == ["75thPercentile", "95thPercentile", "98thPercentile", "99thPercentile", "median", "mean",
                          "count"]  # fmt: skip
    tasks = corral_jobs(live, TRAIN)
    ran = sorted((j["finished_at"] - j["started_at"]) * 1000 for j in tasks)
    assert hist["count"] == len(ran) == 2
    # Two values: Dropwizard's uniform snapshot puts the median at their mean, and every higher percentile at the max.
    assert hist["median"] == pytest.approx(sum(ran) / 2, abs=1) and hist["mean"] == pytest.approx(sum(ran) / 2, abs=1)
    for q in ("75thPercentile", "95thPercentile", "98thPercentile", "99thPercentile"):
        assert hist[q] == pytest.approx(ran[1], abs=1), q
    history = stat["taskStatHistory"]
    assert [t["status"] for t in history] == ["Success", "Success"]
    assert {t["taskId"] for t in history} == {j["id"] for j in tasks}
    for t in history:
        assert t["jobName"] == TRAIN and re.fullmatch(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d", t["startTime"])
        assert re.fullmatch(r"(\d+h)?(\d+m)?\d+s", t["duration"])
    assert client.job_stat(EVALUATE)["histogram"]["count"] == 1
    assert "not found" in client.refused("job_stat", "no-such-job")


def test_stats_by_percentile(client: Counted) -> None:
    for call in ("scheduler_stat_99th", "scheduler_stat_98th", "scheduler_stat_95th", "scheduler_stat_75th",
                 "scheduler_stat_median", "scheduler_stat_mean"):  # fmt: skip
        rows = getattr(client, call)()
        assert {r["jobNameLabel"] for r in rows} == {TRAIN, EVALUATE}, call
        times = [r["time"] for r in rows]
        assert times == sorted(times, reverse=True) and all(t > 0 for t in times)  # seconds, slowest first


def test_graph(client: Counted, live: Live) -> None:
    csv = client.scheduler_graph()  # text/plain: the client hands back the text
    assert csv == (
        f"node,{EVALUATE},success,idle\n"
        f"node,{TRAIN},success,idle\n"
        f"link,{TRAIN},{EVALUATE}\n"
    )  # fmt: skip
    with live.http() as http:  # chronos-python has no call for the DOT form
        dot = http.get("/chronos/v1/scheduler/graph/dot")
    assert dot.status_code == 200 and dot.headers["content-type"].startswith("text/plain")
    assert dot.text == f'digraph G {{\n  1 [ label="{EVALUATE}" ];\n  2 [ label="{TRAIN}" ];\n  2 -> 1;\n}}\n'


def test_metrics(client: Counted) -> None:
    metrics = client.metrics()
    assert set(metrics) == {"version", "gauges", "counters", "histograms", "meters", "timers"}
    assert metrics["counters"][f"jobs.run.success.{TRAIN}"] == {"count": 2}
    assert metrics["counters"][f"jobs.run.failure.{TRAIN}"] == {"count": 0}
    hist = metrics["histograms"][f"jobs.run.time.{TRAIN}"]
    assert hist["count"] == 2 and hist["min"] <= hist["p50"] <= hist["max"]


def test_update_keeps_the_counters(client: Counted) -> None:
    assert client.update({**JOB, "command": "echo retrained", "description": "changed"}) is None
    train = listed(client)[TRAIN]
    assert (train["command"], train["description"], train["successCount"]) == ("echo retrained", "changed", 2)


def test_delete_tasks_kills_a_running_task(client: Counted, live: Live) -> None:
    sleeper = {"name": "sleeper", "command": "sleep 30", "owner": "me@example.com", "disabled": False,
               "schedule": "R/2099-01-01T00:00:00Z/PT24H", "retries": 0}  # fmt: skip
    assert client.add(sleeper) is None
    assert client.run("sleeper") is None
    wait_for("sleeper to run", lambda: [j["state"] for j in corral_jobs(live, "sleeper")] == ["running"])
    assert client.delete_tasks("sleeper") is None
    wait_for("sleeper's task to be killed", lambda: [j["state"] for j in corral_jobs(live, "sleeper")] == ["cancelled"])
    wait_for("sleeper's failure to count", lambda: listed(client)["sleeper"]["errorCount"] == 1)
    assert client.delete("sleeper") is None


def test_a_bad_job_is_refused_with_what_is_wrong(client: Counted) -> None:
    bad = {**JOB, "name": "bad", "schedule": "R/1960-01-01T00:00:00Z/PT1H"}
    assert "/schedule: start '1960-01-01T00:00:00Z' is before 1970" in client.refused("add", bad)
    assert "bad" not in listed(client)


def test_delete_reparents_the_children_as_chronos_does(client: Counted) -> None:
    schedule = listed(client)[TRAIN]["schedule"]
    assert client.delete(TRAIN) is None
    jobs = listed(client)
    assert set(jobs) == {EVALUATE}
    # The child of a deleted scheduled job takes over its schedule (Chronos' JobManagementResource.delete).
    assert (jobs[EVALUATE]["schedule"], jobs[EVALUATE]["scheduleTimeZone"]) == (schedule, "Europe/Berlin")
    assert "parents" not in jobs[EVALUATE]
    assert client.delete(EVALUATE) is None
    assert client.list() == []
    assert "not found" in client.refused("delete", EVALUATE)


# ------------------------------------------------------------------------------------------------ auth
def test_username_and_password_carry_the_token(live: Live) -> None:
    """httplib2 sends Basic credentials only after a 401 that offers Basic: corral's 401 under /chronos does."""
    challenge = httpx.get(f"{live.url}/chronos/v1/scheduler/jobs")
    assert challenge.status_code == 401
    assert challenge.headers["www-authenticate"] == 'Bearer realm="corral", Basic realm="corral"'
    assert httpx.get(f"{live.url}/v1/jobs").headers["www-authenticate"] == "Bearer"  # no browser prompt elsewhere
    basic = Counted(chronos.connect(server(live), username="anyone", password=live.token))
    assert basic.list() == []
    wrong = Counted(chronos.connect(server(live), username="anyone", password="not-a-token"))
    assert wrong.refused("list").endswith(": ")  # a 401: the client raises UnauthorizedError() (no text) and logs it


def test_every_client_call_answered() -> None:
    """The tally: every call of the suite answered as it should (the report quotes this line)."""
    total = sum(len(v) for v in CALLS.values())
    passed = sum(sum(v) for v in CALLS.values())
    print(f"\nchronos-python contract: {passed}/{total} calls passed over {len(CALLS)} client methods")
    required = {"add", "update", "list", "search", "run", "job_stat", "scheduler_graph", "metrics", "delete",
                "delete_tasks"}  # fmt: skip
    assert required <= set(CALLS) and passed == total, CALLS


# ------------------------------------------------------------------------------------------------ the endpoint table
def doc_table() -> list[tuple[str, str, bool]]:
    """(method, path, served) of each row of docs/compat/chronos.md's endpoint table."""
    rows = []
    for line in (ROOT / "docs/compat/chronos.md").read_text().splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] in ("GET", "POST", "PUT", "DELETE"):
            assert cells[2] in ("served", "not supported"), line
            rows.append((cells[0], cells[1], cells[2] == "served"))
    return rows


def test_the_doc_table_is_the_code_s_table() -> None:
    assert doc_table() == [(e.method, e.path, e.served) for e in ENDPOINTS]


def test_every_endpoint_not_served_answers_in_chronos_error_shape(live: Live) -> None:
    refused = [(m, p) for m, p, served in doc_table() if not served]
    assert refused
    with live.http() as http:
        for method, path in refused:
            concrete = path.replace("{name}", "nightly").replace("{task}", "ct:1:0:nightly:")
            variants = [concrete, concrete.removeprefix("/v1")] if concrete.startswith("/v1/") else [concrete]
            for url in variants:
                r = http.request(method, f"/chronos{url}", json={} if method in ("POST", "PUT") else None)
                assert r.status_code == 501, (method, url, r.text)
                body = r.json()
                assert set(body) == {"status", "message"} and body["status"] == "Not Implemented", body
                assert f"{method} {path} is not supported by corral: " in body["message"], body
