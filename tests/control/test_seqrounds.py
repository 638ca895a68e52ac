"""The members' window, retry cap and blocks in arrays (``control.seqrounds``) against the
objects they replace: a :class:`~control.window.RoundWindow`, a
:class:`~control.blocks.BlockPlanner` and the base controller's ``_observed``, round by round,
bit for bit."""

import numpy as np
import pytest

from control.blocks import BlockPlanner
from control.dspark import DSparkController
from control.dspark_base import DSparkBaseController
from control.dspark_config import DSparkConfig
from control.seqrounds import (
    CHANGED,
    MAY_CLOSE,
    SlotBlocks,
    SlotWindow,
    bind_constants,
    observe_rounds,
)
from control.seqstate import SeqArrays
from control.window import RoundWindow


class Reference:
    """The object path: the base controller's ``_observed`` on a RoundWindow and a
    BlockPlanner; block ends and rebuilds are logged with the window as read then."""

    _observed = DSparkBaseController._observed

    def __init__(self, cfg) -> None:
        self.config = cfg
        self._win = RoundWindow(cfg.window_rounds)
        self._blocks = BlockPlanner(cfg.block_tokens, cfg.snap_tokens, cfg.span_tokens)
        self._push, self._feed = self._win.push_row, self._blocks.feed
        self._retry = cfg.goodput_cooldown
        self.rounds = self.fails = self.cooldown = self.cooldowns = 0
        self.log: list = []

    def _block_end(self) -> None:
        w = self._win
        self.log.append(("end", w.a_hat(), w.tpot_s(), w.wall_tpot_s(), w.lossy_fraction()))

    def _rebuild(self, block_end: bool) -> None:
        self.log.append(("rebuild", self.cooldown))


class Slot:
    """The array path for one member in a shared store: the compiled round, then what its
    event leaves to Python, logged as :class:`Reference` logs it."""

    def __init__(self, store: SeqArrays, cfg) -> None:
        self.config, self.store = cfg, store
        self.slot = store.new_slot(self)
        self.log: list = []

    def _bind(self, store, slot) -> None:
        store.widen(self.config.window_rounds)
        bind_constants(memoryview(store.ints[slot]), self.config, self.config.goodput_cooldown)
        self._views(store, slot)

    def _views(self, store, slot) -> None:
        self.win, self.blocks = SlotWindow(store, slot), SlotBlocks(store, slot)
        self.ints = store.ints[slot]

    def after(self, ev: int, e: int, ends) -> None:
        if ev & MAY_CLOSE and self.blocks._close(e, ends):
            w = self.win
            self.log.append(("end", w.a_hat(), w.tpot_s(), w.wall_tpot_s(), w.lossy_fraction()))
        elif ev & CHANGED:
            self.log.append(("rebuild", int(self.ints[2])))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_batch_in_arrays_moves_as_each_member_on_its_own_objects(seed):
    """Members of three configs (windows 1, 5 and 32 rounds; blocks of 16 snapping from 8,
    of 20 with an attention span of 17; retry caps 1 and 3, one without cool-downs) in one
    store, 300 rounds of random drafts, outcomes, lossy accepts and sentence ends: every
    member's window sums and reads, block counts, round and retry counts, and the order of
    its block ends and rebuilds equal the object path's, bit for bit."""
    cfgs = [
        DSparkConfig(
            window_rounds=1, block_tokens=16, snap_tokens=8, retry_cap=1, goodput_cooldown=True
        ),
        DSparkConfig(
            window_rounds=5, block_tokens=20, span_tokens=17, retry_cap=3, goodput_cooldown=True
        ),
        DSparkConfig(window_rounds=32, block_tokens=16, snap_tokens=0, goodput_cooldown=False),
    ]
    rng = np.random.default_rng(seed)
    store = SeqArrays(6, 2)  # grows and widens as members join
    members = [(Reference(cfgs[i % 3]), Slot(store, cfgs[i % 3])) for i in range(9)]
    idx = np.array([s.slot for _, s in members], dtype=np.intp)
    t = 0.0
    for _ in range(300):
        d = rng.integers(0, 5, 9)
        n = np.array([rng.integers(0, k + 1) if rng.random() < 0.7 else 0 for k in d])
        e = n + 1
        lo = rng.integers(0, 2, 9) * n
        ends = [tuple(sorted(rng.choice(k, rng.integers(0, 2), replace=False).tolist())) for k in e]
        draft_s, verify_s = float(rng.uniform(0, 0.01)), float(rng.uniform(0.01, 0.05))
        t += draft_s + verify_s
        for i, (ref, _) in enumerate(members):
            ref._observed(t, int(d[i]), int(n[i]), draft_s, draft_s + verify_s, int(lo[i]), int(e[i]), ends[i])  # fmt: skip
        ev = np.empty(9, dtype=np.int64)
        has = np.array([bool(x) for x in ends])
        observe_rounds(store.ints, store.ring, store.wsum, idx, t, d, n, e, lo, has, draft_s, draft_s + verify_s, ev)  # fmt: skip
        for i in np.flatnonzero(ev).tolist():
            members[i][1].after(int(ev[i]), int(e[i]), ends[i])
        for ref, sl in members:
            rw, sw = ref._win, sl.win
            assert (rw.a_hat(), rw.tpot_s(), rw.wall_tpot_s(), rw.lossy_fraction(), rw.count) == (
                sw.a_hat(), sw.tpot_s(), sw.wall_tpot_s(), sw.lossy_fraction(), sw.count
            )  # fmt: skip
            b, sb = ref._blocks, sl.blocks
            assert (b.tokens_in_block, b.total_tokens, b.blocks_closed, b.last_boundary) == (
                sb.tokens_in_block, sb.total_tokens, sb.blocks_closed, sb.last_boundary
            )  # fmt: skip
            assert [ref.rounds, ref.fails, ref.cooldown, ref.cooldowns] == sl.ints[:4].tolist()
    for ref, sl in members:
        assert ref.log == sl.log
    assert sum(x[0] == "end" for ref, _ in members for x in ref.log) > 30
    assert sum(x[0] == "rebuild" for ref, _ in members for x in ref.log) > 30


def test_a_controller_moved_between_stores_keeps_its_window_blocks_and_counts():
    """A sequence adopted into a batch's store (and released back to one of its own) carries
    its ring, sums and counts: it reads and moves on exactly as a twin that stayed alone."""
    cfg = DSparkConfig(k_max=6, window_rounds=4, block_tokens=16, snap_tokens=4)
    alone, moved = DSparkController(cfg), DSparkController(cfg)
    batch = SeqArrays(6, 1)
    for r in range(40):
        if r == 10:
            batch.adopt(moved)
        if r == 25:  # into a store whose rings are wider
            wide = SeqArrays(6, 3)
            wide.widen(9)
            wide.adopt(moved)
        for m in (alone, moved):
            m.observe_values(0.05 * (r + 1), 3, r % 4, (), 0.01, 0.04, 500, 0, r % 4 + 1, ())
        w0, w1 = alone._win, moved._win
        assert (w0.a_hat(), w0.tpot_s(), w0.wall_tpot_s()) == (
            w1.a_hat(),
            w1.tpot_s(),
            w1.wall_tpot_s(),
        )
        assert alone.state() == moved.state()
