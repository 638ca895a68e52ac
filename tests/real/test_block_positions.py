"""A block drafter's greedy position trace (real.positions) holds what the engine's rounds see:
the head's confidences and the run lengths of blocks drafted from the target's own states."""

from __future__ import annotations

import pytest
import torch

from control import make_controller
from real.block_drafter import BlockDrafter
from real.engine import Engine
from real.positions import record_positions, replay_fixed_k
from tests.real.conftest import CFG, prompt, tiny_target
from tests.real.test_block_drafter import LENGTH, OracleBlock, tiny_block


def test_block_trace_confidences_are_the_engine_rounds():
    """Every round of a fixed-k run reports, as its confidences, the head's predictions that
    the trace recorded at the round's output position (the target's states of every committed
    position handed over; stale states from an earlier sequence would change them)."""
    target = tiny_target()
    d = BlockDrafter(tiny_block(), LENGTH, torch.float64, "cpu")
    eng = Engine(target, d, CFG)
    eng.generate(prompt(40), 30, make_controller("fixed", {"k": 5}))  # leave other states behind
    p = prompt(41)
    recs = record_positions(eng, p, 30, horizon=CFG.k_max + 1)
    g = eng.generate(p, 30, make_controller("fixed", {"k": 5}))
    assert len(g.records) >= 6
    for r in g.records:
        t = r.context_tokens - len(p)
        assert r.confidences == pytest.approx(recs[t].confidences[: r.drafted], abs=1e-12)
    assert replay_fixed_k(recs, 5) == [r.accepted for r in g.records]


@pytest.mark.parametrize("right", [2, 4])
def test_block_trace_run_lengths(right):
    """A drafter right for its first ``right`` slots: run length min(right, B) at every
    position but the last few, and fixed-k replays equal the engine's accepts."""
    target = tiny_target()
    eng = Engine(target, OracleBlock(target, right), CFG)
    p = prompt(5)
    recs = record_positions(eng, p, 20, horizon=CFG.k_max + 1)
    assert [r.run_length for r in recs[:15]] == [right] * 15
    for k in (1, 3, 6):
        g = eng.generate(p, 20, make_controller("fixed", {"k": k}))
        assert replay_fixed_k(recs, k) == [r.accepted for r in g.records]
