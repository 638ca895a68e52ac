"""Online recalibration of the block drafter's confidence head (real.block_recalibration): the
Platt map starts as the identity, recovers a known miscalibration from verified slots, is held
by its prior, remembers its window; the by-range correction is each range's shrunk accepted
share, the by-request offset the posterior mode of its request's own slots; the drafter predicts
with the map fitted before the round, per request, and learns only what the engine verified;
tools that replay a drafter see the shipped head."""

from __future__ import annotations

import dataclasses

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
    rc = OnlineCalibration(RecalibrationConfig(bin_width=0.0, request_precision=0.0))
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


def test_the_refinements_leave_the_map_as_it_was_fitted():
    """The map (a, b) is fitted on the slots alone: the by-range and by-request refinements
    sit on top of it and never move it."""
    rng = np.random.default_rng(6)
    plain = OnlineCalibration(RecalibrationConfig(bin_width=0.0, request_precision=0.0))
    full = OnlineCalibration()
    for i in range(50):
        z = rng.normal(0.5, 2.0, 8)
        y = (rng.random(8) < sigmoid(0.5 * z - 0.3)).astype(float)
        plain.learn(z, y)
        full.learn(z, y, [i % 3] * 8)
        assert np.array_equal(plain.theta, full.theta)
    a, b = plain.theta
    assert plain.apply(np.array([0.7]))[0] == sigmoid(a * 0.7 + b)


def test_a_logit_range_predicts_its_shrunk_accepted_share():
    """Slots learned in one range of 0.5 (memory bins 0.125 wide), the map held at the
    identity: a logit in that range predicts (S + m·σ(z)) / (W + m); a range with no slot is
    the map itself, float for float."""
    m = 16.0
    rc = OnlineCalibration(
        RecalibrationConfig(
            prior_slots=1e9, memory_slots=1e12, bin_prior_slots=m, request_precision=0.0
        )
    )
    z = np.array([1.0, 1.1, 1.2, 1.05, 1.15, 1.0])  # memory bins 104-106: the range 26
    y = np.array([0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    for _ in range(4):
        rc.learn(z, y)
    W, S = rc._w[104:108].sum(), rc._s[104:108].sum()
    assert W == pytest.approx(24.0) and S == pytest.approx(4.0)
    got = rc.apply(np.array([1.12, -2.0]))
    a, b = rc.theta  # held within 1e-8 of the identity by its prior
    assert got[0] == pytest.approx((S + m * sigmoid(a * 1.12 + b)) / (W + m), rel=1e-14)
    assert got[1] == sigmoid(a * -2.0 + b)
    with pytest.raises(ValueError, match=r"multiple of 0\.125"):
        OnlineCalibration(RecalibrationConfig(bin_width=0.3))


def map_offset(s: np.ndarray, y: np.ndarray, lam: float, weight: float = 1.0) -> float:
    """The posterior mode of d given logits s and outcomes y, each of weight ``weight``
    (prior N(0, 1/λ)), by bisection of the score w·Σ(y − σ(s + d)) − λd (decreasing in d)."""
    lo, hi = -20.0, 20.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if weight * float((y - sigmoid(s + mid)).sum()) - lam * mid > 0.0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def test_each_request_gets_the_posterior_mode_of_its_own_slots():
    """Request "hard" refuses what the head says it accepts; "easy" accepts all: after a few
    rounds each offset is the mode of its posterior (the shared map held fixed), of opposite
    signs; a request with no slot predicts the shared map; forgetting a request drops it."""
    lam = 4.0
    rc = OnlineCalibration(
        RecalibrationConfig(prior_slots=1e9, bin_width=0.0, request_precision=lam)
    )
    z = np.array([2.0, 1.5, 1.0])
    hard, easy = [], []
    for _ in range(6):
        rc.learn(
            np.concatenate([z, z]), np.array([1, 0, 0, 1, 1, 1.0]), ["hard"] * 3 + ["easy"] * 3
        )
        hard.append([1, 0, 0])
        easy.append([1, 1, 1])
    a, b = rc.theta  # held within 1e-8 of the identity by its prior
    s = a * np.tile(z, 6) + b
    assert rc.offset("hard") == pytest.approx(map_offset(s, np.ravel(hard), lam), abs=1e-6)
    assert rc.offset("easy") == pytest.approx(map_offset(s, np.ravel(easy), lam), abs=1e-6)
    assert rc.offset("hard") < 0.0 < rc.offset("easy")
    rows = rc.apply(np.array([[1.0], [1.0], [1.0]]), ["hard", "easy", "new"])[:, 0]
    assert rows[0] == pytest.approx(sigmoid(a + b + rc.offset("hard")), rel=1e-12)
    assert rows[0] < rows[2] == sigmoid(a + b) < rows[1]
    rc.forget_request("hard")
    assert rc.offset("hard") == 0.0 and rc.offset("easy") != 0.0
    rc.reset()
    assert rc.offset("easy") == 0.0


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


def test_rounds_without_a_draft_forget_a_requests_offset():
    """A request refused everything, then drafted nothing for 40 rounds (a stop read its low
    confidences): its evidence weighs (1 − 1/16)^40 and its offset is that posterior's mode,
    near 0 again, so its drafts resume and are checked."""
    lam = 4.0
    rc = OnlineCalibration(RecalibrationConfig(prior_slots=1e9, bin_width=0.0))
    z = np.array([2.0, 1.0, 1.5, 2.5])
    for _ in range(5):
        rc.learn(z, np.zeros(4), ["r"] * 4)
    before = rc.offset("r")
    for _ in range(40):
        rc.idle("r")
    rc.idle("never seen")  # nothing to forget
    a, b = rc.theta
    want = map_offset(a * np.tile(z, 5) + b, np.zeros(20), lam, (1 - 1 / 16) ** 40)
    assert before < -1.0 and rc.offset("r") == pytest.approx(want, abs=1e-6)
    assert before < rc.offset("r") < 0.0 and rc.offset("never seen") == 0.0


def test_the_drafter_keeps_an_offset_per_request_slot():
    """Two rows of one proposal learn opposite outcomes: each engine slot's request gets its own
    offset, its next confidences move with it, and a new request in a slot starts at 0."""
    target = tiny_target()
    rc = OnlineCalibration(RecalibrationConfig(prior_slots=1e9, bin_width=0.0))
    d = BlockDrafter(tiny_block(), LENGTH, torch.float64, "cpu", 2, rc)
    eng = Engine(target, d, dataclasses.replace(CFG, slots=2))
    p = prompt(3, 9)
    for slot in (0, 1):
        eng.seq[slot, : len(p)] = torch.tensor(p)
    eng.prefill_rows([0, 1], [0, 0], [len(p) - 1] * 2)
    _, z = d.block_logits(eng.seq, [0, 1], [len(p)] * 2, 4)
    d.propose_batch(eng.seq, [0, 1], [len(p)] * 2, [4, 4], [0.0, 0.0], CFG.sampling, None)
    d.learn([0, 1], [4, 4], [4, 0])  # slot 0: all four accepted; slot 1: refused at once
    assert rc.offset(1) < 0.0 < rc.offset(0)
    conf = rc.apply(z.detach().double().numpy(), [0, 1])
    assert np.all(conf[0] > sigmoid(z[0].detach().double().numpy()))
    assert np.all(conf[1] < sigmoid(z[1].detach().double().numpy()))
    d.reset_slot(1)
    assert rc.offset(1) == 0.0 and rc.offset(0) > 0.0


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
