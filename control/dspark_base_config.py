"""The fields both policies of the ``dspark`` controller read (:mod:`control.dspark`): the
verification mode, β and its loop, the floor and gains of the α loop, the window and blocks, the
update timing, the anomaly guard and the retry cap. Each policy's own fields live in its subclass
(:class:`~control.dspark_config.GoodputPolicyConfig`,
:class:`~control.dspark_seed_config.SeedPolicyConfig`). Tuning metadata may name fields of the
user-facing :class:`~control.dspark_config.DSparkConfig`, the table the tuner searches: its
``policy`` (``when``) and the other policy's fields (``alpha_min`` ends at ``alpha0``, ``k_max``
starts at ``k_min``)."""

from __future__ import annotations

from dataclasses import dataclass

from control.configio import param
from control.errors import ConfigError


@dataclass(frozen=True)
class DSparkBaseConfig:
    # --- modes and starting point -------------------------------------------------------------
    # lossless by default; threshold (lossy β rule) only when asked.
    mode: str = param("strict", choices=("strict", "threshold"), doc="verification mode", tune=True)
    # the seed's starting conservativeness.
    beta0: float = param(
        0.85,
        lo=0.7,
        hi=0.99,
        doc="initial β (threshold-mode threshold)",
        tune=(0.7, 0.99),
        when={"mode": ("threshold",)},
    )
    # DESIGN's α range starts at 0.3 (it ends at alpha_max under the seed policy, at 1 under
    # goodput).
    alpha_min: float = param(
        0.3,
        lo=0.3,
        hi=1.5,
        doc="lower clamp of α and of its integrator",
        tune=(0.3, 1.5),
        hi_from=("alpha0", 0),
    )
    # DESIGN's β range (the seed's clip).
    beta_min: float = param(
        0.7,
        lo=0.7,
        hi=0.99,
        doc="lower clamp of β and of its integrator",
        tune=(0.7, 0.99),
        hi_from=("beta0", 0),
        when={"mode": ("threshold",)},
    )
    beta_max: float = param(
        0.99,
        lo=0.7,
        hi=0.99,
        doc="upper clamp of β and of its integrator",
        tune=(0.7, 0.99),
        lo_from=("beta0", 0),
        when={"mode": ("threshold",)},
    )
    # --- draft length ---------------------------------------------------------------------------
    # DESIGN: k ≤ 15 when speculating; the goodput policy may choose any k ≤ k_max.
    k_max: int = param(
        15, lo=1, hi=64, doc="largest draft length", tune=(2, 32), lo_from=("k_min", 0)
    )
    # 0 = no drafter-confidence stop (the seed has none); it never changes output. Tuned only
    # for the seed policy: the goodput planner stops each sequence on its own evidence, and a τ
    # tuned on the simulator's synthetic confidences does not transfer to a real drafter (τ =
    # 0.185 from a study made real dspark draft nothing in 79% of rounds on unseen prompts).
    # Both policies hand it to the driver (the goodput plan keeps each sequence's τ).
    tau: float = param(
        0.0,
        lo=0.0,
        hi=1.0,
        doc="drafter-confidence stop passed to the driver",
        tune=(0.0, 0.9),
        when={"policy": ("seed",)},
    )
    # --- targets --------------------------------------------------------------------------------
    # 50 ms per output token: a common interactive TPOT SLO.
    slo_tpot_s: float = param(0.05, lo=1e-5, hi=10.0, doc="TPOT service-level objective")
    # per-round draft+verify time is what a sequence experiences inside a batch step.
    tpot_source: str = param(
        "round_time",
        choices=("round_time", "wall_clock"),
        doc="measured TPOT: Σ(draft_s+verify_s)/Σemitted, or now_s span",
    )
    # --- window and blocks ------------------------------------------------------------------------
    # 32 rounds ~ 100-250 tokens: a block or two of history.
    window_rounds: int = param(
        32, lo=1, hi=4096, doc="sliding window of rounds for â, TPOT", tune=(4, 512), log=True
    )
    # the seed: blocks of 64-128 tokens; 96 is the middle.
    block_tokens: int = param(
        96, lo=16, hi=512, doc="block size B in tokens", tune=(16, 512), log=True
    )
    # a sentence end within 16 tokens before B closes the block early.
    snap_tokens: int = param(
        16,
        lo=0,
        hi=256,
        doc="snap window before B for a sentence end",
        tune=(0, 64),
        hi_from=("block_tokens", -1),
    )
    # 0 = no attention-span limit on block length.
    span_tokens: int = param(0, lo=0, hi=1 << 20, doc="attention-span limit of a block (0 = none)")
    # --- update timing ----------------------------------------------------------------------------
    # 8 rounds before the first update: â of fewer rounds is mostly noise.
    warmup_rounds: int = param(
        8, lo=0, hi=10_000, doc="rounds before the first update", tune=(0, 64)
    )
    # at least 2 rounds between updates even when blocks close back to back.
    min_update_rounds: int = param(
        2, lo=1, hi=10_000, doc="minimum rounds between two updates", tune=(1, 32), log=True
    )
    # --- α loop gains (seed: Kp = Kd = 0, Ki = γ) -----------------------------------------------
    # seed has no proportional term.
    alpha_kp: float = param(
        0.0,
        lo=0.0,
        hi=10.0,
        doc="α loop proportional gain",
        tune=(0.001, 2.0),
        log=True,
        switch=True,
    )
    # γ = 0.1: a 0.1 error in â moves α by 0.01 per block.
    alpha_ki: float = param(
        0.1,
        lo=0.0,
        hi=10.0,
        doc="α loop integral gain (the seed's γ)",
        tune=(0.001, 2.0),
        log=True,
        switch=True,
    )
    # seed has no derivative term.
    alpha_kd: float = param(
        0.0, lo=0.0, hi=10.0, doc="α loop derivative gain", tune=(0.001, 2.0), log=True, switch=True
    )
    # --- β loop gains --
    beta_kp: float = param(
        0.0,
        lo=0.0,
        hi=10.0,
        doc="β loop proportional gain",
        tune=(0.001, 2.0),
        log=True,
        switch=True,
        when={"mode": ("threshold",)},
    )  # seed: none
    # same γ as the α loop, as in the seed.
    beta_ki: float = param(
        0.1,
        lo=0.0,
        hi=10.0,
        doc="β loop integral gain (the seed's γ)",
        tune=(0.001, 2.0),
        log=True,
        switch=True,
        when={"mode": ("threshold",)},
    )
    beta_kd: float = param(
        0.0,
        lo=0.0,
        hi=10.0,
        doc="β loop derivative gain",
        tune=(0.001, 2.0),
        log=True,
        switch=True,
        when={"mode": ("threshold",)},
    )  # seed: none
    # λ = 0.5: derivative of the error averaged over ~2 updates.
    d_filter: float = param(
        0.5,
        lo=0.01,
        hi=1.0,
        doc="low-pass coefficient λ of the derivative",
        tune=(0.05, 1.0),
        log=True,
    )
    # --- anomaly guard --
    # z-score reacts to one bad block; cusum to a sustained smaller drop.
    anomaly_detector: str = param(
        "zscore", choices=("zscore", "cusum", "off"), doc="collapse-of-â detector", tune=True
    )
    # 3 σ below the baseline.
    anomaly_z: float = param(
        3.0,
        lo=0.5,
        hi=20.0,
        doc="z-score limit for a collapse",
        tune=(1.0, 10.0),
        log=True,
        when={"anomaly_detector": ("zscore",)},
    )
    # a block-to-block σ of â below 0.05 is not trusted (few rounds per block).
    anomaly_sigma_floor: float = param(
        0.05,
        lo=1e-4,
        hi=1.0,
        doc="smallest σ used by the z-score",
        tune=(0.005, 0.2),
        log=True,
        when={"anomaly_detector": ("zscore",)},
    )
    # drops smaller than 0.05 per block are ignored by the CUSUM.
    cusum_slack: float = param(
        0.05,
        lo=0.0,
        hi=1.0,
        doc="CUSUM slack per block",
        tune=(0.0, 0.2),
        when={"anomaly_detector": ("cusum",)},
    )
    # a cumulative drop of 0.3 in â.
    cusum_limit: float = param(
        0.3,
        lo=0.01,
        hi=5.0,
        doc="CUSUM alarm level",
        tune=(0.05, 2.0),
        log=True,
        when={"anomaly_detector": ("cusum",)},
    )
    # baseline follows â with a time constant of ~5 blocks.
    baseline_ema: float = param(
        0.2,
        lo=0.01,
        hi=1.0,
        doc="EMA coefficient of the â baseline",
        tune=(0.02, 0.8),
        log=True,
        when={"anomaly_detector": ("zscore", "cusum")},
    )
    # 3 blocks of baseline before judging.
    baseline_min_blocks: int = param(
        3,
        lo=1,
        hi=1000,
        doc="block ends before the guard judges",
        tune=(1, 16),
        when={"anomaly_detector": ("zscore", "cusum")},
    )
    # more than 20% of accepts lossy is a quality risk worth acting on.
    lossy_limit: float = param(
        0.2,
        lo=0.0,
        hi=1.0,
        doc="threshold mode: max lossy-accept fraction",
        tune=(0.005, 0.5),
        log=True,
        when={"mode": ("threshold",)},
    )
    # verifying strictly is the safe reaction for both causes.
    anomaly_action: str = param(
        "strict",
        choices=("reset", "raise_beta", "strict"),
        doc="on anomaly: reset integrators, raise β, or verify strictly",
        tune=True,
        when={"anomaly_detector": ("zscore", "cusum")},
    )
    # one step of 0.05 toward stricter acceptance.
    beta_raise: float = param(
        0.05,
        lo=0.0,
        hi=0.29,
        doc="β increase of the raise_beta action",
        tune=(0.01, 0.29),
        when={
            "anomaly_action": ("raise_beta",),
            "anomaly_detector": ("zscore", "cusum"),
            "mode": ("threshold",),
        },
    )
    # 2 clean block ends before the guard clears.
    recovery_blocks: int = param(
        2,
        lo=1,
        hi=100,
        doc="clean block ends that end an anomaly",
        tune=(1, 16),
        when={"anomaly_detector": ("zscore", "cusum")},
    )
    # --- retry cap --
    # DESIGN: R <= 3 consecutive fruitless rounds.
    retry_cap: int = param(
        3, lo=1, hi=3, doc="fruitless rounds (drafted, none accepted) before AR", tune=(1, 3)
    )
    # 4 plain steps, then try speculating again.
    cooldown_rounds: int = param(
        4, lo=1, hi=1000, doc="plain AR rounds of the cool-down", tune=(1, 64), log=True
    )

    def __post_init__(self) -> None:
        if self.beta_min > self.beta_max:
            raise ConfigError(f"beta_min = {self.beta_min} > beta_max = {self.beta_max}")
        if not self.beta_min <= self.beta0 <= self.beta_max:
            raise ConfigError(
                f"beta0 = {self.beta0} outside [beta_min, beta_max] = "
                f"[{self.beta_min}, {self.beta_max}]"
            )
        if self.snap_tokens >= self.block_tokens:
            raise ConfigError(
                f"snap_tokens = {self.snap_tokens} must be < block_tokens = {self.block_tokens}"
            )
