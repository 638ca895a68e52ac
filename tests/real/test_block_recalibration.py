"""Online recalibration of the block drafter's confidence head (real.block_recalibration): the
Platt map starts as the identity, recovers a known miscalibration from verified slots, is held
by its prior, remembers its window; the drafter predicts with the map fitted before the round
and learns only what the engine verified; tools that replay a drafter see the shipped head."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from control import make_controller
from real.block_drafter import BlockDrafter
from real.block_recalibration import (
    OnlineCalibration,
    RecalibrationConfig,
    shipped_calibration,
    verified_slots,
)
from real.block_train import ece
from real.engine import Engine
from tests.real.conftest import CFG, prompt, tiny_target
from tests.real.test_block_drafter import LENGTH, tiny_block


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def test_no_slot_learned_is_the_shipped_calibration():
    z = np.linspace(-6.0, 6.0, 25)
    assert np.array_equal(OnlineCalibration().apply(z), sigmoid(z))


def test_a_known_miscalibration_is_recovered_round_by_round():
    """Slots accepted with probability σ(0.5·z − 0.3): the head over-confident, as it is on
    unseen prompts. Learned 8 slots a round, the map reaches (0.5, −0.3) and the predictions
    made before each round (prequential) are far better calibrated than the head's."""
    rng = np.random.default_rng(5)
    rc = OnlineCalibration()
    pred, raw, hit = [], [], []
    for _ in range(500):
        z = rng.normal(0.5, 2.0, 8)
        y = (rng.random(8) < sigmoid(0.5 * z - 0.3)).astype(float)
        pred += rc.apply(z).tolist()
        raw += sigmoid(z).tolist()
        hit += y.tolist()
        rc.learn(z, y)
    a, b = rc.theta
    assert abs(a - 0.5) < 0.05 and abs(b + 0.3) < 0.1
    p, r, h = np.array(pred), np.array(raw), np.array(hit)
    assert ece(r, h) > 0.1 and ece(p, h) < 0.03


def test_the_prior_holds_the_map_against_few_slots():
    z, y = np.array([3.0, 2.0, 4.0]), np.array([0.0, 0.0, 0.0])
    weak = OnlineCalibration(RecalibrationConfig(prior_slots=0.5))
    strong = OnlineCalibration(RecalibrationConfig(prior_slots=1e6))
    weak.learn(z, y)
    strong.learn(z, y)
    assert np.allclose(strong.theta, [1.0, 0.0], atol=1e-4)
    assert weak.apply(np.array([3.0]))[0] < 0.5 < sigmoid(3.0)


def test_the_window_keeps_the_last_slots_and_reset_forgets_them():
    rc = OnlineCalibration(RecalibrationConfig(window=16))
    for i in range(5):
        rc.learn(np.full(6, float(i)), np.ones(6))
    assert rc.slots == 16 and rc._z.tolist() == [2.0] * 4 + [3.0] * 6 + [4.0] * 6
    rc.reset()
    assert rc.slots == 0 and rc.theta.tolist() == [1.0, 0.0]


@pytest.mark.parametrize(
    ("drafted", "accepted", "slots", "outcomes"),
    [(4, 2, 3, [1, 1, 0]), (3, 3, 3, [1, 1, 1]), (5, 0, 1, [0]), (0, 0, 0, [])],
)
def test_the_verified_slots_of_a_round(drafted, accepted, slots, outcomes):
    z = [0.1, 0.2, 0.3, 0.4, 0.5]
    zs, ys = verified_slots(z, drafted, accepted)
    assert zs == z[:slots] and ys == outcomes


def test_the_drafter_predicts_with_the_fitted_map_and_learns_what_was_verified():
    """A map set by hand turns the head's logits into the round's confidences; ``learn`` takes
    the slots verification decided (drafted 5, accepted 2: three slots)."""
    target = tiny_target()
    rc = OnlineCalibration()
    d = BlockDrafter(tiny_block(), LENGTH, torch.float64, "cpu", recalibration=rc)
    eng = Engine(target, d, CFG)
    p = prompt(3, 9)
    eng._prefill(p)
    eng.seq[0, : len(p)] = torch.tensor(p)
    rc.theta = np.array([0.5, 0.2])
    _, z = d.block_logits(eng.seq, [0], [len(p)], 5)
    count, conf, _ = d.propose(eng.seq, len(p), 5, 0.0, CFG.sampling, None)
    want = sigmoid(0.5 * z[0].detach().double().numpy() + 0.2)
    assert count == 5 and np.allclose(conf, want, rtol=0, atol=1e-12)
    d.learn([0], [5], [2])
    assert rc.slots == 3 and rc._y.tolist() == [1.0, 1.0, 0.0]
    d.learn([0], [5], [2])  # nothing pending: the proposal was learned once
    assert rc.slots == 3


def test_the_engine_teaches_the_drafter_and_greedy_output_is_unchanged():
    """Greedy decoding with a recalibrating block drafter equals target-only decoding; the map
    learned exactly the slots the rounds verified."""
    target = tiny_target()
    rc = OnlineCalibration(RecalibrationConfig(prior_slots=2.0))
    eng = Engine(target, BlockDrafter(tiny_block(), LENGTH, torch.float64, "cpu", 1, rc), CFG)
    verified = 0
    for i in range(3):
        p = prompt(20 + i, 10)
        g = eng.generate(p, 24, make_controller("fixed", {"k": 4}))
        assert g.tokens == eng.greedy_reference(p, 24)
        verified += sum(min(r.accepted + 1, r.drafted) for r in g.records)
    assert rc.slots == verified > 0 and not np.array_equal(rc.theta, [1.0, 0.0])


def test_replaying_tools_see_the_shipped_head():
    rc = OnlineCalibration()
    d = BlockDrafter(tiny_block(), LENGTH, torch.float64, "cpu", recalibration=rc)
    with shipped_calibration(d):
        assert d.recalibration is None
    assert d.recalibration is rc
    with pytest.raises(RuntimeError), shipped_calibration(d):
        raise RuntimeError("interrupted")
    assert d.recalibration is rc
