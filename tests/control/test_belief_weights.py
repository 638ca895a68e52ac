"""The beliefs' pseudo-trial weights chosen by how well they predicted (control.belief_weights)."""

from __future__ import annotations

import numpy as np
import pytest

from control.belief_kernel import grid_beliefs, point_beliefs
from control.belief_weights import PredictiveWeights
from control.dspark import DSparkConfig, DSparkController
from control.dspark_planner import DSparkPlanner

CFG = DSparkConfig(belief_weights="predictive")


def drive(planner, members, rate_of, rounds, rng, k=4):
    """``rounds`` rounds, a full plan's beliefs every 2 (as the planner re-plans): sequence i
    drafts ``k``, each token accepted with ``rate_of(i, round)`` until the first refusal."""
    for r in range(rounds):
        if r % 2 == 0:
            planner.acceptance(members)
        for i, m in enumerate(members):
            n = 0
            while n < k and rng.random() < rate_of(i, r):
                n += 1
            m.observe_values(float(r), k, n, None, 0.0, 0.01, 100, 0, n + 1, ())


def fresh(n):
    return DSparkPlanner(CFG), [DSparkController(CFG) for _ in range(n)]


def test_every_pair_of_the_grid_is_the_belief_of_that_pair_alone():
    rng = np.random.default_rng(0)
    values = rng.uniform(0, 30, (9, 11))  # SUM_N, SUM_REJ, RECENT_N, RECENT_REJ in columns 0-3
    idx = np.arange(9, dtype=np.intp)
    w, R = np.array([0.5, 3.0, 40.0]), np.array([1.0, 8.0])
    grid = grid_beliefs(values, idx, 0.7, w, R, 6)
    assert grid.shape == (9, 6, 6)
    for i in range(3):
        for j in range(2):
            one = point_beliefs(values, idx, 0.7, float(w[i]), float(R[j]), 6)
            assert np.array_equal(grid[:, i * 2 + j, :], one.T)  # the same floats, not merely close


def test_without_evidence_the_configured_weights_plan():
    planner, members = fresh(4)
    planner.acceptance(members)
    assert planner.weights.pair() == (CFG.prior_trials, CFG.recent_prior)


def test_one_rate_for_every_sequence_pools_more():
    """i.i.d. acceptance: a sequence's own counts and its recent rounds are noise, so the
    pairs that lean on the pool predict better."""
    rng = np.random.default_rng(1)
    planner, members = fresh(16)
    drive(planner, members, lambda i, r: 0.7, 600, rng)
    w, R = planner.weights.pair()
    assert w >= 4 * CFG.prior_trials and R >= 16 * CFG.recent_prior


def test_rates_that_differ_and_stay_keep_each_sequences_own_counts():
    rng = np.random.default_rng(2)
    planner, members = fresh(16)
    rates = rng.uniform(0.2, 0.95, 16)
    drive(planner, members, lambda i, r: rates[i], 600, rng)
    w, R = planner.weights.pair()
    assert w <= CFG.prior_trials and R >= 4 * CFG.recent_prior


def test_stretches_of_easy_and_hard_text_keep_the_recent_weight():
    """Each sequence switches between 0.95 and 0.15 (a stretch lasts ~8 rounds): its recent
    rounds say which stretch it is in, so the configured recent weight stays."""
    rng = np.random.default_rng(3)
    planner, members = fresh(16)
    flips = rng.random((600, 16)) < 1 / 8
    easy = np.logical_xor.accumulate(flips, axis=0)
    drive(planner, members, lambda i, r: 0.95 if easy[r, i] else 0.15, 600, rng)
    assert planner.weights.pair()[1] == CFG.recent_prior


def test_outcomes_are_scored_only_against_the_predictions_made_for_that_member():
    w = PredictiveWeights(20.0, 8.0, 4)
    w.pred, w.owner = np.zeros((2, 16, 4)), np.empty(2, dtype=object)
    a, b = object(), object()
    w.pred[0] = 0.6
    w.owner[0] = a
    counts = np.zeros((1, 10))
    counts[0, 1] = 1.0  # one round: position 1 accepted, position 2 refused
    w._learn(np.array([0]), np.array([b], dtype=object), counts)
    assert not w.score.any()  # slot 0's predictions were made for a, not b
    w._learn(np.array([0]), np.array([a], dtype=object), counts)
    assert w.score == pytest.approx(-((1 - 0.6) ** 2 + 0.6**2))  # the Brier score, every pair
