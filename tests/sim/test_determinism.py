"""Same config and seed -> identical tables; other seeds differ; controllers share arrivals."""

import pandas as pd
import pytest

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


class _ObserveOnly:
    """A controller seen only through ``observe(Observation)``, asking for confidences: the
    simulator's slow path (no ``observe_values``, per-token confidence tuples built)."""

    reads_confidences = True

    def __init__(self, inner):
        self.inner, self.decide, self.state = inner, inner.decide, inner.state
        # told what the inner controller is told (the driver's SLOs, the first token's time):
        # only the observe path differs
        self.set_slo, self.first_token = inner.set_slo, inner.first_token
        self.seen_confidences = 0

    def observe(self, obs):
        assert len(obs.confidences) == obs.drafted
        self.seen_confidences += len(obs.confidences)
        self.inner.observe(obs)


@pytest.mark.parametrize(
    "cfg", [{}, {"mode": "threshold", "beta0": 0.75}, {"tau": 0.5, "mode": "threshold"}]
)
def test_fast_observe_path_changes_nothing(tiny, monkeypatch, cfg):
    """observe_values with () confidences (and the confidences drawn but not built) gives the
    same run, to the bit, as observe(Observation) with every confidence handed over.
    Per-sequence decisions throughout: the wrapper hides the members' planner interface."""
    import sim.api

    monkeypatch.setattr(sim.api, "make_planner", lambda name, config: None)
    fast = simulate(tiny, "dspark", cfg, seed=2, baseline=False)
    real_make = sim.api.make_controller
    made = []

    def slow_make(name, config):
        made.append(_ObserveOnly(real_make(name, config)))
        return made[-1]

    monkeypatch.setattr(sim.api, "make_controller", slow_make)
    slow = simulate(tiny, "dspark", cfg, seed=2, baseline=False)
    assert sum(c.seen_confidences for c in made) > 1000
    pd.testing.assert_frame_equal(fast.requests, slow.requests)
    assert pd.Series(fast.summary).equals(pd.Series(slow.summary))
    traced = simulate(tiny, "dspark", cfg, seed=2, baseline=False, trace=True)
    pd.testing.assert_frame_equal(fast.requests, traced.requests)
