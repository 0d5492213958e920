"""`corral k8s`: the two commands exist and refuse bad settings with a clear message before touching a cluster."""

from __future__ import annotations

from typer.testing import CliRunner

from corral.cli.main import app

runner = CliRunner()


def test_k8s_commands_are_listed() -> None:
    r = runner.invoke(app, ["k8s", "--help"])
    assert r.exit_code == 0
    assert "extender" in r.output and "device-plugin" in r.output


def test_extender_refuses_an_unknown_policy() -> None:
    r = runner.invoke(app, ["k8s", "extender", "--policy", "nope"])
    assert r.exit_code == 2
    assert "policy: unknown policy 'nope'" in r.output


def test_device_plugin_refuses_an_unknown_resource() -> None:
    args = ["k8s", "device-plugin", "--node-name", "n1", "--simulate-gpus", "1xA100-80GB", "--resource", "foo/bar"]
    r = runner.invoke(app, args)
    assert r.exit_code == 2
    assert "cannot advertise foo/bar" in r.output
