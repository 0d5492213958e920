"""Metronome job JSON: the compatibility checklist's format items, every error text, the echo and the mapping."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from corral.mesos import metronome as m
from corral.mesos.errors import ObjectNotValid
from corral.mesos.model import RestartRule, job_spec
from corral.model.errors import InvalidRequest
from corral.model.resources import ConstraintOp, GpuBehavior
from corral.schedule.cron import DAY_OF_MONTH_MUST_EXIST


def job(**run: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"cpus": 1, "mem": 128, "disk": 0, "cmd": "sleep 1"}
    base.update(run)
    return {"id": "nightly", "run": {k: v for k, v in base.items() if v is not None}}


def invalid(data: Any, **kw: Any) -> ObjectNotValid:
    with pytest.raises(ObjectNotValid) as err:
        m.parse_job(data, **kw)
    assert err.value.status == 422
    body = err.value.to_json()
    assert body["message"] == "Object is not valid"
    assert all(set(d) == {"path", "errors"} and d["errors"] for d in body["details"])
    return err.value


# -------------------------------------------------------------------------------------- checklist 1: the schema
def test_unknown_keys_at_top_level_and_in_run_are_refused_with_their_path() -> None:
    data = job(colour="blue")
    data["owner"] = "me"
    err = invalid(data)
    assert err.errors_at("/run/colour") == ("is not a known property (additional properties are not allowed here)",)
    assert err.errors_at("/owner")


def test_unknown_keys_deeper_down_are_ignored() -> None:
    m.parse_job(job(restart={"policy": "NEVER", "note": "x"}))


@pytest.mark.parametrize("missing", ["cpus", "mem", "disk"])
def test_missing_resources_are_refused(missing: str) -> None:
    err = invalid(job(**{missing: None}))
    assert err.errors_at(f"/run/{missing}") == ("is required",)


def test_missing_run_and_id() -> None:
    err = invalid({})
    assert err.errors_at("/id") == ("is required",) and err.errors_at("/run") == ("is required",)
    assert invalid([1, 2]).errors_at("/") == ("must be a JSON object",)


def test_resources_below_the_minimum() -> None:
    err = invalid(job(mem=31, cpus=0.001, disk=-1))
    assert err.errors_at("/run/mem") == ("must be >= 32, got 31",)
    assert err.errors_at("/run/cpus") == ("must be >= 0.01, got 0.001",)
    assert err.errors_at("/run/disk") == ("must be >= 0, got -1",)


def test_wrong_types() -> None:
    err = invalid(job(cpus="1", cmd=5, env=[]))
    assert err.errors_at("/run/cpus") == ("must be a number",)
    assert err.errors_at("/run/cmd") == ("must be a string",)
    assert err.errors_at("/run/env") == ("must be an object",)
    assert invalid(job(cmd="")).errors_at("/run/cmd") == ("must not be empty",)


# ------------------------------------------------------------------------------------------ checklist 2: ids
@pytest.mark.parametrize("good", ["a.b-c.d1", "a", "job-1", "0"])
def test_good_ids(good: str) -> None:
    assert m.parse_job({**job(), "id": good}).id == good
    assert m.check_job_id(good) == good


@pytest.mark.parametrize("bad", ["-a", "a-", "A", "a_b", "a..b", "a.", "a?b", ""])
def test_bad_ids(bad: str) -> None:
    err = invalid({**job(), "id": bad})
    assert err.errors_at("/id")[0].startswith("must be dot-separated segments of lowercase letters, digits")
    with pytest.raises(InvalidRequest) as bad_path:
        m.check_job_id(bad)
    assert bad_path.value.message == f"Not a valid id: {bad}"


# ------------------------------------------------------------------------------------------ checklist 3: GPUs
def test_fractional_gpus_are_refused() -> None:
    err = invalid(job(gpus=1.5))
    assert err.errors_at("/run/gpus") == ("GPUs must be a whole number (fractional GPUs are not supported), got 1.5",)
    assert invalid(job(gpus=-1)).errors_at("/run/gpus") == ("must be >= 0, got -1",)


def test_gpus_with_docker_are_refused_but_ucr_and_bare_cmd_are_fine() -> None:
    err = invalid(job(gpus=2, cmd=None, docker={"image": "tensorflow/tensorflow"}))
    assert m.GPUS_WITH_DOCKER in err.errors_at("/run/gpus")
    ucr = m.parse_job(job(gpus=2, cmd=None, ucr={"image": {"id": "gpu-workload"}}))
    assert m.to_definition(ucr).request.gpu_count == 2
    assert m.parse_job(job(gpus=2)).run.gpus == 2


def test_seed_gpu_job_is_accepted() -> None:
    seed = {
        "id": "job-gpu",
        "description": "job example with gpu",
        "run": {"cpus": 0.01, "mem": 32, "disk": 0, "gpus": 4, "ucr": {"image": {"id": "gpu-workload"}}},
    }
    d = m.to_definition(m.parse_job(seed))
    assert (d.request.cpu_milli, d.request.memory_mib, d.request.gpu_count, d.request.gpu_milli) == (10, 32, 4, 1000)
    assert d.image is not None and (d.image.image, d.image.runtime) == ("gpu-workload", "mesos")
    assert d.command == ()


# ---------------------------------------------------------------------------------------- checklist 4: echo
def test_defaults_are_echoed() -> None:
    data = job(artifacts=[{"uri": "https://example.org/a.tgz"}])
    data["run"]["placement"] = {"constraints": [{"attribute": "rack", "operator": "EQ", "value": "r1"}]}
    data["schedules"] = [{"id": "every-monday", "cron": "0 9 1-7 * 1"}]
    out = m.job_to_json(m.parse_job(data), datetime(2017, 10, 2, 10, tzinfo=UTC))
    run = out["run"]
    assert run["maxLaunchDelay"] == 3600
    assert run["restart"] == {"policy": "NEVER"}
    assert run["artifacts"] == [
        {"uri": "https://example.org/a.tgz", "executable": False, "extract": True, "cache": False}
    ]
    assert run["placement"]["constraints"] == [{"attribute": "rack", "operator": "IS", "value": "r1"}]
    assert run["gpus"] == 0
    assert out["schedules"] == [
        {
            "id": "every-monday",
            "cron": "0 9 1-7 * 1",
            "timezone": "UTC",
            "startingDeadlineSeconds": 900,
            "concurrencyPolicy": "ALLOW",
            "enabled": True,
            "nextRunAt": "2017-11-06T09:00:00.000Z",
        }
    ]


def test_disabled_schedule_has_no_next_run() -> None:
    data = {**job(), "schedules": [{"id": "s", "cron": "* * * * *", "enabled": False}]}
    assert "nextRunAt" not in m.job_to_json(m.parse_job(data), datetime(2026, 1, 1, tzinfo=UTC))["schedules"][0]


# ----------------------------------------------------------------------- checklist 5 and 6: schedules and deps
def test_second_schedule_is_refused() -> None:
    data = {**job(), "schedules": [{"id": "a", "cron": "* * * * *"}, {"id": "b", "cron": "* * * * *"}]}
    assert invalid(data).errors_at("/schedules") == (m.ONE_SCHEDULE_ONLY,)


def test_dependencies_and_schedules_together_are_refused() -> None:
    data = {**job(), "schedules": [{"id": "a", "cron": "* * * * *"}], "dependencies": [{"id": "parent"}]}
    assert invalid(data).errors_at("/") == (m.DEPENDENCIES_AND_SCHEDULES,)


def test_impossible_cron_and_short_deadline_are_refused() -> None:
    data = {**job(), "schedules": [{"id": "feb", "cron": "0 0 31 2 *", "startingDeadlineSeconds": 30}]}
    err = invalid(data)
    assert err.errors_at("/schedules/0/cron") == (DAY_OF_MONTH_MUST_EXIST,)
    assert err.errors_at("/schedules/0/startingDeadlineSeconds") == ("must be >= 60 seconds, got 30",)
    zero = {**job(), "schedules": [{"id": "z", "cron": "* * * * *", "startingDeadlineSeconds": 0}]}
    assert invalid(zero).errors_at("/schedules/0/startingDeadlineSeconds") == ("must be >= 1, got 0",)


def test_schedule_field_errors() -> None:
    data = {
        **job(),
        "schedules": [{"id": "Bad_Id", "cron": "0 0 * * 9", "timezone": "Mars/Base", "concurrencyPolicy": "MAYBE"}],
    }
    err = invalid(data)  # the schema fails first (concurrencyPolicy); fix it and the rules speak
    assert err.errors_at("/schedules/0/concurrencyPolicy") == ("must be one of 'ALLOW' or 'FORBID', got 'MAYBE'",)
    data["schedules"][0]["concurrencyPolicy"] = "FORBID"
    err = invalid(data)
    assert err.errors_at("/schedules/0/id")[0].startswith("must be lowercase letters, digits and hyphens")
    assert err.errors_at("/schedules/0/cron") == ("day of week field: value 9 is out of range 0..7",)
    assert err.errors_at("/schedules/0/timezone") == (
        "'Mars/Base' is not an IANA time zone name (e.g. UTC, Europe/Berlin)",
    )


def test_schedule_posted_alone() -> None:
    spec = m.parse_schedule({"id": "s", "cron": "0 * * * *", "timezone": "Europe/Berlin"})
    assert spec.starting_deadline_seconds == 900
    with pytest.raises(ObjectNotValid) as err:
        m.parse_schedule({"id": "s", "cron": "0 0 30 2 *"})
    assert err.value.errors_at("/cron") == (DAY_OF_MONTH_MUST_EXIST,)


def test_dependencies_must_be_known_unique_and_acyclic() -> None:
    known = {"a": [], "b": ["a"], "c": ["b"]}
    ok = {**job(), "dependencies": [{"id": "c"}]}
    assert [d.id for d in m.parse_job(ok, known_jobs=known).dependencies] == ["c"]
    unknown = {**job(), "dependencies": [{"id": "x"}, {"id": "a"}, {"id": "w"}]}
    assert invalid(unknown, known_jobs=known).errors_at("/dependencies") == (m.DEPENDENCIES_UNKNOWN + "[w, x]",)
    dup = {**job(), "dependencies": [{"id": "a"}, {"id": "a"}]}
    assert invalid(dup, known_jobs=known).errors_at("/dependencies") == ("must be unique, got ['a', 'a']",)
    # Updating "a" to depend on "c" closes a -> c -> b -> a.
    cycle = {**job(), "id": "a", "dependencies": [{"id": "c"}]}
    assert invalid(cycle, known_jobs=known).errors_at("/dependencies") == (m.DEPENDENCIES_CYCLE,)
    itself = {**job(), "id": "a", "dependencies": [{"id": "a"}]}
    assert invalid(itself, known_jobs=known).errors_at("/dependencies") == (m.DEPENDENCIES_CYCLE,)


# ------------------------------------------------------------------------------------ the other rule texts
def test_command_or_image_is_required() -> None:
    assert invalid(job(cmd=None)).errors_at("/run") == (m.NO_COMMAND,)
    assert m.parse_job(job(cmd=None, args=["--help"], docker={"image": "busybox"})).run.args == ["--help"]


def test_docker_and_ucr_together() -> None:
    err = invalid(job(docker={"image": "a"}, ucr={"image": {"id": "b"}}))
    assert err.errors_at("/run") == (m.DOCKER_AND_UCR,)


def test_secrets_must_be_referenced_and_defined() -> None:
    err = invalid(job(env={"A": {"secret": "s1"}, "B": "plain"}, secrets={"s2": {"source": "/x"}}))
    assert err.errors_at("/run/secrets") == (m.SECRETS_UNDEFINED + "s1", m.SECRETS_UNREFERENCED + "s2")
    assert invalid(job(env={"A": 5})).errors_at("/run/env/A") == ('must be a string or {"secret": "<secret name>"}',)


def test_file_secrets_are_refused_only_with_docker() -> None:
    vol = [{"containerPath": "/etc/key", "secret": "key"}]
    secrets = {"key": {"source": "vault/key"}}
    err = invalid(job(cmd=None, docker={"image": "busybox"}, volumes=vol, secrets=secrets))
    assert err.errors_at("/run/volumes/0") == (m.FILE_SECRETS_UCR_ONLY,)
    d = m.to_definition(m.parse_job(job(cmd=None, ucr={"image": {"id": "x"}}, volumes=vol, secrets=secrets)))
    assert d.image is not None
    # Metronome's validator looks only for Docker: a bare command takes a file secret too.
    assert m.parse_job(job(volumes=vol, secrets=secrets)).run.volumes[0].secret == "key"
    assert invalid(job(volumes=[{"containerPath": "/d"}])).errors_at("/run/volumes/0") == (
        "a volume needs hostPath and mode (RO or RW), or a secret",
    )


def test_network_rules_in_metronomes_words() -> None:
    err = invalid(job(networks=[{"mode": "container/bridge"}]))
    assert err.errors_at("/run/networks") == (m.NETWORKS_CONTAINERS_ONLY,)
    err = invalid(job(docker={"image": "x"}, cmd=None, networks=[{"mode": "host"}, {"mode": "container", "name": "a"}]))
    assert set(err.errors_at("/run/networks")) == {m.NETWORKS_MIXED, m.NETWORKS_ONE_HOST_OR_BRIDGE}
    two = [{"mode": "container", "name": "a"}, {"mode": "container", "name": "a"}]
    err = invalid(job(docker={"image": "x"}, cmd=None, networks=two))
    assert set(err.errors_at("/run/networks")) == {m.NETWORKS_DOCKER_ONE, m.NETWORKS_NAMES_UNIQUE}
    two[1]["name"] = "b"
    assert len(m.parse_job(job(ucr={"image": {"id": "x"}}, cmd=None, networks=two)).run.networks) == 2
    err = invalid(job(networks=[{"mode": "host", "name": "n", "labels": {"a": "b"}}]))
    assert err.errors_at("/run/networks/0/name") == ("must be empty for host network",)
    assert err.errors_at("/run/networks/0/labels") == ("must be empty for host network",)
    err = invalid(job(ucr={"image": {"id": "x"}}, cmd=None, networks=[{"mode": "container"}]))
    assert err.errors_at("/run/networks/0/name") == ("must not be empty for container networks",)
    assert m.parse_job(job(networks=[{"mode": "host"}])).run.networks[0].mode == "host"


def test_placement_constraint_rules() -> None:
    c = {"constraints": [{"attribute": "rack", "operator": "LIKE", "value": "("}, {"attribute": "z", "operator": "IS"}]}
    err = invalid(job(placement=c))
    assert err.errors_at("/run/placement/constraints/0/value")[0].startswith("is not a valid regular expression")
    assert err.errors_at("/run/placement/constraints/1") == ("IS needs a value",)
    bad_op = {"constraints": [{"attribute": "rack", "operator": "NEAR", "value": "x"}]}
    assert invalid(job(placement=bad_op)).errors_at("/run/placement/constraints/0/operator")


def test_restart_policy_values() -> None:
    assert invalid(job(restart={"policy": "ALWAYS"})).errors_at("/run/restart/policy")
    assert invalid(job(restart={})).errors_at("/run/restart/policy") == ("is required",)
    # Metronome reads any duration >= 0; a zero deadline means a failure is final at once.
    zero = m.parse_job(job(restart={"policy": "ON_FAILURE", "activeDeadlineSeconds": 0}))
    assert m.after_task(m.to_definition(zero).restart, "TASK_FAILED", T0, T0) == "FAILED"
    assert invalid(job(restart={"policy": "ON_FAILURE", "activeDeadlineSeconds": -1})).errors_at(
        "/run/restart/activeDeadlineSeconds"
    )
    j = m.parse_job(job(restart={"policy": "ON_FAILURE", "activeDeadlineSeconds": 60}))
    assert m.to_definition(j).restart == RestartRule("ON_FAILURE", 60.0)


# ------------------------------------------------------------------------------------------------- mapping
def test_mapping_to_corral() -> None:
    data = job(
        cpus=0.5,
        mem=32.5,
        disk=100,
        gpus=1,
        env={"MODE": "fast", "TOKEN": {"secret": "tok"}},
        secrets={"tok": {"source": "vault/tok"}},
        user="alice",
        taskKillGracePeriodSeconds=5,
        maxLaunchDelay=600,
    )
    data["run"]["placement"] = {"constraints": [{"attribute": "@hostname", "operator": "LIKE", "value": "gpu-.*"}]}
    data["labels"] = {"GPU_SCHEDULING_BEHAVIOR": "restricted", "team": "ml"}
    data["description"] = "train"
    data["schedules"] = [{"id": "s", "cron": "0 2 * * *", "timezone": "Europe/Berlin", "concurrencyPolicy": "FORBID"}]
    d = m.to_definition(m.parse_job(data))
    r = d.request
    assert (r.cpu_milli, r.memory_mib, r.gpu_count, r.gpu_milli, d.disk_mib) == (500, 33, 1, 1000, 100)
    assert r.labels["team"] == "ml"
    assert r.effective_behavior(GpuBehavior.UNRESTRICTED) is GpuBehavior.RESTRICTED
    data["labels"]["GPU_SCHEDULING_BEHAVIOR"] = "bogus"  # Marathon ignores a label value it does not know
    ignored = m.to_definition(m.parse_job(data)).request
    assert ignored.effective_behavior(GpuBehavior.UNRESTRICTED) is GpuBehavior.UNRESTRICTED
    assert [(c.attribute, c.op, c.value) for c in r.constraints] == [("hostname", ConstraintOp.LIKE, "gpu-.*")]
    assert d.command == ("/bin/sh", "-c", "sleep 1")
    assert d.env == {"MODE": "fast"} and d.secret_env == {"TOKEN": "tok"}
    assert (d.user, d.kill_grace_s, d.max_launch_delay_s, d.description) == ("alice", 5, 600.0, "train")
    (rule,) = d.schedules
    assert (rule.kind, rule.timezone, rule.concurrency.value, rule.starting_deadline_s) == (
        "cron",
        "Europe/Berlin",
        "FORBID",
        900.0,
    )
    assert rule.schedule().next_after(datetime(2026, 6, 30, 12, tzinfo=UTC)) == datetime(2026, 7, 1, 0, tzinfo=UTC)
    spec = job_spec(d, user="alice", uid=1000, gid=1000)
    assert spec.command == d.command and spec.request == d.request and spec.name == "nightly"


def test_image_jobs_need_a_container_runtime() -> None:
    d = m.to_definition(m.parse_job(job(cmd=None, docker={"image": "busybox", "forcePullImage": True})))
    assert d.image is not None and (d.image.runtime, d.image.force_pull) == ("docker", True)
    with pytest.raises(InvalidRequest, match="names the image 'busybox': it needs a configured container runtime"):
        job_spec(d, user="alice", uid=1000, gid=1000)


# ---------------------------------------------------------------------------------------- runs: checklist 9, 12
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("rule", "status", "after_s", "outcome"),
    [
        (RestartRule("ON_FAILURE", 60), "TASK_FAILED", 30, "RELAUNCH"),
        (RestartRule("ON_FAILURE", 60), "TASK_FAILED", 70, "FAILED"),
        (RestartRule("ON_FAILURE", 60), "TASK_KILLED", 30, "RELAUNCH"),
        (RestartRule("ON_FAILURE", None), "TASK_LOST", 10**6, "RELAUNCH"),
        (RestartRule("NEVER"), "TASK_FAILED", 1, "FAILED"),
        (RestartRule("NEVER"), "TASK_KILLED", 1, "FAILED"),
        (RestartRule("ON_FAILURE", 60), "TASK_FINISHED", 70, "SUCCESS"),
    ],
)
def test_restart_policy(rule: RestartRule, status: m.TaskStatus, after_s: int, outcome: str) -> None:
    assert m.after_task(rule, status, T0, T0 + timedelta(seconds=after_s)) == outcome


def test_run_ids() -> None:
    rng = random.Random(7)
    ids = {m.new_run_id(datetime(2026, 11, 26, 9, 30, 5, tzinfo=UTC), rng) for _ in range(50)}
    assert len(ids) == 50
    assert all(m.RUN_ID.fullmatch(i) and i.startswith("20261126093005") for i in ids)


def test_dependency_trigger() -> None:
    t = [T0 + timedelta(hours=h) for h in range(6)]
    both_ok = {"a": ("SUCCESS", t[2]), "b": ("SUCCESS", t[3])}
    assert m.dependencies_met(both_ok, child_last_success=t[1], child_last_start=t[1])
    assert not m.dependencies_met(both_ok, child_last_success=t[1], child_last_start=t[4])  # already started since
    assert not m.dependencies_met(both_ok, child_last_success=t[2], child_last_start=t[1])  # a is not newer
    assert not m.dependencies_met({"a": ("FAILED", t[2]), "b": ("SUCCESS", t[3])}, None, None)
    assert not m.dependencies_met({"a": None, "b": ("SUCCESS", t[3])}, None, None)
    assert m.dependencies_met({"a": ("SUCCESS", t[0])}, None, None)


# ------------------------------------------------------------------------------------------- REST-level rules
def test_second_schedule_through_its_endpoint_is_a_conflict() -> None:
    j = m.parse_job(job())
    first = m.add_schedule(j, m.parse_schedule({"id": "a", "cron": "0 * * * *"}))
    with pytest.raises(m.MetronomeError) as err:
        m.add_schedule(first, m.parse_schedule({"id": "b", "cron": "0 * * * *"}))
    assert (err.value.status, err.value.body) == (409, {"message": "Only one schedule supported at the moment"})
    with pytest.raises(m.MetronomeError) as err:
        m.add_schedule(first, m.parse_schedule({"id": "a", "cron": "0 * * * *"}))
    assert (err.value.status, err.value.body) == (409, {"message": "A schedule with id a already exists"})
    dependent = m.parse_job({**job(), "dependencies": [{"id": "p"}]})
    with pytest.raises(ObjectNotValid) as invalid_err:
        m.add_schedule(dependent, m.parse_schedule({"id": "a", "cron": "0 * * * *"}))
    assert invalid_err.value.errors_at("/") == (m.DEPENDENCIES_AND_SCHEDULES,)


def test_the_urls_id_wins_over_the_bodys() -> None:
    assert m.parse_job({**job(), "id": "other"}, url_id="nightly").id == "nightly"
    with pytest.raises(ObjectNotValid) as err:
        m.parse_job({**job(), "id": "Not_Valid"}, url_id="nightly")  # the body's id is still checked
    assert err.value.errors_at("/id")
    assert m.parse_schedule({"id": "other", "cron": "0 * * * *"}, url_id="s").id == "s"


def test_put_without_schedules_keeps_them() -> None:
    old = m.parse_job({**job(), "schedules": [{"id": "s", "cron": "0 * * * *"}]})
    new = m.replace_job(old, m.parse_job(job(cmd="sleep 2")))
    assert new.run.cmd == "sleep 2" and [s.id for s in new.schedules] == ["s"]


def test_not_found_and_exists_bodies() -> None:
    assert (m.job_not_found("x").status, m.job_not_found("x").body) == (404, {"id": "x", "message": "Job not found"})
    assert (m.job_exists().status, m.job_exists().body) == (409, {"message": "Job with this id already exists"})


def test_embed_options() -> None:
    assert m.parse_embed(["activeRuns,schedules", "history"]) == {"activeRuns", "schedules", "history"}
    with pytest.raises(m.MetronomeError) as err:
        m.parse_embed(["activeRuns,tasks"])
    assert err.value.status == 400 and err.value.body["message"].startswith("Unknown embed options: tasks.")


def test_global_gpu_behaviour_setting() -> None:
    assert m.gpu_scheduling_behavior(None) is None
    assert m.gpu_scheduling_behavior("restricted") is GpuBehavior.RESTRICTED
    with pytest.raises(InvalidRequest) as err:
        m.gpu_scheduling_behavior("scarce")
    assert err.value.message == (
        "Setting scarce is invalid. Valid settings are undefined, restricted, unrestricted, preferential"
    )
