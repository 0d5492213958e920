"""Schedules in the daemon with an injected clock (time zones, a daylight-saving change, restarts between ticks and
in the middle of a trigger), and Chronos jobs through /chronos: checklist items 7 and 13, parents, softError, and
dependency state that survives a restart (Chronos lost it on a leader change, its issue #811)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from corral.jobs.controller import SCHEDULE_DECISIONS_PER_ROUND
from corral.jobs.definitions import DEF, RUN, iso
from corral.jobs.model import JobState
from corral.mesos.chronos import ChronosDefaults
from corral.schedule.iso8601 import IsoDuration
from corral.store import SqliteStore
from corral.store.base import StoreError
from tests.api.test_api import BOB
from tests.jobs.harness import World, at, metronome_job
from tests.schedule.counting import counted

JOBS = "/metronome/v1/jobs"
CHRONOS = "/chronos/v1/scheduler"


def scheduled(c: TestClient, cron: str, tz: str = "UTC", job_id: str = "nightly", **extra: Any) -> None:
    body = {**metronome_job(job_id), "schedules": [{"id": "s", "cron": cron, "timezone": tz, **extra}]}
    r = c.post(JOBS, json=body)
    assert r.status_code == 201, r.text


def run_ticks(world: World, prefix: str = "metronome:nightly") -> list[str]:
    """The scheduled instants of the runs created so far, from the run documents."""
    runs = [body for _, body, _ in world.store.list_docs(RUN) if body["trigger"] == "schedule"]
    return sorted(at_iso(r["tick"]) for r in runs if f"{r['job']}" == prefix.split(":")[1])


def at_iso(t: float) -> str:
    text = iso(t)
    assert text is not None
    return text


def step(world: World, until: str, every_s: float = 600, complete: bool = False) -> None:
    """Rounds every `every_s` seconds up to `until` (a daemon's rounds are much closer; the rule does not care).
    `complete`: every running task succeeds before each round."""
    end = at(until).timestamp()
    while world.clock.t + every_s <= end:
        world.clock.advance(every_s)
        if complete:
            for job in world.running():
                world.executor.finish(job.id, 0)
        world.tick()
    world.clock.t = max(world.clock.t, end)
    world.tick()


# ------------------------------------------------------------------------------------------------ cron
def test_cron_in_a_time_zone_keeps_its_wall_time_across_the_spring_dst_change(tmp_path: Path) -> None:
    world = World(tmp_path, start="2024-03-29T12:00:00Z")
    scheduled(world.client(), "0 9 * * *", "Europe/Berlin")
    step(world, "2024-04-01T12:00:00Z", every_s=1800)
    # 09:00 in Berlin: 08:00Z in winter time, 07:00Z from March 31 (summer time)
    assert run_ticks(world) == [
        "2024-03-30T08:00:00.000Z",
        "2024-03-31T07:00:00.000Z",
        "2024-04-01T07:00:00.000Z",
    ]


def test_cron_in_the_skipped_hour_fires_once_shifted_by_the_gap(tmp_path: Path) -> None:
    world = World(tmp_path, start="2024-03-09T12:00:00Z")
    scheduled(world.client(), "30 2 * * *", "America/New_York")
    step(world, "2024-03-11T12:00:00Z", every_s=1800)
    # 02:30 EST on the 10th does not exist: it fires at 03:30 EDT (07:30Z), once
    assert run_ticks(world) == ["2024-03-10T07:30:00.000Z", "2024-03-11T06:30:00.000Z"]


def test_a_restart_between_two_ticks_neither_loses_nor_repeats_one(tmp_path: Path) -> None:
    world = World(tmp_path, start="2024-01-01T00:00:00Z", store=SqliteStore(tmp_path / "jobs.db"))
    scheduled(world.client(), "*/10 * * * *")
    step(world, "2024-01-01T00:10:00Z")
    assert run_ticks(world) == ["2024-01-01T00:10:00.000Z"]
    world.clock.set(at("2024-01-01T00:15:00Z"))
    again = world.restarted()
    again.tick()
    assert run_ticks(again) == ["2024-01-01T00:10:00.000Z"]  # the 00:10 tick is not run again
    step(again, "2024-01-01T00:20:00Z")
    assert run_ticks(again) == ["2024-01-01T00:10:00.000Z", "2024-01-01T00:20:00.000Z"]


def test_ticks_missed_while_down_run_once_within_the_deadline_and_are_counted(tmp_path: Path) -> None:
    world = World(tmp_path, start="2024-01-01T00:00:00Z", store=SqliteStore(tmp_path / "jobs.db"))
    scheduled(world.client(), "*/10 * * * *", startingDeadlineSeconds=300)
    world.clock.set(at("2024-01-01T00:32:00Z"))  # down over 00:10, 00:20 and 00:30
    back = world.restarted()
    back.tick()
    assert run_ticks(back) == ["2024-01-01T00:30:00.000Z"]  # the latest, 2 min late, within its 5 min deadline
    assert back.ctl.state("nightly")["missed_ticks"] == 2
    back.clock.set(at("2024-01-01T00:46:00Z"))  # 00:40 is 6 min late: past its deadline, dropped
    later = back.restarted()
    later.tick()
    assert run_ticks(later) == ["2024-01-01T00:30:00.000Z"] and later.ctl.state("nightly")["missed_ticks"] == 3


def test_a_crash_between_deciding_a_tick_and_writing_its_run_runs_it_exactly_once(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    world = World(tmp_path, start="2024-01-01T00:00:00Z", store=store)
    scheduled(world.client(), "*/10 * * * *")
    real_put = store.put_doc

    def failing_put(kind: str, key: str, body: Any, **kw: Any) -> int:
        if kind == RUN:
            raise StoreError("disk full")
        return real_put(kind, key, body, **kw)

    store.put_doc = failing_put  # type: ignore[method-assign]
    world.clock.set(at("2024-01-01T00:10:00Z"))
    world.tick()  # the cursor and the pending run are stored; the run document is not
    assert run_ticks(world) == [] and world.ctl.state("nightly")["pending"] is not None
    store.put_doc = real_put  # type: ignore[method-assign]
    world.clock.set(at("2024-01-01T00:11:00Z"))
    again = world.restarted()
    again.tick()
    again.tick()
    assert run_ticks(again) == ["2024-01-01T00:10:00.000Z"] and len(again.jobs("metronome:nightly")) == 1


# ------------------------------------------------------------------------------------------------ Chronos
def post(c: TestClient, body: dict[str, Any], endpoint: str = "iso8601", status: int = 204) -> Any:
    r = c.post(f"{CHRONOS}/{endpoint}", json=body)
    assert r.status_code == status, r.text
    return r.json() if r.content else None


def chronos_job(c: TestClient, name: str) -> Any:
    return next(j for j in c.get(f"{CHRONOS}/jobs").json() if j["name"] == name)


def test_item7_every_two_hours_forever(tmp_path: Path) -> None:
    world = World(tmp_path, start="2024-01-01T00:30:00Z")
    c = world.client()
    post(c, {"name": "every2h", "command": "true", "schedule": "R/2014-03-08T20:00:00Z/PT2H"})
    world.tick()  # the start has long passed: its missed periods collapse into one run now
    step(world, "2024-01-01T06:30:00Z", every_s=900, complete=True)
    runs = sorted(r["tick"] for _, r, _ in world.store.list_docs(RUN))
    assert [at_iso(t) for t in runs] == [
        "2024-01-01T00:00:00.000Z",
        "2024-01-01T02:00:00.000Z",
        "2024-01-01T04:00:00.000Z",
        "2024-01-01T06:00:00.000Z",
    ]
    assert chronos_job(c, "every2h")["schedule"] == "R/2024-01-01T08:00:00.000Z/PT2H"


def test_item7_r3_runs_three_times_then_is_disabled_and_counts_down(tmp_path: Path) -> None:
    world = World(tmp_path, start="2024-01-01T00:00:00Z")
    c = world.client()
    post(c, {"name": "thrice", "command": "true", "schedule": "R3/2024-01-01T01:00:00Z/PT1H"})
    assert chronos_job(c, "thrice")["schedule"].startswith("R3/2024-01-01T01:00:00")
    step(world, "2024-01-01T01:00:00Z")
    assert chronos_job(c, "thrice")["schedule"].startswith("R2/2024-01-01T02:00:00")
    assert chronos_job(c, "thrice")["disabled"] is False
    step(world, "2024-01-01T08:00:00Z", complete=True)
    assert len(world.jobs("chronos:thrice")) == 3
    assert chronos_job(c, "thrice")["disabled"] is True


def test_item7_no_schedule_and_no_parents_runs_once_now_and_zero_resources_take_the_defaults(tmp_path: Path) -> None:
    world = World(tmp_path)
    c = world.client()
    post(c, {"name": "once", "command": "echo once", "cpus": 0, "mem": 0})
    (job,) = world.jobs("chronos:once")
    assert job.spec.request.cpu_milli == 100 and job.spec.request.memory_mib == 128
    assert job.spec.command == ("/bin/sh", "-c", "echo once") and job.spec.retries == 0
    shown = chronos_job(c, "once")
    assert (shown["cpus"], shown["mem"], shown["disk"]) == (0.1, 128, 256)
    world.tick()
    world.finish(job.id, 0)
    assert chronos_job(c, "once")["successCount"] == 1 and len(world.jobs("chronos:once")) == 1


def test_item13_retries_are_spaced_by_the_retry_delay_and_soft_error_fires_children(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.ctl.chronos_defaults = ChronosDefaults(failure_retry_s=60)
    c = world.client()
    post(c, {"name": "flaky", "command": "false", "schedule": "R1/2024-01-01T00:10:00Z/PT1H", "retries": 2,
             "softError": True})  # fmt: skip
    post(c, {"name": "after", "command": "true", "parents": ["flaky"]}, "dependency")
    step(world, "2024-01-01T00:10:00Z")
    starts = []
    for _ in range(3):
        (live,) = [j for j in world.jobs("chronos:flaky") if not j.state.final]
        world.tick()
        job = world.store.get(live.id)
        assert job is not None and job.started_at is not None
        starts.append(job.started_at - at("2024-01-01T00:10:00Z").timestamp())
        assert world.jobs("chronos:after") == []  # not while flaky still has attempts left
        world.finish(live.id, 1)
        world.clock.advance(30)
        world.tick()
        world.clock.advance(30)
        world.tick()
    assert starts == [0, 60, 120]  # 3 attempts (retries: 2), a retry delay apart
    assert len(world.jobs("chronos:flaky")) == 3
    shown = chronos_job(c, "flaky")
    assert shown["errorCount"] == 1 and shown["errorsSinceLastSuccess"] == 1 and shown["lastError"]
    assert len(world.jobs("chronos:after")) == 1  # softError: the child runs after the final failure


def test_item13_concurrent_false_never_overlaps(tmp_path: Path) -> None:
    world = World(tmp_path)
    c = world.client()
    post(c, {"name": "slow", "command": "sleep 1000", "schedule": "R/2024-01-01T00:10:00Z/PT10M"})
    step(world, "2024-01-01T01:00:00Z")
    assert len(world.jobs("chronos:slow")) == 1  # the first run is still going: every later tick is skipped
    (job,) = world.jobs("chronos:slow")
    world.finish(job.id, 0)
    step(world, "2024-01-01T01:10:00Z")
    assert len(world.jobs("chronos:slow")) == 2


def test_multiple_parents_state_survives_a_restart(tmp_path: Path) -> None:
    world = World(tmp_path, store=SqliteStore(tmp_path / "jobs.db"))
    c = world.client()
    for name in ("a", "b"):
        post(c, {"name": name, "command": "true", "schedule": "R/2030-01-01T00:00:00Z/P1D"})
    post(c, {"name": "child", "command": "true", "parents": ["a", "b"]}, "dependency")
    c.put(f"{CHRONOS}/job/a")
    world.tick()
    (a,) = world.jobs("chronos:a")
    world.finish(a.id, 0)
    assert world.jobs("chronos:child") == []
    world.clock.advance(60)
    again = world.restarted()  # a's success is remembered across the restart
    c2 = again.client()
    assert c2.put(f"{CHRONOS}/job/b").status_code == 204
    again.tick()
    (b,) = again.jobs("chronos:b")
    again.finish(b.id, 0)
    (child,) = again.jobs("chronos:child")
    assert child.state in (JobState.QUEUED, JobState.RUNNING)
    # the next round needs both parents again: a alone does not start the child
    c2.put(f"{CHRONOS}/job/a")
    again.tick()
    again.finish(next(j.id for j in again.jobs("chronos:a") if not j.state.final), 0)
    assert len(again.jobs("chronos:child")) == 1


def test_chronos_errors_and_updates(tmp_path: Path) -> None:
    world = World(tmp_path)
    c = world.client()
    bad = post(c, {"name": "x", "command": "true", "schedule": "R/1960-01-01T00:00:00Z/PT1H"}, status=400)
    assert bad["status"] == "Bad Request" and bad["details"][0]["path"] == "/schedule"
    assert bad["message"] == "/schedule: start '1960-01-01T00:00:00Z' is before 1970-01-01T00:00:00Z"
    frac = post(c, {"name": "x", "command": "true", "gpus": 0.5}, status=400)
    assert frac["details"][0]["path"] == "/gpus"
    orphan = post(c, {"name": "x", "command": "true", "parents": ["nope"]}, "dependency", status=400)
    assert orphan["details"] == [{"path": "/parents", "errors": ["unknown parent jobs: nope"]}]
    post(c, {"name": "x", "command": "true", "schedule": "R/2030-01-01T00:00:00Z/P1D"})
    post(c, {"name": "x", "command": "echo updated", "schedule": "R/2030-01-01T00:00:00Z/P1D"})
    assert chronos_job(c, "x")["command"] == "echo updated"
    missing = c.put(f"{CHRONOS}/job/nope")
    assert missing.status_code == 404 and missing.json() == {"status": "Not Found", "message": "Job 'nope' not found"}
    assert c.delete(f"{CHRONOS}/job/x").status_code == 204
    assert c.get(f"{CHRONOS}/jobs").json() == []


@pytest.mark.parametrize("path", ["/chronos/scheduler/jobs", "/chronos/v1/scheduler/jobs"])
def test_chronos_2_and_3_paths(tmp_path: Path, path: str) -> None:
    world = World(tmp_path)
    assert world.client().get(path).json() == []


# ------------------------------------------------------------------------------------------------ hostile schedules
def test_a_sub_second_period_is_refused_and_pt1s_from_2000_costs_a_bounded_number_of_steps(tmp_path: Path) -> None:
    # Issue 12, finding 2: R/2020-01-01T00:00:00Z/PT0.001S held the daemon's lock for 55 s.
    world = World(tmp_path, start="2026-11-26T12:00:00.250Z")
    c = world.client()
    refused = post(c, {"name": "fast", "command": "true", "schedule": "R/2020-01-01T00:00:00Z/PT0.001S"}, status=400)
    why = (
        "period PT0.001S is shorter than the minimum of 1 second: every tick starts a run, and corral "
        "starts runs at most once a second per schedule (use PT1S or longer)"
    )
    assert refused == {
        "status": "Bad Request",
        "message": f"/schedule: {why}",
        "details": [{"path": "/schedule", "errors": [why]}],
    }
    own = c.post("/v1/definitions", json={"name": "fast", "command": "true", "schedule": "R//PT0.5S"})
    assert own.status_code == 422 and own.json()["detail"]["field"] == "/schedule"
    assert own.json()["detail"]["message"].startswith("period PT0.5S is shorter than the minimum of 1 second")
    assert c.get(f"{CHRONOS}/jobs").json() == []
    # PT1S from the year 2000: 845 million ticks have passed, all collapsed into one run, in a few tick evaluations.
    post(c, {"name": "every-second", "command": "true", "schedule": "R/2000-01-01T00:00:00Z/PT1S"})
    with counted(IsoDuration, "add_to") as calls:
        world.tick()
        world.clock.advance(1)
        world.tick()
    assert calls[0] <= 30, f"{calls[0]} tick evaluations in two rounds"
    ticks = sorted(at_iso(r["tick"]) for _, r, _ in world.store.list_docs(RUN))
    assert ticks == ["2026-11-26T12:00:00.000Z"]  # the second run waits: concurrent is false and the first runs
    state = world.ctl.state("every-second")
    # Every second up to 12:00:00 but the one that ran; 12:00:01 was skipped (a run was active), not missed.
    assert state["missed_ticks"] == (at("2026-11-26T12:00:00Z") - at("2000-01-01T00:00:00Z")).total_seconds()
    assert state["forbidden_ticks"] == 1
    assert chronos_job(c, "every-second")["schedule"] == "R/2026-11-26T12:00:02.000Z/PT1S"


def test_twenty_schedules_due_at_once_are_decided_a_bounded_number_per_round_earliest_first(tmp_path: Path) -> None:
    world = World(tmp_path, start="2026-11-26T11:59:00Z")
    c = world.client()
    for i in range(20):
        # job-00 is due last: the names' order is not the order of due times
        post(c, {"name": f"job-{i:02d}", "command": "true", "schedule": f"R/2026-11-26T12:00:{19 - i:02d}Z/PT1H"})
    world.tick()  # nothing due yet: every schedule now knows its next tick
    world.clock.t = at("2026-11-26T12:01:00Z").timestamp()  # all 20 are due
    runs_per_round = []
    for _ in range(20 // SCHEDULE_DECISIONS_PER_ROUND + 2):
        before = len(world.store.list_docs(RUN))
        world.clock.advance(0.2)
        world.tick()
        runs_per_round.append(len(world.store.list_docs(RUN)) - before)
    expected = [SCHEDULE_DECISIONS_PER_ROUND] * (20 // SCHEDULE_DECISIONS_PER_ROUND)
    assert runs_per_round == [*expected, 0, 0]
    # The earliest due first: the order of the runs is the order of the ticks, each run for its own tick.
    runs = sorted((r["created_at"], r["tick"], r["job"]) for _, r, _ in world.store.list_docs(RUN))
    assert [at_iso(tick) for _, tick, _ in runs] == [f"2026-11-26T12:00:{i:02d}.000Z" for i in range(20)]
    assert [job for _, _, job in runs] == [f"job-{19 - i:02d}" for i in range(20)]


def test_a_huge_starting_deadline_does_not_stop_the_rounds(tmp_path: Path) -> None:
    # 10^15 s overflowed a datetime in every round, so the controller failed for every job definition.
    # Admission now refuses it (docs/limits.md), but a definition an older corral stored may still carry it.
    world = World(tmp_path, start="2024-01-01T00:00:30Z")
    body = {
        **metronome_job("nightly"),
        "schedules": [{"id": "s", "cron": "*/10 * * * *", "startingDeadlineSeconds": 10**15}],
    }
    refused = world.client().post(JOBS, json=body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["details"][0]["path"] == "/schedules/0/startingDeadlineSeconds"
    scheduled(world.client(), "*/10 * * * *", startingDeadlineSeconds=60)
    scheduled(world.client(), "*/10 * * * *", job_id="other")
    doc = world.ctl.book.get(DEF, "nightly")
    assert doc is not None
    stored = {
        **doc,
        "spec": {**doc["spec"], "schedules": [{**doc["spec"]["schedules"][0], "startingDeadlineSeconds": 10**15}]},
    }
    world.ctl.book.put(DEF, "nightly", stored)  # as an older corral stored it, past today's admission
    step(world, "2024-01-01T00:20:30Z")
    assert run_ticks(world) == []  # a stored definition that breaks today's rules is left out (logged), not run
    assert run_ticks(world, "metronome:other") == ["2024-01-01T00:10:00.000Z", "2024-01-01T00:20:00.000Z"]


# ------------------------------------------------------------------------------------------------ Chronos' other routes
def test_deleting_a_dependent_job_hands_its_parents_to_its_children(tmp_path: Path) -> None:
    world = World(tmp_path)
    c = world.client()
    post(c, {"name": "root", "command": "true", "schedule": "R/2030-01-01T00:00:00Z/P1D"})
    post(c, {"name": "middle", "command": "true", "parents": ["root"]}, "dependency")
    post(c, {"name": "leaf", "command": "true", "parents": ["middle"]}, "dependency")
    assert c.delete(f"{CHRONOS}/job/middle").status_code == 204
    assert chronos_job(c, "leaf")["parents"] == ["root"]
    # The leaf now runs after root's successes, as middle did.
    c.put(f"{CHRONOS}/job/root")
    world.tick()
    (root,) = world.jobs("chronos:root")
    world.finish(root.id, 0)
    assert len(world.jobs("chronos:leaf")) == 1
    graph = c.get(f"{CHRONOS}/graph/csv")
    assert graph.text.splitlines()[-1] == "link,root,leaf"


def test_search_summary_corral_extras_and_small_routes(tmp_path: Path) -> None:
    world = World(tmp_path)
    c = world.client()
    for i in range(12):
        post(c, {"name": f"job-{i:02d}", "command": f"echo {i}", "schedule": "R/2030-01-01T00:00:00Z/P1D"})
    names = [j["name"] for j in c.get(f"{CHRONOS}/jobs/search", params={"name": "job"}).json()]
    assert names == [f"job-{i:02d}" for i in range(10)]  # Chronos' default limit is 10
    page = c.get(f"{CHRONOS}/jobs/search", params={"name": "job", "offset": 10, "limit": 5}).json()
    assert [j["name"] for j in page] == ["job-10", "job-11"]
    anyone = c.get(f"{CHRONOS}/jobs/search", params={"name": "nope", "any": "echo 3"}).json()
    assert [j["name"] for j in anyone] == ["job-03"]  # `any` lets a job in by its name or command
    # Chronos 2's PUT updates; GET one job; corral's extras only when asked for.
    update = {"name": "job-00", "command": "echo new", "schedule": "R/2030-01-01T00:00:00Z/P1D"}
    assert c.put(f"{CHRONOS}/iso8601", json=update).status_code == 204
    one = c.get(f"{CHRONOS}/job/job-00").json()
    assert one["command"] == "echo new" and "corral" not in one
    c.put(f"{CHRONOS}/job/job-00")
    world.tick()
    extra = c.get(f"{CHRONOS}/job/job-00", params={"corral": "true"}).json()["corral"]
    (task,) = world.jobs("chronos:job-00")
    assert extra["user"] == one["runAsUser"] and extra["runs"][0]["jobs"] == [task.id]
    assert all("corral" in j for j in c.get(f"{CHRONOS}/jobs", params={"corral": "true"}).json())
    summary = c.get(f"{CHRONOS}/jobs/summary").json()["jobs"]
    assert summary[0] == {"name": "job-00", "status": "fresh", "state": "1 running", "schedule": one["schedule"],
                          "parents": [], "disabled": False}  # fmt: skip
    marked = c.put(f"{CHRONOS}/job/success/job-01")
    assert marked.status_code == 200 and marked.text == "marked job job-01 as successful: true"
    assert c.get(f"{CHRONOS}/stats/nonsense").json() == []
    assert c.get(f"{CHRONOS}/leader").json() == {"leader": "testserver"}
    assert c.get("/chronos/ping").text == "pong\n"


def test_a_job_with_neither_schedule_nor_parents_shows_r1_then_r0(tmp_path: Path) -> None:
    world = World(tmp_path, start="2024-01-01T00:00:00Z")
    c = world.client()
    assert c.post(f"{CHRONOS}/iso8601", json={"name": "once", "command": "true"}).status_code == 204
    shown = chronos_job(c, "once")
    assert shown["schedule"] == "R0/2024-01-01T00:00:00.000Z/PT24H" and shown["disabled"] is True  # already ran
    assert "parents" not in shown


def test_stats_graph_summary_and_metrics_show_only_the_callers_jobs(tmp_path: Path) -> None:
    world = World(tmp_path)
    alice, bob = world.client(), world.client(BOB)
    post(alice, {"name": "alices-secret", "command": "true", "schedule": "R/2030-01-01T00:00:00Z/P1D"})
    post(bob, {"name": "bobs", "command": "true", "schedule": "R/2030-01-01T00:00:00Z/P1D"})
    for path in ("/graph/csv", "/graph/dot", "/jobs/summary", "/stats/median", "/jobs", "/jobs/search"):
        seen = bob.get(f"{CHRONOS}{path}")
        assert seen.status_code == 200 and "bobs" in seen.text and "alices-secret" not in seen.text, path
    metrics = bob.get("/chronos/metrics")
    assert "bobs" in metrics.text and "alices-secret" not in metrics.text
    for path in ("/job/stat/alices-secret", "/job/alices-secret"):
        assert bob.get(f"{CHRONOS}{path}").json() == {"status": "Not Found", "message": "Job 'alices-secret' not found"}
    assert bob.delete(f"{CHRONOS}/job/alices-secret").status_code == 404
