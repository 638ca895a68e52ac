"""Prompt chunks in a sequence's predicted TPOT while prompts wait beyond a round's pass.

Under chunked prefill a round's forward carries the drafts first, then up to the token
budget of waiting prompt tokens. Two regimes of what the chunks cost a decoding sequence:

- **Prompts arrive at their own rate** (nothing waits beyond the pass): a longer round carries
  more of them, so the chunks stretch every planned second by ``1 / (1 − ρ)``, ρ the replica's
  recent prefill share (``slo_prefill = "stretch"``, :mod:`control.dspark_planner`).
- **Prompts wait beyond the pass** (a backlog, e.g. one long prompt prefilled over several
  rounds): every round fills the pass with a chunk until the backlog is cleared, whatever the
  drafts, so each round a sequence lives through then costs it the chunk's seconds on top of
  its own, a cost longer drafts amortise (``slo_prefill = "backlog"``).

A sequence sits through the backlog for the rounds it needs at the spare budget, but only
within its own life: the share ``f = min(1, rounds the backlog fills / rounds the sequence
lives)`` of its life pays the chunk a round, the rest is stretched. A short request behind a
long prompt (the Azure code trace: median 13 output tokens behind prompts of up to 7,437
tokens, several passes each) pays the chunk at nearly every round it lives; a long one (the
conversation trace: mean 211 output tokens) mostly the stretch, whatever the backlog.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from control.batch import BatchContext


def backlog_share(
    backlog: int,
    budget: int | None,
    verified: float,
    life_tokens: float,
    tokens_per_round: np.ndarray,
) -> tuple[np.ndarray, float] | None:
    """``(f, chunk)``: per sequence, the share ``f`` of its life the waiting prompts fill the
    pass, and this round's chunk in prompt tokens; None when nothing waits, the engine reports
    no budget, the drafts fill the pass, or no life is known (``life_tokens`` ≤ 0).

    ``backlog``: prompt tokens waiting; ``budget``: tokens a forward may carry; ``verified``:
    the round's verified tokens ``Σ(k_i + 1)``; ``life_tokens``: a sequence's expected output;
    ``tokens_per_round``: each sequence's expected tokens a round (its life in rounds is
    ``life_tokens`` over these, at least 1)."""
    spare = (budget or 0) - verified
    if backlog <= 0 or spare <= 0 or not life_tokens > 0.0:
        return None
    life = np.maximum(life_tokens / np.maximum(tokens_per_round, 1.0), 1.0)
    return np.minimum(1.0, (backlog / spare) / life), min(float(backlog), spare)


def predicted_terms(stretch: float, f: np.ndarray, chunk_s: float) -> tuple[np.ndarray, np.ndarray]:
    """``(stretch_i, extra_i)`` of :func:`control.goodput.slo_goodput_row` for shares ``f``:
    ``f · (T + chunk_s) + (1 − f) · stretch · T`` is ``T · stretch_i + extra_i``."""
    return stretch - f * (stretch - 1.0), f * chunk_s


def prompts_queued(wait: float, ttft_s: float, now_s: float, batch: BatchContext) -> bool:
    """Whether the oldest waiting prompt of ``batch`` has waited more than
    ``wait`` × the TTFT SLO ``ttft_s`` at ``now_s``: past the knee, where prompts queue (never
    at ``wait`` 0, nor when the engine does not tell when it arrived)."""
    since = batch.waiting_since_s
    return wait > 0.0 and since is not None and now_s - since > wait * ttft_s
