"""Acceptance predicted from the drafter's confidences (``real.predicted``): the isotonic fit,
the calibration recovering a known acceptance curve, the drawn traces' structure, and the
drafter rollout being the drafter's own greedy continuation."""

import numpy as np
import pytest
import torch
from scipy.optimize import isotonic_regression

from control.types import PositionRecord
from real import predicted as P
from tests.real.conftest import make_engine, prompt


def test_pav_is_the_isotonic_regression():
    assert P.pav([0, 1, 2, 3], [1, 3, 2, 4])[1].tolist() == [1.0, 2.5, 4.0]
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.random(40)
        y = (rng.random(40) < x).astype(float)
        w = rng.integers(1, 4, 40).astype(float)
        kx, ky = P.pav(x, y, w)
        order = np.argsort(x, kind="stable")
        ref = isotonic_regression(y[order], weights=w[order]).x
        # the knots' values are the blocks of the reference, each block once
        assert np.allclose(np.unique(ky), np.unique(ref))
        assert (np.diff(ky) >= 0).all() and (np.diff(kx) > 0).all()


def test_run_lengths_are_runs_of_ones_capped():
    bits = np.array([1, 1, 1, 0, 1, 0, 0, 1, 1])
    assert P.run_lengths(bits, 9).tolist() == [3, 2, 1, 0, 1, 0, 0, 2, 1]
    assert P.run_lengths(bits, 2).tolist() == [2, 2, 1, 0, 1, 0, 0, 2, 1]


def _traces(rng, n_req, n_pos, p_of_c, horizon=5):
    """Position traces with a known P(a_t = 1 | c_t) (no run-length effect)."""
    out = []
    for rid in range(n_req):
        c = rng.random(n_pos + horizon)
        bits = (rng.random(len(c)) < p_of_c(c)).astype(np.int64)
        L = P.run_lengths(bits, horizon)
        out.append(
            [
                PositionRecord(rid, t, int(L[t]), tuple(c[t : t + horizon].tolist()))
                for t in range(n_pos)
            ]
        )
    return out


def test_calibration_recovers_a_known_acceptance_curve():
    rng = np.random.default_rng(1)
    pos = _traces(rng, 40, 400, lambda c: 0.2 + 0.6 * c)
    # the rollout's confidences are the text's squeezed towards 1: the map must undo it
    roll = [list(np.sqrt(rng.random(400))) for _ in range(40)]
    cal = P.fit_calibration(pos, roll, P.PredictConfig(quantiles=101))
    for g in (0, 1):
        for c in (0.2, 0.5, 0.8):
            assert P.accept_probability(cal, [c], g)[0] == pytest.approx(0.2 + 0.6 * c, abs=0.06)
    # sqrt(u) has quantile q^2 ... mapped back onto u's quantile q
    for q in (0.3, 0.6, 0.9):
        assert P.map_confidences(cal, [np.sqrt(q)])[0] == pytest.approx(q, abs=0.03)


def test_calibration_level_moves_each_prompt_to_the_calibrations_mean():
    rng = np.random.default_rng(5)
    pos = _traces(rng, 20, 300, lambda c: 0.1 + 0.8 * c)
    roll = [list(rng.random(300)) for _ in range(20)]
    cfg = P.PredictConfig(map_confidences=False)
    cal = P.fit_calibration(pos, roll, cfg)
    plain = P.fit_calibration(pos, roll, P.PredictConfig(map_confidences=False, level="confidence"))
    assert "level" not in plain and {k: v for k, v in cal.items() if k != "level"} == plain
    # the level is the curves' mean along the calibration rollouts: 0.1 + 0.8 E[c] = 0.5
    assert cal["level"] == pytest.approx(0.5, abs=0.03)
    for lo, hi in ((0.0, 0.3), (0.6, 1.0), (0.2, 0.9)):  # a sure and an unsure prompt
        confs = lo + (hi - lo) * rng.random(200)
        p0, p1 = P.curves(cal, confs)
        assert (p0 + p1).mean() / 2 == pytest.approx(cal["level"], abs=1e-6)
        # one logit offset for both curves: the positions keep their order, the curves their gap
        q0, q1 = P.curves(plain, confs)
        assert (np.argsort(p0, kind="stable") == np.argsort(q0, kind="stable")).all()
        off0, off1 = P._logit(p0) - P._logit(q0), P._logit(p1) - P._logit(q1)
        assert np.allclose(off0, off0[0], atol=1e-6) and np.allclose(off1, off0[0], atol=1e-6)
    assert all(np.array_equal(a, b) for a, b in zip(P.curves(plain, confs), (q0, q1)))


def test_calibration_level_predicts_a_prompt_set_whose_confidences_shifted():
    """Held-out prompts accept as often as the calibration's but the drafter is surer of them
    (its confidences are squeezed towards 1): the calibration level predicts their acceptance,
    the fitted curves predict too much."""
    rng = np.random.default_rng(6)
    pos = _traces(rng, 20, 300, lambda c: 0.2 + 0.6 * c)
    roll = [list(rng.random(300)) for _ in range(20)]
    sure = np.sqrt(rng.random(4000))  # the held-out rollout: same acceptance, surer drafter
    real = 0.2 + 0.6 * 0.5  # what the held-out text accepts (its confidences uniform, as above)
    shares = {}
    for level in ("calibration", "confidence"):
        cal = P.fit_calibration(pos, roll, P.PredictConfig(map_confidences=False, level=level))
        bits = P.draw_bits(cal, sure, np.random.default_rng(7))
        shares[level] = bits.mean()
    assert shares["calibration"] == pytest.approx(real, abs=0.03)
    assert shares["confidence"] > real + 0.05


def test_drawn_bits_follow_the_markov_chain():
    p0, p1 = 0.3, 0.8
    cal = {
        "after_0": {"logit": [-1.0, 1.0], "p": [p0, p0]},
        "after_1": {"logit": [-1.0, 1.0], "p": [p1, p1]},
    }
    bits = P.draw_bits(cal, np.full(200_000, 0.5), np.random.default_rng(2))
    assert bits.mean() == pytest.approx(p0 / (1 - p1 + p0), abs=0.01)  # stationary share
    prev, nxt = bits[:-1], bits[1:]
    assert nxt[prev == 1].mean() == pytest.approx(p1, abs=0.01)
    assert nxt[prev == 0].mean() == pytest.approx(p0, abs=0.01)


def test_synthetic_positions_are_a_consistent_trace():
    rng = np.random.default_rng(3)
    pos = _traces(rng, 10, 200, lambda c: c)
    cal = P.fit_calibration(pos, [], P.PredictConfig(map_confidences=False))
    confs = list(rng.random(60))
    toks = list(range(60))
    recs = P.synthetic_positions(cal, toks, confs, 50, 6, {3, 7}, np.random.default_rng(4), 9)
    assert [r.position for r in recs] == list(range(50)) and {r.request_id for r in recs} == {9}
    L = np.array([r.run_length for r in recs])
    assert ((L[:-1] == 0) | (L[:-1] == np.minimum(L[1:] + 1, 6))).all() and L.max() <= 6
    assert all(r.confidences == tuple(confs[r.position : r.position + 6]) for r in recs)
    assert [r.position for r in recs if r.sentence_end] == [3, 7]
    with pytest.raises(Exception, match="rollout of 60"):
        P.synthetic_positions(cal, toks, confs, 60, 6, set(), rng)


@torch.inference_mode()
def test_rollout_is_the_drafters_own_greedy_continuation():
    eng = make_engine("tf")
    p = prompt(5)
    toks, confs = P.drafter_rollout(eng, p, 30)  # chunks of k_max + 1 = 9
    assert len(toks) == len(confs) == 30
    # one token at a time from a fresh drafter cache each step: the same tokens, same confidences
    seq, d = eng.seq, eng.drafter
    full = p + toks
    for t in range(30):
        L = len(p) + t
        seq[0, :L] = torch.tensor(full[:L])
        d.reset()
        count, c, _ = d.propose(seq, L, 1, 0.0, P._GREEDY, None)
        assert count == 1 and int(seq[0, L]) == toks[t]
        assert c[0] == pytest.approx(confs[t], rel=1e-9)
