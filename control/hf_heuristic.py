"""``hf-heuristic``: Hugging Face's ``num_assistant_tokens_schedule="heuristic"``.

After a round in which every drafted token was accepted, ``k += 2`` (capped at ``k_max``);
otherwise ``k = max(1, k - 1)``. From ``k = 5``, rounds [all accepted, partial, all accepted]
give ``k = 7, 6, 8``. A round that drafted nothing (``k`` cut to 0 by the driver, e.g. at the
length limit) counts as "all accepted", as in HF (``n_matches == num_assistant_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from control.base import Controller
from control.configio import param
from control.errors import ConfigError
from control.types import Decision, Observation


@dataclass(frozen=True)
class HFHeuristicConfig:
    # HF's assistant starts from 5 drafted tokens in the worked example.
    k0: int = param(5, lo=1, hi=64, doc="initial draft length", tune=(1, 16))
    # 32: beyond it a single rejection wastes more than a round; the static KV cache needs a cap.
    k_max: int = param(
        32, lo=1, hi=64, doc="cap on the draft length", tune=(1, 64), lo_from=("k0", 0)
    )

    def __post_init__(self) -> None:
        if self.k0 > self.k_max:
            raise ConfigError(f"k0 = {self.k0} > k_max = {self.k_max}")


class HFHeuristicController(Controller):
    name = "hf-heuristic"
    reads_confidences = False

    def __init__(self, config: HFHeuristicConfig | None = None) -> None:
        self.config = config or HFHeuristicConfig()
        # one Decision per possible k, built once: decide() allocates nothing.
        self._decisions = tuple(Decision(k=k) for k in range(self.config.k_max + 1))
        self.reset()

    def reset(self) -> None:
        self.k = self.config.k0
        self.rounds = 0

    def decide(self, now_s: float) -> Decision:
        return self._decisions[self.k]

    def observe(self, obs: Observation) -> None:
        self.rounds += 1
        if obs.accepted == obs.drafted:
            k = self.k + 2
            self.k = k if k < self.config.k_max else self.config.k_max
        elif self.k > 1:
            self.k -= 1

    def state(self) -> dict[str, Any]:
        return {"k": self.k, "rounds": self.rounds}
