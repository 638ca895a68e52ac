"""The profile corrected by the engine's own rounds (issue 19, item 4): a k-cycling controller
gives engine rounds at every draft length; ``correct_from_trace`` scales each verify size so
that the table's prediction of those very rounds has median measured / tabled = 1 exactly.
Invariants of the method, not timing assertions (timings on a shared machine flake)."""

import dataclasses
import itertools

import numpy as np
import pandas as pd
import pytest

from control.types import RoundRecord
from real.profile import (
    DRAFTER,
    TARGET,
    CycleK,
    GridProfiler,
    ProfileConfig,
    after_a_draft,
    calibration_ks,
    correct_from_trace,
    trace_ratios,
)
from sim.latency import Table
from tests.real.conftest import CFG, make_engine, prompt

PCFG = ProfileConfig(contexts=(8, 40), prefill_tokens=(12,), warmup=0, repeats=1)


@pytest.fixture(scope="module")
def profiled():
    eng = make_engine("tf", cfg=dataclasses.replace(CFG, k_max=4, max_len=120))
    gp = GridProfiler(eng, PCFG)
    gp.passes(1)
    rows, _ = gp.rows()
    recs = []
    for i in range(3):
        g = eng.generate(prompt(i), 40, CycleK(range(5), offset=i), request_id=i)
        recs += g.records
    return pd.DataFrame(rows), recs


def test_cycle_k_visits_every_draft_length_in_turn():
    c = CycleK([0, 2, 5], offset=1)
    ks = []
    for _ in range(6):
        ks.append(c.decide(0.0).k)
        c.observe(None)
    assert ks == [2, 5, 0, 2, 5, 0]
    c.reset()
    assert c.decide(0.0).k == 2


def test_engine_rounds_of_the_cycle_cover_every_k(profiled):
    _, recs = profiled
    # every k of the cycle was run (the engine cuts k only near the end of a request)
    assert {r.drafted for r in recs} >= set(range(5))


def test_lookup_is_the_simulators_table(profiled, tmp_path):
    df, recs = profiled
    p = tmp_path / "latency.csv"
    df.to_csv(p, index=False)
    tab = Table(p, TARGET)
    med, tot = trace_ratios(df, recs), trace_ratios(df, recs, statistic="mean")
    for k in med:
        rs = [x for x in recs if x.drafted == k]
        tabled = [tab.lookup(1, k + 1, x.context_tokens) for x in rs]
        want = np.median([x.verify_s / t for x, t in zip(rs, tabled)])
        assert med[k]["verify_ratio"] == pytest.approx(want, rel=1e-12)
        want = sum(x.verify_s for x in rs) / sum(tabled)
        assert tot[k]["verify_ratio"] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("statistic", ["median", "mean"])
def test_correction_makes_the_table_match_the_trace_exactly(profiled, statistic):
    df, recs = profiled
    out, det = correct_from_trace(df, recs, intercept_s=1e-5, min_rounds=3, statistic=statistic)
    assert det["verify_scale_by_k"]  # some k were corrected
    for k in det["verify_scale_by_k"]:
        assert det["after"][k]["verify_ratio"] == pytest.approx(1.0, rel=1e-9)
        t = (df.model == TARGET) & (df.batch == 1) & (df.new_tokens == k + 1)
        np.testing.assert_allclose(
            out.loc[t, "seconds"], df.loc[t, "seconds"] * det["verify_scale_by_k"][k]
        )
    # rows of verify sizes no round had (prefill chunks) are untouched
    big = (df.model == TARGET) & (df.new_tokens > 5)
    assert out.loc[big, "seconds"].equals(df.loc[big, "seconds"])
    # drafter rows: one scale, and after it the median step share is exactly 1
    d = df.model == DRAFTER
    np.testing.assert_allclose(out.loc[d, "seconds"], df.loc[d, "seconds"] * det["drafter_scale"])
    _, det2 = correct_from_trace(out, recs, intercept_s=1e-5, min_rounds=3, statistic=statistic)
    assert det2["drafter_scale"] == pytest.approx(1.0, rel=1e-9)
    assert all(v == pytest.approx(1.0, rel=1e-9) for v in det2["verify_scale_by_k"].values())


def _rec(k: int, ctx: int, draft_s: float, verify_s: float, rnd: int = 0) -> RoundRecord:
    return RoundRecord(
        request_id=0,
        round=rnd,
        now_s=0.0,
        k=k,
        drafted=k,
        accepted=0,
        emitted=1,
        draft_s=draft_s,
        verify_s=verify_s,
        context_tokens=ctx,
    )


@pytest.mark.parametrize("statistic", ["median", "mean"])
def test_known_scales_are_recovered(statistic):
    rows = []
    for T in (1, 2, 3):
        for c in (0, 100):
            rows.append(
                {
                    "model": TARGET,
                    "batch": 1,
                    "new_tokens": T,
                    "context_tokens": c,
                    "seconds": T + c / 100,
                }
            )
    rows += [
        {"model": DRAFTER, "batch": 1, "new_tokens": 1, "context_tokens": c, "seconds": 0.5}
        for c in (0, 100)
    ]
    df = pd.DataFrame(rows)
    # k = 0 rounds verify 0.8 x the table, k = 1 rounds 1.25 x; drafts 2 x the step + 0.1
    recs = [_rec(0, c, 0.0, 0.8 * (1 + c / 100)) for c in (10, 50, 90)]
    recs += [_rec(1, c, 0.1 + 2 * 0.5, 1.25 * (2 + c / 100)) for c in (10, 50, 90)]
    out, det = correct_from_trace(df, recs, intercept_s=0.1, min_rounds=3, statistic=statistic)
    assert det["verify_scale_by_k"] == {0: pytest.approx(0.8), 1: pytest.approx(1.25)}
    assert det["drafter_scale"] == pytest.approx(2.0)
    k2 = out[(out.model == TARGET) & (out.new_tokens == 3)]
    assert list(k2.seconds) == [3.0, 4.0]  # no round drafted 2: unchanged


def test_draft_free_rounds_right_after_a_draft_do_not_correct_k0():
    """k = 0 is corrected from draft-free rounds inside a draft-free stretch (or first in a
    generation), the profile cell's state; those right after a drafting round are reported."""
    rows = [
        {"model": m, "batch": 1, "new_tokens": T, "context_tokens": c, "seconds": s}
        for m, T, s in ((TARGET, 1, 1.0), (TARGET, 2, 2.0), (DRAFTER, 1, 0.5))
        for c in (0, 100)
    ]
    df = pd.DataFrame(rows)
    # one generation: 0, 0, 0, 1, 0, 1, 0 — stretch rounds verify 0.9 x, those after a draft 1.2 x
    ks = [0, 0, 0, 1, 0, 1, 0]
    recs, prev = [], 0
    for i, k in enumerate(ks):
        v = 2.0 if k else (1.2 if i and prev else 0.9)
        recs.append(_rec(k, 50, 1.0 if k else 0.0, v, rnd=i))
        prev = k
    # a second generation's first round follows the last one's draft in the list: it starts anew
    recs.append(_rec(0, 50, 0.0, 0.9, rnd=0))
    assert after_a_draft(recs) == [False, False, False, False, True, False, True, False]
    _, det = correct_from_trace(df, recs, min_rounds=3, statistic="median")
    assert det["verify_scale_by_k"][0] == pytest.approx(0.9)
    assert det["before"][0]["rounds"] == 4
    assert det["zero_draft_after_draft"]["rounds"] == 2
    assert det["zero_draft_after_draft"]["verify_ratio"] == pytest.approx(1.2 / 0.9)


def test_calibration_cycle_holds_a_draft_free_round_after_a_draft_free_round():
    ks = calibration_ks(4)
    assert ks == [0, 0, 1, 2, 3, 4]
    c = CycleK(ks)
    seq = []
    for _ in range(2 * len(ks)):
        seq.append(c.decide(0.0).k)
        c.observe(None)
    pairs = list(itertools.pairwise(seq))
    assert (0, 0) in pairs and (4, 0) in pairs and set(seq) == set(range(5))
