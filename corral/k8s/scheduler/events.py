"""The Events `corral k8s scheduler` writes (FailedScheduling, CorralIgnoresNode, CorralGangIncomplete, Preempting,
Preempted, PreemptionStopped): one body for all of them, from the scheduler's component, and the words' bound."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

COMPONENT = "corral-scheduler"
#: What an Event's message (and a condition's) may hold.
MESSAGE_MAX = 1024


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def short(text: str) -> str:
    return text if len(text) <= MESSAGE_MAX else text[: MESSAGE_MAX - 3] + "..."


def pod_ref(namespace: str, name: str, uid: str = "") -> dict[str, Any]:
    """An Event's involvedObject for a pod (its UID where known)."""
    ref: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace}
    if uid:
        ref["uid"] = uid
    return ref


def event_body(
    namespace: str, involved: dict[str, Any], reason: str, message: str, type_: str, host: str
) -> dict[str, Any]:
    """A core/v1 Event about `involved` in `namespace` ("default" for a node's), written once (count 1)."""
    now = now_iso()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": type_,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": host,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
