"""``dspark``: the confidence scheduler (docs/design.md, "The `dspark` scheduler" and "Formulas"),
with two policies.

**goodput** (the default, load-aware). A round planner (:mod:`control.dspark_planner`, one per
engine replica, called once per round) chooses one draft cap for the batch and lets each
sequence stop below it, maximising expected emitted tokens per second of *batch* round time
(:mod:`control.goodput`) with costs learned online from the observed rounds
(:mod:`control.costmodel`) and per-sequence, per-position acceptance pooled over the batch.
Each sequence keeps its own evidence (forgotten acceptance counts), blocks, guards and loops:

- α loop — the TPOT trim. Error ``e = 1 − latency_ratio`` (measured TPOT of the sequence's
  window over ``slo_tpot_s``), output α in ``[alpha_min, 1]`` starting at 1. α weights the time
  that speculation adds to a round (``1/α``): α = 1 is pure goodput; a sequence that misses its
  SLO lowers α and stops drafting tokens that pay only at full goodput, which shortens the
  rounds it shares. Feedback path: shorter drafts → shorter rounds → lower TPOT → e rises; when
  the SLO is met the integrator rests at its ceiling 1 (pure goodput).
- β loop — unchanged (threshold mode): error ``1 − latency_ratio``, output β; a lower β lets
  more drafted tokens pass, raising tokens per round and lowering TPOT.
- Blocks decide when the trims move (updates only at block ends, as in the seed). The retry
  cap's cool-down is off unless ``goodput_cooldown`` (the plan already stops drafts that do
  not pay; forcing k = 0 also stops them where drafting is nearly free).

Without a planner (a batch-1 driver or a trace replay) a goodput sequence plans a batch of
itself with a private planner that learns from its own rounds.

**seed** (``policy = "seed"``): the seed's rules as written. Per sequence it keeps a sliding
window of rounds and, only when a semi-autoregressive block closes (:mod:`control.blocks`),
updates two loops:

- α loop (aggressiveness): PID on ``e = â − a_target`` (â: :mod:`control.window`), output α in
  ``[alpha_min, alpha_max]``, mapped to ``k = clip(round(α · k_ref), k_min, k_max)``
  (round half up); k only moves when the new value differs by at least ``k_hysteresis``.
- β loop (conservativeness, the threshold of lossy ``threshold`` verification): PID on
  ``e = 1 − latency_ratio``, ``latency_ratio = measured TPOT / slo_tpot_s``, output β in
  ``[beta_min, beta_max]`` (too slow → β falls → more drafted tokens pass).

With ``Kp = Kd = 0`` and ``Ki = γ`` the two loops are the seed's lines exactly::

    α ← α + γ · (â − a_target)
    β ← clip(β − γ · (latency_ratio − 1), 0.7, 0.99)

(α is also kept in its range; see :mod:`control.pid` for why it is bit-exact.) Around the loops:
warm-up (no updates for the first ``warmup_rounds``), a minimum update interval, an anomaly
guard (:mod:`control.anomaly`) whose action is configurable (reset the integrators, raise β, or
verify strictly until it recovers), and a retry cap (after ``retry_cap`` consecutive rounds that
drafted something and accepted nothing, ``cooldown_rounds`` plain autoregressive steps).

``decide`` returns a cached :class:`Decision` (rebuilt only when something changed), and
``observe`` is O(1): the simulator calls both for every sequence every round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from control.anomaly import AnomalyGuard
from control.base import Controller
from control.batch import BatchContext, RoundStats
from control.blocks import BlockPlanner
from control.configio import param
from control.errors import ConfigError
from control.pid import PID
from control.seqstate import (
    ALPHA,
    DECODE_S,
    PLANNED,
    RECENT_N,
    RECENT_REJ,
    SUM_N,
    SUM_REJ,
    TOKENS,
    SeqArrays,
)
from control.types import Decision, Mode, Observation
from control.window import RoundWindow


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


def k_of_alpha(alpha: float, k_ref: float, k_min: int, k_max: int) -> int:
    """``clip(round(α · k_ref), k_min, k_max)`` with round half up."""
    k = int(alpha * k_ref + 0.5)
    return k_min if k < k_min else k_max if k > k_max else k


class DSparkController(Controller):
    name = "dspark"
    reads_confidences = False

    def __init__(self, config: DSparkConfig | None = None) -> None:
        c = self.config = config or DSparkConfig()
        self._win = RoundWindow(c.window_rounds)
        self._blocks = BlockPlanner(c.block_tokens, c.snap_tokens, c.span_tokens)
        self.goodput = c.policy == "goodput"
        self.slo: Any = None  # the driver's SLOs (set_slo), None until told
        # goodput: α is the time-penalty weight of speculation, 1 = pure goodput (its ceiling)
        a_hi, a0 = (1.0, 1.0) if self.goodput else (c.alpha_max, c.alpha0)
        self._pid_a = PID(c.alpha_kp, c.alpha_ki, c.alpha_kd, c.d_filter, c.alpha_min, a_hi, a0)
        self._decay = 1.0 - 1.0 / c.memory_rounds  # goodput: forgetting of the â counts
        self._fast = 1.0 - 1.0 / c.recent_rounds  # goodput: forgetting of the recent counts
        self._retry = not self.goodput or c.goodput_cooldown
        self._pid_b = PID(
            c.beta_kp, c.beta_ki, c.beta_kd, c.d_filter, c.beta_min, c.beta_max, c.beta0
        )
        self._push = self._win.push_row  # bound once: observe() is on the hot path
        self._feed = self._blocks.feed
        self._guard = AnomalyGuard(
            c.anomaly_detector,
            c.anomaly_z,
            c.anomaly_sigma_floor,
            c.cusum_slack,
            c.cusum_limit,
            c.baseline_ema,
            c.baseline_min_blocks,
            c.lossy_limit,
            c.recovery_blocks,
        )
        self.reset()

    def first_token(self, ttft_s: float) -> None:
        """The request's time to first token (told by the driver): a request past its TTFT
        SLO no longer counts in the planner's SLO share (its tokens still count as output)."""
        self.ttft_s = ttft_s

    def set_slo(self, slo: Any) -> None:
        """The driver's SLOs: the TPOT trim holds the driver's TPOT SLO (``slo_tpot_s`` when it
        gives none), and a planner of this sequence's own plans against them."""
        self.slo = slo
        if self._solo is not None:
            self._solo.set_slo(slo)

    @classmethod
    def make_planner(cls, config: DSparkConfig) -> Any:
        if config.policy != "goodput":
            return None
        from control.dspark_planner import DSparkPlanner

        return DSparkPlanner(config)

    # --- the rows a round planner reads (control.seqstate) --
    def _bind(self, store: SeqArrays, slot: int) -> None:
        self._store, self._slot = store, slot
        # memoryviews: element access in Python floats, ~2x numpy's scalar indexing
        self._row: Any = memoryview(store.values[slot])  # format "d": floats in and out
        self._cnt: Any = memoryview(store.counts[slot])

    def __getstate__(self) -> dict[str, Any]:  # memoryviews do not pickle: rebound on load
        return {k: v for k, v in self.__dict__.items() if k not in ("_row", "_cnt")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._bind(self._store, self._slot)

    sum_n = property(lambda self: float(self._row[SUM_N]))
    sum_rej = property(lambda self: float(self._row[SUM_REJ]))
    recent_n = property(lambda self: float(self._row[RECENT_N]))
    recent_rej = property(lambda self: float(self._row[RECENT_REJ]))
    decode_s = property(lambda self: float(self._row[DECODE_S]))
    tokens = property(lambda self: int(self._row[TOKENS]))

    @property
    def alpha(self) -> float:
        return float(self._row[ALPHA])

    @alpha.setter
    def alpha(self, value: float) -> None:
        self._row[ALPHA] = value

    @property
    def planned_k(self) -> int:
        """goodput: this sequence's length in the planner's last full plan (-1: none)."""
        return int(self._row[PLANNED])

    @property
    def counts(self) -> list[int]:
        """goodput: this sequence's rounds since the planner last read them: index n = rounds
        that accepted n and then refused one, k_max + 1 + n = rounds that accepted all n."""
        return [int(x) for x in self._cnt.tolist()]

    @property
    def plan_rates(self) -> Any:
        """goodput: the per-position rates the planner's last full plan predicted for this
        sequence (before its position factors; None before any), what ``counts`` is held to."""
        st, i = self._store, self._slot
        return st.rates[i].copy() if st.has_rates[i] else None

    # --- protocol --
    def reset(self) -> None:
        c = self.config
        self._win.clear()
        self._blocks.reset()
        self._pid_a.reset()
        self._pid_b.reset()
        self._guard.reset()
        # the state a round planner reads lives in its rows of a SeqArrays (control.seqstate):
        # sum_n / sum_rej (goodput: accepted tokens and rounds that ended in a rejection,
        # forgotten at 1/memory_rounds per round), recent_n / recent_rej (the same, forgotten at
        # 1/recent_rounds), decode_s (seconds from the first round's start to the end of the
        # last round observed), tokens (emitted by the rounds observed), α, planned_k, counts,
        # plan_rates; a sequence no planner drives has a store of its own
        store = getattr(self, "_store", None)
        if store is None:
            SeqArrays.single(c.k_max).new_slot(self)
        else:
            store.new_slot(self, self._slot)
        self.alpha = self._pid_a.output
        self.beta = c.beta0
        self.k = c.k_max if self.goodput else k_of_alpha(c.alpha0, c.k_ref, c.k_min, c.k_max)
        self.context_tokens = 0
        self.first_s = -1.0  # start of the first round observed (≈ the first token's time)
        self.ttft_s = math.nan  # the request's time to first token, when the driver tells it
        # goodput: own planner when no round planner drives this sequence; reset() keeps it —
        # the costs it learned are the hardware's, not the sequence's (a new controller forgets)
        self._solo = getattr(self, "_solo", None)
        self._full = c.k_max + 1
        self.a_hat: float | None = None
        self.latency_ratio: float | None = None
        self.rounds = 0
        self.updates = 0
        self.last_update_round = -(10**9)
        self.fails = 0
        self.cooldown = 0
        self.cooldowns = 0
        self.block_index = 0
        self._pending: Decision | None = None
        # set by _rebuild() below, before any use
        self._decision: Decision = None  # type: ignore[assignment]
        self._block_decision: Decision | None = None
        self._rebuild(False)

    def decide(self, now_s: float, batch=None) -> Decision:
        """Seed policy: this sequence's decision. Goodput policy with no round planner driving
        it (a batch-1 engine, a trace replay): a plan for a batch of this one sequence, its
        costs learned from its own rounds."""
        if self.goodput:
            if self._solo is None:
                from control.dspark_planner import DSparkPlanner

                self._solo = DSparkPlanner(self.config)
                if self.slo is not None:
                    self._solo.set_slo(self.slo)
            ctx = BatchContext(1, self.context_tokens) if batch is None else batch
            return self._solo.plan(now_s, (self,), ctx)[0]
        return self.take_decision()

    def take_decision(self) -> Decision:
        """The sequence's own decision (the block-end one once, then the cached one); under
        the goodput policy its k is the sequence's cap (k_max, 0 in a cool-down)."""
        d = self._pending
        if d is not None:
            self._pending = None
            return d
        return self._decision

    def observe(self, obs: Observation) -> None:
        self.observe_values(
            obs.now_s,
            obs.drafted,
            obs.accepted,
            obs.confidences,
            obs.draft_s,
            obs.verify_s,
            obs.context_tokens,
            obs.lossy_accepts,
            obs.emitted,
            obs.sentence_ends,
            obs.batch_size,
            obs.batch_tokens,
            obs.batch_context_tokens,
        )

    def observe_values(
        self,
        now_s,
        drafted,
        n,
        confidences,
        draft_s,
        verify_s,
        context_tokens,
        lossy_accepts,
        e,
        sentence_ends,
        batch_size=1,
        batch_tokens=0,
        batch_context_tokens=0,
    ) -> None:
        # hot path (the simulator calls it per sequence per round): locals, no calls but the
        # window's push and the block planner's feed (both bound once) unless something happens
        # (a fruitless round, a cool-down step, a block boundary).
        self._push(
            (
                n,
                1 if n < drafted else 0,
                drafted,
                e,
                draft_s,
                draft_s + verify_s,
                lossy_accepts,
                now_s,
            )
        )  # window.row_of
        self.rounds += 1
        if self.goodput:  # in place, in this sequence's rows (control.seqstate)
            r = self._row
            rej = 1 if n < drafted else 0
            f = self._decay
            r[0] = r[0] * f + n  # SUM_N
            r[1] = r[1] * f + rej  # SUM_REJ
            f = self._fast
            r[2] = r[2] * f + n  # RECENT_N
            r[3] = r[3] * f + rej  # RECENT_REJ
            self.context_tokens = context_tokens + e
            if self.first_s < 0.0:
                self.first_s = now_s - draft_s - verify_s
            r[4] = now_s - self.first_s  # DECODE_S
            r[5] += e  # TOKENS
            if drafted:  # per-position evidence, pooled by the planner at its next full plan
                self._cnt[n if n < drafted else self._full + n] += 1.0
            if self._solo is not None:  # no round planner: the round goes to its own planner
                self._solo.observe_round(
                    RoundStats(
                        now_s - draft_s - verify_s,
                        now_s,
                        batch_size,
                        1 if drafted else 0,
                        drafted,
                        batch_tokens or drafted + 1,
                        batch_context_tokens or context_tokens,
                        draft_s,
                        verify_s,
                        n,
                        e,
                    )
                )
        changed = False
        if self.cooldown:
            self.cooldown -= 1
            changed = self.cooldown == 0
        elif drafted and self._retry:
            if n:
                self.fails = 0
            else:
                self.fails += 1
                if self.fails >= self.config.retry_cap:
                    self.fails = 0
                    self.cooldown = self.config.cooldown_rounds
                    self.cooldowns += 1
                    changed = True
        if self._feed(e, sentence_ends):  # a block closed
            self._block_end()
            return
        if changed:
            self._rebuild(False)

    def state(self) -> dict[str, Any]:
        g = self._guard
        return {
            "k": self.k,
            "k_decided": self._decision.k,
            "mode": self._decision.mode,
            "alpha": self.alpha,
            "beta": self.beta,
            "a_hat": self.a_hat,
            "latency_ratio": self.latency_ratio,
            "alpha_integrator": self._pid_a.integrator,
            "beta_integrator": self._pid_b.integrator,
            "alpha_derivative": self._pid_a.d_state,
            "beta_derivative": self._pid_b.d_state,
            "anomaly": g.active,
            "anomaly_reason": g.last_reason,
            "anomalies": g.detections,
            "cusum": g.cusum,
            "baseline_a": g.mu,
            "fails": self.fails,
            "cooldown": self.cooldown,
            "cooldowns": self.cooldowns,
            "block_index": self.block_index,
            "block_tokens_so_far": self._blocks.tokens_in_block,
            "rounds": self.rounds,
            "updates": self.updates,
            "policy": self.config.policy,
            "a_seq": (
                self.sum_n / (self.sum_n + self.sum_rej) if self.sum_n + self.sum_rej > 0 else None
            ),
        }

    # --- internals --
    def _rebuild(self, block_end: bool) -> None:
        c = self.config
        strict = self._guard.active and c.anomaly_action == "strict"
        # c.mode is one of MODES (its param choices): the Literal Decision takes
        mode: Mode = "strict" if strict else c.mode  # type: ignore[assignment]
        k = 0 if self.cooldown else self.k
        beta = self.beta
        # reuse the previous (immutable) Decision objects when nothing in them changed
        d = self._decision
        if d is None or d.k != k or d.mode != mode or d.beta != beta or d.tau != c.tau:
            d = self._decision = Decision(k=k, mode=mode, beta=beta, tau=c.tau)
        if block_end:
            p = self._block_decision
            if p is None or p.k != k or p.mode != mode or p.beta != beta:
                p = self._block_decision = Decision(
                    k=k, mode=mode, beta=beta, tau=c.tau, block_end=True
                )
            self._pending = p

    def _block_end(self) -> None:
        c = self.config
        win = self._win
        self.block_index = self._blocks.blocks_closed
        a = win.a_hat()
        tpot = win.tpot_s() if c.tpot_source == "round_time" else win.wall_tpot_s()
        self.a_hat = a
        slo = self.slo.tpot_s if self.slo is not None else math.inf
        self.latency_ratio = (
            None if tpot is None else tpot / (slo if math.isfinite(slo) else c.slo_tpot_s)
        )
        if self.rounds >= c.warmup_rounds:
            if self.rounds - self.last_update_round >= c.min_update_rounds:
                if self.goodput:  # α trims the time penalty to hold the TPOT SLO
                    if self.latency_ratio is not None:
                        self.alpha = self._pid_a.step(1.0 - self.latency_ratio)
                elif a is not None:
                    self.alpha = self._pid_a.step(a - c.a_target)
                if self.latency_ratio is not None:
                    self.beta = self._pid_b.step(1.0 - self.latency_ratio)
                self.last_update_round = self.rounds
                self.updates += 1
            if self._guard.check(a, win.lossy_fraction(), c.mode == "threshold"):
                self._on_anomaly()
            if not self.goodput:
                k = k_of_alpha(self.alpha, c.k_ref, c.k_min, c.k_max)
                if abs(k - self.k) >= c.k_hysteresis:
                    self.k = k
        self._rebuild(True)

    def _on_anomaly(self) -> None:
        c = self.config
        if c.anomaly_action == "reset":
            self._pid_a.reset()
            self._pid_b.reset()
            self.alpha, self.beta = self._pid_a.output, self._pid_b.output
        elif c.anomaly_action == "raise_beta":
            self._pid_b.reset(self._pid_b.integrator + c.beta_raise)  # clears e_prev too
            self.beta = self._pid_b.output
