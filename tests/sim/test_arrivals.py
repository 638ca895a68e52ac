"""Arrival processes added for load that reward adaptation: capacity mode and a swinging rate."""

from __future__ import annotations

import numpy as np
import pytest

from sim.workload import LengthConfig, WorkloadConfig, _sinusoid_gaps, generate


def streams(seed=0):
    return {"arrivals": np.random.default_rng(seed), "lengths": np.random.default_rng(seed + 1)}


def test_capacity_mode_puts_every_request_at_zero():
    cfg = WorkloadConfig(arrival="capacity", num_requests=50,
                         output=LengthConfig(dist="constant", mean_tokens=7.0))
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
