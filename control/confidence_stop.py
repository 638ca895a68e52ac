"""``confidence-stop``: draft up to ``k_max`` tokens, stop at low drafter confidence.

The decision carries ``tau``: the driver stops drafting before the first token whose drafter
confidence is below τ (Hugging Face's ``assistant_confidence_threshold``, DISCO, AdaEDL). This
only decides *how much to draft*; verification stays strict, so the output never changes.

τ is fixed (``adapt = "fixed"``) or adapted (``adapt = "target"``) from the history of
(confidence, accepted) pairs: every drafted token that was verified — the accepted prefix and
the first refused token; tokens after a rejection were never judged — goes into a histogram of
``bins`` confidence bins over the last ``window_pairs`` pairs. Every ``update_rounds`` rounds τ
becomes the upper edge of the highest bin (with at least ``min_bin_pairs`` pairs) whose
empirical acceptance probability is below ``target_accept``: the confidence under which a
drafted token is more likely wasted than not (for ``target_accept = 0.5``). No such bin:
τ = ``tau_min``. τ is clipped to ``[tau_min, tau_max]``.

Selection effect: tokens below τ are never drafted, so their bins empty out of the window;
τ then falls back to ``tau_min`` and the low-confidence region is observed again. This
re-exploration is deliberate (a bin without data keeps no vote).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from control.base import Controller
from control.configio import param
from control.errors import ConfigError
from control.types import Decision, Observation


@dataclass(frozen=True)
class ConfidenceStopConfig:
    # drafts are cut by τ, so the cap can be generous.
    k_max: int = param(
        10, lo=1, hi=64, doc="draft length when no token falls below τ", tune=(1, 32)
    )
    # HF's default assistant_confidence_threshold is 0.4.
    tau: float = param(
        0.4, lo=0.0, hi=1.0, doc="fixed τ, and the start value when adapting", tune=(0.0, 0.95)
    )
    adapt: str = param(
        "fixed",
        choices=("fixed", "target"),  # fixed: HF's behaviour
        doc="fixed τ, or τ where empirical acceptance falls below target_accept",
        tune=True,
    )
    # 0.5: stop where a drafted token is more likely refused than accepted.
    target_accept: float = param(
        0.5,
        lo=0.01,
        hi=0.99,
        doc="acceptance probability at τ",
        tune=(0.1, 0.95),
        when={"adapt": ("target",)},
    )
    # 20 bins of width 0.05.
    bins: int = param(
        20,
        lo=2,
        hi=200,
        doc="confidence histogram bins on [0, 1]",
        tune=(4, 64),
        when={"adapt": ("target",)},
    )
    # ~60 rounds of pairs.
    window_pairs: int = param(
        512,
        lo=16,
        hi=100_000,
        doc="(confidence, accepted) pairs kept",
        tune=(64, 8192),
        log=True,
        when={"adapt": ("target",)},
    )
    # 16 pairs per bin before its acceptance estimate is trusted (±0.12).
    min_bin_pairs: int = param(
        16,
        lo=1,
        hi=10_000,
        doc="pairs a bin needs to vote",
        tune=(1, 128),
        log=True,
        when={"adapt": ("target",)},
    )
    # adapting every 16 rounds keeps observe() cheap and τ steady.
    update_rounds: int = param(
        16,
        lo=1,
        hi=10_000,
        doc="rounds between two τ updates",
        tune=(1, 256),
        log=True,
        when={"adapt": ("target",)},
    )
    tau_min: float = param(
        0.0,
        lo=0.0,
        hi=1.0,
        doc="lower clamp of adapted τ",
        tune=(0.0, 0.5),
        when={"adapt": ("target",)},
    )  # 0: no stop
    # never stop on every token.
    tau_max: float = param(
        0.95,
        lo=0.0,
        hi=1.0,
        doc="upper clamp of adapted τ",
        tune=(0.5, 1.0),
        lo_from=("tau_min", 0.0),
        when={"adapt": ("target",)},
    )

    def __post_init__(self) -> None:
        if self.tau_min > self.tau_max:
            raise ConfigError(f"tau_min = {self.tau_min} > tau_max = {self.tau_max}")


class ConfidenceStopController(Controller):
    name = "confidence-stop"

    def __init__(self, config: ConfidenceStopConfig | None = None) -> None:
        self.config = config or ConfidenceStopConfig()
        self.reset()

    def reset(self) -> None:
        c = self.config
        self.tau = c.tau
        self.rounds = 0
        self.count = [0] * c.bins
        self.accepted = [0] * c.bins
        self._ring_bin = [-1] * c.window_pairs
        self._ring_acc = [0] * c.window_pairs
        self._i = 0
        self._decision = Decision(k=c.k_max, tau=self.tau)

    def decide(self, now_s: float) -> Decision:
        return self._decision

    def observe(self, obs: Observation) -> None:
        self.rounds += 1
        c = self.config
        if c.adapt == "fixed":
            return
        conf = obs.confidences
        if conf:
            n = obs.accepted
            nb = c.bins
            size = c.window_pairs
            for j in range(min(n + 1, obs.drafted)):
                b = int(conf[j] * nb)
                b = 0 if b < 0 else nb - 1 if b >= nb else b
                acc = 1 if j < n else 0
                i = self._i
                old = self._ring_bin[i]
                if old >= 0:
                    self.count[old] -= 1
                    self.accepted[old] -= self._ring_acc[i]
                self._ring_bin[i] = b
                self._ring_acc[i] = acc
                self.count[b] += 1
                self.accepted[b] += acc
                self._i = i + 1 if i + 1 < size else 0
        if self.rounds % c.update_rounds == 0:
            self._adapt()

    def _adapt(self) -> None:
        c = self.config
        tau = c.tau_min
        for b in range(c.bins - 1, -1, -1):
            cnt = self.count[b]
            if cnt >= c.min_bin_pairs and self.accepted[b] < c.target_accept * cnt:
                tau = (b + 1) / c.bins
                break
        tau = min(c.tau_max, max(c.tau_min, tau))
        if tau != self.tau:
            self.tau = tau
            self._decision = Decision(k=c.k_max, tau=tau)

    def state(self) -> dict[str, Any]:
        return {"k": self.config.k_max, "tau": self.tau, "rounds": self.rounds}
