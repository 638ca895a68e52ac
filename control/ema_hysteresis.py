"""``ema-hysteresis``: SGLang-style adaptive draft length.

An exponential moving average of the accepted tokens per round,
``ema ← ema + ema_coef · (n − ema)`` (started at the first round's ``n``), drives ``k`` through
a fixed list of candidate draft lengths one step at a time: up when ``ema >= up_ratio · k``
(the drafter fills most of its draft), down when ``ema <= down_ratio · k``; between the two
ratios nothing changes (hysteresis). No step is taken during the first ``warmup_rounds``
rounds, and at most one every ``update_rounds`` rounds.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from control.base import Controller
from control.configio import param
from control.errors import ConfigError
from control.types import Decision, Observation


@dataclass(frozen=True)
class EmaHysteresisConfig:
    # SGLang-like ladder: fine steps at short drafts, coarser at long ones.
    candidates: tuple[int, ...] = param(
        (1, 2, 3, 4, 5, 6, 8), lo=1, hi=64, doc="allowed draft lengths, increasing"
    )
    # start in the middle of the ladder.
    k0: int = param(
        4,
        lo=1,
        hi=64,
        doc="initial draft length (one of the candidates)",
        tune=True,
        choices_from="candidates",
    )
    # ~5-round memory: follows regime changes within a block.
    ema_coef: float = param(
        0.2,
        lo=0.01,
        hi=1.0,
        doc="EMA coefficient of accepted tokens/round",
        tune=(0.01, 1.0),
        log=True,
    )
    # step up when 80% of the draft is accepted on average.
    up_ratio: float = param(
        0.8, lo=0.0, hi=1.0, doc="step up when ema >= up_ratio * k", tune=(0.3, 1.0)
    )
    # step down when fewer than 40% of it are.
    down_ratio: float = param(
        0.4,
        lo=0.0,
        hi=1.0,
        doc="step down when ema <= down_ratio * k",
        tune=(0.0, 0.9),
        hi_from=("up_ratio", -0.05),
    )
    # a few rounds before trusting the EMA.
    warmup_rounds: int = param(4, lo=0, hi=10_000, doc="rounds before the first step", tune=(0, 64))
    # let the EMA see the new k before moving again.
    update_rounds: int = param(
        4, lo=1, hi=10_000, doc="rounds between two steps", tune=(1, 64), log=True
    )

    def __post_init__(self) -> None:
        c = self.candidates
        if not c or any(b <= a for a, b in itertools.pairwise(c)):
            raise ConfigError(f"candidates = {list(c)} must be a non-empty increasing list")
        if self.k0 not in c:
            raise ConfigError(f"k0 = {self.k0} is not one of the candidates {list(c)}")
        if self.down_ratio >= self.up_ratio:
            raise ConfigError(
                f"down_ratio = {self.down_ratio} must be < up_ratio = {self.up_ratio}"
            )


class EmaHysteresisController(Controller):
    name = "ema-hysteresis"
    reads_confidences = False

    def __init__(self, config: EmaHysteresisConfig | None = None) -> None:
        self.config = config or EmaHysteresisConfig()
        self._decisions = tuple(Decision(k=k) for k in self.config.candidates)
        self.reset()

    def reset(self) -> None:
        self.index = self.config.candidates.index(self.config.k0)
        self.ema: float | None = None
        self.rounds = 0
        self.since_step = 0

    @property
    def k(self) -> int:
        return self.config.candidates[self.index]

    def decide(self, now_s: float) -> Decision:
        return self._decisions[self.index]

    def observe(self, obs: Observation) -> None:
        c = self.config
        n = obs.accepted
        self.ema = float(n) if self.ema is None else self.ema + c.ema_coef * (n - self.ema)
        self.rounds += 1
        self.since_step += 1
        if self.rounds < c.warmup_rounds or self.since_step < c.update_rounds:
            return
        k = c.candidates[self.index]
        if self.ema >= c.up_ratio * k and self.index + 1 < len(c.candidates):
            self.index += 1
            self.since_step = 0
        elif self.ema <= c.down_ratio * k and self.index > 0:
            self.index -= 1
            self.since_step = 0

    def state(self) -> dict[str, Any]:
        return {"k": self.k, "ema_accepted": self.ema, "rounds": self.rounds}
