"""What the three Mesos-era formats share: how their JSON is read, and the pieces they spell alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from corral.mesos.errors import Problems
from corral.model import limits
from corral.model.resources import MAX_QUANTITY
from corral.model.units import MAX_DURATION_S

#: One segment of a Marathon app id or a Metronome job id: lower-case letters, digits and inner dashes.
ID_SEGMENT = r"(?:[a-z0-9]|[a-z0-9][a-z0-9-]*[a-z0-9])"


class MesosModel(BaseModel):
    """camelCase JSON, strict types, unknown keys ignored here (each format decides what an unknown key means)."""

    model_config = ConfigDict(
        strict=True,
        extra="ignore",
        populate_by_name=True,
        alias_generator=to_camel,
        frozen=True,
        allow_inf_nan=False,  # NaN and Infinity are no amount of anything (and overflow every conversion)
    )


class KeyValue(MesosModel):
    """A container runtime parameter (Docker's `--key value`)."""

    key: str
    value: str


class FetchUri(MesosModel):
    """A URI the Mesos fetcher would download into the sandbox (Metronome artifacts, Marathon and Chronos fetch)."""

    uri: str = Field(min_length=1)
    executable: bool = False
    extract: bool = True
    cache: bool = False


# ----------------------------------------------------------------------------------- what every format must obey
# The same bounds as corral's own API (corral.model.limits), checked at admission in each format's error shape, so
# a definition never fails when its run launches. Numbers: the `le=` bounds on each model's fields.
MAX_ID = 200  # an app id, job id or job name: shown in tables, used in paths and as a corral job name
MAX_INSTANCES = 1000  # a Marathon app's instances on one machine (docs/limits.md)
MAX_CPUS = MAX_QUANTITY["cpu_milli"] / 1000
MAX_MIB = float(MAX_QUANTITY["memory_mib"])
MAX_GPUS = MAX_QUANTITY["gpu_count"]
MAX_SECONDS = MAX_DURATION_S  # any duration in seconds (deadlines, delays, grace periods)
MAX_RETRIES = 100


def _at(path: str, sub: str) -> str:
    return f"{path}/{sub.replace('~', '~0').replace('/', '~1')}" if sub else path


def check_command(problems: Problems, args: Sequence[str], path: str) -> None:
    """An argv (`args`, `arguments`): each argument at `path/i`, the whole at `path`."""
    for sub, why in limits.command_problems(args):
        problems.add(_at(path, sub), why)


def check_shell(problems: Problems, cmd: str | None, path: str) -> None:
    """A shell command (`cmd`), run as one argument of /bin/sh -c."""
    if cmd is not None:
        for _, why in limits.command_problems([cmd]):
            problems.add(path, why)


def check_env(problems: Problems, env: Mapping[str, Any], path: str) -> None:
    """Environment variables: names and string values (secret references are checked by each format)."""
    for sub, why in limits.env_problems(env):
        problems.add(_at(path, sub), why)


def check_text(problems: Problems, text: str | None, path: str, limit: int = limits.MAX_TEXT) -> None:
    if text is not None:
        why = limits.free_text_problem(text, limit)
        if why is not None:
            problems.add(path, why)


def check_labels(problems: Problems, labels: Mapping[str, str], path: str) -> None:
    for key, value in labels.items():
        check_text(problems, key, path, MAX_ID)
        check_text(problems, value, _at(path, key))


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint of a peer's REST API, as corral answers it: served, or refused in the peer's error shape with
    why (`note`). Each peer keeps one tuple of these; its routes and its docs/compat table are made from / checked
    against that tuple. `path` is the peer's own (parameters as {name}), relative to corral's mount of the peer."""

    method: str
    path: str
    served: bool
    note: str
