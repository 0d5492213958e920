"""Metronome jobs in the daemon, through its REST API under /metronome: the compatibility checklist's items about
jobs (numbered as in the reference's section 7), run by a daemon over a fake executor with an injected clock."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from corral.jobs.model import JobSpec, JobState
from corral.model.resources import GpuBehavior, Request
from tests.api.test_api import BOB, ROOT
from tests.jobs.harness import World, at, metronome_job

JOBS = "/metronome/v1/jobs"


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def create(c: TestClient, body: dict[str, Any], status: int = 201) -> Any:
    r = c.post(JOBS, json=body)
    assert r.status_code == status, r.text
    return r.json()


def errors_at(body: Any, path: str) -> list[str]:
    assert body["message"] == "Object is not valid"
    return [e for d in body["details"] if d["path"] == path for e in d["errors"]]


def run_now(c: TestClient, job_id: str) -> Any:
    r = c.post(f"{JOBS}/{job_id}/runs")
    assert r.status_code == 201, r.text
    return r.json()


def get_run(c: TestClient, job_id: str, run_id: str) -> Any:
    r = c.get(f"{JOBS}/{job_id}/runs/{run_id}?corral=true")  # with corral's trigger and reason
    assert r.status_code == 200, r.text
    return r.json()


# ------------------------------------------------------------------------------------------------ formats
def test_item1_unknown_keys_missing_resources_and_minimums_get_422_with_paths(world: World) -> None:
    c = world.client()
    body = metronome_job(colour="blue")
    body["owner"] = "me"
    bad = create(c, body, 422)
    assert errors_at(bad, "/run/colour") and errors_at(bad, "/owner")
    assert errors_at(create(c, metronome_job(cpus=None), 422), "/run/cpus") == ["is required"]
    assert errors_at(create(c, metronome_job(mem=31), 422), "/run/mem") == ["must be >= 32, got 31"]
    assert errors_at(create(c, metronome_job(cpus=0.001), 422), "/run/cpus") == ["must be >= 0.01, got 0.001"]
    assert c.get(JOBS).json() == []  # nothing was stored


@pytest.mark.parametrize("job_id", ["a.b-c.d1", "x", "a1.b2"])
def test_item2_good_ids_are_accepted(world: World, job_id: str) -> None:
    assert create(world.client(), metronome_job(job_id))["id"] == job_id


@pytest.mark.parametrize("job_id", ["-a", "a-", "A", "a_b", "a..b"])
def test_item2_bad_ids_are_refused_in_the_body_and_in_the_path(world: World, job_id: str) -> None:
    c = world.client()
    assert errors_at(create(c, metronome_job(job_id), 422), "/id")
    r = c.get(f"{JOBS}/{job_id}")
    assert r.status_code == 400 and r.json() == {"message": f"Not a valid id: {job_id}"}


def test_item3_and_22_gpus_are_whole_and_not_with_docker_cmd_and_ucr_are_fine(tmp_path: Path) -> None:
    world = World(tmp_path, runtime="podman")
    c = world.client()
    frac = create(c, metronome_job(gpus=1.5), 422)
    assert errors_at(frac, "/run/gpus")[0].startswith("GPUs must be a whole number")
    docker = create(c, metronome_job("d", gpus=2, cmd=None, docker={"image": "nvcr.io/x"}), 422)
    assert "GPUs are not supported with Docker" in errors_at(docker, "/run/gpus")
    assert create(c, metronome_job("bare", gpus=2))["run"]["gpus"] == 2
    ucr = metronome_job("ucr", gpus=1, ucr={"image": {"id": "nvcr.io/nvidia/pytorch:24.01"}}, cmd="python t.py")
    assert create(c, ucr)["run"]["ucr"]["image"]["kind"] == "docker"
    # the UCR job runs through the configured runtime, with its GPU granted by UUID at launch
    run = run_now(c, "ucr")
    world.tick()
    launched = world.executor.spec(run["tasks"][0]["id"])
    assert launched.command[:2] == ("/bin/sh", "-c") and launched.command[3:6] == (
        "corral-container",
        "podman",
        "nvcr.io/nvidia/pytorch:24.01",
    )
    assert launched.command[6:] == ("/bin/sh", "-c", "python t.py") and len(launched.gpu_uuids) == 1


def test_item22_an_image_without_a_container_runtime_is_refused_at_admission(world: World) -> None:
    c = world.client()
    ucr = metronome_job("ucr", ucr={"image": {"id": "busybox"}})
    body = create(c, ucr, 422)
    assert errors_at(body, "/run/ucr") == [
        "job ucr names the container image 'busybox', but this corral serve has no container runtime: start it "
        "with --container-runtime docker (or podman), or give a command without an image"
    ]
    assert c.get(f"{JOBS}/ucr").status_code == 404


def test_item22_a_request_this_machine_can_never_hold_is_refused_at_admission(world: World) -> None:
    body = create(world.client(), metronome_job("huge", gpus=3), 422)
    (message,) = errors_at(body, "/run/gpus")
    assert message.startswith("can never run on this machine: 0/1 nodes fit")


def test_item4_defaults_are_echoed(world: World) -> None:
    world.clock.set(at("2024-05-01T10:00:00Z"))
    c = world.client()
    body = metronome_job(
        artifacts=[{"uri": "http://x/y.tgz"}],
        placement={"constraints": [{"attribute": "hostname", "operator": "EQ", "value": world.daemon.node.name}]},
    )
    body["schedules"] = [{"id": "daily", "cron": "0 3 * * *"}]
    refused = create(c, body, 422)  # corral fetches nothing: said at admission rather than failing every run
    assert errors_at(refused, "/run/artifacts") == [
        "corral does not fetch artifacts: put the files on this machine (or in the image) instead"
    ]
    del body["run"]["artifacts"]
    job = create(c, body)
    assert job["run"]["maxLaunchDelay"] == 3600 and job["run"]["restart"] == {"policy": "NEVER"}
    assert job["run"]["placement"]["constraints"][0]["operator"] == "IS"
    assert job["schedules"] == [
        {
            "id": "daily",
            "cron": "0 3 * * *",
            "timezone": "UTC",
            "startingDeadlineSeconds": 900,
            "concurrencyPolicy": "ALLOW",
            "enabled": True,
            "nextRunAt": "2024-05-02T03:00:00.000Z",
        }
    ]
    assert c.get(f"{JOBS}/nightly").json() == job


def test_item5_one_schedule_no_schedules_with_dependencies_put_keeps_schedules(world: World) -> None:
    c = world.client()
    create(c, metronome_job("parent"))
    create(c, {**metronome_job(), "schedules": [{"id": "s1", "cron": "0 * * * *"}]})
    second = c.post(f"{JOBS}/nightly/schedules", json={"id": "s2", "cron": "0 1 * * *"})
    assert second.status_code == 409 and second.json() == {"message": "Only one schedule supported at the moment"}
    again = c.post(f"{JOBS}/nightly/schedules", json={"id": "s1", "cron": "0 1 * * *"})
    assert again.status_code == 409 and again.json() == {"message": "A schedule with id s1 already exists"}
    both = {
        **metronome_job("both"),
        "schedules": [{"id": "s", "cron": "0 * * * *"}],
        "dependencies": [{"id": "parent"}],
    }
    assert errors_at(create(c, both, 422), "/") == ["Jobs may not have both dependencies and schedules specified"]
    r = c.put(f"{JOBS}/nightly", json=metronome_job(cmd="echo changed"))
    assert r.status_code == 200, r.text
    assert r.json()["run"]["cmd"] == "echo changed" and [s["id"] for s in r.json()["schedules"]] == ["s1"]
    assert c.get(f"{JOBS}/nightly/schedules/s1").json()["cron"] == "0 * * * *"
    missing = c.get(f"{JOBS}/nightly/schedules/zz")
    assert missing.status_code == 404 and missing.json() == {"message": "Schedule not found"}
    unknown = create(c, {**metronome_job("orphan"), "dependencies": [{"id": "nope"}]}, 422)
    assert errors_at(unknown, "/dependencies") == ["Dependencies contain unknown jobs. unknown=[nope]"]
    create(c, {**metronome_job("child"), "dependencies": [{"id": "parent"}]})
    cycle = c.put(f"{JOBS}/parent", json={**metronome_job("parent"), "dependencies": [{"id": "child"}]})
    assert cycle.status_code == 422 and errors_at(cycle.json(), "/dependencies") == ["Dependencies have a cycle."]


def test_item6_cron_dom_and_dow_both_match_and_impossible_or_short_deadlines_are_refused(tmp_path: Path) -> None:
    world = World(tmp_path, start="2017-10-02T10:00:00Z")
    c = world.client()
    job = create(c, {**metronome_job(), "schedules": [{"id": "first-monday", "cron": "0 9 1-7 * 1"}]})
    assert job["schedules"][0]["nextRunAt"] == "2017-11-06T09:00:00.000Z"
    feb = c.post(f"{JOBS}/nightly/schedules", json={"id": "x", "cron": "0 0 31 2 *"})
    assert feb.status_code == 422 and errors_at(feb.json(), "/cron")[0].startswith("Day of the month must exist")
    short = create(
        c, {**metronome_job("b"), "schedules": [{"id": "s", "cron": "* * * * *", "startingDeadlineSeconds": 30}]}, 422
    )
    assert errors_at(short, "/schedules/0/startingDeadlineSeconds") == ["must be >= 60 seconds, got 30"]
    # nothing ran on the 2nd of October or on any other day of the first week but the Monday
    world.clock.set(at("2017-11-06T09:00:00Z"))
    world.tick()
    assert [j.spec.origin.split(":")[2][:14] for j in world.jobs()] == ["20171106090000"]


# ------------------------------------------------------------------------------------------------ runs
def test_item9_on_failure_relaunches_within_the_active_deadline_then_fails(world: World) -> None:
    c = world.client()
    create(c, metronome_job(restart={"policy": "ON_FAILURE", "activeDeadlineSeconds": 60}))
    run = run_now(c, "nightly")
    world.tick()
    first = run["tasks"][0]["id"]
    world.clock.advance(30)
    world.finish(first, 1)  # fails at 30 s: relaunched at once, no back-off
    tasks = get_run(c, "nightly", run["id"])["tasks"]
    assert [t["status"] for t in tasks] == ["TASK_FAILED", "TASK_RUNNING"]
    assert get_run(c, "nightly", run["id"])["status"] == "ACTIVE"
    world.clock.advance(40)
    world.finish(tasks[1]["id"], 1)  # fails at 70 s: past the deadline
    done = get_run(c, "nightly", run["id"])
    assert done["status"] == "FAILED" and len(done["tasks"]) == 2
    assert done["reason"] == f"task {tasks[1]['id']} failed (exit code 1)"


def test_item9_never_makes_the_first_failure_final_and_a_kill_is_a_failure(world: World) -> None:
    c = world.client()
    create(c, metronome_job("never"))
    create(c, metronome_job("again", restart={"policy": "ON_FAILURE"}))
    never = run_now(c, "never")
    again = run_now(c, "again")
    world.tick()
    world.finish(never["tasks"][0]["id"], 2)
    assert get_run(c, "never", never["id"])["status"] == "FAILED"
    killed = c.post(f"/v1/jobs/{again['tasks'][0]['id']}/cancel")  # corral cancel of the task: TASK_KILLED
    assert killed.status_code == 200
    world.tick()
    tasks = get_run(c, "again", again["id"])["tasks"]
    assert [t["status"] for t in tasks] == ["TASK_KILLED", "TASK_RUNNING"]  # ON_FAILURE, no deadline: relaunched


def test_item10_scheduled_run_not_active_within_its_starting_deadline_fails_manual_runs_wait(world: World) -> None:
    c = world.client()
    hog = world.daemon.submit(JobSpec(("hog",), Request(1000, 1024, gpu_count=2, gpu_milli=1000), "carol", 7, 7))
    world.tick()
    body = metronome_job(gpus=2)
    body["schedules"] = [{"id": "s", "cron": "*/10 * * * *", "startingDeadlineSeconds": 60}]
    create(c, body)
    manual = run_now(c, "nightly")
    world.clock.set(at("2024-01-01T00:10:00Z"))
    world.tick()
    scheduled = next(r for r in c.get(f"{JOBS}/nightly/runs?corral=true").json() if r["trigger"] == "schedule")
    assert scheduled["status"] == "STARTING"
    assert c.get("/metronome/v1/queue").json() == [
        {"jobId": "nightly", "runs": [{"runId": manual["id"]}, {"runId": scheduled["id"]}]}
    ]
    world.clock.set(at("2024-01-01T00:11:01Z"))
    world.tick()
    failed = get_run(c, "nightly", scheduled["id"])
    assert failed["status"] == "FAILED" and failed["tasks"][0]["status"] == "TASK_KILLED"
    assert failed["reason"] == "not started within its starting deadline (60 s after its scheduled time): aborted"
    assert world.store.get(failed["tasks"][0]["id"]).state is JobState.CANCELLED  # type: ignore[union-attr]
    assert get_run(c, "nightly", manual["id"])["status"] == "STARTING"  # manual runs have no deadline
    world.executor.finish(hog.id, 0)
    world.tick()
    assert get_run(c, "nightly", manual["id"])["status"] == "ACTIVE"


def test_item11_forbid_skips_ticks_while_a_run_is_active_manual_runs_still_run_disabled_never_ticks(
    world: World,
) -> None:
    c = world.client()
    forbid = {**metronome_job("f"), "schedules": [{"id": "s", "cron": "*/5 * * * *", "concurrencyPolicy": "FORBID"}]}
    off = {**metronome_job("off"), "schedules": [{"id": "s", "cron": "*/5 * * * *", "enabled": False}]}
    create(c, forbid)
    create(c, off)
    world.clock.set(at("2024-01-01T00:05:00Z"))
    world.tick()
    (first,) = c.get(f"{JOBS}/f/runs").json()
    world.clock.set(at("2024-01-01T00:10:00Z"))
    world.tick()
    assert [r["id"] for r in c.get(f"{JOBS}/f/runs").json()] == [first["id"]]  # skipped silently
    manual = run_now(c, "f")
    assert manual["status"] == "STARTING" and len(c.get(f"{JOBS}/f/runs").json()) == 2
    assert c.get(f"{JOBS}/off/runs").json() == []
    assert world.jobs("metronome:off") == []
    assert world.ctl.state("f")["forbidden_ticks"] == 1


def test_item12_run_ids_and_status_sequence(world: World) -> None:
    c = world.client()
    create(c, metronome_job(restart={"policy": "ON_FAILURE"}))
    run = run_now(c, "nightly")
    assert re.fullmatch(r"\d{14}[A-Za-z0-9]{5}", run["id"]) and run["id"].startswith("20240101000000")
    seen = [run["status"]]
    world.tick()
    seen.append(get_run(c, "nightly", run["id"])["status"])
    world.finish(run["tasks"][0]["id"], 1)  # relaunched: the run stays ACTIVE
    seen.append(get_run(c, "nightly", run["id"])["status"])
    world.finish(get_run(c, "nightly", run["id"])["tasks"][1]["id"], 0)
    seen.append(get_run(c, "nightly", run["id"])["status"])
    assert seen == ["STARTING", "ACTIVE", "ACTIVE", "SUCCESS"]
    assert get_run(c, "nightly", run["id"])["completedAt"] == "2024-01-01T00:00:00.000Z"
    missing = c.get(f"{JOBS}/nightly/runs/20240101000000xxxxx")
    assert missing.status_code == 404 and missing.json() == {"message": "Job Run not found"}


def test_stop_a_run_kills_its_task_and_fails_it_even_under_on_failure(world: World) -> None:
    c = world.client()
    create(c, metronome_job(restart={"policy": "ON_FAILURE"}))
    run = run_now(c, "nightly")
    world.tick()
    stopped = c.post(f"{JOBS}/nightly/runs/{run['id']}/actions/stop")
    assert stopped.status_code == 200
    world.tick()
    done = get_run(c, "nightly", run["id"])
    assert done["status"] == "FAILED" and done["reason"] == "stopped" and len(done["tasks"]) == 1


# ------------------------------------------------------------------------------------------------ GPU
@pytest.mark.parametrize(
    ("global_mode", "label", "runs"),
    [
        (GpuBehavior.UNRESTRICTED, "restricted", False),
        (GpuBehavior.UNRESTRICTED, None, True),
        (GpuBehavior.RESTRICTED, "unrestricted", True),
        (GpuBehavior.RESTRICTED, None, False),
        (GpuBehavior.RESTRICTED, "sometimes", False),  # an invalid label is ignored
    ],
)
def test_item21_gpu_scheduling_behavior_label_works_per_job(
    tmp_path: Path, global_mode: GpuBehavior, label: str | None, runs: bool
) -> None:
    world = World(tmp_path, behavior=global_mode)
    c = world.client()
    body = metronome_job("cpu-only")
    if label is not None:
        body["labels"] = {"GPU_SCHEDULING_BEHAVIOR": label}
    create(c, body)
    run = run_now(c, "cpu-only")
    world.tick()
    (job,) = world.jobs("metronome:cpu-only")
    assert (job.state is JobState.RUNNING) == runs
    if not runs:
        assert "DeclinedScarceResources" in job.reason or "GPU node kept for GPU work" in job.reason, job.reason
        assert get_run(c, "cpu-only", run["id"])["status"] == "STARTING"


# ------------------------------------------------------------------------------------------------ API rules
def test_others_see_404_with_metronomes_text_and_root_sees_all(world: World) -> None:
    alice, bob, root = world.client(), world.client(BOB), world.client(ROOT)
    create(alice, metronome_job())
    r = bob.get(f"{JOBS}/nightly")
    assert r.status_code == 404 and r.json() == {"id": "nightly", "message": "Job not found"}
    assert bob.post(f"{JOBS}/nightly/runs").status_code == 404
    assert bob.get(JOBS).json() == []
    assert [j["id"] for j in root.get(JOBS).json()] == ["nightly"]
    taken = bob.post(JOBS, json=metronome_job())
    assert taken.status_code == 409 and taken.json() == {"message": "Job with this id already exists"}
    bad = alice.get(JOBS, params={"embed": "everything"})
    assert bad.status_code == 400 and bad.json()["message"].startswith("Unknown embed options: everything")


def test_delete_refused_with_active_runs_or_dependants_then_allowed(world: World) -> None:
    c = world.client()
    create(c, metronome_job("parent"))
    create(c, {**metronome_job("child"), "dependencies": [{"id": "parent"}]})
    run = run_now(c, "parent")
    world.tick()
    busy = c.delete(f"{JOBS}/parent")
    assert busy.status_code == 409
    assert busy.json() == {"message": "There are active job runs. Override with stopCurrentJobRuns=true"}
    c.delete(f"{JOBS}/child")
    r = c.delete(f"{JOBS}/parent", params={"stopCurrentJobRuns": "true"})
    assert r.status_code == 200 and r.json()["id"] == "parent"
    world.tick()
    assert world.store.get(run["tasks"][0]["id"]).state is JobState.CANCELLED  # type: ignore[union-attr]
    assert c.get(JOBS).json() == [] and world.store.list_docs("jobs.run") == []


def test_depended_on_job_cannot_be_deleted(world: World) -> None:
    c = world.client()
    create(c, metronome_job("parent"))
    create(c, {**metronome_job("child"), "dependencies": [{"id": "parent"}]})
    r = c.delete(f"{JOBS}/parent")
    assert r.status_code == 409 and r.json() == {"message": "Job parent is a dependency of child; delete them first"}


def test_dependencies_child_runs_after_parents_succeed_once_per_round(world: World) -> None:
    c = world.client()
    create(c, metronome_job("a"))
    create(c, metronome_job("b"))
    create(c, {**metronome_job("child"), "dependencies": [{"id": "a"}, {"id": "b"}]})
    ra, rb = run_now(c, "a"), run_now(c, "b")
    world.tick()
    world.clock.advance(1)
    world.finish(ra["tasks"][0]["id"], 0)
    assert world.jobs("metronome:child") == []  # b has not succeeded yet
    world.finish(rb["tasks"][0]["id"], 1)
    assert world.jobs("metronome:child") == []  # b failed
    rb2 = run_now(c, "b")
    world.tick()
    world.clock.advance(1)
    world.finish(rb2["tasks"][0]["id"], 0)
    (child,) = world.jobs("metronome:child")
    (run,) = c.get(f"{JOBS}/child/runs?corral=true").json()
    assert run["trigger"] == "dependency"
    world.finish(child.id, 0)
    world.tick()
    assert len(world.jobs("metronome:child")) == 1  # not again until the parents run again


def test_corrals_own_definitions_api_names_the_first_bad_path_once(world: World) -> None:
    c = world.client()
    r = c.post("/v1/definitions", json={"id": "bad job"})
    assert r.status_code == 422 and r.json() == {"detail": {"field": "/run", "message": "is required"}}
    r = c.post("/v1/definitions", json={"id": "ok", "run": {"cpus": 1, "mem": 31, "disk": 0, "cmd": "x", "gpus": 1.5}})
    detail = r.json()["detail"]
    assert detail["field"].startswith("/run/") and not detail["message"].startswith("/")
    assert "; /run/" in detail["message"]  # the other invalid paths follow, each named once


def test_a_task_that_ended_while_the_daemon_was_down_is_its_real_outcome_not_a_relaunch(tmp_path: Path) -> None:
    from corral.store import SqliteStore

    world = World(tmp_path, store=SqliteStore(tmp_path / "jobs.db"))
    c = world.client()
    create(c, metronome_job("ok", restart={"policy": "ON_FAILURE", "activeDeadlineSeconds": 600}))
    create(c, metronome_job("bad", restart={"policy": "ON_FAILURE", "activeDeadlineSeconds": 600}))
    ok, bad = run_now(c, "ok"), run_now(c, "bad")
    world.tick()
    machine = world.executor.restarted()  # the daemon is down; both tasks end under their supervisors meanwhile
    machine.finish(ok["tasks"][0]["id"], 0)
    machine.finish(bad["tasks"][0]["id"], 4)
    world.executor = machine
    back = world.restarted()
    back.tick()
    c = back.client()
    done = get_run(c, "ok", ok["id"])
    assert done["status"] == "SUCCESS" and [t["status"] for t in done["tasks"]] == ["TASK_FINISHED"]
    relaunched = get_run(c, "bad", bad["id"])  # a real failure: ON_FAILURE relaunches, once
    assert [t["status"] for t in relaunched["tasks"]] == ["TASK_FAILED", "TASK_RUNNING"]
    assert (
        relaunched["reason"]
        == f"task {bad['tasks'][0]['id']} failed (exit code 4); relaunched (restart policy ON_FAILURE)"
    )
    history = c.get(f"{JOBS}/ok", params={"embed": "history"}).json()["history"]
    assert (history["successCount"], history["failureCount"]) == (1, 0)
