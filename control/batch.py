"""The round-level contract between a batched engine (sim or real) and a controller's planner.

A batched round serves several sequences at once: the draft phase lasts as long as the longest
draft of the batch, and ONE target pass verifies Σ(k_i + 1) tokens. Draft length is therefore
a round-level decision. Both engines drive it the same way, once per round:

    decisions = plan_round(planner, members, now_s, BatchContext(...))   # before drafting
    ... draft, verify, commit ...
    planner.observe_members(members, ...)   # each member's observation (no planner: each
                                            # member's own observe)
    planner.observe_round(RoundStats(...))                              # after the round

``members`` are the per-sequence controllers of the running sequences, in batch order. A
controller class that plans per round returns a planner from ``make_planner(config)``; for every
other controller ``plan_round`` with ``planner=None`` is simply ``[c.decide(now_s) ...]``, so
existing controllers work unchanged. Pure and sans-IO: times are arguments, never read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from control.types import Decision


@dataclass(frozen=True, slots=True)
class Slo:
    """The service-level objectives a driver serves, in seconds: time to first token, and each
    request's own time per output token after the first. ``inf`` = no objective. Drivers hand
    it once (``RoundPlanner.set_slo``, ``Controller.set_slo``) before the first round."""

    ttft_s: float = math.inf
    tpot_s: float = math.inf

    @property
    def active(self) -> bool:
        return math.isfinite(self.ttft_s) or math.isfinite(self.tpot_s)


def told_slo(make_ctrl: Any, slo: Slo) -> Any:
    """``make_ctrl`` whose controllers are told ``slo`` (``set_slo``) when built: how both
    engines hand their SLOs to per-request controllers. A duck-typed controller without
    ``set_slo`` is built as is."""

    def make() -> Any:
        c = make_ctrl()
        told = getattr(c, "set_slo", None)
        if told is not None:
            told(slo)
        return c

    return make


@dataclass(frozen=True, slots=True)
class BatchContext:
    """The round's batch as the engine knows it before drafting.

    ``batch_size``: running sequences in this round. ``context_tokens``: Σ of their context
    lengths (prompt + emitted so far). ``max_draft``: the engine's cap on any k this round
    (its static cache or its configuration), ``None`` when it has none. Chunked prefill:
    ``token_budget`` is the most tokens one forward may carry (drafts first, then prompt
    chunks), ``prefill_backlog`` the prompt tokens waiting for it; a drafted token then
    displaces a prompt token (``None`` / 0: prefill does not share the pass).
    ``waiting_since_s``: arrival time of the oldest request whose prompt is not yet fully
    prefilled (its TTFT clock), ``None`` when none waits or the engine does not tell.
    ``block_draft``: the drafter proposes a whole block in one forward (a round's draft
    phase is one step whatever the lengths kept).
    """

    batch_size: int
    context_tokens: int
    max_draft: int | None = None
    prefill_backlog: int = 0
    token_budget: int | None = None
    waiting_since_s: float | None = None
    block_draft: bool = False


@dataclass(frozen=True, slots=True)
class RoundStats:
    """What one batched round cost: the evidence of a planner's online cost model.

    ``drafting``: sequences that drafted at least one token. ``draft_steps``: drafter forward
    steps of the round (the longest draft; 0 when nobody drafted). ``verify_tokens``: tokens in
    the target's verify pass, Σ(drafted_i + 1). ``accepted`` / ``emitted``: Σ over the batch.
    ``draft_s`` / ``verify_s``: measured (real) or modelled (sim) seconds of the two phases;
    ``end_s - start_s`` also holds the round's fixed overheads. ``prefill_tokens``: prompt
    tokens that shared the round's forward passes (chunked prefill: they are in ``verify_s`` and,
    for the drafter's own prefill, in ``draft_s``); 0 when the engine prefills separately.
    ``catchup_tokens``: tokens the drafter fed in ``draft_s`` beyond one per drafting row, i.e.
    those it missed while its row drafted nothing (k = 0 rounds); they are in ``draft_s`` only.
    """

    start_s: float
    end_s: float
    batch_size: int
    drafting: int
    draft_steps: int
    verify_tokens: int
    context_tokens: int
    draft_s: float
    verify_s: float
    accepted: int = 0
    emitted: int = 0
    prefill_tokens: int = 0
    catchup_tokens: int = 0

    @classmethod
    def of_observation(cls, obs: Any) -> RoundStats:
        """The round a batch-1 ``Observation`` (or ``RoundRecord``) describes: one sequence,
        ending at ``now_s`` after its draft and verify phases."""
        return cls.of_rows([obs])

    @classmethod
    def of_sequence(
        cls,
        now_s: float,
        drafted: int,
        accepted: int,
        emitted: int,
        draft_s: float,
        verify_s: float,
        context_tokens: int,
        batch_size: int = 1,
        batch_tokens: int = 0,
        batch_context_tokens: int = 0,
    ) -> RoundStats:
        """The round one sequence observed (its ``observe_values`` fields), for a planner of
        its own: the batch's size, verified tokens and context as the driver gave them, else
        this sequence's alone."""
        return cls(
            now_s - draft_s - verify_s,
            now_s,
            batch_size,
            1 if drafted else 0,
            drafted,
            batch_tokens or drafted + 1,
            batch_context_tokens or context_tokens,
            draft_s,
            verify_s,
            accepted,
            emitted,
        )

    @classmethod
    def of_rows(cls, rows: Sequence[Any]) -> RoundStats:
        """The round the rows' ``RoundRecord``s (or ``Observation``s) of one batched round
        describe: they share its end ``now_s`` and its draft and verify phases."""
        r0, drafted = rows[0], [r.drafted for r in rows]
        return cls(
            r0.now_s - r0.draft_s - r0.verify_s,
            r0.now_s,
            len(rows),
            sum(1 for d in drafted if d),
            max(drafted),
            sum(drafted) + len(rows),
            sum(r.context_tokens for r in rows),
            r0.draft_s,
            r0.verify_s,
            sum(r.accepted for r in rows),
            sum(r.emitted for r in rows),
        )


class RoundPlanner:
    """Decides one round for a whole batch; subclasses override ``plan``/``observe_round``."""

    #: the driver's SLOs (``set_slo``); none until told
    slo: Slo = Slo()

    def set_slo(self, slo: Slo) -> None:
        """Told by the driver before the first round: the SLOs its requests are served at."""
        self.slo = slo

    def plan(self, now_s: float, members: Sequence[Any], batch: BatchContext) -> list[Decision]:
        return [c.decide(now_s) for c in members]

    def observe_round(self, stats: RoundStats) -> None:
        """Told after every round (default: nothing to learn)."""

    def observe_members(
        self,
        members: Sequence[Any],
        now_s: float,
        drafted: Sequence[int],
        accepted: Sequence[int],
        confidences: Sequence[tuple[float, ...]] | None,
        draft_s: float,
        verify_s: float,
        context: Sequence[int],
        lossy: Sequence[int],
        emitted: Sequence[int],
        sentence_ends: Sequence[tuple[int, ...]],
        batch_tokens: int,
        batch_context_tokens: int,
    ) -> None:
        """Each member's observation of the round, in batch order (one entry per member in
        each sequence; ``confidences`` None when no member reads them): by default each
        member's ``observe_values`` with its :class:`~control.types.Observation`'s fields; a
        planner that keeps its members' evidence in arrays records the batch at once."""
        size = len(members)
        conf = confidences if confidences is not None else [()] * size
        for m, d, n, cf, cx, lo, e, se in zip(
            members, drafted, accepted, conf, context, lossy, emitted, sentence_ends
        ):
            m.observe_values(
                now_s, d, n, cf, draft_s, verify_s, cx, lo, e, se, size, batch_tokens,
                batch_context_tokens,
            )  # fmt: skip

    def reset(self) -> None:
        """Back to the initial state (default: stateless)."""

    def state(self) -> dict[str, Any]:
        return {}


def plan_round(
    planner: RoundPlanner | None, members: Sequence[Any], now_s: float, batch: BatchContext
) -> list[Decision]:
    """The round's decisions: the planner's, or each member's own ``decide`` when none."""
    if planner is None:
        return [c.decide(now_s) for c in members]
    return planner.plan(now_s, members, batch)
