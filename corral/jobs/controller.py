"""The jobs controller: named job definitions (Metronome, Chronos) turned into runs, and runs into corral jobs.

    every round (daemon lock held), after the daemon has collected exits:
      active runs   -> follow each run's task (a corral job with origin "SOURCE:NAME:RUN"):
                       queued -> run STARTING; started -> ACTIVE; ended -> outcome:
                         success                              -> run SUCCESS
                         failure, Metronome ON_FAILURE in deadline -> new task at once (no back-off)
                         failure, Chronos attempt < retries  -> new task after the retry delay
                         otherwise / stopped                 -> run FAILED
                       a scheduled run still STARTING past its starting deadline -> task cancelled, run FAILED
      schedules     -> due_ticks(schedule, cursor, now): the latest due tick (if in time, and not FORBID-blocked)
                       becomes a run; the cursor moves in the same write (see corral.jobs.definitions)
      dependencies  -> Metronome: every parent's latest run SUCCESS and newer than the child's last dependency start;
                       Chronos: every parent has a completion (success, or failure with softError) not yet consumed
                       by this child; one dependency run at a time, the state kept in the store

Runs' corral jobs have no retries of their own: the definition's restart or retry rule decides, in the controller.
A task's outcome is its corral job's state, which the daemon takes from the job's supervisor record (see
corral.executor.local): a task that finished while the daemon was down is SUCCEEDED or FAILED with its real exit
code, never LOST, so a restart neither re-runs a finished run nor spends an ON_FAILURE relaunch or a Chronos retry
on it. LOST (its supervisor vanished without a record, e.g. a reboot) counts as a failure, as Mesos' lost tasks do.
`job_ended` needs no work: the round reads each task's job from the store right after the daemon has ended it, which
also covers a restart that happened between the two.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from corral.executor.container import container_command
from corral.jobs.definitions import (
    ACTIVE,
    DEF,
    FAILED,
    FINAL,
    HISTORY_KEPT,
    RUN,
    STARTING,
    STATE,
    SUCCESS,
    Book,
    Conflict,
    DefinitionNotFound,
    NameTaken,
    Owner,
    RunNotFound,
    epoch,
    instant,
    run_key,
)
from corral.jobs.environment import base_environment
from corral.jobs.model import Job, JobSpec, JobState
from corral.mesos import chronos, metronome
from corral.mesos.errors import ObjectNotValid, Problems
from corral.mesos.model import JobDefinition, ScheduleRule
from corral.model.errors import InvalidRequest
from corral.model.snapshot import ClusterSnapshot
from corral.placement import place, render
from corral.placement.engine import validate_against
from corral.schedule.clock import Schedule, TickPolicy, due_ticks
from corral.schedule.iso8601 import RepeatingInterval
from corral.store.base import JobQuery

if TYPE_CHECKING:
    from corral.daemon.core import Daemon

log = logging.getLogger("corral.jobs")

Source = Literal["metronome", "chronos"]
TASK_FINAL = frozenset({"TASK_FINISHED", "TASK_FAILED", "TASK_KILLED"})
_TASK_STATUS = {
    JobState.QUEUED: "TASK_CREATED",
    JobState.STARTING: "TASK_STARTING",
    JobState.RUNNING: "TASK_RUNNING",
    JobState.SUCCEEDED: "TASK_FINISHED",
    JobState.FAILED: "TASK_FAILED",
    JobState.CANCELLED: "TASK_KILLED",
    JobState.LOST: "TASK_FAILED",  # Mesos' lost and error tasks are failures in Metronome
}
COUNTED_KEPT = 200  # run ids whose outcome is already in the counters (a restart must not count one twice)
#: Schedule decisions that write (a run triggered, or a cursor moved past ticks that did not run) per round, the
#: earliest due first: 10 a second at the loop's pace. Each is about five durable store writes under the daemon's
#: lock (and a run's launch three more), so 20 schedules due at once are spread over rounds instead of holding the
#: lock for their sum; a tick that waits a round is still due (its cursor has not moved) and runs late, within its
#: starting deadline.
SCHEDULE_DECISIONS_PER_ROUND = 2
#: At a restart, jobs submitted up to this long before the oldest active run are looked at as its tasks.
RUN_CLOCK_MARGIN_S = 86400.0


@dataclass
class Entry:
    """A stored definition, parsed once per document version."""

    name: str
    source: Source
    owner: Owner
    created_at: float
    definition: JobDefinition
    metronome: metronome.MetronomeJob | None = None
    chronos: chronos.ChronosJob | None = None
    schedules: list[tuple[ScheduleRule, Schedule]] = field(default_factory=list)

    @property
    def parents(self) -> tuple[str, ...]:
        return self.definition.parents


def blank_state() -> dict[str, Any]:
    return {
        "cursors": {},
        "success_count": 0,
        "failure_count": 0,
        "last_success_at": None,
        "last_failure_at": None,
        "errors_since_last_success": 0,
        "auto_disabled": False,
        "latest": None,  # {"status", "finished_at"} of the latest finished run
        "successful_runs": [],
        "failed_runs": [],
        "counted": [],
        "completions": 0,  # runs that let children run (Chronos: success, or failure with softError)
        "consumed": {},  # Chronos child: parent -> completions of that parent already used
        "last_dependency_start": None,  # Metronome child: when its last dependency-triggered run was created
        "missed_ticks": 0,
        "forbidden_ticks": 0,
        "pending": None,
    }


class JobsController:
    """The `Controller` of job definitions. Every method runs under the daemon's lock."""

    def __init__(
        self,
        daemon: Daemon,
        *,
        chronos_defaults: chronos.ChronosDefaults | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.daemon = daemon
        self.book = Book(daemon.store)
        self.chronos_defaults = chronos_defaults or chronos.ChronosDefaults()
        self.rng = rng or random.Random(os.urandom(16))
        self._entries: dict[str, tuple[dict[str, Any], Entry | None]] = {}  # name -> (the document parsed, its entry)
        self._active: set[str] = set()  # keys of runs not yet SUCCESS/FAILED
        self._next_check: dict[str, float] = {}  # name -> when its schedule can next have a due tick
        self._decisions_left = SCHEDULE_DECISIONS_PER_ROUND  # this round's, reset by tick
        self._loaded = False

    # ------------------------------------------------------------------------------------------ the Controller
    def tick(self, daemon: Daemon, now: float) -> None:
        self.load()
        for key in sorted(self._active):
            self._follow(key, now)
        self._decisions_left = SCHEDULE_DECISIONS_PER_ROUND
        due_first = sorted((self._next_check.get(n, -math.inf), n) for n, _ in self.book.items(DEF))
        for _, name in due_first:
            entry = self.entry(name)
            if entry is None:
                continue
            if entry.schedules:
                self._schedule(entry, now)
            if entry.parents:
                self._dependencies(entry, now)

    def job_ended(self, daemon: Daemon, job: Job) -> None:
        """Nothing to do: the round that follows reads the job's end from the store (see the module docstring)."""

    # ------------------------------------------------------------------------------------------ loading
    def load(self) -> None:
        """Once per daemon start: finish runs that were decided but not written, and attach tasks that were
        submitted but not recorded (the daemon stopped between the two writes)."""
        if self._loaded:
            return
        self._loaded = True
        defined = {name for name, _ in self.book.items(DEF)}
        for name, state in list(self.book.items(STATE)):
            if name not in defined:
                continue
            pending = state.get("pending")
            if pending is not None:
                key = run_key(name, pending["id"])
                if self.book.get(RUN, key) is None:
                    self.book.put(RUN, key, pending)
                self.book.put(STATE, name, {**state, "pending": None})
        active = {key: run for key, run in self.book.items(RUN) if run["status"] not in FINAL}
        self._active = set(active)
        if not active:  # the common restart: nothing to attach, and the store's history is not read
            return
        # A run's tasks were submitted after it was made: only jobs since the oldest active run are read, not the
        # whole history (100,000 ended jobs took 13 s under the daemon's lock in the first round: issue 26, item 7).
        # A day's margin: the clock may have been set back between a run's making and its tasks'.
        since = min(float(run["created_at"]) for run in active.values()) - RUN_CLOCK_MARGIN_S
        by_origin: dict[str, list[Job]] = {}
        for job in self.daemon.store.query(JobQuery(since=since)):
            if job.spec.origin.startswith(("metronome:", "chronos:")):
                by_origin.setdefault(job.spec.origin, []).append(job)
        for key in sorted(self._active):
            run = self.book.get(RUN, key)
            entry = self.entry(run["job"]) if run is not None else None
            if run is None or entry is None:
                continue
            known = {t["job"] for t in run["tasks"]}
            extra = [j for j in by_origin.get(self._origin(entry, run), []) if j.id not in known]
            if extra:
                run = copy.deepcopy(run)
                for job in extra:
                    run["tasks"].append(self._task(job))
                    run["wait_until"] = None
                self.book.put(RUN, key, run)

    def entry(self, name: str) -> Entry | None:
        doc = self.book.get(DEF, name)
        if doc is None:
            self._entries.pop(name, None)
            return None
        cached = self._entries.get(name)
        if cached is not None and cached[0] is doc:
            return cached[1]
        try:
            entry: Entry | None = self._parse(doc)
        except (InvalidRequest, ObjectNotValid, ValueError, KeyError, TypeError) as exc:
            # Stored by an older corral past today's admission rules (docs/limits.md): left out, never a round's
            # failure, which would stop every other definition's schedule too. Said once per stored version.
            log.warning("job definition %r cannot be loaded and is left out: %s", name, exc)
            entry = None
        self._entries[name] = (doc, entry)
        return entry

    def _parse(self, doc: dict[str, Any]) -> Entry:
        owner = Owner.from_json(doc["owner"])
        if doc["source"] == "metronome":
            mjob = metronome.parse_job(doc["spec"])
            definition = metronome.to_definition(mjob)
            entry = Entry(doc["name"], "metronome", owner, doc["created_at"], definition, metronome=mjob)
        else:
            anchor = instant(doc["anchor"])
            cjob = chronos.parse_job(doc["spec"], now=anchor)
            definition = chronos.to_definition(cjob, now=anchor, defaults=self.chronos_defaults)
            entry = Entry(doc["name"], "chronos", owner, doc["created_at"], definition, chronos=cjob)
        entry.schedules = [(rule, rule.schedule()) for rule in definition.schedules]
        return entry

    def entries(self, viewer: Owner | None = None, source: Source | None = None) -> list[Entry]:
        self.load()
        out = []
        for name, _ in self.book.items(DEF):
            entry = self.entry(name)
            if entry is None or (source is not None and entry.source != source):
                continue
            if viewer is None or viewer.may_see(entry.owner):
                out.append(entry)
        return sorted(out, key=lambda e: e.name)

    def visible(self, name: str, viewer: Owner, source: Source | None = None) -> Entry:
        self.load()
        entry = self.entry(name)
        if entry is None or not viewer.may_see(entry.owner) or (source is not None and entry.source != source):
            raise DefinitionNotFound(name)
        return entry

    def state(self, name: str) -> dict[str, Any]:
        return self.book.get(STATE, name) or blank_state()

    def runs(self, name: str, active_only: bool = False, fresh: bool = True) -> list[dict[str, Any]]:
        """The job's runs, oldest first. `fresh`: bring active runs up to date with their tasks first (the round
        follows runs before it launches jobs, so a run read between rounds would lag by one)."""
        prefix = f"{name}/"
        if fresh:
            now = self.daemon.clock()
            for key in sorted(k for k in self._active if k.startswith(prefix)):
                self._follow(key, now)
        if active_only:  # from the index of active runs: the round asks this for every scheduled or dependent job
            found = [self.book.get(RUN, k) for k in self._active if k.startswith(prefix)]
            runs = [r for r in found if r is not None and r["status"] not in FINAL]
        else:
            runs = [r for k, r in self.book.items(RUN) if k.startswith(prefix)]
        return sorted(runs, key=lambda r: (r["created_at"], r["id"]))

    def run(self, name: str, run_id: str) -> dict[str, Any]:
        if run_key(name, run_id) in self._active:
            self._follow(run_key(name, run_id), self.daemon.clock())
        run = self.book.get(RUN, run_key(name, run_id))
        if run is None:
            raise RunNotFound(name, run_id)
        return run

    # ------------------------------------------------------------------------------------------ definitions
    def known_metronome(self, viewer: Owner) -> dict[str, Sequence[str]]:
        """Metronome job id -> its dependencies, for the jobs `viewer` may depend on."""
        self.load()
        return {e.name: e.parents for e in self.entries(viewer, "metronome")}

    def known_chronos(self, viewer: Owner) -> dict[str, Sequence[str]]:
        """Chronos job name -> its parents, for the jobs `viewer` may name as parents."""
        return {e.name: e.parents for e in self.entries(viewer, "chronos")}

    def admit(self, doc: dict[str, Any], status: int) -> Entry:
        """Parse a definition document about to be stored, and refuse what corral cannot run here (ObjectNotValid
        with the source's status: 422 Metronome, 400 Chronos)."""
        entry = self._parse(doc)
        problems = Problems(status=status)
        d = entry.definition
        metro = entry.source == "metronome"
        if d.image is not None and self.daemon.container_runtime is None:
            where = ("/run/docker" if d.image.runtime == "docker" else "/run/ucr") if metro else "/container"
            problems.add(
                where,
                f"job {d.name} names the container image {d.image.image!r}, but this corral serve has no container "
                "runtime: start it with --container-runtime docker (or podman), or give a command without an image",
            )
        if d.secret_env:
            problems.add("/run/secrets", "corral has no secret store: give the values in env instead of secrets")
        if d.artifacts:
            problems.add(
                "/run/artifacts" if metro else "/fetch",
                "corral does not fetch artifacts: put the files on this machine (or in the image) instead",
            )
        if metro and entry.metronome is not None and entry.metronome.run.volumes:
            problems.add("/run/volumes", "volumes are not supported by corral's container runs")
        if not problems:
            try:
                self._check_fits(d)
            except InvalidRequest as exc:
                problems.add("/run/gpus" if metro and d.request.wants_gpu else ("/run" if metro else "/"), exc.message)
        problems.raise_if_any()
        return entry

    def _check_fits(self, d: JobDefinition) -> None:
        empty = ClusterSnapshot([self.daemon.node])
        validate_against(empty, d.request)
        decision = place(empty, d.request, self.daemon.config, 0)
        if not decision.placed and all(decision.unresolvable(i) for i in range(len(empty))):
            raise InvalidRequest("request", f"can never run on this machine: {render(decision.explanation)}")

    def create(self, source: Source, name: str, spec: dict[str, Any], owner: Owner, now: float, status: int) -> Entry:
        """Store a new definition (NameTaken if the name is used, whoever owns it)."""
        self.load()
        if self.book.get(DEF, name) is not None:
            raise NameTaken(name)
        self._entries.pop(name, None)
        doc = {"name": name, "source": source, "owner": owner.to_json(), "spec": spec, "created_at": now}
        doc["anchor"] = now
        entry = self.admit(doc, status)
        state = blank_state()
        state["cursors"] = self._initial_cursors(entry, now, {})
        state["consumed"] = {p: self.state(p)["completions"] for p in entry.parents}
        state["last_dependency_start"] = now if entry.parents else None
        once = None
        if entry.definition.run_once_now:
            once = self._new_run(entry, "once", now)
            state["pending"] = once
        self.book.put(STATE, name, state)
        self.book.put(DEF, name, doc)
        if once is not None:
            self._write_pending(entry, once, now)
        return self.entry(name) or entry

    def replace(self, name: str, spec: dict[str, Any], owner: Owner, now: float, status: int) -> Entry:
        """Replace a definition's spec (Metronome PUT, Chronos re-post, schedule changes); its runs, counters and
        dependency state stay; the cursor of a schedule whose expression changed starts again from now."""
        old = self.visible(name, owner)
        doc = dict(self.book.get(DEF, name) or {})
        doc["spec"] = spec
        if old.source == "chronos" and old.chronos is not None:
            same = (spec.get("schedule"), spec.get("scheduleTimeZone", "")) == (
                old.chronos.schedule,
                old.chronos.schedule_time_zone,
            )
            if not same:
                doc["anchor"] = now  # an empty start means the time of this post
        entry = self.admit(doc, status)
        before = {r.id: r for r, _ in old.schedules}
        state = copy.deepcopy(self.state(name))
        state["cursors"] = self._initial_cursors(entry, now, {
            sid: c for sid, c in state["cursors"].items()
            if sid in before and any(r.id == sid and _same(r, before[sid]) for r, _ in entry.schedules)
        })  # fmt: skip
        for p in entry.parents:
            state["consumed"].setdefault(p, self.state(p)["completions"])
        self.book.put(STATE, name, state)
        self.book.put(DEF, name, doc)
        self._next_check.pop(name, None)
        return self.entry(name) or entry

    def _initial_cursors(self, entry: Entry, now: float, keep: dict[str, float]) -> dict[str, float]:
        cursors = {}
        for rule, sched in entry.schedules:
            if rule.id in keep:
                cursors[rule.id] = keep[rule.id]
            elif isinstance(sched, RepeatingInterval):
                # Chronos runs a job whose start has passed at once (its missed periods collapse into one run).
                cursors[rule.id] = min(now, epoch(sched.start) - 0.001)
            else:
                cursors[rule.id] = now  # Metronome never back-fills ticks from before the schedule existed
        return cursors

    def delete(self, name: str, owner: Owner, stop_runs: bool) -> Entry:
        entry = self.visible(name, owner)
        active = self.runs(name, active_only=True)
        if active and not stop_runs:
            raise Conflict(metronome.ACTIVE_RUNS)
        children = sorted(e.name for e in self.entries() if name in e.parents)
        if children:
            raise Conflict(f"Job {name} is a dependency of {', '.join(children)}; delete them first")
        for run in active:
            self._cancel_tasks(run)
        for run in self.runs(name):
            self.book.delete(RUN, run_key(name, run["id"]))
            self._active.discard(run_key(name, run["id"]))
        self.book.delete(STATE, name)
        self.book.delete(DEF, name)
        self._entries.pop(name, None)
        self._next_check.pop(name, None)
        return entry

    # ------------------------------------------------------------------------------------------ runs
    def start_run(
        self, name: str, owner: Owner, now: float, trigger: str = "manual", arguments: Sequence[str] = ()
    ) -> dict[str, Any]:
        """A run now, whatever the schedule or concurrency policy says (manual runs ignore FORBID)."""
        entry = self.visible(name, owner)
        run = self._new_run(entry, trigger, now, arguments=arguments)
        key = run_key(name, run["id"])
        self.book.put(RUN, key, run)
        self._active.add(key)
        self._follow(key, now)
        return self.book.get(RUN, key) or run

    def stop_run(self, name: str, run_id: str, owner: Owner, now: float) -> dict[str, Any]:
        self.visible(name, owner)
        key = run_key(name, run_id)
        run = self.run(name, run_id)
        if run["status"] in FINAL:
            return run
        run = copy.deepcopy(run)
        run["stop"] = True
        run["reason"] = "stopped"
        self.book.put(RUN, key, run)
        self._cancel_tasks(run)
        self._follow(key, now)
        return self.book.get(RUN, key) or run

    def stop_all(self, name: str, owner: Owner, now: float) -> None:
        for run in self.runs(name, active_only=True):
            self.stop_run(name, run["id"], owner, now)

    def mark_success(self, name: str, owner: Owner, now: float) -> None:
        """Chronos `PUT /v1/scheduler/job/success/NAME`: count a success, so that children waiting on it run."""
        entry = self.visible(name, owner)
        state = copy.deepcopy(self.state(name))
        if entry.source == "chronos":
            _apply_stats(state, chronos.on_success(_stats(state), instant(now)).stats)
        else:
            state["success_count"] += 1
            state["last_success_at"] = now
        state["latest"] = {"status": SUCCESS, "finished_at": now}
        state["completions"] += 1
        self.book.put(STATE, name, state)

    def _new_run(self, entry: Entry, trigger: str, now: float, **extra: Any) -> dict[str, Any]:
        while True:
            run_id = metronome.new_run_id(instant(now), self.rng)
            if self.book.get(RUN, run_key(entry.name, run_id)) is None:
                break
        run: dict[str, Any] = {
            "id": run_id,
            "job": entry.name,
            "trigger": trigger,
            "status": STARTING,
            "created_at": now,
            "completed_at": None,
            "tick": None,
            "deadline": None,  # a scheduled run must be ACTIVE by then
            "tasks": [],
            "wait_until": now,  # when to submit the next task (None: none wanted)
            "attempt": 0,  # failed tasks so far (Chronos' retries count them)
            "stop": False,
            "reason": "",
            "arguments": [],
        }
        run.update(extra)
        run["arguments"] = list(run["arguments"])
        return run

    def _write_pending(self, entry: Entry, run: dict[str, Any], now: float) -> None:
        """The run recorded as `pending` in the state document: write it, clear `pending`, and start it."""
        key = run_key(entry.name, run["id"])
        if self.book.get(RUN, key) is None:
            self.book.put(RUN, key, run)
        state = self.book.get(STATE, entry.name)
        if state is not None and state.get("pending") is not None:
            self.book.put(STATE, entry.name, {**state, "pending": None})
        self._active.add(key)
        self._follow(key, now)

    def _trigger(self, entry: Entry, trigger: str, now: float, changes: dict[str, Any], **extra: Any) -> None:
        """A run decided by the controller, with the state changes that decided it, in one state write."""
        run = self._new_run(entry, trigger, now, **extra)
        state = {**copy.deepcopy(self.state(entry.name)), **changes, "pending": run}
        self.book.put(STATE, entry.name, state)
        self._write_pending(entry, run, now)

    def _cancel_tasks(self, run: dict[str, Any]) -> None:
        for task in run["tasks"]:
            if task["status"] in TASK_FINAL:
                continue
            job = self.daemon.store.get(task["job"])
            if job is not None and not job.state.final:
                with contextlib.suppress(InvalidRequest):  # it ended meanwhile
                    self.daemon.cancel(job.id)

    # ------------------------------------------------------------------------------------------ following runs
    def _follow(self, key: str, now: float) -> None:
        stored = self.book.get(RUN, key)
        entry = self.entry(stored["job"]) if stored is not None else None
        if stored is None or entry is None or stored["status"] in FINAL:
            self._active.discard(key)
            return
        run = copy.deepcopy(stored)
        task = run["tasks"][-1] if run["tasks"] else None
        if task is not None and task["status"] not in TASK_FINAL:
            job = self.daemon.store.get(task["job"])
            if job is not None and job.state is JobState.QUEUED and run["status"] == STARTING:
                deadline = run["deadline"]
                if deadline is not None and now > deadline:
                    run["stop"] = True
                    run["reason"] = (
                        f"not started within its starting deadline ({deadline - (run['tick'] or deadline):g} s "
                        "after its scheduled time): aborted"
                    )
                    self.book.put(RUN, key, run)
                    self._cancel_tasks(run)
                    job = self.daemon.store.get(task["job"])
            self._observe(run, task, job, now)
        task = run["tasks"][-1] if run["tasks"] else None
        if run["status"] not in FINAL and (task is None or task["status"] in TASK_FINAL):
            if run["stop"]:
                self._finish(entry, run, FAILED, now, run["reason"] or "stopped")
            elif run["wait_until"] is not None and now >= run["wait_until"]:
                self._submit(entry, run, now)
        if run != stored:
            self.book.put(RUN, key, run)
        if run["status"] in FINAL:
            self._active.discard(key)
            self._prune(entry.name)

    def _observe(self, run: dict[str, Any], task: dict[str, Any], job: Job | None, now: float) -> None:
        """The task's corral job as the run sees it; a task that has just ended decides what the run does next."""
        if job is None:
            task["status"], task["completed_at"] = "TASK_FAILED", now
        else:
            task["status"] = _TASK_STATUS[job.state]
            task["started_at"] = job.started_at
            task["completed_at"] = job.finished_at if job.state.final else None
            if job.state in (JobState.STARTING, JobState.RUNNING) or (job.state.final and job.started_at is not None):
                run["status"] = ACTIVE
        if task["status"] not in TASK_FINAL:
            return
        entry = self.entry(run["job"])
        assert entry is not None
        why = job.reason if job is not None else "its corral job is gone"
        if task["status"] == "TASK_FINISHED":
            self._finish(entry, run, SUCCESS, now, "")
            return
        if run["stop"]:
            self._finish(entry, run, FAILED, now, run["reason"] or "stopped")
            return
        run["attempt"] += 1
        if entry.source == "metronome":
            outcome = metronome.after_task(
                entry.definition.restart, "TASK_FAILED", instant(run["created_at"]), instant(now)
            )
            if outcome == "RELAUNCH":
                run["wait_until"] = now
                run["reason"] = f"task {task['job']} failed ({why}); relaunched (restart policy ON_FAILURE)"
            else:
                self._finish(entry, run, FAILED, now, f"task {task['job']} failed ({why})")
            return
        state = self.state(entry.name)
        result = chronos.on_failure(
            _stats(state), entry.definition.retry, run["attempt"] - 1, instant(now), self.chronos_defaults
        )
        if result.retry_at is not None:
            run["wait_until"] = epoch(result.retry_at)
            run["reason"] = (
                f"attempt {run['attempt']} failed ({why}); retry {run['attempt']} of {entry.definition.retry.retries} "
                f"at {result.retry_at.isoformat()}"
            )
        else:
            self._finish(entry, run, FAILED, now, f"attempt {run['attempt']} failed ({why})", result)

    def _submit(self, entry: Entry, run: dict[str, Any], now: float) -> None:
        try:
            spec = self.job_spec(entry, run)
            job = self.daemon.submit(spec)
        except InvalidRequest as exc:
            self._finish(entry, run, FAILED, now, f"could not submit: {exc.message}")
            return
        run["tasks"].append(self._task(job))
        run["wait_until"] = None

    @staticmethod
    def _task(job: Job) -> dict[str, Any]:
        return {"job": job.id, "status": _TASK_STATUS[job.state], "started_at": job.started_at, "completed_at": None}

    @staticmethod
    def _origin(entry: Entry, run: dict[str, Any]) -> str:
        return f"{entry.source}:{entry.name}:{run['id']}"

    def job_spec(self, entry: Entry, run: dict[str, Any]) -> JobSpec:
        """One task of a run as a corral job: the owner's identity, a plain environment with the definition's
        variables, no retries of its own, and a container runtime's `run` for a definition naming an image."""
        d = entry.definition
        command = d.command
        if run["arguments"] and entry.chronos is not None and not entry.chronos.shell:
            command = (*command, *run["arguments"])
        env, home = base_environment(entry.owner.uid, entry.owner.user)
        env.update(d.env)
        if d.image is not None:
            runtime = self.daemon.container_runtime
            if runtime is None:
                raise InvalidRequest("container_runtime", f"{d.name} names an image and no runtime is configured")
            command, extra = container_command(runtime, d.image.image, command, sorted(d.env))
            env.update(extra)
        return JobSpec(
            command=command,
            request=d.request,
            user=entry.owner.user,
            uid=entry.owner.uid,
            gid=entry.owner.gid,
            name=d.name,
            retries=0,
            time_limit_s=d.time_limit_s,
            env=env,
            cwd=home,
            origin=self._origin(entry, run),
        )

    def _finish(
        self,
        entry: Entry,
        run: dict[str, Any],
        status: str,
        now: float,
        reason: str,
        chronos_outcome: chronos.Outcome | None = None,
    ) -> None:
        """The run's outcome, counted once in the job's state (written before the run, so a restart in between
        finds it counted and does not count it again)."""
        run["status"], run["completed_at"], run["wait_until"] = status, now, None
        if reason:
            run["reason"] = reason
        state = copy.deepcopy(self.state(entry.name))
        if run["id"] not in state["counted"]:
            ok = status == SUCCESS
            fires = ok
            if entry.source == "chronos":
                outcome = chronos.on_success(_stats(state), instant(now)) if ok else chronos_outcome
                if outcome is None:  # stopped or never submitted: a final failure
                    outcome = chronos.on_failure(
                        _stats(state), entry.definition.retry, 1 << 30, instant(now), self.chronos_defaults
                    )
                _apply_stats(state, outcome.stats)
                fires = outcome.fire_children
            elif ok:
                state["success_count"] += 1
                state["last_success_at"] = now
            else:
                state["failure_count"] += 1
                state["last_failure_at"] = now
            state["latest"] = {"status": status, "finished_at": now}
            if fires:
                state["completions"] += 1
            listed = "successful_runs" if ok else "failed_runs"
            state[listed] = [*state[listed], {"id": run["id"], "createdAt": run["created_at"], "finishedAt": now}][
                -HISTORY_KEPT:
            ]
            state["counted"] = [*state["counted"], run["id"]][-COUNTED_KEPT:]
            self.book.put(STATE, entry.name, state)

    def _prune(self, name: str) -> None:
        finished = [r for r in self.runs(name) if r["status"] in FINAL]
        for old in finished[: max(0, len(finished) - HISTORY_KEPT)]:
            self.book.delete(RUN, run_key(name, old["id"]))

    # ------------------------------------------------------------------------------------------ triggers
    def _schedule(self, entry: Entry, now: float) -> None:
        if self._next_check.get(entry.name, -math.inf) > now or self._decisions_left <= 0:
            return  # not due; or due, and this round has made its decisions (see SCHEDULE_DECISIONS_PER_ROUND)
        state = self.state(entry.name)
        active = len(self.runs(entry.name, active_only=True, fresh=False))
        disabled = state["auto_disabled"]
        next_check = math.inf
        for rule, sched in entry.schedules:
            cursor = state["cursors"].get(rule.id, now)
            policy = rule.tick_policy()
            if disabled:
                policy = TickPolicy(policy.starting_deadline_s, policy.concurrency, False)
            decision = due_ticks(sched, instant(cursor), instant(now), policy, active_runs=active)
            if decision.next_tick is not None:
                next_check = min(next_check, epoch(decision.next_tick))
            if epoch(decision.cursor) == cursor and rule.id in state["cursors"]:
                continue
            changes: dict[str, Any] = {
                "cursors": {**state["cursors"], rule.id: epoch(decision.cursor)},
                "missed_ticks": state["missed_ticks"] + decision.missed,
                "forbidden_ticks": state["forbidden_ticks"] + (decision.skipped_by_forbid is not None),
            }
            self._decisions_left -= 1
            if decision.missed:
                log.info("job %s: %d tick(s) of schedule %s missed", entry.name, decision.missed, rule.id)
            if decision.run is not None:
                deadline = epoch(decision.run_deadline) if decision.run_deadline is not None else None
                self._trigger(entry, "schedule", now, changes, tick=epoch(decision.run), deadline=deadline)
                active += 1
            else:
                self.book.put(STATE, entry.name, {**copy.deepcopy(state), **changes})
            state = self.state(entry.name)
        self._next_check[entry.name] = next_check

    def _dependencies(self, entry: Entry, now: float) -> None:
        if any(r["trigger"] == "dependency" for r in self.runs(entry.name, active_only=True, fresh=False)):
            return  # one dependency-triggered run at a time
        state = self.state(entry.name)
        if entry.definition.disabled or state["auto_disabled"]:
            return
        parents = {p: self.book.get(STATE, p) for p in entry.parents}
        if any(s is None for s in parents.values()):
            return
        if entry.source == "metronome":
            latest: dict[str, tuple[str, datetime | None] | None] = {}
            for p, s in parents.items():
                assert s is not None
                last = s["latest"]
                latest[p] = None if last is None else (last["status"], instant(last["finished_at"]))
            last_start = state["last_dependency_start"]
            last_success = state["last_success_at"]
            if metronome.dependencies_met(
                latest,
                None if last_success is None else instant(last_success),
                None if last_start is None else instant(last_start),
            ):
                self._trigger(entry, "dependency", now, {"last_dependency_start": now})
            return
        consumed = state["consumed"]
        if all(s is not None and s["completions"] > consumed.get(p, 0) for p, s in parents.items()):
            self._trigger(entry, "dependency", now, {"consumed": {p: consumed.get(p, 0) + 1 for p in parents}})


def _same(a: ScheduleRule, b: ScheduleRule) -> bool:
    return (a.kind, a.expression, a.timezone) == (b.kind, b.expression, b.timezone) and (
        a.kind == "cron" or a.anchor == b.anchor
    )


def _stats(state: dict[str, Any]) -> chronos.JobStats:
    def when(v: float | None) -> datetime | None:
        return None if v is None else instant(v)

    return chronos.JobStats(
        success_count=state["success_count"],
        error_count=state["failure_count"],
        last_success=when(state["last_success_at"]),
        last_error=when(state["last_failure_at"]),
        errors_since_last_success=state["errors_since_last_success"],
        disabled=state["auto_disabled"],
    )


def _apply_stats(state: dict[str, Any], stats: chronos.JobStats) -> None:
    state["success_count"] = stats.success_count
    state["failure_count"] = stats.error_count
    state["last_success_at"] = None if stats.last_success is None else epoch(stats.last_success)
    state["last_failure_at"] = None if stats.last_error is None else epoch(stats.last_error)
    state["errors_since_last_success"] = stats.errors_since_last_success
    state["auto_disabled"] = stats.disabled
