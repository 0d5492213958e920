"""How the thin client words what the daemon answers: times, GPU grants, reasons, a job in full, an explanation.

Pure functions of the answer (and of the time now), so each is tested without a daemon, and cheap: only the
standard library, nothing of the engine (tests/cli/test_startup.py).

    gpus_text       [{index 0, milli 1000}, {index 1, ...}]  ->  "0,1"      a share: "0:300m/10GiB"
    held_text       the same  ->  "0 (GPU-5d3c...), 1 (GPU-...)"   a share: "0 (GPU-...): 300m of compute, 10GiB"
    ago             1795727531.4 (now + 7200)                  ->  "2h ago"   ("in 2h" for a time ahead)
    machine_words   "0/1 nodes fit: 1 insufficient GPU (need 1 whole GPU)"
                    ->  "does not fit on this machine: insufficient GPU (need 1 whole GPU)"

The engine writes its sentences for a cluster ("0/1213 nodes fit: ..."), and the daemon, the simulator and the
Kubernetes extender store or send them as they are (their tests hold them). `corral serve` is one machine, so where
the sentence is about one node the CLI says it the way one says it of one machine; about several nodes it stays.
"""

from __future__ import annotations

import functools
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

TYPE_CHECKING = False  # typing's, without importing typing: `corral ps`'s fast path draws with this module
if TYPE_CHECKING:
    from typing import Any

#: What a table shows of a reason: one line, this many characters at most (`show` and `explain` show it all).
REASON_CELLS = 60
TIME_FIELDS = ("submitted_at", "started_at", "finished_at", "created_at")


def mem_text(mib: int) -> str:
    """10240 -> "10GiB", 1536 -> "1536MiB" (as `--memory` and `--gpu-memory` read it back)."""
    return f"{mib // 1024}GiB" if mib and mib % 1024 == 0 else f"{mib}MiB"


def gpus_text(job: Mapping[str, Any]) -> str:
    """The GPUs a job holds: indices of whole GPUs ("0,1"); a share as INDEX:MILLIm/MEMORY ("0:300m/10GiB"); "-"."""
    parts = []
    for g in job.get("gpus") or ():
        milli, memory = int(g.get("milli", 1000)), int(g.get("memory_mib", 0))
        if milli >= 1000:
            parts.append(str(g["index"]))
            continue
        share = "/".join(p for p in (f"{milli}m" if milli else "", mem_text(memory) if memory else "") if p)
        parts.append(f"{g['index']}:{share or '0m'}")
    return ",".join(parts) or "-"


def held_text(job: Mapping[str, Any]) -> str:
    """`show`'s GPUs held: each GPU's index and UUID, and a share's compute and memory; a gang's instance by instance.

    "0 (GPU-5d3c...)", "1 (GPU-...): 300m of compute, 10GiB", "instance 0: 0 (...); instance 1: 1 (...)"; "-"."""
    grants = list(job.get("gpus") or ())
    if not grants:
        return "-"
    parts = []
    for g in grants:
        milli, memory = int(g.get("milli", 1000)), int(g.get("memory_mib", 0))
        text = f"{g['index']} ({g['uuid']})" if g.get("uuid") else str(g["index"])
        if milli < 1000:
            share = [f"{milli}m of compute" if milli else "", mem_text(memory) if memory else ""]
            text += ": " + ", ".join(p for p in share if p)
        parts.append(text)
    n = int(job.get("instances") or 1)
    if n > 1 and len(parts) % n == 0:
        k = len(parts) // n
        return "; ".join(f"instance {i}: " + ", ".join(parts[i * k : (i + 1) * k]) for i in range(n))
    return ", ".join(parts)


def duration_text(seconds: float) -> str:
    """45 -> "45s", 190 -> "3m", 7300 -> "2h", 200000 -> "2d" (one unit, rounded down, like `docker ps`)."""
    s = int(abs(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def exact_duration(seconds: float) -> str:
    """A time limit as given: 7200 -> "2h", 2700 -> "45m", 90 -> "90s"."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def ago(when: float | None, now: float) -> str:
    """A time relative to now: "3m ago", "in 2h", "now" within a second; "-" when there is none."""
    if when is None:
        return "-"
    delta = now - when
    if abs(delta) < 1:
        return "now"
    return f"{duration_text(delta)} ago" if delta > 0 else f"in {duration_text(delta)}"


def iso(when: float | None) -> str | None:
    """Seconds since the epoch as ISO 8601 in local time with its offset ("2026-11-26T21:15:03+00:00")."""
    if when is None:
        return None
    return datetime.fromtimestamp(when, UTC).astimezone().isoformat(timespec="seconds")


def iso_times(data: Any) -> Any:
    """A daemon answer (a job, a list of them) with its `*_at` times as ISO 8601, for `--json`."""
    if isinstance(data, list):
        return [iso_times(d) for d in data]
    if isinstance(data, dict):
        return {
            k: iso(v) if k in TIME_FIELDS and isinstance(v, int | float) and not isinstance(v, bool) else v
            for k, v in data.items()
        }
    return data


def command_text(argv: Sequence[str]) -> str:
    """The command as a shell would need it typed: `sh -c 'date >> f; sleep 8'`."""
    return shlex.join(argv)


# ---------------------------------------------------------------------------------------------------- reasons
_ONE_NODE_MISS = re.compile(r"^0/1 nodes fit: 1 (?P<why>.+)$", re.S)
_ONE_NODE_FIT = re.compile(r"^1/1 nodes fit; chose (?P<node>\S+)(?P<rest>.*)$", re.S)
_SCORE = re.compile(r"\((?P<policy>[\w.-]+) score (?P<score>[-+0-9.e]+)\)")
_NEVER = "can never run on this machine: "
NOT_NOW = "does not fit on this machine now: "

#: Sentences the engine writes for a cluster that say something else of one machine.
ONE_MACHINE = {
    "no node without free GPUs fit; placed on a GPU node, keeping the per-GPU reserve free": (
        "this job needs no GPU; it runs beside the free GPUs, leaving their per-GPU reserve of CPU and memory free"
    ),
}

#: The engine's reason names that are not words; what they mean, for people: of a cluster, of this machine, and in
#: a table's cell.
NAMED_REASONS = {
    "DeclinedScarceResources": (
        "declined: the job needs no GPU, and the GPU behaviour keeps nodes with free GPUs for GPU work "
        "(DeclinedScarceResources)",
        "the job needs no GPU, and the GPU behaviour keeps this machine for GPU work while it has a free GPU "
        "(DeclinedScarceResources)",
        "GPUs free: kept for GPU work (DeclinedScarceResources)",
    ),
}


def _named(text: str, *, form: int = 0) -> str:
    for name, words in NAMED_REASONS.items():
        text = re.sub(rf"(?<![\w(]){name}(?![\w)])", words[form], text)
    return text


#: Policies whose node score runs from 0 to 100, higher preferred (their modules' docstrings; fgd-scarcity adds a
#: tie-break below 1, topology binpack's score / 1000). The others' scores are said to be their own.
SCORES_OF_100 = frozenset(
    {"binpack", "spread", "bestfit", "dotprod", "fgd", "fgd-scarcity", "gpu-packing", "load", "topology"}
)


def _score_words(m: re.Match[str]) -> str:
    if m["policy"] in SCORES_OF_100:
        return f"({m['policy']} score {m['score']} of 100, higher preferred)"
    return f"({m['policy']} score {m['score']}, on that policy's own scale)"


def _scores(text: str) -> str:
    return _SCORE.sub(_score_words, text)


def engine_words(text: str) -> str:
    """An engine sentence about a cluster with its named reasons in words and its scores' direction said."""
    return _scores(_named(text))


def machine_words(reason: str, *, short: bool = False) -> str:
    """An engine sentence about one node, said of this machine; about several nodes, the cluster's words. Named
    reasons (DeclinedScarceResources) get words (`short`: a table cell's); a score says which way it counts."""
    if not reason:
        return reason
    prefix = ""
    if reason.startswith(_NEVER):
        prefix, reason = _NEVER, reason[len(_NEVER) :]
    if m := _ONE_NODE_MISS.match(reason):  # after "can never run on this machine: " the why alone
        named = m["why"] in NAMED_REASONS  # a sentence of its own already
        reason = m["why"] if prefix or named else NOT_NOW + m["why"]
    elif reason in ONE_MACHINE:
        reason = ONE_MACHINE[reason]
    elif m := _ONE_NODE_FIT.match(reason):
        rest = m["rest"]
        reason = f"fits this machine; chose{rest}" if rest.startswith(" GPU") else f"fits this machine{rest}"
    return prefix + _scores(_named(reason, form=2 if short else 1))


_PREEMPTED_BY = re.compile(r"preempted by (job \S+)")
BEING_PREEMPTED = "being preempted: "


def preempted_text(job: Mapping[str, Any], now: float) -> str:
    """A waiting job's preemption, for a table: "preempted by job 5 (3m ago)", "preempted 2x, last by job 5 (...)"."""
    p = job.get("preempted")
    if not isinstance(p, Mapping):
        return ""
    m = _PREEMPTED_BY.search(str(p.get("reason", "")))
    count = int(p.get("count") or 1)
    by = f" by {m[1]}" if m else ""
    head = "preempted" + by if count == 1 else f"preempted {count}x, last{by or ' time'}"
    at = p.get("at")
    return head + (f" ({ago(at, now)})" if isinstance(at, int | float) else "")


def short_reason(job: Mapping[str, Any], now: float | None = None) -> str:
    """A table's REASON: why a queued job waits (after its preemption, if it was preempted: by whom, when), how an
    ended one ended; one line, cut to REASON_CELLS characters. A running job's note on where it was placed is for
    `show` and `explain`; one being preempted says so."""
    reason = str(job.get("reason") or "")
    if job.get("state") in ("running", "starting"):
        if reason.startswith(("ending", "cancel requested")):  # being stopped: held until nothing of it runs
            return _cell(reason.split(": its ")[0] if reason.startswith("ending: past") else reason)
        if not reason.startswith(BEING_PREEMPTED):
            return "-"
        m = _PREEMPTED_BY.search(reason)
        text = "being preempted" + (f" by {m[1]}" if m else "")
    else:
        # a queued job's state already says it waits: the table keeps the words on why
        text = _short_words(reason)
        if job.get("state") == "queued" and (before := preempted_text(job, time.time() if now is None else now)):
            if text.startswith("preempted by"):  # just stopped: its reason tells the preemption until the next round
                text = "queued again"
            return f"{before}; {_cell(text) if text else 'waits for its turn'}"  # the cell's width for the why
    return _cell(text)


@functools.lru_cache(maxsize=256)
def _short_words(reason: str) -> str:
    """A waiting or ended job's reason in a table's words: remembered, as the jobs of a long queue mostly share one."""
    return machine_words(reason, short=True).strip().removeprefix(NOT_NOW)


def _cell(text: str) -> str:
    if not text:
        return "-"
    first = text.splitlines()[0]
    cut = first if len(first) <= REASON_CELLS else first[: REASON_CELLS - 1].rstrip() + "…"
    return cut + ("…" if cut is first and len(text.splitlines()) > 1 else "")


def explain_text(job_id: str, data: Mapping[str, Any]) -> list[str]:
    """`corral explain`: a sentence for the state, then every further part of the answer, one line each."""
    state, reason = str(data.get("state", "")), machine_words(str(data.get("reason") or "")).strip()
    lines: list[str]
    if state == "queued":
        lines = [f"job {job_id} is waiting: {reason}" if reason else f"job {job_id} is waiting for its turn"]
    elif state in ("starting", "running"):
        lines = [f"job {job_id} is {state}" + (f" ({reason})" if reason else "")]
    elif state == "succeeded":
        lines = [f"job {job_id} succeeded" + (f" ({reason})" if reason else "")]
    elif state == "failed":
        lines = [f"job {job_id} failed: {reason or 'no reason recorded'}"]
    elif state == "cancelled":
        by = "" if reason in ("", "cancelled") else f": {reason}"
        lines = [f"job {job_id} was cancelled{by}"]
    elif state == "lost":
        lines = [f"job {job_id} was lost: {reason or 'its outcome is unknown'}"]
    else:  # a newer daemon's state
        lines = [f"job {job_id} is {state}" + (f": {reason}" if reason else "")]
    # A waiting job's place in the queue, who holds what it waits for and its reservation come twice: as fields (for
    # --json and programs) and as the daemon's sentences in `story`, which are what a person reads: one a line.
    lines += [sentence for sentence in _SENTENCE_END.split(str(data.get("story") or "").strip()) if sentence]
    now = time.time()
    for key, value in data.items():
        if key in _SAID or value in (None, "", [], {}):
            continue
        lines.append(f"{key.replace('_', ' ')}: {_value_text(key, value, now)}")
    return lines


#: Parts of an explain answer the lines above already say (the rest, a newer daemon's, are printed one a line).
_SAID = frozenset({"state", "reason", "story", "position", "queued", "holders", "reservation", "estimated_start",
                   "default_time_limit_s", "preempted", "queue", "queue_position", "queue_queued", "ahead",
                   "limit", "gpus", "started_at", "time_limit_s", "ends_at", "preemptible_now",
                   "may_be_preempted_by", "may_preempt"})  # fmt: skip
_SENTENCE_END = re.compile(r"(?<=\.) +(?=[A-Z])")


def _value_text(key: str, value: Any, now: float) -> str:
    """A further part of an answer in words: lists joined, mappings as "key value", a time (`*_at`) relative."""
    if isinstance(value, list):
        return ", ".join(_value_text(key, v, now) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k.replace('_', ' ')} {_value_text(k, v, now)}" for k, v in value.items() if v is not None)
    if key.endswith("_at") and isinstance(value, int | float) and not isinstance(value, bool):
        return ago(value, now)
    if isinstance(value, str):
        return machine_words(value)
    return str(value)


# ------------------------------------------------------------------------------------------------- errors
#: The daemon's names for what `corral submit`, `ps` and `cancel` send, and the flags a user typed them with.
FLAGS = {
    "gpus": "--gpus", "gpu_count": "--gpus", "gpu_fraction": "--gpu-fraction", "gpu_milli": "--gpu-fraction",
    "gpu_memory": "--gpu-memory", "gpu_memory_mib": "--gpu-memory", "min_gpu_memory_mib": "--gpu-memory",
    "cpus": "--cpus", "cpu_milli": "--cpus", "memory": "--memory", "memory_mib": "--memory",
    "gpu_model": "--gpu-model", "gpu_models": "--gpu-model", "time_limit": "--time-limit",
    "time_limit_s": "--time-limit", "priority": "--priority", "name": "--name", "retries": "--retries",
    "instances": "--instances", "gang": "--gang",
    "command": "COMMAND", "state": "--state", "user": "--user", "since": "--since", "limit": "--limit",
    "after": "--after", "request": "", "queue": "--queue", "instance": "--instance", "dependency": "--dependency",
    "kill_on_invalid_dep": "--kill-on-invalid-dep", "output": "--output", "error": "--error", "script": "script",
    "array": "--array",
}  # fmt: skip


def flag_error(field: str, message: str, flags: Mapping[str, str] | None = FLAGS) -> str:
    """An error answer's (field, message) as a line: the field as the flag that set it where known ("--gpu-memory:
    ..."), none for the request as a whole; the engine's sentence in one machine's words."""
    name = field if flags is None else flags.get(field, field)
    message = machine_words(message)
    return f"{name}: {message}" if name else message


# ------------------------------------------------------------------------------------------------ one job
def show_lines(job: Mapping[str, Any], now: float | None = None) -> list[tuple[str, str]]:
    """`corral show`: (label, text) pairs, every request field included, times absolute and relative."""
    now = time.time() if now is None else now

    def when(key: str) -> str:
        t = job.get(key)
        return "-" if t is None else f"{iso(t)} ({ago(t, now)})"

    req: Mapping[str, Any] = job.get("request") or {}
    lines = [
        ("id", str(job.get("id", ""))),
        ("name", job.get("name") or "-"),
        ("user", str(job.get("user", ""))),
        ("state", str(job.get("state", ""))),
        ("command", command_text(job.get("command") or [])),
        ("reason", machine_words(str(job.get("reason") or "")) or "-"),
        ("submitted", when("submitted_at")),
        ("started", when("started_at")),
        ("finished", when("finished_at")),
    ]
    if job.get("started_at") is not None:
        end = job.get("finished_at") or now
        lines.append(("ran for", duration_text(end - job["started_at"])))
    exit_code = job.get("exit_code")
    lines += [
        ("exit code", "-" if exit_code is None else str(exit_code)),
        ("attempts", str(job.get("attempts", 0)) + (f" (retries allowed: {req['retries']})" if req else "")),
        ("gpus held", held_text(job)),
    ]
    if req:
        gpu_ask = "-"
        if req.get("gpu_count"):
            n = req["gpu_count"]
            if req.get("gpu_milli", 0) >= 1000:
                gpu_ask = f"{n} whole"
            else:
                share = " and ".join(
                    p for p in (
                        f"{req['gpu_milli'] / 10:g} % of each" if req.get("gpu_milli") else "",
                        f"{mem_text(req['gpu_memory_mib'])} each" if req.get("gpu_memory_mib") else "",
                    ) if p
                )  # fmt: skip
                gpu_ask = f"{n} share{'s' if n > 1 else ''}: {share}"
        limit = req.get("time_limit_s")
        lines += [
            ("cpus", f"{req['cpu_milli'] / 1000:g}"),
            ("memory", mem_text(req["memory_mib"])),
            ("gpus", gpu_ask),
            ("gpu memory", mem_text(req["gpu_memory_mib"]) if req.get("gpu_memory_mib") else "-"),
            ("gpu models", ", ".join(req["gpu_models"]) if req.get("gpu_models") else "any"),
            ("time limit", "-" if limit is None else exact_duration(limit)),
            ("cwd", str(req.get("cwd", ""))),
            ("env", f"{req.get('env_count', 0)} variables"),
        ]
    preempted = job.get("preempted")
    if preempted:
        times = "once" if preempted.get("count") == 1 else f"{preempted.get('count')} times"
        lines.append(("preempted", f"{times}; the last: {preempted.get('reason', '')}"))
    if job.get("dependency"):
        kill = " (cancelled if it can never be met)" if job.get("kill_on_invalid_dep") else ""
        lines.append(("dependency", f"{job['dependency']}{kill}"))
    if job.get("array_job_id"):
        array_id, task = job["array_job_id"], job.get("array_task_id")
        counts = job.get("array_tasks")
        if counts:  # the array as a whole (`corral show ID` of an array): these lines are its first task's
            from corral.jobs.array import tasks_text  # only for an array: 4 ms of import the CLI's start need not pay

            lines.append(("array", f"{array_id} (--array {job.get('array')}): {tasks_text(counts)}"))
            lines.append(("", f"the fields above are task {array_id}_{task}'s; each task: corral show {array_id}_TASK"))
        else:
            lines.append(("array", f"task {array_id}_{task} of array {array_id} (--array {job.get('array')})"))
    if (job.get("instances") or 1) > 1:
        lines.append(("instances", f"{job['instances']}" + (" (a gang: all or none)" if job.get("gang") else "")))
    lines += [
        ("preemptible", "no" if job.get("preemptible") is False else "yes"),
        ("priority", str(job.get("priority", 0))),
        ("log", job.get("log_path") or "-"),
        ("origin", job.get("origin") or "-"),
    ]
    script = job.get("script")
    if script:  # a batch script (docs/batch-scripts.md): its stored text is what each attempt runs
        lines.append(
            (
                "script",
                f"{script.get('name', '')} ({script.get('dialect', '')} directives; "
                f"{script.get('bytes', 0)} bytes stored: corral show --script {job.get('id', '')})",
            )
        )
    for label in ("output", "error"):
        if job.get(label):
            lines.append((label, str(job[label])))
    if job.get("held_by"):
        lines.append(("held", f"by {job['held_by']} (corral release {job.get('id', '')})"))
    for k, change in enumerate(job.get("history") or ()):
        lines.append(("history" if k == 0 else "", change_text(change)))
    return lines


def array_rows(jobs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`corral ps`'s rows: a job array's tasks folded into one row, where its first task stood (unless --expand):
    id "12_[0-99%8]", state its tasks by state ("92 queued, 8 running"), the GPUs its tasks hold, the reason of its
    first waiting task (else its first task's), ended when its last task ended. Other jobs as they are."""
    rows: list[dict[str, Any]] = []
    groups: dict[str, dict[str, Any]] = {}
    if not any(job.get("array_job_id") for job in jobs):
        return [dict(job) for job in jobs]
    from corral.jobs.array import STATE_ORDER  # only when arrays are listed: 4 ms of import the CLI need not pay

    for job in jobs:
        array_id = job.get("array_job_id")
        if not array_id:
            rows.append(dict(job))
            continue
        row = groups.get(array_id)
        if row is None:
            row = groups[array_id] = {**job, "id": f"{array_id}_[{job.get('array') or ''}]", "gpus": [], "counts": {}}
            row["reason_from"] = None
            rows.append(row)
        state = str(job.get("state", ""))
        row["counts"][state] = row["counts"].get(state, 0) + 1
        row["gpus"] = [*row["gpus"], *(job.get("gpus") or ())]
        if state == "queued" and row["reason_from"] != "queued":
            row["reason"], row["reason_from"] = job.get("reason"), "queued"
        row["finished_at"] = max((t for t in (row.get("finished_at"), job.get("finished_at")) if t), default=None)
        row["submitted_at"] = min(float(row["submitted_at"]), float(job.get("submitted_at") or row["submitted_at"]))
    for row in groups.values():
        counts = row["counts"]
        order = [st for st in STATE_ORDER if counts.get(st)] + sorted(st for st in counts if st not in STATE_ORDER)
        row["state"] = ", ".join(f"{counts[st]} {st}" for st in order)
        row["ended"] = all(st in ("succeeded", "failed", "cancelled", "lost") for st in counts)
    return rows


def change_text(change: Mapping[str, Any]) -> str:
    """One entry of a job's history: "2026-11-28 12:50:00 priority 0 -> 5 by alice", "... held by root"."""
    at, by, name = iso(float(change.get("at", 0))), str(change.get("by", "")), str(change.get("field", ""))
    old, new = str(change.get("old", "")), str(change.get("new", ""))
    if name == "held":
        return f"{at} {'held' if new == 'yes' else 'released'} by {by}"
    if name == "time_limit_s":
        name = "time limit"
        old, new = (exact_duration(float(v)) if v else "none" for v in (old, new))
    return f"{at} {name}: {old or '-'} -> {new or '-'} by {by}"
