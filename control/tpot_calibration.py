"""The TPOT prediction held to what the rounds it planned really took.

Under the driver's SLOs the round planner predicts each sequence's time per output token as
its planned round seconds, stretched by the replica's prompt chunks
(:mod:`control.prefill_backlog`), over its expected tokens (:func:`control.goodput.slo_goodput_row`). That model can be biased:
on the Azure conversation trace at its knee the rounds the plans chose took 0.89 of the seconds
predicted for them while the expected tokens were 1.00 of those emitted, and a request's
realized TPOT was 0.88 of the mean of its predictions (geometric mean over requests; on the
code trace 0.95, 0.96 and 1.02).

:class:`TpotCalibration` keeps the ratio of the two over the recent rounds: each round adds its
batch's wall seconds ``B · dt`` and emitted tokens against what the last full plan predicted a
sequence a round (its mean predicted seconds ``t̄`` and expected tokens ``ē``, times ``B``), all
forgotten at ``rate`` a round, and

    factor = (Σ B·dt / Σ B·t̄) / (Σ emitted / Σ B·ē)

multiplies every predicted TPOT of the next plans. A prior of ``prior_rounds`` rounds at factor
1 (the first round's prediction) keeps the first plans as the model has them; the factor is
clamped to ``[FACTOR_MIN, FACTOR_MAX]``. The planner applies it under ``slo_calibrate`` (off by
default: :class:`control.dspark_config.GoodputPolicyConfig` says what it measured).
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: the factor's range: a model off by more than 2x either way is held there
FACTOR_MIN, FACTOR_MAX = 0.5, 2.0


class TpotCalibration:
    """The recent ratio of realized to predicted time per token of a planner's rounds."""

    def __init__(self, rate: float = 0.002, prior_rounds: float = 20.0) -> None:
        self.rate = rate  # forgetting a round (~1/rate rounds of memory)
        self.prior_rounds = prior_rounds  # weight of factor 1 at the start, in rounds
        self.reset()

    def reset(self) -> None:
        self._pred: tuple[float, float] | None = None  # (t̄, ē) of the last full plan
        self._sums: list[float] | None = None  # Σ predicted s, Σ real s, Σ expected, Σ emitted

    def planned(self, seconds: float, tokens: float) -> None:
        """A full plan's prediction a sequence a round: ``seconds`` (its round time as the
        TPOT model stretches it, before the factor) and ``tokens`` (expected emitted)."""
        if seconds > 0.0 and tokens > 0.0:
            self._pred = (seconds, tokens)

    def planned_row(self, plan: Any, row: int, stretch: Any, extra_s: Any) -> None:
        """:meth:`planned` from row ``row`` of a :class:`~control.goodput.RoundPlan`, its
        round seconds times ``stretch`` plus ``extra_s`` (scalars or one per sequence, as the
        prompt-chunk terms came before the factor) and its expected tokens, each a mean over
        the batch."""
        assert plan.seconds_by_cap is not None and plan.expected is not None
        e = plan.expected[row]
        if len(e):
            t = plan.seconds_by_cap[row] * stretch + extra_s
            self.planned(float(np.mean(t)), float(e.mean()))

    def observe(self, round_s: float, batch_size: int, emitted: float) -> None:
        """One round's wall seconds, batch size and emitted tokens, against the last plan's
        prediction (nothing before a plan has predicted)."""
        if self._pred is None or batch_size <= 0:
            return
        t, e = self._pred[0] * batch_size, self._pred[1] * batch_size
        s = self._sums
        if s is None:  # the prior: prior_rounds rounds exactly as predicted
            m = self.prior_rounds
            s = self._sums = [m * t, m * t, m * e, m * e]
        keep = 1.0 - self.rate
        s[0] = s[0] * keep + t
        s[1] = s[1] * keep + round_s * batch_size
        s[2] = s[2] * keep + e
        s[3] = s[3] * keep + emitted

    @property
    def factor(self) -> float:
        """Realized over predicted time per token (1 before any round was observed)."""
        s = self._sums
        if s is None or s[0] <= 0.0 or s[3] <= 0.0:
            return 1.0
        f = (s[1] / s[0]) * (s[2] / s[3])
        return min(max(f, FACTOR_MIN), FACTOR_MAX)
