"""Contract suite: marathon-python 0.13.0 (the `marathon` package, unmodified) against a live `corral serve`.

The only help the client gets is the shim it needs on Python 3.10+ (`collections.Iterable`, moved to
`collections.abc`). Every step goes through `MarathonClient`; corral's own view (which GPUs an instance holds) is read
with `?corral=true` or the corral CLI. `Counted` counts the client's calls, so a run reports "N/N calls passed".
"""

from __future__ import annotations

import collections
import collections.abc
import contextlib
import inspect
import json
import queue
import re
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.api.marathon import NOT_SUPPORTED
from tests.api.test_serve import wait_for
from tests.mesos.live import Live, live_corral
from tests.services.test_serve import free_range

# The shim the issue allows: marathon-python's JSON encoders still name collections.Iterable (gone since 3.10).
for _name in ("Iterable", "Mapping", "MutableMapping", "Sequence"):
    if not hasattr(collections, _name):
        setattr(collections, _name, getattr(collections.abc, _name))

from marathon import MarathonClient, MarathonHttpError, NotFoundError  # noqa: E402 - after the shim
from marathon.models.app import (  # noqa: E402
    MarathonApp,
    MarathonHealthCheck,
    MarathonTask,
    MarathonUpgradeStrategy,
)
from marathon.models.container import MarathonContainer  # noqa: E402
from marathon.models.deployment import MarathonDeployment  # noqa: E402
from marathon.models.info import MarathonInfo  # noqa: E402
from marathon.models.queue import MarathonQueueItem  # noqa: E402
from marathon.util import to_snake_case  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "marathon-app-gpu.json"
COMPAT = ROOT / "docs" / "compat" / "marathon.md"
PY = sys.executable  # a fast python3 for the instances (the PATH's python3 may be a pyenv shim)


class Counted:
    """The client, with every method call counted (and each one that raised)."""

    calls = 0
    failed: list[str] = []  # noqa: RUF012 - one tally for the module
    methods: set[str] = set()  # noqa: RUF012
    expecting = False

    def __init__(self, client: MarathonClient) -> None:
        self._client = client

    @staticmethod
    @contextlib.contextmanager
    def error_expected() -> Iterator[None]:
        """A call that must raise (a 404 after a delete): passing means raising."""
        Counted.expecting = True
        try:
            yield
        finally:
            Counted.expecting = False

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            Counted.calls += 1
            Counted.methods.add(name)
            try:
                return method(*args, **kwargs)
            except Exception as exc:
                if not Counted.expecting:
                    Counted.failed.append(f"{name}: {exc!r}")
                raise
            if Counted.expecting:
                Counted.failed.append(f"{name}: did not raise")

        return call


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CORRAL_SERVICE_PORTS", free_range(40))
        # An image app is admitted only with a runtime; none runs here (its instances fail to start, and back off).
        with live_corral(tmp_path_factory.mktemp("marathon"), "--container-runtime", "docker") as running:
            yield running
    passed = Counted.calls - len(Counted.failed)
    print(f"\nmarathon-python contract: {passed}/{Counted.calls} client calls passed ({len(Counted.methods)} methods)")
    for failure in Counted.failed:
        print(f"  failed: {failure}")


@pytest.fixture
def client(live: Live) -> Counted:
    return Counted(MarathonClient(live.url + "/marathon", auth_token=live.token, timeout=30))


def http_app(**kw: Any) -> MarathonApp:
    """Two HTTP servers with an HTTP health check on their first port."""
    check = MarathonHealthCheck(
        protocol="HTTP", path="/", port_index=0, grace_period_seconds=20, interval_seconds=1, timeout_seconds=1,
        max_consecutive_failures=3,
    )  # fmt: skip
    return MarathonApp(**{
        "cmd": f"exec {PY} -m http.server --bind 127.0.0.1 $PORT0", "cpus": 0.1, "mem": 64.0, "instances": 2,
        "health_checks": [check], **kw,
    })  # fmt: skip


def running_ids(client: Counted, app_id: str) -> set[str]:
    return {t.id for t in client.get_app(app_id).tasks if t.state == "TASK_RUNNING"}


def healthy(client: Counted, app_id: str, n: int) -> Callable[[], bool]:
    def check() -> bool:
        app = client.get_app(app_id)
        return bool(app.tasks_healthy == n and app.tasks_running == n and len(app.tasks) == n)

    return check


def test_ping_info_and_leader(client: Counted) -> None:
    assert client.ping() == b"pong"
    info = client.get_info()
    assert isinstance(info, MarathonInfo) and info.elected is True and info.name == "corral"
    assert info.leader and client.get_leader() == {"leader": info.leader}


def test_the_documented_flow(client: Counted, live: Live) -> None:
    """create (health check) -> list (embedded tasks) -> get -> scale up/down -> kill one -> kill by id -> restart ->
    versions -> delete, with a short id as the client sends it (no leading slash)."""
    created = client.create_app("contract-web", http_app())
    assert isinstance(created, MarathonApp) and created.id == "/contract-web" and created.instances == 2
    wait_for("two healthy instances", healthy(client, "contract-web", 2), timeout=30)

    listed = {a.id: a for a in client.list_apps(embed_tasks=True, embed_counts=True)}
    web = listed["/contract-web"]
    assert len(web.tasks) == 2 and all(isinstance(t, MarathonTask) and t.app_id == "/contract-web" for t in web.tasks)
    assert all(t.health_check_results[0].alive for t in web.tasks) and web.tasks_healthy == 2
    assert [a.id for a in client.list_apps(app_id="contract")] == ["/contract-web"]

    shown = client.get_app("contract-web")
    assert isinstance(shown.upgrade_strategy, MarathonUpgradeStrategy) and shown.health_checks[0].port_index == 0
    first = {t.id for t in shown.tasks}

    # Scaling by the short id keeps the running instances (it used to replace them all).
    client.scale_app("contract-web", instances=3)
    wait_for("a third instance", healthy(client, "contract-web", 3), timeout=30)
    assert first < running_ids(client, "contract-web")
    client.scale_app("contract-web", delta=-1)
    wait_for("back to the first two", lambda: {t.id for t in client.get_app("contract-web").tasks} == first, timeout=30)
    assert {t.id for t in client.list_tasks("contract-web")} == first
    assert first <= {t.id for t in client.list_tasks()}

    victim, other = sorted(first)
    killed = client.kill_task("contract-web", victim)
    assert isinstance(killed, MarathonTask) and killed.id == victim and killed.state == "TASK_KILLING"
    wait_for("a replacement", lambda: len(running_ids(client, "contract-web") - first) == 1, timeout=30)
    assert client.get_app("contract-web").instances == 2

    scaled = client.kill_task("contract-web", other, scale=True)
    assert set(scaled) == {"deploymentId", "version"}
    wait_for("one instance left", lambda: len(running_ids(client, "contract-web")) == 1, timeout=30)
    assert client.get_app("contract-web").instances == 1 and other not in running_ids(client, "contract-web")

    (last,) = running_ids(client, "contract-web")
    assert client.kill_given_tasks([last, "no-such-task.7"]) is True
    wait_for("its replacement", lambda: running_ids(client, "contract-web") - {last} != set(), timeout=30)

    restarted = client.restart_app("contract-web")
    assert set(restarted) == {"deploymentId", "version"}

    def on_new_version() -> bool:
        tasks = client.get_app("contract-web").tasks
        return len(tasks) == 1 and tasks[0].version == restarted["version"] and tasks[0].state == "TASK_RUNNING"

    wait_for("the restart", on_new_version, timeout=30)

    versions = client.list_versions("contract-web")
    assert versions[0] == restarted["version"] and versions == sorted(versions, reverse=True) and len(versions) >= 4
    oldest = client.get_version("contract-web", versions[-1])
    assert isinstance(oldest, MarathonApp) and oldest.instances == 2 and oldest.version == versions[-1]
    rolled = client.rollback_app("contract-web", versions[-1])
    assert client.get_app("contract-web").instances == 2
    assert client.list_versions("contract-web")[0] == rolled["version"]

    gone = client.delete_app("contract-web")
    assert set(gone) == {"deploymentId", "version"}
    with Counted.error_expected(), pytest.raises(NotFoundError):
        client.get_app("contract-web")
    assert "/contract-web" not in {a.id for a in client.list_apps()}


def test_deployments_queue_and_cancelling_a_deployment(client: Counted) -> None:
    """An instance that cannot launch (hostname UNIQUE on one machine) keeps a scale-up in deployment and in the
    queue; cancelling the deployment rolls the app back."""
    app = MarathonApp(cmd="exec sleep 300", cpus=0.1, mem=16.0, instances=1, constraints=[["hostname", "UNIQUE"]])
    client.create_app("/contract-held", app)
    wait_for("the first instance", lambda: len(running_ids(client, "contract-held")) == 1, timeout=30)
    wait_for("no deployment", lambda: client.list_deployments() == [], timeout=30)
    change = client.scale_app("/contract-held", instances=2)

    (deployment,) = client.list_deployments()
    assert isinstance(deployment, MarathonDeployment) and deployment.id == change["deploymentId"]
    assert deployment.affected_apps == ["/contract-held"]
    assert deployment.steps[0].actions[0].action == "ScaleApplication"
    (item,) = client.list_queue()
    assert isinstance(item, MarathonQueueItem) and item.app.id == "/contract-held" and item.count == 1
    assert item.delay.overdue is True
    client.reset_delay("contract-held")

    back = client.delete_deployment(deployment.id)
    assert set(back) == {"deploymentId", "version"}
    assert client.get_app("contract-held").instances == 1 and client.list_queue() == []
    assert client.list_deployments() == []
    client.delete_app("contract-held", force=True)


def test_marathon_pythons_own_live_test_app(client: Counted) -> None:
    """marathon-python's tests/test_create_app.py with its tests/config.py get_app(): a relative id ('./...'), a
    Docker container and an HTTP health check without timeoutSeconds (Marathon's default 20 s = its interval)."""
    service_port = 10000 + uuid.uuid4().int % 1000
    container = MarathonContainer.from_json({
        "type": "DOCKER",
        "docker": {"image": "python:3.4.3", "network": "BRIDGE",
                   "portMappings": [{"containerPort": 8000, "servicePort": service_port, "protocol": "tcp"}]},
    })  # fmt: skip
    check = {"protocol": "HTTP", "portIndex": 0, "path": "/", "gracePeriodSeconds": 5, "intervalSeconds": 20,
             "maxConsecutiveFailures": 3}  # fmt: skip
    app = MarathonApp(
        id=f"./marathon-integration-test-{uuid.uuid4()}-8000-{service_port}", instances=1, cpus=0.1, mem=64.0,
        args=["python", "-m", "http.server", "8000"], container=container,
        health_checks=[MarathonHealthCheck.from_json(check)],
    )  # fmt: skip
    created = client.create_app(app_id=app.id, app=app)
    assert created.id == "/" + app.id[2:] and created.container.docker.image == "python:3.4.3"
    got = client.get_app(app.id)
    assert isinstance(got.upgrade_strategy, MarathonUpgradeStrategy)
    assert isinstance(got.health_checks.pop(), MarathonHealthCheck)
    client.delete_app(got.id, force=True)

    # The same test, with the container swapped for a command (no container runtime runs here), up to healthy.
    local = MarathonApp(id="./contract-live-test", instances=1, cpus=0.1, mem=64.0,
                        cmd=f"exec {PY} -m http.server --bind 127.0.0.1 $PORT0",
                        health_checks=[MarathonHealthCheck.from_json({**check, "intervalSeconds": 1})])  # fmt: skip
    client.create_app(app_id=local.id, app=local)
    wait_for("the app to become healthy", lambda: bool(client.get_app(local.id).tasks_healthy), timeout=30)
    got = client.get_app(local.id)
    assert isinstance(got, MarathonApp) and isinstance(got.upgrade_strategy, MarathonUpgradeStrategy)
    assert isinstance(got.tasks.pop(), MarathonTask) and isinstance(got.health_checks.pop(), MarathonHealthCheck)
    client.delete_app(got.id, force=True)


def test_the_gpu_example_is_placed_on_a_gpu(client: Counted, live: Live) -> None:
    data = json.loads(EXAMPLE.read_text())
    data["cmd"] = data["cmd"].replace("python3", PY)
    app = MarathonApp.from_json(data)
    created = client.create_app(app.id, app)
    assert created.gpus == 1 and created.id == "/inference/echo-gpu"
    wait_for("the GPU app to become healthy", healthy(client, app.id, 1), timeout=30)

    with live.http() as http:
        plain = http.get("/marathon/v2/apps/inference/echo-gpu").json()["app"]
        assert "corral" not in plain and all("corral" not in t for t in plain["tasks"])
        ours = http.get("/marathon/v2/apps/inference/echo-gpu", params={"corral": "true"}).json()["app"]
    ((task,),) = [ours["tasks"]]
    assert [g["model"] for g in task["corral"]["gpus"]] == ["A100"]
    shown = json.loads(live.local.run("app", "show", "inference/echo-gpu", "--json").stdout)
    assert shown["tasks"][0]["corral"]["gpus"] == task["corral"]["gpus"]
    listed = live.local.run("app", "list").stdout
    assert "/inference/echo-gpu" in listed and "1/1" in listed
    client.delete_app(app.id)


def fits(body: dict[str, Any], model: type) -> bool:
    """Whether marathon-python's `model.from_json` takes every key of `body` (it passes each, snake_cased, to the
    constructor, which fails on any it does not know)."""
    taken = set(inspect.signature(model).parameters)
    return {to_snake_case(k) for k in body} <= taken


def test_default_answers_carry_no_corral_fields(client: Counted, live: Live) -> None:
    client.create_app("contract-shape", MarathonApp(cmd="exec sleep 300", cpus=0.1, mem=16.0, instances=1))
    wait_for("the instance", lambda: len(running_ids(client, "contract-shape")) == 1, timeout=30)
    with live.http() as http:
        every = "&".join(f"embed=apps.{e}" for e in ("tasks", "counts", "deployments", "readiness", "lastTaskFailure",
                                                     "failures", "taskStats"))  # fmt: skip
        (app,) = [a for a in http.get(f"/marathon/v2/apps?{every}").json()["apps"] if a["id"] == "/contract-shape"]
        assert fits(app, MarathonApp) and {"tasks", "taskStats", "readinessCheckResults"} <= set(app)
        assert fits(app["tasks"][0], MarathonTask) and fits(http.get("/marathon/v2/info").json(), MarathonInfo)
        for path in ("/v2/apps?embed=apps.tasks", "/v2/apps/contract-shape", "/v2/apps/contract-shape/tasks",
                     "/v2/tasks", "/v2/queue", "/v2/deployments"):  # fmt: skip
            assert '"corral"' not in http.get("/marathon" + path).text, path
        assert "corral" in http.get("/marathon/v2/apps/contract-shape", params={"corral": "true"}).json()["app"]
    # update_apps: PUT /v2/apps with a list (a scale of one app, the creation of another)
    more = MarathonApp(id="contract-more", cmd="exec sleep 300", cpus=0.1, mem=16.0, instances=1)
    client.update_apps([MarathonApp(id="contract-shape", instances=2), more])
    wait_for(
        "both apps", lambda: len(running_ids(client, "contract-shape") | running_ids(client, "contract-more")) == 3
    )
    killed = client.kill_tasks("contract-more")
    assert [t.id for t in killed] == ["contract-more.1"] and killed[0].state == "TASK_KILLING"
    client.delete_app("contract-shape")
    client.delete_app("contract-more")


def test_the_event_stream(client: Counted, live: Live) -> None:
    """event_stream() sends no token, only Basic auth: the token as the password."""
    sse = Counted(MarathonClient(live.url + "/marathon", username="events", password=live.token))
    got: queue.Queue[Any] = queue.Queue()

    def listen() -> None:
        try:
            for event in sse.event_stream(
                event_types=[
                    "event_stream_attached",
                    "status_update_event",
                    "health_status_changed_event",
                    "app_terminated_event",
                ]
            ):
                got.put(event)
                if event.event_type == "app_terminated_event":
                    return
        except Exception as exc:  # the test reads it from the queue
            got.put(exc)

    threading.Thread(target=listen, daemon=True).start()
    assert got.get(timeout=10).event_type == "event_stream_attached"
    client.create_app("contract-events", http_app(instances=1))
    seen: list[Any] = []

    def until(kind: str, **attrs: Any) -> Any:
        while True:
            event = got.get(timeout=30)
            assert not isinstance(event, Exception), event
            seen.append(event)
            if event.event_type == kind and all(getattr(event, k, None) == v for k, v in attrs.items()):
                return event

    running = until("status_update_event", app_id="/contract-events", task_status="TASK_RUNNING")
    assert running.task_id == "contract-events.1" and running.ports
    assert until("health_status_changed_event", app_id="/contract-events").alive is True
    client.delete_app("contract-events")
    ended = until("status_update_event", task_id="contract-events.1", task_status="TASK_KILLED")
    assert ended.app_id == "/contract-events"
    until("app_terminated_event", app_id="/contract-events")
    sse._client.sse_session.close()


# ------------------------------------------------------------------------------------------ not supported
def compat_rows() -> list[tuple[str, str, str]]:
    """(method, path, corral's answer) for each row of the endpoint table in docs/compat/marathon.md."""
    rows = []
    for line in COMPAT.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"(GET|HEAD|POST|PUT|PATCH|DELETE)(, (GET|HEAD|POST|PUT|PATCH|DELETE))*",
                                            cells[0]):  # fmt: skip
            for method in cells[0].split(", "):
                rows.append((method, cells[1].strip("`"), cells[2]))
    return rows


def test_the_compat_table_lists_exactly_the_endpoints_the_code_refuses() -> None:
    documented = {(m, p) for m, p, answer in compat_rows() if answer.startswith("not supported")}
    refused = {(m, p) for methods, p, _ in NOT_SUPPORTED for m in methods}
    assert documented == refused


def test_every_endpoint_not_supported_says_so_in_marathons_shape(live: Live) -> None:
    rows = compat_rows()
    assert len(rows) > 60, "the endpoint table was not found"
    with live.http() as http:
        for method, path, answer in rows:
            url = "/marathon" + re.sub(r"\{(\w+)\}", lambda m: f"x-{m.group(1).replace('_', '-')}", path)
            with http.stream(method, url) as got:  # streamed: GET /v2/events never ends
                if not answer.startswith("not supported"):
                    assert got.status_code != 501, (method, path)
                    if got.status_code == 404:  # an unknown app or task, not an unknown route
                        assert "no route" not in got.read().decode(), (method, path)
                    continue
                got.read()
            assert got.status_code == 501, (method, path, got.status_code, got.text)
            if method != "HEAD":  # a HEAD answer has no body
                body = got.json()
                assert list(body) == ["message"] and "not supported by corral" in body["message"], (method, path)
                assert body["message"].startswith(f"{method} {url.removeprefix('/marathon')}: ")


def test_an_app_with_the_gang_label_starts_its_instances_together(client: Counted, live: Live) -> None:
    """The label `corral.gang` (docs/preemption.md): the app's JSON shape is Marathon's, the label is echoed as given;
    a gang that could never all run on the idle machine (2 GPUs here) is refused with Marathon's 422."""

    def gang(n: int) -> MarathonApp:
        return MarathonApp(
            cmd="exec sleep 600", cpus=0.1, mem=32.0, gpus=1, instances=n, labels={"corral.gang": "true"}
        )

    created = client.create_app("/gang-pair", gang(2))
    assert created.labels == {"corral.gang": "true"}
    wait_for("both instances to run", lambda: len(running_ids(client, "/gang-pair")) == 2, timeout=30)
    with live.http() as http:
        ours = http.get("/marathon/v2/apps/gang-pair", params={"corral": "true"}).json()["app"]
    gpus = [g["index"] for t in ours["tasks"] for g in t["corral"]["gpus"]]
    assert sorted(gpus) == [0, 1]
    client.delete_app("/gang-pair")
    with Counted.error_expected(), pytest.raises(MarathonHttpError) as refused:
        client.create_app("/gang-three", gang(3))
    assert refused.value.status_code == 422 and "can never start" in json.dumps(refused.value.error_details)
