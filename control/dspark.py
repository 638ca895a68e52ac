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
from typing import Any

from control.anomaly import AnomalyGuard
from control.base import ValuesObserver
from control.batch import BatchContext, RoundStats
from control.blocks import BlockPlanner
from control.dspark_config import DSparkConfig
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
from control.types import Decision, Mode
from control.window import RoundWindow


def k_of_alpha(alpha: float, k_ref: float, k_min: int, k_max: int) -> int:
    """``clip(round(α · k_ref), k_min, k_max)`` with round half up."""
    k = int(alpha * k_ref + 0.5)
    return k_min if k < k_min else k_max if k > k_max else k


class DSparkController(ValuesObserver):
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
        # window.row_of, one line (this function is the hot path; the formatter would spread it)
        self._push((n, 1 if n < drafted else 0, drafted, e, draft_s, draft_s + verify_s, lossy_accepts, now_s))  # fmt: skip
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
