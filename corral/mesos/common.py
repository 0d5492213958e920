"""What the three Mesos-era formats share: how their JSON is read, and the pieces they spell alike."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

#: One segment of a Marathon app id or a Metronome job id: lower-case letters, digits and inner dashes.
ID_SEGMENT = r"(?:[a-z0-9]|[a-z0-9][a-z0-9-]*[a-z0-9])"


class MesosModel(BaseModel):
    """camelCase JSON, strict types, unknown keys ignored here (each format decides what an unknown key means)."""

    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True, alias_generator=to_camel, frozen=True)


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
