"""Arrival processes added for load that reward adaptation: capacity mode and a swinging rate."""

from __future__ import annotations

import numpy as np
import pytest

from sim.workload import LengthConfig, WorkloadConfig, _sinusoid_gaps, generate


def streams(seed=0):
    return {"arrivals": np.random.default_rng(seed), "lengths": np.random.default_rng(seed + 1)}


def test_capacity_mode_puts_every_request_at_zero():
    cfg = WorkloadConfig(
        arrival="capacity", num_requests=50, output=LengthConfig(dist="constant", mean_tokens=7.0)
    )
    r = generate(cfg, streams())
    assert len(r) == 50 and not r.arrival_s.any() and (r.output_tokens == 7).all()


def test_sinusoid_rate_has_the_mean_and_the_swing():
    g = _sinusoid_gaps(10.0, 0.9, 60.0, 40_000, np.random.default_rng(0))
    t = np.cumsum(g)
    assert t[0] == 0.0 and (g >= 0).all()
    assert len(t) / t[-1] == pytest.approx(10.0, rel=0.03)
    # expected share of arrivals in each quarter period: (1 ± 0.9·2/π) / 4 on the rising/falling
    q, _ = np.histogram(t % 60.0, bins=4, range=(0, 60))
    share = q / q.sum()
    hi, lo = (1 + 0.9 * 2 / np.pi) / 4, (1 - 0.9 * 2 / np.pi) / 4
    assert share == pytest.approx([hi, hi, lo, lo], abs=0.01)


def test_sinusoid_is_seeded_and_load_scale_applies():
    cfg = WorkloadConfig(arrival="sinusoid", rate_rps=5.0, num_requests=2000)
    a, b = generate(cfg, streams(3)), generate(cfg, streams(3))
    assert np.array_equal(a.arrival_s, b.arrival_s)
    fast = generate(cfg, streams(3), load_scale=2.0)
    assert len(fast) / fast.arrival_s[-1] == pytest.approx(10.0, rel=0.08)


def test_mixture_acceptance_classes_and_run_lengths():
    from control.errors import DSparkError
    from sim.acceptance import AcceptanceConfig, AcceptanceModel

    cfg = AcceptanceConfig(model="mixture", mixture_rates=(0.9, 0.4), mixture_weights=(0.25, 0.75))
    n = 40_000
    m = AcceptanceModel(cfg, n, np.random.default_rng(1), np.random.default_rng(2))
    assert set(np.unique(m.rate)) == {0.9, 0.4}
    assert (m.rate == 0.9).mean() == pytest.approx(0.25, abs=0.01)
    ids = np.arange(n)
    L = m.run_lengths(ids, np.zeros(n, dtype=np.int64))
    for j in (1, 3):  # P(L >= j) = Σ_c w_c a_c^j
        assert (L >= j).mean() == pytest.approx(0.25 * 0.9**j + 0.75 * 0.4**j, abs=0.01)
    assert np.array_equal(m.true_rates(ids[:5], ids[:5]), m.rate[:5])
    bad = AcceptanceConfig(model="mixture", mixture_rates=(0.9,), mixture_weights=(0.5, 0.5))
    with pytest.raises(DSparkError, match="mixture_rates"):
        AcceptanceModel(bad, 3, np.random.default_rng(1), np.random.default_rng(2))
