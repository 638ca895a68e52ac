"""``analytic``: argmax of Leviathan et al.'s speedup, checked against brute force."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control import make_controller
from control.analytic import best_k
from control.errors import ConfigError
from control.leviathan import expected_speedup
from tests.control.helpers import obs, run


def brute(a, c, lo, hi):
    vals = {
        k: (1 - a ** (k + 1)) / ((1 - a) * (k * c + 1)) if a < 1 else (k + 1) / (k * c + 1)
        for k in range(lo, hi + 1)
    }
    top = max(vals.values())
    return min(k for k, v in vals.items() if v == top)


@settings(max_examples=300, deadline=None)
@given(
    a=st.floats(0.0, 0.999), c=st.floats(0.0, 2.0), lo=st.integers(0, 5), span=st.integers(0, 30)
)
def test_best_k_matches_brute_force(a, c, lo, span):
    k, ref = best_k(a, c, lo, lo + span), brute(a, c, lo, lo + span)
    if k != ref:  # only a floating-point tie (e.g. a == c makes k = 0 and 1 equal) may differ
        assert expected_speedup(a, k, c) == pytest.approx(expected_speedup(a, ref, c), rel=1e-12)


@pytest.mark.parametrize(
    "a, c, k, expected",
    [
        (0.8, 0.0, 4, (1 - 0.8**5) / 0.2),  # tokens per round at c = 0 (Eq. 1)
        (1.0, 0.1, 4, 5 / 1.4),  # the a -> 1 limit: k+1 tokens
        (0.0, 0.5, 3, 1 / 2.5),
    ],
)
def test_expected_speedup_values(a, c, k, expected):
    assert expected_speedup(a, k, c) == pytest.approx(expected, rel=1e-12)


def test_analytic_priors_then_measured():
    cfg = {
        "window_rounds": 8,
        "k_min": 0,
        "k_max": 12,
        "a_prior": 0.7,
        "c_prior": 0.1,
        "min_trials": 8,
        "update_rounds": 1,
    }
    c = make_controller("analytic", cfg)
    assert c.decide(0.0).k == best_k(0.7, 0.1, 0, 12)  # no data: priors
    # 4 rounds: k=4, n = 3, 4, 1, 4 -> Σn = 12, rejections 2, â = 12/14;
    # draft step 0.002 s, verify pass 0.04 s -> c = 0.05
    rounds = [obs(4, n, draft_s=0.008, verify_s=0.04) for n in (3, 4, 1, 4)]
    run(c, rounds)
    a, cost = c.estimates()
    assert a == 12 / 14 and cost == pytest.approx(0.05, rel=1e-12)
    assert c.decide(0.0).k == brute(12 / 14, cost, 0, 12)
    assert c.state()["a_hat"] == a


def test_analytic_all_accepted_picks_k_max_and_collapse_picks_zero():
    c = make_controller("analytic", {"update_rounds": 1, "k_max": 10, "min_trials": 1})
    run(c, [obs(4, 4, draft_s=0.004, verify_s=0.02)] * 3)  # â = 1, c = 0.05
    assert c.decide(0.0).k == 10
    c.reset()
    run(c, [obs(4, 0, draft_s=0.04, verify_s=0.02)] * 32)  # â = 0, c = 0.5
    assert c.decide(0.0).k == 0


def test_analytic_recomputes_every_update_rounds():
    c = make_controller("analytic", {"update_rounds": 3, "min_trials": 1, "k_max": 10})
    k0 = c.decide(0.0).k
    run(c, [obs(4, 0)] * 2)
    assert c.decide(0.0).k == k0  # not yet recomputed
    run(c, [obs(4, 0)])
    assert c.decide(0.0).k == 0


def test_analytic_bad_config():
    with pytest.raises(ConfigError, match="k_min = 5 > k_max = 2"):
        make_controller("analytic", {"k_min": 5, "k_max": 2})
