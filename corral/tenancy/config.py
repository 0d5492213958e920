"""Queues from a TOML file: guarantees, limits, borrowing, weights and priority bounds, validated as a whole.

    half_life = "7d"                 # fair share: usage decays by half in this time (default 7d)
    min_runtime = "5m"               # a job runs this long before it may be preempted (again); default 5m
    default_queue = "default"        # jobs that name no queue (default: "default"; created if not listed)
    admins = ["ann"]                 # may exceed priority bounds, submit anywhere, reload (root always may)
    admin_groups = ["ops"]

    [queues.train]
    weight = 2                       # fair share (default 1)
    max_priority = 50                # bound for users (default: none beyond the API's -100..100)
    min_runtime = "10m"              # this queue's jobs: protected from preemption for their first 10 minutes
    submitters = ["ann", "@ml"]      # who may submit (a name, or @group); default: everyone
    guarantee = { gpus = 2 }         # deserved: kept for it while it has work (others borrow it only when idle)
    limit = { gpus = 4, memory = "256GiB" }       # at most this much at once
    borrow_limit = { gpus = 1 }      # at most this much above its guarantee (default: up to its limit)
    namespaces = ["ml-train"]        # corral k8s scheduler: pods of these namespaces (that name no queue by label)
    [queues.train.users.ann]         # per user in this queue ("*": every user)
    limit = { gpus = 2 }
    weight = 2
    max_priority = 10
    [queues.train.groups.ml]         # per Unix group in this queue (a job counts for each group its user is in)
    limit = { gpus = 3 }
    [users.bob]                      # per user across all queues ("*": every user)
    limit = { gpu_milli = 2500 }
    [groups.interns]                 # per group across all queues
    limit = { gpus = 1 }

Amounts: `gpus` (GPUs, a share counted by its part: 0.5 + 0.3 + 1 = 1.8; fractions such as 1.5 are allowed),
`gpu_milli` (1000 = one GPU), `gpu_memory` ("40GiB"), `cpus` (16, "500m"), `memory` ("64GiB"), as `corral submit`'s
flags. A gang counts every instance: 3 instances of 1 GPU ask for 3 GPUs. Every error names the file, the key and the
rule: unknown keys, negative, NaN or huge numbers, a guarantee above its limit. Guarantees that sum above the
machine are refused when the machine is known (`validate_against_machine`): a guarantee that cannot be honoured is
a promise the scheduler cannot keep.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.model.errors import CorralError, InvalidRequest
from corral.model.resources import MAX_PRIORITY, MAX_QUANTITY, MILLI_PER_GPU
from corral.model.units import parse_cpu_milli, parse_duration_seconds, parse_memory_mib

#: The dimensions of a quota, in this order in every vector (`Amounts.vector`).
DIMENSIONS = ("gpus", "gpu_milli", "gpu_memory", "cpus", "memory")
#: How each dimension reads in a message (the unit of the vector's base value). `gpus` is held in milli, as
#: `gpu_milli`: a share counts by its part (issue 23: a 0.5 share is half a GPU of a `gpus` limit, not a whole one).
NAMES = {"gpus": "GPU milli", "gpu_milli": "GPU milli", "gpu_memory": "MiB of GPU memory", "cpus": "CPU milli",
         "memory": "MiB of memory"}  # fmt: skip
DEFAULT_HALF_LIFE_S = 7 * 86400.0
#: How long a job runs before it may be preempted (again), without a queues file or a `min_runtime` in it. Five
#: minutes: preemption then costs a victim at most one restart per five minutes however often a higher-priority job
#: is submitted and cancelled (issue 23: 7 preemptions in 60 s), and a high-priority job waits at most that long
#: for a victim; Slurm's PreemptExemptTime and Kueue users set minutes for the same reason (a job's warm-up).
DEFAULT_MIN_RUNTIME_S = 300.0
#: The most a `min_runtime` may be: a day (longer would make preemption all but off; say preemptible = false then).
MAX_MIN_RUNTIME_S = 86400.0
DEFAULT_QUEUE = "default"
MAX_WEIGHT = 1e6
_MAX = {
    "gpus": MAX_QUANTITY["gpu_count"] * 1024 * MILLI_PER_GPU,
    "gpu_milli": MAX_QUANTITY["gpu_count"] * 1024 * MILLI_PER_GPU,
    "gpu_memory": MAX_QUANTITY["memory_mib"],
    "cpus": MAX_QUANTITY["cpu_milli"],
    "memory": MAX_QUANTITY["memory_mib"],
}
Vector = tuple[int, int, int, int, int]

# Bounds of a queues file (docs/queues.md "Bounds"), each far above any real file and checked before the file is
# parsed, or before its parts are read: a hostile file is refused in milliseconds, never a RecursionError (issue 23:
# 100,000 nested arrays answered 500) nor seconds under the daemon's lock (200,000 tables took over 15 s).
#: The most bytes a queues file may have (read no further).
MAX_FILE_BYTES = 1024 * 1024
#: The deepest nesting: arrays and inline tables inside each other, and the parts of one dotted key or table name.
MAX_DEPTH = 16
#: The most tables ([headers] and { inline tables }) in one file.
MAX_TABLES = 50_000
#: The most queues in one file.
MAX_QUEUES = 1_000
#: The most user and group entries in one file, all queues and the file's top level together; also the most names in
#: one list (submitters, admins, admin_groups).
MAX_PRINCIPALS = 10_000


class QueueConfigError(CorralError):
    """The queues file is not valid; the message names the file, the key and the problem."""


@dataclass(frozen=True)
class Amounts:
    """A quota: per dimension a bound in base units (GPU milli, GPU milli, MiB, CPU milli, MiB), None = unbounded.
    `gpus` and `gpu_milli` are one measure (a share counts by its part) written two ways in the file."""

    gpus: int | None = None
    gpu_milli: int | None = None
    gpu_memory: int | None = None
    cpus: int | None = None
    memory: int | None = None

    def values(self) -> tuple[int | None, ...]:
        return (self.gpus, self.gpu_milli, self.gpu_memory, self.cpus, self.memory)

    def vector(self, unset: int = 0) -> Vector:
        v = [unset if x is None else x for x in self.values()]
        return (v[0], v[1], v[2], v[3], v[4])

    @property
    def empty(self) -> bool:
        return all(x is None for x in self.values())

    def as_dict(self) -> dict[str, int | float]:
        """As the file writes it: `gpus` in GPUs (1.5), the rest in base units."""
        return {k: vector_value(k, v) for k, v in zip(DIMENSIONS, self.values(), strict=True) if v is not None}


def vector_value(dim: str, value: int) -> int | float:
    """A base-unit value as the API shows it: `gpus` in GPUs (an int when whole: 2, else 1.8), the rest unchanged."""
    if dim != "gpus":
        return value
    return value // MILLI_PER_GPU if value % MILLI_PER_GPU == 0 else round(value / MILLI_PER_GPU, 3)


@dataclass(frozen=True)
class Principal:
    """A user's or group's rules (in a queue, or across all queues)."""

    limit: Amounts = Amounts()
    weight: float = 1.0
    max_priority: int | None = None


@dataclass(frozen=True)
class QueueSpec:
    name: str
    weight: float = 1.0
    guarantee: Amounts = Amounts()
    limit: Amounts = Amounts()
    borrow_limit: Amounts = Amounts()  # above the guarantee; unset: up to the limit
    max_priority: int | None = None
    submitters: tuple[str, ...] | None = None  # None: everyone; names, "@group" for a Unix group
    min_runtime_s: float | None = None  # None: the file's `min_runtime` (QueuesConfig.min_runtime_s)
    users: Mapping[str, Principal] = field(default_factory=dict)
    groups: Mapping[str, Principal] = field(default_factory=dict)
    #: Kubernetes namespaces whose pods go to this queue when they name none by label (`corral k8s scheduler` only;
    #: serve reads and ignores it, so one file serves both).
    namespaces: tuple[str, ...] = ()

    def user(self, name: str) -> Principal | None:
        return self.users.get(name) or self.users.get("*")


@dataclass(frozen=True)
class QueuesConfig:
    queues: Mapping[str, QueueSpec]
    default_queue: str = DEFAULT_QUEUE
    half_life_s: float = DEFAULT_HALF_LIFE_S
    admins: frozenset[str] = frozenset()
    admin_groups: frozenset[str] = frozenset()
    users: Mapping[str, Principal] = field(default_factory=dict)
    groups: Mapping[str, Principal] = field(default_factory=dict)
    source: str = ""  # the file it came from ("" = built in)
    min_runtime_s: float = DEFAULT_MIN_RUNTIME_S  # for queues that set none

    @classmethod
    def single(cls, min_runtime_s: float = DEFAULT_MIN_RUNTIME_S) -> QueuesConfig:
        """No file: one queue without limits (corral's behaviour before queues)."""
        return cls({DEFAULT_QUEUE: QueueSpec(DEFAULT_QUEUE)}, min_runtime_s=min_runtime_s)

    def user(self, name: str) -> Principal | None:
        return self.users.get(name) or self.users.get("*")

    def min_runtime(self, queue: str) -> float:
        """How long a job of `queue` runs before it may be preempted (again)."""
        spec = self.queues.get(queue)
        return spec.min_runtime_s if spec is not None and spec.min_runtime_s is not None else self.min_runtime_s


# ------------------------------------------------------------------------------------------------ parsing
class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, problem: str) -> QueueConfigError:
        return QueueConfigError(f"{self.source}: {key}: {problem}")

    def table(self, value: Any, key: str, allowed: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a table, got {type(value).__name__}")
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.fail(f"{key}.{unknown[0]}" if key else unknown[0],
                            f"unknown key (known: {', '.join(sorted(allowed))})")  # fmt: skip
        return value

    def name(self, value: str, key: str) -> str:
        if not value or len(value) > 64 or not all(c.isalnum() or c in "-_." for c in value):
            raise self.fail(key, f"a name is 1-64 letters, digits, '-', '_' or '.', got {value!r}")
        return value

    def weight(self, value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.fail(key, f"must be a finite number, got {value!r}")
        if not 0 < value <= MAX_WEIGHT:
            raise self.fail(key, f"must be > 0 and at most {MAX_WEIGHT:g}, got {value!r}")
        return float(value)

    def priority(self, value: Any, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_PRIORITY:
            raise self.fail(key, f"must be a whole number in -{MAX_PRIORITY}..{MAX_PRIORITY}, got {value!r}")
        return value

    def duration(self, value: Any, key: str, example: str, least: float, most: float) -> float:
        try:
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise InvalidRequest(key, f"must be a duration such as {example!r}, got {value!r}")
            seconds = parse_duration_seconds(str(value), key)
        except InvalidRequest as exc:
            raise self.fail(key, exc.message) from None
        if not least <= seconds <= most:
            raise self.fail(key, f"must be from {least:g} to {most:g} seconds, got {value!r}")
        return seconds

    def names(self, value: Any, key: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, "must be a list of names")
        if len(value) > MAX_PRINCIPALS:
            raise self.fail(key, f"{len(value)} names, more than the {MAX_PRINCIPALS} a list may have")
        for v in value:
            self.name(v.removeprefix("@"), key)  # "@ml": the Unix group ml
        return tuple(value)

    def amounts(self, value: Any, key: str) -> Amounts:
        t = self.table(value, key, set(DIMENSIONS))
        out: dict[str, int] = {}
        for dim, raw in t.items():
            k = f"{key}.{dim}"
            if isinstance(raw, bool) or not isinstance(raw, int | float | str):
                raise self.fail(k, f"must be a number or an amount, got {raw!r}")
            if isinstance(raw, float) and not math.isfinite(raw):
                raise self.fail(k, f"must be finite, got {raw!r}")
            if isinstance(raw, int | float) and raw < 0:
                raise self.fail(k, f"must not be negative, got {raw!r}")
            try:
                if dim == "gpus":
                    if not isinstance(raw, int | float):
                        raise InvalidRequest(dim, f"must be a number of GPUs (1.5: one and a half), got {raw!r}")
                    milli = raw * MILLI_PER_GPU
                    if isinstance(raw, float) and (milli > _MAX[dim] or abs(milli - round(milli)) > 1e-6):
                        raise InvalidRequest(dim, f"must be a number of GPUs in steps of 0.001, got {raw!r}")
                    v = round(milli)
                elif dim == "gpu_milli":
                    if not isinstance(raw, int):
                        raise InvalidRequest(dim, f"must be a whole number (1000 = one GPU), got {raw!r}")
                    v = raw
                elif dim == "cpus":
                    v = parse_cpu_milli(raw, k)
                else:
                    v = parse_memory_mib(raw, k)
            except InvalidRequest as exc:
                raise self.fail(k, exc.message) from None
            if v > _MAX[dim]:
                most = _MAX[dim] // MILLI_PER_GPU if dim == "gpus" else _MAX[dim]
                raise self.fail(k, f"must be at most {most}, got {raw!r}")
            out[dim] = v
        return Amounts(**out)

    def principal(self, value: Any, key: str) -> Principal:
        t = self.table(value, key, {"limit", "weight", "max_priority"})
        return Principal(
            self.amounts(t.get("limit", {}), f"{key}.limit"),
            self.weight(t.get("weight", 1.0), f"{key}.weight"),
            self.priority(t["max_priority"], f"{key}.max_priority") if "max_priority" in t else None,
        )

    def principals(self, value: Any, key: str) -> dict[str, Principal]:
        t = self.table(value, key, set(value) if isinstance(value, dict) else set())
        return {(n if n == "*" else self.name(n, f"{key}.{n}")): self.principal(v, f"{key}.{n}") for n, v in t.items()}

    def queue(self, name: str, value: Any) -> QueueSpec:
        key = f"queues.{self.name(name, f'queues.{name}')}"
        allowed = {"weight", "guarantee", "limit", "borrow_limit", "max_priority", "submitters", "users", "groups",
                   "min_runtime", "namespaces"}  # fmt: skip
        t = self.table(value, key, allowed)
        guarantee = self.amounts(t.get("guarantee", {}), f"{key}.guarantee")
        limit = self.amounts(t.get("limit", {}), f"{key}.limit")
        for dim, g, lim in zip(DIMENSIONS, guarantee.values(), limit.values(), strict=True):
            if g is not None and lim is not None and g > lim:
                shown = f"is {vector_value(dim, g)}, above the queue's limit of {vector_value(dim, lim)}"
                raise self.fail(f"{key}.guarantee.{dim}", shown)
        return QueueSpec(
            name=name,
            weight=self.weight(t.get("weight", 1.0), f"{key}.weight"),
            guarantee=guarantee,
            limit=limit,
            borrow_limit=self.amounts(t.get("borrow_limit", {}), f"{key}.borrow_limit"),
            max_priority=self.priority(t["max_priority"], f"{key}.max_priority") if "max_priority" in t else None,
            submitters=self.names(t["submitters"], f"{key}.submitters") if "submitters" in t else None,
            min_runtime_s=(
                self.duration(t["min_runtime"], f"{key}.min_runtime", "5m", 0, MAX_MIN_RUNTIME_S)
                if "min_runtime" in t
                else None
            ),
            users=self.principals(t.get("users", {}), f"{key}.users"),
            groups=self.principals(t.get("groups", {}), f"{key}.groups"),
            namespaces=self.namespaces(t["namespaces"], f"{key}.namespaces") if "namespaces" in t else (),
        )

    def namespaces(self, value: Any, key: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, "must be a list of namespace names")
        if len(value) > MAX_PRINCIPALS:
            raise self.fail(key, f"{len(value)} names, more than the {MAX_PRINCIPALS} a list may have")
        for v in value:
            if not _NAMESPACE.fullmatch(v):
                raise self.fail(key, f"a namespace is 1-63 lower-case letters, digits or '-' (a DNS label), got {v!r}")
        return tuple(value)


#: A Kubernetes namespace's name (RFC 1123 label).
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

#: What the bounds' scan sees of TOML: strings and comments (skipped whole), brackets, dots and line ends.
_SCAN = re.compile(r'"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*|[\[\]{}.\n]', re.S)


def check_bounds(text: str, source: str) -> None:
    """Refuse a file past the size, depth or table bounds before TOML parses it (a scan of its brackets, dots and
    line ends, strings and comments skipped), so a hostile file costs one linear pass."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_FILE_BYTES:
        raise QueueConfigError(
            f"{source}: the file is more than {MAX_FILE_BYTES} bytes (a queues file may have at most {MAX_FILE_BYTES})"
        )
    depth = dots = tables = 0
    line = 1
    at_line_start = True
    for m in _SCAN.finditer(text):
        tok = m.group()
        c = tok[0]
        if c == "\n":
            line += 1
            dots = 0
            at_line_start = True
            continue
        if c in "[{":
            if c == "{" or (at_line_start and depth == 0):  # an inline table, or a [table] / [[table]] header
                tables += 1
            depth += 1
            if depth > MAX_DEPTH:
                raise QueueConfigError(
                    f"{source}: line {line}: arrays and inline tables nested more than {MAX_DEPTH} deep (the most a "
                    "queues file may nest)"
                )
        elif c in "]}":
            depth = max(0, depth - 1)
        elif c == ".":
            dots += 1
            if dots >= MAX_DEPTH:
                raise QueueConfigError(
                    f"{source}: line {line}: a dotted key of more than {MAX_DEPTH} parts (the most a queues file may "
                    "nest)"
                )
        else:
            line += tok.count("\n")  # a multi-line string, or a comment (none)
        at_line_start = c == "[" and at_line_start and depth <= 2  # "[[": still the header's start
    if tables > MAX_TABLES:
        raise QueueConfigError(f"{source}: {tables} tables, more than the {MAX_TABLES} a queues file may have")


def _check_counts(top: dict[str, Any], source: str) -> None:
    """Refuse too many queues, users and groups before any of them is read."""
    queues = top.get("queues")
    if isinstance(queues, dict) and len(queues) > MAX_QUEUES:
        raise QueueConfigError(f"{source}: queues: {len(queues)} queues, more than the {MAX_QUEUES} a file may have")
    principals = 0
    for where in [top, *(q for q in (queues.values() if isinstance(queues, dict) else ()) if isinstance(q, dict))]:
        for key in ("users", "groups"):
            found = where.get(key)
            if isinstance(found, dict):
                principals += len(found)
    if principals > MAX_PRINCIPALS:
        raise QueueConfigError(
            f"{source}: users: {principals} user and group entries, more than the {MAX_PRINCIPALS} a file may have"
        )


def parse_queues(text: str, source: str = "queues.toml") -> QueuesConfig:
    """The configuration in `text` (TOML); QueueConfigError names `source`, the key and the problem (or the bound
    the file passes: `check_bounds`)."""
    r = _Reader(source)
    check_bounds(text, source)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise QueueConfigError(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:  # the scan bounds nesting; this is the last guard, never a 500
        raise QueueConfigError(f"{source}: nested too deep (at most {MAX_DEPTH})") from None
    if isinstance(data, dict):
        _check_counts(data, source)
    allowed = {"half_life", "default_queue", "admins", "admin_groups", "queues", "users", "groups", "min_runtime"}
    top = r.table(data, "", allowed)
    half_life = DEFAULT_HALF_LIFE_S
    if "half_life" in top:
        raw = top["half_life"]
        try:
            if isinstance(raw, bool) or not isinstance(raw, str | int | float):
                raise InvalidRequest("half_life", f'must be a duration such as "7d", got {raw!r}')
            half_life = parse_duration_seconds(str(raw), "half_life")
        except InvalidRequest as exc:
            raise r.fail("half_life", exc.message) from None
        if not half_life > 0:
            raise r.fail("half_life", f"must be more than 0 seconds, got {raw!r}")
    queues_raw = r.table(top.get("queues", {}), "queues", set(top.get("queues", {})))
    queues = {name: r.queue(name, value) for name, value in queues_raw.items()}
    mapped: dict[str, str] = {}
    for q in queues.values():
        for ns in q.namespaces:
            if ns in mapped:
                raise r.fail(f"queues.{q.name}.namespaces",
                             f"namespace {ns!r} is already mapped to queue {mapped[ns]!r} (a namespace maps to one "
                             "queue)")  # fmt: skip
            mapped[ns] = q.name
    default = top.get("default_queue", DEFAULT_QUEUE)
    if not isinstance(default, str):
        raise r.fail("default_queue", f"must be a queue's name, got {default!r}")
    if default not in queues:
        if "default_queue" in top:
            raise r.fail("default_queue", f"names no queue of this file: {default!r} (queues: {', '.join(queues)})")
        queues[default] = QueueSpec(default)
    return QueuesConfig(
        queues=queues,
        default_queue=default,
        half_life_s=half_life,
        admins=frozenset(r.names(top.get("admins", []), "admins")),
        admin_groups=frozenset(r.names(top.get("admin_groups", []), "admin_groups")),
        users=r.principals(top.get("users", {}), "users"),
        groups=r.principals(top.get("groups", {}), "groups"),
        source=source,
        min_runtime_s=(
            r.duration(top["min_runtime"], "min_runtime", "5m", 0, MAX_MIN_RUNTIME_S)
            if "min_runtime" in top
            else DEFAULT_MIN_RUNTIME_S
        ),
    )


def validate_against_machine(config: QueuesConfig, capacity: Vector) -> None:
    """Refuse guarantees that add up to more than the machine has: they could not all be kept at once."""
    for i, dim in enumerate(DIMENSIONS):
        total = sum(q.guarantee.vector()[i] for q in config.queues.values())
        if total > capacity[i]:
            unit = "GPUs" if dim == "gpus" else NAMES[dim]
            raise QueueConfigError(
                f"{config.source}: queues.*.guarantee.{dim}: the guarantees add up to {vector_value(dim, total)} "
                f"{unit}, more than the machine's {vector_value(dim, capacity[i])}"
            )
