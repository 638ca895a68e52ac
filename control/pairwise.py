"""Sums in numpy's pairwise order, compiled (numba): a compiled loop that sums a batch this way
gives the float numpy's ``a.sum()`` would, so the planner's kernels and their numpy forms agree
bit for bit (:mod:`control.goodput_kernel`, :mod:`control.cost_kernel`)."""

from __future__ import annotations

import numpy as np
from numba import njit

#: numpy's pairwise summation: blocks of at most this many elements are summed by 8 partial
#: sums (numpy/core/src/umath/loops_utils.h.src, PW_BLOCKSIZE)
PW_BLOCKSIZE = 128


@njit(cache=True, error_model="numpy")
def _block_sum(a: np.ndarray, lo: int, n: int) -> float:  # pragma: no cover - compiled
    """``a[lo:lo + n].sum()`` for ``n ≤ PW_BLOCKSIZE`` in numpy's order: a plain loop below 8
    elements, else 8 interleaved partial sums, combined pairwise, then the rest in turn."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[lo + i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    end = n - n % 8
    while i < end:
        j = lo + i
        r0 += a[j]
        r1 += a[j + 1]
        r2 += a[j + 2]
        r3 += a[j + 3]
        r4 += a[j + 4]
        r5 += a[j + 5]
        r6 += a[j + 6]
        r7 += a[j + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit(cache=True, error_model="numpy")
def pairwise_sum(a: np.ndarray, lo: int, n: int) -> float:  # pragma: no cover - compiled
    """``a[lo:lo + n].sum()`` in numpy's order: blocks of at most ``PW_BLOCKSIZE``
    (:func:`_block_sum`), a longer range split in halves at a multiple of 8 and summed left
    plus right (numpy recurses; this walks the same tree with a stack: a compiled function
    that calls itself cannot be cached)."""
    if n <= PW_BLOCKSIZE:
        return _block_sum(a, lo, n)
    f_lo = np.empty(64, dtype=np.int64)  # frames: range start, length, halves done
    f_n = np.empty(64, dtype=np.int64)
    f_stage = np.empty(64, dtype=np.int64)
    vals = np.empty(64)  # sums of finished ranges, left before right
    top, nv = 0, 0
    f_lo[0], f_n[0], f_stage[0] = lo, n, 0
    while top >= 0:
        m = f_n[top]
        if m <= PW_BLOCKSIZE:
            vals[nv] = _block_sum(a, f_lo[top], m)
            nv += 1
            top -= 1
            continue
        h = m // 2
        h -= h % 8
        if f_stage[top] == 0:
            f_stage[top] = 1
            f_lo[top + 1], f_n[top + 1], f_stage[top + 1] = f_lo[top], h, 0
            top += 1
        elif f_stage[top] == 1:
            f_stage[top] = 2
            f_lo[top + 1], f_n[top + 1], f_stage[top + 1] = f_lo[top] + h, m - h, 0
            top += 1
        else:
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
            top -= 1
    return vals[0]
