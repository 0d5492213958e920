"""Validation errors in the shape Metronome and Marathon return them (HTTP 422):

    {"message": "Object is not valid", "details": [{"path": "/run/mem", "errors": ["must be >= 32"]}]}

Paths are JSON pointers into the submitted document (`/schedules/0/cron`); `/` is the document itself. Schema-level
problems (missing, unknown or mistyped properties, numbers out of range) come from pydantic and are reworded here;
rule-level problems use the source systems' own texts where the reference gives them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from corral.model.errors import CorralError

OBJECT_NOT_VALID = "Object is not valid"

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class ErrorDetail:
    path: str
    errors: tuple[str, ...]


class ObjectNotValid(CorralError):
    """A submitted job or app broke one or more rules. `status` is what the API answers (422; Chronos' own API
    answered 400)."""

    def __init__(self, details: Sequence[ErrorDetail], status: int = 422) -> None:
        self.details = tuple(details)
        self.status = status
        super().__init__("; ".join(f"{d.path}: {', '.join(d.errors)}" for d in self.details) or OBJECT_NOT_VALID)

    def to_json(self) -> dict[str, Any]:
        return {
            "message": OBJECT_NOT_VALID,
            "details": [{"path": d.path, "errors": list(d.errors)} for d in self.details],
        }

    def errors_at(self, path: str) -> tuple[str, ...]:
        return tuple(e for d in self.details if d.path == path for e in d.errors)


@dataclass
class Problems:
    """Collects rule violations by path, in the order found, and raises them together."""

    status: int = 422
    _by_path: dict[str, list[str]] = field(default_factory=dict)

    def add(self, path: str, message: str) -> None:
        self._by_path.setdefault(path or "/", []).append(message)

    def extend(self, details: Iterable[ErrorDetail]) -> None:
        for d in details:
            for e in d.errors:
                self.add(d.path, e)

    def __bool__(self) -> bool:
        return bool(self._by_path)

    def raise_if_any(self) -> None:
        if self._by_path:
            raise ObjectNotValid([ErrorDetail(p, tuple(e)) for p, e in self._by_path.items()], self.status)


def pointer(*parts: str | int) -> str:
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in parts)


_TYPE_WORDS = {
    "string_type": "must be a string",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "list_type": "must be an array",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "missing": "is required",
    "extra_forbidden": "is not a known property (additional properties are not allowed here)",
    "string_too_short": "must not be empty",
}


def _num(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _reword(err: Any, path: str) -> str:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind in ("int_type", "int_from_float", "int_parsing"):
        if path.endswith("/gpus"):
            return f"GPUs must be a whole number (fractional GPUs are not supported), got {err.get('input')!r}"
        return f"must be a whole number, got {err.get('input')!r}"
    if kind == "greater_than_equal":
        return f"must be >= {_num(ctx['ge'])}, got {err.get('input')!r}"
    if kind == "greater_than":
        return f"must be > {_num(ctx['gt'])}, got {err.get('input')!r}"
    if kind == "less_than_equal":
        return f"must be <= {_num(ctx['le'])}, got {err.get('input')!r}"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}, got {err.get('input')!r}"
    return _TYPE_WORDS.get(kind, str(err["msg"]))


def details_from_pydantic(exc: ValidationError) -> list[ErrorDetail]:
    by_path: dict[str, list[str]] = {}
    for err in exc.errors():
        path = pointer(*err["loc"]) if err["loc"] else "/"
        by_path.setdefault(path, []).append(_reword(err, path))
    return [ErrorDetail(p, tuple(e)) for p, e in by_path.items()]


def validate_model(model: type[M], data: Any, status: int = 422) -> M:
    """`model.model_validate(data)`, with pydantic's errors turned into `ObjectNotValid`."""
    if not isinstance(data, dict):
        raise ObjectNotValid([ErrorDetail("/", ("must be a JSON object",))], status)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ObjectNotValid(details_from_pydantic(exc), status) from None
