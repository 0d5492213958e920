"""Seeded random sequences of bind / rebind / delete / finish / restart / relist / concurrent binds / failed and
unanswered Bindings / late watch events against the in-memory API server (which, like kube-apiserver, answers a
second Binding with 409 and copies a Binding's annotations onto the pod): no GPU is ever over-committed or given
twice according to the API server, and once its events are delivered the extender counts exactly what the API server
says is bound (`sequences.py` describes the steps and checks)."""

from __future__ import annotations

from corral.k8s.client import JsonObj
from corral.k8s.fake import node_object
from tests.k8s.conftest import gpu_node
from tests.k8s.sequences import FakeBackend, Sequence, Stats, run_sequences

SEQUENCES = 40
STEPS = 60


def nodes() -> list[JsonObj]:
    """Small nodes, so that sequences fill them and every bind contends: 2 + 2 + 1 GPUs, and a CPU node."""
    return [gpu_node("gpu-a", 2), gpu_node("gpu-b", 2), gpu_node("gpu-c", 1, model="T4", memory_mib=46080),
            node_object("cpu-1", "32", "128Gi")]  # fmt: skip


def test_random_sequences_never_over_commit_and_the_count_follows_the_api_server() -> None:
    stats = run_sequences(nodes, range(SEQUENCES), STEPS)
    assert stats.steps == SEQUENCES * STEPS
    report = (f"{stats.over_commits} over-commits, {stats.damaged} damaged assignments, {stats.mismatches} count "
              "mismatches:\n" + "\n".join(stats.failures[:10]))  # fmt: skip
    assert (stats.over_commits, stats.damaged, stats.mismatches, stats.rebinds_granted) == (0, 0, 0, 0), report
    # The sequences did what they are for: every kind of step ran, binds were granted and refused.
    assert {"bind", "rebind", "concurrent binds", "delete", "finish", "restart", "relist", "relist older than a bind",
            "binding fails",
            "binding answer lost", "deliver events"} <= set(stats.ops)  # fmt: skip
    assert stats.bound > SEQUENCES * 5 and stats.refused > SEQUENCES


def test_the_findings_sequence_puts_no_third_whole_gpu_pod_on_a_two_gpu_node() -> None:
    """The reported sequence, step by step: bind, rebind elsewhere (409), then two more whole-GPU pods."""
    seq = Sequence(FakeBackend(nodes()), seed=0)
    first, second, third = (seq.create(kind=0) for _ in range(3))  # corral.dev/gpu: 1 each
    assert seq.bind(first, "gpu-a") == ""
    assert "already bound to gpu-a" in seq.bind(first, "gpu-b")
    seq.b.deliver(None)
    seq.restart()
    assert "already bound to gpu-a" in seq.bind(first, "gpu-a")
    answers = [seq.bind(second, "gpu-a"), seq.bind(third, "gpu-a")]
    seq.check("findings")
    seq.settle_and_compare()
    assert seq.stats.over_commits == seq.stats.damaged == seq.stats.mismatches == 0, seq.stats.failures
    assert answers[0] == "" and "does not fit on gpu-a" in answers[1]
    on_a = sorted(p["metadata"]["name"] for p in seq.b.pods() if p["spec"].get("nodeName") == "gpu-a")
    assert on_a == sorted([first, second])


def test_stats_add_up() -> None:
    a, b = Stats(sequences=1, steps=2, over_commits=1), Stats(sequences=1, steps=3)
    a.add(b)
    assert (a.sequences, a.steps, a.over_commits) == (2, 5, 1)
