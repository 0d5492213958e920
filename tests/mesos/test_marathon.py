"""Marathon apps: the seed's apps, defaults, every rule text, and the mapping onto a ServiceDefinition."""

from __future__ import annotations

from typing import Any

import pytest

from corral.mesos import marathon as mr
from corral.mesos.errors import ObjectNotValid
from corral.mesos.model import BackoffPolicy, ConstraintOperator, HealthCheckRule, ServiceConstraint, UpgradeRule
from corral.model.resources import ConstraintOp

SEED_GPU_APP: dict[str, Any] = {
    "id": "tensorflow-gpus",
    "cpus": 4,
    "gpus": 1,
    "mem": 2048,
    "disk": 0,
    "instances": 1,
    "container": {"type": "MESOS", "docker": {"image": "tensorflow/tensorflow:latest-gpu"}},
    "portDefinitions": [{"port": 10000, "name": "http"}],
    "networks": [{"mode": "host"}],
    "labels": {"HAPROXY_GROUP": "external"},
    "env": {"PASSWORD": "s3cret"},
}

SEED_DOCKER_APP: dict[str, Any] = {
    "id": "/tensorflow-app",
    "cmd": "PORT=8888 /run_jupyter.sh --allow-root",
    "cpus": 2,
    "mem": 4096,
    "instances": 1,
    "container": {
        "type": "DOCKER",
        "docker": {"image": "tensorflow/tensorflow:latest", "network": "BRIDGE", "forcePullImage": True},
    },
    "env": {"PASSWORD": "s3cret"},
}


def invalid(data: Any, **kw: Any) -> ObjectNotValid:
    with pytest.raises(ObjectNotValid) as err:
        mr.parse_app(data, **kw)
    assert err.value.status == 422 and err.value.to_json()["message"] == "Object is not valid"
    return err.value


def test_seed_gpu_app() -> None:
    s = mr.to_service(mr.parse_app(SEED_GPU_APP))
    assert (s.name, s.instances, s.request.cpu_milli, s.request.memory_mib, s.request.gpu_count) == (
        "tensorflow-gpus",
        1,
        4000,
        2048,
        1,
    )
    assert s.image is not None and s.image.runtime == "mesos"
    assert s.command == () and s.ports == (10000,) and s.env == {"PASSWORD": "s3cret"}


def test_seed_docker_app() -> None:
    s = mr.to_service(mr.parse_app(SEED_DOCKER_APP))
    assert s.name == "tensorflow-app" and s.image is not None
    assert (s.image.runtime, s.image.force_pull) == ("docker", True)
    assert s.command == ("/bin/sh", "-c", "PORT=8888 /run_jupyter.sh --allow-root")


def test_gpus_with_docker_and_without_the_feature() -> None:
    with_docker = {**SEED_DOCKER_APP, "gpus": 1}
    assert invalid(with_docker).errors_at("/gpus") == (mr.GPU_NEEDS_MESOS,)
    assert invalid(SEED_GPU_APP, gpu_feature_enabled=False).errors_at("/gpus") == (mr.GPU_FEATURE_OFF,)
    assert invalid({**SEED_GPU_APP, "gpus": 0.5}).errors_at("/gpus")[0].startswith("GPUs must be a whole number")


def test_defaults() -> None:
    app = mr.parse_app({"id": "/web", "cmd": "serve", "healthChecks": [{}]})
    assert (app.instances, app.cpus, app.mem, app.disk, app.gpus) == (1, 1.0, 128.0, 0.0, 0)
    s = mr.to_service(app)
    assert s.backoff == BackoffPolicy(1.0, 1.15, 300.0)
    assert s.kill_selection == "YOUNGEST_FIRST" and s.upgrade == UpgradeRule(1.0, 1.0)
    assert s.health_checks == (HealthCheckRule("HTTP", 300.0, 60.0, 20.0, 3, "/", 0, None, None, 15.0),)
    assert s.request.labels == {}


def test_upgrade_defaults_for_resident_and_single_instance_apps() -> None:
    resident = mr.to_service(mr.parse_app({"id": "db", "cmd": "x", "residency": {}}))
    assert resident.upgrade == UpgradeRule(0.5, 0.0)
    single = mr.to_service(mr.parse_app({"id": "s", "cmd": "x", "labels": {"MARATHON_SINGLE_INSTANCE_APP": "true"}}))
    assert single.upgrade == UpgradeRule(0.0, 0.0)
    given = {"id": "g", "cmd": "x", "upgradeStrategy": {"minimumHealthCapacity": 0.5}}
    assert mr.to_service(mr.parse_app(given)).upgrade == UpgradeRule(0.5, 1.0)


def test_constraints_map_to_rules_and_request_constraints() -> None:
    app = {
        "id": "spread",
        "cmd": "x",
        "instances": 4,
        "constraints": [["hostname", "UNIQUE"], ["rack", "MAX_PER", "2"], ["@hostname", "LIKE", "gpu-.*"]],
    }
    s = mr.to_service(mr.parse_app(app))
    assert s.constraints == (
        ServiceConstraint("hostname", ConstraintOperator.UNIQUE),
        ServiceConstraint("rack", ConstraintOperator.MAX_PER, "2"),
        ServiceConstraint("@hostname", ConstraintOperator.LIKE, "gpu-.*"),
    )
    assert [(c.attribute, c.op) for c in s.request.constraints] == [("hostname", ConstraintOp.LIKE)]


def test_health_checks_and_secrets_map() -> None:
    app = {
        "id": "svc",
        "args": ["serve", "--port", "80"],
        "healthChecks": [
            {"protocol": "COMMAND", "command": {"value": "curl -f localhost"}, "gracePeriodSeconds": 5},
            {"protocol": "TCP", "port": 8080, "intervalSeconds": 10, "timeoutSeconds": 2, "maxConsecutiveFailures": 0},
        ],
        "env": {"DB_PASSWORD": {"secret": "db"}},
        "secrets": {"db": {"source": "vault/db"}},
        "killSelection": "OLDEST_FIRST",
    }
    s = mr.to_service(mr.parse_app(app))
    assert s.command == ("serve", "--port", "80")
    cmd, tcp = s.health_checks
    assert (cmd.protocol, cmd.command, cmd.grace_period_s) == ("COMMAND", "curl -f localhost", 5.0)
    assert cmd.port_index is None
    assert (tcp.port, tcp.port_index, tcp.interval_s, tcp.max_consecutive_failures) == (8080, None, 10.0, 0)
    assert s.secret_env == {"DB_PASSWORD": "vault/db"} and s.kill_selection == "OLDEST_FIRST"


@pytest.mark.parametrize(
    ("data", "path", "text"),
    [
        ({"id": "a"}, "/", mr.NO_COMMAND),
        ({"id": "a", "cmd": "x", "args": ["y"]}, "/", mr.CMD_AND_ARGS),
        ({"id": "/A_b", "cmd": "x"}, "/id", "must be a path of segments of lowercase letters"),
        ({"id": "/a/-b", "cmd": "x"}, "/id", "must be a path of segments"),
        ({"id": "./..", "cmd": "x"}, "/id", "naming an app below '/'"),
        ({"id": "a", "cmd": "x", "cpus": 0.0001}, "/cpus", "must be >= 0.001, got 0.0001"),
        ({"id": "a", "cmd": "x", "instances": -1}, "/instances", "must be >= 0, got -1"),
        ({"id": "a", "cmd": "x", "backoffFactor": 0.5}, "/backoffFactor", "must be >= 1, got 0.5"),
        ({"id": "a", "cmd": "x", "killSelection": "RANDOM"}, "/killSelection", "must be one of"),
        ({"id": "a", "cmd": "x", "healthChecks": [{"protocol": "COMMAND"}]}, "/healthChecks/0", "needs command.value"),
        (
            {"id": "a", "cmd": "x", "healthChecks": [{"portIndex": 0, "port": 80}]},
            "/healthChecks/0",
            "give portIndex or port, not both",
        ),
        (
            {"id": "a", "cmd": "x", "portDefinitions": [{"port": 0}], "healthChecks": [{"portIndex": 1}]},
            "/healthChecks/0/portIndex",
            "there are only 1 port definitions",
        ),
        ({"id": "a", "cmd": "x", "healthChecks": [{"protocol": "UDP"}]}, "/healthChecks/0/protocol", "must be one of"),
        ({"id": "a", "cmd": "x", "env": {"K": {"secret": "nope"}}}, "/env/K", 'must be a string or {"secret"'),
        ({"id": "a", "cmd": "x", "unreachableStrategy": 5}, "/unreachableStrategy", 'must be "disabled" or'),
        (
            {"id": "a", "cmd": "x", "unreachableStrategy": {"inactiveAfterSeconds": 60, "expungeAfterSeconds": 30}},
            "/unreachableStrategy",
            "inactiveAfterSeconds must be <= expungeAfterSeconds",
        ),
        ({"id": "a", "cmd": "x", "constraints": [["rack"]]}, "/constraints/0", "must be [field, operator]"),
        ({"id": "a", "cmd": "x", "constraints": [["", "UNIQUE"]]}, "/constraints/0", "the field must not be empty"),
        ({"id": "a", "cmd": "x", "constraints": [["r", "NEAR", "1"]]}, "/constraints/0", "unknown operator 'NEAR'"),
        ({"id": "a", "cmd": "x", "constraints": [["r", "UNIQUE", "1"]]}, "/constraints/0", "UNIQUE takes no value"),
        ({"id": "a", "cmd": "x", "constraints": [["r", "CLUSTER", ""]]}, "/constraints/0", "CLUSTER takes a non-empty"),
        ({"id": "a", "cmd": "x", "constraints": [["r", "GROUP_BY", "x"]]}, "/constraints/0", "GROUP_BY takes no value"),
        ({"id": "a", "cmd": "x", "constraints": [["r", "MAX_PER"]]}, "/constraints/0", "MAX_PER needs a whole number"),
        ({"id": "a", "cmd": "x", "constraints": [["r", "MAX_PER", "0"]]}, "/constraints/0", "MAX_PER needs a whole"),
        ({"id": "a", "cmd": "x", "constraints": [["r", "IS"]]}, "/constraints/0", "IS needs a value"),
        ({"id": "a", "cmd": "x", "constraints": [["r", "LIKE", "("]]}, "/constraints/0", "is not a valid regular"),
    ],
)
def test_errors(data: dict[str, Any], path: str, text: str) -> None:
    errors = invalid(data).errors_at(path)
    assert any(text in e for e in errors), errors


def test_unknown_properties_are_ignored() -> None:
    assert mr.parse_app({"id": "a", "cmd": "x", "tasksRunning": 3, "version": "2020-01-01"}).id == "/a"


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("web", "/web"),
        ("/web/", "/web"),
        ("./web", "/web"),  # marathon-python's own live test creates "./marathon-integration-test-..."
        ("a//b", "/a/b"),
        ("./a/../b", "/b"),
        ("../../web", "/web"),  # never above the root, as Marathon's PathId.canonicalPath
        ("/prod/./db", "/prod/db"),
    ],
)
def test_ids_resolve_relative_to_the_root_as_marathon_does(given: str, canonical: str) -> None:
    assert mr.parse_app({"id": given, "cmd": "x"}).id == canonical


def test_a_health_check_may_time_out_as_late_as_its_interval() -> None:
    """Marathon has no timeoutSeconds < intervalSeconds rule (its default check, 20 s every 20 s in marathon-python's
    live test, and timeout 20 with interval 10, are both valid there): a probe that runs long delays the next one."""
    for interval, timeout in ((20, 20), (10, 20)):
        app = {"id": "a", "cmd": "x", "healthChecks": [{"intervalSeconds": interval, "timeoutSeconds": timeout}]}
        (check,) = mr.to_service(mr.parse_app(app)).health_checks
        assert (check.interval_s, check.timeout_s) == (interval, timeout)
