"""Job arrays, in Slurm's words: `--array 0-99%8`, `1,3,5-7`, `0-99:2`; tasks addressed as `ID_TASK`.

    parse("0-99:2%8")   -> ArraySpec(tasks=(0, 2, ..., 98), throttle=8, step=2, text="0-99:2%8")
    one submission      -> N jobs with consecutive ids A, A+1, ... A+N-1, one per task, in task order;
                           the array's id is A (its first task's), as Slurm's SLURM_ARRAY_JOB_ID
    parse_ref("12_7")   -> Ref("12", (7,));  "12_[1-5,9]" -> Ref("12", (1, 2, 3, 4, 5, 9));  "12" -> Ref("12", None)
    task_job_id(head, 7) -> "A + index of task 7": no look-up, the ids are consecutive

Each task is an ordinary job (its own id, state, log, retries): the scheduler, the store and every listing treat it
as one. What makes it a task is `JobSpec.array` (an `ArrayTask`: the array's id, the task's id, and the array's
shared `ArraySpec`). The store keeps the submitted spec once per array and a few bytes per task
(corral.store.sqlite: `arrays` table, stub specs), so a submission of 10,000 tasks writes one spec, not 10,000.

`%N` throttles the tasks running at once (`throttle`, pure: the round offers at most N - running tasks of such an
array to the scheduler). Pure: no store, no clock.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from corral.model.errors import InvalidRequest

if TYPE_CHECKING:
    from corral.jobs.model import Job, JobSpec

FIELD = "array"
#: Most tasks one array may have. Slurm's MaxArraySize defaults to 1001 (task ids 0..1000), too small for sweeps.
#: 10,000 tasks are acknowledged in under half a second (BENCHMARKS.md); 100,000 in about 2.5 s on the 2-core
#: development machine, and while they wait each round costs what 100,000 single jobs cost (about 2.7 s there).
MAX_ARRAY_TASKS = 100_000
#: Highest task id (Slurm's ceiling for MaxArraySize is 4,000,001: task ids 0..4,000,000).
MAX_TASK_ID = 4_000_000
#: Longest `--array` text (a list of single ids is the longest legitimate form).
MAX_ARRAY_TEXT = 64 * 1024

_RANGE = re.compile(r"(\d{1,10})(?:-(\d{1,10})(?::(\d{1,10}))?)?")
FORMS = "give 0-99, 1,3,5-7, 0-99:2 (a step), with %N to run at most N at once"


@dataclass(frozen=True)
class ArraySpec:
    """An array's tasks, sorted and without repeats; `throttle`: at most this many running at once (0: no limit)."""

    text: str  # canonical: what was given, without spaces ("0-99:2%8"); it alone decides the rest
    tasks: tuple[int, ...] = field(repr=False, compare=False)  # up to 100,000: never compared, hashed or printed
    throttle: int = field(default=0, compare=False)
    step: int = field(default=1, compare=False)  # Slurm's SLURM_ARRAY_TASK_STEP: a single range's step, else 1

    @property
    def count(self) -> int:
        return len(self.tasks)

    @property
    def first(self) -> int:
        return self.tasks[0]

    @property
    def last(self) -> int:
        return self.tasks[-1]

    def index(self, task: int) -> int | None:
        """Position of `task` among the tasks (its job id is the array's id + this), None when not one of them."""
        i = bisect.bisect_left(self.tasks, task)
        return i if i < len(self.tasks) and self.tasks[i] == task else None


@dataclass(frozen=True)
class ArrayTask:
    """One task of an array: the array's job id ("" before it is stored), the task id, and the array's spec."""

    job_id: str
    task: int
    spec: ArraySpec

    @property
    def head(self) -> bool:
        """The first task, whose job id is the array's id."""
        return self.task == self.spec.first


def _int(text: str, what: str) -> int:
    value = int(text)
    if value > MAX_TASK_ID:
        raise InvalidRequest(FIELD, f"{what} {value} is above the highest task id, {MAX_TASK_ID:,}")
    return value


@functools.lru_cache(maxsize=256)
def parse(text: str) -> ArraySpec:
    """`--array` text; InvalidRequest naming `array` and what is wrong. Cached: every task of an array shares one."""
    if len(text) > MAX_ARRAY_TEXT:
        raise InvalidRequest(FIELD, f"at most {MAX_ARRAY_TEXT} characters, got {len(text)}")
    compact = "".join(text.split())
    if not compact:
        raise InvalidRequest(FIELD, f"empty: {FORMS}")
    body, percent, limit = compact.partition("%")
    throttle = 0
    if percent:
        if not limit.isdigit() or not limit.isascii():
            raise InvalidRequest(FIELD, f"%{limit[:20]}: after % give how many tasks may run at once (a number)")
        throttle = int(limit[:12])
        if not 1 <= throttle <= MAX_ARRAY_TASKS:
            raise InvalidRequest(FIELD, f"%{throttle}: at most 1..{MAX_ARRAY_TASKS:,} tasks at once")
    ranges: list[tuple[int, int, int]] = []
    count = 0
    for part in body.split(","):
        m = _RANGE.fullmatch(part)
        if m is None or not part.isascii():
            raise InvalidRequest(FIELD, f"{part[:40]!r} is not a task id or range: {FORMS}")
        start = _int(m.group(1), "task id")
        stop = _int(m.group(2), "task id") if m.group(2) is not None else start
        step = int(m.group(3)) if m.group(3) is not None else 1
        if stop < start:
            raise InvalidRequest(FIELD, f"{part}: the range ends before it starts")
        if not 1 <= step <= MAX_TASK_ID:
            raise InvalidRequest(FIELD, f"{part}: the step must be 1..{MAX_TASK_ID:,}")
        count += (stop - start) // step + 1
        if count > MAX_ARRAY_TASKS:  # counted before any list is made: 0-999999999 costs nothing to refuse
            raise InvalidRequest(
                FIELD, f"{compact[:60]} has more than {MAX_ARRAY_TASKS:,} tasks (at most {MAX_ARRAY_TASKS:,} an array)"
            )
        ranges.append((start, stop, step))
    tasks = tuple(sorted({t for start, stop, step in ranges for t in range(start, stop + 1, step)}))
    return ArraySpec(compact, tasks, throttle, ranges[0][2] if len(ranges) == 1 else 1)


def task_spec(template: JobSpec, job_id: str, task: int) -> JobSpec:
    """`template` (an array's spec, checked already) as task `task` of array `job_id`: a copy of its fields with
    another `array`, without `dataclasses.replace`'s checks, which cost 11 us a task (110 ms for 10,000)."""
    a = template.array
    assert a is not None
    new = object.__new__(type(template))
    new.__dict__.update(template.__dict__)
    object.__setattr__(new, "array", ArrayTask(job_id, task, a.spec))
    return new


# ---------------------------------------------------------------------------------------------- addressing
@dataclass(frozen=True)
class Ref:
    """What `ID`, `ID_7` or `ID_[1-5,9]` names: a job id, and the tasks (None: the job, or the whole array)."""

    job_id: str
    tasks: tuple[int, ...] | None = None
    text: str = ""

    @property
    def is_range(self) -> bool:
        return self.tasks is not None and self.text.endswith("]")


_REF = re.compile(r"([1-9][0-9]{0,17})(?:_(\d{1,10}|\[[0-9,:\-]{1,4096}\]))?")


def parse_ref(text: str, field: str = "job") -> Ref:
    """`ID`, `ID_TASK` or `ID_[RANGES]` (ranges as --array takes them, without %); InvalidRequest naming `field`."""
    m = _REF.fullmatch(text.strip()) if text.isascii() else None
    if m is None:
        raise InvalidRequest(field, f"{text[:40]!r} is not a job id (12), a task (12_7) or a range of tasks (12_[1-5])")
    if m.group(2) is None:
        return Ref(m.group(1), None, text.strip())
    tail = m.group(2)
    if tail.startswith("["):
        try:
            tasks = parse(tail[1:-1]).tasks
        except InvalidRequest as exc:
            raise InvalidRequest(field, f"{text[:40]}: {exc.message}") from None
        return Ref(m.group(1), tasks, text.strip())
    return Ref(m.group(1), (int(tail),), text.strip())


def task_job_id(head: JobSpec, array_id: str, task: int) -> str | None:
    """The job id of task `task` of the array whose first task's spec is `head`; None when it has no such task."""
    a = head.array
    if a is None or a.job_id != array_id:
        return None
    i = a.spec.index(task)
    return None if i is None else str(int(array_id) + i)


def task_ids(head: JobSpec, array_id: str) -> list[str]:
    """Every task's job id, in task order."""
    a = head.array
    return [] if a is None else [str(int(array_id) + i) for i in range(a.spec.count)]


def ids_of(job: Job | JobSpec | Mapping[str, Any]) -> tuple[str | None, int | None]:
    """(the array's job id, the task id) of a job that is an array's task, else (None, None): what Slurm's %A and %a
    output patterns stand for (the batch scripts' `--output`). Takes a Job, a JobSpec or an API answer (JobOut)."""
    if isinstance(job, Mapping):
        array_id, task = job.get("array_job_id"), job.get("array_task_id")
        return (str(array_id), int(task)) if array_id and task is not None else (None, None)
    spec = getattr(job, "spec", job)
    a = getattr(spec, "array", None)
    return (a.job_id, a.task) if a is not None and a.job_id else (None, None)


def task_name(job: Job) -> str:
    """A job as `ps --expand` and the logs show it: "12_7" for a task, its id otherwise."""
    a = job.spec.array
    return f"{a.job_id}_{a.task}" if a is not None and a.job_id else job.id


#: The order states are counted in, for an array's tasks.
STATE_ORDER = ("queued", "starting", "running", "succeeded", "failed", "cancelled", "lost")


def tasks_text(counts: Mapping[str, int]) -> str:
    """Tasks by state: "100 tasks: 92 queued, 8 running" (states in life order; others after)."""
    total = sum(counts.values())
    order = [s for s in STATE_ORDER if counts.get(s)] + sorted(s for s in counts if s not in STATE_ORDER and counts[s])
    parts = ", ".join(f"{counts[s]} {s}" for s in order)
    return f"{total} task{'s' if total != 1 else ''}" + (f": {parts}" if parts else "")


# ---------------------------------------------------------------------------------------------- environment
def _dialect(spec: JobSpec) -> str:
    """The batch script's dialect ("sbatch", "corral"), "" when the job came from no script (corral.cli batch)."""
    script: Any = getattr(spec, "script", None) or {}
    if isinstance(script, Mapping):
        return str(script.get("dialect") or "")
    return str(getattr(script, "dialect", "") or "")


def environment(spec: JobSpec) -> dict[str, str]:
    """The variables a task gets: CORRAL_ARRAY_JOB_ID, CORRAL_ARRAY_TASK_ID, ..._COUNT/_MIN/_MAX/_STEP, and Slurm's
    SLURM_ARRAY_* of the same values when it came from an #SBATCH script (so such scripts run unchanged)."""
    a = spec.array
    if a is None or not a.job_id:
        return {}
    values = {
        "JOB_ID": a.job_id,
        "TASK_ID": str(a.task),
        "TASK_COUNT": str(a.spec.count),
        "TASK_MIN": str(a.spec.first),
        "TASK_MAX": str(a.spec.last),
        "TASK_STEP": str(a.spec.step),
    }
    env = {f"CORRAL_ARRAY_{k}": v for k, v in values.items()}
    if _dialect(spec) == "sbatch":
        env.update({f"SLURM_ARRAY_{k}": v for k, v in values.items()})
    return env


# ---------------------------------------------------------------------------------------------- the round
def throttle_reason(array_id: str, limit: int, running: int) -> str:
    return (
        f"waiting for its array's throttle: array {array_id} runs at most {limit} task{'s' if limit > 1 else ''} at "
        f"once (%{limit}), {running} running"
    )


def throttle_story(array_id: str, limit: int, running: int) -> str:
    """What `explain` says of a task its array's throttle holds back."""
    return (
        f"It waits for its array's throttle: at most {limit} of its tasks run at once, and {running} "
        f"{'runs' if running == 1 else 'run'} (corral ps --array {array_id})."
    )


def throttle(waiting: Sequence[Job], holding: Iterable[Job]) -> tuple[list[Job], dict[str, str]]:
    """(the waiting jobs offered to the scheduler, {id: reason} of the tasks held back by their array's `%N`).

    Of an array with `%N` and R tasks starting or running, only its first N - R waiting tasks (oldest first) are
    offered, so however many the scheduler starts in a round, the array never runs more than N. One pass; arrays
    without a throttle, and single jobs, pass through untouched."""
    if not any(j.spec.array is not None and j.spec.array.spec.throttle for j in waiting):
        return list(waiting), {}
    running: dict[str, int] = {}
    for j in holding:
        a = j.spec.array
        if a is not None and a.spec.throttle:
            running[a.job_id] = running.get(a.job_id, 0) + 1
    room: dict[str, int] = {}
    offered: list[Job] = []
    held: dict[str, str] = {}
    for j in waiting:
        a = j.spec.array
        if a is None or not a.spec.throttle:
            offered.append(j)
            continue
        left = room.get(a.job_id)
        if left is None:
            left = a.spec.throttle - running.get(a.job_id, 0)
        if left > 0:
            offered.append(j)
            room[a.job_id] = left - 1
        else:
            room[a.job_id] = 0
            held[j.id] = throttle_reason(a.job_id, a.spec.throttle, running.get(a.job_id, 0))
    return offered, held
