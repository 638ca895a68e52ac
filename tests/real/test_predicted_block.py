"""Acceptance predicted from a block drafter's confidence head (real.predicted_block): the
rollout's per-position blocks, the calibration's slot pairs and ECE, the drawn run lengths."""

from __future__ import annotations

import numpy as np
import pytest

from control.types import PositionRecord
from real.engine import Engine
from real.predicted_block import (
    MIN_SLOT_PAIRS,
    block_rollout,
    expected_calibration_error,
    fit_block_calibration,
    slot_probability,
    synthetic_block_positions,
)
from tests.real.conftest import CFG, prompt, tiny_target
from tests.real.test_block_drafter import OracleBlock


def _rec(t: int, run: int, confs) -> PositionRecord:
    return PositionRecord(request_id=0, position=t, run_length=run, confidences=tuple(confs))


def test_block_rollout_is_the_drafter_text_and_every_position_block():
    """A drafter right for 3 slots proposes the target's greedy continuation as its own text;
    from every position the head's 5 confidences (0.9, 0.8, ..), the text left as it was."""
    target = tiny_target()
    eng = Engine(target, OracleBlock(target, 3), CFG)
    p = prompt(7)
    toks, blocks = block_rollout(eng, p, 20, 12)
    ref = eng.greedy_reference(p, 20)
    # chunks of B = 5: the first 3 of each chunk are the target's given the chunk's start
    assert toks[:3] == ref[:3] and len(toks) == 20
    assert len(blocks) == 12
    assert all(b == pytest.approx([0.9, 0.8, 0.7, 0.6, 0.5]) for b in blocks)


def test_calibration_pairs_and_ece():
    """Slots 1..run + 1 are decided (8 here); a head that says 0.9 for slot 1 (accepted 3 of 4
    decided), 0.5 for slot 2 (1 of 3) and 0.3 for slot 3 (0 of 1) has per-position ECE
    |0.9 - 3/4|, |0.5 - 1/3|, 0.3, pooled their decided-weighted mean; with fewer than
    MIN_SLOT_PAIRS decided a slot takes the pooled isotonic fit."""
    recs = [[_rec(0, 2, [0.9, 0.5, 0.3]), _rec(1, 0, [0.9, 0.5, 0.3])]]
    recs += [[_rec(0, 1, [0.9, 0.5, 0.3]), _rec(1, 1, [0.9, 0.5, 0.3])]]
    cal = fit_block_calibration(recs)
    assert cal["decided_slots"] == 3 + 1 + 2 + 2
    assert cal["a_rate"] == pytest.approx(3 / 4)
    want = [abs(0.9 - 0.75), abs(0.5 - 1 / 3), abs(0.3 - 0.0)]
    assert cal["head_ece_by_position"] == pytest.approx(want)
    assert cal["head_ece"] == pytest.approx((0.15 * 4 + (0.5 - 1 / 3) * 3 + 0.3) / 8)
    assert expected_calibration_error(np.array([0.95, 0.95]), np.array([1.0, 0.0])) == (
        pytest.approx(0.45)
    )
    # the pooled fit is isotonic in the confidence: 0 at 0.3, 1/3 at 0.5, 3/4 at 0.9
    assert slot_probability(cal, [0.9, 0.5, 0.3, 0.9]) == pytest.approx([0.75, 1 / 3, 0.0, 0.75])


def test_per_slot_fit():
    """A slot with enough decided pairs gets its own fit: slot 1 accepted whatever its
    confidence (1.0), slot 2 never (0.0), though both say 0.6."""
    recs = [[_rec(t, 1, [0.6, 0.6]) for t in range(MIN_SLOT_PAIRS)]]
    cal = fit_block_calibration(recs)
    assert slot_probability(cal, [0.6, 0.6]) == pytest.approx([1.0, 0.0])


def _cal(p: float) -> dict:
    return {"pooled": {"logit": [-5.0, 5.0], "p": [p, p]}, "by_slot": []}


def test_drawn_run_lengths():
    """p = 1: every slot accepted (run = B, capped at the horizon); p = 0: none; p = 0.5: the
    mean run is Σ_j 0.5^j over the block, the confidences the block's."""
    blocks = [[0.8] * 5 for _ in range(4000)]
    toks = [1] * 4000
    rng = np.random.default_rng(0)
    full = synthetic_block_positions(_cal(1.0), toks, blocks, 4, 17, {1}, rng)
    assert [r.run_length for r in full] == [5] * 4 and full[0].sentence_end
    assert full[0].confidences == pytest.approx((0.8,) * 5)
    assert [
        r.run_length for r in synthetic_block_positions(_cal(1.0), toks, blocks, 3, 2, (), rng)
    ] == [2] * 3
    assert {
        r.run_length for r in synthetic_block_positions(_cal(0.0), toks, blocks, 50, 17, (), rng)
    } == {0}
    half = synthetic_block_positions(_cal(0.5), toks, blocks, 4000, 17, (), rng)
    mean = np.mean([r.run_length for r in half])
    assert mean == pytest.approx(sum(0.5**j for j in range(1, 6)), abs=0.05)
