"""``oracle``: told the future by the simulator; an upper bound, never run by the engine.

Before each ``decide`` the driver calls ``set_future(L)`` with the length ``L`` of the run of
drafted tokens the target would accept from here. The oracle drafts ``k = min(L, k_max)``.

Why exactly ``L`` (and ``k = 0`` when ``L = 0``): drafting ``L`` tokens accepts all of them and
the verify pass adds the bonus token, ``L + 1`` tokens for ``L`` drafter steps and one target
pass; drafting more adds drafter steps whose tokens are all refused (the correction token is
the same one the bonus would have been), drafting fewer emits fewer tokens for the same target
pass. With ``L = 0`` a drafted token would be refused anyway, so a plain autoregressive step
emits the same single token without the drafter's cost. At batch 1 this is optimal for any
cost ratio ``c`` < 1; in a batch a longer verify can slow the others, which the oracle ignores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from control.base import Controller
from control.configio import param
from control.types import Decision, Observation


@dataclass(frozen=True)
class OracleConfig:
    # 16: the longest draft the engines' static KV caches are sized for by default.
    k_max: int = param(16, lo=0, hi=64, doc="cap on the draft length")
    # a driver that forgot set_future gets plain autoregressive steps, never a guess.
    fallback_k: int = param(0, lo=0, hi=64, doc="k when no future was given for this round")


class OracleController(Controller):
    name = "oracle"
    needs_future = True
    reads_confidences = False

    def __init__(self, config: OracleConfig | None = None) -> None:
        self.config = config or OracleConfig()
        top = max(self.config.k_max, self.config.fallback_k)
        self._decisions = tuple(Decision(k=k) for k in range(top + 1))
        self.reset()

    def reset(self) -> None:
        self.future: int | None = None
        self.rounds = 0
        self.last_k = 0

    def set_future(self, run_length: int) -> None:
        self.future = run_length

    def decide(self, now_s: float) -> Decision:
        f = self.future
        if f is None:
            k = self.config.fallback_k
        else:
            k = 0 if f < 0 else f if f < self.config.k_max else self.config.k_max
        self.last_k = k
        return self._decisions[k]

    def observe(self, obs: Observation) -> None:
        self.rounds += 1
        self.future = None

    def state(self) -> dict[str, Any]:
        return {"k": self.last_k, "future": self.future, "rounds": self.rounds}
