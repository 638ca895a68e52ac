"""Same config and seed -> identical tables; other seeds differ; controllers share arrivals."""

import pandas as pd

from sim import compare, simulate


def test_same_seed_identical_tables(tiny):
    a = simulate(tiny, "fixed", seed=3, trace=True)
    b = simulate(tiny, "fixed", seed=3, trace=True)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.rounds, b.rounds)
    assert pd.Series(a.summary).equals(pd.Series(b.summary))


def test_other_seed_differs(tiny):
    a = simulate(tiny, "fixed", seed=3, baseline=False)
    b = simulate(tiny, "fixed", seed=4, baseline=False)
    assert not a.requests["arrival_s"].equals(b.requests["arrival_s"])
    assert a.summary["output_tokens"] != b.summary["output_tokens"]


def test_controllers_see_identical_arrivals(tiny):
    a = simulate(tiny, "fixed", {"k": 2}, seed=5, baseline=False)
    b = simulate(tiny, "fixed", {"k": 7}, seed=5, baseline=False)
    for col in ("arrival_s", "prompt_tokens", "output_tokens"):
        pd.testing.assert_series_equal(a.requests[col], b.requests[col])
    assert not a.requests["finish_s"].equals(b.requests["finish_s"])


def test_compare_rows_and_determinism(tiny):
    df1 = compare(tiny, ["fixed", ("fixed", {"k": 0})], seed=1, load_scales=(0.5, 2.0))
    df2 = compare(tiny, ["fixed", ("fixed", {"k": 0})], seed=1, load_scales=(0.5, 2.0))
    pd.testing.assert_frame_equal(df1, df2)
    assert list(df1["controller"]) == ["fixed#1", "fixed#2"] * 2
    assert list(df1["load_scale"]) == [0.5, 0.5, 2.0, 2.0]
    # k = 0 with a drafter deployed only pays the drafter's prefill over the plain baseline
    assert 0.95 < df1.loc[1, "speedup"] <= 1.0
    assert df1.loc[2, "offered_rps"] == 4 * df1.loc[0, "offered_rps"]
