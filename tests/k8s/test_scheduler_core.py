"""The standalone scheduler's logic on corral.k8s.fake's FakeKubeApi (the real plane: test_scheduler_e2e.py).

The batch step (pure), the loop (queue, batches, binds, retries when capacity frees), why a pod waits (condition,
rate-limited events, /explain, /metrics), the books at a restart and with other schedulers' pods, bind failures.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from corral.k8s.cli import app, explain_text, split_listen
from corral.k8s.client import KubeApiError
from corral.k8s.convert import ANN_ASSIGNMENT, Assignment, GpuSlot, assignment_annotations, parse_assignment
from corral.k8s.fake import FakeKubeApi, node_object, pod_object
from corral.k8s.scheduler import batch as batch_mod
from corral.k8s.scheduler import core as core_mod
from corral.k8s.scheduler import events
from corral.k8s.scheduler.batch import INVALID, NO_NODES, Bind, Wait, place_batch
from corral.k8s.scheduler.core import EVENTS_PER_WINDOW, Scheduler, TokenBucket, pending_of
from corral.k8s.scheduler.http import answer
from corral.k8s.state import ClusterState, Informer
from corral.model.errors import InvalidRequest
from corral.placement import PlacementConfig
from tests.k8s.conftest import gpu_node

BINPACK = PlacementConfig(policy="binpack")


def wait_for(what: str, check: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def gpu_pod(name: str, gpus: int = 1, scheduler: str = "corral", **kw: Any) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    p = pod_object(name, [{"name": "main", "resources": {"requests": {"cpu": "100m"}, "limits": limits}}], **kw)
    p["spec"]["schedulerName"] = scheduler
    return p


def node_of(api: FakeKubeApi, name: str) -> str | None:
    node: str | None = api.pods[("default", name)]["spec"].get("nodeName")
    return node


def used_gpus(api: FakeKubeApi) -> list[str]:
    """Every GPU UUID named by a bound pod's assignment, repeats kept."""
    out: list[str] = []
    for p in api.pods.values():
        a = parse_assignment(p["metadata"].get("annotations"))
        if a is not None:
            out.extend(s.uuid for s in a.slots)
    return out


@pytest.fixture
def api() -> FakeKubeApi:
    api = FakeKubeApi()
    api.put_node(gpu_node("n1", 2))
    api.put_node(gpu_node("n2", 2))
    return api


@pytest.fixture
def run(api: FakeKubeApi) -> Iterator[Callable[..., Scheduler]]:
    started: list[Scheduler] = []

    def start(**kw: Any) -> Scheduler:
        s = Scheduler(api, kw.pop("config", BINPACK), batch_window=0.001, **kw)
        s.start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


# ---------------------------------------------------------------------------------------------------- batch step
def _snapshot(api: FakeKubeApi) -> ClusterState:
    state = ClusterState()
    Informer(api, state).sync_once()
    return state


def test_the_batch_step_places_in_arrival_order_on_the_books_it_is_given(api: FakeKubeApi) -> None:
    state = _snapshot(api)
    s = state.snapshot
    assert s is not None
    pods = [pending_of(gpu_pod(f"p{i}", 2)) for i in range(3)] + [pending_of(gpu_pod("small", 1))]
    out = place_batch(pods, s, BINPACK)
    assert [type(d).__name__ for d in out] == ["Bind", "Bind", "Wait", "Wait"]
    b0, b1, w2, w3 = out
    assert isinstance(b0, Bind) and isinstance(b1, Bind) and isinstance(w2, Wait) and isinstance(w3, Wait)
    assert {b0.allocation.node, b1.allocation.node} == {"n1", "n2"}
    assert set(s.allocations) == {"uid-default-p0", "uid-default-p1"}  # granted as decided
    assert parse_assignment(b0.annotations) == b0.assignment
    assert w2.reason == "0/2 nodes fit: 2 insufficient GPU (need 2 whole GPUs)" and w2.code == "insufficient_gpu"
    assert not w2.unresolvable
    assert w3.reason == "0/2 nodes fit: 2 insufficient GPU (need 1 whole GPU)"


def test_the_batch_step_explains_pods_it_cannot_read_and_clusters_without_nodes() -> None:
    bad = gpu_pod("bad")
    bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1.5"
    p = pending_of(bad)
    assert p.ask is None
    assert p.error == (
        "pod default/bad cannot be scheduled: spec.containers[0].resources[nvidia.com/gpu]: must be a whole number, "
        "got '1.5'"
    )
    [w1, w2] = place_batch([p, pending_of(gpu_pod("fine"))], None, BINPACK)
    assert isinstance(w1, Wait) and (w1.code, w1.unresolvable, w1.reason) == (INVALID, True, p.error)
    assert isinstance(w2, Wait) and (w2.code, w2.reason) == (NO_NODES, "corral knows no nodes yet")


def test_a_node_selector_is_a_constraint(api: FakeKubeApi) -> None:
    api.put_node(node_object("labelled", "8", "32Gi", labels={"zone": "b"}))
    state = _snapshot(api)
    p = gpu_pod("picky", 0)
    p["spec"]["nodeSelector"] = {"zone": "b"}
    [d] = place_batch([pending_of(p)], state.snapshot, BINPACK)
    assert isinstance(d, Bind) and d.allocation.node == "labelled"


# ---------------------------------------------------------------------------------------------------- the loop
def test_pods_of_its_name_are_bound_in_one_write_each_with_their_assignment(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    run()
    for i in range(4):
        api.put_pod(gpu_pod(f"p{i}"))
    api.put_pod(gpu_pod("theirs", scheduler="default-scheduler"))
    wait_for("4 binds", lambda: all(node_of(api, f"p{i}") for i in range(4)))
    binds = [c for c in api.calls if c[0] == "create_binding"]
    assert len(binds) == 4 and not [c for c in api.calls if c[0] == "patch_pod_annotations"]
    assert sorted(used_gpus(api)) == sorted(f"GPU-{n}-{j}" for n in ("n1", "n2") for j in range(2))
    time.sleep(0.1)
    assert node_of(api, "theirs") is None


def test_a_pod_waiting_for_capacity_binds_as_soon_as_a_pod_is_deleted(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    s = run()
    api.put_pod(gpu_pod("a", 2))
    api.put_pod(gpu_pod("b", 2))
    wait_for("the fill", lambda: bool(node_of(api, "a") and node_of(api, "b")))
    api.put_pod(gpu_pod("waits", 2))
    wait_for("its reason", lambda: s.explain("default/waits")["state"] == "pending")
    assert s.pending_by_reason() == {"insufficient_gpu": 1}
    freed = node_of(api, "a")
    api.delete_pod("default", "a")
    wait_for("the bind", lambda: node_of(api, "waits") == freed, 2)  # no backoff timer: at the deletion
    assert s.explain("default/waits") == {"pod": "default/waits", "state": "bound", "reason": f"bound to {freed}"}


def test_a_new_node_lets_a_waiting_pod_bind(api: FakeKubeApi, run: Callable[..., Scheduler]) -> None:
    run()
    api.put_pod(gpu_pod("big", 4))
    wait_for("an event", lambda: bool(api.events))
    api.put_node(gpu_node("n3", 4))
    wait_for("the bind", lambda: node_of(api, "big") == "n3", 2)


def test_a_pending_pod_gets_its_condition_once_and_at_most_a_few_events(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    run()
    api.put_pod(gpu_pod("big", 4))
    wait_for("an event", lambda: bool(api.events))
    for i in range(10):  # capacity "frees" ten times: ten attempts
        api.put_pod(gpu_pod(f"other-{i}", 0, scheduler="default-scheduler", node="n1"))
        api.delete_pod("default", f"other-{i}")
        time.sleep(0.02)
    time.sleep(0.3)
    status = api.pods[("default", "big")]["status"]
    [cond] = [c for c in status["conditions"] if c["type"] == "PodScheduled"]
    message = "0/2 nodes fit: 2 fewer than 4 eligible GPUs"
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Unschedulable", message)
    assert len([c for c in api.calls if c[0] == "patch_pod_status"]) == 1  # the same reason: written once
    mine = [e for ns, e in api.events if e["involvedObject"]["name"] == "big"]
    assert 1 <= len(mine) <= EVENTS_PER_WINDOW
    e = mine[0]
    assert (e["reason"], e["type"], e["message"], e["source"]) == (
        "FailedScheduling",
        "Warning",
        message,
        {"component": "corral-scheduler"},
    )


def test_a_refused_binding_gives_its_gpus_back_and_the_pod_is_placed_again(
    api: FakeKubeApi, run: Callable[..., Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core_mod, "BIND_RETRY", 1.0)  # long enough to see the pod wait
    api.fail_next["create_binding"] = KubeApiError("admission webhook said no", 403)
    s = run()
    api.put_pod(gpu_pod("p", 2))
    wait_for("the failure", lambda: s.pending_by_reason() == {"bind_failed": 1})
    assert s.explain("default/p")["reason"] == "the Binding failed: admission webhook said no"
    assert s.state.snapshot is not None and not s.state.snapshot.allocations  # the charge given back
    wait_for("the bind", lambda: node_of(api, "p") is not None)
    assert len([c for c in api.calls if c[0] == "create_binding"]) == 1  # the refused one made no call (fail_next)
    assert s.metrics.binds.labels("refused")._value.get() == 1
    wait_for("the books to settle", lambda: s.state.pods["uid-default-p"].confirmed)
    assert s.state.snapshot is not None and list(s.state.snapshot.allocations) == ["uid-default-p"]


def test_a_binding_whose_answer_is_lost_is_counted_once(api: FakeKubeApi, run: Callable[..., Scheduler]) -> None:
    api.lose_answer["create_binding"] = KubeApiError("connection reset", None)
    s = run()
    api.put_pod(gpu_pod("p", 2))
    api.put_pod(gpu_pod("q", 2))
    wait_for("both bound", lambda: bool(node_of(api, "p") and node_of(api, "q")))
    time.sleep(0.2)
    assert len([c for c in api.calls if c[0] == "create_binding"]) == 2  # the lost one was not written again
    assert sorted(used_gpus(api)) == sorted(set(used_gpus(api)))
    assert s.metrics.binds.labels("unknown")._value.get() == 1
    assert s.state.snapshot is not None and len(s.state.snapshot.allocations) == 2


class BoundBySomeoneElse(FakeKubeApi):
    """A Binding that loses the race: another scheduler binds the pod first (409)."""

    def create_binding(self, namespace: str, name: str, uid: str, node: str,
                       annotations: dict[str, str] | None = None) -> None:  # fmt: skip
        if name == "raced":
            super().create_binding(namespace, name, uid, "n2" if node == "n1" else "n1")
        super().create_binding(namespace, name, uid, node, annotations)


def test_a_pod_bound_by_another_scheduler_first_is_counted_where_it_went() -> None:
    api = BoundBySomeoneElse()
    api.put_node(gpu_node("n1", 2))
    api.put_node(gpu_node("n2", 2))
    s = Scheduler(api, BINPACK, batch_window=0.001)
    s.start()
    try:
        api.put_pod(gpu_pod("raced", 2))
        wait_for("the race", lambda: s.metrics.binds.labels("refused")._value.get() == 1)
        wait_for(
            "the books", lambda: "uid-default-raced" in s.state.pods and s.state.pods["uid-default-raced"].confirmed
        )
        other = node_of(api, "raced")
        api.put_pod(gpu_pod("next", 2))
        wait_for("the next pod", lambda: node_of(api, "next") is not None)
        assert node_of(api, "next") != other  # the raced pod's GPUs were charged on its real node
    finally:
        s.close()


def test_the_books_charge_gpu_pods_of_other_schedulers(api: FakeKubeApi, run: Callable[..., Scheduler]) -> None:
    api.put_pod(gpu_pod("kube", 2, scheduler="default-scheduler", node="n1"))
    s = run()
    assert s.state.snapshot is not None and int(s.state.snapshot.gpu_full_free[s.state.snapshot.index["n1"]]) == 0
    api.put_pod(gpu_pod("mine", 2))
    wait_for("the bind", lambda: node_of(api, "mine") == "n2")
    api.put_pod(gpu_pod("more", 1))
    wait_for("its reason", lambda: s.explain("default/more")["state"] == "pending")


def test_a_restart_rebuilds_the_books_from_bound_pods_annotations(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    # n1's GPU 1 and n2's GPU 0 are held by pods a previous scheduler bound
    for name, node, j in (("old-1", "n1", 1), ("old-2", "n2", 0)):
        a = Assignment(node, {"main": (GpuSlot(j, f"GPU-{node}-{j}", 1000, 81920),)})
        api.put_pod(gpu_pod(name, 1, node=node, annotations=assignment_annotations(a, "nvidia")))
    run()
    api.put_pod(gpu_pod("new-1", 1))
    api.put_pod(gpu_pod("new-2", 1))
    api.put_pod(gpu_pod("new-3", 1))
    wait_for("two binds", lambda: bool(node_of(api, "new-1") and node_of(api, "new-2")))
    time.sleep(0.1)
    assert sorted(used_gpus(api)) == ["GPU-n1-0", "GPU-n1-1", "GPU-n2-0", "GPU-n2-1"]  # each once
    assert node_of(api, "new-3") is None


def test_hostile_pods_wait_with_their_reason_and_hold_nothing_up(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    s = run()
    huge = gpu_pod("huge", 1, annotations={"x.example/blob": "x" * 300_000})
    bad = gpu_pod("bad")
    bad["spec"]["containers"][0]["resources"]["limits"] = {"corral.dev/gpu-milli": "500"}
    bad["metadata"]["annotations"] = {"corral.dev/gpu-count": "lots"}
    broken = gpu_pod("broken")
    broken["spec"]["containers"] = "not a list"
    for p in (bad, broken, huge, gpu_pod("fine")):
        api.put_pod(p)
    wait_for("the good ones", lambda: bool(node_of(api, "fine") and node_of(api, "huge")))
    wait_for("two events", lambda: {e["involvedObject"]["name"] for _, e in api.events} == {"bad", "broken"})
    by_pod = {e["involvedObject"]["name"]: e["message"] for _, e in api.events}
    assert by_pod["bad"] == (
        "pod default/bad cannot be scheduled: metadata.annotations[corral.dev/gpu-count]: not a Kubernetes quantity: "
        "'lots' (examples: 2, 500m, 4Gi, 1e3)"
    )
    assert (
        by_pod["broken"]
        == "pod default/broken cannot be scheduled: spec.containers: must be a list of container objects"
    )
    assert s.pending_by_reason() == {INVALID: 2}


def test_messages_longer_than_the_limit_are_cut(api: FakeKubeApi, run: Callable[..., Scheduler]) -> None:
    run()
    p = gpu_pod("long", 1, annotations={"corral.dev/gpu-model": ",".join(f"M{i}" for i in range(600))})
    api.put_pod(p)
    wait_for("its event", lambda: bool(api.events))
    message = api.events[0][1]["message"]
    assert len(message) == events.MESSAGE_MAX and message.endswith("...")


# ---------------------------------------------------------------------------------------------------- read views
def test_metrics_and_explain_answer(api: FakeKubeApi, run: Callable[..., Scheduler]) -> None:
    s = run()
    api.put_pod(gpu_pod("p", 2))
    api.put_pod(gpu_pod("big", 8))
    wait_for("the bind", lambda: node_of(api, "p") is not None)
    wait_for("the wait", lambda: s.explain("default/big")["state"] == "pending")
    # its FailedScheduling event is written after the reason is known, by the writer: wait for that too
    wait_for("the event", lambda: b'corral_scheduler_events_total{result="sent"}' in answer(s, "/metrics")[2])
    status, ctype, body = answer(s, "/metrics")
    text = body.decode()
    assert status == 200 and ctype.startswith("text/plain")
    assert 'corral_scheduler_binds_total{result="bound"} 1.0' in text
    assert 'corral_scheduler_pending_pods{reason="too_few_gpus"} 1.0' in text
    for name in (
        "corral_scheduler_bind_duration_seconds_bucket",
        "corral_scheduler_batch_size_bucket",
        "corral_scheduler_pod_scheduling_duration_seconds_count",
        'corral_scheduler_events_total{result="sent"}',
    ):
        assert name in text
    status, _, body = answer(s, "/explain/default/big")
    assert status == 200 and orjson.loads(body) == {
        "pod": "default/big",
        "state": "pending",
        "code": "too_few_gpus",
        "queue": "default",
        "reason": "0/2 nodes fit: 2 fewer than 8 eligible GPUs",
    }
    assert orjson.loads(answer(s, "/explain/default/nobody")[2]) == {
        "pod": "default/nobody",
        "state": "unknown",
        "reason": "corral's scheduler does not know pod default/nobody",
    }
    assert answer(s, "/explain/x")[0] == 404
    status, _, body = answer(s, "/nope")
    assert status == 404 and orjson.loads(body) == {
        "error": "/nope: no such endpoint (known: /metrics, /healthz, /readyz, /explain/NAMESPACE/POD)"
    }
    assert answer(s, "/readyz")[:1] == (200,)


def test_the_token_bucket_spends_its_burst_then_paces_at_qps() -> None:
    now = [0.0]
    bucket = TokenBucket(qps=100, burst=3, clock=lambda: now[0])
    waits = [bucket.reserve() for _ in range(5)]
    assert waits == pytest.approx([0, 0, 0, 0.01, 0.02])  # past the burst: each caller its own slot, 1/qps apart
    now[0] = 1.0  # a second later the bucket has refilled, to the burst and no further
    assert [bucket.reserve() for _ in range(4)] == pytest.approx([0, 0, 0, 0.01])
    with pytest.raises(InvalidRequest, match="--qps: must be > 0, got 0"):
        TokenBucket(0, 1)
    with pytest.raises(InvalidRequest, match="--burst: must be >= 1, got 0"):
        TokenBucket(1, 0)


def test_the_assignment_annotation_is_what_the_extender_writes(api: FakeKubeApi, run: Callable[..., Scheduler]) -> None:
    run()
    api.put_pod(gpu_pod("p", 1))
    wait_for("the bind", lambda: node_of(api, "p") is not None)
    ann = api.pods[("default", "p")]["metadata"]["annotations"]
    a = parse_assignment(ann)
    assert a is not None and ann == assignment_annotations(a, "nvidia") and ANN_ASSIGNMENT in ann


# ---------------------------------------------------------------------------------------------------- the commands
def test_explain_text_says_why_a_pod_waits_and_lists_its_events() -> None:
    pod = gpu_pod("big", 4)
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                    "message": "0/2 nodes fit: 2 fewer than 4 eligible GPUs",
                                    "lastTransitionTime": "2026-11-28T14:00:00Z"}]  # fmt: skip
    event = {"involvedObject": {"name": "big", "uid": "uid-default-big"}, "reason": "FailedScheduling",
             "message": "0/2 nodes fit: 2 fewer than 4 eligible GPUs", "count": 2,
             "lastTimestamp": "2026-11-28T14:00:05Z", "source": {"component": "corral-scheduler"}}  # fmt: skip
    old = {**event, "involvedObject": {"name": "big", "uid": "an-older-pod-of-that-name"}}
    assert explain_text(pod, [event, old]).splitlines() == [
        "default/big: pending (Unschedulable, since 2026-11-28T14:00:00Z)",
        "  0/2 nodes fit: 2 fewer than 4 eligible GPUs",
        "  queue default",
        "events:",
        "  2026-11-28T14:00:05Z FailedScheduling (x2) from corral-scheduler: 0/2 nodes fit: 2 fewer than 4 eligible "
        "GPUs",
    ]
    assert explain_text(gpu_pod("new"), []) == "default/new: pending, not looked at yet by its scheduler (corral)"
    assert explain_text(gpu_pod("on", node="n1"), []) == "default/on: bound to n1"


def test_the_commands_refuse_bad_arguments_naming_them() -> None:
    runner = CliRunner()
    out = runner.invoke(app, ["explain", "a/b/c"])
    assert out.exit_code == 2 and "error: expected NAMESPACE/POD, got 'a/b/c'" in out.output
    out = runner.invoke(app, ["scheduler", "--listen", "nowhere", "--kubeconfig", "/nonexistent"])
    assert out.exit_code == 2 and "error: --listen: expected HOST:PORT (e.g. 0.0.0.0:9444), got 'nowhere'" in out.output
    for flag, value, words in (("--qps", "0", "must be > 0, got 0"), ("--burst", "0", "must be >= 1, got 0"),
                               ("--bind-workers", "0", "must be >= 1, got 0"),
                               ("--batch-window-ms", "-1", "must be >= 0, got -1")):  # fmt: skip
        out = runner.invoke(app, ["scheduler", flag, value, "--kubeconfig", "/nonexistent", "--listen", ""])
        assert out.exit_code == 2 and f"error: {flag}: {words}" in out.output, out.output
    out = runner.invoke(app, ["scheduler", "--kubeconfig", "/nonexistent", "--listen", ""])
    assert out.exit_code == 2 and "error: cannot read the kubeconfig /nonexistent: FileNotFoundError: " in out.output
    assert split_listen("[::1]:9444") == ("::1", 9444) and split_listen(":9444") == ("0.0.0.0", 9444)
    assert split_listen("") is None


def test_bound_pods_of_one_shape_are_read_once_whatever_their_assignment(monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.k8s import convert

    full: list[str] = []
    real = convert._pod_request

    def counted(pod: Any, *args: Any) -> convert.PodAsk:
        full.append(pod["metadata"]["name"])
        return real(pod, *args)

    monkeypatch.setattr(convert, "_pod_request", counted)
    monkeypatch.setattr(convert, "_shapes", OrderedDict())  # shapes earlier tests left
    for j in range(3):
        a = Assignment("n1", {"main": (GpuSlot(j, f"GPU-n1-{j}", 1000, 81920),)})
        p = gpu_pod(f"shape-{j}", 1, node="n1", annotations=assignment_annotations(a, "nvidia"))
        ask = convert.pod_request(p, min_cpu_milli=0)
        assert ask.request.id == f"uid-default-shape-{j}" and ask.request.gpu_count == 1
    assert full == ["shape-0"]


def test_a_node_whose_gpu_inventory_lies_is_left_out_with_an_event(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    liar: dict[str, Any] = gpu_node("liar", 8)
    liar["status"]["allocatable"]["nvidia.com/gpu"] = "2"  # the annotation says 8
    api.put_node(liar)
    broken: dict[str, Any] = gpu_node("broken", 2)
    broken["metadata"]["annotations"]["corral.dev/gpus"] = '[{"index": "zero"}]'
    api.put_node(broken)
    s = run()
    api.put_pod(gpu_pod("eight", 8))
    api.put_pod(gpu_pod("one", 1))
    wait_for("the small pod", lambda: node_of(api, "one") in ("n1", "n2"))
    wait_for("the node events", lambda: len([e for _, e in api.events if e["involvedObject"]["kind"] == "Node"]) == 2)
    told = {e["involvedObject"]["name"]: e for _, e in api.events if e["involvedObject"]["kind"] == "Node"}
    assert told["liar"]["message"] == (
        "node liar: its corral.dev/gpus annotation lists 8 GPUs but its allocatable nvidia.com/gpu is 2; corral places "
        "nothing there until they agree"
    )
    assert told["broken"]["message"].startswith(
        "node broken: metadata.annotations[corral.dev/gpus]: each GPU needs index, model, memory_mib"
    )
    assert {e["reason"] for e in told.values()} == {"CorralIgnoresNode"}
    wait_for("the big pod's reason", lambda: s.explain("default/eight")["state"] == "pending")
    api.put_node(liar)  # the same lie again: no second event
    time.sleep(0.2)
    assert len([e for _, e in api.events if e["involvedObject"]["kind"] == "Node"]) == 2
    liar["status"]["allocatable"]["nvidia.com/gpu"] = "8"  # now they agree
    api.put_node(liar)
    wait_for("the big pod", lambda: node_of(api, "eight") == "liar", 2)


def test_pods_stay_off_tainted_and_cordoned_nodes_unless_they_tolerate_them(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    tainted: dict[str, Any] = gpu_node("n1", 2)
    tainted["spec"] = {"taints": [{"key": "gpu", "value": "reserved", "effect": "NoSchedule"},
                                  {"key": "soft", "effect": "PreferNoSchedule"}]}  # fmt: skip
    api.put_node(tainted)
    cordoned: dict[str, Any] = gpu_node("n2", 2)
    cordoned["spec"] = {"unschedulable": True}
    api.put_node(cordoned)
    s = run()
    api.put_pod(gpu_pod("plain", 1))
    tolerant = gpu_pod("tolerant", 1)
    tolerant["spec"]["tolerations"] = [{"key": "gpu", "operator": "Equal", "value": "reserved", "effect": "NoSchedule"}]
    api.put_pod(tolerant)
    wait_for("the tolerant pod", lambda: node_of(api, "tolerant") == "n1")
    wait_for("the plain pod's reason", lambda: s.explain("default/plain")["state"] == "pending")
    assert s.explain("default/plain")["reason"] == "0/2 nodes fit: 2 taint not tolerated or cordoned"
    del cordoned["spec"]  # uncordoned
    api.put_node(cordoned)
    wait_for("the plain pod", lambda: node_of(api, "plain") == "n2", 2)


def test_a_pod_deleted_while_its_batch_is_placed_is_not_kept_waiting(
    api: FakeKubeApi, run: Callable[..., Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = run()
    real = batch_mod.place_batch
    ghost = gpu_pod("ghost", 8)

    def deleted_meanwhile(pending: Any, snapshot: Any, config: Any) -> Any:
        if any(p.name == "default/ghost" for p in pending):
            s.observed("pods", "DELETED", ghost)  # the watch's deletion, arriving while the batch is placed
        return real(pending, snapshot, config)

    monkeypatch.setattr(core_mod, "place_batch", deleted_meanwhile)
    api.put_pod(ghost)
    api.put_pod(gpu_pod("after", 1))
    wait_for("the next pod", lambda: node_of(api, "after") is not None)
    time.sleep(0.1)
    assert s.pending_by_reason() == {} and s.explain("default/ghost")["state"] == "unknown"
    assert not [e for _, e in api.events if e["involvedObject"]["name"] == "ghost"]


def test_a_reason_that_changes_soon_after_is_written_when_its_interval_is_up(
    api: FakeKubeApi, run: Callable[..., Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core_mod, "CONDITION_EVERY", 0.5)
    run()
    api.put_pod(gpu_pod("big", 4))
    wait_for("the first condition", lambda: bool(api.pods[("default", "big")]["status"].get("conditions")))
    api.put_node(node_object("cpu-1", "8", "32Gi"))  # a new node: tried again, and the reason changes

    def message() -> str:
        [c] = api.pods[("default", "big")]["status"]["conditions"]
        return str(c["message"])

    wait_for("the new reason", lambda: message() == "0/3 nodes fit: 2 fewer than 4 eligible GPUs, 1 no GPUs", 5)
    assert len([c for c in api.calls if c[0] == "patch_pod_status"]) == 2


def test_a_move_in_its_queue_sends_no_event_and_is_written_later_than_a_new_reason(
    api: FakeKubeApi, run: Callable[..., Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With queues every waiting pod's words name its place ("position i of n"), which moves whenever a pod arrives
    or starts: a move alone sends no FailedScheduling event, and its condition waits CONDITION_POSITION_EVERY (not
    CONDITION_EVERY); a new reason is written and told as before, the move's wait notwithstanding."""
    monkeypatch.setattr(core_mod, "CONDITION_EVERY", 0.0)
    monkeypatch.setattr(core_mod, "CONDITION_POSITION_EVERY", 3600.0)
    monkeypatch.setattr(core_mod, "EVENTS_PER_WINDOW", 100)  # (not the per-pod limit: the rule for a move)
    s = run()
    api.put_pod(gpu_pod("big", 4))
    wait_for("the first condition", lambda: bool(api.pods[("default", "big")]["status"].get("conditions")))
    wait_for("its event", lambda: any(e["involvedObject"]["name"] == "big" for _, e in api.events))
    w = s._unschedulable[api.pods[("default", "big")]["metadata"]["uid"]]

    def told(reason: str) -> tuple[int, int, str]:
        with s._cond:
            w.reason = reason
        s.write_reason(w)
        [c] = api.pods[("default", "big")]["status"]["conditions"]
        patches = len([x for x in api.calls if x[0] == "patch_pod_status" and x[2] == "big"])
        return patches, len([e for _, e in api.events if e["involvedObject"]["name"] == "big"]), str(c["message"])

    p0, e0, _ = told("queue q, position 2 of 5; held by no room: A")
    assert told("queue q, position 1 of 6; held by no room: A") == (
        p0,
        e0,
        "queue q, position 2 of 5; held by no room: A",
    )
    assert told("queue q, position 1 of 6; held by the limit: B") == (
        p0 + 1,
        e0 + 1,
        "queue q, position 1 of 6; held by the limit: B",
    )
    moved = told("queue q; held by the limit: B")  # out of line: its place alone changed
    assert moved == (p0 + 1, e0 + 1, "queue q, position 1 of 6; held by the limit: B")
    monkeypatch.setattr(core_mod, "CONDITION_POSITION_EVERY", 0.0)  # (its wait is up)
    assert told("queue q, position 3 of 7; held by the limit: B") == (
        p0 + 2, e0 + 1, "queue q, position 3 of 7; held by the limit: B")  # fmt: skip
    assert told("queue q, position 3 of 7; held by the limit: B")[1] == e0 + 1  # still a move since its last event
    assert told("queue q, position 1 of 6; held by the limit: B")[1] == e0 + 2  # its last event's words: as before


def test_a_round_hands_a_move_alone_to_no_writer_and_its_condition_comes_due_later(
    api: FakeKubeApi, run: Callable[..., Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newcomer moves every pod behind it ("of 2" to "of 3"): the round gives none of them to the writer (ten
    thousand a round on a cluster, each looked at again), no event is sent for it, and each one's condition comes
    due CONDITION_POSITION_EVERY after its last write, when the writer rewrites it with its place then."""
    from corral.tenancy.config import parse_queues

    monkeypatch.setattr(core_mod, "CONDITION_EVERY", 0.0)
    monkeypatch.setattr(core_mod, "CONDITION_POSITION_EVERY", 3600.0)
    s = run(queues=parse_queues("[queues.q]\nnamespaces = ['default']\n"))
    for name in ("hog1", "hog2"):
        api.put_pod(gpu_pod(name, 2))
    wait_for("both nodes taken", lambda: node_of(api, "hog1") is not None and node_of(api, "hog2") is not None)

    def condition(name: str) -> str:
        return str(next((c["message"] for c in api.pods[("default", name)]["status"].get("conditions", [])), ""))

    api.put_pod(gpu_pod("a", 2))  # the head (its reservation's words change with it)
    api.put_pod(gpu_pod("b", 2))
    wait_for("b's words", lambda: condition("b").startswith("queue q, position 2 of 2;"))
    uid = api.pods[("default", "b")]["metadata"]["uid"]
    w = s._unschedulable[uid]
    told: list[str] = []
    real = s._say_why

    def say_why(x: Any) -> None:
        told.append(x.name)
        real(x)

    monkeypatch.setattr(s, "_say_why", say_why)
    events = len([e for _, e in api.events if e["involvedObject"]["name"] == "b"])
    api.put_pod(gpu_pod("c", 2))
    wait_for("c's words", lambda: condition("c").startswith("queue q, position 3 of 3;"))
    assert w.reason.startswith("queue q, position 2 of 3;")  # b's words moved in the round ...
    assert "b" not in told and "c" in told  # ... and the writer was not handed b
    assert condition("b").startswith("queue q, position 2 of 2;")
    assert w.due and w.due_at >= w.written_at + 3600.0
    monkeypatch.setattr(core_mod, "CONDITION_POSITION_EVERY", 0.0)
    with s._write_cond:  # its time is up: the writer rewrites it from the due list, with no event
        s._due = [(0.0, seq, x) if x is w else (at, seq, x) for at, seq, x in s._due]
        heapq.heapify(s._due)
        s._write_cond.notify()
    wait_for("b's move written", lambda: condition("b").startswith("queue q, position 2 of 3;"))
    assert len([e for _, e in api.events if e["involvedObject"]["name"] == "b"]) == events


def _required(*terms: list[dict[str, Any]], kind: str = "matchExpressions") -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{kind: t} for t in terms]}}}  # fmt: skip


def test_required_node_affinity_is_placed_by(api: FakeKubeApi) -> None:
    api.put_node(node_object("zone-b", "8", "32Gi", labels={"zone": "b", "disk": "ssd"}))
    api.put_node(node_object("zone-c", "8", "32Gi", labels={"zone": "c"}))
    state = _snapshot(api)
    cases: dict[str, tuple[list[dict[str, Any]], str, str]] = {
        "in": ([{"key": "zone", "operator": "In", "values": ["b", "x"]}], "matchExpressions", "zone-b"),
        "not-in": ([{"key": "zone", "operator": "NotIn", "values": ["b"]}, {"key": "zone", "operator": "Exists"}],
                   "matchExpressions", "zone-c"),
        "no-disk": ([{"key": "disk", "operator": "DoesNotExist"}, {"key": "zone", "operator": "Exists"}],
                    "matchExpressions", "zone-c"),
        "by-name": ([{"key": "metadata.name", "operator": "In", "values": ["zone-c"]}], "matchFields", "zone-c"),
    }  # fmt: skip
    for name, (exprs, kind, node) in cases.items():
        p = gpu_pod(name, 0)
        p["spec"]["affinity"] = _required(exprs, kind=kind)
        [d] = place_batch([pending_of(p)], state.snapshot, BINPACK)
        assert isinstance(d, Bind) and d.allocation.node == node, name


def test_node_affinity_corral_cannot_place_by_is_named(api: FakeKubeApi) -> None:
    two = gpu_pod("two-terms", 0)
    two["spec"]["affinity"] = _required([{"key": "zone", "operator": "In", "values": ["b"]}],
                                        [{"key": "zone", "operator": "In", "values": ["c"]}])  # fmt: skip
    gt = gpu_pod("gt", 0)
    gt["spec"]["affinity"] = _required([{"key": "cores", "operator": "Gt", "values": ["8"]}])
    where = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    assert pending_of(two).error == (
        f"pod default/two-terms cannot be scheduled: {where}: 2 terms (any of which may match): corral's scheduler "
        "takes one"
    )
    assert pending_of(gt).error == (
        f"pod default/gt cannot be scheduled: {where}[0].matchExpressions[0].operator: 'Gt': corral's scheduler takes "
        "In, NotIn, Exists, DoesNotExist"
    )
