"""Acceptance predicted from a block drafter's confidence head on new prompts (the block
drafter's case of :mod:`real.predicted`).

A block drafter's proposal from output position t is one forward over the committed context: its
slot j is not the drafter's first proposal from t + j - 1, so the run length from t is not a
chain of first-proposal bits. Its evidence is the head's prediction per slot instead:

1. Evidence (:func:`block_rollout`): the drafter's greedy continuation of each prompt (the
   target's teacher-forced states of each committed chunk handed over, :func:`drafter_rollout`;
   the target never decodes), then from every output position t the head's confidences
   ``c_{t,1..B}`` of the block it proposes over that text.
2. Calibration (:func:`fit_block_calibration`, on the calibration prompts only, where the
   target's position traces hold the head's confidences on the target's own text and the run
   length from every t): P(slot j accepted | slots < j accepted, c_{t,j}) by isotonic regression
   of slot j's confidence over the decided slots j (slots 1..run + 1 of each position; the fit
   pooled over slots where a slot has fewer than ``MIN_SLOT_PAIRS``), and the expected
   calibration error of the head per block position. No rollout -> text map: the one learned
   on the calibration prompts (where the drafter's text and the target's part most) shifted the
   held-out prompts' confidences further from their text's on ``configs/validate.toml``.
3. Prediction (:func:`synthetic_block_positions`): per new prompt and draw, at every t the slots
   accepted one by one with the calibrated probabilities of their confidences until the
   first rejection: a position trace the simulator's ``replay`` acceptance model reads.
"""

from __future__ import annotations

import numpy as np
import torch

from control.errors import DSparkError
from control.types import PositionRecord
from real.block_recalibration import shipped_calibration, verified_slots
from real.block_train import ece as expected_calibration_error
from real.predicted import _GREEDY, PredictConfig, _interp, _logit, drafter_rollout, pav

#: decided slots a block position needs for its own isotonic fit (else the pooled one)
MIN_SLOT_PAIRS = 20


def block_rollout(
    engine, prompt_ids, n_tokens: int, n_positions: int
) -> tuple[list[int], list[list[float]]]:
    """:func:`_block_rollout` with the drafter's head as shipped, no online recalibration
    (a prediction is checked against the runs a recalibration would learn from)."""
    with shipped_calibration(engine.drafter):
        return _block_rollout(engine, prompt_ids, n_tokens, n_positions)


@torch.inference_mode()
def _block_rollout(
    engine, prompt_ids, n_tokens: int, n_positions: int
) -> tuple[list[int], list[list[float]]]:
    """The drafter's rollout of ``n_tokens`` tokens and, from each of its first ``n_positions``
    output positions, the head's confidences of the whole block proposed there (module doc, 1)."""
    d = engine.drafter
    B = int(getattr(d, "block_size", 0) or 0)
    if not B:
        raise DSparkError("a block rollout needs a block drafter")
    if n_tokens < n_positions + B:
        raise DSparkError(f"rollout of {n_tokens} tokens; {n_positions + B} needed")
    toks, _ = drafter_rollout(engine, prompt_ids, n_tokens)
    seq, P = engine.seq, len(prompt_ids)
    blocks = []
    for t in range(n_positions):
        L = P + t
        kept = seq[0, L : L + B].clone()
        count, confs, _ = d.propose(seq, L, B, 0.0, _GREEDY, None)
        seq[0, L : L + B] = kept  # the proposal is written over the rollout: put it back
        blocks.append([float(x) for x in confs[:count]])
    return toks, blocks


def _slot_pairs(positions: list[list[PositionRecord]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(confidence, accepted, slot index) of every decided slot of the recorded traces: slots
    1..run + 1 of each position (the first rejection included, none after it)."""
    c: list[float] = []
    a: list[float] = []
    j: list[int] = []
    for recs in positions:
        for r in recs:
            cs, ys = verified_slots(list(r.confidences), len(r.confidences), r.run_length)
            c += cs
            a += ys
            j += range(len(cs))
    if not c:
        raise DSparkError("calibration position traces hold no confidence-head prediction")
    return np.asarray(c, dtype=float), np.asarray(a, dtype=float), np.asarray(j)


def _isotonic(conf: np.ndarray, acc: np.ndarray) -> dict:
    """Isotonic fit of acceptance on the confidence's logit, tied confidences pooled first (one
    knot each, weighted by its pairs)."""
    ux, inv = np.unique(_logit(conf), return_inverse=True)
    n = np.bincount(inv).astype(float)
    kx, ky = pav(ux, np.bincount(inv, weights=acc) / n, n)
    return {"logit": kx.tolist(), "p": ky.tolist()}


def head_ece(positions: list[list[PositionRecord]]) -> dict:
    """The head's expected calibration error on recorded traces, pooled and per block
    position (its confidence of slot j against slot j's acceptance given slots < j were)."""
    c, a, j = _slot_pairs(positions)
    return {
        "head_ece": expected_calibration_error(c, a),
        "head_ece_by_position": [
            expected_calibration_error(c[j == s], a[j == s]) for s in range(int(j.max()) + 1)
        ],
        "decided_slots": len(c),
    }


def fit_block_calibration(
    positions: list[list[PositionRecord]], rollout_blocks=None, cfg: PredictConfig | None = None
) -> dict:
    """The calibration (module doc, 2) from the calibration prompts' position traces (the
    rollouts and the config are not read: no map). A plain dict (JSON-able)."""
    c, a, j = _slot_pairs(positions)
    pooled = _isotonic(c, a)
    by_slot = []
    for s in range(int(j.max()) + 1):
        m = j == s
        if m.sum() < MIN_SLOT_PAIRS:
            by_slot.append(pooled)
            continue
        by_slot.append(_isotonic(c[m], a[m]))
    return {
        "kind": "block",
        "a_rate": float(a[j == 0].mean()),
        "pooled": pooled,
        "by_slot": by_slot,
        **head_ece(positions),
    }


def _slot_knots(cal: dict) -> tuple[list, tuple]:
    """The calibration's per-slot and pooled isotonic fits as ``_interp`` knot arrays."""

    def knots(g: dict) -> tuple:
        return np.asarray(g["logit"]), np.asarray(g["p"])

    return [knots(g) for g in cal.get("by_slot", [])], knots(cal["pooled"])


def slot_probability(cal: dict, confs, knots: tuple | None = None) -> np.ndarray:
    """P(slot j accepted | the ones before it were) at confidences ``confs`` of slots 1, 2, ..
    (a slot past the fitted ones takes the pooled fit). ``knots``: ``_slot_knots(cal)``, when
    the caller reads the same calibration many times."""
    fits, pooled = knots if knots is not None else _slot_knots(cal)
    out = []
    for s, x in enumerate(np.asarray(confs, dtype=float)):
        out.append(float(_interp(fits[s] if s < len(fits) else pooled, _logit(x))))
    return np.asarray(out)


def synthetic_block_positions(
    cal: dict,
    tokens: list[int],
    blocks: list[list[float]],
    n_new: int,
    horizon: int,
    sentence_end_ids,
    rng: np.random.Generator,
    request_id: int = 0,
) -> list[PositionRecord]:
    """One drawn position trace of a prompt from its block rollout (module doc, 3): ``n_new``
    positions, each with its drawn run length and the block's confidences."""
    if len(blocks) < n_new:
        raise DSparkError(f"block rollout of {len(blocks)} positions; {n_new} needed")
    out = []
    knots = _slot_knots(cal)
    for t in range(n_new):
        c = np.asarray(blocks[t], dtype=float)[:horizon]
        ok = rng.random(len(c)) < slot_probability(cal, c, knots)
        run = int(np.argmin(ok)) if not ok.all() else len(c)
        out.append(
            PositionRecord(
                request_id=request_id,
                position=t,
                run_length=run,
                confidences=tuple(float(x) for x in c),
                sentence_end=tokens[t] in sentence_end_ids,
            )
        )
    return out
