"""``dspark real profile`` over batch: a full batch x new_tokens x context grid per model that the
simulator's table backend reads, timed on the batched engine's own verify / draft / prefill."""

import dataclasses

import pytest
import torch

from real.profile import ProfileConfig, profile, round_overhead_s
from sim.latency import Table
from tests.real.conftest import CFG, make_engine

PCFG = ProfileConfig(
    contexts=(8, 30),
    prefill_tokens=(12,),
    warmup=0,
    repeats=2,
    overhead_prompts=1,
    overhead_tokens=10,
    batches=(1, 2, 4),
    draft_lengths=(0, 1, 3),
)


def test_batched_profile_is_a_full_grid_the_simulator_reads(tmp_path):
    eng = make_engine("tf", cfg=dataclasses.replace(CFG, slots=4))
    df, details = profile(eng, PCFG)
    t, d = df[df.model == "target"], df[df.model == "drafter"]
    assert len(t) == 3 * 3 * 4 and len(d) == 3 * 3 * 2  # batches x contexts x new tokens
    assert sorted(set(t.new_tokens)) == [1, 2, 4, 12]
    assert sorted(set(t.batch)) == sorted(set(d.batch)) == [1, 2, 4]
    assert (df.seconds >= 0).all()
    ov = df[df.model == "round-overhead"]
    assert list(ov.batch) == [1, 2, 4]
    assert round_overhead_s(df) == pytest.approx(details["round_overhead_s"])
    assert round_overhead_s(df, batch=4) == pytest.approx(ov.seconds.iloc[2])
    p = tmp_path / "latency.csv"
    df.to_csv(p, index=False)
    tab = Table(p, "target")
    row = t[(t.batch == 4) & (t.new_tokens == 4) & (t.context_tokens == 30)].iloc[0]
    # the backend's query is (batch, Σ new tokens, Σ context): per-sequence values x batch
    assert tab.seconds(4, 16, 120.0) == pytest.approx(row.seconds)
    Table(p, "drafter")
    # (no timing comparison here: which of two measured cells is slower is a benchmark's
    # question on a machine shared with other jobs, not a unit test's)


def test_profile_needs_enough_slots():
    from control.errors import DSparkError

    with pytest.raises(DSparkError, match="slots"):
        profile(make_engine("tf", cfg=dataclasses.replace(CFG, slots=2)), PCFG)


def test_startup_rows_count_the_tokens_each_timed_pass_verified(monkeypatch):
    """``startup_cost_rows``' verify rows carry the tokens the timed pass really verified
    (Σ over its B rows of k + 1, as ``RoundStats.verify_tokens`` counts a round's), not one
    row's k + 1: the planner's cost fit reads them on the same axis as its rounds. The timer is
    made to report the verified-token count instead of seconds, so the check needs no clock."""
    import real.profile as rp
    from real.profile import startup_cost_rows, startup_grid

    eng = make_engine("tf", cfg=dataclasses.replace(CFG, slots=4))
    seen: list[int] = []
    verify = eng.verify

    def spy(slots, Ls, drafted, *rest):
        seen.append(sum(d + 1 for d in drafted))
        return verify(slots, Ls, drafted, *rest)

    monkeypatch.setattr(eng, "verify", spy)
    timed = rp.RegionTimer.verify
    monkeypatch.setattr(
        rp.RegionTimer, "verify", lambda self, *a: (timed(self, *a), float(seen[-1]))[1]
    )
    rows = startup_cost_rows(eng, repeats=1)
    batches, _, ks = startup_grid(4, CFG.k_max, CFG.max_len)
    verify_rows = [r for r in rows if r[0] == "verify"]
    assert {(b, n) for _, b, n, _, _ in verify_rows} == {
        (b, b * (k + 1)) for b in batches for k in ks
    }
    assert all(n == s for _, _, n, _, s in verify_rows)  # the pass verified what the row says
    assert max(b for _, b, _, _, _ in verify_rows) == 4


def test_a_block_drafter_is_profiled_like_a_model_drafter():
    """A block drafter keeps no cache of its own (nothing to rewind): the profile times its
    one forward a round on the same grid, and an n-gram drafter is still refused by name."""
    from control.errors import DSparkError
    from control.latency_rows import BLOCK_MARKER
    from real.block_drafter import BlockDrafter
    from real.engine import Engine
    from real.profile import profiled_drafter
    from tests.real.conftest import tiny_target
    from tests.real.test_block_drafter import LENGTH, tiny_block

    cfg = dataclasses.replace(CFG, slots=4)
    d = BlockDrafter(tiny_block(), LENGTH, torch.float64, "cpu", 4)
    assert profiled_drafter(d) is d and not hasattr(d, "set_valid")
    df, _ = profile(Engine(tiny_target(), d, cfg), PCFG)
    phase = df[df.model == "draft-phase"]
    assert sorted(set(phase.new_tokens)) == [1, 3] and sorted(set(phase.batch)) == [1, 2, 4]
    assert (df.seconds >= 0).all() and len(df[df.model == "target"]) == 3 * 3 * 4
    # one row says the table timed a block drafter, and of which block size
    marker = df[df.model == BLOCK_MARKER]
    assert list(marker.new_tokens) == [d.block_size] and list(marker.seconds) == [0.0]
    assert not (profile(make_engine("tf", cfg=cfg), PCFG)[0].model == BLOCK_MARKER).any()
    with pytest.raises(DSparkError, match="conv, tf, feat or block"):
        profile(make_engine("ngram", cfg=cfg), PCFG)
