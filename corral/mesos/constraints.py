"""Marathon constraints `[field, OPERATOR, value?]`: parsing with clear errors, and evaluation over the "fields" of
one placement candidate given the instances already placed.

On one machine a candidate is whatever the daemon places an instance on, described by string fields: for example
`{"hostname": "box", "gpu": "3", "gpu_model": "H100", "numa": "1"}`. Then `["gpu", "UNIQUE"]` is one instance per
GPU, `["numa", "GROUP_BY"]` spreads instances over NUMA nodes and `["gpu_model", "LIKE", "A100.*"]` picks the model.

    operator  value            accepts the candidate when
    UNIQUE    -                no placed instance has the same value
    CLUSTER   v (optional)     its value is v; without v, the value of the instances already placed
    GROUP_BY  n (optional)     its value has no more instances than the least used value (of the known values,
                               or of at least n values when only the placed ones are known)
    MAX_PER   n                fewer than n placed instances have its value
    LIKE      regex            its value matches the whole regex
    UNLIKE    regex            it has no such field, or its value does not match
    IS        v                its value is v (numbers: equal to 0.001)

A candidate without the field is refused by every operator but UNLIKE (Marathon: agents lacking the attribute).
`hostname` and `@hostname` are the same field.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.mesos.errors import Problems
from corral.mesos.model import ConstraintOperator, ServiceConstraint

OPERATORS = ", ".join(o.value for o in ConstraintOperator)


def _whole(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() and int(value) >= 1 else None


def parse_constraint(raw: Any, path: str, problems: Problems) -> ServiceConstraint | None:
    if not isinstance(raw, list) or not 2 <= len(raw) <= 3 or not all(isinstance(x, str) for x in raw):
        problems.add(path, f"must be [field, operator] or [field, operator, value] (strings), got {raw!r}")
        return None
    field, op_text, *rest = raw
    value = rest[0] if rest else None
    if not field:
        problems.add(path, "the field must not be empty")
        return None
    try:
        op = ConstraintOperator(op_text.upper())
    except ValueError:
        problems.add(path, f"unknown operator {op_text!r}; use one of {OPERATORS}")
        return None
    bad = None
    if op is ConstraintOperator.UNIQUE and value is not None:
        bad = "UNIQUE takes no value"
    elif op is ConstraintOperator.CLUSTER and value == "":
        bad = "CLUSTER takes a non-empty value, or none"
    elif op is ConstraintOperator.GROUP_BY and value is not None and _whole(value) is None:
        bad = f"GROUP_BY takes no value or a whole number of groups >= 1, got {value!r}"
    elif op is ConstraintOperator.MAX_PER and _whole(value) is None:
        bad = f"MAX_PER needs a whole number value >= 1, got {value!r}"
    elif op in (ConstraintOperator.LIKE, ConstraintOperator.UNLIKE, ConstraintOperator.IS) and value is None:
        bad = f"{op.value} needs a value"
    elif op in (ConstraintOperator.LIKE, ConstraintOperator.UNLIKE):
        try:
            re.compile(value or "")
        except re.error as exc:
            bad = f"{value!r} is not a valid regular expression ({exc})"
    if bad:
        problems.add(path, bad)
        return None
    return ServiceConstraint(field, op, value)


def parse_constraints(raw: Sequence[Any], path: str, problems: Problems) -> tuple[ServiceConstraint, ...]:
    parsed = (parse_constraint(c, f"{path}/{i}", problems) for i, c in enumerate(raw))
    return tuple(c for c in parsed if c is not None)


def field_of(fields: Mapping[str, str], name: str) -> str | None:
    if name in ("hostname", "@hostname"):
        return fields.get("hostname", fields.get("@hostname"))
    return fields.get(name)


def _same(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return abs(float(a) - float(b)) < 0.001
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Rejection:
    constraint: ServiceConstraint
    reason: str

    def __str__(self) -> str:
        return f"constraint {self.constraint}: {self.reason}"


def check(
    constraints: Sequence[ServiceConstraint],
    candidate: Mapping[str, str],
    placed: Sequence[Mapping[str, str]],
    domains: Mapping[str, Collection[str]] | None = None,
) -> list[Rejection]:
    """Why `candidate` may not take one more instance (empty: it may). `placed`: the fields of the candidates the
    app's instances already run on; `domains`: every value a field can take on this machine, where known (makes
    GROUP_BY spread over all of them rather than only the ones already used)."""
    out: list[Rejection] = []
    for c in constraints:
        value = field_of(candidate, c.field)
        op = c.operator
        if value is None:
            if op is not ConstraintOperator.UNLIKE:
                out.append(Rejection(c, f"{c.field} is not set here"))
            continue
        used = Counter(v for p in placed if (v := field_of(p, c.field)) is not None)
        reason = None
        if op is ConstraintOperator.UNIQUE and used[value]:
            reason = f"an instance already runs where {c.field} is {value}"
        elif op is ConstraintOperator.CLUSTER:
            target = c.value if c.value is not None else next(iter(used), None)
            if target is not None and value != target:
                reason = f"{c.field} is {value}, instances are kept on {target}"
        elif op is ConstraintOperator.GROUP_BY:
            known = set(domains[c.field]) if domains and c.field in domains else set(used) | {value}
            least = min(used[v] for v in known)
            wanted = _whole(c.value)
            if (domains is None or c.field not in domains) and wanted is not None and len(set(used)) < wanted:
                least = 0  # fewer groups used than asked for: only a new value evens the spread
            if used[value] > least:
                reason = f"{c.field} {value} has {used[value]} instances, another value has {least}"
        elif op is ConstraintOperator.MAX_PER:
            limit = _whole(c.value) or 1
            if used[value] >= limit:
                reason = f"{c.field} {value} already has {used[value]} instances (at most {limit})"
        elif op is ConstraintOperator.LIKE and not re.fullmatch(c.value or "", value):
            reason = f"{c.field} is {value}, which does not match {c.value}"
        elif op is ConstraintOperator.UNLIKE and re.fullmatch(c.value or "", value):
            reason = f"{c.field} is {value}, which matches {c.value}"
        elif op is ConstraintOperator.IS and not _same(value, c.value or ""):
            reason = f"{c.field} is {value}, not {c.value}"
        if reason:
            out.append(Rejection(c, reason))
    return out
