"""``fixed``: the same draft length every round (``k = 0`` is plain autoregressive decoding)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from control.base import Controller
from control.configio import param
from control.types import Decision, Observation


@dataclass(frozen=True)
class FixedConfig:
    # 4 drafted tokens: near the optimum for a ~0.7-0.8 acceptance drafter at c ~ 0.05-0.1.
    k: int = param(
        4, lo=0, hi=64, doc="draft length of every round (0 = no speculation)", tune=(0, 16)
    )
    # lossless verification unless asked otherwise.
    mode: str = param("strict", choices=("strict", "threshold"), doc="verification mode", tune=True)
    # the seed's starting conservativeness; used only in threshold mode.
    beta: float = param(
        0.85,
        lo=0.7,
        hi=0.99,
        doc="threshold-mode acceptance threshold",
        tune=(0.7, 0.99),
        when={"mode": ("threshold",)},
    )


class FixedController(Controller):
    name = "fixed"
    reads_confidences = False

    def __init__(self, config: FixedConfig | None = None) -> None:
        self.config = config or FixedConfig()
        self.reset()

    def reset(self) -> None:
        self.rounds = 0
        # built once: decide() is on the simulator's hot path.
        # mode is a str checked against Decision's Literal by its param choices
        self._decision = Decision(
            k=self.config.k,
            mode=self.config.mode,  # type: ignore[arg-type]
            beta=self.config.beta,
        )

    def decide(self, now_s: float) -> Decision:
        return self._decision

    def observe(self, obs: Observation) -> None:
        self.rounds += 1

    def observe_values(self, *_values: Any, **_named: Any) -> None:
        """:meth:`Controller.observe_values`: only the round count moves."""
        self.rounds += 1

    def state(self) -> dict[str, Any]:
        return {"k": self.config.k, "rounds": self.rounds}
