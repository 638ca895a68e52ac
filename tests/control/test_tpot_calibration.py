"""The predicted TPOT held to the rounds' real time per token (``slo_calibrate``)."""

from __future__ import annotations

import pytest

from control.batch import BatchContext, RoundStats, Slo
from control.dspark import DSparkConfig, DSparkController
from control.dspark_planner import DSparkPlanner
from control.tpot_calibration import FACTOR_MAX, FACTOR_MIN, TpotCalibration


def test_the_factor_is_real_over_predicted_seconds_times_expected_over_emitted_tokens():
    cal = TpotCalibration(rate=0.1, prior_rounds=20.0)
    cal.observe(0.05, 8, 16)  # no plan has predicted yet: nothing learned
    assert cal.factor == 1.0
    cal.planned(0.04, 2.0)  # a sequence a round: 0.04 s, 2 tokens
    # rounds of 8 sequences taking 0.8 of the predicted seconds and emitting 1.25x the
    # expected tokens: a sequence's time per token is 0.8 / 1.25 = 0.64 of the prediction
    n, d = 30, 0.9
    for _ in range(n):
        cal.observe(0.032, 8, 20.0)
    geo = (1 - d**n) / (1 - d)  # Σ of the forgotten weights of the n rounds
    prior = 20.0 * d**n  # the prior's 20 rounds (added at the first round), forgotten since
    seconds = (prior * 0.32 + geo * 0.8 * 0.32) / ((prior + geo) * 0.32)
    tokens = (prior + geo) * 16.0 / (prior * 16.0 + geo * 20.0)
    assert cal.factor == pytest.approx(seconds * tokens, rel=1e-12)
    assert 0.64 < cal.factor < 0.7  # on its way from 1 to 0.64
    for _ in range(500):
        cal.observe(0.032, 8, 20.0)
    assert cal.factor == pytest.approx(0.64, rel=1e-9)
    cal.reset()
    assert cal.factor == 1.0


def test_the_factor_is_held_within_its_range_and_ignores_empty_plans():
    cal = TpotCalibration(rate=0.5, prior_rounds=1.0)
    cal.planned(0.0, 2.0)  # no seconds predicted: not a prediction
    cal.observe(0.1, 4, 8.0)
    assert cal.factor == 1.0
    cal.planned(0.01, 1.0)
    for _ in range(60):
        cal.observe(1.0, 4, 4.0)  # rounds 100x slower than predicted
    assert cal.factor == FACTOR_MAX
    for _ in range(60):
        cal.observe(1e-5, 4, 4.0)
    assert cal.factor == FACTOR_MIN


def _members(n: int) -> list[DSparkController]:
    out = []
    for i in range(n):
        m = DSparkController(DSparkConfig(belief_weights="fixed"))
        acc = (4, 3, 1, 0)[i % 4]  # four kinds of sequence, 0.0 to 1.0 acceptance
        for r in range(30):
            m.observe_values(0.1 * r, 4, acc, None, 0.01, 0.03, 500, 0, 1 + acc, ())
        out.append(m)
    return out


def _planner(calibrate: bool, tpot_s: float) -> DSparkPlanner:
    pl = DSparkPlanner(
        DSparkConfig(slo_calibrate=calibrate, explore_every=0, belief_weights="fixed")
    )
    pl.set_slo(Slo(2.0, tpot_s))
    for i, n in enumerate([40, 80] * 10):  # rounds at two token counts: the costs are known
        pl.observe_round(
            RoundStats(0.1 * i, 0.1 * i + 0.06, 20, 20, 2, n, 5000, 0.01, 0.03 + 3e-4 * n)
        )
    return pl


def test_a_planner_holding_its_predictions_to_a_factor_plans_as_if_the_slo_were_divided_by_it():
    # every predicted TPOT times f is held to the SLO s (and to the spread's s): exactly the
    # uncalibrated prediction held to s / f
    members = _members(20)
    batch = BatchContext(20, 10_000)
    for f_rounds, slo in ((0.5, 0.03), (1.6, 0.03), (1.6, 0.06)):
        cal = _planner(True, slo)
        cal.tpot_cal.planned(0.05, 2.0)
        for _ in range(4000):  # rounds f_rounds x as long as predicted, tokens as expected
            cal.tpot_cal.observe(0.05 * f_rounds, 20, 40.0)
        f = cal.tpot_cal.factor
        assert f == pytest.approx(f_rounds, rel=0.01)
        plain = _planner(False, slo / f)
        assert plain.tpot_cal is None
        ks = [d.k for d in cal.plan(100.0, members, batch)]
        assert ks == [d.k for d in plain.plan(100.0, members, batch)]
        # and the factor moves the plan: the uncalibrated planner at s drafts otherwise
        other = [d.k for d in _planner(False, slo).plan(100.0, members, batch)]
        assert ks != other


def test_the_planner_learns_the_factor_from_the_rounds_it_planned():
    pl = _planner(True, 0.05)
    members = _members(8)
    batch = BatchContext(8, 4000)
    pl.plan(0.0, members, batch)  # a full plan records its prediction
    t, e = pl.tpot_cal._pred
    emitted = round(8 * e)  # every round takes 0.7 of the predicted seconds
    for i in range(1, 4000):
        pl.observe_round(RoundStats(i, i + 0.7 * t, 8, 8, 2, 16, 4000, 0.0, 0.7 * t, 0, emitted))
    assert pl.tpot_cal.factor == pytest.approx(0.7 * 8 * e / emitted, rel=1e-3)
    pl.reset()
    assert pl.tpot_cal.factor == 1.0
