"""The ``goodput`` policy of the ``dspark`` controller (the default; :mod:`control.dspark`
describes it): a sequence of a batch that a round planner (:mod:`control.dspark_planner`) plans
each round. Besides what both policies keep, the sequence holds its acceptance evidence in its
rows of the planner's :class:`~control.seqstate.SeqArrays`, and its α trims the time penalty of
speculation to hold the TPOT SLO (1 = pure goodput, its ceiling)."""

from __future__ import annotations

import math
from typing import Any

from control.batch import BatchContext, RoundStats
from control.dspark_base import DSparkBaseController
from control.dspark_config import GoodputPolicyConfig
from control.dspark_planner import DSparkPlanner
from control.seqrounds import (
    CHANGED,
    COOLDOWN,
    COOLDOWNS,
    FAILS,
    MAY_CLOSE,
    ROUNDS,
    SlotBlocks,
    SlotWindow,
    bind_constants,
    observe_one,
    row_property,
)
from control.seqstate import (
    ALPHA,
    CONTEXT,
    DECODE_S,
    FIRST_S,
    PLANNED,
    READS,
    RECENT_N,
    RECENT_REJ,
    SOLO,
    SUM_N,
    SUM_REJ,
    TOKENS,
    TTFT,
    SeqArrays,
    expected_outcome,
)
from control.types import Decision


class GoodputPolicyController(DSparkBaseController):
    # the store and slot a planner reads every round: held in the object itself (a dict
    # lookup less, and one memory line a member, where a batch of hundreds is listed a round)
    __slots__ = ("_store", "_slot")
    policy = "goodput"
    records_evidence = True
    config: GoodputPolicyConfig

    def __init__(self, config: GoodputPolicyConfig | None = None) -> None:
        c = config or GoodputPolicyConfig()
        self._decay = 1.0 - 1.0 / c.memory_rounds  # forgetting of the â counts
        self._fast = 1.0 - 1.0 / c.recent_rounds  # forgetting of the recent counts
        # the drivers hand confidences only to controllers that read them
        self.reads_confidences = c.acceptance_source == "confidence"
        # α is the time-penalty weight of speculation, 1 = pure goodput (its ceiling)
        super().__init__(c, 1.0, 1.0)
        self._retry = c.goodput_cooldown

    def first_token(self, ttft_s: float) -> None:
        """The request's time to first token (told by the driver): a request past its TTFT
        SLO no longer counts in the planner's SLO share (its tokens still count as output)."""
        self.ttft_s = ttft_s

    def set_slo(self, slo: Any) -> None:
        """The driver's SLOs: the TPOT trim holds the driver's TPOT SLO (``slo_tpot_s`` when it
        gives none), and a planner of this sequence's own plans against them."""
        super().set_slo(slo)
        if self._solo is not None:
            self._solo.set_slo(slo)

    @classmethod
    def make_planner(cls, config: GoodputPolicyConfig) -> Any:
        return DSparkPlanner(config)

    # --- the rows a round planner reads (control.seqstate) --
    def _bind(self, store: SeqArrays, slot: int) -> None:
        """Take ``slot`` of ``store``: its constants written (forgetting factors, flags, the
        window's, retry cap's and blocks' sizes: :mod:`control.seqrounds`), then its views."""
        store.decay[slot], store.fast[slot] = self._decay, self._fast
        store.widen(self.config.window_rounds)
        self._views(store, slot)
        self._row[SOLO] = 0.0 if getattr(self, "_solo", None) is None else 1.0
        self._row[READS] = 1.0 if self.reads_confidences else 0.0
        bind_constants(self._ist, self.config, self.config.goodput_cooldown)

    def _views(self, store: SeqArrays, slot: int) -> None:
        """Views onto ``slot`` of ``store``, whose rows already hold this sequence (moved or
        reallocated there by the store)."""
        self._store, self._slot = store, slot
        # memoryviews: element access in Python floats, ~2x numpy's scalar indexing
        self._row: Any = memoryview(store.values[slot])  # format "d": floats in and out
        self._cnt: Any = memoryview(store.counts[slot])
        self._ist: Any = memoryview(store.ints[slot])
        self._win: Any = SlotWindow(store, slot, self._ist)
        self._blocks: Any = SlotBlocks(store, slot, self._ist)

    _VIEWS = ("_row", "_cnt", "_ist", "_win", "_blocks")

    def __getstate__(self) -> dict[str, Any]:  # memoryviews do not pickle: rebound on load
        state = {k: v for k, v in self.__dict__.items() if k not in self._VIEWS}
        return {**state, "_store": self._store, "_slot": self._slot}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        store, slot = state.pop("_store"), state.pop("_slot")
        self.__dict__.update(state)
        self._bind(store, slot)

    sum_n = property(lambda self: float(self._row[SUM_N]))
    sum_rej = property(lambda self: float(self._row[SUM_REJ]))
    recent_n = property(lambda self: float(self._row[RECENT_N]))
    recent_rej = property(lambda self: float(self._row[RECENT_REJ]))
    decode_s = property(lambda self: float(self._row[DECODE_S]))
    tokens = property(lambda self: int(self._row[TOKENS]))
    rounds = row_property("_ist", ROUNDS, "rounds observed")
    fails = row_property("_ist", FAILS, "fruitless drafting rounds in a row")
    cooldown = row_property("_ist", COOLDOWN, "rounds left of a cool-down")
    cooldowns = row_property("_ist", COOLDOWNS, "cool-downs so far")
    alpha = row_property("_row", ALPHA, "α, the TPOT trim of the time penalty (1 = pure goodput)")
    ttft_s = row_property("_row", TTFT, "the request's time to first token (NaN until told)")

    @property
    def first_s(self) -> float:
        """Start of the first round observed (≈ the first token's time); -1 before it."""
        return float(self._row[FIRST_S])

    @property
    def context_tokens(self) -> int:
        """The sequence's context after the last round observed (prompt + emitted)."""
        return int(self._row[CONTEXT])

    @property
    def planned_k(self) -> int:
        """This sequence's length in the planner's last full plan (-1: none)."""
        return int(self._row[PLANNED])

    @property
    def counts(self) -> list[int]:
        """This sequence's rounds since the planner last read them: index n = rounds that
        accepted n and then refused one, k_max + 1 + n = rounds that accepted all n."""
        return [int(x) for x in self._cnt.tolist()]

    @property
    def plan_rates(self) -> Any:
        """The per-position rates the planner's last full plan predicted for this sequence
        (before its position factors; None before any), what ``counts`` is held to."""
        st, i = self._store, self._slot
        return st.rates[i].copy() if st.has_rates[i] else None

    # --- protocol --
    def reset(self) -> None:
        c = self.config
        # the state a round planner reads lives in its rows of a SeqArrays (control.seqstate):
        # sum_n / sum_rej (accepted tokens and rounds that ended in a rejection, forgotten at
        # 1/memory_rounds per round), recent_n / recent_rej (the same, forgotten at
        # 1/recent_rounds), decode_s (seconds from the first round's start to the end of the
        # last round observed), tokens (emitted by the rounds observed), α, planned_k, counts,
        # plan_rates; a sequence no planner drives has a store of its own
        store = getattr(self, "_store", None)
        if store is None:
            SeqArrays.single(c.k_max, c.window_rounds).new_slot(self)
        else:
            store.new_slot(self, self._slot)
        self.ttft_s = math.nan  # the request's time to first token, when the driver tells it
        # own planner when no round planner drives this sequence; reset() keeps it — the costs
        # it learned are the hardware's, not the sequence's (a new controller forgets)
        self._solo = getattr(self, "_solo", None)
        self._full = c.k_max + 1
        super().reset()

    def decide(self, now_s: float, batch=None) -> Decision:
        """With no round planner driving it (a batch-1 engine, a trace replay): a plan for a
        batch of this one sequence, its costs learned from its own rounds."""
        if self._solo is None:
            self._solo = DSparkPlanner(self.config)
            self._row[SOLO] = 1.0  # a batch planner observes this sequence on its own
            if self.slo is not None:
                self._solo.set_slo(self.slo)
        ctx = BatchContext(1, self.context_tokens) if batch is None else batch
        return self._solo.plan(now_s, (self,), ctx)[0]

    def _record(
        self,
        now_s,
        drafted,
        n,
        confidences,
        draft_s,
        verify_s,
        context_tokens,
        e,
        batch_size,
        batch_tokens,
        batch_context_tokens,
    ) -> None:
        # hot path: the round's evidence goes in place into this sequence's rows
        # (control.seqstate; SeqArrays.record does the same for a batch at once); the base's
        # observe_values then does what both policies do
        r = self._row
        if self.reads_confidences and confidences:  # what the drafter's confidences predicted
            got, rej = expected_outcome(confidences)
        else:
            got, rej = n, (1 if n < drafted else 0)
        f = self._decay
        r[0] = r[0] * f + got  # SUM_N
        r[1] = r[1] * f + rej  # SUM_REJ
        f = self._fast
        r[2] = r[2] * f + got  # RECENT_N
        r[3] = r[3] * f + rej  # RECENT_REJ
        r[9] = context_tokens + e  # CONTEXT
        if r[8] < 0.0:  # FIRST_S
            r[8] = now_s - draft_s - verify_s
        r[4] = now_s - r[8]  # DECODE_S
        r[5] += e  # TOKENS
        if drafted:  # per-position evidence, pooled by the planner at its next full plan
            self._cnt[n if n < drafted else self._full + n] += 1.0
        if self._solo is not None:  # no round planner: the round goes to its own planner
            self._solo.observe_round(
                RoundStats.of_sequence(
                    now_s,
                    drafted,
                    n,
                    e,
                    draft_s,
                    verify_s,
                    context_tokens,
                    batch_size,
                    batch_tokens,
                    batch_context_tokens,
                )
            )

    def take_decision(self) -> Decision:
        """The base's; a one-round (block-end) decision marks the slot's hand-out stale, so
        the next round hands the cached decision again (``DSparkPlanner.plan``)."""
        if self._pending is not None:
            self._store.dirty[self._slot] = True
        return super().take_decision()

    def _rebuild(self, block_end: bool) -> None:
        super()._rebuild(block_end)
        self._store.dirty[self._slot] = True  # the slot's last hand-out may differ now

    def _observed(self, now_s, drafted, n, draft_s, round_s, lossy_accepts, e, sentence_ends):
        """The base's ``_observed`` on the slot's arrays (:func:`control.seqrounds.observe_rounds`
        for this one sequence), then :meth:`after_round`."""
        ev = observe_one(self._store, self._slot, now_s, drafted, n, draft_s, round_s, lossy_accepts, e, sentence_ends)  # fmt: skip
        if ev:
            self.after_round(ev, e, sentence_ends)

    def after_round(self, event: int, e: int, sentence_ends) -> None:
        """What a round whose event (``control.seqrounds``) is not 0 leaves to Python: the
        block it may close (then the block end's updates), else a changed decision."""
        if event & MAY_CLOSE and self._blocks._close(e, sentence_ends):
            self._block_end()
        elif event & CHANGED:
            self._rebuild(False)

    # --- policy hooks --
    def _initial_k(self) -> int:
        return self.config.k_max  # the sequence's cap; the plan chooses each round's length

    def _alpha_error(self, a_hat: float | None) -> float | None:
        """α trims the time penalty to hold the TPOT SLO: ``1 − latency_ratio``."""
        return None if self.latency_ratio is None else 1.0 - self.latency_ratio

    def _a_seq(self) -> float | None:
        return self.sum_n / (self.sum_n + self.sum_rej) if self.sum_n + self.sum_rej > 0 else None
