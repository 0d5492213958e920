"""Marathon's /v2/apps under /marathon, over an in-process daemon: shapes, texts, identity, scale, restart, tasks."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.api.marathon import router
from corral.model.resources import GpuBehavior
from corral.placement import PlacementConfig
from tests.api.test_api import ALICE, BOB, ROOT, AsPeer
from tests.services.helpers import World, machine

WEB = {"id": "/web", "cmd": "python3 -m http.server $PORT0", "cpus": 0.5, "mem": 64, "instances": 2}


class Api:
    def __init__(self, tmp_path: Path, **world: Any) -> None:
        self.world = World(tmp_path, **world)
        self.lock = threading.Lock()
        d = self.world.daemon
        self.app = create_app(d, self.lock, lambda: None, routers=[router(d, self.lock, lambda: None,
                                                                          self.world.controller)])  # fmt: skip

    def client(self, peer: tuple[int, int, str] = ALICE) -> TestClient:
        return TestClient(AsPeer(self.app, peer, "unix"), raise_server_exceptions=False)

    def tick(self, seconds: float = 0.0) -> None:
        with self.lock:
            self.world.tick(seconds)


@pytest.fixture
def api(tmp_path: Path) -> Api:
    return Api(tmp_path)


def test_create_echoes_marathons_defaults_and_runs_the_instances(api: Api) -> None:
    c = api.client()
    r = c.post("/marathon/v2/apps", json=WEB)
    assert r.status_code == 201, r.text
    app = r.json()
    assert r.headers["location"] == "/marathon/v2/apps/web"
    assert (app["id"], app["instances"], app["gpus"], app["disk"], app["backoffSeconds"]) == ("/web", 2, 0, 0, 1)
    assert (app["backoffFactor"], app["maxLaunchDelaySeconds"], app["killSelection"]) == (1.15, 300, "YOUNGEST_FIRST")
    assert app["portDefinitions"] == [{"port": 0, "protocol": "tcp"}] and app["deployments"]
    api.tick()
    shown = c.get("/marathon/v2/apps/web").json()["app"]
    assert shown["tasksRunning"] == 2 and shown["deployments"] == []
    tasks = c.get("/marathon/v2/apps//web/tasks").json()["tasks"]
    assert [t["id"] for t in tasks] == ["web.1", "web.2"] and all(t["state"] == "TASK_RUNNING" for t in tasks)
    assert [t["ports"] for t in tasks] == [[40000], [40001]] and tasks[0]["host"] == "box"
    assert [a["id"] for a in c.get("/marathon/v2/apps").json()["apps"]] == ["/web"]


def test_marathons_error_shapes_and_texts(api: Api) -> None:
    c = api.client()
    assert c.post("/marathon/v2/apps", json=WEB).status_code == 201
    again = c.post("/marathon/v2/apps", json=WEB)
    assert again.status_code == 409 and again.json() == {"message": "An app with id [/web] already exists."}
    missing = c.get("/marathon/v2/apps/nope")
    assert missing.status_code == 404 and missing.json() == {"message": "App '/nope' does not exist"}
    for method in ("DELETE", "PUT"):
        other = api.client(BOB).request(method, "/marathon/v2/apps/web", json={"instances": 0})
        assert other.status_code == 404 and other.json() == {"message": "App '/web' does not exist"}, method
    assert c.post("/marathon/v2/apps/nope/restart").json() == {"message": "App '/nope' does not exist"}
    bad = c.post("/marathon/v2/apps", json={**WEB, "id": "/x", "gpus": 1.5, "mem": -1})
    assert bad.status_code == 422
    body = bad.json()
    assert body["message"] == "Object is not valid"
    assert {d["path"] for d in body["details"]} == {"/gpus", "/mem"}
    assert c.post("/marathon/v2/apps", content=b"{nope").status_code == 400
    assert c.get("/marathon/v2/apps/web").status_code == 200, "a bad request lost what was stored"


def test_gpus_are_whole_and_docker_gpus_are_refused(api: Api) -> None:
    """Checklist 22: GPU counts are whole numbers end to end; GPU + Docker runtime rejected at admission."""
    c = api.client()
    frac = c.post("/marathon/v2/apps", json={**WEB, "id": "/f", "gpus": 0.5}).json()
    assert frac["details"][0]["errors"][0].startswith("GPUs must be a whole number")
    docker = {**WEB, "id": "/d", "gpus": 1, "container": {"type": "DOCKER", "docker": {"image": "cuda"}}}
    r = c.post("/marathon/v2/apps", json=docker)
    assert r.status_code == 422 and "GPU resources only work with the Mesos containerizer" in r.text


def test_an_image_needs_a_container_runtime(api: Api) -> None:
    c = api.client()
    ucr = {**WEB, "id": "/u", "gpus": 1, "instances": 1, "container": {"type": "MESOS", "docker": {"image": "cuda:12"}}}
    r = c.post("/marathon/v2/apps", json=ucr)
    assert r.status_code == 422
    assert r.json()["details"] == [{"path": "/container", "errors": [
        "the app names the container image 'cuda:12', but this corral serve has no container runtime: start it with "
        "--container-runtime docker|podman, or give a cmd that runs without one"]}]  # fmt: skip
    api.world.daemon.container_runtime = "podman"
    assert c.post("/marathon/v2/apps", json=ucr).status_code == 201
    api.tick()
    (job,) = api.world.live("/u")
    launched = api.world.executor.spec(job.id)
    assert launched.command[:3] == ("/bin/sh", "-c", launched.command[2]) and "podman" in launched.command
    assert "cuda:12" in launched.command and launched.gpu_uuids == ("GPU-box-0",)


def test_scale_keeps_the_version_and_a_change_or_restart_makes_a_new_one(api: Api) -> None:
    c = api.client()
    c.post("/marathon/v2/apps", json=WEB)
    api.tick()
    before = c.get("/marathon/v2/apps/web").json()["app"]
    scaled = c.put("/marathon/v2/apps/web", json={"instances": 3})
    assert scaled.status_code == 200 and set(scaled.json()) == {"version", "deploymentId"}
    api.tick(1)
    after = c.get("/marathon/v2/apps/web").json()["app"]
    assert after["tasksRunning"] == 3 and after["cmd"] == WEB["cmd"]
    assert after["versionInfo"]["lastConfigChangeAt"] == before["versionInfo"]["lastConfigChangeAt"]
    assert after["versionInfo"]["lastScalingAt"] > before["versionInfo"]["lastScalingAt"]
    restarted = c.post("/marathon/v2/apps/web/restart")
    assert restarted.status_code == 200
    api.tick(1)
    api.tick()
    api.tick()
    final = c.get("/marathon/v2/apps/web").json()["app"]
    assert final["versionInfo"]["lastConfigChangeAt"] == restarted.json()["version"]
    assert {t["version"] for t in final["tasks"]} == {restarted.json()["version"]} and len(final["tasks"]) == 3
    created = c.put("/marathon/v2/apps/other", json={"cmd": "sleep 1000"})
    assert created.status_code == 201


def test_delete_removes_the_app_and_its_instances(api: Api) -> None:
    c = api.client()
    c.post("/marathon/v2/apps", json=WEB)
    api.tick()
    r = c.delete("/marathon/v2/apps/web")
    assert r.status_code == 200 and "deploymentId" in r.json()
    api.tick()
    assert api.world.live() == [] and c.get("/marathon/v2/apps").json() == {"apps": []}


def test_each_user_sees_their_own_apps_and_root_sees_all(api: Api) -> None:
    api.client(ALICE).post("/marathon/v2/apps", json=WEB)
    api.client(BOB).post("/marathon/v2/apps", json={**WEB, "id": "/bobs"})
    assert [a["id"] for a in api.client(BOB).get("/marathon/v2/apps").json()["apps"]] == ["/bobs"]
    assert [a["id"] for a in api.client(ROOT).get("/marathon/v2/apps").json()["apps"]] == ["/bobs", "/web"]
    api.tick()
    assert {j.spec.user for j in api.world.live("/bobs")} == {"bob"}


def test_the_gpu_scheduling_behavior_label_works_per_app(tmp_path: Path) -> None:
    """Checklist 21: the per-app label overrides the global mode (restricted keeps non-GPU work off free GPUs)."""
    api = Api(tmp_path, box=machine("A100"))
    assert api.world.daemon.config == PlacementConfig(gpu_behavior=GpuBehavior.UNRESTRICTED)
    c = api.client()
    c.post("/marathon/v2/apps", json={**WEB, "instances": 1, "labels": {"GPU_SCHEDULING_BEHAVIOR": "restricted"}})
    c.post("/marathon/v2/apps", json={**WEB, "id": "/free", "instances": 1})
    api.tick()
    (held,) = api.world.live()
    assert held.state.value == "queued" and "DeclinedScarceResources" in held.reason
    assert [j.state.value for j in api.world.live("/free")] == ["running"]


def test_delay_reset_and_health_in_tasks(api: Api) -> None:
    c = api.client()
    check = {"protocol": "TCP", "gracePeriodSeconds": 0, "intervalSeconds": 5, "timeoutSeconds": 1}
    c.post("/marathon/v2/apps", json={**WEB, "instances": 1, "healthChecks": [check]})
    api.tick()
    api.tick()
    api.world.checker.answer(False, "connection refused")
    api.tick(5)
    (task,) = c.get("/marathon/v2/apps/web/tasks").json()["tasks"]
    (result,) = task["healthCheckResults"]
    assert result["alive"] is False and result["consecutiveFailures"] == 1
    assert result["lastFailureCause"] == "connection refused" and result["taskId"] == "web.1"
    api.world.fail(api.world.running()[0])
    api.tick()
    assert c.get("/marathon/v2/apps/web?corral=true").json()["app"]["corral"]["launchDelaySeconds"] == 1.0
    assert c.delete("/marathon/v2/queue/web/delay").status_code == 204
    api.tick()
    assert len(api.world.running()) == 1


def test_scaling_an_app_created_without_a_leading_slash_keeps_its_instances(api: Api) -> None:
    """marathon-python creates "web" and scales with PUT /v2/apps/web {"instances": n}: that is a scale (the same
    config version, the running instances kept), not a new version that replaces them all."""
    c = api.client()
    assert c.post("/marathon/v2/apps", json={**WEB, "id": "web"}).status_code == 201
    api.tick()
    before = {j.id for j in api.world.running()}
    config = c.get("/marathon/v2/apps/web").json()["app"]["versionInfo"]["lastConfigChangeAt"]
    assert c.put("/marathon/v2/apps/web", json={"instances": 3}).status_code == 200
    api.tick(1)
    api.tick(1)
    shown = c.get("/marathon/v2/apps//web").json()["app"]
    assert shown["versionInfo"]["lastConfigChangeAt"] == config and shown["tasksRunning"] == 3
    assert before < {j.id for j in api.world.running()}


def test_corral_fields_only_when_asked(api: Api) -> None:
    c = api.client()
    c.post("/marathon/v2/apps", json={**WEB, "instances": 1})
    api.tick()
    plain = c.get("/marathon/v2/apps/web").json()["app"]
    assert "corral" not in plain and "corral" not in plain["tasks"][0]
    ours = c.get("/marathon/v2/apps/web", params={"corral": "true"}).json()["app"]
    assert ours["corral"] == {"user": "alice", "waiting": "", "launchDelaySeconds": 0.0}
    assert ours["tasks"][0]["corral"]["job"] == api.world.running()[0].id
    listed = c.get("/marathon/v2/apps", params={"embed": "apps.tasks"}).json()["apps"][0]
    assert "corral" not in listed and [t["id"] for t in listed["tasks"]] == ["web.1"]
    assert "tasks" not in c.get("/marathon/v2/apps").json()["apps"][0]
    bad = c.get("/marathon/v2/apps", params={"corral": "maybe"})
    assert bad.status_code == 400 and list(bad.json()) == ["message"]


def test_kill_task_by_id_and_versions(api: Api) -> None:
    c = api.client()
    c.post("/marathon/v2/apps", json=WEB)
    api.tick()
    gone = c.delete("/marathon/v2/apps/web/tasks/nope.9")
    assert gone.status_code == 404 and gone.json() == {"message": "Task 'nope.9' does not exist"}
    both = c.delete("/marathon/v2/apps/web/tasks/web.1", params={"scale": "true", "wipe": "true"})
    assert both.status_code == 400 and both.json() == {"message": "You cannot use scale and wipe at the same time."}
    r = c.post("/marathon/v2/tasks/delete", params={"scale": "true"}, json={"ids": ["web.2"]})
    assert r.status_code == 200 and set(r.json()) == {"version", "deploymentId"}
    api.tick()
    api.tick()
    assert [t["id"] for t in c.get("/marathon/v2/tasks").json()["tasks"]] == ["web.1"]
    versions = c.get("/marathon/v2/apps/web/versions").json()["versions"]
    assert len(versions) == 2
    assert c.get(f"/marathon/v2/apps/web/versions/{versions[1]}").json()["instances"] == 2
    missing = c.get("/marathon/v2/apps/web/versions/2000-01-01T00:00:00.000Z")
    assert missing.json() == {"message": "App '/web' does not exist in version 2000-01-01T00:00:00.000Z"}
    back = c.put("/marathon/v2/apps/web", json={"version": versions[1]})
    assert back.status_code == 200
    assert c.get("/marathon/v2/apps/web").json()["app"]["instances"] == 2
    assert c.post("/marathon/v2/tasks/delete", json={"ids": "web.1"}).status_code == 422
    bob = api.client(BOB)  # another user learns nothing of alice's app through any of the new reads
    assert bob.get("/marathon/v2/tasks").json() == {"tasks": []} and bob.get("/marathon/v2/deployments").json() == []
    assert bob.get("/marathon/v2/queue").json() == {"queue": []}
    assert bob.get("/marathon/v2/apps/web/versions").json() == {"message": "App '/web' does not exist"}
    assert bob.post("/marathon/v2/tasks/delete", json={"ids": ["web.1"]}).json() == {"tasks": []}
    assert bob.delete("/marathon/v2/apps/web/tasks/web.1").status_code == 404
    api.tick()
    assert [t["state"] for t in c.get("/marathon/v2/apps/web/tasks").json()["tasks"]] == ["TASK_RUNNING"] * 2


def test_put_a_list_of_apps_checks_all_before_changing_any(api: Api) -> None:
    c = api.client()
    c.post("/marathon/v2/apps", json=WEB)
    bad = c.put("/marathon/v2/apps", json=[{"id": "/web", "instances": 3}, {"id": "/new", "cmd": "x", "cpus": -1}])
    assert bad.status_code == 422 and [d["path"] for d in bad.json()["details"]] == ["/1/cpus"]
    assert c.get("/marathon/v2/apps/web").json()["app"]["instances"] == 2
    assert c.get("/marathon/v2/apps/new").status_code == 404
    ok = c.put("/marathon/v2/apps", json=[{"id": "web", "instances": 3}, {"id": "./new", "cmd": "sleep 100"}])
    assert ok.status_code == 200 and set(ok.json()) == {"version", "deploymentId"}
    assert [a["instances"] for a in c.get("/marathon/v2/apps").json()["apps"]] == [1, 3]
    other = api.client(BOB).put("/marathon/v2/apps", json=[{"id": "/web", "instances": 0}])
    assert other.status_code == 404 and other.json() == {"message": "App '/web' does not exist"}
    assert c.put("/marathon/v2/apps", json={"id": "/web"}).status_code == 422


def test_cancelling_a_creation_removes_the_app_and_a_scale_rolls_back(api: Api) -> None:
    c = api.client()
    held = {**WEB, "id": "/held", "constraints": [["hostname", "UNIQUE"]]}  # the second instance never launches
    c.post("/marathon/v2/apps", json=held)
    api.tick()
    (deployment,) = c.get("/marathon/v2/deployments").json()
    assert deployment["steps"] == [{"actions": [{"action": "StartApplication", "app": "/held"}]}]
    (item,) = c.get("/marathon/v2/queue").json()["queue"]
    assert (item["app"]["id"], item["count"], item["delay"]) == ("/held", 1, {"timeLeftSeconds": 0, "overdue": True})
    assert c.delete(f"/marathon/v2/deployments/{deployment['id']}", params={"force": "true"}).status_code == 202
    assert c.get("/marathon/v2/apps/held").status_code == 404
    api.tick()
    assert api.world.live() == []
    gone = c.delete(f"/marathon/v2/deployments/{deployment['id']}")
    assert gone.status_code == 404 and gone.json() == {"message": f"DeploymentPlan {deployment['id']} does not exist"}
    assert c.get("/marathon/v2/deployments").json() == []
