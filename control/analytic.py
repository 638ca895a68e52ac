"""``analytic``: the draft length that maximises the i.i.d. model's expected speedup.

With per-token acceptance rate ``a`` and cost ratio ``c`` (one drafter step / one target
forward), a round of draft length ``k`` emits ``(1 − a^(k+1)) / (1 − a)`` tokens on average for
a cost of ``k·c + 1`` target forwards (:mod:`control.leviathan`), so

    k* = argmax_{k_min <= k <= k_max} (1 − a^(k+1)) / ((1 − a)(k·c + 1))

(ties to the smaller k). ``a`` is the window estimate â (see :mod:`control.window`); at
``â = 1`` the round emits ``k + 1`` tokens (the formula's limit). ``c`` is measured as
(Σdraft_s / Σdrafted) / (Σverify_s / rounds) over the window. Until the window holds
``min_trials`` verified tokens, ``a_prior`` stands in for â; without timings, ``c_prior`` for c.
The choice is recomputed every ``update_rounds`` rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from control.base import Controller
from control.configio import param
from control.errors import ConfigError
from control.leviathan import expected_speedup
from control.types import Decision, Observation
from control.window import RoundWindow, row_of


def best_k(a: float, c: float, k_min: int, k_max: int) -> int:
    """argmax over k in [k_min, k_max] of ``expected_speedup(a, k, c)`` (smallest k on ties)."""
    best, best_v = k_min, -1.0
    for k in range(k_min, k_max + 1):
        v = expected_speedup(a, k, c)
        if v > best_v:
            best, best_v = k, v
    return best


@dataclass(frozen=True)
class AnalyticConfig:
    # 32 rounds: ~100+ verified tokens, â within ~±0.05.
    window_rounds: int = param(
        32, lo=1, hi=4096, doc="sliding window of rounds for â and c", tune=(4, 1024), log=True
    )
    # k = 0 (no speculation) is allowed: it wins when â is low or c high.
    k_min: int = param(0, lo=0, hi=64, doc="smallest draft length considered", tune=(0, 4))
    # 16 covers the optimum up to â ~ 0.95 at c ~ 0.05.
    k_max: int = param(
        16, lo=0, hi=64, doc="largest draft length considered", tune=(1, 32), lo_from=("k_min", 0)
    )
    # a typical small-drafter acceptance rate, used until data arrives.
    a_prior: float = param(
        0.7, lo=0.0, hi=1.0, doc="â used before min_trials verified tokens", tune=(0.2, 0.95)
    )
    # a drafter ~10x cheaper per step than the target.
    c_prior: float = param(
        0.1, lo=0.0, hi=10.0, doc="cost ratio used without timings", tune=(0.005, 1.0), log=True
    )
    # 8 verified tokens before trusting â.
    min_trials: int = param(
        8,
        lo=1,
        hi=100_000,
        doc="verified tokens before â replaces the prior",
        tune=(1, 512),
        log=True,
    )
    # recompute every 4 rounds: â moves slowly, the argmax costs k_max evaluations.
    update_rounds: int = param(
        4, lo=1, hi=10_000, doc="rounds between two recomputations of k", tune=(1, 64), log=True
    )

    def __post_init__(self) -> None:
        if self.k_min > self.k_max:
            raise ConfigError(f"k_min = {self.k_min} > k_max = {self.k_max}")


class AnalyticController(Controller):
    name = "analytic"
    reads_confidences = False

    def __init__(self, config: AnalyticConfig | None = None) -> None:
        self.config = config or AnalyticConfig()
        self._win = RoundWindow(self.config.window_rounds)
        self._decisions = tuple(Decision(k=k) for k in range(self.config.k_max + 1))
        self.reset()

    def reset(self) -> None:
        self._win.clear()
        self.rounds = 0
        self._recompute()

    def estimates(self) -> tuple[float, float]:
        """(â, c) as used for the choice of k, priors standing in for missing data."""
        w, cfg = self._win, self.config
        a = cfg.a_prior if w.sum_n + w.sum_rej < cfg.min_trials else w.sum_n / (w.sum_n + w.sum_rej)
        verify_s = w.sum_round_s - w.sum_draft_s
        if w.sum_drafted > 0 and w.sum_draft_s > 0.0 and verify_s > 0.0:
            c = (w.sum_draft_s / w.sum_drafted) / (verify_s / w.count)
        else:
            c = cfg.c_prior
        return a, c

    def _recompute(self) -> None:
        self.a, self.c = self.estimates()
        self.k = best_k(self.a, self.c, self.config.k_min, self.config.k_max)

    def decide(self, now_s: float) -> Decision:
        return self._decisions[self.k]

    def observe(self, obs: Observation) -> None:
        self._win.push_row(row_of(obs))
        self.rounds += 1
        if self.rounds % self.config.update_rounds == 0:
            self._recompute()

    def state(self) -> dict[str, Any]:
        return {"k": self.k, "a_hat": self.a, "c": self.c, "rounds": self.rounds}
