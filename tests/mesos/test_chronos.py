"""Chronos jobs: checklist items 7 and 13, the seed's GPU job, errors, and the retry/softError rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from corral.mesos import chronos as c
from corral.mesos.errors import ObjectNotValid
from corral.mesos.model import RetryRule
from corral.model.resources import ConstraintOp
from corral.schedule.clock import ConcurrencyPolicy, TickPolicy, due_ticks

NOW = datetime(2026, 5, 1, 12, tzinfo=UTC)

SEED_GPU_JOB: dict[str, Any] = {
    "name": "test-gpu",
    "command": "cd $MESOS_SANDBOX && /bin/bash gpu_demo.sh",
    "shell": True,
    "retries": 2,
    "cpus": 4,
    "disk": 256,
    "mem": 4096,
    "gpus": 1,
    "uris": ["https://gist.githubusercontent.com/x/gpu_demo.sh"],
    "environmentVariables": [],
    "arguments": [],
    "runAsUser": "root",
    "container": {"type": "MESOS", "image": "tensorflow/tensorflow:latest-gpu"},
    "schedule": "R/2018-03-05T23:00:00.000Z/PT24H",
}


def parse(data: dict[str, Any], **kw: Any) -> c.ChronosJob:
    return c.parse_job(data, now=NOW, **kw)


def invalid(data: Any, **kw: Any) -> ObjectNotValid:
    with pytest.raises(ObjectNotValid) as err:
        c.parse_job(data, now=NOW, **kw)
    assert err.value.status == 400
    return err.value


def test_seed_gpu_job_maps_onto_corral() -> None:
    d = c.to_definition(parse(SEED_GPU_JOB), now=NOW)
    r = d.request
    assert (r.cpu_milli, r.memory_mib, r.gpu_count, r.gpu_milli, d.disk_mib) == (4000, 4096, 1, 1000, 256)
    assert d.image is not None and (d.image.image, d.image.runtime) == ("tensorflow/tensorflow:latest-gpu", "mesos")
    assert d.command == ("/bin/sh", "-c", "cd $MESOS_SANDBOX && /bin/bash gpu_demo.sh")
    assert [a.uri for a in d.artifacts] == ["https://gist.githubusercontent.com/x/gpu_demo.sh"]
    assert (d.user, d.retry) == ("root", RetryRule(2, 60.0, False))
    (rule,) = d.schedules
    assert (rule.kind, rule.starting_deadline_s, rule.concurrency) == ("iso8601", None, ConcurrencyPolicy.FORBID)
    assert rule.schedule().next_after(datetime(2018, 3, 6, tzinfo=UTC)) == datetime(2018, 3, 6, 23, tzinfo=UTC)


def test_gpus_with_the_docker_containerizer_are_refused() -> None:
    data = {**SEED_GPU_JOB, "container": {"type": "DOCKER", "image": "tensorflow/tensorflow:latest-gpu"}}
    assert invalid(data).errors_at("/gpus") == (c.GPU_NEEDS_MESOS,)
    assert invalid({**SEED_GPU_JOB, "gpus": 0.5}).errors_at("/gpus") == (
        "GPUs must be a whole number (fractional GPUs are not supported), got 0.5",
    )


# -------------------------------------------------------------------------------------------- checklist 7
def test_every_two_hours_forever() -> None:
    d = c.to_definition(parse({"name": "tick", "command": "true", "schedule": "R/2014-03-08T20:00:00Z/PT2H"}), now=NOW)
    s = d.schedules[0].schedule()
    assert s.next_after(datetime(2014, 3, 8, 21, tzinfo=UTC)) == datetime(2014, 3, 8, 22, tzinfo=UTC)
    assert s.next_after(datetime(2030, 1, 1, 1, tzinfo=UTC)) == datetime(2030, 1, 1, 2, tzinfo=UTC)
    assert c.remaining_repetitions(d, NOW) is None


def test_r3_runs_three_times_then_the_job_is_disabled() -> None:
    d = c.to_definition(parse({"name": "r3", "command": "true", "schedule": "R3/2026-05-01T13:00:00Z/PT1H"}), now=NOW)
    s, policy = d.schedules[0].schedule(), d.schedules[0].tick_policy()
    cursor, runs, now = NOW, [], NOW
    for _ in range(6):
        decision = due_ticks(s, cursor, now, policy)
        if decision.run:
            runs.append(decision.run)
        cursor = decision.cursor
        now += timedelta(hours=1, minutes=1)
    assert runs == [datetime(2026, 5, 1, h, tzinfo=UTC) for h in (13, 14, 15)]
    assert c.remaining_repetitions(d, cursor) == 0


def test_no_schedule_and_no_parents_is_one_run_now() -> None:
    d = c.to_definition(parse({"name": "once", "command": "true"}), now=NOW)
    assert d.run_once_now and d.schedules == () and d.parents == ()
    child = c.to_definition(parse({"name": "child", "command": "true", "parents": ["once"]}), now=NOW)
    assert not child.run_once_now and child.parents == ("once",)


def test_zero_or_absent_resources_take_the_configured_defaults() -> None:
    d = c.to_definition(parse({"name": "small", "command": "true", "cpus": 0}), now=NOW)
    assert (d.request.cpu_milli, d.request.memory_mib, d.disk_mib) == (100, 128, 256)
    custom = c.ChronosDefaults(cpus=0.5, mem=64, disk=10)
    d = c.to_definition(parse({"name": "small", "command": "true"}), now=NOW, defaults=custom)
    assert (d.request.cpu_milli, d.request.memory_mib, d.disk_mib) == (500, 64, 10)


def test_schedule_time_zone_and_epsilon() -> None:
    data = {
        "name": "berlin",
        "command": "true",
        "schedule": "R/2026-03-27T09:00:00Z/P1D",
        "scheduleTimeZone": "Europe/Berlin",
        "epsilon": "PT30M",
        "concurrent": True,
        "disabled": True,
    }
    (rule,) = c.to_definition(parse(data), now=NOW).schedules
    assert rule.tick_policy() == TickPolicy(1800.0, ConcurrencyPolicy.ALLOW, False)
    ticks = [rule.schedule().next_after(datetime(2026, 3, d, tzinfo=UTC)) for d in (28, 29, 30)]
    assert [t.hour for t in ticks if t] == [8, 7, 7]  # 09:00 Berlin on both sides of the change


def test_shell_false_runs_command_with_arguments() -> None:
    d = c.to_definition(parse({"name": "a", "command": "echo", "shell": False, "arguments": ["x y"]}), now=NOW)
    assert d.command == ("echo", "x y")
    d = c.to_definition(parse({"name": "a", "command": "echo", "arguments": ["ignored"]}), now=NOW)
    assert d.command == ("/bin/sh", "-c", "echo")


def test_other_fields_map() -> None:
    data = {
        "name": "full",
        "command": "true",
        "environmentVariables": [{"name": "A", "value": "1"}],
        "labels": [{"name": "GPU_SCHEDULING_BEHAVIOR", "value": "unrestricted"}],
        "constraints": [["rack", "EQUALS", "r1"], ["host", "UNLIKE", "old-.*"]],
        "highPriority": True,
        "maxCompletionTime": 3600,
        "fetch": [{"uri": "https://x/y.tgz", "extract": False}],
        "softError": True,
        "retries": 0,
    }
    d = c.to_definition(parse(data), now=NOW)
    assert d.env == {"A": "1"} and d.labels == {"GPU_SCHEDULING_BEHAVIOR": "unrestricted"}
    got = [(k.attribute, k.op) for k in d.request.constraints]
    assert got == [("rack", ConstraintOp.IS), ("host", ConstraintOp.UNLIKE)]
    assert (d.request.priority, d.time_limit_s, d.retry) == (1, 3600.0, RetryRule(0, 60.0, True))
    assert d.artifacts[0].extract is False


# --------------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("data", "path", "text"),
    [
        ({"name": "a b!", "command": "x"}, "/name", "must be letters, digits, '_', '.' or '-', got 'a b!'"),
        ({"name": "caf\u00e9", "command": "x"}, "/name", "must be letters, digits, '_', '.' or '-'"),
        ({"name": "a"}, "/command", "is required (it may be empty only for a container image)"),
        ({"name": "a", "command": "x", "schedule": "R/2014-03-08T20:00:00Z/P"}, "/schedule", "'P' is not an ISO 8601"),
        (
            {"name": "a", "command": "x", "schedule": "R/1960-01-01T00:00:00Z/PT1H"},
            "/schedule",
            "start '1960-01-01T00:00:00Z' is before 1970-01-01T00:00:00Z",
        ),
        (
            {"name": "a", "command": "x", "schedule": "R/2014-03-08T20:00:00Z/PT1H", "scheduleTimeZone": "Nowhere"},
            "/scheduleTimeZone",
            "'Nowhere' is not an IANA time zone name",
        ),
        (
            {"name": "a", "command": "x", "schedule": "R//PT1H", "parents": ["b"]},
            "/",
            c.SCHEDULE_AND_PARENTS,
        ),
        ({"name": "a", "command": "x", "fetch": [{"uri": "u"}], "uris": ["v"]}, "/fetch", c.FETCH_AND_URIS),
        ({"name": "a", "command": "x", "epsilon": "P1M"}, "/epsilon", "a window cannot be in months or years"),
        ({"name": "a", "command": "x", "parents": ["a"]}, "/parents", "a job cannot be its own parent"),
        ({"name": "a", "command": "x", "constraints": [["rack", "NEAR", "x"]]}, "/constraints/0", "unknown operator"),
        ({"name": "a", "command": "x", "constraints": [["rack", "LIKE"]]}, "/constraints/0", "must be [attribute"),
        ({"name": "a", "command": "x", "constraints": [["r", "LIKE", "("]]}, "/constraints/0", "not a regular expr"),
        ({"name": "a", "command": "x", "retries": -1}, "/retries", "must be >= 0, got -1"),
    ],
)
def test_errors(data: dict[str, Any], path: str, text: str) -> None:
    errors = invalid(data).errors_at(path)
    assert any(text in e for e in errors), errors


def test_unknown_parents() -> None:
    assert invalid({"name": "a", "command": "x", "parents": ["p", "q"]}, known_jobs={"p": ()}).errors_at(
        "/parents"
    ) == ("unknown parent jobs: q",)


# ----------------------------------------------------------------------------------- checklist 13: retries
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_two_retries_mean_at_most_three_attempts_spaced_by_the_delay() -> None:
    rule = RetryRule(retries=2, delay_s=60.0)
    stats, now, attempts = c.JobStats(), T0, []
    for attempt in range(10):
        attempts.append(now)
        out = c.on_failure(stats, rule, attempt, now)
        stats = out.stats
        if out.retry_at is None:
            assert out.final and not out.fire_children
            break
        assert not out.final
        now = out.retry_at
    assert attempts == [T0, T0 + timedelta(seconds=60), T0 + timedelta(seconds=120)]
    assert (stats.error_count, stats.errors_since_last_success, stats.last_error) == (1, 1, attempts[-1])


def test_soft_error_fires_children_after_the_final_failure() -> None:
    out = c.on_failure(c.JobStats(), RetryRule(retries=0, soft_error=True), 0, T0)
    assert out.final and out.fire_children and out.retry_at is None


def test_a_job_already_failing_gets_no_retries_until_it_succeeds() -> None:
    failing = c.JobStats(last_error=T0, last_success=T0 - timedelta(days=1))
    assert c.on_failure(failing, RetryRule(retries=2), 0, T0 + timedelta(hours=1)).retry_at is None
    recovered = c.on_success(failing, T0 + timedelta(hours=2)).stats
    assert recovered.success_count == 1 and recovered.errors_since_last_success == 0
    assert c.on_failure(recovered, RetryRule(retries=2), 0, T0 + timedelta(hours=3)).retry_at is not None


def test_auto_disable_after_consecutive_failed_runs() -> None:
    defaults = c.ChronosDefaults(disable_after_failures=2)
    stats = c.JobStats()
    stats = c.on_failure(stats, RetryRule(retries=0), 0, T0, defaults).stats
    assert not stats.disabled
    stats = c.on_failure(stats, RetryRule(retries=0), 0, T0 + timedelta(hours=1), defaults).stats
    assert stats.disabled and stats.error_count == 2
    never = c.on_failure(c.JobStats(errors_since_last_success=50), RetryRule(retries=0), 0, T0).stats
    assert not never.disabled  # 0 = off (the default)


# ------------------------------------------------------------------------------------ rules Chronos did not have
def test_repeated_parents_count_once_as_in_chronos_set() -> None:
    job = parse({"name": "c", "command": "x", "parents": ["a", "b", "a"]}, known_jobs={"a": (), "b": ()})
    assert job.parents == ["a", "b"]


@pytest.mark.parametrize("value", [0, -1])
def test_max_completion_time_zero_or_less_is_no_limit(value: int) -> None:
    d = c.to_definition(parse({"name": "a", "command": "x", "maxCompletionTime": value}), now=NOW)
    assert d.time_limit_s is None


def test_container_type_and_volume_mode_in_lower_case() -> None:
    data = {"name": "a", "command": "x", "container": {"type": "mesos", "image": "i", "volumes": [
        {"containerPath": "/data", "hostPath": "/srv", "mode": "ro"}]}}  # fmt: skip
    job = parse(data)
    assert job.container is not None and job.container.type == "MESOS" and job.container.volumes[0].mode == "RO"


def test_a_custom_executor_is_refused() -> None:
    assert invalid({"name": "a", "command": "x", "executor": "/opt/exec"}).errors_at("/executor") == (c.NO_EXECUTORS,)
    assert parse({"name": "a", "command": "x", "executor": "", "executorFlags": "f"}).executor_flags == "f"


def test_a_parent_that_closes_a_cycle_is_refused_at_parents() -> None:
    known = {"a": ("c",), "b": ("a",)}  # a <- c would be c's own ancestor: c -> a -> ... c
    err = invalid({"name": "c", "command": "x", "parents": ["b"]}, known_jobs=known)
    assert err.errors_at("/parents") == ("c would depend on itself through its parents (a cycle)",)


# ------------------------------------------------------------------------------------------- Chronos' shapes
JOB_FIELDS = [  # Chronos 3's JobSerializer, in its order
    "name", "command", "shell", "executor", "executorFlags", "taskInfoData", "retries", "owner", "ownerName",
    "description", "successCount", "errorCount", "lastSuccess", "lastError", "cpus", "disk", "mem", "disabled",
    "softError", "dataProcessingJobType", "errorsSinceLastSuccess", "fetch", "uris", "environmentVariables",
    "arguments", "highPriority", "runAsUser", "concurrent", "maxCompletionTime",
]  # fmt: skip
COUNTERS = {"successCount": 0, "errorCount": 0, "lastSuccess": "", "lastError": "", "errorsSinceLastSuccess": 0}


def shape(data: dict[str, Any], schedule: str | None = "R/2030-01-01T00:00:00.000Z/PT1H", **kw: Any) -> Any:
    job = parse(data)
    return c.job_shape(job, schedule=schedule, run_as="ana", cpus=1, mem=128, disk=256, counters=COUNTERS,
                       disabled=False, **kw)  # fmt: skip


def test_job_shape_is_chronos_serializer_field_for_field() -> None:
    scheduled = shape({"name": "a", "command": "x", "uris": ["http://u/a.tgz"]})
    assert list(scheduled) == [*JOB_FIELDS, "constraints", "schedule", "scheduleTimeZone"]
    assert (scheduled["runAsUser"], scheduled["maxCompletionTime"], scheduled["fetch"]) == ("ana", 0, [])
    listed = shape({"name": "a", "command": "x", "uris": ["http://u/a.tgz"]}, listing=True)
    assert listed["fetch"] == [{"uri": "http://u/a.tgz", "executable": False, "cache": False, "extract": True}]
    container = {"type": "MESOS", "image": "img", "volumes": [{"containerPath": "/d"}]}
    dependent = shape({"name": "b", "command": "x", "parents": ["a"], "container": container}, schedule=None)
    assert list(dependent) == [*JOB_FIELDS, "container", "constraints", "parents"]
    assert dependent["container"] == {
        "type": "MESOS",
        "image": "img",
        "network": "HOST",
        "networkInfos": [],
        "volumes": [{"containerPath": "/d"}],
        "forcePullImage": False,
        "parameters": [],
    }


def test_fields_chronos_3_lacks_appear_only_when_the_job_sets_them() -> None:
    assert not {"gpus", "labels", "epsilon"} & set(shape({"name": "a", "command": "x"}))
    posted = shape({"name": "a", "command": "x", "gpus": 2, "labels": [{"name": "k", "value": "v"}], "epsilon": "PT1M"})
    assert (posted["gpus"], posted["labels"], posted["epsilon"]) == (2, [{"name": "k", "value": "v"}], "PT1M")


def test_quantiles_are_dropwizard_uniform_snapshot() -> None:
    values = [float(v) for v in range(1, 11)]  # Dropwizard's UniformSnapshotTest: 1..5 -> median 3, p75 4.5
    assert c.quantile([1, 2, 3, 4, 5], 0.5) == 3 and c.quantile([1, 2, 3, 4, 5], 0.75) == 4.5
    assert c.quantile(values, 0.99) == 10 and c.quantile(values, 0.01) == 1 and c.quantile([], 0.5) == 0
    h = c.histogram([300.0, 100.0, 200.0])
    assert list(h) == ["75thPercentile", "95thPercentile", "98thPercentile", "99thPercentile", "median", "mean",
                       "count"]  # fmt: skip
    assert (h["median"], h["mean"], h["count"], h["75thPercentile"]) == (200, 200, 3, 300)
    d = c.dropwizard_histogram([1.0, 3.0])
    assert (d["min"], d["max"], d["mean"], d["p50"]) == (1, 3, 2, 2) and d["stddev"] == pytest.approx(2**0.5)


def test_graph_texts() -> None:
    names, edges = ["a", "b", "c"], [("a", "c"), ("b", "c")]
    assert c.dot_graph(names, edges) == (
        'digraph G {\n  1 [ label="a" ];\n  2 [ label="b" ];\n  3 [ label="c" ];\n  1 -> 3;\n  2 -> 3;\n}\n'
    )
    nodes = [("a", "success", "idle"), ("c", "fresh", "1 running")]
    assert c.csv_graph(nodes, [("a", "c")]) == "node,a,success,idle\nnode,c,fresh,1 running\nlink,a,c\n"
    assert [c.last_state("", ""), c.last_state("2026", ""), c.last_state("", "2026")] == ["fresh", "success", "failure"]
    assert c.last_state("2026-01-02T00:00:00.000Z", "2026-01-01T00:00:00.000Z") == "success"
    assert [c.job_state(0, 0), c.job_state(1, 0), c.job_state(1, 2)] == ["idle", "queued", "2 running"]
