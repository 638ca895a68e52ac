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
from real.profile import DRAFT_PHASE, DRAFTER, TARGET, GridProfiler, ProfileConfig
from real.trace_correction import (
    CycleK,
    after_a_draft,
    calibration_ks,
    correct_from_trace,
    draft_phases,
    tabled_draft_s,
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
    first = draft_phases(recs)[2]  # a generation's first draft phase feeds the prompt: out
    for k in med:
        rs = [x for x, f in zip(recs, first) if x.drafted == k and not f]
        tabled = [tab.lookup(1, k + 1, x.context_tokens) for x in rs]
        want = np.median([x.verify_s / t for x, t in zip(rs, tabled)])
        assert med[k]["verify_ratio"] == pytest.approx(want, rel=1e-12)
        want = sum(x.verify_s for x in rs) / sum(tabled)
        assert tot[k]["verify_ratio"] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("statistic", ["median", "mean"])
def test_correction_makes_the_table_match_the_trace_exactly(profiled, statistic):
    df, recs = profiled
    out, det = correct_from_trace(df, recs, min_rounds=3, statistic=statistic)
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
    # drafter and draft-phase rows: one scale, and after it the draft ratio is exactly 1
    d = df.model.isin([DRAFTER, DRAFT_PHASE])
    assert (df.model == DRAFT_PHASE).any()
    np.testing.assert_allclose(out.loc[d, "seconds"], df.loc[d, "seconds"] * det["drafter_scale"])
    _, det2 = correct_from_trace(out, recs, min_rounds=3, statistic=statistic)
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


def _grid(extra=()) -> pd.DataFrame:
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
        {"model": m, "batch": 1, "new_tokens": n, "context_tokens": c, "seconds": s}
        for m, n, s in ((DRAFTER, 1, 0.5), (DRAFTER, 3, 0.7), *extra)
        for c in (0, 100)
    ]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("statistic", ["median", "mean"])
def test_known_scales_are_recovered(statistic):
    df = _grid([(DRAFT_PHASE, 1, 0.6), (DRAFT_PHASE, 2, 1.5)])
    # one generation: three k = 0 rounds verifying 0.8 x the table, then four k = 1 rounds
    # verifying 1.25 x with drafts 2 x the draft-phase row (the first feeds the prompt: left out)
    recs = [_rec(0, c, 0.0, 0.8 * (1 + c / 100), rnd=i) for i, c in enumerate((10, 50, 90))]
    recs += [
        _rec(1, c, 2 * 0.6, 1.25 * (2 + c / 100), rnd=3 + i) for i, c in enumerate((5, 10, 50, 90))
    ]
    out, det = correct_from_trace(df, recs, min_rounds=3, statistic=statistic)
    assert det["verify_scale_by_k"] == {0: pytest.approx(0.8), 1: pytest.approx(1.25)}
    assert det["drafter_scale"] == pytest.approx(2.0)
    assert det["before"][1]["rounds"] == 3
    k2 = out[(out.model == TARGET) & (out.new_tokens == 3)]
    assert list(k2.seconds) == [3.0, 4.0]  # no round drafted 2: unchanged
    ph = out[out.model == DRAFT_PHASE]
    assert list(ph.seconds) == [1.2, 1.2, 3.0, 3.0]


def _tau_rec(k, drafted, rnd, tau=0.0, request_id=0) -> RoundRecord:
    return dataclasses.replace(
        _rec(k, 50, 0.0, 1.0, rnd), drafted=drafted, tau=tau, request_id=request_id
    )


def test_draft_phases_count_steps_extra_tokens_and_the_first_phase():
    recs = [
        _tau_rec(0, 0, 0),  # the generation starts without drafting
        _tau_rec(2, 2, 1),  # the first phase: it feeds the prompt
        _tau_rec(0, 0, 2),
        _tau_rec(0, 0, 3),
        _tau_rec(3, 3, 4),  # two draft-free rounds before it: two extra tokens
        _tau_rec(4, 1, 5, tau=0.5),  # the τ stop fired after one token: two steps ran
        _tau_rec(4, 0, 6, tau=0.5),  # stopped at once: one step, nothing drafted
        _tau_rec(2, 2, 7),
        _tau_rec(1, 1, 0, request_id=1),  # a new generation: its first phase
    ]
    steps, extra, first = draft_phases(recs)
    assert steps.tolist() == [0, 2, 0, 0, 3, 2, 1, 2, 1]
    assert extra.tolist() == [0, 0, 0, 0, 2, 0, 0, 0, 0]
    assert first.tolist() == [False, True, False, False, False, False, False, False, True]
    df = _grid([(DRAFT_PHASE, 1, 0.6), (DRAFT_PHASE, 3, 1.8)])
    got = tabled_draft_s(df, recs)
    # the phase row of the steps (k = 2 between the rows of 1 and 3), plus, for the two extra
    # tokens, the drafter's row of 3 tokens less its row of 1
    want = [0.0, 1.2, 0.0, 0.0, 1.8 + 0.2, 1.2, 0.6, 1.2, 0.6]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # a table without draft-phase rows: steps x the drafter step
    np.testing.assert_allclose(tabled_draft_s(_grid(), recs)[4], 3 * 0.5 + 0.2, rtol=1e-12)


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
