"""`GET /v1/acct` and `/v1/acct/summary` (issue 26 item 6), in-process: ended jobs with their hours and GPU
efficiency (simulated GPUs: made-up figures, said so), who sees whose jobs, filters, paging and the error texts.

A daemon on 4 simulated H100-80GB with the fake executor and a clock the test moves (tests/api/test_read_views.py's
Box); `run` starts a job, lets rounds sample it, and ends it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.api.test_api import ALICE, BOB, ROOT
from tests.api.test_read_views import T0, Box

Peer = tuple[int, int, str]
QUEUES = 'admins = ["carol"]\n[queues.default]\n[queues.train]\n'
CAROL = (1002, 1002, "carol")


@pytest.fixture
def box(tmp_path: Path) -> Box:
    path = tmp_path / "queues.toml"
    path.write_text(QUEUES)
    return Box(tmp_path, path)


def run(box: Box, seconds: float, exit_code: int = 0, peer: Peer = ALICE, ticks: int = 5, **body: Any) -> str:
    """Submit, start, sample `ticks` times over `seconds`, end with `exit_code`; the job's id."""
    job = box.submit(peer, **body)
    box.tick()
    for _ in range(ticks):
        box.clock.t += seconds / ticks
        box.tick()
    if not ticks:
        box.clock.t += seconds
    box.fake.finish(job, exit_code, ended_at=box.clock.t)
    box.tick()
    return job


def acct(box: Box, peer: Peer = ALICE, **params: Any) -> list[dict[str, Any]]:
    r = box.client(peer).get("/v1/acct", params=params)
    assert r.status_code == 200, r.text
    return list(r.json())


def error(box: Box, url: str, status: int, peer: Peer = ALICE, **params: Any) -> tuple[str, str]:
    r = box.client(peer).get(url, params=params)
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    return detail["field"], detail["message"]


def test_an_ended_job_has_its_hours_and_its_simulated_gpu_efficiency(box: Box) -> None:
    job = run(box, 3600, gpus=2, cpus="4", queue="train", name="resnet")
    failed = run(box, 60, exit_code=3, ticks=0, gpus=1)
    cpu_only = run(box, 60)
    rows = acct(box)
    assert [r["id"] for r in rows] == [job, failed, cpu_only]
    r = rows[0]
    assert (r["name"], r["user"], r["queue"], r["state"], r["exit_code"]) == (
        "resnet",
        "alice",
        "train",
        "succeeded",
        0,
    )
    assert (r["started_at"], r["ended_at"], r["elapsed_s"]) == (T0, T0 + 3600, 3600)
    assert (r["gpus"], r["gpu_ids"], r["cpus"], r["gpu_hours"], r["cpu_hours"]) == (2.0, [0, 1], 4.0, 2.0, 4.0)
    # simulated GPUs: made-up figures from every sample, and said so
    assert r["simulated"] is True and r["gpu_samples"] == 5
    assert 30 <= r["gpu_util_pct"] <= 95
    assert 0.4 * 2 * 81920 <= r["gpu_mem_peak_mib"] <= 0.9 * 2 * 81920
    # a job that ended before any sample still shows simulated figures (one made-up sample at its end)
    f = rows[1]
    assert (f["state"], f["exit_code"], f["elapsed_s"], f["gpus"]) == ("failed", 3, 60, 1.0)
    assert (f["gpu_samples"], f["simulated"]) == (1, True) and 30 <= f["gpu_util_pct"] <= 95
    c = rows[2]  # no GPU: nothing to sample
    assert (c["gpus"], c["gpu_util_pct"], c["gpu_mem_peak_mib"], c["gpu_samples"], c["simulated"]) == (
        0.0, None, None, 0, False,
    )  # fmt: skip
    # a job that never ran: cancelled while waiting
    waiting = box.submit(gpus=4)
    assert box.client().post(f"/v1/jobs/{waiting}/cancel").status_code == 200
    last = acct(box)[-1]
    assert (last["id"], last["state"], last["elapsed_s"], last["gpu_hours"], last["gpus"]) == (
        waiting, "cancelled", 0, 0, 4.0,
    )  # fmt: skip


def test_users_see_their_own_jobs_root_and_admins_everyones(box: Box) -> None:
    mine = run(box, 100, gpus=1)
    bobs = run(box, 100, peer=BOB, gpus=1)
    assert [r["id"] for r in acct(box, ALICE)] == [mine]
    assert [r["id"] for r in acct(box, BOB)] == [bobs]
    assert [r["id"] for r in acct(box, ROOT)] == [mine, bobs]
    assert [r["id"] for r in acct(box, CAROL)] == [mine, bobs]  # an admin of the queues file
    assert [r["id"] for r in acct(box, ROOT, user="bob")] == [bobs]
    assert [r["id"] for r in acct(box, ALICE, user="alice")] == [mine]
    assert error(box, "/v1/acct", 403, ALICE, user="bob") == ("user", "only root or an admin can see other users' jobs")
    assert error(box, "/v1/acct/summary", 403, BOB, user="alice")[0] == "user"
    summed = box.client(ALICE).get("/v1/acct/summary").json()
    assert [(s["user"], s["jobs"]) for s in summed] == [("alice", 1)]


def test_filters_and_pages(box: Box) -> None:
    ok = [run(box, 100, gpus=1) for _ in range(3)]
    bad = run(box, 100, exit_code=1, gpus=1, queue="train")
    assert [r["id"] for r in acct(box, state="failed")] == [bad]
    assert [r["id"] for r in acct(box, state="completed,failed")] == [*ok, bad]  # Slurm's word for succeeded
    assert [r["id"] for r in acct(box, queue="train")] == [bad]
    ends = [r["ended_at"] for r in acct(box)]
    assert [r["id"] for r in acct(box, since=ends[1], until=ends[3])] == ok[1:]
    r = box.client().get("/v1/acct", params={"limit": 3})
    assert [j["id"] for j in r.json()] == ok and r.headers["X-Corral-Next-After"]
    nxt = box.client().get("/v1/acct", params={"limit": 3, "after": r.headers["X-Corral-Next-After"]})
    assert [j["id"] for j in nxt.json()] == [bad] and "X-Corral-Next-After" not in nxt.headers


def test_summary_per_user_and_queue(box: Box) -> None:
    run(box, 3600, gpus=2)
    run(box, 1800, gpus=1, queue="train")
    run(box, 3600, peer=BOB, gpus=1)
    rows = box.client(ROOT).get("/v1/acct/summary").json()
    assert [(s["user"], s["queue"], s["jobs"], s["gpu_hours"]) for s in rows] == [
        ("alice", "default", 1, 2.0),
        ("alice", "train", 1, 0.5),
        ("bob", "default", 1, 1.0),
    ]
    assert all(s["simulated"] and 30 <= s["gpu_util_pct"] <= 95 for s in rows)


def test_bad_input_gets_a_422_naming_the_field(box: Box) -> None:
    assert error(box, "/v1/acct", 422, since=T0 + 10, until=T0) == (
        "since",
        f"must be before until ({T0 + 10:.0f} is not before {T0:.0f})",
    )
    field, message = error(box, "/v1/acct", 422, until=1e300)
    assert field == "until" and message == (
        "must be a time between 1970 and 9999 (seconds since the epoch, 0..253402300799), got 1e+300"
    )
    assert error(box, "/v1/acct/summary", 422, since=-1)[0] == "since"
    assert error(box, "/v1/acct", 422, state="running") == (
        "state",
        "must be one of cancelled, failed, lost, succeeded (the states of jobs that ended; completed is succeeded),"
        " got 'running'",
    )
    assert error(box, "/v1/acct", 422, after="12") == (
        "after",
        "not a page cursor: '12' (pass X-Corral-Next-After as it came)",
    )
    assert error(box, "/v1/acct", 422, limit=0)[0] == "limit"
    assert error(box, "/v1/acct", 422, limit=10**6)[0] == "limit"


def test_the_columns_layout_has_the_rows_values_field_by_field(box: Box) -> None:
    jobs = [run(box, 3600, gpus=2, cpus="4", name="resnet"), run(box, 60, exit_code=3, ticks=0), run(box, 90, gpus=1)]
    cancelled = box.submit(ALICE, gpus=1)  # cancelled before a round starts it
    assert box.client().post(f"/v1/jobs/{cancelled}/cancel").status_code == 200
    for params in ({}, {"limit": 2}, {"state": "failed"}):
        rows = acct(box, **params)
        r = box.client().get("/v1/acct", params={**params, "layout": "columns"})
        assert r.status_code == 200, r.text
        columns = r.json()
        assert list(columns) == list(rows[0])  # AcctOut's fields, in order
        assert [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)] == rows
        rows_page = box.client().get("/v1/acct", params=params)
        assert r.headers.get("X-Corral-Next-After") == rows_page.headers.get("X-Corral-Next-After")
    assert {r["id"] for r in acct(box)} == {*jobs, cancelled}
    field, message = error(box, "/v1/acct", 422, layout="table")
    assert (field, message) == ("layout", "Input should be 'rows' or 'columns'")
