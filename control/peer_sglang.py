"""``sglang-adaptive``: SGLang's adaptive speculative decoding (``--speculative-adaptive``).

From SGLang's documentation: after each verify pass the policy reads the accepted draft length
of every request, averages it over the batch, and smooths it with an EMA (weight ``ema_alpha``
on the newest batch). It switches among pre-built tiers ``candidate_steps`` (draft steps per
round, [1, 3, 7] by default), probing one step beyond the observed acceptance:

    target_steps ≈ clamp(round(ema + 1), min(candidate_steps), max(candidate_steps)).

The first ``warmup_batches`` verify batches only feed the EMA; after them the tier is
recomputed every ``update_interval`` batches; ``down_hysteresis`` and ``up_hysteresis`` are
extra margins before moving to a smaller or a larger tier. The initial
``--speculative-num-steps`` is snapped to the nearest tier. A tier change takes effect from the
next round.

Our reading where the doc is silent (each choice tested by hand):

- the EMA starts at the initial tier − 1 (neutral: neither up nor down); a batch in which
  nobody drafted is not a verify batch and is skipped;
- the tier is recomputed after every ``update_interval``-th batch past the warm-up (the first
  time after batch ``warmup_batches + update_interval``);
- the tier walks toward the target one tier at a time: down while the target of
  ``ema + 1 − down_hysteresis`` (rounded half up) is at or below the next smaller tier; if it
  did not move down, up while the target of ``ema + 1 − up_hysteresis`` is above the current
  tier. ``down_hysteresis ≤ 0 ≤ up_hysteresis`` make either move harder (−0.25: the EMA must
  fall a quarter token further before the tier drops). Walking up past the rounded target
  (from 3 to 7 when the target is 4) is what lets the policy probe beyond its tier: requests
  at tier s accept at most s drafts, so the target never exceeds s + 1.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from control.batch import BatchContext, RoundPlanner, RoundStats
from control.configio import param
from control.errors import ConfigError
from control.peer_common import K_LIMIT, PeerController, fold_pending, uniform
from control.types import Decision


@dataclass(frozen=True)
class SglangAdaptiveConfig:
    # the doc's default tiers
    candidate_steps: tuple[int, ...] = param(
        (1, 3, 7), lo=1, hi=K_LIMIT, doc="tiers of draft steps, increasing"
    )
    # the doc's launch example: --speculative-num-steps 3
    num_steps: int = param(
        3,
        lo=1,
        hi=K_LIMIT,
        doc="--speculative-num-steps: initial steps (snapped to the nearest tier)",
        tune=True,
        choices_from="candidate_steps",
    )
    # the doc's default 0.2
    ema_alpha: float = param(
        0.2, lo=0.0, hi=1.0, doc="EMA weight of the newest batch's accept length", tune=(0.01, 1.0)
    )
    # the doc's default 10 verify batches
    warmup_batches: int = param(
        10, lo=0, hi=1_000_000, doc="verify batches observed before any switch", tune=(0, 64)
    )
    # the doc's default: every 5 verify batches
    update_interval: int = param(
        5, lo=1, hi=1_000_000, doc="verify batches between tier decisions", tune=(1, 64), log=True
    )
    # the doc's default −0.25
    down_hysteresis: float = param(
        -0.25, lo=-16.0, hi=16.0, doc="margin before a smaller tier", tune=(-2.0, 0.0)
    )
    # the doc's default 0
    up_hysteresis: float = param(
        0.0, lo=-16.0, hi=16.0, doc="margin before a larger tier", tune=(0.0, 2.0)
    )

    def __post_init__(self) -> None:
        c = self.candidate_steps
        if not c or any(b <= a for a, b in itertools.pairwise(c)):
            raise ConfigError(f"candidate_steps = {list(c)} must be a non-empty increasing list")


def snap(tiers: Sequence[int], steps: float) -> int:
    """Index of the tier nearest to ``steps`` clamped to the tiers' range, ties to the smaller."""
    t = min(max(steps, tiers[0]), tiers[-1])
    return min(range(len(tiers)), key=lambda i: (abs(tiers[i] - t), tiers[i]))


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


class SglangAdaptivePlanner(RoundPlanner):
    """One tier for the whole batch, moved by the EMA of the batch's mean accept length."""

    def __init__(self, config: SglangAdaptiveConfig) -> None:
        self.config = config
        self.tiers = tuple(config.candidate_steps)
        self.reset()

    def reset(self) -> None:
        self.index = snap(self.tiers, self.config.num_steps)
        self.ema = float(self.steps - 1)
        self.batches = 0
        self.switches = 0
        self.members: Sequence[Any] = ()

    @property
    def steps(self) -> int:
        return self.tiers[self.index]

    def plan(self, now_s: float, members: Sequence[Any], batch: BatchContext) -> list[Decision]:
        self.members = members
        return uniform(self.steps, batch, len(members))

    def observe_round(self, stats: RoundStats) -> None:
        fold_pending(self.members)  # the batch's sums in stats are all the policy reads
        if stats.drafting <= 0:
            return
        self.observe_accept_length(stats.accepted / stats.drafting)

    def observe_accept_length(self, mean_accepted: float) -> None:
        """One verify batch whose requests accepted ``mean_accepted`` draft tokens on average."""
        c = self.config
        self.ema += c.ema_alpha * (mean_accepted - self.ema)
        self.batches += 1
        past = self.batches - c.warmup_batches
        if past > 0 and past % c.update_interval == 0:
            self._decide_tier()

    def _decide_tier(self) -> None:
        c, tiers, i = self.config, self.tiers, self.index
        target = self.ema + 1.0
        down = _round_half_up(target - c.down_hysteresis)
        while i > 0 and down <= tiers[i - 1]:
            i -= 1
        if i == self.index:
            up = _round_half_up(target - c.up_hysteresis)
            while i + 1 < len(tiers) and up > tiers[i]:
                i += 1
        if i != self.index:
            self.index, self.switches = i, self.switches + 1

    def state(self) -> dict[str, Any]:
        return {"steps": self.steps, "ema_accepted": self.ema, "batches": self.batches}


class SglangAdaptiveController(PeerController):
    name = "sglang-adaptive"
    config_class = SglangAdaptiveConfig
    planner_class = SglangAdaptivePlanner
