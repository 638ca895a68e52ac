"""The fitted round costs of :meth:`control.costmodel.RoundCostModel.functions` as compiled
functions of one parameter vector (numba), so that a plan reads them without a Python call a
row (:mod:`control.goodput_kernel`), and the :class:`~control.goodput.CostFunctions` callables
every other reader uses are the same functions over arrays.

The vector (``SPEC_*`` offsets) holds the verify line at the round's context (intercept
``v0``, slope ``v1``, a hinge ``h_j`` at each knot ``κ_j``), how prompt chunks share the pass
(``KIND_*``: none; a token budget ``cap`` with ``backlog`` prompt tokens waiting; a fixed
``pre`` prompt tokens), the prompt penalty (``value`` output tokens per displaced prompt token,
``free`` prompt tokens a plain round would carry) and a draft step (``s0 + s1·drafting``):

- ``raw(N) = max(v0 + v1·N + Σ_j h_j·max(N − κ_j, 0), 0)``, its slope ``max(v1 + Σ_{κ_j < N}
  h_j, 0)``;
- the chunk beside ``N`` verified tokens: ``min(backlog, max(cap − N, 0))`` under a budget, ``pre``
  without one; the verify seconds charged to the drafts ``raw(N + p) − (raw(p) − raw(0))``, and
  its slope the chunk's own while drafts push prompt tokens out of the pass;
- the penalty ``value · max(free − p(N), 0)`` and its slope (``value`` once the pass is full);
- a draft step ``max(s0 + s1·d, 0)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from control.pairwise import pairwise_sum

#: how prompt chunks share the verify pass
KIND_NONE, KIND_BUDGET, KIND_SHARED = 0.0, 1.0, 2.0
#: offsets in the parameter vector; the knots, then their hinges, follow ``SPEC_HEAD``
SPEC_KIND, SPEC_V0, SPEC_V1, SPEC_BACKLOG, SPEC_CAP, SPEC_PRE = 0, 1, 2, 3, 4, 5
SPEC_BASE, SPEC_VALUE, SPEC_FREE, SPEC_S0, SPEC_S1, SPEC_NK, SPEC_HEAD = 6, 7, 8, 9, 10, 11, 12


def cost_spec(
    kind: float,
    v0: float,
    v1: float,
    knots: np.ndarray,
    hinge: np.ndarray,
    s0: float,
    s1: float,
    backlog: float = 0.0,
    cap: float = 0.0,
    pre: float = 0.0,
    value: float = 0.0,
    free: float = 0.0,
) -> np.ndarray:
    """The parameter vector (``raw(0)``, the chunk path's base, filled in from the line)."""
    knots = np.ascontiguousarray(knots, dtype=float)
    hinge = np.ascontiguousarray(hinge, dtype=float)
    f = float
    return _spec(f(kind), f(v0), f(v1), f(backlog), f(cap), f(pre), f(value), f(free), f(s0), f(s1), knots, hinge)  # fmt: skip


@njit(cache=True, error_model="numpy")
def _spec(kind, v0, v1, backlog, cap, pre, value, free, s0, s1, knots, hinge):  # fmt: skip  # pragma: no cover - compiled
    """:func:`cost_spec`'s vector, compiled."""
    nk = knots.shape[0]
    spec = np.empty(SPEC_HEAD + nk + hinge.shape[0])
    spec[SPEC_KIND], spec[SPEC_V0], spec[SPEC_V1] = kind, v0, v1
    spec[SPEC_BACKLOG], spec[SPEC_CAP], spec[SPEC_PRE] = backlog, cap, pre
    spec[SPEC_BASE], spec[SPEC_VALUE], spec[SPEC_FREE] = 0.0, value, free
    spec[SPEC_S0], spec[SPEC_S1], spec[SPEC_NK] = s0, s1, nk
    spec[SPEC_HEAD : SPEC_HEAD + nk] = knots
    spec[SPEC_HEAD + nk :] = hinge
    spec[SPEC_BASE] = raw(spec, 0.0)
    return spec


@njit(cache=True, error_model="numpy")
def raw(spec: np.ndarray, n: float) -> float:  # pragma: no cover - compiled
    """The verify line at ``n`` verified tokens, never negative."""
    nk = int(spec[SPEC_NK])
    dot = 0.0
    for j in range(nk):
        dot += max(n - spec[SPEC_HEAD + j], 0.0) * spec[SPEC_HEAD + nk + j]
    return max(spec[SPEC_V0] + spec[SPEC_V1] * n + dot, 0.0)


@njit(cache=True, error_model="numpy")
def raw_slope(spec: np.ndarray, n: float) -> float:  # pragma: no cover - compiled
    """∂raw/∂N at ``n`` (the hinges below it), never negative."""
    nk = int(spec[SPEC_NK])
    dot = 0.0
    for j in range(nk):
        dot += (1.0 if n > spec[SPEC_HEAD + j] else 0.0) * spec[SPEC_HEAD + nk + j]
    return max(spec[SPEC_V1] + dot, 0.0)


@njit(cache=True, error_model="numpy")
def chunk(spec: np.ndarray, n: float) -> float:  # pragma: no cover - compiled
    """Prompt tokens sharing the pass with ``n`` verified ones."""
    if spec[SPEC_KIND] == KIND_BUDGET:
        return min(spec[SPEC_BACKLOG], max(spec[SPEC_CAP] - n, 0.0))
    if spec[SPEC_KIND] == KIND_SHARED:
        return spec[SPEC_PRE]
    return 0.0


@njit(cache=True, error_model="numpy")
def verify(spec: np.ndarray, n: float) -> float:  # pragma: no cover - compiled
    """Verify seconds charged to ``n`` verified tokens (the chunk's own share left out)."""
    if spec[SPEC_KIND] == KIND_NONE:
        return raw(spec, n)
    p = chunk(spec, n)
    return raw(spec, n + p) - (raw(spec, p) - spec[SPEC_BASE])


@njit(cache=True, error_model="numpy")
def verify_slope(spec: np.ndarray, n: float) -> float:  # pragma: no cover - compiled
    """Seconds per extra verified token at ``n``."""
    if spec[SPEC_KIND] == KIND_NONE:
        return raw_slope(spec, n)
    p = chunk(spec, n)
    if spec[SPEC_KIND] == KIND_BUDGET and p < spec[SPEC_BACKLOG] and n < spec[SPEC_CAP]:
        return raw_slope(spec, p)
    return raw_slope(spec, n + p)


@njit(cache=True, error_model="numpy")
def penalty(spec: np.ndarray, n: float) -> float:  # pragma: no cover - compiled
    """Output tokens the prompt tokens pushed out of the pass are worth."""
    return spec[SPEC_VALUE] * max(spec[SPEC_FREE] - chunk(spec, n), 0.0)


@njit(cache=True, error_model="numpy")
def penalty_slope(spec: np.ndarray, n: float) -> float:  # pragma: no cover - compiled
    """The penalty's slope: ``value`` once the drafts fill the pass."""
    return 0.0 if n + spec[SPEC_BACKLOG] < spec[SPEC_CAP] else spec[SPEC_VALUE]


@njit(cache=True, error_model="numpy")
def step(spec: np.ndarray, d: float) -> float:  # pragma: no cover - compiled
    """One draft step over ``d`` drafting rows."""
    return max(spec[SPEC_S0] + spec[SPEC_S1] * d, 0.0)


@njit(cache=True, error_model="numpy")
def _many(spec: np.ndarray, x: np.ndarray, which: int) -> np.ndarray:  # pragma: no cover
    out = np.empty(x.size)
    flat = x.ravel()
    for i in range(x.size):
        v = flat[i]
        if which == 0:
            out[i] = verify(spec, v)
        elif which == 1:
            out[i] = verify_slope(spec, v)
        elif which == 2:
            out[i] = penalty(spec, v)
        elif which == 3:
            out[i] = penalty_slope(spec, v)
        elif which == 4:
            out[i] = step(spec, v)
        else:
            out[i] = raw(spec, v)
    return out


@njit(cache=True, error_model="numpy")
def tables(spec: np.ndarray, n_lo: int, n_hi: int, d_hi: int):  # pragma: no cover - compiled
    """The tables :func:`control.goodput_kernel.plan_rows` reads: verify seconds, their slope,
    the penalty and its slope at ``n_lo..n_hi`` verified tokens, to be filled where a plan
    reads them (:func:`fill_tables_at`; ``have`` marks the rows filled: a plan's few rows of a
    table as long as ``B · k_max``), and a draft step at ``1..d_hi`` drafting rows, whole."""
    m = n_hi - n_lo + 1
    st = np.empty(d_hi)
    for i in range(d_hi):
        st[i] = step(spec, float(i + 1))
    return np.empty(m), np.empty(m), np.empty(m), np.empty(m), st, np.zeros(m, dtype=np.bool_)


@njit(cache=True, error_model="numpy")
def fill_tables_at(spec, n_lo, i, vs, vsl, pen, psl, have):  # fmt: skip  # pragma: no cover - compiled
    """Row ``i`` (``n_lo + i`` verified tokens) of the tables of :func:`tables`, unless
    ``have`` says it is filled (always, for tables filled whole by callables)."""
    if not have[i]:
        n = float(n_lo + i)
        vs[i] = verify(spec, n)
        vsl[i] = verify_slope(spec, n)
        pen[i] = penalty(spec, n)
        psl[i] = penalty_slope(spec, n)
        have[i] = True


#: the functions :class:`SpecFunction` evaluates, by name
WHICH = {"verify": 0, "verify_slope": 1, "penalty": 2, "penalty_slope": 3, "step": 4, "raw": 5}


class SpecFunction:
    """One of the functions above as a vectorised callable of its argument (any shape)."""

    __slots__ = ("spec", "which")

    def __init__(self, spec: np.ndarray, name: str) -> None:
        self.spec, self.which = spec, WHICH[name]

    def __call__(self, x: float | Sequence[float] | np.ndarray) -> np.ndarray:
        a = np.asarray(x, dtype=float)
        flat = np.ascontiguousarray(a)  # (at least 1-d)
        return _many(self.spec, flat, self.which).reshape(a.shape)


@njit(cache=True, error_model="numpy")
def ridge_solve(A, A0, b, b0, ridge, prior):  # pragma: no cover - compiled
    """``θ`` of :attr:`control.costmodel.LinearCost.theta`: ``(A + A₀ + diag ρ) θ = b + b₀ +
    ρ·prior`` with ``ρ_j = ridge_j · max(diag_j, 1e-12 · max(max diag, 1e-300))``, by Gaussian
    elimination with partial pivoting (as LAPACK's ``gesv``); ``(θ, False)`` when a pivot is 0
    (a singular system: the caller keeps its prior)."""
    n = b.shape[0]
    M = A + A0
    dmax = M[0, 0]
    for j in range(1, n):
        dmax = max(dmax, M[j, j])
    floor = 1e-12 * max(dmax, 1e-300)
    x = b + b0
    for j in range(n):
        rho = ridge[j] * max(M[j, j], floor)
        M[j, j] = M[j, j] + rho
        x[j] = x[j] + rho * prior[j]
    for c in range(n):
        p = c
        for r in range(c + 1, n):
            if abs(M[r, c]) > abs(M[p, c]):
                p = r
        if M[p, c] == 0.0:
            return x, False
        if p != c:
            for j in range(n):
                M[c, j], M[p, j] = M[p, j], M[c, j]
            x[c], x[p] = x[p], x[c]
        for r in range(c + 1, n):
            f = M[r, c] / M[c, c]
            for j in range(c, n):
                M[r, j] -= f * M[c, j]
            x[r] -= f * x[c]
    for c in range(n - 1, -1, -1):
        s = x[c]
        for j in range(c + 1, n):
            s -= M[c, j] * x[j]
        x[c] = s / M[c, c]
    return x, True


@njit(cache=True, error_model="numpy")
def _small_median(x):  # pragma: no cover - compiled
    """``np.median`` of ``x`` (the mean of the two middle values of an even count)."""
    v = np.sort(x)
    h = len(v) // 2
    return v[h] if len(v) % 2 else (v[h - 1] + v[h]) / 2.0


@njit(cache=True, error_model="numpy")
def ls_update(A, b, X, y, theta, count, scale, forget, huber):  # fmt: skip  # pragma: no cover - compiled
    """:meth:`control.costmodel.LinearCost.update_many` on its sufficient statistics ``A``,
    ``b`` (in place): rows ``X`` (oldest first) with targets ``y`` weighed ``forget`` to the
    age of each and, when ``huber`` > 0 and a typical residual ``scale`` is known, down by
    Huber's weight against the fit ``theta`` (read when ``count`` > 0). Returns the new count
    and scale."""
    n, m = X.shape
    w = np.empty(n)
    for r in range(n):
        w[r] = forget ** float(n - 1 - r)  # the newest row weighs 1
    if huber > 0.0:
        res = np.zeros(n)
        if count > 0.0:
            for r in range(n):
                p = 0.0
                for j in range(m):
                    p += X[r, j] * theta[j]
                res[r] = abs(y[r] - p)
        s = scale
        if s > 0.0:
            # never finer than 0.5% of the rows' own size: exact data must not make every
            # later change an outlier
            c = huber * max(s, 0.005 * (pairwise_sum(np.abs(y), 0, n) / n))
            for r in range(n):
                if res[r] > c:
                    w[r] = w[r] * (c / res[r])
        keep = 0.95 ** float(n)
        if s > 0.0:
            scale = keep * s + (1.0 - keep) * _small_median(res)
        else:
            scale = pairwise_sum(res, 0, n) / n
    fn = forget ** float(n)
    for i in range(m):
        for j in range(m):
            acc = 0.0
            for r in range(n):
                acc += X[r, i] * w[r] * X[r, j]
            A[i, j] = A[i, j] * fn + acc
        acc = 0.0
        for r in range(n):
            acc += X[r, i] * w[r] * y[r]
        b[i] = b[i] * fn + acc
    return count * fn + pairwise_sum(w, 0, n), scale


@njit(cache=True, error_model="numpy")
def verify_rows(n, ctx, knots):  # pragma: no cover - compiled
    """Feature rows ``[1, N, ctx/1000, max(N − κ, 0)...]`` of the verify fit (``n``, ``ctx``:
    one per row)."""
    m, nk = n.shape[0], knots.shape[0]
    out = np.empty((m, 3 + nk))
    for r in range(m):
        out[r, 0] = 1.0
        out[r, 1] = n[r]
        out[r, 2] = ctx[r] / 1000.0
        for j in range(nk):
            out[r, 3 + j] = max(n[r] - knots[j], 0.0)
    return out


@njit(cache=True, error_model="numpy")
def draft_rows(k, d, ctx, pre, phase):  # pragma: no cover - compiled
    """Feature rows ``[phase, k, k·d, k·ctx/1000, pre/1000]`` of the draft fit (one entry of
    each per row); ``phase`` NaN: 1 where the row drafts (``k > 0``), else 0."""
    m = d.shape[0]
    out = np.empty((m, 5))
    for r in range(m):
        out[r, 0] = (1.0 if k[r] > 0 else 0.0) if np.isnan(phase) else phase
        out[r, 1] = k[r]
        out[r, 2] = k[r] * d[r]
        out[r, 3] = k[r] * ctx[r] / 1000.0
        out[r, 4] = pre[r] / 1000.0
    return out


@njit(cache=True, error_model="numpy")
def fold_rows(a, knots):  # pragma: no cover - compiled
    """The buffered rounds ``a`` (rows: verify + prompt tokens, context, verify seconds, draft
    steps, drafting rows, draft seconds, drafter prefill) as the two fits' rows and targets:
    every round for the verify fit, the rounds with a draft phase (steps or drafter prefill)
    for the draft fit."""
    m = a.shape[0]
    Xv = verify_rows(a[:, 0], a[:, 1], knots)
    keep = np.zeros(m, dtype=np.bool_)
    for r in range(m):
        keep[r] = a[r, 3] > 0 or a[r, 6] > 0
    d = a[keep]
    Xd = draft_rows(d[:, 3], d[:, 4], d[:, 1], d[:, 6], np.nan)
    return Xv, a[:, 2].copy(), Xd, d[:, 5].copy()
