"""The goodput planner's acceptance beliefs: calibrated on what its plans predicted."""

from __future__ import annotations

import numpy as np
import pytest

from control.dspark import DSparkConfig, DSparkController
from control.dspark_planner import DSparkPlanner


def drive(planner, members, rate_of, rounds, k, rng):
    """``rounds`` rounds: a full plan's beliefs every 8 rounds (as the planner re-plans), each
    sequence drafting ``k`` with its position-j token accepted with ``rate_of(i, j)``."""
    for r in range(rounds):
        if r % 8 == 0:
            planner.acceptance(members)
        for i, m in enumerate(members):
            n = 0
            while n < k and rng.random() < rate_of(i, n + 1):
                n += 1
            m.observe_values(float(r), k, n, None, 0.0, 0.01, 100, 0, n + 1, ())


def fresh(n, **over):
    cfg = DSparkConfig(**over)
    return DSparkPlanner(cfg), [DSparkController(cfg) for _ in range(n)]


def test_iid_beliefs_are_calibrated_per_position():
    rng = np.random.default_rng(0)
    planner, members = fresh(16)
    drive(planner, members, lambda i, j: 0.7, 600, 6, rng)
    a = planner.acceptance(members)
    # position j's rate given j - 1 accepted: 0.7 everywhere, within sampling noise
    assert np.abs(a[:6].mean(axis=1) - 0.7).max() < 0.03


def test_decaying_acceptance_gives_falling_position_rates():
    rng = np.random.default_rng(1)
    planner, members = fresh(16)
    drive(planner, members, lambda i, j: 0.9 * 0.85 ** (j - 1), 600, 5, rng)
    a = planner.acceptance(members).mean(axis=1)
    truth = 0.9 * 0.85 ** np.arange(5)
    assert np.all(np.diff(a[:5]) < 0)
    assert np.abs(a[:5] - truth).max() < 0.05


def test_beliefs_follow_each_sequence_and_rise_only_when_uncertain():
    """Half the batch accepts at 0.9, half at 0.4: each sequence's belief goes to its own rate;
    the predictive rate of later positions rises more for a sequence with little evidence."""
    rng = np.random.default_rng(2)
    planner, members = fresh(8)
    drive(planner, members, lambda i, j: 0.9 if i < 4 else 0.4, 200, 4, rng)
    a = planner.acceptance(members)
    assert a[0, :4].mean() == pytest.approx(0.9, abs=0.07)
    assert a[0, 4:].mean() == pytest.approx(0.4, abs=0.1)
    b = planner._beliefs(members)
    newcomer = DSparkController(planner.config)  # no evidence: the pooled rate, mass = prior
    nb = planner._beliefs([newcomer])[:, 0]
    assert np.all(np.diff(nb) > 0)  # uncertain: each accepted token raises the next one's odds
    rise_new = nb[3] - nb[0]
    rise_known = (b[3] - b[0])[:4].mean()
    assert 0 < rise_known < rise_new


def test_rounds_pool_only_at_a_plan_and_against_that_plan():
    """A sequence's rounds count once, at the next plan, against the rates of the plan they
    ran under (not the new one)."""
    planner, (m,) = fresh(1)
    planner.acceptance([m])
    held = m.plan_rates.copy()
    m.observe_values(0.0, 3, 1, None, 0.0, 0.01, 10, 0, 2, ())  # tried positions 1 and 2
    assert sum(planner.profile) == 0
    planner.acceptance([m])
    K = planner.config.k_max
    assert planner.profile[1] == 1 and sum(planner.profile) == 1  # refused after 1 accepted
    assert planner.expected[:3] == pytest.approx([held[0], held[1], 0.0])
    assert sum(planner.expected[3:K]) == 0


def drive_with_head(planner, members, rates, report, rounds, k, rng):
    """As :func:`drive`, each sequence at its own i.i.d. rate, its drafter reporting the
    confidence ``report(rate)`` at every drafted position."""
    for r in range(rounds):
        if r % 8 == 0:
            planner.acceptance(members)
        for m, a in zip(members, rates):
            n = 0
            while n < k and rng.random() < a:
                n += 1
            m.observe_values(float(r), k, n, (report(a),) * k, 0.0, 0.01, 100, 0, n + 1, ())


def test_a_calibrated_head_holds_each_sequence_nearer_its_rate_than_its_outcomes():
    """64 sequences at rates spread over 0.3-0.9, 64 rounds of 4 drafts: with a calibrated
    confidence head as evidence each sequence's first-position belief is nearer its rate
    than with its verification outcomes, whose last few rounds (the recent estimate) are
    noisy (the same rounds, the same random draws; 0.020-0.026 against 0.053-0.060)."""
    rates = np.linspace(0.3, 0.9, 64)
    err = {}
    for source in ("outcomes", "confidence"):
        planner, members = fresh(64, acceptance_source=source)
        drive_with_head(planner, members, rates, lambda a: a, 64, 4, np.random.default_rng(5))
        err[source] = np.abs(planner.acceptance(members)[0] - rates).mean()
    assert err["confidence"] < 0.6 * err["outcomes"]


def test_the_head_mode_trusts_the_heads_calibration():
    """A head that reports 0.15 above every sequence's rate: in the head mode the beliefs are
    the head's (its calibration is the drafter's job: the engine refits it on the verified
    slots), with no position factor from the outcomes; the outcome mode's are the rates."""
    rates = np.linspace(0.3, 0.8, 32)
    for source, shift in (("confidence", 0.15), ("outcomes", 0.0)):
        planner, members = fresh(32, acceptance_source=source)
        high = lambda a: a + 0.15  # noqa: E731
        drive_with_head(planner, members, rates, high, 400, 4, np.random.default_rng(6))
        a = planner.acceptance(members)[0]
        assert abs((a - rates).mean() - shift) < 0.03, source
