"""The extender with `--workload auto`: it learns its target workload from the pods it filters, decides with it,
and says which workload it uses (/status, /metrics, a log line)."""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from corral.cli.main import app
from corral.k8s.cli import load_workload
from corral.k8s.extender import Extender, create_app
from corral.k8s.fake import pod_object
from corral.model.errors import InvalidRequest
from corral.model.resources import Request
from corral.placement import PlacementConfig, place
from corral.placement.learned import LearnerConfig, WorkloadLearner
from corral.placement.workload import TargetWorkload
from tests.k8s.conftest import Cluster, Served, small

ALL = ["gpu-a", "gpu-b", "gpu-t4", "cpu-1"]
QUICK = LearnerConfig(half_life_pods=math.inf, min_pods=4, check_pods=2, min_change=0.0)


def gpu_pod(name: str, gpus: str, cpu: str = "2") -> dict[str, Any]:
    return pod_object(name, [{"name": "c", "image": "x", "resources": {
        "limits": {"corral.dev/gpu": gpus}, "requests": {"cpu": cpu, "memory": "1Gi"}}}])  # fmt: skip


def learning(config: LearnerConfig = QUICK, policy: str = "fgd-priced") -> Cluster:
    c = small()
    c.extender = Extender(c.state, c.api, PlacementConfig(policy=policy), learner=WorkloadLearner(config))
    return c


def test_the_extender_learns_from_filtered_pods_once_per_uid(caplog: pytest.LogCaptureFixture) -> None:
    c = learning()
    ext = c.extender
    assert ext.config.workload is None and ext.workload_source == "default"
    one = gpu_pod("one", "1")
    for _ in range(5):  # kube-scheduler retries an unschedulable pod: it counts once
        ext.filter({"Pod": one, "NodeNames": ALL})
    assert ext.learner is not None and ext.learner.pods == 1
    assert ext.config.workload is None  # below the minimum sample: the engine's generic workload
    with caplog.at_level(logging.INFO, logger="corral.k8s.extender"):
        for i in range(3):
            ext.filter({"Pod": gpu_pod(f"two-{i}", "2", cpu="8"), "NodeNames": ALL})
    w = ext.config.workload
    assert w is not None and ext.workload_source == "learned"
    assert {(t.gpu_count, t.cpu_milli, t.probability) for t in w.types} == {(1, 2000, 0.25), (2, 8000, 0.75)}
    assert "workload: learned: 2 typical types, 0 rare; top: 2x1000m GPU + 8000m CPU: 75.0 %" in caplog.text


def test_decisions_use_the_learned_workload() -> None:
    c = learning()
    ext = c.extender
    for i in range(4):
        ext.filter({"Pod": gpu_pod(f"p{i}", "1"), "NodeNames": ALL})
    w = ext.config.workload
    assert w is not None
    p = gpu_pod("next", "1")
    v = ext.verdict(p)
    s = c.state.snapshot
    assert s is not None
    expected = place(s, v.request, dataclasses.replace(ext.config, top_scores=len(s), workload=w))
    assert v.allocation == expected.allocation
    assert s.memo.get(("workload", w.key)) is not None  # fgd-priced compiled the learned workload, not the default


def test_status_and_metrics_name_the_workload_in_use() -> None:
    c = learning()
    with Served(create_app(c.extender)) as url:
        status = httpx.get(f"{url}/status", timeout=10).json()["workload"]
        assert status["source"] == "default"
        assert status["learner"]["source"] == "default (learning)" and status["learner"]["min_pods"] == 4
        for i in range(4):
            body = {"Pod": gpu_pod(f"p{i}", "1"), "NodeNames": ALL}
            assert httpx.post(f"{url}/filter", json=body, timeout=10).status_code == 200
        status = httpx.get(f"{url}/status", timeout=10).json()["workload"]
        assert status["source"] == "learned" and status["types"] == 1
        assert status["learner"]["pods_seen"] == 4 and status["learner"]["rebuilds"] == 1
        assert status["learner"]["top"] == ["1x1000m GPU + 2000m CPU: 100.0 %"]
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert 'corral_extender_workload_source{source="learned"} 1.0' in metrics
    assert 'corral_extender_workload_source{source="default"} 0.0' in metrics
    assert "corral_extender_workload_pods_seen 4.0" in metrics
    assert "corral_extender_workload_rebuilds 1.0" in metrics
    assert "corral_extender_workload_types 1.0" in metrics


def test_a_given_workload_is_kept_and_says_so() -> None:
    given = TargetWorkload.from_requests(
        [Request(cpu_milli=1000, gpu_count=1, gpu_milli=500), Request(cpu_milli=8000, gpu_count=4, gpu_milli=1000)]
    )
    c = small()
    ext = Extender(c.state, c.api, PlacementConfig(policy="fgd", workload=given))
    ext.filter({"Pod": gpu_pod("p", "1"), "NodeNames": ALL})
    assert ext.config.workload is given and ext.workload_source == "given"
    assert ext.workload_status() == {"source": "given", "types": len(given.types), "tail": 0}


def test_workload_flag(tmp_path: Path) -> None:
    assert load_workload("auto") is None and load_workload("default") is None
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
                    "a,4000,1024,1,500,\nb,4000,1024,1,500,\nc,8000,1024,2,1000,V100M32\n")  # fmt: skip
    w = load_workload(str(pods))
    assert w is not None
    assert [(t.cpu_milli, t.gpu_milli, t.gpu_count, t.models) for t in w.types] == [
        (4000, 500, 1, None), (8000, 1000, 2, frozenset({"V100M32"}))
    ]  # fmt: skip
    with pytest.raises(InvalidRequest, match="--workload: expected auto, default or a pod list file"):
        load_workload("learned")
    bad = tmp_path / "bad.csv"
    bad.write_text("name,cpu_milli\n")
    with pytest.raises(InvalidRequest, match=r"^--workload: .*bad\.csv"):
        load_workload(str(bad))
    r = CliRunner().invoke(app, ["k8s", "extender", "--workload", "nope"])
    assert r.exit_code == 2
    assert "error: --workload: expected auto, default or a pod list file; 'nope' is none of them" in r.output


def test_pods_the_cluster_cannot_serve_are_not_learned() -> None:
    """Pods asking for a GPU model no node has, or more GPUs than any node, are not counted (their types would
    only dilute the others), and the engine keeps deciding for everyone else."""
    c = learning(LearnerConfig(half_life_pods=math.inf, min_pods=3, check_pods=1, min_change=0.0))
    ext = c.extender
    odd = gpu_pod("odd-model", "1")
    odd["metadata"]["annotations"]["corral.dev/gpu-model"] = "Z9000"
    assert ext.filter({"Pod": odd, "NodeNames": ALL})["NodeNames"] == []
    assert ext.filter({"Pod": gpu_pod("many", "8"), "NodeNames": ALL})["NodeNames"] == []  # the most is 4
    for i in range(3):
        ext.filter({"Pod": gpu_pod(f"p{i}", "1"), "NodeNames": ALL})
    assert ext.learner is not None and ext.learner.pods == 3
    w = ext.config.workload
    assert w is not None and [(t.gpu_count, t.models, t.probability) for t in (*w.types, *w.tail)] == [(1, None, 1.0)]
    assert ext.filter({"Pod": gpu_pod("after", "2"), "NodeNames": ALL})["NodeNames"] == ["gpu-a", "gpu-b"]
