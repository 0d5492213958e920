"""corral hold / release / update of waiting jobs (issue 26 item 5), in-process: the rules, the answers' texts, the
history `show` lists, and a hold kept across a restart of the store (docs/hold-update.md).

A daemon on 4 simulated H100-80GB with the fake executor and a clock the test moves (tests/api/test_read_views.py's
Box), with a queues file where it matters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.cli.views import change_text, show_lines
from corral.jobs.model import Change, JobSpec, spec_from_json, spec_to_json
from corral.model.resources import Request
from corral.store import SqliteStore
from tests.api.test_api import ALICE, BOB, ROOT
from tests.api.test_read_views import T0, Box

QUEUES = 'admins = ["bob"]\n[queues.default]\nmax_priority = 10\n[queues.train]\nsubmitters = ["carol"]\n'


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


@pytest.fixture
def qbox(tmp_path: Path) -> Box:
    path = tmp_path / "queues.toml"
    path.write_text(QUEUES)
    return Box(tmp_path, path)


def post(box: Box, url: str, peer: tuple[int, int, str] = ALICE) -> Any:
    return box.client(peer).post(url)


def patch(box: Box, job_id: str, peer: tuple[int, int, str] = ALICE, **body: Any) -> Any:
    return box.client(peer).patch(f"/v1/jobs/{job_id}", json=body)


def show(box: Box, job_id: str, peer: tuple[int, int, str] = ALICE) -> dict[str, Any]:
    r = box.client(peer).get(f"/v1/jobs/{job_id}")
    assert r.status_code == 200, r.text
    return dict(r.json())


def error(r: Any, status: int) -> tuple[str, str]:
    assert r.status_code == status, r.text
    body = r.json()["detail"]
    return body["field"], body["message"]


def test_a_held_job_waits_with_its_reason_until_released_and_show_lists_both(box: Box) -> None:
    job = box.submit(gpus=1)
    r = post(box, f"/v1/jobs/{job}/hold")
    assert r.status_code == 200, r.text
    assert r.json()["held_by"] == "alice" and r.json()["reason"] == f"held by alice (corral release {job})"
    box.tick()
    box.tick()
    data = show(box, job)
    assert data["state"] == "queued" and data["reason"] == f"held by alice (corral release {job})"
    assert post(box, f"/v1/jobs/{job}/hold").json()["history"] == data["history"]  # a second hold changes nothing
    box.clock.t += 60
    r = post(box, f"/v1/jobs/{job}/release")
    assert r.status_code == 200 and r.json()["held_by"] == "" and r.json()["reason"] == ""
    box.tick()
    data = show(box, job)
    assert data["state"] == "running"
    assert data["history"] == [
        {"at": T0, "by": "alice", "field": "held", "old": "no", "new": "yes"},
        {"at": T0 + 60, "by": "alice", "field": "held", "old": "yes", "new": "no"},
    ]
    lines = show_lines(data, now=T0 + 60)
    at = [text for label, text in lines if label in ("history", "")]
    assert lines[-2][0] == "history" and len(at) == 2
    assert at[0].endswith(" held by alice") and at[1].endswith(" released by alice")
    # running: neither hold nor update
    assert error(post(box, f"/v1/jobs/{job}/hold"), 422) == (
        "state",
        f"job {job} is running: only a waiting job can be held",
    )
    assert error(patch(box, job, priority=3), 422) == (
        "state",
        f"job {job} is running: only a waiting job can be updated",
    )


def test_others_jobs_are_not_found_and_a_hold_by_root_is_released_only_by_root(box: Box) -> None:
    job = box.submit(gpus=1)
    assert error(post(box, f"/v1/jobs/{job}/hold", BOB), 404) == ("job", f"no job {job}")
    assert error(patch(box, job, BOB, priority=1), 404) == ("job", f"no job {job}")
    assert post(box, f"/v1/jobs/{job}/hold", ROOT).json()["held_by"] == "root"
    data = show(box, job)
    assert ("held", f"by root (corral release {job})") in show_lines(data, now=T0)
    assert error(post(box, f"/v1/jobs/{job}/release"), 403) == (
        "job",
        f"job {job} was held by root: only root or an admin may release it",
    )
    assert post(box, f"/v1/jobs/{job}/release", ROOT).json()["held_by"] == ""


def test_update_changes_a_waiting_job_within_bounds_and_records_each_change(box: Box) -> None:
    blocker = box.submit(gpus=4)
    box.tick()
    job = box.submit(gpus=1, name="a", time_limit="1h")
    box.clock.t += 5
    r = patch(box, job, priority=50, time_limit="1:30:00", gpus=2, name="b")
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["priority"] == 50 and data["name"] == "b" and data["request"]["gpu_count"] == 2
    assert data["request"]["time_limit_s"] == 5400
    changes = {(c["field"], c["old"], c["new"]) for c in data["history"]}
    assert changes == {
        ("priority", "0", "50"),
        ("time_limit_s", "3600", "5400"),
        ("gpus", "1", "2"),
        ("name", "a", "b"),
    }
    words = [change_text(c) for c in data["history"]]
    assert any(w.endswith("time limit: 1h -> 90m by alice") for w in words), words
    assert any(w.endswith("priority: 0 -> 50 by alice") for w in words), words
    # users within -100..100; the machine's GPUs as submit checks them; nothing unknown (no dependency added)
    assert error(patch(box, job, priority=101), 403) == (
        "priority",
        "must be in -100..100 (only root or an admin of the queues file may go beyond), got 101",
    )
    field, message = error(patch(box, job, gpus=5), 422)
    assert field == "request" and message.startswith("can never run on this machine"), message
    r = patch(box, job, dependency="afterok:1")
    assert r.status_code == 422 and "dependency" in r.text, r.text
    field, message = error(patch(box, job), 422)
    assert message == "say what to change: priority, time_limit, queue, gpus or name"
    assert patch(box, job, ROOT, priority=1000).json()["priority"] == 1000  # root beyond the bounds
    assert blocker


def test_queue_bounds_submitters_and_admins_apply_to_updates(qbox: Box) -> None:
    job = qbox.submit(gpus=1)
    assert error(patch(qbox, job, priority=11), 403) == (
        "priority",
        "11 is above the bound of queue 'default', 10 (only root or an admin may exceed it)",
    )
    assert error(patch(qbox, job, queue="train"), 403) == ("queue", "user alice may not submit to queue 'train'")
    assert error(patch(qbox, job, queue="nope"), 422) == ("queue", "no queue 'nope' (queues: default, train)")
    # bob, an admin of the queues file, beyond every bound, on alice's job
    data = patch(qbox, job, BOB, priority=500, queue="train").json()
    assert data["priority"] == 500 and data["queue"] == "train"
    assert [(c["by"], c["field"]) for c in data["history"]] == [("bob", "queue"), ("bob", "priority")]


def test_a_dependent_jobs_verdict_is_worked_out_again_after_an_update(box: Box) -> None:
    first = box.submit(gpus=1)
    box.tick()
    later = box.submit(gpus=1, dependency=f"afterok:{first}")
    box.tick()
    assert show(box, later)["state"] == "queued"
    assert patch(box, later, name="renamed").status_code == 200
    assert later not in box.daemon._dependency_memo
    box.tick()
    assert show(box, later)["state"] == "queued" and f"job {first}" in show(box, later)["reason"]


def test_a_hold_and_its_history_survive_reopening_the_store(tmp_path: Path) -> None:
    spec = JobSpec(("true",), Request(cpu_milli=1000), "alice", 1000, 1000)
    text = spec_to_json(spec)
    assert "held_by" not in text and "history" not in text  # jobs never held store what they stored before
    store = SqliteStore(tmp_path / "jobs.db")
    job = store.add(spec, T0)
    held = JobSpec(
        ("true",), Request(cpu_milli=1000), "alice", 1000, 1000, held_by="alice",
        history=(Change(T0, "alice", "held", "no", "yes"),),
    )  # fmt: skip
    store.update(job.id, spec=held)
    store.close()
    again = SqliteStore(tmp_path / "jobs.db")
    got = again.get(job.id)
    assert got is not None and got.spec == held
    assert spec_from_json(spec_to_json(held)) == held
    again.close()


def test_a_retried_submission_of_a_held_job_answers_the_same_job(box: Box) -> None:
    body = {"command": ["true"], "idempotency_key": "k-1"}
    first = box.client().post("/v1/jobs", json=body)
    assert first.status_code == 201
    job = first.json()["id"]
    assert post(box, f"/v1/jobs/{job}/hold").status_code == 200
    again = box.client().post("/v1/jobs", json=body)
    assert again.status_code == 200 and again.json()["id"] == job and again.json()["held_by"] == "alice"
