"""The ``dspark`` controller's configuration, one dataclass for both policies (``goodput`` and
``seed``; :mod:`control.dspark` describes them). Each field names the policy it acts under."""

from __future__ import annotations

from dataclasses import dataclass

from control.configio import param
from control.errors import ConfigError


@dataclass(frozen=True)
class DSparkConfig:
    # --- policy -------------------------------------------------------------------------------
    # goodput: load-aware round planning (control.dspark_planner); seed: the seed's α → k rule.
    policy: str = param(
        "goodput",
        choices=("goodput", "seed"),
        doc="goodput (load-aware, default) or seed (α → k as written)",
    )
    # 4 pseudo-trials: a new request starts at the pooled rate and is its own after ~2 rounds.
    prior_trials: float = param(
        4.0,
        lo=0.0,
        hi=1000.0,
        doc="goodput: weight of the pooled rate in a sequence's â",
        tune=(0.5, 64.0),
        log=True,
        when={"policy": ("goodput",)},
    )
    # slo-goodput: plan for the tokens of requests that meet the driver's SLOs (per-request
    # TPOT within the SLO, waiting prompts' value from their TTFT slack); with slack SLOs it is
    # the throughput plan. throughput: tokens per second of batch round time, SLOs ignored.
    objective: str = param(
        "slo-goodput",
        choices=("slo-goodput", "throughput"),
        doc="goodput: what the round plan maximises",
        tune=True,
        when={"policy": ("goodput",)},
    )
    # 0.8: plan each sequence's predicted TPOT (round time / expected tokens) to 80% of the SLO:
    # headroom for the rounds the plan does not foresee (long prompt chunks, new batch-mates).
    slo_margin: float = param(
        0.8,
        lo=0.1,
        hi=2.0,
        doc="goodput/slo-goodput: share of the TPOT SLO a plan may use",
        tune=(0.6, 1.2),
        when={"policy": ("goodput",)},
    )
    # 0 = steady state: a plan's round time is taken to last, and a sequence's TPOT is round time
    # over expected tokens. h > 0 weighs its TPOT so far as h rounds like the planned one, which
    # lost attainment in benchmarks/slo_value.py (sequences behind their SLO stop counting).
    slo_horizon_rounds: float = param(
        0.0,
        lo=0.0,
        hi=1e6,
        doc="goodput/slo-goodput: rounds a sequence's TPOT so far is weighed against (0 = none)",
        tune=(0.0, 256.0),
        when={"policy": ("goodput",)},
    )
    # 0 = a hard cut at the planned share of the SLO (benchmarks/slo_value.py); s > 0 counts a
    # sequence predicted at p by the logistic σ((SLO − p) / (s · SLO)).
    slo_spread: float = param(
        0.0,
        lo=0.0,
        hi=10.0,
        doc="goodput/slo-goodput: relative spread of a predicted TPOT (0 = hard cut)",
        tune=(0.01, 1.0),
        log=True,
        switch=True,
        when={"policy": ("goodput",)},
    )
    # 8: a waiting prompt about to miss its TTFT SLO is worth up to 8x the observed value of a
    # prompt token, so drafts give its chunk the pass.
    ttft_value_max: float = param(
        8.0,
        lo=0.0,
        hi=1000.0,
        doc="goodput/slo-goodput: cap on the TTFT urgency factor of a prompt token's value",
        tune=(1.0, 64.0),
        log=True,
        when={"policy": ("goodput",)},
    )
    # 0.7: a middling drafter, used only until the first rounds of any request are seen.
    a_prior: float = param(
        0.7,
        lo=0.01,
        hi=0.99,
        doc="goodput: pooled rate before any round",
        tune=(0.3, 0.95),
        when={"policy": ("goodput",)},
    )
    # 4: explores a useful length while the cost model has seen only one token count.
    k_start: int = param(
        4,
        lo=1,
        hi=64,
        doc="goodput: cap of the first rounds (cold start)",
        tune=(1, 8),
        when={"policy": ("goodput",)},
    )
    # every 32nd round tries the neighbouring cap so the cost slope stays identifiable.
    explore_every: int = param(
        32,
        lo=0,
        hi=100_000,
        doc="goodput: rounds between cost probes at cap ± 1 (0 = never)",
        tune=(0, 256),
        when={"policy": ("goodput",)},
    )
    # 64 rounds: long enough to average a sequence's noise, short enough to follow its regime.
    memory_rounds: int = param(
        64,
        lo=1,
        hi=100_000,
        doc="goodput: forgetting horizon of acceptance evidence (rounds)",
        tune=(4, 1024),
        log=True,
        when={"policy": ("goodput",)},
    )
    # the last ~4 rounds, weighed against 8 pseudo-trials of the long-run rate: a good or bad
    # stretch (easy/hard regimes) moves a sequence's â within a few rounds, noise hardly does.
    recent_rounds: int = param(
        4,
        lo=1,
        hi=10_000,
        doc="goodput: forgetting horizon of the recent-evidence estimate (rounds)",
        tune=(1, 64),
        log=True,
        when={"policy": ("goodput",)},
    )
    recent_prior: float = param(
        8.0,
        lo=0.0,
        hi=1e6,
        doc="goodput: pseudo-trials of the long-run rate in the recent estimate (large = ignore)",
        tune=(0.5, 1000.0),
        log=True,
        when={"policy": ("goodput",)},
    )
    # 0.99 per round: the cost fit remembers ~100 rounds and follows a change of load.
    cost_forget: float = param(
        0.99,
        lo=0.5,
        hi=1.0,
        doc="goodput: forgetting factor of costs",
        tune=(0.9, 0.999),
        when={"policy": ("goodput",)},
    )
    # 32 rounds: an engine's measured start-up profile counts as a third of the ~100 rounds
    # the fit remembers: rounds spread over many draft lengths outweigh it, rounds crowded at
    # one length (whose timing noise would set the slope) cannot; it matters most where the
    # first rounds are slow to vary (benchmarks/real_tp.py, TP = 2 with dspark).
    # 0 = off (the engine then times nothing).
    profile_prior_rounds: float = param(
        32.0,
        lo=0.0,
        hi=1e6,
        doc="goodput: weight of a seeded cost profile, in rounds",
        when={"policy": ("goodput",)},
    )
    # 1: a prompt token that drafts push out of a full chunked-prefill pass is worth one output
    # token (the request it belongs to joins the batch that much later); 0 = only its time.
    # Under prompt_value_source = "observed" this is the prior of the learned value.
    prompt_token_value: float = param(
        1.0,
        lo=0.0,
        hi=100.0,
        doc="goodput: output tokens a displaced prompt token is worth (chunked prefill)",
        tune=(0.0, 4.0),
        when={"policy": ("goodput",)},
    )
    # observed: a prompt token is worth the output its request brings per prompt token, learned
    # as Σ emitted / Σ prefilled over the rounds (~1000 rounds' memory), prompt_token_value
    # its prior: chat-sized prompts (~300 in, ~250 out) move it toward 0.8, 14k-token prompts
    # with ~340 out toward 340/14000 = 0.024, and the drafts get the pass (measured by
    # benchmarks/prompt_value.py and the long-context trace of benchmarks/long_context_trace.py).
    # fixed: prompt_token_value as is.
    prompt_value_source: str = param(
        "observed",
        choices=("fixed", "observed"),
        doc="goodput: prompt-token value fixed, or learned from emitted / prefilled tokens",
        tune=True,
        when={"policy": ("goodput",)},
    )
    # 65536 prompt tokens (~200 chat prompts): the value moves once a workload's prompts and
    # outputs have been seen at scale, not while a big batch first fills: a small prior lets
    # the first prompts of a filling batch set it (benchmarks/prompt_value.py, the capacity cells
    # at B = 128/256).
    prompt_value_prior_tokens: float = param(
        65536.0,
        lo=0.0,
        hi=1e9,
        doc="goodput: prompt tokens of pseudo-evidence behind prompt_token_value (observed)",
        tune=(1024.0, 1048576.0),
        log=True,
        when={"policy": ("goodput",)},
    )
    # 2 rounds: a sequence's belief moves within a few rounds when text switches between easy
    # and hard stretches (6 seeds: 8 rounds lost 2-3% to 2 on Markov and mixed-rate cells);
    # each full plan costs ~0.3 ms of CPU, so 1 doubles the planner's cost again for ~1%.
    replan_rounds: int = param(
        2,
        lo=1,
        hi=10_000,
        doc="goodput: rounds between full plans",
        tune=(1, 32),
        log=True,
        when={"policy": ("goodput",)},
    )
    # --- modes and starting point -------------------------------------------------------------
    # lossless by default; threshold (lossy β rule) only when asked.
    mode: str = param("strict", choices=("strict", "threshold"), doc="verification mode", tune=True)
    # the seed's starting aggressiveness.
    alpha0: float = param(
        0.8,
        lo=0.3,
        hi=1.5,
        doc="initial α (aggressiveness)",
        tune=(0.3, 1.5),
        when={"policy": ("seed",)},
    )
    # the seed's starting conservativeness.
    beta0: float = param(
        0.85,
        lo=0.7,
        hi=0.99,
        doc="initial β (threshold-mode threshold)",
        tune=(0.7, 0.99),
        when={"mode": ("threshold",)},
    )
    # DESIGN's α range.
    alpha_min: float = param(
        0.3,
        lo=0.3,
        hi=1.5,
        doc="lower clamp of α and of its integrator",
        tune=(0.3, 1.5),
        hi_from=("alpha0", 0),
    )
    alpha_max: float = param(
        1.5,
        lo=0.3,
        hi=1.5,
        doc="upper clamp of α and of its integrator",
        tune=(0.3, 1.5),
        lo_from=("alpha0", 0),
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
    k_max: int = param(
        15, lo=1, hi=64, doc="largest draft length", tune=(2, 32), lo_from=("k_min", 0)
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
    # 0 = no drafter-confidence stop (the seed has none); it never changes output. Tuned only
    # for the seed policy: the goodput planner stops each sequence on its own evidence, and a τ
    # tuned on the simulator's synthetic confidences does not transfer to a real drafter (τ =
    # 0.185 from a study made real dspark draft nothing in 79% of rounds on unseen prompts).
    tau: float = param(
        0.0,
        lo=0.0,
        hi=1.0,
        doc="drafter-confidence stop passed to the driver",
        tune=(0.0, 0.9),
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
    # off: under goodput a sequence whose drafts do not pay already stops (its â falls); a forced
    # cool-down also stops it where drafting is nearly free (the others set the round's steps).
    goodput_cooldown: bool = param(
        False,
        choices=(False, True),
        doc="goodput: also apply the retry-cap cool-down",
        tune=True,
        when={"policy": ("goodput",)},
    )
    # 4 plain steps, then try speculating again.
    cooldown_rounds: int = param(
        4, lo=1, hi=1000, doc="plain AR rounds of the cool-down", tune=(1, 64), log=True
    )

    def __post_init__(self) -> None:
        if self.alpha_min > self.alpha_max:
            raise ConfigError(f"alpha_min = {self.alpha_min} > alpha_max = {self.alpha_max}")
        if not self.alpha_min <= self.alpha0 <= self.alpha_max:
            raise ConfigError(
                f"alpha0 = {self.alpha0} outside [alpha_min, alpha_max] = "
                f"[{self.alpha_min}, {self.alpha_max}]"
            )
        if self.beta_min > self.beta_max:
            raise ConfigError(f"beta_min = {self.beta_min} > beta_max = {self.beta_max}")
        if not self.beta_min <= self.beta0 <= self.beta_max:
            raise ConfigError(
                f"beta0 = {self.beta0} outside [beta_min, beta_max] = "
                f"[{self.beta_min}, {self.beta_max}]"
            )
        if self.k_min > self.k_max:
            raise ConfigError(f"k_min = {self.k_min} > k_max = {self.k_max}")
        if self.snap_tokens >= self.block_tokens:
            raise ConfigError(
                f"snap_tokens = {self.snap_tokens} must be < block_tokens = {self.block_tokens}"
            )
