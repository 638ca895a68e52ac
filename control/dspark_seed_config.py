"""The ``seed`` policy's own fields (:class:`~control.dspark_seed.SeedPolicyController`): the
α loop's start, ceiling and target, and the α → k mapping. The fields it shares with the goodput
policy are :class:`~control.dspark_base_config.DSparkBaseConfig`'s."""

from __future__ import annotations

from dataclasses import dataclass

from control.configio import param
from control.dspark_base_config import DSparkBaseConfig
from control.errors import ConfigError


@dataclass(frozen=True)
class SeedPolicyConfig(DSparkBaseConfig):
    # --- starting point and α range -------------------------------------------------------------
    # the seed's starting aggressiveness.
    alpha0: float = param(
        0.8,
        lo=0.3,
        hi=1.5,
        doc="initial α (aggressiveness)",
        tune=(0.3, 1.5),
        when={"policy": ("seed",)},
    )
    # DESIGN's α range ends at 1.5.
    alpha_max: float = param(
        1.5,
        lo=0.3,
        hi=1.5,
        doc="upper clamp of α and of its integrator",
        tune=(0.3, 1.5),
        lo_from=("alpha0", 0),
    )
    # --- α → k mapping ------------------------------------------------------------------------
    # DESIGN: k = clip(round(α · 10), 3, 15); α0 = 0.8 gives k = 8.
    k_ref: float = param(
        10.0,
        lo=1.0,
        hi=64.0,
        doc="draft length at α = 1",
        tune=(2.0, 32.0),
        log=True,
        when={"policy": ("seed",)},
    )
    # DESIGN: k in [3, 15] when speculating (seed policy; goodput may choose any k ≤ k_max).
    k_min: int = param(
        3,
        lo=1,
        hi=64,
        doc="seed: smallest draft length when speculating",
        tune=(1, 8),
        when={"policy": ("seed",)},
    )
    # 1 = follow α exactly (the seed); larger damps chatter of k between neighbours.
    k_hysteresis: int = param(
        1,
        lo=1,
        hi=16,
        doc="k changes only when |k_new - k| >= this",
        tune=(1, 4),
        when={"policy": ("seed",)},
    )
    # --- targets --------------------------------------------------------------------------------
    # a drafter accepting ~60% per token is where k ~ 8 pays off at c ~ 0.05.
    a_target: float = param(
        0.6,
        lo=0.05,
        hi=0.99,
        doc="acceptance rate the α loop aims at",
        tune=(0.3, 0.95),
        when={"policy": ("seed",)},
    )

    def __post_init__(self) -> None:
        if self.alpha_min > self.alpha_max:
            raise ConfigError(f"alpha_min = {self.alpha_min} > alpha_max = {self.alpha_max}")
        if not self.alpha_min <= self.alpha0 <= self.alpha_max:
            raise ConfigError(
                f"alpha0 = {self.alpha0} outside [alpha_min, alpha_max] = "
                f"[{self.alpha_min}, {self.alpha_max}]"
            )
        if self.k_min > self.k_max:
            raise ConfigError(f"k_min = {self.k_min} > k_max = {self.k_max}")
        super().__post_init__()
