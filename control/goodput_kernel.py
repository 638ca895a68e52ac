"""The compiled loop of :func:`control.goodput.plan_round_lengths` (numba, no Python objects).

The goodput choice iterates Dinkelbach's condition over (caps × sequences × draft positions);
at the batch sizes a serving engine runs (16-256 sequences, 16 positions, ~7 caps) its numpy
form is ~50 calls on arrays of a few thousand floats, so interpreter and call overhead, not
arithmetic, set its cost. This module runs the same operations, in the same order, as one
compiled loop: the round counts, round times and goodput of every row, the positions that pay,
the join cost of a sequence that starts drafting, until the lengths stop moving.

The round-time pieces stay the cost model's (one home for it): the loop reads tables over
every token count and drafting count a plan can reach, the rows of a fitted model's token-count
tables computed by :mod:`control.cost_kernel` where the loop first reads them (a plan reads a
few of the ``B · k_max`` a batch could reach), other :class:`~control.goodput.CostFunctions`
callables tabulated whole. Sums over a batch follow numpy's pairwise summation
(:func:`~control.pairwise.pairwise_sum`), so a row's expected tokens are the float numpy would
give. Tabulating a callable evaluates the fitted line's hinge product on a longer array than
the loop's rows, and BLAS may sum that 9-term product in another order by array length: round
times can move in their last bit (a relative 1e-16), as they do between two machines' BLAS
kernels.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from control.cost_kernel import fill_tables_at
from control.pairwise import pairwise_sum


@njit(cache=True, error_model="numpy")
def _rows(k, cum, n_lo, spec, have, vs_tab, vsl_tab, pen_tab, psl_tab, has_pen, step_tab, block, fixed, overhead, t0, shared, w_mean, n, d, t, g, e):  # fmt: skip  # pragma: no cover - compiled
    """Per row of ``k``: verified tokens ``n``, drafting sequences ``d``, round time ``t``,
    goodput ``g`` and expected tokens ``e`` (the tables' rows at ``n`` filled first).
    The goodput is the expected tokens less the prompt penalty over the round's time, with the
    time beyond a plain decoding round ``t0`` weighed by 1 / mean α (the planner's cost
    weighting) and the ``shared`` seconds every row pays left out."""
    R, B = k.shape
    for r in range(R):
        tot, mx, cnt = 0, 0, 0
        for i in range(B):
            x = k[r, i]
            tot += x
            if x > mx:
                mx = x
            if x != 0:
                cnt += 1
            e[r, i] = cum[x, i]
        n[r], d[r] = tot + B, cnt
        fill_tables_at(spec, n_lo, n[r] - n_lo, vs_tab, vsl_tab, pen_tab, psl_tab, have)
        st = min(mx, 1) if block else mx
        draft = fixed + st * step_tab[max(cnt, 1) - 1] if st > 0 else 0.0
        t[r] = draft + vs_tab[n[r] - n_lo] + overhead
        value = pairwise_sum(e[r], 0, B)
        if has_pen:
            value = value - pen_tab[n[r] - n_lo]
        g[r] = value / max(t0 - shared + (t[r] - t0) / w_mean, 1e-12)


@njit(cache=True, error_model="numpy")
def plan_rows(powers, cum, bound, per_step, w, shared, iterations, spec, have, vs_tab, vsl_tab, pen_tab, has_pen, psl_tab, has_pslope, step_tab, block, fixed, overhead):  # fmt: skip  # pragma: no cover - compiled
    """The draft lengths of every cap's row, its goodput, round time and expected tokens:
    :func:`control.goodput.plan_round_lengths` from ``bound`` (rows × sequences) on. Tables
    are indexed by ``n − B`` (verified tokens: verify seconds, its slope, the prompt penalty
    and its slope) and ``d − 1`` (drafting sequences: a draft step's seconds); the former's
    rows are filled from ``spec`` where ``have`` says they are not yet (:func:`tables`)."""
    R, B = bound.shape
    P = powers.shape[0]
    n_lo = B  # every sequence verifies at least its bonus token
    fill_tables_at(spec, n_lo, 0, vs_tab, vsl_tab, pen_tab, psl_tab, have)
    t0 = vs_tab[0] + overhead  # a round of plain decoding
    w_mean = pairwise_sum(w, 0, B) / B if B else 1.0  # w.mean(): the same sum and division
    ones = True  # every α 1: x / 1.0 is x, so the divisions are skipped
    for i in range(B):
        if w[i] != 1.0:
            ones = False
    k = bound.copy()
    n = np.empty(R, dtype=np.int64)
    d = np.empty(R, dtype=np.int64)
    t = np.empty(R)
    g = np.empty(R)
    e = np.empty((R, B))
    k_new = np.empty_like(k)
    _rows(k, cum, n_lo, spec, have, vs_tab, vsl_tab, pen_tab, psl_tab, has_pen, step_tab, block, fixed, overhead, t0, shared, w_mean, n, d, t, g, e)  # fmt: skip
    for _ in range(iterations):
        same = True
        for r in range(R):
            gv = g[r] * vsl_tab[n[r] - n_lo]
            ps = psl_tab[n[r] - n_lo] if has_pslope else 0.0
            join = g[r] * (per_step[r] * (step_tab[d[r]] - step_tab[max(d[r], 1) - 1]))
            for i in range(B):
                thr = gv if ones else gv / w[i]
                if has_pslope:
                    thr = thr + ps
                # positions whose survival pays, up to the row's bound (survival never rises
                # along the draft: each power is the one before times a rate in [0, 1])
                ks, cap = 0, min(bound[r, i], P - 1)
                while ks < cap and powers[ks + 1, i] >= thr:
                    ks += 1
                x = ks if cum[ks, i] - 1.0 >= thr * ks + (join if ones else join / w[i]) else 0
                k_new[r, i] = x
                if x != k[r, i]:
                    same = False
        if same:
            break
        k[:, :] = k_new
        _rows(k, cum, n_lo, spec, have, vs_tab, vsl_tab, pen_tab, psl_tab, has_pen, step_tab, block, fixed, overhead, t0, shared, w_mean, n, d, t, g, e)  # fmt: skip
    return k, g, t, e


@njit(cache=True, error_model="numpy")
def position_powers(a: np.ndarray, K: int):  # pragma: no cover - compiled
    """``(rows + 1, B)``: P(token j accepted) from per-position rates ``a`` (``(rows, B)``, each
    clipped to [0, 1], at most ``K`` rows read) and its running sum (``E(a_i, k)`` at row k),
    each row the one before times (plus) the next, as numpy accumulates."""
    rows = min(a.shape[0], K)
    B = a.shape[1]
    powers = np.empty((rows + 1, B))
    cum = np.empty((rows + 1, B))
    for i in range(B):
        powers[0, i] = 1.0
        cum[0, i] = 1.0
    for j in range(rows):
        for i in range(B):
            x = a[j, i]
            if x < 0.0:
                x = 0.0
            if x > 1.0:
                x = 1.0
            powers[j + 1, i] = x if j == 0 else powers[j, i] * x
            cum[j + 1, i] = cum[j, i] + powers[j + 1, i]
    return powers, cum


@njit(cache=True, error_model="numpy")
def cap_bounds(kcap: np.ndarray, K: int, lo: int, hi: int):  # pragma: no cover - compiled
    """Each cap's row of per-sequence bounds ``min(cap, kcap_i, K)`` (caps ``lo..hi``), the
    most draft tokens a row can hold, and the longest bound."""
    R, B = hi - lo + 1, kcap.shape[0]
    bound = np.empty((R, B), dtype=np.int64)
    most, top = 0, 0
    for r in range(R):
        tot = 0
        for i in range(B):
            x = min(lo + r, kcap[i], K)
            bound[r, i] = x
            tot += x
            top = max(top, x)
        most = max(most, tot)
    return bound, most, top


@njit(cache=True, error_model="numpy")
def best_row(score: np.ndarray, goodput: np.ndarray) -> int:  # pragma: no cover - compiled
    """The row of the highest ``score``, the higher goodput among rows within 1e-9 of it
    (relative), then the first (:func:`control.goodput._best_row`)."""
    top = score[0]
    for r in range(1, score.shape[0]):
        if score[r] > top:
            top = score[r]
    floor = top - 1e-9 * abs(top)
    best = -1
    for r in range(score.shape[0]):
        if score[r] >= floor and (best < 0 or goodput[r] > goodput[best]):
            best = r
    return best


@njit(cache=True, error_model="numpy")
def mean_tpot_scores(seconds: np.ndarray, expected: np.ndarray):  # pragma: no cover - compiled
    """Per row, minus ``T_r · mean_i 1 / max(E_ir, 1e-12)`` (:func:`control.goodput.mean_tpot_row`)."""
    R, B = expected.shape
    buf = np.empty(B)
    out = np.empty(R)
    for r in range(R):
        for i in range(B):
            buf[i] = 1.0 / max(expected[r, i], 1e-12)
        out[r] = -(seconds[r] * (pairwise_sum(buf, 0, B) / B))
    return out


@njit(cache=True, error_model="numpy")
def floor_lengths(k, cum, seconds, stretch, extra, tpot, caps, kcap, lost):  # fmt: skip  # pragma: no cover - compiled
    """The rows ``k`` with each sequence raised to the shortest length whose expected tokens
    reach what a round needs to meet ``tpot`` (``(T_r · stretch_i + extra_i) / tpot``; one
    ``stretch`` / ``extra`` for all or one per sequence) where one within ``min(cap_r, kcap_i)``
    and the known positions does, ``lost`` sequences left alone
    (:func:`control.goodput.slo_floor_plan`); and whether any was raised."""
    R, B = k.shape
    P = cum.shape[0]
    out = k.copy()
    raised = False
    for r in range(R):
        for i in range(B):
            if lost[i]:
                continue
            s = stretch[i] if stretch.shape[0] > 1 else stretch[0]
            x = extra[i] if extra.shape[0] > 1 else extra[0]
            need = (seconds[r] * s + x) / tpot
            kn = 0
            for j in range(P):
                if cum[j, i] < need:
                    kn += 1
            if kn > k[r, i] and kn <= min(caps[r], kcap[i]) and kn < P:
                out[r, i] = kn
                raised = True
    return out, raised


@njit(cache=True, error_model="numpy")
def slo_scores(e, seconds, goodput, tpot, decode, tokens, has_history, horizon, horizon_tokens, spread, lost, stretch, extra, attainment):  # fmt: skip  # pragma: no cover - compiled
    """Per row, the score :func:`control.goodput.slo_goodput_row` ranks by: the expected share
    of the sequences not ``lost`` that meet ``tpot`` (``attainment``), or the row's goodput
    times the share of their expected tokens that do; the chance of meeting it logistic in
    the predicted TPOT (``spread`` × ``tpot`` wide; 0: the hard cut). With a history, the TPOT
    so far is carried ``horizon_tokens`` more tokens at the row's time per token when that is
    > 0, else ``horizon`` rounds like the row's."""
    R, B = e.shape
    keep = 0
    for i in range(B):
        if not lost[i]:
            keep += 1
    meet = np.empty(keep)
    em = np.empty(keep)
    ek = np.empty(keep)
    out = np.empty(R)
    for r in range(R):
        c = 0
        for i in range(B):
            if lost[i]:
                continue
            s = stretch[i] if stretch.shape[0] > 1 else stretch[0]
            x = extra[i] if extra.shape[0] > 1 else extra[0]
            t = seconds[r] * s + x
            if has_history and horizon_tokens > 0.0:
                pred = (decode[i] + horizon_tokens * t / max(e[r, i], 1e-12)) / (
                    tokens[i] + horizon_tokens
                )
            elif has_history:
                pred = (decode[i] + horizon * t) / (tokens[i] + horizon * e[r, i])
            else:
                pred = t / max(e[r, i], 1e-12)
            if spread > 0.0:
                z = min(max((tpot - pred) / (spread * tpot), -50.0), 50.0)
                m = 1.0 / (1.0 + np.exp(-z))
            else:
                m = 1.0 if pred <= tpot else 0.0
            meet[c] = m
            em[c] = e[r, i] * m
            ek[c] = e[r, i]
            c += 1
        if attainment:
            out[r] = pairwise_sum(meet, 0, keep) / keep
        else:
            out[r] = goodput[r] * pairwise_sum(em, 0, keep) / max(pairwise_sum(ek, 0, keep), 1e-12)
    return out
