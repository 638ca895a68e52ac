"""``metrics.noise_floor``: what a simulator exact on every true value scores on noisy repeats."""

import math

import numpy as np
import pytest
from scipy.stats import norm

from validate import metrics as M


def _p_median3_outside(sigma: float, target_pct: float) -> float:
    """Exact P(|exp(-m) - 1| > t) for m the median of 3 i.i.d. N(0, σ²): the median's CDF is
    3Φ² - 2Φ³."""

    def cdf(x: float) -> float:
        f = norm.cdf(x / sigma)
        return 3 * f**2 - 2 * f**3

    t = target_pct / 100.0
    # |expm1(-m)| > t  <=>  m < -log(1 + t)  or  m > -log(1 - t)
    return cdf(-math.log1p(t)) + 1.0 - cdf(-math.log1p(-t))


def test_one_row_matches_the_median_of_three_exactly():
    rng = np.random.default_rng(5)
    draws = 40_000
    f = M.noise_floor([0.08], [10.0], 3, rng, draws=draws)
    p = _p_median3_outside(0.08, 10.0)
    assert f["p_over_target"] == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / draws))


def test_rows_without_noise_score_zero_and_need_no_more_repeats():
    f = M.noise_floor([0.0, 0.0], [5.0, 5.0], 3, np.random.default_rng(0))
    assert f["max_abs_error_pct_p90"] == 0.0
    assert f["p_over_target"] == 0.0
    assert f["repeats_needed_for_p10"] == 3  # the run's own count already suffices
    assert f["noisy_rows"] == 0


def test_more_rows_and_fewer_repeats_raise_the_floor():
    one = M.noise_floor([0.05], [5.0], 3, np.random.default_rng(1))
    eight = M.noise_floor([0.05] * 8, [5.0] * 8, 3, np.random.default_rng(1))
    assert eight["p_over_target"] > one["p_over_target"]
    assert eight["max_abs_error_pct_p50"] > one["max_abs_error_pct_p50"]
    # the independent-rows union: 1 - (1 - p)^8, within Monte Carlo error
    q = 1.0 - (1.0 - _p_median3_outside(0.05, 5.0)) ** 8
    assert eight["p_over_target"] == pytest.approx(q, abs=0.03)
    need = eight["repeats_needed_for_p10"]
    assert need in M.MORE_REPEATS
    more = M.noise_floor([0.05] * 8, [5.0] * 8, need, np.random.default_rng(2))
    assert more["p_over_target"] <= 0.1 + 0.02


def test_fewer_than_two_repeats_have_no_floor():
    assert M.noise_floor([0.1], [10.0], 1, np.random.default_rng(0)) is None


def test_noise_is_pooled_per_group_and_metric_and_deterministic_rows_stay_exact(monkeypatch):
    # workload w: two controllers whose throughput varies, one whose accepted length is fixed
    real = {
        ("a", "w"): [{"x": 100.0, "y": 2.0}, {"x": 110.0, "y": 2.0}, {"x": 90.0, "y": 2.0}],
        ("b", "w"): [{"x": 50.0, "y": 1.5}, {"x": 52.0, "y": 1.6}, {"x": 51.0, "y": 1.4}],
    }
    seen = {}

    def spy(sigmas, targets, repeats, rng, draws=4000):
        seen.update(sigmas=list(sigmas), targets=list(targets), repeats=repeats)
        return {}

    monkeypatch.setattr(M, "noise_floor", spy)
    M.noise_floor_of(real, {"x": 10.0, "y": 20.0}, np.random.default_rng(0))
    sx = [M.log_sd([100, 110, 90]), M.log_sd([50, 52, 51])]
    pooled_x = math.sqrt((sx[0] ** 2 + sx[1] ** 2) / 2)
    # rows in the order of real x targets: (a, x), (a, y), (b, x), (b, y)
    assert seen["sigmas"][0] == pytest.approx(pooled_x)
    assert seen["sigmas"][2] == pytest.approx(pooled_x)
    assert seen["sigmas"][1] == 0.0  # a's accepted length never moved
    assert seen["sigmas"][3] == pytest.approx(M.log_sd([1.5, 1.6, 1.4]))  # alone in its pool
    assert seen["targets"] == [10.0, 20.0, 10.0, 20.0]
    assert seen["repeats"] == 3
