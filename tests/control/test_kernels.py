"""The planner's compiled loops give numpy's numbers: sums in numpy's pairwise order bit for
bit, the fitted costs as the closed forms of ``control.cost_kernel``'s docstring, the cost fits'
update and solve as numpy's and LAPACK's to rounding, the caps' rank, the beliefs, the pooling
and the position factors as their numpy forms, float for float."""

from __future__ import annotations

import numpy as np
import pytest

from control.belief_kernel import (
    brier_loss,
    grid_beliefs,
    hold_to_plans,
    point_beliefs,
    position_factor,
    scaled_capped,
)
from control.cost_kernel import (
    KIND_BUDGET,
    KIND_NONE,
    KIND_SHARED,
    SpecFunction,
    cost_spec,
    ls_update,
    ridge_solve,
)
from control.costmodel import KNOTS
from control.goodput_kernel import (
    best_row,
    floor_lengths,
    mean_tpot_scores,
    position_powers,
    slo_scores,
)
from control.pairwise import pairwise_sum

KN = np.array(KNOTS, dtype=float)


@pytest.mark.parametrize("n", [*range(40), 127, 128, 129, 255, 256, 1000, 4097])
def test_pairwise_sum_is_numpys_sum_bit_for_bit(n):
    rng = np.random.default_rng(n)
    for _ in range(5):
        x = rng.random((3, n)) * 10.0 ** rng.uniform(-6, 6)
        assert pairwise_sum(x[1], 0, n) == x.sum(axis=1)[1]
        assert pairwise_sum(x.ravel(), n, n) == x[1].sum()


def _line(rng):
    v0, v1 = rng.uniform(1e-3, 1e-2), rng.uniform(0, 1e-5)
    hinge = rng.normal(size=len(KN)) * 1e-6
    return v0, v1, hinge, rng.uniform(1e-4, 1e-3), rng.uniform(0, 1e-5)


def _raw(n, v0, v1, hinge):
    return np.maximum(v0 + v1 * n + np.maximum(n[:, None] - KN, 0.0) @ hinge, 0.0)


def _raw_slope(n, v1, hinge):
    return np.maximum(v1 + (n[:, None] > KN) @ hinge, 0.0)


@pytest.mark.parametrize("seed", range(5))
def test_fitted_costs_are_the_closed_forms(seed):
    rng = np.random.default_rng(seed)
    v0, v1, hinge, s0, s1 = _line(rng)
    n = np.arange(1.0, 3000.0, 7.0)
    close = {"rtol": 1e-12, "atol": 1e-18}
    # no chunk: the line itself
    spec = cost_spec(KIND_NONE, v0, v1, KN, hinge, s0, s1)
    np.testing.assert_allclose(SpecFunction(spec, "verify")(n), _raw(n, v0, v1, hinge), **close)
    slope = SpecFunction(spec, "verify_slope")(n)
    np.testing.assert_allclose(slope, _raw_slope(n, v1, hinge), **close)
    d = np.arange(1.0, 300.0)
    np.testing.assert_allclose(SpecFunction(spec, "step")(d), np.maximum(s0 + s1 * d, 0.0))
    # a token budget with a backlog: the chunk min(backlog, cap − N), its own share left out
    backlog, cap, value, batch = 700.0, 1024.0, 0.4, 40
    free = min(backlog, cap - batch)
    spec = cost_spec(
        KIND_BUDGET, v0, v1, KN, hinge, s0, s1, backlog=backlog, cap=cap, value=value, free=free
    )
    p = np.minimum(backlog, np.maximum(cap - n, 0.0))
    base = _raw(np.zeros(1), v0, v1, hinge)[0]
    want = _raw(n + p, v0, v1, hinge) - (_raw(p, v0, v1, hinge) - base)
    np.testing.assert_allclose(SpecFunction(spec, "verify")(n), want, **close)
    inside = (p < backlog) & (n < cap)
    want = np.where(inside, _raw_slope(p, v1, hinge), _raw_slope(n + p, v1, hinge))
    np.testing.assert_allclose(SpecFunction(spec, "verify_slope")(n), want, **close)
    want = value * np.maximum(free - p, 0.0)
    np.testing.assert_allclose(SpecFunction(spec, "penalty")(n), want, **close)
    want = np.where(n + backlog < cap, 0.0, value)
    assert (SpecFunction(spec, "penalty_slope")(n) == want).all()
    # a fixed chunk beside every pass
    spec = cost_spec(KIND_SHARED, v0, v1, KN, hinge, s0, s1, pre=300.0)
    want = _raw(n + 300.0, v0, v1, hinge) - (_raw(np.full(1, 300.0), v0, v1, hinge) - base)
    np.testing.assert_allclose(SpecFunction(spec, "verify")(n), want, **close)
    # any shape in, the same shape out
    assert SpecFunction(spec, "verify")(5.0).shape == ()
    assert SpecFunction(spec, "verify")(np.ones((2, 3))).shape == (2, 3)


def test_ridge_solve_is_lapacks_to_rounding_and_refuses_a_singular_system():
    rng = np.random.default_rng(0)
    for _ in range(200):
        m = int(rng.integers(2, 13))
        X = rng.normal(size=(30, m)) * 10.0 ** rng.uniform(-2, 2, size=m)
        A, b = X.T @ X, X.T @ rng.normal(size=30)
        A0, b0 = np.eye(m) * 0.1, rng.normal(size=m)
        ridge, prior = np.full(m, 1e-4), rng.normal(size=m)
        M = A + A0
        diag = np.diagonal(M)
        rho = ridge * np.maximum(diag, 1e-12 * max(float(diag.max()), 1e-300))
        want = np.linalg.solve(M + np.diag(rho), b + b0 + rho * prior)
        theta, ok = ridge_solve(A, A0, b, b0, ridge, prior)
        assert ok
        np.testing.assert_allclose(theta, want, rtol=1e-9, atol=1e-12)
    zero = np.zeros((3, 3))
    _, ok = ridge_solve(zero, zero, np.ones(3), np.zeros(3), np.zeros(3), np.zeros(3))
    assert not ok


def test_position_powers_are_running_products_and_sums_of_the_clipped_rates():
    rng = np.random.default_rng(1)
    a = rng.uniform(-0.2, 1.2, size=(6, 9))
    powers, cum = position_powers(a, 4)
    c = np.clip(a[:4], 0.0, 1.0)
    assert powers.shape == (5, 9)
    assert (powers[0] == 1.0).all()
    assert (powers[1:] == np.multiply.accumulate(c, axis=0)).all()
    assert (cum == np.add.accumulate(powers, axis=0)).all()


def test_the_mean_tpot_rank_and_the_best_row_are_the_numpy_expressions():
    rng = np.random.default_rng(2)
    for _ in range(50):
        R, B = int(rng.integers(1, 8)), int(rng.integers(1, 200))
        t, e = rng.uniform(0.01, 0.1, R), rng.uniform(0.0, 5.0, (R, B))
        e[0, 0] = 0.0  # a sequence expecting nothing: its time per token is capped, not inf
        want = -(t * (1.0 / np.maximum(e, 1e-12)).mean(axis=1))
        score = mean_tpot_scores(t, e)
        assert (score == want).all()
        g = rng.uniform(0, 1, R)
        score[rng.integers(0, R)] = score.max()  # ties within 1e-9 go to the higher goodput
        top = np.flatnonzero(score >= score.max() - 1e-9 * abs(score.max()))
        assert best_row(score, g) == top[np.argmax(g[top])]


def beta_beliefs(sn, sr, rn, rr, pool: float, w, R, steps: np.ndarray) -> np.ndarray:
    """The beliefs' numpy form (the planner's before it was compiled): counts ``sn`` / ``sr``
    shrunk toward ``pool`` by ``w``, the recent ``rn`` / ``rr`` weighed against ``R``; position
    j at ``(â·m + j) / (m + j)``. Scalar ``w``, ``R``: ``(K, B)``; columns ``(Gw, 1)``,
    ``(Gr, 1)``: ``(Gw, Gr, K, B)``."""
    own = (sn + w * pool) / np.maximum(sn + sr + w, 1e-12)
    mass = rn + rr + R
    if np.ndim(w):
        own = own[:, None, :]
    own = (rn + R * own) / np.maximum(mass, 1e-12)
    return (own[..., None, :] * mass[..., None, :] + steps) / (mass[..., None, :] + steps)


def _store(rng, slots, K):
    values = rng.uniform(0.0, 30.0, size=(slots, 11))
    counts = rng.integers(0, 3, size=(slots, 2 * (K + 1))).astype(float) * 0.5
    rates = rng.uniform(0.0, 1.0, size=(slots, K))
    return values, counts, rates, rng.random(slots) < 0.5


@pytest.mark.parametrize("seed", range(4))
def test_beliefs_and_pooling_are_their_numpy_forms_float_for_float(seed):
    rng = np.random.default_rng(seed)
    K, slots = 8, 40
    values, counts, rates, has = _store(rng, slots, K)
    idx = rng.permutation(slots)[:25].astype(np.intp)
    pool, w, R = 0.7, 20.0, 5.0
    steps = np.arange(K, dtype=float)[:, None]
    sn, sr, rn, rr = values[idx, :4].T
    want = beta_beliefs(sn, sr, rn, rr, pool, w, R, steps)
    belief = point_beliefs(values, idx, pool, w, R, K)
    assert (belief == want).all()
    # pooling the rounds since the last plan (numpy: sums over the batch's rows in order)
    profile, expected = rng.random(2 * (K + 1)), rng.random(K)
    c = counts[idx]
    tried = c[:, :K] + c[:, K + 2 :]
    at = np.cumsum(tried[:, ::-1], axis=1)[:, ::-1]
    prev = np.where(has[idx][:, None], rates[idx], belief.T)
    want_profile = profile + c.sum(axis=0)
    want_expected = expected + (at * prev).sum(axis=0)
    hold_to_plans(counts, rates, has, idx, belief, profile, expected, K)
    assert (profile == want_profile).all() and (expected == want_expected).all()
    assert (rates[idx] == belief.T).all() and has[idx].all() and not counts[idx].any()
    # the position factors: S_j over what the plans predicted, each toward the one before
    succ = np.cumsum((profile[: K + 1] + profile[K + 1 :])[::-1])[::-1][1:]
    prior, want_f = 1.0, []
    for sj, ej in zip(succ.tolist(), expected.tolist()):
        prior = (sj + 2.0 * prior) / (ej + 2.0)
        want_f.append(prior)
    f = position_factor(profile, expected, K)
    assert f.tolist() == want_f
    assert (scaled_capped(f, belief, 0.999) == np.minimum(f[:, None] * belief, 0.999)).all()


def _numpy_update(A, b, X, y, theta, count, scale, forget, huber):
    """``LinearCost.update_many`` in numpy (its form before it was compiled)."""
    n = len(y)
    w = forget ** np.arange(n - 1, -1, -1, dtype=float)
    r = np.abs(y - X @ theta) if count > 0.0 else np.zeros(n)
    if scale > 0.0:
        c = huber * max(scale, 0.005 * float(np.abs(y).mean()))
        w = w * np.where(r > c, c / np.maximum(r, 1e-300), 1.0)
    keep = 0.95**n
    scale = keep * scale + (1.0 - keep) * float(np.median(r)) if scale > 0.0 else float(r.mean())
    fn = forget**n
    Xw = X * w[:, None]
    return A * fn + Xw.T @ X, b * fn + Xw.T @ y, count * fn + float(w.sum()), scale


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 20])
def test_the_cost_fits_update_is_the_weighted_least_squares_update(n):
    rng = np.random.default_rng(n)
    m = 6
    for count, scale in ((0.0, 0.0), (5.0, 0.0), (5.0, 1e-3), (5.0, 1e-6)):
        A, b = np.eye(m) * rng.random(), rng.random(m)
        X, y = rng.random((n, m)), rng.random(n) * 1e-2
        theta = rng.random(m) * 1e-3
        y[0] += 1.0  # an outlier: weighted down once a typical residual is known
        wA, wb, wc, ws = _numpy_update(A, b, X, y, theta, count, scale, 0.97, 3.0)
        c2, s2 = ls_update(A, b, X, y, theta, count, scale, 0.97, 3.0)
        np.testing.assert_allclose(A, wA, rtol=1e-13)
        np.testing.assert_allclose(b, wb, rtol=1e-13)
        assert c2 == pytest.approx(wc, rel=1e-15) and s2 == pytest.approx(ws, rel=1e-13)


@pytest.mark.parametrize("seed", range(4))
def test_the_slo_floor_and_scores_are_their_numpy_forms(seed):
    rng = np.random.default_rng(seed)
    R, B, P = 5, 30, 9
    powers = np.vstack([np.ones(B), np.cumprod(rng.uniform(0.3, 1.0, (P - 1, B)), axis=0)])
    cum = np.cumsum(powers, axis=0)
    k = rng.integers(0, 4, (R, B))
    seconds, tpot = rng.uniform(0.02, 0.06, R), 0.03
    caps, kcap = np.arange(2, 2 + R), rng.integers(0, P + 2, B)
    lost = rng.random(B) < 0.2
    stretch, extra = rng.uniform(1.0, 1.5, B), np.array([0.004])
    need = (seconds[:, None] * stretch + extra) / tpot
    k_need = np.add.reduce(cum[:, None, :] < need[None, :, :], axis=0)
    bound = np.minimum(caps[:, None], kcap[None, :])
    up = (k_need > k) & (k_need <= bound) & (k_need < P) & ~lost[None, :]
    out, raised = floor_lengths(k, cum, seconds, stretch, extra, tpot, caps, kcap, lost)
    assert raised == up.any() and (out == np.where(up, k_need, k)).all()
    # each row's SLO score: the logistic chance of meeting the TPOT SLO, over the sequences
    # not lost (attainment), or the goodput times the share of tokens that meet it
    e, g = cum[k, np.arange(B)], rng.uniform(1000, 2000, R)
    dec, tok = rng.uniform(0, 5, B), rng.uniform(1, 200, B)
    t = seconds[:, None] * stretch + extra
    for hist, H in ((False, 0.0), (True, 0.0), (True, 120.0)):
        if not hist:
            pred = t / np.maximum(e, 1e-12)
        elif H:  # carried H more tokens at the row's time per token
            pred = (dec + H * t / np.maximum(e, 1e-12)) / (tok + H)
        else:  # carried 8 rounds like the row's
            pred = (dec + 8.0 * t) / (tok + 8.0 * e)
        meet = 1.0 / (1.0 + np.exp(-np.clip((tpot - pred) / (0.1 * tpot), -50.0, 50.0)))
        ek, mk = e[:, ~lost], meet[:, ~lost]
        for att in (True, False):
            want = mk.mean(axis=1) if att else g * (ek * mk).sum(axis=1) / ek.sum(axis=1)
            got = slo_scores(e, seconds, g, tpot, dec, tok, hist, 8.0, H, 0.1, lost, stretch, extra, att)  # fmt: skip
            np.testing.assert_allclose(got, want, rtol=1e-13)


def test_the_weight_grid_and_its_brier_scores_are_their_numpy_forms():
    rng = np.random.default_rng(5)
    K, slots = 6, 20
    values, counts, _, _ = _store(rng, slots, K)
    idx = np.arange(16, dtype=np.intp)
    w, R = 20.0 * np.array([0.25, 1.0, 4.0]), 8.0 * np.array([1.0, 4.0])
    sn, sr, rn, rr = values[idx, :4].T
    steps = np.arange(K, dtype=float)[:, None]
    want = beta_beliefs(sn, sr, rn, rr, 0.6, w[:, None], R[:, None], steps)
    want = want.reshape(-1, *want.shape[2:]).transpose(2, 0, 1)  # (b, G, K)
    pred = grid_beliefs(values, idx, 0.6, w, R, K)
    assert (pred == want).all()
    c, f = counts[idx], rng.uniform(0.8, 1.2, K)
    refused = c[:, :K]
    at = np.cumsum((refused + c[:, K + 2 :])[:, ::-1], axis=1)[:, ::-1]
    got = at - refused
    p = np.minimum(pred * f, 0.999)
    want = np.einsum("bk,bgk->g", at, p * p) - 2.0 * np.einsum("bk,bgk->g", got, p) + got.sum()
    np.testing.assert_allclose(brier_loss(c, pred, f, K), want, rtol=1e-13)
