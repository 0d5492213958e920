"""fgd-priced's issue-27 rule: while free CPU runs out before free GPU milli (the CPU-aware horizon is the smaller),
the GPU pods' fill gain counts every target type fully (no scarcity weights); otherwise fgd-scarcity's weights."""

from __future__ import annotations

import numpy as np

from corral.model.resources import Request
from corral.model.snapshot import ClusterSnapshot
from corral.placement import PlacementConfig
from corral.placement.context import Context
from corral.placement.filters import evaluate
from corral.placement.scarcity import horizons, scarcity_weights
from corral.placement.scores.fgd_priced import FgdPriced
from corral.placement.workload import TargetType, TargetWorkload
from tests.builders import cluster, gpus, node
from tests.placement.test_properties import normalised


class _Issue27(FgdPriced):
    name = "test-priced-issue27"
    unweighted_cpu_bound = False


def context(s: ClusterSnapshot, request: Request, workload: TargetWorkload) -> Context:
    config = PlacementConfig(policy="fgd-priced", workload=workload)
    fit = evaluate(s, request, request.effective_behavior(config.gpu_behavior), config.reserve)
    return Context(s, request, fit, workload, np.random.default_rng(0))


def workload(cpu_only_cores: int) -> TargetWorkload:
    # Mostly small shares and whole GPUs with few cores, plus pods without GPUs of `cpu_only_cores` cores.
    return normalised([
        TargetType(1000, 100, 1, None, 0.45),
        TargetType(2000, 1000, 1, None, 0.05),
        TargetType(cpu_only_cores * 1000, 0, 0, None, 0.5),
    ])  # fmt: skip


def test_no_scarcity_weights_while_cpu_runs_out_first() -> None:
    s = cluster(*(node(f"n{i}").gpus(8).cpu(64) for i in range(4)))
    wl = workload(32)  # 0.5 x 32 cores per pod: the 256 cores go long before the 32 GPUs
    h_gpu, h_cpu = horizons(s, wl)
    assert h_cpu < h_gpu
    ctx = context(s, gpus(1, 100, cpu=1000), wl)
    assert not np.all(scarcity_weights(s, wl, h_gpu) == 1.0)  # the weights would discount some type
    assert np.all(FgdPriced()._weights(ctx) == 1.0)
    assert np.array_equal(_Issue27()._weights(context(s, gpus(1, 100, cpu=1000), wl)), scarcity_weights(s, wl, h_gpu))


def test_scarcity_weights_kept_while_gpu_milli_runs_out_first() -> None:
    s = cluster(*(node(f"n{i}").gpus(8).cpu(256) for i in range(4)))
    wl = workload(2)
    h_gpu, h_cpu = horizons(s, wl)
    assert h_cpu == h_gpu
    ctx = context(s, gpus(1, 100, cpu=1000), wl)
    weights = scarcity_weights(s, wl, h_gpu)
    assert not np.all(weights == 1.0)
    assert np.array_equal(FgdPriced()._weights(ctx), weights)
