"""The compiled loops of ``dspark``'s beliefs (:meth:`control.dspark_planner.DSparkPlanner.acceptance`),
read straight from the batch's arrays (:class:`~control.seqstate.SeqArrays`): each sequence's
predictive rates at one pair of weights, pooling the rounds since the last plan against what
it predicted, and the pooled position factors. The same float operations in the same order as
their numpy form (sums over the batch row after row, as numpy reduces the outer axis), so the
beliefs are numpy's float for float (``tests/control/test_kernels.py`` holds that form).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from control.seqstate import RECENT_N, RECENT_REJ, SUM_N, SUM_REJ


@njit(cache=True, error_model="numpy")
def point_beliefs(values, idx, pool, w, R, K):  # pragma: no cover - compiled
    """``(K, B)``: the predictive rates of the sequences in slots ``idx`` at weights ``(w, R)``:
    each one's counts ``sn`` / ``sr`` (accepted, refused; long-run) shrunk toward ``pool`` by
    ``w`` pseudo-trials, then its recent counts ``rn`` / ``rr`` weighed against ``R``
    pseudo-trials of that; position j (j accepted before it) at ``(â·m + j) / (m + j)``, ``m``
    the recent mass ``rn + rr + R``."""
    B = idx.shape[0]
    out = np.empty((K, B))
    for i in range(B):
        row = values[idx[i]]
        sn, sr, rn, rr = row[SUM_N], row[SUM_REJ], row[RECENT_N], row[RECENT_REJ]
        own = (sn + w * pool) / max(sn + sr + w, 1e-12)
        mass = rn + rr + R
        own = (rn + R * own) / max(mass, 1e-12)
        top = own * mass
        for j in range(K):
            out[j, i] = (top + j) / (mass + j)
    return out


@njit(cache=True, error_model="numpy")
def hold_to_plans(counts, rates, has_rates, idx, belief, profile, expected, K):  # fmt: skip  # pragma: no cover - compiled
    """Pool the rounds of slots ``idx`` since the last plan (``counts``) into ``profile``, what
    that plan predicted for the positions they tried into ``expected``; then give each slot
    the rates ``belief`` (``(K, B)``) and clear its counts (in place)."""
    B, W = idx.shape[0], counts.shape[1]
    nonzero = False
    for i in range(B):
        for c in range(W):
            if counts[idx[i], c] != 0.0:
                nonzero = True
    if nonzero:
        tot = np.zeros(W)
        for i in range(B):
            for c in range(W):
                tot[c] += counts[idx[i], c]
        for c in range(W):
            profile[c] += tot[c]
        add = np.zeros(K)
        at = np.empty(K)
        for i in range(B):
            s = idx[i]
            # rounds by positions tried, t = 1..K: refused after t − 1, or all t accepted;
            # trials at position j: those that tried j or more
            run = 0.0
            for j in range(K - 1, -1, -1):
                run += counts[s, j] + counts[s, K + 2 + j]
                at[j] = run
            for j in range(K):
                prev = rates[s, j] if has_rates[s] else belief[j, i]
                add[j] += at[j] * prev
        for j in range(K):
            expected[j] += add[j]
    for i in range(B):
        s = idx[i]
        for j in range(K):
            rates[s, j] = belief[j, i]
        has_rates[s] = True
        for c in range(W):
            counts[s, c] = 0.0


@njit(cache=True, error_model="numpy")
def position_factor(profile, expected, K):  # pragma: no cover - compiled
    """Per position j = 1..K: successes over what the plans predicted there, each shrunk toward
    the one before it (the first toward 1): ``r_j = (S_j + 2·r_{j−1}) / (E_j + 2)``, ``S_j``
    the pooled rounds that accepted j − 1 or more and went on."""
    succ = np.empty(K + 1)
    run = 0.0
    for n in range(K, -1, -1):
        run += profile[n] + profile[K + 1 + n]
        succ[n] = run
    f = np.empty(K)
    prior = 1.0
    for j in range(K):
        prior = (succ[j + 1] + 2.0 * prior) / (expected[j] + 2.0)
        f[j] = prior
    return f


@njit(cache=True, error_model="numpy")
def scaled_capped(f, belief, cap):  # pragma: no cover - compiled
    """``min(f_j · belief_ji, cap)``."""
    K, B = belief.shape
    out = np.empty((K, B))
    for j in range(K):
        for i in range(B):
            out[j, i] = min(f[j] * belief[j, i], cap)
    return out


@njit(cache=True, error_model="numpy")
def grid_beliefs(values, idx, pool, w, R, K):  # pragma: no cover - compiled
    """``(b, Gw·Gr, K)``: every grid point's predictive rates for the sequences in slots ``idx``
    (:func:`point_beliefs` at each ``(w_a, R_c)``, point ``a·Gr + c``)."""
    B, Gw, Gr = idx.shape[0], w.shape[0], R.shape[0]
    out = np.empty((B, Gw * Gr, K))
    for i in range(B):
        row = values[idx[i]]
        sn, sr, rn, rr = row[SUM_N], row[SUM_REJ], row[RECENT_N], row[RECENT_REJ]
        for a in range(Gw):
            own0 = (sn + w[a] * pool) / max(sn + sr + w[a], 1e-12)
            for c in range(Gr):
                mass = rn + rr + R[c]
                own = (rn + R[c] * own0) / max(mass, 1e-12)
                top = own * mass
                for j in range(K):
                    out[i, a * Gr + c, j] = (top + j) / (mass + j)
    return out


@njit(cache=True, error_model="numpy")
def brier_loss(counts, pred, factor, K):  # pragma: no cover - compiled
    """Per grid point, the Brier score of the rounds in ``counts`` (rows by accepted n: refused
    after n, or all n accepted) at the predictions ``pred`` (``(b, G, K)``) times ``factor``,
    capped at 0.999: ``Σ at·p² − 2·Σ got·p + Σ got`` over sequences and positions (``at`` the
    rounds that tried a position, ``got`` those that had it accepted)."""
    b, G = pred.shape[0], pred.shape[1]
    sq, lin = np.zeros(G), np.zeros(G)
    total = 0.0
    at = np.empty(K)
    got = np.empty(K)
    for i in range(b):
        run = 0.0
        for j in range(K - 1, -1, -1):
            run += counts[i, j] + counts[i, K + 2 + j]
            at[j] = run
        for j in range(K):
            got[j] = at[j] - counts[i, j]
            total += got[j]
        for g in range(G):
            for j in range(K):
                p = min(pred[i, g, j] * factor[j], 0.999)
                sq[g] += at[j] * (p * p)
                lin[g] += got[j] * p
    return sq - 2.0 * lin + total
