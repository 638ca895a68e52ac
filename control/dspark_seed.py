"""The ``seed`` policy of the ``dspark`` controller (``policy = "seed"``; :mod:`control.dspark`
describes it): the seed's α → k rule as written. At each update the α loop steps on
``â − a_target`` and ``k = clip(round(α · k_ref), k_min, k_max)`` moves when it differs from
the current k by at least ``k_hysteresis``."""

from __future__ import annotations

from control.dspark_base import DSparkBaseController
from control.dspark_seed_config import SeedPolicyConfig


def k_of_alpha(alpha: float, k_ref: float, k_min: int, k_max: int) -> int:
    """``clip(round(α · k_ref), k_min, k_max)`` with round half up."""
    k = int(alpha * k_ref + 0.5)
    return k_min if k < k_min else k_max if k > k_max else k


class SeedPolicyController(DSparkBaseController):
    policy = "seed"
    config: SeedPolicyConfig

    def __init__(self, config: SeedPolicyConfig | None = None) -> None:
        c = config or SeedPolicyConfig()
        super().__init__(c, c.alpha_max, c.alpha0)

    def _initial_k(self) -> int:
        c = self.config
        return k_of_alpha(c.alpha0, c.k_ref, c.k_min, c.k_max)

    def _alpha_error(self, a_hat: float | None) -> float | None:
        """α (aggressiveness) follows the acceptance rate: ``â − a_target``."""
        return None if a_hat is None else a_hat - self.config.a_target

    def _after_update(self) -> None:
        c = self.config
        k = k_of_alpha(self.alpha, c.k_ref, c.k_min, c.k_max)
        if abs(k - self.k) >= c.k_hysteresis:
            self.k = k
