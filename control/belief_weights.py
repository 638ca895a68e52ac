"""The pseudo-trial weights of ``dspark``'s beliefs, chosen by how well they predicted.

A sequence's belief (:mod:`control.dspark_planner`, item 1) shrinks its own counts toward the
batch's pooled rate by ``w`` pseudo-trials (``prior_trials``) and its recent rounds toward that
long-run rate by ``R`` (``recent_prior``). Which weights suit depends on the text:

- sequences of one rate (i.i.d. tokens) are best told the pool: large ``w`` and ``R``; a
  sequence's own counts then only add noise to its length;
- sequences whose rates differ and stay (a Beta spread over requests): small ``w``, large ``R``;
- text that switches between easy and hard stretches (Markov): small ``R``.

With ``belief_weights = "predictive"`` the planner keeps a grid of ``(w, R)``, the configured
``w`` times :data:`W_SCALES` by the configured ``R`` times :data:`R_SCALES`
(:class:`PredictiveWeights`):

1. one full plan in :data:`SCORE_EVERY` keeps, for the batch's first :data:`SCORED` sequences,
   the per-position rates every grid point predicts for them (times that plan's position
   factors, capped as the plan caps them);
2. the next full plan scores each point by the Brier score of those sequences' outcomes since
   (each draft position tried: accepted, or refused), added to its sum; the sums are halved
   every :data:`SCORE_HALF_LIFE` rounds;
3. every full plan uses the point of the best sum: the configured pair until another scores
   higher.

Why the Brier score and not the log-likelihood: a plan pays little for a draft token it was
too sure of (one verified slot) and much for tokens it did not draft, while the log-likelihood
punishes a confident miss without bound. Scored by the log-likelihood, the Markov cells chose
the most pooled weights (a stretch's first refusals cost the sharp beliefs most) and lost ~3%
of throughput at batch 1; by the Brier score they keep the configured recent weight. Why the
recent weight's grid starts at the configured value: sharper recent weights predicted better
on the Markov cells at batch 16 and planned worse (−1.3%).

A prediction is scored only for the member it was made for (a slot's new member is not scored
on its predecessor's).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from control.belief_kernel import brier_loss, grid_beliefs, point_beliefs
from control.seqstate import resized

#: the grids: the configured ``w`` times W_SCALES, the configured ``R`` times R_SCALES (never
#: below it: sharper than the configured recent weight predicts better and plans worse)
W_SCALES = (0.25, 1.0, 4.0, 16.0)
R_SCALES = (1.0, 4.0, 16.0, 64.0)
#: rounds after which the scores are halved (~1,500 rounds of memory: many requests' text, so the
#: choice follows the workload, not one sequence's stretch)
SCORE_HALF_LIFE = 1024
#: sequences a plan keeps every point's predictions for (the first of the batch): the scores
#: gather evidence fast enough from these, and a large batch's plan pays no more for them
SCORED = 16
#: full plans per prediction scored: one plan in this many keeps every point's predictions and
#: the next scores them (evidence from a quarter of the plans, at a quarter of the cost)
SCORE_EVERY = 4


class PredictiveWeights:
    """The grid of ``(w, R)``, its scores and each slot's last predictions (module doc)."""

    def __init__(self, prior_trials: float, recent_prior: float, k_max: int) -> None:
        self.w = prior_trials * np.array(W_SCALES)[:, None]  # (G_w, 1)
        self.R = recent_prior * np.array(R_SCALES)[:, None]  # (G_r, 1)
        self.k_max = k_max
        self.default = W_SCALES.index(1.0) * len(R_SCALES) + R_SCALES.index(1.0)  # as set
        self.pred = np.zeros((0, len(W_SCALES) * len(R_SCALES), k_max))  # per slot: (G, K)
        self.owner = np.empty(0, dtype=object)  # per slot: the member they were made for
        self.factor = np.ones(1)  # the predicting plan's position factors (the planner sets)
        self.reset()

    def reset(self) -> None:
        self.score = np.zeros(len(W_SCALES) * len(R_SCALES))
        self.owner[:] = None
        self.kept = np.zeros(0, dtype=np.intp)  # the slots the last plan kept predictions for
        self.plans = 0  # full plans so far
        self._pair: tuple[float, float] | None = None  # pair()'s, until the scores move

    @property
    def choice(self) -> int:
        """The grid point plans use: the best score, the configured pair among ties."""
        best = float(self.score.max())
        return self.default if self.score[self.default] >= best else int(np.argmax(self.score))

    def pair(self) -> tuple[float, float]:
        """``(w, R)`` of :attr:`choice` (kept until the scores move)."""
        if self._pair is None:
            i, j = divmod(self.choice, len(R_SCALES))
            self._pair = float(self.w[i, 0]), float(self.R[j, 0])
        return self._pair

    def beliefs(self, store: Any, idx: np.ndarray, pool: float) -> np.ndarray:
        """Score the outcomes since the last plan (``store.counts``, not yet pooled) of the
        sequences it kept predictions for, then the beliefs ``(K, B)`` of the chosen point;
        every point's predictions kept for the batch's first :data:`SCORED` sequences."""
        if len(self.kept):  # the last plan's predictions, scored once
            kept = self.kept
            # (a sequence no longer in the batch is not scored: its rows stay with it)
            owners = members_of(store, kept)
            owners[store.seen[kept] != store.tick] = None
            self._learn(kept, owners, store.counts[kept])
            self.owner[kept] = None
            self.kept = kept[:0]
        self.plans += 1
        if self.plans % SCORE_EVERY == 0:
            if len(self.pred) < store.capacity:
                self.pred = resized(self.pred, store.capacity)
                self.owner = resized(self.owner, store.capacity)
            sub = idx[:SCORED]
            self.pred[sub] = grid_beliefs(store.values, sub, pool, self.w[:, 0], self.R[:, 0], self.k_max)  # fmt: skip
            self.owner[sub] = members_of(store, sub)
            self.kept = sub
        w, R = self.pair()
        return point_beliefs(store.values, idx, pool, w, R, self.k_max)

    def _learn(self, idx: np.ndarray, owners: np.ndarray, counts: np.ndarray) -> None:
        """Add to each point's score the Brier score of the rounds in ``counts`` (rows by
        accepted n: refused after n, or all n accepted) of the members its predictions were
        made for, at those predictions times ``factor`` (as the plan read them)."""
        K = self.k_max
        known = np.array([a is b for a, b in zip(self.owner[idx], owners)], dtype=bool)
        c = counts[known]
        if not c.any():
            return
        # −Σ got·(1 − p)² + refused·p², expanded: −Σ at·p² − 2·got·p + got
        f = self.factor if len(self.factor) == K else np.broadcast_to(self.factor, K).copy()
        self.score -= brier_loss(c, self.pred[idx[known]], f, K)
        self._pair = None

    def halve(self) -> None:
        """Forget: the planner calls it every :data:`SCORE_HALF_LIFE` rounds."""
        self.score *= 0.5
        self._pair = None


def members_of(store: Any, idx: np.ndarray) -> np.ndarray:
    """The members in slots ``idx`` of ``store`` (its weak references followed; None: gone)."""
    return np.array([None if r is None else r() for r in store.owners[idx].tolist()], object)
