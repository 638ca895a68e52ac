"""Profile and trace files round-trip; the latency table is what the simulator's backend reads."""

import numpy as np
import pandas as pd
import pytest

from control.errors import DSparkError
from control.registry import make_controller
from control.types import PositionRecord, RoundRecord, records_from_rows, records_to_columns
from real.profile import COLUMNS, profile, read_latency, round_overhead_s
from real.tracing import PromptSetConfig, make_prompts, record_positions_full, run_requests
from sim.latency import Table
from tests.validate.conftest import ECFG, PCFG


def test_profile_table_round_trips_and_feeds_the_sim(engine, tmp_path):
    df, details = profile(engine, PCFG)
    assert tuple(df.columns) == COLUMNS
    ctxs = [0, 8, 40]
    t = df[df.model == "target"]
    # full grid: new tokens 1..k_max+1 plus the prefill chunks, at every context
    assert sorted(set(t.new_tokens)) == list(range(1, ECFG.k_max + 2)) + [12, 24]
    assert sorted(set(t.context_tokens)) == ctxs and len(t) == 9 * len(ctxs)
    d = df[df.model == "drafter"]
    assert sorted(set(d.new_tokens)) == [1, 12, 24] and len(d) == 3 * len(ctxs)
    assert (df.seconds >= 0).all() and (df.repeats >= 1).all()
    assert (df.seconds_p10 <= df.seconds_p90).all()
    ov = df[df.model == "round-overhead"]
    assert len(ov) == 1 and ov.seconds.iloc[0] == pytest.approx(details["round_overhead_s"])
    p = tmp_path / "latency.csv"
    df.to_csv(p, index=False)
    back = read_latency(p)
    pd.testing.assert_frame_equal(back, df, check_dtype=False)
    assert round_overhead_s(back) == pytest.approx(details["round_overhead_s"])
    # the simulator's table backend reads it; grid points come back exactly
    tab = Table(p, "target")
    row = t[(t.new_tokens == 4) & (t.context_tokens == 40)].iloc[0]
    assert tab.seconds(1, 4, 40.0) == pytest.approx(row.seconds)
    # and interpolates linearly in context between grid points
    a = t[(t.new_tokens == 4) & (t.context_tokens == 8)].seconds.iloc[0]
    assert tab.seconds(1, 4, 24.0) == pytest.approx((a + row.seconds) / 2)


def test_latency_table_missing_column_is_one_line(tmp_path):
    p = tmp_path / "latency.csv"
    pd.DataFrame({"model": ["target"], "batch": [1], "new_tokens": [1], "seconds": [0.1]}).to_csv(
        p, index=False
    )
    with pytest.raises(DSparkError, match="lacks column 'context_tokens'"):
        read_latency(p)


def test_round_and_position_traces_round_trip(engine, tmp_path):
    ps = make_prompts(
        PromptSetConfig(
            workload="random",
            n_prompts=2,
            prompt_tokens_min=6,
            prompt_tokens_max=10,
            max_new_tokens=20,
        ),
        vocab_size=64,
    )
    recs, reqs = run_requests(engine, ps, 20, lambda: make_controller("hf-heuristic"), "hf")
    assert [q.output_tokens for q in reqs] == [20, 20]
    assert sum(r.emitted for r in recs) == 40 and all(r.controller == "hf" for r in recs)
    p = tmp_path / "rounds.csv"
    pd.DataFrame(records_to_columns(recs)).to_csv(p, index=False)
    back = records_from_rows(pd.read_csv(p).to_dict("records"))
    assert back == recs
    pos, cont = record_positions_full(engine, ps[0], 20)
    assert len(pos) == 20 and cont == reqs[0].tokens  # float64: greedy speculation is exact
    # every position keeps the drafter's whole chain (k_max + 1 confidences)
    assert all(len(r.confidences) == ECFG.k_max + 1 for r in pos)
    q = tmp_path / "positions.csv"
    pd.DataFrame(records_to_columns(pos, PositionRecord)).to_csv(q, index=False)
    assert records_from_rows(pd.read_csv(q).to_dict("records"), PositionRecord) == pos
    assert all(isinstance(r, RoundRecord) for r in back)
    # run lengths agree with the greedy continuation: L(t) >= 1 iff the drafter's first proposal
    # at t was the target's token, which a k = 1 round then accepts
    g = engine.generate(ps[0], 20, make_controller("fixed", {"k": 1}))
    t = 0
    for r in g.records:
        assert r.accepted == min(1, pos[t].run_length, 20 - t - 1)
        t += r.emitted
    assert np.isfinite([r.draft_s for r in recs]).all()
