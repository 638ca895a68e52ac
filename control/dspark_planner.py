"""The round planner of the load-aware ``dspark`` (the default ``goodput`` policy).

Once per round, for the batch's sequences (each a :class:`~control.dspark.DSparkController`):

1. **Evidence per sequence.** ``â_i = (Σn_i + w·p) / (Σn_i + Σrej_i + w)``: the sequence's own
   acceptance counts (forgotten at ``1/memory_rounds`` per round) shrunk toward the pool ``p``
   of the batch (``w`` = ``prior_trials``), so a new request starts at what its batch-mates see,
   then moved by its recent rounds; a Beta belief whose predictive rate rises along the draft
   while the sequence's rate is uncertain; times a pooled factor per draft position that holds
   the beliefs to what the plans predicted (see :meth:`DSparkPlanner.acceptance`). ``w`` and
   the recent rounds' weight are as configured, or (``belief_weights = "predictive"``) the
   pair on a grid around them whose beliefs predicted the batch's outcomes best
   (:mod:`control.belief_weights`).
2. **Costs** from :class:`~control.costmodel.RoundCostModel`, fitted on the rounds observed by
   this planner (``observe_round``), never on the simulator's latency model.
3. **Choice** by :func:`~control.goodput.plan_round_lengths`: one cap for the round, each sequence
   stopping below it when its next token does not pay for its verify time; a sequence in a
   cool-down (retry cap) has cap 0. α (per sequence, the TPOT trim) weights the time penalty.
   Under the driver's SLOs (objective ``slo-goodput``) the cap is the one with the most
   requests expected to meet the TPOT SLO (:func:`~control.goodput.slo_goodput_row`), each
   sequence's predicted TPOT being its planned round time stretched by the share of the
   replica's recent time that went to prompt chunks (``prefill_share``), over its expected
   tokens: one draft step more lengthens every sequence's wait, and low-acceptance sequences,
   whose tokens it does not multiply, are the ones it pushes past the SLO. With
   ``slo_prefill = "backlog"`` (the default), while prompts wait beyond this round's pass the
   chunk is a cost a round, not a stretch, for as long as they fill the pass: a sequence's
   predicted TPOT takes ``f_i · (T_r + C) + (1 − f_i) · T_r / (1 − ρ)`` over its expected
   tokens, ``C`` the seconds this round's chunk adds to the verify pass and ``f_i`` the rounds
   the waiting prompts need at the spare budget over the rounds sequence ``i`` lives (the
   mean output per sequence new to the batch, ``Σ emitted / Σ arrivals`` forgotten as the
   prompt value's sums, over its planned tokens a round), at most 1
   (:mod:`control.prefill_backlog`). With no TPOT SLO and no prompt queueing
   (``no_slo_rank = "mean-tpot"``, :meth:`DSparkPlanner._ranks_latency`) the cap is the one
   with the least mean predicted time per token over the sequences
   (:func:`~control.goodput.mean_tpot_row`): each request's latency weighs alike.
4. **Probing.** Until the cost model has seen two token counts, caps alternate between
   ``k_start`` and 1; afterwards every ``explore_every``-th round uses cap ± 1 (alternating), so
   the slope of the verify cost stays identifiable when the load does not move by itself; none
   while the last full plan's SLO rank hurdle bound (``slo_quiet_probes``: TPOT pays for it).
5. **Prompt tokens.** Under chunked prefill a draft that pushes prompt tokens out of the pass is
   charged what they are worth in output tokens (``RoundCostModel.functions``): the configured
   ``prompt_token_value``, or (``prompt_value_source = "observed"``, the default) the workload's
   own output per prompt token, ``(Σ emitted + m·v₀) / (Σ prefilled + m)`` over the rounds seen
   (forgotten at 1/1000 per round; ``v₀`` = ``prompt_token_value``, ``m`` =
   ``prompt_value_prior_tokens``, forgotten at the same rate, so a replica that prefills few
   tokens a round is not held near ``v₀`` for good): a prompt token brings its request's output
   per prompt token. While prompts queue (the oldest has waited ``sunk_share_rounds`` rounds)
   the plain step's share of a pass it shares with a chunk (``CostFunctions.shared_s``) is
   left out of the goodput ratio: time is the bottleneck then, and that share is paid
   whatever the drafts.
6. **Re-planning.** A full plan runs every ``replan_rounds`` rounds, or sooner when the batch
   size moved by more than a quarter (and by more than 4); in between each sequence keeps its planned length (a
   newcomer takes the cap), bounded by its own decision. This keeps the planner's cost per
   round near that of the per-sequence controllers it drives. With ``replan_backoff`` b > 0,
   each full plan that gives every sequence the length it kept doubles the interval (up to
   ``2^b`` times, at most ``explore_every``); a plan that changes a length resets it, and a
   prompt starting or ending to wait, or a new draft limit from the engine, re-plans at once.
7. **Idling.** A full plan that drafts nothing while no prompt token waits (speculation does
   not pay here: a compute-bound target, a drafter that misses) learns nothing new until the
   next probe — no draft, no acceptance or cost-slope evidence. After ``i`` such plans in a
   row the interval between full plans is ``replan_rounds·2^i`` (at most ``explore_every``)
   and probes come every ``explore_every·2^min(i, 3)`` rounds, so an engine where speculation
   loses pays neither a plan every other round nor a probe (a drafter catching up on every
   token since its last draft) every ``explore_every``. A plan that drafts, or prompt tokens
   newly waiting, end it; a batch that moves re-plans as before.

8. **A confidence head** (``acceptance_source = "confidence"``). Each sequence's evidence is
   what its drafter's confidences predicted for the positions it drafted
   (:func:`~control.seqstate.expected_outcome`), the beliefs take no position factor (the
   head's calibration is the drafter's: the engine refits it on the verified slots), and a
   full plan gives every sequence the round's cap with its break-even survival
   (:func:`~control.goodput.break_even`) as ``Decision.survival``: the driver cuts each
   drafted block where the running product of its confidences falls below the survival the
   plan holds a token to, so this round's predictions, not the history, decide the length.

The per-sequence decision keeps its mode, β, τ and block-end flag; only k (and, with a
confidence head, the survival stop) is planned.

The sequences' state lives in the planner's arrays (:class:`~control.seqstate.SeqArrays`, a
slot per member): their evidence, windows, retry caps and blocks, recorded for the batch at once
(``observe_members``); a plan gathers the batch by slot, and hands each sequence its decision
again unless it moved (:mod:`control.handout`), with no Python loop over the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from control.batch import BatchContext, RoundPlanner, RoundStats
from control.belief_kernel import hold_to_plans, point_beliefs, position_factor, scaled_capped
from control.belief_weights import SCORE_HALF_LIFE, PredictiveWeights
from control.costmodel import RoundCostModel
from control.goodput import (
    CostFunctions,
    binding_hurdle,
    break_even,
    mean_tpot_row,
    plan_round_lengths,
    slo_floor_plan,
    slo_goodput_row,
)
from control.handout import HandOut, kept_lengths
from control.prefill_backlog import backlog_share, predicted_terms, prompts_queued
from control.seqstate import (
    ALPHA,
    DECODE_S,
    PLANNED,
    READS,
    SOLO,
    SURVIVAL,
    TOKENS,
    TTFT,
    SeqArrays,
    any_set,
)
from control.tpot_calibration import TpotCalibration
from control.types import Decision

#: Per-round weight of the newest round in the prefill share of a replica's time (~100 rounds:
#: many prompts' chunks, so one long prompt does not swing a sequence's predicted TPOT).
PREFILL_SHARE_RATE = 0.01
#: The prefill share is capped here: a replica that only prefills still plans its decode.
PREFILL_SHARE_MAX = 0.9

#: Batches from this size on record their members' evidence at once (``observe_members``, one
#: compiled call: control.seqstate.record_round); a lone member records its own (measured with
#: benchmarks/planner_cost.py: the members' observe calls at batch 16 29.4 -> 23.8 µs a round).
RECORD_AT_ONCE = 2

#: Per-round memory of the emitted / prefilled token sums behind the observed prompt value
#: (~1000 rounds: many requests' prompts and outputs, so one long prompt does not swing it).
PROMPT_VALUE_KEEP = 0.999


class DSparkPlanner(RoundPlanner):
    """Goodput planning of draft lengths for a batch of ``dspark`` sequences."""

    needs_rates = False  # the rate oracle (control.references) sets it and is told true rates

    def __init__(self, config: Any) -> None:
        self.config = config
        self.costs = RoundCostModel(forget=config.cost_forget)
        self.hand = HandOut()  # the decisions handed to the batch (control.handout)
        #: the batch's per-sequence state, a slot per member (control.seqstate)
        self.seqs = SeqArrays(config.k_max, 16)
        self._idx = np.zeros(0, dtype=np.intp)  # the slots of this round's members
        self._members: list = []  # this round's members (observe_members checks them)
        self._ranks = np.arange(1, config.k_max + 1)  # draft positions 1..K (_beliefs)
        self._head = config.acceptance_source == "confidence"  # module docstring, item 8
        #: the beliefs' weights chosen by their predictions (belief_weights "predictive")
        self.weights = (
            PredictiveWeights(config.prior_trials, config.recent_prior, config.k_max)
            if config.belief_weights == "predictive" and not self._head
            else None
        )
        #: predicted TPOT held to the rounds' real seconds and tokens (slo_calibrate)
        self.tpot_cal = TpotCalibration() if config.slo_calibrate else None
        self.reset()

    def reset(self) -> None:
        self.costs.reset()
        if self.weights is not None:
            self.weights.reset()
        if self.tpot_cal is not None:
            self.tpot_cal.reset()
        self.profile = np.zeros(2 * (self.config.k_max + 1))  # pooled rounds by n (_pooled)
        self.expected = np.zeros(self.config.k_max)  # Σ plan-predicted rate at position j
        self.rounds = 0
        self.last_cap = -1  # no plan yet: the first full plan searches every cap
        self.last_goodput = float("nan")
        self._rates: list[float] | None = None
        self._since = 0  # rounds since the last full plan
        self.full_plan = False  # whether the last round's plan was a full one (item 6)
        self._planned_b = 0  # batch size of the last full plan
        self._idle = 0  # draft-free full plans in a row with no prompt waiting (item 7)
        self._stable = 0  # full plans in a row that kept every length (item 6)
        self._planned_backlog = False  # whether a prompt waited at the last full plan
        self._planned_kmax = -1  # the engine's draft limit at the last full plan
        self._probed = False  # whether the last full plan was a probe
        self._binds = False  # whether the last full plan's rank hurdle bound
        self._emitted = 0.0  # Σ output tokens of the rounds seen (forgotten, PROMPT_VALUE_KEEP)
        self._prefilled = 0.0  # Σ prompt tokens of the rounds seen (the same)
        self._prior_w = 1.0  # what is left of the prompt value's prior (forgotten the same)
        self._arrivals = 0.0  # Σ sequences new to the batch (forgotten the same)
        self._adopted = self.seqs.adopted  # the store's count at the last round seen
        self._round_s = 0.0  # recent round time (EMA over ~20 rounds), for the TTFT urgency
        self._chunk_s = 0.0  # recent prompt-chunk seconds a round (EMA, PREFILL_SHARE_RATE)
        self._pass_s = 0.0  # recent seconds a round (the same EMA), the share's denominator
        self._survival0 = 0.0  # the last full plan's break-even survival at α = 1 (item 8)

    @property
    def wants_costs_seed(self) -> bool:
        """Whether a measured cost profile would be used (``profile_prior_rounds`` > 0): an
        engine need not time itself for nothing."""
        return self.config.profile_prior_rounds > 0

    def seed_costs(self, rows) -> None:
        """A measured cost profile (``RoundCostModel.seed`` rows) as the cost fits' prior,
        worth ``profile_prior_rounds`` rounds; an engine hands its own before the first
        round."""
        self.costs.seed(rows, self.config.profile_prior_rounds)

    def set_rates(self, rates: Sequence[float]) -> None:
        """True per-sequence rates (the rate oracle only; a causal planner never gets them)."""
        self._rates = list(rates)

    # --- planning --
    def acceptance(self, members: Sequence[Any], idx: np.ndarray | None = None) -> np.ndarray:
        """Per-position acceptance rates ``(k_max, B)``, position j given positions < j were
        accepted in the same round.

        Each sequence's rate is a Beta belief: its own counts (forgotten at ``1/memory_rounds``)
        shrunk toward the batch's pooled rate by ``prior_trials`` pseudo-trials, then its recent
        rounds (``1/recent_rounds``) weighed against ``recent_prior`` pseudo-trials of that.
        With mean ``â_i`` and evidence mass ``m_i`` the predictive rate of position j is
        ``(â_i·m_i + j − 1) / (m_i + j − 1)``: each accepted draft token is evidence that the
        sequence is in a good stretch, so an uncertain sequence's later positions are more
        likely accepted and a well-known one's hardly move (the easy/hard regimes of real text;
        an i.i.d. sequence known exactly stays flat).

        That, times a pooled position factor ``r_j`` = successes at position j / what the
        plans predicted there (each sequence's rounds are held to the rates of the plan they ran
        under, read at the next plan), over every sequence this planner served (forgotten by
        halves every ``memory_rounds`` rounds). Holding each round to its own prediction keeps
        ``r_j`` free of survivor bias and calibrates the belief itself: ``r_j`` = 1 when the
        beliefs are right, falls with j when acceptance decays with the draft position or the
        beliefs run high, rises when they run low."""
        if idx is None:
            idx = self.seqs.slots_of(members)
        belief = self._beliefs(idx)
        self._hold_to_plans(idx, belief)
        if self._head:  # the head's predictions, calibrated by the drafter (module item 8)
            return np.minimum(belief, 0.999)
        # S_j: rounds with n ≥ j, j = 1..K; each position shrunk toward the one before it
        f = position_factor(self.profile, self.expected, self.config.k_max)
        if self.weights is not None:  # what the next plan scores this one's predictions at
            self.weights.factor = f
        return scaled_capped(f, belief, 0.999)

    def _pooled(self) -> tuple[np.ndarray, np.ndarray]:
        """The pooled rounds by accepted n: those refused after n, those that accepted all n."""
        K = self.config.k_max
        return self.profile[: K + 1], self.profile[K + 1 :]

    def _beliefs(self, idx: Any) -> np.ndarray:
        """The per-position predictive rates ``(K, B)`` of each sequence's Beta belief
        (``idx``: the sequences' slots, or the sequences)."""
        if not isinstance(idx, np.ndarray):
            idx = self.seqs.slots_of(idx)
        c = self.config
        rej, full = self._pooled()
        succ = float((rej + full)[1:] @ self._ranks)  # accepted tokens, pooled
        pool = (succ + 2.0 * c.a_prior) / (succ + rej.sum() + 2.0)
        if self.weights is not None:  # the weights that predicted best (scored first)
            return self.weights.beliefs(self.seqs, idx, pool)
        # (the recent rounds shrunk toward that long-run rate: a stretch moves it, noise little)
        return point_beliefs(self.seqs.values, idx, pool, c.prior_trials, c.recent_prior, c.k_max)

    def _hold_to_plans(self, idx: np.ndarray, belief: np.ndarray) -> None:
        """Pool each sequence's rounds since the last plan (its ``counts``) into ``profile``,
        with what that plan predicted for the positions they tried into ``expected``; then
        give each sequence this plan's ``belief`` (``idx``: the sequences' slots)."""
        st = self.seqs
        K = self.config.k_max
        hold_to_plans(
            st.counts, st.rates, st.has_rates, idx, belief, self.profile, self.expected, K
        )

    def prompt_value(self) -> float:
        """Output tokens a displaced prompt token is worth (module docstring, item 5)."""
        c = self.config
        if c.prompt_value_source == "fixed":
            return c.prompt_token_value
        m = c.prompt_value_prior_tokens * self._prior_w
        if self._prefilled + m <= 0.0:
            return c.prompt_token_value
        return (self._emitted + m * c.prompt_token_value) / (self._prefilled + m)

    def serves_slo(self) -> bool:
        """Whether plans are held to the driver's SLOs (objective ``slo-goodput`` and an SLO
        told by the driver)."""
        return self.config.objective == "slo-goodput" and self.slo.active

    def ttft_urgency(self, now_s: float, batch: BatchContext) -> float:
        """Factor on a prompt token's value from the TTFT slack of the oldest waiting prompt:
        the time the backlog needs at the pass's spare budget and the recent round time, over
        the time left before that prompt misses its TTFT SLO, times 2 (1 when the backlog takes
        half the slack), capped at ``ttft_value_max``; the cap once the slack is gone. 1 when
        the SLO, the backlog or the oldest arrival is unknown."""
        c, slo = self.config, self.slo
        since = batch.waiting_since_s
        if since is None or not math.isfinite(slo.ttft_s) or batch.prefill_backlog <= 0:
            return 1.0
        slack = slo.ttft_s - (now_s - since)
        if slack <= 0.0:
            return c.ttft_value_max
        spare = max((batch.token_budget or 0) - batch.batch_size, 1)
        round_s = self._round_s
        if not round_s > 0.0:
            return 1.0
        clear_s = math.ceil(batch.prefill_backlog / spare) * round_s
        return min(c.ttft_value_max, 2.0 * clear_s / slack)

    def cost_functions(self, batch: BatchContext, now_s: float = 0.0) -> CostFunctions:
        value = self.prompt_value()
        if self.serves_slo():
            value *= self.ttft_urgency(now_s, batch)
        return self.costs.functions(
            batch.context_tokens,
            backlog=batch.prefill_backlog,
            budget=batch.token_budget,
            batch_size=batch.batch_size,
            prompt_value=value,
            block=batch.block_draft,
            # otherwise the chunk is latency the batch sits through, its share in the ratio
            sunk=self.saturated(now_s, batch),
        )

    def saturated(self, now_s: float, batch: BatchContext) -> bool:
        """Whether prompts queue: the oldest waiting one has waited more than
        ``sunk_share_rounds`` rounds (always at 0; never when the engine does not tell)."""
        wait = self.config.sunk_share_rounds
        since = batch.waiting_since_s
        return wait == 0.0 or (since is not None and now_s - since > wait * self._round_s)

    def _ranks_latency(self, now_s: float, batch: BatchContext) -> bool:
        """Whether this plan ranks its caps by mean time per token (``no_slo_rank``): the
        ``slo-goodput`` objective with no TPOT SLO to hold, and no prompt queueing."""
        c = self.config
        return (
            c.no_slo_rank == "mean-tpot"
            and c.objective == "slo-goodput"
            and not self.saturated(now_s, batch)
        )

    def plan(self, now_s: float, members: Sequence[Any], batch: BatchContext) -> list[Decision]:
        c, st = self.config, self.seqs
        self._idx = idx = st.slots_of(members)
        self._members = members = members if isinstance(members, list) else list(members)
        k_max = c.k_max if batch.max_draft is None else min(c.k_max, batch.max_draft)
        B = len(members)
        e = c.explore_every << min(self._idle, 3)  # probes thin out while idling
        # (no probe while the SLO binds: slo_quiet_probes)
        probe = bool(e) and self.rounds % e == e - 1 and not (c.slo_quiet_probes and self._binds)
        self.full_plan = probe or not self._keeps_plan(B, batch, k_max)
        fresh = self.hand.take(st, idx, members)  # the decisions that may have moved
        if not self.full_plan:
            # between re-plans: each sequence keeps its planned length (a newcomer takes the
            # cap); its own decision still bounds it (cool-down, block end, mode)
            self._since += 1
            cap = min(self.last_cap, k_max)
            x = kept_lengths(st.values, PLANNED, idx, cap)
            if self._head:  # a newcomer (no plan yet, α 1) takes the plan's survival at α 1
                p = st.values[idx, PLANNED]
                sv = np.where(p >= 0.0, st.values[idx, SURVIVAL], self._survival0)
                return self._cut_head(idx, x, sv)
            return self.hand.cut(st, idx, fresh, x)
        self._since = 0
        self._planned_b = B
        kept = None  # the lengths this round would have kept (not after a probe: its lengths
        # were an experiment, never a plan to keep)
        after_probe, self._probed = self._probed, probe
        base_k = st.base_k[idx]
        if c.replan_backoff and not (probe or after_probe or self._head) and self.last_cap >= 0:
            cap = min(self.last_cap, k_max)
            kept = np.minimum(kept_lengths(st.values, PLANNED, idx, cap), base_k)
        self._binds = False  # (until this plan's rank says otherwise)
        k = self._full_plan(members, np.minimum(base_k, k_max), k_max, batch, probe, now_s)
        if kept is not None:
            same = bool((kept == k).all())
            self._stable = min(self._stable + 1, c.replan_backoff) if same else 0
        self._planned_backlog = batch.prefill_backlog > 0
        self._planned_kmax = k_max
        if not probe:  # a probe is an experiment: it neither starts nor ends idling
            idle = self.last_cap == 0 and batch.prefill_backlog <= 0
            # (bounded: the interval and the probe cadence saturate long before 32)
            self._idle = min(self._idle + 1, 32) if idle else 0
        st.values[idx, PLANNED] = k
        if self._head:
            return self._cut_head(idx, k, st.values[idx, SURVIVAL])
        return self.hand.cut(st, idx, fresh, k)

    def _cut_head(self, idx: np.ndarray, x: np.ndarray, survival: np.ndarray) -> list[Decision]:
        """With a confidence head (item 8): each sequence's decision at length ``x`` (at most
        its own k) with its survival stop."""
        with_k = self.hand.with_k
        base = self.seqs.base[idx].tolist()
        return [with_k(d, min(d.k, xi), s) for d, xi, s in zip(base, x.tolist(), survival.tolist())]

    def _keeps_plan(self, B: int, batch: BatchContext, k_max: int) -> bool:
        """Whether this round keeps the last full plan: within its interval (items 6 and 7),
        with costs ready, no true rates to plan with, the batch size near the planned one,
        while idling no prompt token newly waiting and, while backing off, neither a prompt
        starting or ending to wait nor a new draft limit ``k_max`` from the engine."""
        c = self.config
        interval = min(
            c.replan_rounds << max(self._idle, self._stable),
            max(c.replan_rounds, c.explore_every),
        )
        return (
            self._since < interval - 1
            and self.last_cap >= 0
            and self.costs.ready
            and self._rates is None
            and abs(B - self._planned_b) <= max(4, B // 4)
            and not (self._idle and batch.prefill_backlog > 0)
            and not (
                self._stable
                and (
                    (batch.prefill_backlog > 0) != self._planned_backlog
                    or k_max != self._planned_kmax
                )
            )
        )

    def _full_plan(self, members, kcap, k_max, batch, probe, now_s=0.0) -> np.ndarray:
        c = self.config
        if self._rates is not None and len(self._rates) == len(members):
            a = np.asarray(self._rates, dtype=float)
        else:
            a = self.acceptance(members, self._idx)
        self._rates = None
        if not self.costs.ready:
            cap = c.k_start if self.rounds % 2 == 0 else 1
            k = np.minimum(kcap, min(cap, k_max))
        else:
            alpha = self.seqs.values[self._idx, ALPHA]
            # search near the last cap (±3): a cap moves by at most that between full plans;
            # every cap when none yet, or when the engine's limit fell below that window
            lo = self.last_cap - 3
            near = None if self.last_cap < 0 or lo > k_max else (lo, self.last_cap + 3)
            costs = self.cost_functions(batch, now_s)
            p = plan_round_lengths(a, kcap, costs, k_max, alpha, cap_range=near)
            if self.serves_slo() and math.isfinite(self.slo.tpot_s):
                h, spread, life = c.slo_horizon_rounds, c.slo_spread, 0.0
                # the wide view while prompts queue
                queued = prompts_queued(c.slo_congested_wait, self.slo.ttft_s, now_s, batch)
                if queued:
                    h, spread = 0.0, c.slo_congested_spread
                elif c.slo_life_horizon > 0.0:  # tokens: mean outputs per sequence
                    life = c.slo_life_horizon * self._life_tokens()
                v = self.seqs.values
                stretch0, extra0 = stretch, extra_s = self._prefill_terms(batch, p)
                if self.tpot_cal is not None and not queued:  # the model's recent bias
                    f = self.tpot_cal.factor
                    stretch, extra_s = stretch * f, extra_s * f
                tpot = self.slo.tpot_s * c.slo_margin
                lost = v[self._idx, TTFT] > self.slo.ttft_s
                if c.slo_floor:
                    p = slo_floor_plan(p, a, kcap, costs, tpot, stretch, extra_s, lost, alpha)
                history = h > 0 or life > 0
                d, n = v[self._idx, DECODE_S], v[self._idx, TOKENS]
                hd = 0.0 if queued else binding_hurdle(c.slo_rank_hurdle, c.slo_hurdle_from, self.slo.tpot_s, d, n)  # fmt: skip
                self._binds = hd > 0.0
                row = slo_goodput_row(
                    p,
                    tpot,
                    d if history else None,
                    n if history else None,
                    h,
                    spread,
                    lost,
                    stretch,
                    c.slo_rank,
                    extra_s,
                    life,
                    hd,
                )
                if self.tpot_cal is not None:
                    self.tpot_cal.planned_row(p, row, stretch0, extra0)
            elif self._ranks_latency(now_s, batch):
                row = mean_tpot_row(p)
            else:
                row = int(np.argmax(p.goodput))
            self.last_goodput = float(p.goodput[row])
            k = p.k_by_cap[row]
            cap = int(k.max()) if len(k) else 0
            if probe:  # one round at the neighbouring cap; the next round re-plans
                up = (self.rounds // c.explore_every) % 2 == 0 or cap == 0  # no cap −1
                alt = cap + 1 if up else cap - 1
                rows = np.flatnonzero(p.caps == alt)
                if len(rows):
                    k = p.k_by_cap[rows[0]]
                if alt > 0 and not k.any():  # every sequence stopped below the probe's cap:
                    k = np.minimum(kcap, 1)  # it would measure nothing, so each drafts one
                self._since = 1 << 30  # past any interval: the next round re-plans
            if self._head:  # every sequence at the cap, each cut by its break-even survival
                # (rounded to 1/1000: the decisions are cached by it; the last: at α = 1)
                thr = break_even(p, row, costs, np.append(alpha, 1.0)).round(3)
                self.seqs.values[self._idx, SURVIVAL] = thr[:-1]
                self._survival0 = float(thr[-1])
                k = np.minimum(kcap, int(k.max()) if len(k) else 0)
        self.last_cap = int(k.max()) if len(k) else 0
        return k

    def _prefill_terms(self, batch: BatchContext, plan: Any) -> tuple[Any, Any]:
        """``(stretch, extra_s)`` of :func:`~control.goodput.slo_goodput_row` by ``slo_prefill``
        (with ``"backlog"`` one per sequence while prompts wait: :mod:`control.prefill_backlog`;
        this round's chunk priced by the verify fit, the drafter's own prefill of it left out:
        counted, the code knee's attainment fell on seeds 11-13)."""
        c = self.config
        if c.slo_prefill == "additive":
            return 1.0, self._chunk_s
        s = 1.0 / (1.0 - self.prefill_share())
        if c.slo_prefill != "backlog" or batch.prefill_backlog <= 0:  # (most plans: no backlog)
            return s, 0.0
        n = float(batch.batch_size + plan.k.sum())
        row = plan.expected[int(np.argmax(plan.goodput))]
        share = backlog_share(
            batch.prefill_backlog, batch.token_budget, n, self._life_tokens(), row
        )
        if share is None:
            return s, 0.0
        v = self.costs.verify_s(np.array([n, n + share[1]]), batch.context_tokens)
        return predicted_terms(s, share[0], max(float(v[1] - v[0]), 0.0))

    def _life_tokens(self) -> float:
        """A sequence's mean output: the recent emitted tokens per sequence new to the batch
        (0 before any)."""
        return self._emitted / self._arrivals if self._arrivals > 0.0 else 0.0

    def prefill_share(self) -> float:
        """The share of the replica's recent time its prompt chunks took (the verify pass's
        seconds in proportion to its prompt tokens; the drafter's own prefill not counted),
        at most ``PREFILL_SHARE_MAX``: what stretches a sequence's wait beyond the planned
        rounds (:func:`control.goodput.slo_goodput_row`)."""
        if not self._pass_s > 0.0:
            return 0.0
        return min(self._chunk_s / self._pass_s, PREFILL_SHARE_MAX)

    def observe_members(self, members, now_s, drafted, accepted, confidences, draft_s, verify_s, context, lossy, emitted, sentence_ends, batch_tokens, batch_context_tokens) -> None:  # fmt: skip
        """The round's observations of the members this round planned: their evidence
        recorded into the planner's arrays at once (:meth:`SeqArrays.record`), then what each
        does with a round besides (its window, retry cap and blocks), exactly as if each had
        observed its own; other members, a batch under ``RECORD_AT_ONCE`` or one holding a
        sequence that also keeps a planner of its own (``decide``), one by one."""
        listed = members if isinstance(members, list) else list(members)
        if (
            len(listed) < RECORD_AT_ONCE
            or listed != self._members  # identity, in order
            or any_set(self.seqs.values, self._idx, SOLO)
        ):
            super().observe_members(
                members, now_s, drafted, accepted, confidences, draft_s, verify_s, context,
                lossy, emitted, sentence_ends, batch_tokens, batch_context_tokens,
            )  # fmt: skip
            return
        conf = None  # each member's evidence: its outcomes, or what its confidences predicted
        if confidences is not None and any_set(v := self.seqs.values, self._idx, READS):
            conf = [c if r else () for r, c in zip(v[self._idx, READS].tolist(), confidences)]
        events = self.seqs.record(
            self._idx, now_s, drafted, accepted, emitted, draft_s, verify_s, context, conf,
            lossy, sentence_ends,
        )  # fmt: skip
        for i in np.flatnonzero(events).tolist():
            listed[i].after_round(int(events[i]), emitted[i], sentence_ends[i])

    def observe_round(self, stats: RoundStats) -> None:
        self.rounds += 1
        dt = stats.end_s - stats.start_s
        self._round_s = dt if self.rounds == 1 else self._round_s + 0.05 * (dt - self._round_s)
        pre = stats.prefill_tokens
        chunk = stats.verify_s * pre / (stats.verify_tokens + pre) if pre > 0 else 0.0
        if self.rounds == 1:
            self._chunk_s, self._pass_s = chunk, dt
        else:
            self._chunk_s += PREFILL_SHARE_RATE * (chunk - self._chunk_s)
            self._pass_s += PREFILL_SHARE_RATE * (dt - self._pass_s)
        self._emitted = self._emitted * PROMPT_VALUE_KEEP + stats.emitted
        self._prefilled = self._prefilled * PROMPT_VALUE_KEEP + stats.prefill_tokens
        self._prior_w *= PROMPT_VALUE_KEEP
        new = self.seqs.adopted - self._adopted
        self._adopted = self.seqs.adopted
        self._arrivals = self._arrivals * PROMPT_VALUE_KEEP + new
        self.costs.observe(stats)
        if self.tpot_cal is not None:
            self.tpot_cal.observe(dt, stats.batch_size, stats.emitted)
        if self.weights is not None and self.rounds % SCORE_HALF_LIFE == 0:
            self.weights.halve()
        if self.rounds % self.config.memory_rounds == 0:
            self.profile *= 0.5
            self.expected *= 0.5

    def state(self) -> dict[str, Any]:
        self.costs.fold()
        th = self.costs.verify.theta
        return {
            "rounds": self.rounds,
            "cap": self.last_cap,
            "goodput": self.last_goodput,
            "verify_intercept_s": float(th[0]),
            "verify_per_token_s": float(th[1]),
            "overhead_s": self.costs.overhead_s,
            "prompt_value": self.prompt_value(),
            "prefill_share": self.prefill_share(),
        }
