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


def test_old_slots_are_forgotten_and_reset_forgets_them_all():
    """Slots at one logit, all refused, then as many all accepted: with a short memory the map
    follows the new ones (the bin's counts forgotten by 1 − 1/memory a slot); reset is the
    shipped calibration again."""
    short = OnlineCalibration(RecalibrationConfig(memory_slots=16.0, prior_slots=1.0))
    for y in (0.0, 1.0):
        for _ in range(20):
            short.learn(np.full(8, 1.0), np.full(8, y))
    keep = (1.0 - 1.0 / 16.0) ** 8
    assert short.slots == pytest.approx(8 * (1 - keep**40) / (1 - keep))
    assert short.apply(np.array([1.0]))[0] > 0.9
    short.reset()
    assert short.slots == 0.0 and short.theta.tolist() == [1.0, 0.0]


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
    assert rc.slots == 3.0 and rc._s.sum() == 2.0
    d.learn([0], [5], [2])  # nothing pending: the proposal was learned once
    assert rc.slots == 3.0


def test_the_engine_teaches_the_drafter_and_greedy_output_is_unchanged():
    """Greedy decoding with a recalibrating block drafter equals target-only decoding; the map
    learned exactly the slots the rounds verified."""
    target = tiny_target()
    rc = OnlineCalibration(RecalibrationConfig(prior_slots=2.0, memory_slots=1e9))
    eng = Engine(target, BlockDrafter(tiny_block(), LENGTH, torch.float64, "cpu", 1, rc), CFG)
    verified = 0
    for i in range(3):
        p = prompt(20 + i, 10)
        g = eng.generate(p, 24, make_controller("fixed", {"k": 4}))
        assert g.tokens == eng.greedy_reference(p, 24)
        verified += sum(min(r.accepted + 1, r.drafted) for r in g.records)
    assert rc.slots == pytest.approx(verified, rel=1e-6) and verified > 0
    assert not np.array_equal(rc.theta, [1.0, 0.0])


def test_replaying_tools_see_the_shipped_head():
    rc = OnlineCalibration()
    d = BlockDrafter(tiny_block(), LENGTH, torch.float64, "cpu", recalibration=rc)
    with shipped_calibration(d):
        assert d.recalibration is None
    assert d.recalibration is rc
    with pytest.raises(RuntimeError), shipped_calibration(d):
        raise RuntimeError("interrupted")
    assert d.recalibration is rc
