"""The services controller: keeps each Marathon app's instances running as corral jobs.

    store document "marathon.app" /web   the app as submitted, its owner, versions (the last MAX_VERSIONS
                                         definitions, for /versions and rollbacks; the last change's kind, for
                                         /v2/deployments), and its durable state: launch back-off, instances being
                                         killed and why, last failure, next number
    jobs with origin "marathon:/web:web.7"   its instances (QUEUED/STARTING/RUNNING); the job store is the truth
                                         about which instances live, so a restarted daemon re-finds (re-adopts) them
                                         and never launches them twice

    every round (tick, under the daemon's lock):
        health results from the worker threads -> on_check -> kill after maxConsecutiveFailures
        per app: instances of an older config version are replaced within the upgrade bounds; too many -> victims
                 by killSelection; too few -> after the launch delay, each new instance passes the constraints
                 (corral.services.placement), gets ports ($PORT0...) and is submitted
        due health checks -> the worker threads
    job_ended: the launch delay grows (failed, finished, lost, killed by its health check) or not (killed)

A round launches at most `LAUNCHES_PER_ROUND` instances and kills at most `KILLS_PER_ROUND`, over all apps: each is
a store write or two and a process to start or signal, under the daemon's lock, so an app of 1,000 instances (or a
scale to 0, or a delete) is spread over rounds instead of holding the lock for seconds. Marathon paces launches the
same way (its launch tokens: 100 every 30 s by default); corral's pace, 4 a round at 5 rounds a second, is six
times that.

Scaling (`instances` only) keeps the config version; any other change, and a restart, makes a new one: the delay
resets and the instances are replaced, as a Marathon deployment does.
"""

from __future__ import annotations

import logging
import math
import pwd
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from corral.daemon.core import CANCELLING, Daemon
from corral.executor.container import container_command
from corral.jobs.environment import base_environment
from corral.jobs.model import Job, JobSpec, JobState
from corral.mesos import marathon as mr
from corral.mesos.errors import ErrorDetail, ObjectNotValid, Problems
from corral.mesos.model import ServiceDefinition
from corral.mesos.services import COUNTED, Backoff, Health, on_check, on_instance_end, pick_victims, upgrade_bounds
from corral.model.errors import CorralError, InvalidRequest
from corral.model.snapshot import ClusterSnapshot
from corral.placement import place, render
from corral.placement.engine import validate_against
from corral.services.health import Checker, HealthChecker, Probe, Result
from corral.services.placement import GPU_FIELDS, admit
from corral.services.ports import NoPorts, PortAllocator

log = logging.getLogger("corral.services")

KIND = "marathon.app"
UNHEALTHY = "unhealthy"
#: The label by which an app asks for its instances as a gang (Marathon has no field for it; label values are strings).
GANG_LABEL = "corral.gang"
#: The start of the reason an instance is killed with when another of its gang ended (see `job_ended`).
GANG_STOP = "gang: "
ORIGIN = "marathon:"
LIVE = (JobState.QUEUED, JobState.STARTING, JobState.RUNNING)
#: The most instances one round launches, and kills, over all apps (see the module docstring).
LAUNCHES_PER_ROUND = 4
KILLS_PER_ROUND = 16
#: Versions of an app kept for `GET /v2/apps/{id}/versions` and rollbacks (Marathon keeps a bounded number too,
#: `--max_versions`); each is a copy of the definition, so the app's store document stays small.
MAX_VERSIONS = 25
NO_RUNTIME = (
    "the app names the container image {image!r}, but this corral serve has no container runtime: start it with "
    "--container-runtime docker|podman, or give a cmd that runs without one"
)
#: Job end -> Mesos task status, for the launch back-off.
STATUS = {
    JobState.SUCCEEDED: "TASK_FINISHED",
    JobState.FAILED: "TASK_FAILED",
    JobState.LOST: "TASK_LOST",
    JobState.CANCELLED: "TASK_KILLED",
}


class AppExists(CorralError):
    pass


class AppNotFound(CorralError):
    pass


def canonical(app_id: str) -> str:
    """The app id as stored: Marathon's canonical path ("web", "./web" and "/web/" are "/web")."""
    return mr.resolve_id(app_id) or "/" + app_id.strip("/")


def origin_of(key: str, instance: str) -> str:
    return f"{ORIGIN}{key}:{instance}"


def parse_origin(origin: str) -> tuple[str, str] | None:
    """(app id, instance id) of an instance's job origin, None for other jobs."""
    if not origin.startswith(ORIGIN):
        return None
    key, sep, instance = origin[len(ORIGIN) :].rpartition(":")
    return (key, instance) if sep else None


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(t * 1000) % 1000:03d}Z"


def is_gang(app: App) -> bool:
    """Whether the app asked for its instances as a gang (label corral.gang "true")."""
    return app.model.labels.get(GANG_LABEL, "").lower() == "true"


def instance_version(job: Job) -> str:
    return job.spec.env.get("MARATHON_APP_VERSION", "")


def instance_ports(job: Job) -> list[int]:
    text = job.spec.env.get("PORTS", "")
    return [int(p) for p in text.split(",") if p.isdigit()]


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int
    user: str


@dataclass
class App:
    """One app: its document (as stored) and what it parses to."""

    key: str
    doc: dict[str, Any]
    doc_version: int
    model: mr.MarathonApp
    service: ServiceDefinition
    waiting: str = ""  # why instances are missing, in words ("" when none are)

    @property
    def owner(self) -> Owner:
        o = self.doc["owner"]
        return Owner(int(o["uid"]), int(o["gid"]), str(o["user"]))

    @property
    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = self.doc.setdefault("state", {})
        return state

    @property
    def config_version(self) -> str:
        return str(self.doc["configVersion"])

    @property
    def port_names(self) -> list[str | None]:
        raw = self.doc["app"]
        if "portDefinitions" in raw:
            return [p.name for p in self.model.port_definitions]
        if isinstance(raw.get("ports"), list):
            return [None] * len(raw["ports"])
        return [None]  # Marathon gives an app without port definitions one port

    def backoff(self) -> Backoff:
        b = self.state.get("backoff") or {}
        last = b.get("last_end")
        return Backoff(
            str(b.get("version", "")),
            float(b.get("delay_s", 0.0)),
            None if last is None else datetime.fromtimestamp(float(last), UTC),
        )

    def set_backoff(self, b: Backoff) -> None:
        self.state["backoff"] = {
            "version": b.version,
            "delay_s": b.delay_s,
            "last_end": None if b.last_end is None else b.last_end.timestamp(),
        }

    @property
    def killing(self) -> dict[str, str]:
        killing: dict[str, str] = self.state.setdefault("killing", {})
        return killing


@dataclass
class InstanceHealth:
    """What the health checks of one instance said, for each of the app's checks (in memory: re-learnt after a
    restart, with the grace period counted from the instance's start)."""

    states: list[Health]
    next_due: list[float]
    in_flight: list[bool]
    last_success: list[float | None] = field(default_factory=list)
    last_failure: list[float | None] = field(default_factory=list)
    first_success: list[float | None] = field(default_factory=list)
    last_message: list[str] = field(default_factory=list)


def prepare(raw: Any, daemon: Daemon, who: Owner) -> tuple[mr.MarathonApp, ServiceDefinition, dict[str, Any], Owner]:
    """Validate an app for this daemon: Marathon's rules (422), then what corral adds. Returns the app, its service,
    the raw document to store and whom its instances run as."""
    model = mr.parse_app(raw)
    service = mr.to_service(model)
    problems = Problems()
    if service.image is not None and daemon.container_runtime is None:
        problems.add("/container", NO_RUNTIME.format(image=service.image.image))
    if model.secrets:
        problems.add("/secrets", "corral has no secret store: give the value in env, or a file the app reads")
    if model.fetch:
        problems.add("/fetch", "corral does not fetch URIs into a sandbox: install the files on this machine")
    port_count = len(model.port_definitions) if "portDefinitions" in raw else len(raw.get("ports") or [0])
    for i, hc in enumerate(service.health_checks):
        if hc.protocol != "COMMAND" and hc.port is None and (hc.port_index or 0) >= port_count:
            problems.add(f"/healthChecks/{i}/portIndex", f"the app has {port_count} port(s): use a smaller portIndex")
    gang = model.labels.get(GANG_LABEL)
    if gang is not None and gang.lower() not in ("true", "false"):
        problems.add(
            f"/labels/{GANG_LABEL}", f'must be "true" or "false" (the app\'s instances as a gang), got {gang!r}'
        )
    if model.require_ports and any(p.port == 0 for p in model.port_definitions):
        problems.add("/portDefinitions", "requirePorts needs a non-zero port in every port definition")
    runs_as = who
    if model.user is not None and model.user != who.user:
        if who.uid != 0:
            problems.add("/user", f"only root may run an app as another user ({model.user!r}); you are {who.user!r}")
        else:
            try:
                entry = pwd.getpwnam(model.user)
                runs_as = Owner(entry.pw_uid, entry.pw_gid, entry.pw_name)
            except KeyError:
                problems.add("/user", f"no user {model.user!r} on this machine")
    problems.raise_if_any()
    request = engine_request(service)
    empty = ClusterSnapshot([daemon.node])
    try:
        validate_against(empty, request)
        decision = place(empty, request, daemon.config, 0)
    except InvalidRequest as exc:
        raise ObjectNotValid([ErrorDetail("/", (exc.message,))]) from None
    if not decision.placed and all(decision.unresolvable(i) for i in range(len(empty))):
        raise ObjectNotValid([ErrorDetail("/", (f"can never run on this machine: {render(decision.explanation)}",))])
    if model.labels.get(GANG_LABEL, "").lower() == "true":
        # A gang that could not start even on the idle machine would wait for ever: refused, as a job's gang is.
        for n in range(model.instances):
            one = place(empty, replace(request, id=f"instance{n}"), daemon.config, 0)
            if one.allocation is None:
                why = f"a gang of {model.instances} can never start on this machine, even idle: only {n} fit"
                raise ObjectNotValid([ErrorDetail("/instances", (f"{why}; {render(one.explanation)}",))])
            empty.allocate(one.allocation)
        # Its queue's and user's limits count the whole gang (issue 23): one that could never start is refused now.
        whole = JobSpec(("true",), request, runs_as.user, runs_as.uid, runs_as.gid, gang_group="?",
                        gang_size=model.instances)  # fmt: skip
        try:
            daemon.queues.admit(whole)
        except InvalidRequest as exc:
            raise ObjectNotValid([ErrorDetail("/instances", (exc.message,))]) from None
    doc_app = {k: v for k, v in raw.items() if k not in READ_ONLY}
    doc_app["id"] = canonical(model.id)
    return model, service, doc_app, runs_as


#: Properties `GET /v2/apps` adds; an exported app sent back keeps none of them.
READ_ONLY = frozenset(
    {
        "version",
        "versionInfo",
        "tasksStaged",
        "tasksRunning",
        "tasksHealthy",
        "tasksUnhealthy",
        "deployments",
        "tasks",
        "lastTaskFailure",
        "corral",
    }
)


def engine_request(service: ServiceDefinition) -> Any:
    """The service's request without constraints over GPU fields (those are this controller's to apply)."""
    keep = tuple(c for c in service.request.constraints if c.attribute not in GPU_FIELDS)
    return replace(service.request, constraints=keep)


class ServicesController:
    """Keeps Marathon apps' instances running (the `Controller` protocol of `corral.daemon.core`)."""

    def __init__(
        self,
        ports: PortAllocator | None = None,
        checker: Checker | None = None,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        self.ports = ports or PortAllocator()
        self.checker: Checker = checker or HealthChecker()
        self.apps: dict[str, App] = {}
        self.health: dict[str, InstanceHealth] = {}  # by job id
        self._loaded = False
        self._new_id: Callable[[], str] = new_id or (lambda: str(uuid.uuid4()))
        self._launches_left = LAUNCHES_PER_ROUND  # this round's budgets, reset by tick
        self._ports_of: dict[str, list[int]] = {}  # live instance -> its ports (fixed at launch; read every round)
        self._kills_left = KILLS_PER_ROUND

    # -------------------------------------------------------------------------------------------- documents
    def load(self, daemon: Daemon) -> None:
        if self._loaded:
            return
        for key, doc, version in daemon.store.list_docs(KIND):
            try:
                model = mr.parse_app(doc["app"])
                self.apps[key] = App(key, doc, version, model, mr.to_service(model))
            except (CorralError, KeyError, TypeError) as exc:  # a definition that no longer parses stays stored
                log.error("app %s cannot be read (%s): its instances are left alone", key, exc)
        self._loaded = True

    def _save(self, daemon: Daemon, app: App) -> None:
        app.doc_version = daemon.store.put_doc(KIND, app.key, app.doc, expect_version=app.doc_version)

    def _version(self, app: App | None, now: float) -> str:
        """A version for a change now: an ISO time, later than the app's current one."""
        version = iso(now)
        if app is not None and version <= str(app.doc.get("version", "")):
            version = iso(datetime.fromisoformat(str(app.doc["version"]).replace("Z", "+00:00")).timestamp() + 0.001)
        return version

    # -------------------------------------------------------------------------------------------- requests
    def get(self, daemon: Daemon, app_id: str) -> App | None:
        self.load(daemon)
        return self.apps.get(canonical(app_id))

    def all(self, daemon: Daemon) -> list[App]:
        self.load(daemon)
        return [self.apps[k] for k in sorted(self.apps)]

    def create(self, daemon: Daemon, raw: Any, who: Owner) -> App:
        self.load(daemon)
        model, service, doc_app, runs_as = prepare(raw, daemon, who)
        key = doc_app["id"]
        if key in self.apps:
            raise AppExists(f"An app with id [{key}] already exists.")
        now = daemon.clock()
        version = self._version(None, now)
        doc = {
            "app": doc_app,
            "owner": {"uid": runs_as.uid, "gid": runs_as.gid, "user": runs_as.user},
            "createdBy": who.user,
            "version": version,
            "configVersion": version,
            "scalingVersion": version,
            "deployment": self._new_id(),
            "change": "start",
            "versions": [{"version": version, "app": doc_app}],
            "state": {"next": 1},
        }
        app = App(key, doc, 0, model, service)
        self._save(daemon, app)
        self.apps[key] = app
        return app

    def update(self, daemon: Daemon, app_id: str, raw: Any, who: Owner, replace: bool = False) -> tuple[App, bool]:
        """PUT: fields not given keep their values (Marathon's app update); `replace` takes `raw` as the whole
        definition. A body of only {"version": V} rolls back to that stored version. Returns (app, created)."""
        self.load(daemon)
        key = canonical(app_id)
        if not isinstance(raw, dict):
            raise ObjectNotValid([ErrorDetail("/", ("must be a JSON object",))])
        current = self.apps.get(key)
        if current is None:
            return self.create(daemon, {**raw, "id": key}, who), True
        if set(raw) == {"version"}:
            raw, replace = self.definition_at(current, str(raw["version"])), True
        base = {} if replace else current.doc["app"]
        merged = {**base, **{k: v for k, v in raw.items() if k not in READ_ONLY}, "id": key}
        owner = current.owner
        model, service, doc_app, runs_as = prepare(merged, daemon, Owner(owner.uid, owner.gid, owner.user))
        now = daemon.clock()
        version = self._version(current, now)
        before = {k: v for k, v in current.model.model_dump().items() if k != "instances"}
        after = {k: v for k, v in model.model_dump().items() if k != "instances"}
        doc = dict(current.doc)
        doc["app"] = doc_app
        doc["version"] = version
        doc["deployment"] = self._new_id()
        if before != after or runs_as != owner:
            doc["configVersion"] = version
            doc["owner"] = {"uid": runs_as.uid, "gid": runs_as.gid, "user": runs_as.user}
            doc["change"] = "upgrade"
        else:
            doc["scalingVersion"] = version
            doc["change"] = "scale"
        doc["versions"] = _with_version(current.doc, version, doc_app)
        app = App(key, doc, current.doc_version, model, service)
        if before != after:
            app.set_backoff(Backoff(version=version))  # a new version starts without a launch delay
        self._save(daemon, app)
        self.apps[key] = app
        return app, False

    def update_many(self, daemon: Daemon, raws: Sequence[Any], who: Owner) -> App | None:
        """`PUT /v2/apps` with a list: each app updated as by `update`, or created. All are checked before any is
        changed (a 422 names the app by its index), so a bad one leaves every app as it was. Returns the last."""
        self.load(daemon)
        problems = Problems()
        for i, raw in enumerate(raws):
            if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
                problems.add(f"/{i}/id", "each app needs its id")
                continue
            current = self.apps.get(canonical(raw["id"]))
            base = current.doc["app"] if current is not None else {}
            merged = {**base, **{k: v for k, v in raw.items() if k not in READ_ONLY}}
            runs = current.owner if current is not None else who
            try:
                prepare(merged, daemon, runs)
            except ObjectNotValid as exc:
                problems.extend(ErrorDetail(f"/{i}{d.path.rstrip('/')}", d.errors) for d in exc.details)
        problems.raise_if_any()
        last = None
        for raw in raws:
            last, _ = self.update(daemon, raw["id"], raw, who)
        return last

    def restart(self, daemon: Daemon, app_id: str) -> App:
        """A new config version with the same definition: every instance is replaced, the delay resets."""
        app = self._known(daemon, app_id)
        version = self._version(app, daemon.clock())
        app.doc.update(version=version, configVersion=version, deployment=self._new_id(), change="restart")
        app.doc["versions"] = _with_version(app.doc, version, app.doc["app"])
        app.set_backoff(Backoff(version=version))
        self._save(daemon, app)
        return app

    def definition_at(self, app: App, version: str) -> dict[str, Any]:
        """The app's definition as it was at `version` (AppNotFound when that version is not kept)."""
        for v in app.doc.get("versions") or []:
            if v.get("version") == version:
                return dict(v["app"])
        raise AppNotFound(f"App '{app.key}' does not exist in version {version}")

    def versions(self, app: App) -> list[str]:
        """The kept versions, newest first (an app stored before versions were kept has its current one)."""
        kept = [str(v["version"]) for v in app.doc.get("versions") or []]
        return sorted(kept or [app.config_version], reverse=True)

    def rollback(self, daemon: Daemon, app_id: str) -> App:
        """Cancel the app's deployment by going back to the version before its last change (Marathon's DELETE of
        a deployment without force). The rollback is itself a new version, as in Marathon."""
        app = self._known(daemon, app_id)
        kept = self.versions(app)
        if len(kept) < 2:
            raise AppNotFound(f"App '{app.key}' has no earlier version to roll back to")
        owner = app.owner
        rolled, _ = self.update(daemon, app.key, self.definition_at(app, kept[1]), owner, replace=True)
        return rolled

    def kill_instances(self, daemon: Daemon, app_id: str, job_ids: Sequence[str], scale: bool) -> App:
        """Kill these instances of the app (`DELETE /v2/apps/{id}/tasks/{task}`, `POST /v2/tasks/delete`). With
        `scale` the app's instances shrink by as many (a scaling version), so none is replaced; without, the rounds
        replace them (a kill does not grow the launch delay)."""
        app = self._known(daemon, app_id)
        live = {j.id: j for j in self.live_jobs(daemon).get(app.key, [])}
        doomed = [live[i] for i in job_ids if i in live and live[i].reason != CANCELLING and i not in app.killing]
        if scale and doomed:
            target = max(0, app.model.instances - len(doomed))
            app, _ = self.update(daemon, app.key, {"instances": target}, app.owner)
        why = "killed by request and scaled down" if scale else "killed by request"
        self._kill_all(daemon, app, doomed, why, app.service.kill_grace_s)
        return app

    def reset_delay(self, daemon: Daemon, app_id: str) -> App:
        """`DELETE /v2/queue/{app}/delay`: the next instance launches at once."""
        app = self._known(daemon, app_id)
        app.set_backoff(Backoff(version=app.config_version))
        self._save(daemon, app)
        return app

    def delete(self, daemon: Daemon, app_id: str) -> str:
        """Remove the app and kill its instances. Returns the deployment id."""
        app = self._known(daemon, app_id)
        daemon.store.delete_doc(KIND, app.key, expect_version=app.doc_version)
        del self.apps[app.key]
        # The first instances go now; the rounds kill the rest (instances of an app that is gone), a bounded
        # number each, so a delete does not hold the lock for as long as 1,000 kills take.
        doomed = [job for job in self.live_jobs(daemon).get(app.key, []) if job.reason != CANCELLING]
        for job in doomed[:KILLS_PER_ROUND]:
            self._kill(daemon, None, job, "deleted")
        return self._new_id()

    def _known(self, daemon: Daemon, app_id: str) -> App:
        app = self.get(daemon, app_id)
        if app is None:
            raise AppNotFound(f"App '{canonical(app_id)}' does not exist")
        return app

    def live_jobs(self, daemon: Daemon) -> dict[str, list[Job]]:
        """Each app's live instances (jobs), by app id."""
        out: dict[str, list[Job]] = {}
        for job in daemon.store.list(LIVE):
            parsed = parse_origin(job.spec.origin)
            if parsed is not None:
                out.setdefault(parsed[0], []).append(job)
        return out

    # -------------------------------------------------------------------------------------------- the round
    def tick(self, daemon: Daemon, now: float) -> None:
        self.load(daemon)
        self._launches_left, self._kills_left = LAUNCHES_PER_ROUND, KILLS_PER_ROUND
        live = self.live_jobs(daemon)
        jobs = {j.id: j for js in live.values() for j in js}
        if self._collect_health(daemon, jobs):
            live = self.live_jobs(daemon)  # health kills changed some
        for key, js in live.items():
            if key not in self.apps:  # deleted (maybe while the daemon was down): its instances go too
                for job in js:
                    if job.reason != CANCELLING and self._take_kill():
                        self._kill(daemon, None, job, "deleted")
        taken = {p for js in live.values() for j in js for p in self._instance_ports(j)}
        for app in list(self.apps.values()):
            try:
                self._reconcile(daemon, app, live.get(app.key, []), now, taken)
            except (CorralError, OSError, ValueError) as exc:
                app.waiting = f"cannot keep the app running: {exc}"
                log.exception("app %s", app.key)
        self._schedule_checks(live, now)
        for job_id in [j for j in self.health if j not in jobs]:
            del self.health[job_id]
        if len(self._ports_of) > len(jobs):
            self._ports_of = {j: p for j, p in self._ports_of.items() if j in jobs}

    def _instance_ports(self, job: Job) -> list[int]:
        ports = self._ports_of.get(job.id)
        if ports is None:
            ports = self._ports_of[job.id] = instance_ports(job)
        return ports

    def _take_kill(self) -> bool:
        """Whether this round may still kill an instance (and count it if so)."""
        if self._kills_left <= 0:
            return False
        self._kills_left -= 1
        return True

    def ready(self, app: App, job: Job) -> bool:
        """Running, and healthy by every health check the app has (what a deployment waits for)."""
        return self._ready(app, job)

    def _ready(self, app: App, job: Job) -> bool:
        if job.state is not JobState.RUNNING:
            return False
        if not app.service.health_checks:
            return True
        h = self.health.get(job.id)
        return h is not None and all(s.healthy is True for s in h.states)

    def _reconcile(self, daemon: Daemon, app: App, jobs: list[Job], now: float, taken: set[int]) -> None:
        gang = is_gang(app)
        if gang and self._break_incomplete(daemon, app, jobs):
            return  # the next round sees the instances it ended, and launches them again, together
        active = [j for j in jobs if j.reason != CANCELLING and j.id not in app.killing]
        current: list[Job] = []
        old: list[Job] = []
        for j in active:
            (current if instance_version(j) == app.config_version else old).append(j)
        target = app.model.instances
        grace = app.service.kill_grace_s
        if len(current) > target:
            victims = self._victims(app, current, min(len(current) - target, self._kills_left))
            self._kills_left -= len(victims)
            self._kill_all(daemon, app, victims, "scaled down", grace)
            gone = {j.id for j in victims}
            current = [j for j in current if j.id not in gone]
        if old:
            keep, most = upgrade_bounds(target, app.service.upgrade)
            ready = sum(self._ready(app, j) for j in current) + sum(self._ready(app, j) for j in old)
            room = most - len(current) - len(old)
            killed = False
            # Instances that are not ready go first; then by killSelection.
            for job in sorted(old, key=lambda j: self._ready(app, j)):
                is_ready = self._ready(app, job)
                if (ready - is_ready >= keep or len(current) + len(old) > most) and self._take_kill():
                    self._kill(daemon, app, job, "replaced by a new version", grace)
                    old.remove(job)
                    ready -= is_ready
                    killed = True
            if not killed and room <= 0 and len(current) < target and old and self._take_kill():
                # The bounds allow no step (e.g. minimumHealthCapacity 1 with maximumOverCapacity 0): one old
                # instance makes way, or the upgrade would never finish.
                victim = self._victims(app, old, 1)[0]
                self._kill(daemon, app, victim, "replaced by a new version", grace)
                old.remove(victim)
            missing = min(target - len(current), most - len(jobs))
        else:
            # An instance being killed still holds its place (ports, GPUs, a single-instance app's one slot) until
            # it has ended, as Marathon replaces a task once it is terminal.
            missing = target - len(current) - (len(jobs) - len(active))
        if missing <= 0:
            # A gang that waits for room: the scheduler's words for it (stored on its instances by the last round).
            queued = (j.reason for j in jobs if gang and j.state is JobState.QUEUED and j.reason.startswith(GANG_STOP))
            app.waiting = next(queued, "")
            return
        backoff = app.backoff()
        not_before = backoff.launch_not_before() if backoff.version in ("", app.config_version) else None
        if not_before is not None and now < not_before.timestamp():
            app.waiting = (
                f"{missing} instance(s) to launch after the launch delay of {backoff.delay_s:g} s "
                f"(at {iso(not_before.timestamp())})"
            )
            return
        placed = [g.index for j in jobs for g in j.gpus]
        alive = len(jobs)
        # A gang's instances are submitted in one round, whatever the round's budget (the scheduler starts a group
        # only once all of it is queued); the budget still counts them, so other apps wait for the next round.
        now_count = missing if gang else min(missing, self._launches_left)
        if now_count < missing:
            app.waiting = (
                f"{missing - now_count} instance(s) to launch in the next rounds (at most {LAUNCHES_PER_ROUND} a round)"
            )
        if now_count <= 0:
            return
        # The round's instance numbers are reserved in one write (a number is never used twice, also across a
        # restart; one left unused when a launch is held back is skipped).
        first = int(app.state.get("next", 1))
        app.state["next"] = first + now_count
        self._save(daemon, app)
        # A gang's instances are all made ready (constraints, ports) before the first is submitted: one held back
        # holds back the whole gang, so a group is never left short of members.
        gathered: list[tuple[JobSpec, list[int]]] = []
        held = "gang of {n} held back (all or none): {why}" if gang else "instance held back: {why}"
        for number in range(first, first + now_count):
            admission = admit(app.service.constraints, daemon.node, app.service.request.gpu_count, alive, placed)
            if not admission.ok:
                app.waiting = held.format(n=now_count, why=admission.reason)
                return
            try:
                fixed = [p.port for p in app.model.port_definitions] if app.model.require_ports else []
                ports = self.ports.allocate(len(app.port_names), taken, fixed)
            except NoPorts as exc:
                app.waiting = held.format(n=now_count, why=exc)
                return
            instance = f"{app.key.strip('/').replace('/', '_')}.{number}"
            spec = self._spec(daemon, app, instance, ports, admission.gpu_models, admission.min_gpu_memory_mib)
            if gang:  # submitted below, all together
                gathered.append((replace(spec, gang_group=f"{app.key}#{first}", gang_size=now_count), ports))
                taken.update(ports)
                alive += 1
                continue
            self._launches_left -= 1
            try:
                daemon.submit(spec)
            except InvalidRequest as exc:
                app.waiting = f"instance refused: {exc.message}"
                return
            taken.update(ports)
            alive += 1
        for spec, _ in gathered:
            self._launches_left -= 1
            try:
                daemon.submit(spec)
            except InvalidRequest as exc:  # the members submitted wait as an incomplete group: ended next round
                app.waiting = f"instance refused: {exc.message}"
                return
        if now_count == missing:
            app.waiting = ""

    def _break_incomplete(self, daemon: Daemon, app: App, jobs: Sequence[Job]) -> bool:
        """End the gang groups that can no longer start whole: one that lost a member before it started (scaled
        down, killed, or partly refused at submission) would wait for ever, and so would one that started and has a
        member back in the queue (preempted): its queued members are ended, and in the second case its started ones
        are stopped too. The rounds then launch the missing instances as a new gang. True when some were ended."""
        groups: dict[str, list[Job]] = {}
        for j in jobs:
            if j.spec.gang_group and j.id not in app.killing and j.reason != CANCELLING:
                groups.setdefault(j.spec.gang_group, []).append(j)
        doomed: list[Job] = []
        for members in groups.values():
            queued = [j for j in members if j.state is JobState.QUEUED]
            if not queued:
                continue
            started = len(queued) < len(members)
            if started:
                doomed += members
            elif len(members) < members[0].spec.gang_size:
                doomed += queued
        if doomed:
            why = f"{GANG_STOP}its gang can no longer start whole (a member left or went back to the queue)"
            self._kill_all(daemon, app, doomed, why, app.service.kill_grace_s)
        return bool(doomed)

    def _stop_gang(self, daemon: Daemon, app: App, ended: Job, status: str, task: str) -> None:
        """One instance of a gang ended while the app still wanted it: the others of its gang are stopped, and the
        rounds launch the whole gang again (all or nothing, as it started)."""
        others = [
            j
            for j in self.live_jobs(daemon).get(app.key, [])
            if j.spec.gang_group == ended.spec.gang_group
            and j.id != ended.id
            and j.reason != CANCELLING
            and j.id not in app.killing
        ]
        if others:
            why = f"{GANG_STOP}instance {task} of its gang ended ({status}): the gang restarts together"
            log.info("app %s: %s; stopping %d other instance(s)", app.key, why, len(others))
            self._kill_all(daemon, app, others, why, app.service.kill_grace_s)

    def _victims(self, app: App, jobs: Sequence[Job], count: int) -> list[Job]:
        """Instances not yet running go first (Marathon kills those before running ones), then by killSelection."""
        waiting = [j for j in jobs if j.state is not JobState.RUNNING]
        waiting.sort(key=lambda j: int(j.id), reverse=True)
        started = [j for j in jobs if j.state is JobState.RUNNING]
        running = [(j.id, datetime.fromtimestamp(j.started_at or j.submitted_at, UTC)) for j in started]
        by_id = {j.id: j for j in jobs}
        chosen = waiting[:count]
        chosen += [by_id[i] for i in pick_victims(running, count - len(chosen), app.service.kill_selection)]
        return chosen

    def _spec(
        self,
        daemon: Daemon,
        app: App,
        instance: str,
        ports: list[int],
        gpu_models: frozenset[str] | None,
        min_gpu_memory: int,
    ) -> JobSpec:
        service = app.service
        request = engine_request(service)
        if gpu_models is not None or min_gpu_memory:
            request = replace(request, gpu_models=gpu_models, min_gpu_memory_mib=min_gpu_memory)
        env, home = base_environment(app.owner.uid, app.owner.user)
        env.update(service.env)
        env.update(
            HOST=daemon.node.name,
            MARATHON_APP_ID=app.key,
            MARATHON_APP_VERSION=app.config_version,
            MESOS_TASK_ID=instance,
            PORTS=",".join(map(str, ports)),
        )
        if service.labels:
            env["MARATHON_APP_LABELS"] = " ".join(service.labels)
        for i, (port, name) in enumerate(zip(ports, app.port_names, strict=True)):
            env[f"PORT{i}"] = str(port)
            if name:
                env[f"PORT_{name.upper().replace('-', '_')}"] = str(port)
        if ports:
            env["PORT"] = str(ports[0])
        command = service.command
        if service.image is not None:
            runtime = daemon.container_runtime
            if runtime is None:
                raise InvalidRequest("container", NO_RUNTIME.format(image=service.image.image))
            command, extra = container_command(runtime, service.image.image, command, sorted(env))
            env.update(extra)
        owner = app.owner
        return JobSpec(
            command=command,
            request=request,
            user=owner.user,
            uid=owner.uid,
            gid=owner.gid,
            name=app.key,
            env=env,
            cwd=home,
            origin=origin_of(app.key, instance),
        )

    def _kill(self, daemon: Daemon, app: App | None, job: Job, why: str, grace: float | None = None) -> None:
        self._kill_all(daemon, app, [job], why, grace)

    def _kill_all(
        self, daemon: Daemon, app: App | None, jobs: Sequence[Job], why: str, grace: float | None = None
    ) -> None:
        """Kill instances: why, recorded for all of them in one write of the app first, then each one signalled."""
        if app is not None and jobs:
            for job in jobs:
                app.killing[job.id] = why
            self._save(daemon, app)
        for job in jobs:
            if job.state is JobState.QUEUED:
                daemon.cancel(job.id)  # ends it at once: job_ended follows
                continue
            daemon.store.update(job.id, reason=CANCELLING)
            daemon.executor.cancel(job.id, grace_s=10.0 if grace is None else grace)

    def job_ended(self, daemon: Daemon, job: Job) -> None:
        parsed = parse_origin(job.spec.origin)
        if parsed is None:
            return
        self.load(daemon)
        app = self.apps.get(parsed[0])
        self.health.pop(job.id, None)
        if app is None:
            return
        why = app.killing.pop(job.id, None)
        unhealthy = why is not None and why.startswith(UNHEALTHY)
        status = "TASK_UNHEALTHY" if unhealthy else STATUS.get(job.state, "TASK_FAILED")
        now = daemon.clock()
        version = instance_version(job)
        backoff = app.backoff()
        if version == app.config_version:
            # An instance of an older version ending says nothing about the current one's launches.
            app.set_backoff(
                on_instance_end(
                    app.service.backoff, backoff, status, datetime.fromtimestamp(now, UTC), app.config_version
                )
            )
        if status in COUNTED:
            app.state["lastTaskFailure"] = {
                "appId": app.key,
                "host": daemon.node.name,
                "message": why if unhealthy else job.reason,
                "state": status,
                "taskId": parsed[1],
                "timestamp": iso(now),
                "version": version,
            }
        self._save(daemon, app)
        wanted = why is None or unhealthy or why == "killed by request"  # not scaled down, replaced or deleted
        if is_gang(app) and job.spec.gang_group and wanted and version == app.config_version:
            self._stop_gang(daemon, app, job, status, parsed[1])

    # -------------------------------------------------------------------------------------------- health
    def _schedule_checks(self, live: Mapping[str, list[Job]], now: float) -> None:
        for key, jobs in live.items():
            app = self.apps.get(key)
            if app is None or not app.service.health_checks:
                continue
            for job in jobs:
                if job.state is JobState.RUNNING and job.reason != CANCELLING and job.id not in app.killing:
                    self._schedule(app, job, now)

    def _schedule(self, app: App, job: Job, now: float) -> None:
        checks = app.service.health_checks
        h = self.health.get(job.id)
        if h is None:
            start = job.started_at if job.started_at is not None else now
            n = len(checks)
            h = InstanceHealth(
                [Health(datetime.fromtimestamp(start, UTC)) for _ in checks],
                [start] * n, [False] * n, [None] * n, [None] * n, [None] * n, [""] * n,
            )  # fmt: skip
            self.health[job.id] = h
        ports = instance_ports(job)
        for i, rule in enumerate(checks):
            if h.in_flight[i] or now < h.next_due[i]:
                continue
            port = rule.port
            if port is None and rule.port_index is not None and rule.port_index < len(ports):
                port = ports[rule.port_index]
            probe = Probe(
                job.id, i, rule.protocol, rule.timeout_s, now, port, rule.path, rule.command,
                dict(job.spec.env), job.spec.uid, job.spec.gid,
            )  # fmt: skip
            h.in_flight[i] = True
            h.next_due[i] = now + rule.interval_s
            self.checker.submit(probe)

    def _collect_health(self, daemon: Daemon, jobs: Mapping[str, Job]) -> bool:
        """Apply the results the workers have; True when an instance was killed."""
        killed = False
        for result in self.checker.results():
            killed |= self._apply(daemon, jobs, result)
        return killed

    def _apply(self, daemon: Daemon, jobs: Mapping[str, Job], result: Result) -> bool:
        p = result.probe
        h = self.health.get(p.job_id)
        job = jobs.get(p.job_id)
        if h is None or job is None or p.index >= len(h.states):
            return False
        h.in_flight[p.index] = False
        parsed = parse_origin(job.spec.origin)
        app = self.apps.get(parsed[0]) if parsed else None
        if app is None or p.index >= len(app.service.health_checks) or job.reason == CANCELLING:
            return False
        rule = app.service.health_checks[p.index]
        h.states[p.index], kill = on_check(rule, h.states[p.index], result.ok, datetime.fromtimestamp(p.at, UTC))
        h.last_message[p.index] = result.message
        if result.ok:
            h.last_success[p.index] = p.at
            if h.first_success[p.index] is None:
                h.first_success[p.index] = p.at
        else:
            h.last_failure[p.index] = p.at
        if not kill or job.id in app.killing:
            return False
        failures = h.states[p.index].consecutive_failures
        log.warning("app %s: instance %s failed %d health checks in a row: killing it", app.key, job.id, failures)
        why = f"{UNHEALTHY}: {rule.protocol} health check failed {failures} times in a row ({result.message})"
        self._kill(daemon, app, job, why, app.service.kill_grace_s)
        return True

    def health_of(self, job_id: str) -> InstanceHealth | None:
        return self.health.get(job_id)


def _with_version(doc: Mapping[str, Any], version: str, definition: dict[str, Any]) -> list[dict[str, Any]]:
    kept = [v for v in doc.get("versions") or [] if v.get("version") != version]
    return [*kept, {"version": version, "app": definition}][-MAX_VERSIONS:]


def counts(app: App, jobs: Sequence[Job], controller: ServicesController) -> dict[str, int]:
    staged = running = healthy = unhealthy = 0
    for job in jobs:
        if job.state is JobState.RUNNING:
            running += 1
            h = controller.health_of(job.id)
            if h is not None and app.service.health_checks:
                healthy += all(s.healthy is True for s in h.states)
                unhealthy += any(s.healthy is False for s in h.states)
        else:
            staged += 1
    return {"tasksStaged": staged, "tasksRunning": running, "tasksHealthy": healthy, "tasksUnhealthy": unhealthy}


def launch_delay_left(app: App, now: float) -> float:
    at = app.backoff().launch_not_before()
    return 0.0 if at is None else max(0.0, math.ceil((at.timestamp() - now) * 1000) / 1000)
