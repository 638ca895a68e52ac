"""Window estimator, PID loop, anomaly guard and block planner on hand-computed inputs."""

from __future__ import annotations

import math

import pytest

from control.anomaly import AnomalyGuard
from control.blocks import BlockPlanner
from control.pid import PID
from control.window import RoundWindow, a_hat_of


def test_a_hat_is_not_vpr():
    # constant a, longer k: VPR falls, the estimator does not. Rounds: k=2 n=2,1 ; k=8 n=2,1
    w2, w8 = RoundWindow(8), RoundWindow(8)
    for n in (2, 1):
        w2.push(n, 1 if n < 2 else 0, 2, n + 1, 0.0, 0.0, 0)
        w8.push(n, 1, 8, n + 1, 0.0, 0.0, 0)
    assert w2.a_hat() == 3 / 4 and w8.a_hat() == 3 / 5
    assert a_hat_of([2, 1], [2, 2]) == 3 / 4 and a_hat_of([0], [0]) is None
    # a tau-stopped round that accepted all it drafted is no rejection: â stays 1
    w = RoundWindow(4)
    w.push(3, 0, 3, 4, 0.0, 0.0, 0)
    assert w.a_hat() == 1.0


def test_window_evicts_and_resums():
    w = RoundWindow(3)
    assert w.a_hat() is None and w.tpot_s() is None and w.wall_tpot_s() is None
    assert w.lossy_fraction() == 0.0
    for i, (n, d) in enumerate([(1, 2), (2, 2), (0, 2), (2, 2), (1, 3)]):
        w.push(
            n, 1 if n < d else 0, d, n + 1, 0.001 * d, 0.01 + 0.001 * d, n // 2, now_s=0.1 * (i + 1)
        )
    # last three rounds: (0,2), (2,2), (1,3)
    assert (w.count, w.sum_n, w.sum_rej, w.sum_drafted, w.sum_emitted) == (3, 3, 2, 7, 6)
    assert w.a_hat() == 3 / 5 and w.lossy_fraction() == 1 / 3
    assert w.sum_round_s == pytest.approx(0.037, abs=1e-15)
    assert w.tpot_s() == pytest.approx(0.037 / 6)
    # wall clock: now 0.3 -> 0.5 over the tokens of the last two rounds (3 + 2)
    assert w.wall_tpot_s() == pytest.approx(0.2 / 5)
    with pytest.raises(ValueError):
        RoundWindow(0)


def test_wall_tpot_before_wrap():
    w = RoundWindow(10)
    w.push(1, 0, 1, 2, 0.0, 0.0, 0, now_s=1.0)
    assert w.wall_tpot_s() is None  # one round: no span
    w.push(1, 0, 1, 2, 0.0, 0.0, 0, now_s=1.5)
    assert w.wall_tpot_s() == 0.25
    w.push(0, 0, 0, 0, 0.0, 0.0, 0, now_s=1.5)
    w2 = RoundWindow(2)
    w2.push(0, 0, 0, 0, 0.0, 0.0, 0, now_s=1.0)
    w2.push(0, 0, 0, 0, 0.0, 0.0, 0, now_s=2.0)
    assert w2.wall_tpot_s() is None  # no tokens


class _EagerRing:
    """Reference: a fixed ring buffer with running sums (s += new - old) whose float sums are
    re-summed each time it wraps -- the rule RoundWindow's lazily computed sums must match
    bit for bit."""

    def __init__(self, size):
        self.size, self.i, self.count = size, 0, 0
        self.rows = [(0, 0, 0, 0, 0.0, 0.0, 0, 0.0)] * size
        self.s = [0, 0, 0, 0, 0.0, 0.0, 0]

    def push(self, row):
        old = self.rows[self.i]
        self.s = [a + (b - c) for a, b, c in zip(self.s, row, old)]
        self.rows[self.i] = row
        self.i += 1
        if self.i == self.size:
            self.i = 0
            self.s[4] = sum([r[4] for r in self.rows])
            self.s[5] = sum([r[5] for r in self.rows])
        self.count = min(self.count + 1, self.size)


def test_window_sums_match_an_eager_ring_bit_for_bit():
    import random

    from control.types import Observation
    from control.window import row_of

    rnd = random.Random(7)
    for size in (1, 3, 8, 32):
        for read_p in (1.0, 0.3, 0.03, 0.004):  # read every round ... rarely (trimmed history)
            w, ref, now = RoundWindow(size), _EagerRing(size), 0.0
            for _ in range(700):
                d = rnd.randint(0, 9)
                n = rnd.randint(0, d)
                now += rnd.random() * 0.02
                o = Observation(
                    now,
                    d,
                    n,
                    (),
                    rnd.random() * 1e-3,
                    rnd.random() * 1e-2,
                    0,
                    rnd.randint(0, n),
                    -1,
                    (),
                )
                row = row_of(o)
                ref.push(row)
                if rnd.random() < 0.5:
                    w.push_row(row)
                else:
                    w.push(*row)
                if rnd.random() < read_p:
                    assert [
                        w.sum_n,
                        w.sum_rej,
                        w.sum_drafted,
                        w.sum_emitted,
                        w.sum_draft_s,
                        w.sum_round_s,
                        w.sum_lossy,
                    ] == ref.s
                    assert w.count == ref.count
            assert w.tpot_s() == ref.s[5] / ref.s[3]
            assert w.a_hat() == (ref.s[0] / (ref.s[0] + ref.s[1]) if ref.s[0] + ref.s[1] else None)


def test_pid_integral_only_is_the_seed_rule():
    p = PID(0.0, 0.05, 0.0, 1.0, 0.3, 1.5, 0.8)
    x = 0.8
    for e in (0.2, -0.1, 0.37, 0.05):
        x = x + 0.05 * e
        assert p.step(e) == x
    # anti-windup: the integrator never leaves its clamp
    for _ in range(100):
        p.step(10.0)
    assert p.integrator == 1.5 and p.output == 1.5
    p.step(-1.0)
    assert p.integrator == pytest.approx(1.45)  # unwinds at once: no stored excess


def test_pid_proportional_and_filtered_derivative():
    p = PID(kp=1.0, ki=0.0, kd=2.0, d_filter=0.5, lo=-10, hi=10, initial=0.0)
    assert p.step(1.0) == 1.0  # first step: no derivative
    # d_raw = -1, d = 0 + 0.5*(-1 - 0) = -0.5 ; out = 0 + 0 + 2*(-0.5) = -1
    assert p.step(0.0) == -1.0
    # d_raw = 0, d = -0.5 + 0.5*(0 + 0.5) = -0.25 ; out = 0 + 2*-0.25
    assert p.step(0.0) == -0.5
    p.reset(20.0)
    assert p.integrator == 10 and p.d_state == 0.0 and p.e_prev is None
    with pytest.raises(ValueError):
        PID(0, 0, 0, 0.5, 0.0, 1.0, 2.0)
    with pytest.raises(ValueError):
        PID(0, 0, 0, 0.0, 0.0, 1.0, 0.5)


def test_guard_zscore_detects_and_recovers():
    g = AnomalyGuard("zscore", 3.0, 0.05, 0.05, 0.3, 0.2, 3, 0.2, 2)
    for _ in range(3):
        assert not g.check(0.8, 0.0, False)
    assert g.mu == 0.8 and g.var == 0.0
    assert g.check(0.6, 0.0, False) and g.active  # (0.8-0.6)/0.05 = 4 > 3
    assert g.last_reason == "a_hat_zscore"
    assert not g.check(0.8, 0.0, False) and g.active
    assert not g.check(0.8, 0.0, False) and not g.active
    assert g.check(None, 0.5, True) and g.last_reason == "lossy_accepts"
    assert not g.check(None, 0.5, False)  # lossy limit only in threshold mode


def test_guard_cusum_accumulates():
    g = AnomalyGuard("cusum", 3.0, 0.05, 0.05, 0.3, 0.01, 1, 0.2, 1)
    g.check(0.8, 0.0, False)
    # each block 0.15 below the (slowly moving) baseline: S grows ~0.1 per block
    fired = [g.check(0.65, 0.0, False) for _ in range(4)]
    assert fired == [False, False, False, True] and g.cusum == 0.0  # reset on alarm
    off = AnomalyGuard("off", 3.0, 0.05, 0.05, 0.3, 0.2, 1, 0.2, 1)
    assert not any(off.check(a, 0.0, False) for a in (0.9, 0.9, 0.0, 0.0))
    with pytest.raises(ValueError):
        AnomalyGuard("bogus", 3.0, 0.05, 0.05, 0.3, 0.2, 1, 0.2, 1)


@pytest.mark.parametrize(
    "B, snap, span, rounds, boundaries",
    [
        # no sentence ends: every B tokens, leftover carried into the next block
        (16, 4, 0, [(10, ()), (10, ()), (12, ())], [16, 32]),
        # a sentence end at token 13 of the block (>= B - snap = 12) closes it there
        (16, 4, 0, [(10, ()), (6, (2,)), (13, ())], [13, 29]),
        # a sentence end too early (token 5 < 12) is ignored
        (16, 4, 0, [(10, (4,)), (6, ())], [16]),
        # the first sentence end in the window wins
        (16, 4, 0, [(10, ()), (6, (4, 2))], [13]),
        # attention-span limit shorter than B
        (64, 0, 20, [(30, ()), (30, ())], [20, 40, 60]),
        # one long round closes two blocks
        (16, 0, 0, [(40, ())], [16, 32]),
        # snap window 0: sentence ends matter only exactly at B
        (16, 0, 0, [(16, (15,)), (16, (14,))], [16, 32]),
    ],
)
def test_block_planner_boundaries(B, snap, span, rounds, boundaries):
    p = BlockPlanner(B, snap, span)
    got = []
    for emitted, ends in rounds:
        before = p.blocks_closed
        closed = p.feed(emitted, ends)
        assert closed == p.blocks_closed - before
        if closed == 1:
            got.append(p.last_boundary)
        elif closed > 1:  # several boundaries in one round: all every B after the first
            last = p.last_boundary
            got.extend(last - p.block_tokens * j for j in reversed(range(closed)))
    assert got == boundaries
    assert p.total_tokens == sum(e for e, _ in rounds)


def test_block_planner_bad_args():
    with pytest.raises(ValueError):
        BlockPlanner(0, 0)
    with pytest.raises(ValueError):
        BlockPlanner(16, -1)
    p = BlockPlanner(16, 4)
    p.feed(20)
    p.reset()
    assert (p.tokens_in_block, p.total_tokens, p.blocks_closed) == (0, 0, 0)
    assert math.isclose(p.snap_from, 12)
