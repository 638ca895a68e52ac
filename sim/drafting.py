"""What a round drafts and accepts, for a whole batch at once: pure numpy functions.

``cap_draft_lengths``: the engine's cuts of the controllers' k. ``confidence_stop``: the τ stop
(drafting stops before the first drafted token whose confidence is below τ; the drafter step
that produced it was still run). ``resample_lossy``: threshold mode, the strictly rejected
tokens that still pass the β rule.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def cap_draft_lengths(
    k: np.ndarray, max_draft: int | None, last_useful: np.ndarray | None
) -> np.ndarray:
    """``k`` cut to the engine cap ``max_draft`` (None: none) and, per sequence, to
    ``last_useful`` (its remaining tokens − 1, never below 0; None: no such cut)."""
    if max_draft is not None:
        k = np.minimum(k, max_draft)
    if last_useful is not None:
        k = np.minimum(k, np.maximum(last_useful, 0))
    return k


def confidence_stop(
    confidences: np.ndarray, tau: np.ndarray, k: np.ndarray, survival: np.ndarray | None = None
) -> tuple[np.ndarray, int]:
    """Drafted tokens per sequence under the τ and survival stops
    (:func:`control.types.draft_stop`), and the drafter steps the batch ran.

    ``confidences``: (batch, max k) drafter confidences; ``tau``, ``survival``: per sequence
    (0 = no stop); ``k``: the draft lengths asked for. A sequence whose τ stop fires at token j
    drafted j tokens and ran j + 1 drafter steps; the survival stop cuts the drafted block
    afterwards (as the engine does), so it saves no step; the batch runs as many steps as its
    longest sequence.
    """
    position = np.arange(confidences.shape[1])
    inside = position[None, :] < k[:, None]
    below = (confidences < tau[:, None]) & inside
    tau_cut = np.where(below.any(axis=1), below.argmax(axis=1), k)
    steps = int(np.where(tau_cut < k, tau_cut + 1, k).max())
    if survival is None or not survival.any():
        return tau_cut, steps
    low = (np.cumprod(confidences, axis=1) < survival[:, None]) & inside
    cut = np.where(low.any(axis=1), low.argmax(axis=1), k)
    return np.minimum(tau_cut, cut), steps


def resample_lossy(
    accepted: np.ndarray,
    drafted: np.ndarray,
    pass_probability: np.ndarray,
    ids: np.ndarray,
    positions: np.ndarray,
    rng: np.random.Generator,
    run_lengths: Callable[[np.ndarray, np.ndarray], np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """Threshold mode: accepted tokens and lossy accepts per sequence after the β rule.

    A sequence that strict verification stopped short of its draft (``accepted < drafted``)
    passes the rejected token with ``pass_probability`` (0: strict, or β = 0.99), then goes on
    with a fresh run length ``run_lengths(ids, positions + accepted)`` from the next position,
    until a rejection fails the rule or the draft is used up. One ``rng.random`` draw over the
    still active sequences per pass, then their fresh run lengths (the same generator as
    ``rng`` in the simulator): the draw order is part of the results.
    """
    accepted, lossy = accepted.copy(), np.zeros(len(accepted), dtype=np.int64)
    s = np.flatnonzero((pass_probability > 0) & (accepted < drafted))
    if not len(s):
        return accepted, lossy
    p, cur, lo, kk = pass_probability[s], accepted[s], lossy[s], drafted[s]
    active = np.ones(len(s), dtype=bool)
    while active.any():
        passed = active & (rng.random(len(s)) < p)
        w = np.flatnonzero(passed)
        if not len(w):
            break
        cur[w] += 1
        lo[w] += 1
        more = run_lengths(ids[s[w]], positions[s[w]] + cur[w])
        cur[w] = np.minimum(cur[w] + more, kk[w])
        active = passed & (cur < kk)
    accepted[s] = cur
    lossy[s] = lo
    return accepted, lossy
