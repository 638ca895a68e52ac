"""Roofline latency: memory-bound decode, cheap verification of a few tokens, the ridge point."""

import pytest
from conftest import scenario

from control.errors import ConfigError
from sim.cluster import Cluster
from sim.hardware import hardware_preset
from sim.latency import Roofline
from sim.models import ModelConfig


def test_70b_batch1_h100_is_memory_bound():
    m = ModelConfig(preset="Llama-3.1-70B", dtype="bf16").resolved()
    hw = hardware_preset("H100-SXM")
    roof = Roofline(m, hw, tp=1)
    t1 = roof.seconds(1, 1, 128)
    weights_s = m.weight_bytes / (hw.bandwidth_bytes_s * hw.bw_efficiency)
    assert m.weight_bytes == pytest.approx(141e9, rel=0.01)  # ~70.6 B params x 2 bytes
    assert t1 == pytest.approx(weights_s, rel=0.10)
    flops_s = 2 * m.total_params / (hw.peak_flops["bf16"] * hw.compute_efficiency)
    assert flops_s < 0.02 * t1  # compute is negligible at batch 1
    # verifying k + 1 tokens costs about one token for small k (weight reads grow by
    # weight_read_growth x k / 63: under 2% at k = 8) ...
    for k in (1, 2, 4, 8):
        assert roof.seconds(1, k + 1, 128) == pytest.approx(t1, rel=0.02)
    # ... stays memory-bound below the ridge point (weight reads at most 1 + growth times
    # those of one token, fitted to profiled decode steps: tests/sim/test_calibration.py) ...
    ridge = roof.ridge_tokens()
    assert 100 < ridge < 1000
    assert roof.seconds(1, int(ridge / 2), 128) < (1.05 + hw.weight_read_growth) * t1
    # ... and grows past it
    assert roof.seconds(1, int(4 * ridge), 128) > 3 * t1
    # compute-bound regime is linear in tokens
    a, b = roof.seconds(1, int(8 * ridge), 128), roof.seconds(1, int(16 * ridge), 128)
    assert b / a == pytest.approx(2.0, rel=0.05)


def test_kv_read_grows_with_context_and_tp_adds_allreduce():
    m = ModelConfig(preset="Llama-3.1-70B").resolved()
    hw = hardware_preset("H100-SXM")
    r1 = Roofline(m, hw, tp=1)
    assert r1.seconds(1, 1, 100_000) > r1.seconds(1, 1, 100)
    assert r1.bytes_per_gpu(1, 1, 1000) - r1.bytes_per_gpu(1, 1, 0) == pytest.approx(
        1000 * m.kv_bytes_per_token
    )
    r8 = Roofline(m, hw, tp=8)
    comm = m.layers * 2 * hw.allreduce_latency_s
    assert r8.seconds(1, 1, 0) > r1.seconds(1, 1, 0) / 8 + comm * 0.99


@pytest.mark.parametrize(
    "dep,target,msg",
    [
        ({"tp": 1}, {"preset": "Llama-3.1-70B"}, "impossible cluster: weights need"),
        ({"tp": 3}, {"preset": "Llama-3.1-8B"}, "not divisible by tensor-parallel degree 3"),
    ],
)
def test_impossible_cluster_is_one_line(dep, target, msg):
    scn = scenario({"deployment": dep, "target": target})
    with pytest.raises(ConfigError) as e:
        Cluster(scn)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_presets_fit_their_clusters():
    from conftest import CONFIGS

    from sim import load_scenario

    for name in ("standard", "azure_conv", "a100_70b", "tiny"):
        c = Cluster(load_scenario(CONFIGS / f"{name}.toml"))
        assert c.kv_budget_bytes > 0
    std = Cluster(load_scenario(CONFIGS / "standard.toml"))
    assert std.num_gpus == 64
