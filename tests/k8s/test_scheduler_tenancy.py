"""corral k8s scheduler with a queues file (issue 25 item 2): in-process tests of the tenancy face.

The pure round (`plan_pods`: pods and the books in, Bind | Wait out) on books read from corral.k8s.fake's
FakeKubeApi, and the Scheduler's loop on it for what a user sees (condition, /explain, /metrics, the CLI).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from corral.k8s.cli import app, explain_text
from corral.k8s.fake import FakeKubeApi, pod_object
from corral.k8s.scheduler.batch import Bind, Pending, Wait
from corral.k8s.scheduler.core import Scheduler, pending_of
from corral.k8s.scheduler.gang import POD_GROUP_API, POD_GROUP_LABEL, GangInfo, GangRef
from corral.k8s.scheduler.http import answer
from corral.k8s.scheduler.tenancy import (
    TIME_LIMIT_ANNOTATION,
    Bound,
    BoundRequests,
    Evictions,
    Face,
    NoEvictions,
    plan_pods,
    pod_words,
    queue_for,
    started_at,
    victims_of,
)
from corral.k8s.state import ClusterState, Informer
from corral.model.resources import Allocation
from corral.placement import PlacementConfig
from corral.tenancy.config import QueueConfigError, parse_queues
from corral.tenancy.plan import Preemption
from tests.k8s.conftest import gpu_node

BINPACK = PlacementConfig(policy="binpack")
NOW = 1_800_000_000.0


def wait_for(what: str, check: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def gpu_pod(name: str, gpus: int = 1, namespace: str = "default", labels: Mapping[str, str] | None = None,
            limit: str | None = None, created: str = "2027-01-01T00:00:00Z",
            priority: int = 0) -> dict[str, Any]:  # fmt: skip
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    ann = {TIME_LIMIT_ANNOTATION: limit} if limit else {}
    p = pod_object(name, [{"name": "main", "resources": {"requests": {"cpu": "100m"}, "limits": limits}}],
                   namespace=namespace, annotations=ann)  # fmt: skip
    p["spec"]["schedulerName"] = "corral"
    p["spec"]["priority"] = priority
    p["metadata"]["labels"] = dict(labels or {})
    p["metadata"]["creationTimestamp"] = created
    return p


class Cluster:
    """Books from a FakeKubeApi, the face, and the bound pods of this scheduler: a round is `plan`."""

    def __init__(self, queues: str, nodes: Sequence[tuple[str, int]] = (("n1", 4),)) -> None:
        self.api = FakeKubeApi()
        for name, gpus in nodes:
            self.api.put_node(gpu_node(name, gpus))
        self.state = ClusterState()
        Informer(self.api, self.state).sync_once()
        self.config = parse_queues(queues, "queues.toml")
        self.face = Face.of(self.config, BINPACK)
        self.bound: dict[str, Bound] = {}

    def pending(self, obj: dict[str, Any]) -> Pending:
        from corral.k8s.scheduler.gang import gang_of

        p = pending_of(obj, self.state.gpu_memory)
        ref = gang_of(obj)
        meta = obj["metadata"]
        from corral.k8s.scheduler.tenancy import created_at, time_limit_of

        return dataclasses.replace(p, queue=queue_for(obj, self.config, self.face.by_namespace),
                                   namespace=meta["namespace"], created=created_at(obj),
                                   time_limit_s=time_limit_of(obj), gang=ref.key if ref else "")  # fmt: skip

    def plan(self, pods: Sequence[dict[str, Any]], now: float = NOW, evictions: Evictions | None = None,
             commit: bool = True, gangs: Mapping[str, GangInfo] | None = None) -> dict[str, Bind | Wait]:  # fmt: skip
        """One round; its Binds are bound at once (the books and `bound`), as the scheduler does."""
        pend = [self.pending(p) for p in pods]
        by_key = {p["metadata"]["uid"]: p for p in pods}
        names = {p.key: p.name for p in pend}
        with self.state.lock:
            r = plan_pods(self.face, pend, self.state.snapshot, self.bound, now, gangs, evictions, names)
        self.last = r
        if r.plan is not None and evictions is not None:  # carried out as the scheduler does
            for pr in r.plan.preemptions:
                evictions.start(pr, victims_of(pr, self.bound))
        out: dict[str, Bind | Wait] = {}
        for d in r.decisions:
            out[d.pod.name.split("/")[1]] = d
            hold = r.holds.get(d.pod.key)
            if isinstance(d, Wait) and hold is not None and hold.holds != "its own pod spec or its PodGroup":
                assert d.reason.startswith(f"{hold.text()}: "), (hold, d.reason)  # every pod's words, however made
            if isinstance(d, Bind) and commit:
                obj = by_key[d.pod.key]
                meta = obj["metadata"]
                self.bound[d.pod.key] = Bound(meta["namespace"], meta["name"], d.pod.queue, now, d.pod.time_limit_s)
        return out

    def bind(self, obj: dict[str, Any], start: float, queue: str | None = None) -> None:
        """A pod bound earlier (its round is not under test): on the books, started at `start`."""
        d = self.plan([obj], now=start)
        assert isinstance(d[obj["metadata"]["name"]], Bind), d


def binds(out: Mapping[str, Bind | Wait]) -> list[str]:
    return sorted(k for k, d in out.items() if isinstance(d, Bind))


def reason(out: Mapping[str, Bind | Wait], name: str) -> str:
    d = out[name]
    assert isinstance(d, Wait), f"{name} was bound"
    return d.reason


# ------------------------------------------------------------------------------------------------ queues
TWO = """
min_runtime = "0s"
[queues.team-a]
namespaces = ["ns-a"]
guarantee = { gpus = 2 }
[queues.team-b]
namespaces = ["ns-b"]
guarantee = { gpus = 2 }
[queues.small]
limit = { gpus = 1 }
"""


def test_no_evictions_is_the_inert_seam() -> None:
    e: Evictions = NoEvictions()
    assert not e.busy()
    assert e.stopping() == frozenset() and e.protected() == frozenset()
    assert dict(e.held()) == {}
    e.bound("uid")


def test_a_pods_queue_is_its_label_then_its_namespaces_queue_then_a_queue_of_its_name_then_the_default() -> None:
    c = parse_queues(TWO + "\n[queues.ns-c]\n", "q.toml")
    m = {"ns-a": "team-a", "ns-b": "team-b"}
    assert queue_for(gpu_pod("p", namespace="ns-a"), c, m) == "team-a"
    assert queue_for(gpu_pod("p", namespace="ns-c"), c, m) == "ns-c"
    assert queue_for(gpu_pod("p", namespace="other"), c, m) == "default"
    for label in ("corral.dev/queue", "kueue.x-k8s.io/queue-name", "kai.scheduler/queue"):
        assert queue_for(gpu_pod("p", namespace="ns-a", labels={label: "small"}), c, m) == "small"


def test_a_bad_namespaces_entry_is_refused_naming_the_key() -> None:
    with pytest.raises(QueueConfigError, match=r"q.toml: queues.a.namespaces: a namespace is 1-63 lower-case"):
        parse_queues('[queues.a]\nnamespaces = ["Team_A"]\n', "q.toml")
    with pytest.raises(QueueConfigError, match=r"queues.b.namespaces: namespace 'x' is already mapped to queue 'a'"):
        parse_queues('[queues.a]\nnamespaces = ["x"]\n[queues.b]\nnamespaces = ["x"]\n', "q.toml")
    with pytest.raises(QueueConfigError, match=r"queues.a.namespaces: must be a list of namespace names"):
        parse_queues('[queues.a]\nnamespaces = "x"\n', "q.toml")


def test_the_scheduler_refuses_a_bad_queues_file_at_start_up_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "queues.toml"
    bad.write_text("[queues.a]\nlimit = { gpus = -1 }\n")
    r = CliRunner().invoke(app, ["scheduler", "--queues", str(bad), "--listen", ""])
    assert r.exit_code != 0
    assert f"{bad}: queues.a.limit.gpus: must not be negative, got -1" in r.output
    r = CliRunner().invoke(app, ["scheduler", "--queues", str(tmp_path / "none.toml"), "--listen", ""])
    assert r.exit_code != 0 and f"{tmp_path / 'none.toml'}: cannot read the queues file" in r.output


def test_a_queue_limit_holds_pods_back_and_says_so() -> None:
    c = Cluster(TWO)
    pods = [gpu_pod(f"s{i}", labels={"corral.dev/queue": "small"}) for i in range(2)]
    out = c.plan(pods)
    assert binds(out) == ["s0"]
    text = reason(out, "s1")
    assert text == ("queue small, position 1 of 1; held by limit: queue 'small' is at its limit of 1 GPU (1 GPU in "
                    "use, the pod asks for 1 GPU)")  # fmt: skip


def test_kueue_and_kai_queue_labels_are_enforced_as_corrals() -> None:
    c = Cluster(TWO)
    out = c.plan([gpu_pod("k", labels={"kueue.x-k8s.io/queue-name": "small"}),
                  gpu_pod("i", labels={"kai.scheduler/queue": "small"}, created="2027-01-01T00:00:01Z")])  # fmt: skip
    assert binds(out) == ["k"]
    assert "queue small" in reason(out, "i") and "held by limit" in reason(out, "i")


def test_a_pod_naming_a_queue_the_file_does_not_have_waits_saying_so() -> None:
    c = Cluster(TWO)
    out = c.plan([gpu_pod("x", labels={"corral.dev/queue": "nope"})])
    assert reason(out, "x") == (
        "pod default/x: queue 'nope' is not in the queues file queues.toml (queues: default, small, team-a, team-b)"
    )


def test_a_pod_above_its_queues_max_priority_waits_saying_so() -> None:
    c = Cluster("[queues.a]\nmax_priority = 10\nnamespaces = ['default']\n")
    out = c.plan([gpu_pod("hi", priority=50)])
    assert reason(out, "hi") == "pod default/hi: priority 50 is above queue a's max_priority 10"


def test_borrowing_stops_at_the_borrow_limit() -> None:
    c = Cluster("[queues.a]\nnamespaces = ['default']\nguarantee = { gpus = 1 }\nborrow_limit = { gpus = 1 }\n"
                "[queues.b]\nguarantee = { gpus = 2 }\n")  # fmt: skip
    out = c.plan([gpu_pod(f"p{i}", created=f"2027-01-01T00:00:0{i}Z") for i in range(3)])
    assert binds(out) == ["p0", "p1"]  # its guarantee and one borrowed; the rest of b's guarantee is not lent
    assert reason(out, "p2") == (
        "queue a, position 1 of 1; held by borrow limit: borrowing: queue 'a' may hold at most 2 GPUs (its guarantee "
        "plus its borrow limit); 2 GPUs in use, the pod asks for 1 GPU"
    )


def test_fair_share_orders_the_queue_that_used_less_first() -> None:
    c = Cluster(TWO, nodes=(("n1", 4),))
    for i in range(3):  # team-a has held three GPUs for an hour
        c.bind(gpu_pod(f"old{i}", namespace="ns-a"), NOW - 3600)
    # a's pod is older, but b has used nothing: b's goes first and takes the last GPU
    out = c.plan([gpu_pod("a1", namespace="ns-a", created="2027-01-01T00:00:00Z"),
                  gpu_pod("b1", namespace="ns-b", created="2027-01-01T00:10:00Z")])  # fmt: skip
    assert binds(out) == ["b1"]
    # (and a, above its guarantee, may not borrow the GPU b's guarantee keeps while b has work)
    assert reason(out, "a1").startswith("queue team-a, position 1 of 1; held by borrow limit: borrowing: queue "
                                        "'team-a' is above its guarantee")  # fmt: skip


def test_a_big_pod_gets_a_reservation_and_only_pods_that_end_before_it_backfill() -> None:
    c = Cluster("[queues.q]\nnamespaces = ['default']\n")
    for i in range(3):
        c.bind(gpu_pod(f"run{i}", limit="1h"), NOW - 600)  # end at NOW + 3000
    out = c.plan([gpu_pod("big", 4, created="2027-01-01T00:00:00Z"),
                  gpu_pod("long", 1, limit="2h", created="2027-01-01T00:00:01Z"),
                  gpu_pod("short", 1, limit="10m", created="2027-01-01T00:00:02Z")])  # fmt: skip
    assert binds(out) == ["short"]  # ends before the reservation: backfilled
    big = reason(out, "big")
    assert big.startswith("queue q, position 1 of 2; held by no room; estimated start ")
    assert time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(NOW + 3000)) in big
    assert reason(out, "long").startswith("queue q, position 2 of 2; held by the reservation of pod default/big: "
                                          "would delay the reservation of pod default/big")  # fmt: skip
    (r,) = c.last.plan.reservations if c.last.plan else ()
    assert r.start == NOW + 3000


def test_quota_that_allows_a_pod_no_node_fits_admits_nothing_kueue_4329() -> None:
    c = Cluster("[queues.q]\nnamespaces = ['default']\nguarantee = { gpus = 8 }\n", nodes=(("n1", 2), ("n2", 2)))
    out = c.plan([gpu_pod("wide", 4)])
    text = reason(out, "wide")
    assert text == "queue q, position 1 of 1; held by no room: 0/2 nodes fit: 2 fewer than 4 eligible GPUs"
    assert c.state.snapshot is not None and not c.state.snapshot.allocations  # nothing charged, nothing bound


def test_two_queues_never_double_book_a_node_in_one_round_kueue_14570() -> None:
    c = Cluster(TWO, nodes=(("n1", 2), ("n2", 2)))
    pods = [gpu_pod(f"{ns}-{i}", 2 if i == 0 else 1, namespace=ns, created=f"2027-01-01T00:00:0{i}Z")
            for ns in ("ns-a", "ns-b") for i in range(3)]  # fmt: skip
    out = c.plan(pods)
    bound = [d for d in out.values() if isinstance(d, Bind)]
    grants = [(d.allocation.node, g.index) for d in bound for g in d.allocation.gpus]
    assert len(grants) == len(set(grants)) == 4  # every GPU once, none twice
    assert sum(len(d.allocation.gpus) for d in bound) == 4


def test_a_gang_goes_whole_or_not_at_all_through_the_queues() -> None:
    c = Cluster("[queues.q]\nnamespaces = ['default']\n", nodes=(("n1", 2), ("n2", 2)))
    ref = GangRef(POD_GROUP_API, "default", "g")
    pods = [gpu_pod(f"m{i}", labels={POD_GROUP_LABEL: "g"}, created=f"2027-01-01T00:00:0{i}Z") for i in range(5)]
    out = c.plan(pods, gangs={"default/g": GangInfo(ref, 5)})
    assert binds(out) == []  # 5 GPUs asked, 4 there: none bound
    assert reason(out, "m0") == ("queue q, position 1 of 5; held by gang default/g: 4 of 5 instances fit (PodGroup "
                                 "default/g: all its members start or none); instance 5: 0/2 nodes fit: 2 "
                                 "insufficient GPU (need 1 whole GPU)")  # fmt: skip
    assert c.state.snapshot is not None and not c.state.snapshot.allocations
    out = c.plan(pods[:4], gangs={"default/g": GangInfo(ref, 4)})
    assert binds(out) == ["m0", "m1", "m2", "m3"]
    pending_gang = c.plan([gpu_pod("late", labels={POD_GROUP_LABEL: "h"})], gangs={})
    assert reason(pending_gang, "late") == "gang default/h: its PodGroup is not known yet"


class Recording(NoEvictions):
    def __init__(self) -> None:
        self.started: list[tuple[Preemption, list[tuple[str, str, str]]]] = []
        self.holds: dict[str, Allocation] = {}

    def start(self, preemption: Preemption, victims: Sequence[tuple[str, str, str]]) -> None:
        self.started.append((preemption, list(victims)))

    def held(self) -> Mapping[str, Allocation]:
        return self.holds


def test_a_queue_below_its_guarantee_preempts_a_borrower_through_the_evictions() -> None:
    c = Cluster(TWO)
    for i in range(4):  # team-a borrows team-b's half
        c.bind(gpu_pod(f"a{i}", namespace="ns-a"), NOW - 600 + i)
    ev = Recording()
    out = c.plan([gpu_pod("b", 2, namespace="ns-b")], evictions=ev)
    assert reason(out, "b") == ("queue team-b, position 1 of 1; held by its victims to stop (preempting): 0/1 nodes "
                                "fit: 1 insufficient GPU (need 2 whole GPUs)")  # fmt: skip
    ((p, victims),) = ev.started
    assert p.preemptor == "uid-ns-b-b"
    assert sorted(v[2] for v in victims) == ["a2", "a3"]  # the latest started: the cheapest borrowers
    assert {v[1] for v in victims} == {"ns-a"}
    # The victims gone, the capacity held for b is b's: bound there, and nobody else's
    for v in p.victims:
        with c.state.lock:
            assert c.state.snapshot is not None
            c.state.snapshot.release(v)
        del c.bound[v]
    ev.holds = {p.preemptor: p.allocation}
    newer = gpu_pod("a-new", namespace="ns-a", created="2026-01-01T00:00:00Z")
    out = c.plan([newer, gpu_pod("b", 2, namespace="ns-b")], evictions=ev)
    b = out["b"]
    assert isinstance(b, Bind) and b.allocation.gpus == p.allocation.gpus
    assert isinstance(out["a-new"], Wait)


def test_while_victims_are_still_stopping_the_preemptor_waits_and_nothing_else_takes_its_room() -> None:
    c = Cluster(TWO)
    for i in range(4):
        c.bind(gpu_pod(f"a{i}", namespace="ns-a"), NOW - 600 + i)
    ev = Recording()
    c.plan([gpu_pod("b", 2, namespace="ns-b")], evictions=ev)
    ((p, _),) = ev.started
    ev.holds = {p.preemptor: p.allocation}
    out = c.plan([gpu_pod("b", 2, namespace="ns-b")], evictions=ev)
    assert reason(out, "b") == "preempting: waiting for its victims to stop"


def test_a_preemptor_held_by_the_minimum_runtime_is_told_the_pods_by_name() -> None:
    c = Cluster(TWO.replace('min_runtime = "0s"', 'min_runtime = "1h"'))
    for i in range(4):  # team-a borrows team-b's half, all started within the hour
        c.bind(gpu_pod(f"a{i}", namespace="ns-a"), NOW - 600 + i)
    ev = Recording()
    out = c.plan([gpu_pod("b", 2, namespace="ns-b")], evictions=ev)
    assert ev.started == []
    said = reason(out, "b")
    assert "; it may preempt pods ns-a/a2, ns-a/a3 from " in said, said  # not "jobs uid-ns-a-a2, uid-ns-a-a3"
    assert "uid-" not in said and " job" not in said
    assert said.endswith("when they have run the minimum runtime of 1h (docs/preemption.md)"), said


def test_the_plans_words_name_pods_and_podgroups() -> None:
    def name_of(key: str) -> str:
        return {"u1": "ns/a", "u2": "ns/b"}.get(key, key)

    said = pod_words("it may preempt job u1 from 08:00, when", "", name_of)
    assert said == "it may preempt pod ns/a from 08:00, when"
    assert (pod_words("would delay the reservation of job u2", "", name_of)
            == "would delay the reservation of pod ns/b")  # fmt: skip
    assert (pod_words("gang: 2 of 3 instances queued; they start together once all are", "ns/g", name_of)
            == "2 of 3 instances queued; they start together once all are")  # fmt: skip
    assert (pod_words("gang: instance job u1: GPU count must be >= 0", "ns/g", name_of)
            == "instance pod ns/a: GPU count must be >= 0")  # fmt: skip


def test_a_restart_starts_bound_pods_at_their_start_time() -> None:
    pod = gpu_pod("p")
    pod["status"] = {"phase": "Running", "startTime": "2027-01-15T08:00:00Z",
                     "conditions": [{"type": "PodScheduled", "status": "True",
                                     "lastTransitionTime": "2027-01-15T07:59:00Z"}]}  # fmt: skip
    assert started_at(pod) == NOW  # 2027-01-15T08:00:00Z
    del pod["status"]["startTime"]
    assert started_at(pod) == NOW - 60  # PodScheduled's transition time, when it has not started yet
    del pod["status"]["conditions"]
    assert started_at(pod) is None  # (the scheduler then counts it from when it saw it)


# ------------------------------------------------------------------------------------------------ the scheduler
@pytest.fixture
def api() -> FakeKubeApi:
    api = FakeKubeApi()
    api.put_node(gpu_node("n1", 2))
    return api


@pytest.fixture
def run(api: FakeKubeApi) -> Iterator[Callable[..., Scheduler]]:
    started: list[Scheduler] = []

    def start(**kw: Any) -> Scheduler:
        s = Scheduler(api, BINPACK, batch_window=0.001, **kw)
        s.start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


def test_the_scheduler_explains_queue_position_hold_and_metrics(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    s = run(queues=parse_queues(TWO, "queues.toml"))
    api.put_pod(gpu_pod("s0", labels={"corral.dev/queue": "small"}))
    wait_for("s0 bound", lambda: bool(api.pods[("default", "s0")]["spec"].get("nodeName")))
    api.put_pod(gpu_pod("s1", labels={"corral.dev/queue": "small"}))
    wait_for("s1's reason", lambda: s.explain("default/s1").get("state") == "pending")
    e = s.explain("default/s1")
    assert e["queue"] == "small" and e["position"] == 1 and e["of"] == 1 and e["held_by"] == "limit"
    assert e["reason"].startswith("queue small, position 1 of 1; held by limit: ")
    wait_for("the condition", lambda: any(
        c.get("type") == "PodScheduled" for c in api.pods[("default", "s1")].get("status", {}).get("conditions", [])
    ))  # fmt: skip
    (cond,) = [c for c in api.pods[("default", "s1")]["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert cond["message"].startswith("queue small, position 1 of 1; held by limit: ")
    status, _, body = answer(s, "/metrics")
    text = body.decode()
    assert status == 200
    assert 'corral_scheduler_queue_pending_pods{queue="small"} 1.0' in text
    assert 'corral_scheduler_queue_pending_pods{queue="team-a"} 0.0' in text
    assert 'corral_scheduler_queue_holding{queue="small",resource="gpu_milli"} 1000.0' in text
    assert 'corral_scheduler_queue_share{queue="small"}' in text
    assert "corral_scheduler_preemptions_total" in text


def test_corral_k8s_explain_shows_the_queue_position_hold_and_estimated_start_from_the_condition() -> None:
    pod = gpu_pod("big", 4, namespace="ns-b")
    message = ("queue team-b, position 1 of 3; held by no room; estimated start 2027-01-15 08:50:00 UTC: 0/1 nodes "
               "fit: 1 insufficient GPU (need 4 whole GPUs)")  # fmt: skip
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                    "message": message, "lastTransitionTime": "2027-01-15T08:00:00Z"}]  # fmt: skip
    assert explain_text(pod, []) == (f"ns-b/big: pending (Unschedulable, since 2027-01-15T08:00:00Z)\n  {message}")


def test_with_queues_a_pod_is_told_again_only_when_its_words_change(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    s = run(queues=parse_queues(TWO, "queues.toml"))
    api.put_pod(gpu_pod("s0", labels={"corral.dev/queue": "small"}))
    wait_for("s0 bound", lambda: bool(api.pods[("default", "s0")]["spec"].get("nodeName")))
    api.put_pod(gpu_pod("s1", labels={"corral.dev/queue": "small"}))

    def told(name: str) -> int:
        return sum(1 for _, e in list(api.events) if e["involvedObject"]["name"] == name)

    wait_for("s1's event", lambda: told("s1") == 1)
    for i in range(3):  # rounds in which s1's words stay the same
        name = f"x{i}"
        api.put_pod(gpu_pod(name, gpus=0, namespace="ns-a"))

        def bound(name: str = name) -> bool:
            return bool(api.pods[("ns-a", name)]["spec"].get("nodeName"))

        wait_for(f"{name} bound", bound)
    assert s.explain("default/s1")["held_by"] == "limit"
    assert told("s1") == 1


def test_after_a_restart_fair_share_is_rebuilt_from_the_bound_pods_start_times(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    # Before the restart: ns-a's pod has run for an hour on one GPU (its status.startTime), the other GPU is free.
    held = gpu_pod("old", namespace="ns-a")
    held["spec"]["nodeName"] = "n1"
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
    held["status"] = {"phase": "Running", "startTime": started}
    api.put_pod(held)
    # ns-a's pending pod is older than ns-b's; ns-b has used nothing: after the restart b goes first
    api.put_pod(gpu_pod("a1", namespace="ns-a", created="2027-01-01T00:00:00Z"))
    api.put_pod(gpu_pod("b1", namespace="ns-b", created="2027-01-01T00:10:00Z"))
    fair = "min_runtime = '0s'\n[queues.team-a]\nnamespaces = ['ns-a']\n[queues.team-b]\nnamespaces = ['ns-b']\n"
    s = run(queues=parse_queues(fair, "queues.toml"))
    wait_for("b1 bound", lambda: bool(api.pods[("ns-b", "b1")]["spec"].get("nodeName")))
    assert not api.pods[("ns-a", "a1")]["spec"].get("nodeName")
    assert s.explain("ns-a/a1")["queue"] == "team-a"
    assert s.tenancy is not None and s.tenancy.tenancy is not None
    rows = {r["queue"]: r for r in s.tenancy.tenancy.shares(list(s._running.values()), time.time())["accounts"]
            if r["user"] is None}  # fmt: skip
    assert rows["team-a"]["usage"]["gpu_milli"] == pytest.approx(1000 * 3600, rel=0.01)  # an hour of one GPU


def test_a_pod_gone_while_the_watch_was_down_leaves_the_queues_at_the_next_list(
    api: FakeKubeApi, run: Callable[..., Scheduler]
) -> None:
    s = run(queues=parse_queues(TWO, "queues.toml"))
    api.put_pod(gpu_pod("p", namespace="ns-a"))
    wait_for("p bound", lambda: bool(api.pods[("ns-a", "p")]["spec"].get("nodeName")))
    api.put_pod(gpu_pod("nudge", gpus=0))  # one more round, which counts p as running
    wait_for("nudge bound", lambda: bool(api.pods[("default", "nudge")]["spec"].get("nodeName")))
    assert "uid-ns-a-p" in s._bound and "uid-ns-a-p" in s._running
    kept = s.tenancy.bound_round if s.tenancy is not None else None
    assert kept is not None and "uid-ns-a-p" in kept.running_by
    s.listed("pods", [])  # a relist after the watch was down: p is gone
    assert "uid-ns-a-p" not in s._bound and "uid-ns-a-p" not in s._running
    assert "uid-ns-a-p" in kept.running_by  # (copied before the change: what the face kept stays as it was)
    assert s.tenancy is not None and s.tenancy.ledger.accounts() == [("queue", "team-a"), ("user", "team-a", "ns-a")]


def test_pods_created_in_one_second_are_ordered_as_they_came_not_by_uid() -> None:
    api = FakeKubeApi()
    api.put_node(gpu_node("n1", 4))
    s = Scheduler(api, BINPACK, batch_window=0.001, queues=parse_queues("[queues.q]\nnamespaces = ['default']\n"))
    s.start()
    try:
        for i in range(3):
            api.put_pod(gpu_pod(f"run{i}", limit="1h"))
        wait_for("runs bound", lambda: all(api.pods[("default", f"run{i}")]["spec"].get("nodeName") for i in range(3)))
        second = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        api.put_pod(gpu_pod("zbig", 4, created=second))  # the same creationTimestamp as the next; its UID sorts after
        wait_for("zbig's reservation", lambda: "estimated start" in s.explain("default/zbig").get("reason", ""))
        api.put_pod(gpu_pod("along", 1, limit="2h", created=second))
        wait_for("along's words", lambda: s.explain("default/along").get("state") in ("pending", "bound"))
        assert s.explain("default/along")["held_by"] == "the reservation of pod default/zbig"
    finally:
        s.close()


def test_a_round_over_the_same_bound_pods_reuses_their_part_and_decides_the_same() -> None:
    """Where the bound pods and their grants are as last round (a full cluster whose queue grows: nothing starts),
    the round takes their Running records, ends and wake from what the last one kept: the same words, plan,
    running pods, ends (pods without a time limit included) and wake as a face that walks them all."""
    import benchmarks.k8s_round as kr
    from corral.k8s.scheduler import tenancy as face_mod
    from corral.tenancy.reservation import expected_end

    state, bound, pods, face = kr.build(40, 60)
    later = kr.NOW + 200.0
    for i, k in enumerate(list(bound)):  # without a time limit, past their end by `later`, in their minimum runtime
        b = bound[k]
        limit = None if i % 5 == 0 else 1800.0 if i % 3 == 0 else b.time_limit_s
        bound[k] = dataclasses.replace(b, time_limit_s=limit, started_at=later - 100 if i % 7 == 0 else b.started_at)
        if i % 11 == 0:  # being stopped: its minimum runtime wakes nothing
            bound[k] = dataclasses.replace(bound[k], started_at=later - 200, stopping=True)
    s = state.snapshot
    assert s is not None

    def round_at(f: Face, now: float) -> Any:
        r = plan_pods(f, pods, s, dict(bound), now, None, kr.Accepting(), None, BoundRequests(state.pods, bound))
        for d in r.decisions:  # given back: the same books next round
            if isinstance(d, Bind):
                s.release(d.allocation.request_id)
        return r

    round_at(face, kr.NOW)
    kept = face.bound_round
    assert kept is not None
    walks: list[int] = []
    real = face_mod._bound_round

    def counted(*a: Any) -> Any:
        walks.append(1)
        return real(*a)

    try:
        face_mod._bound_round = counted  # type: ignore[assignment]
        again = round_at(face, later)
        assert walks == [] and face.bound_round is kept  # (no walk: the kept part)
        fresh_face = Face.of(face.config, face.round.placement)
        fresh = round_at(fresh_face, later)
        assert walks == [1]
    finally:
        face_mod._bound_round = real
    assert [d.reason for d in again.decisions if isinstance(d, Wait)] == [
        d.reason for d in fresh.decisions if isinstance(d, Wait)]  # fmt: skip
    assert again.running == fresh.running and again.wake_at == fresh.wake_at and again.wake_at is not None
    assert again.plan is not None and fresh.plan is not None and again.plan.reservations == fresh.plan.reservations
    default = face.round.default_time_limit_s  # each pod's end and wake as the rules define them, pod by pod
    want_ends = {k: expected_end(b.started_at, b.time_limit_s, default, later) for k, b in bound.items()}
    wakes = [b.started_at + face.config.min_runtime(b.queue) for b in bound.values() if not b.stopping]
    assert kept.ends(later) == want_ends and kept.wake(later) == min(t for t in wakes if t > later)
    first = next(iter(bound))
    bound[first] = dataclasses.replace(bound[first], started_at=bound[first].started_at - 1.0)  # it changed: walked
    round_at(face, later)
    assert face.bound_round is not kept


def test_the_kept_ends_are_reused_only_while_every_end_is_ahead() -> None:
    """With every bound pod's end fixed (a time limit) and ahead, a round takes the same ends again; once `now`
    passes one, that pod's end is `now` (as expected_end says), pod by pod."""
    import benchmarks.k8s_round as kr
    from corral.tenancy.reservation import expected_end

    state, bound, pods, face = kr.build(6, 4)
    s = state.snapshot
    assert s is not None
    plan_pods(face, pods, s, dict(bound), kr.NOW, None, None, None, BoundRequests(state.pods, bound))
    kept = face.bound_round
    assert kept is not None
    first = kept.ends(kr.NOW)
    assert kept.ends(kr.NOW + 1.0) is first  # nothing passed: the same ends
    soonest = min(b.started_at + (b.time_limit_s or 0.0) for b in bound.values())
    later = soonest + 30.0
    default = face.round.default_time_limit_s
    assert kept.ends(later) == {k: expected_end(b.started_at, b.time_limit_s, default, later) for k, b in bound.items()}
    assert kept.ends(later)[min(bound, key=lambda k: bound[k].started_at)] == later


def test_the_bound_pods_walk_remakes_only_what_changed_and_gives_a_fresh_walks_part() -> None:
    """The walk of the bound pods (C-speed maps, a Python step per changed pod) gives, after pods were replaced,
    left the books, began stopping or became protected, the same Running records, ends and wake as a face that
    walks them all for the first time, and keeps the entries of the pods that did not change."""
    import benchmarks.k8s_round as kr
    from corral.k8s.scheduler import tenancy as face_mod

    state, bound, _, face = kr.build(30, 4)
    s = state.snapshot
    assert s is not None
    default = face.round.default_time_limit_s
    face_mod._bound_round(face, bound, s.allocations, frozenset(), frozenset(), None, kr.NOW, default)
    before = dict(face.runs)
    keys = list(bound)
    bound[keys[0]] = dataclasses.replace(bound[keys[0]], started_at=kr.NOW - 5.0)  # a new Bound
    bound[keys[1]] = dataclasses.replace(bound[keys[1]], time_limit_s=None)  # no time limit: its end rolls
    s.release(keys[2])  # gone from the books: no Running, no end
    grant = s.release(keys[3])
    s.allocate(dataclasses.replace(grant))  # the same grant, another object: remade
    stopping, protected = frozenset({keys[4]}), frozenset({keys[5], "not-bound"})
    later = kr.NOW + 50.0
    got = face_mod._bound_round(face, bound, s.allocations, stopping, protected, None, later, default)
    fresh = Face.of(face.config, face.round.placement)
    want = face_mod._bound_round(fresh, bound, s.allocations, stopping, protected, None, later, default)
    assert [r.id for r in got[0]] == [r.id for r in want[0]] and keys[2] not in got[1]
    assert got[0] == want[0] and got[1] == want[1] and got[2] == want[2] and got[3] == want[3]
    remade = {k for k in bound if face.runs.get(k) is not before.get(k)}
    assert remade == {keys[0], keys[1], keys[3], keys[4], keys[5]}
    assert got[1][keys[4]].stopping and not got[1][keys[5]].preemptible
