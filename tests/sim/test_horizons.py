"""Degenerate horizons: a non-finite or non-positive sim.horizon_s is a config error, and no rate
is computed from a zero-length measurement window (throughput, goodput and speedup are NaN with
the reason, and simulate warns once)."""

from __future__ import annotations

import math
import warnings

import pytest
from conftest import h100_8b_scenario, scenario

from control.errors import ConfigError
from sim import simulate
from sim.api import SimWarning, speedup_of
from sim.metrics import unmeasured_reason


@pytest.mark.parametrize(
    "horizon, allowed",
    [
        (math.inf, "a finite number > 0 (leave it out to run until every request finished)"),
        (0.0, "a finite number > 0 (leave it out to run until every request finished)"),
        (-1.0, ">= 0.0"),  # the field's own range
    ],
)
def test_horizon_must_be_finite_and_positive(horizon, allowed):
    with pytest.raises(ConfigError) as e:
        scenario({"sim": {"horizon_s": horizon}})
    assert str(e.value).endswith(f"sim.horizon_s = {horizon!r} is out of range; allowed {allowed}")


def test_unmeasured_reason_is_empty_exactly_for_a_finite_positive_window():
    assert unmeasured_reason(10.0, 2.0) == ""
    assert unmeasured_reason(5.0, 5.0) == (
        "measurement window from sim.warmup_s = 5 s to the end of the run at 5 s has length 0 "
        "s: throughput, goodput and speedup are undefined"
    )
    assert "has length inf s" in unmeasured_reason(math.inf, 0.0)
    assert "has length nan s" in unmeasured_reason(math.nan, 0.0)
    assert math.isnan(speedup_of(0.01, {"mean_tpot_s": 0.005, "unmeasured_reason": "x"}))
    assert speedup_of(0.01, {"mean_tpot_s": 0.005, "unmeasured_reason": ""}) == 2.0


def test_a_zero_length_window_gives_no_rates(tmp_path):
    """The last request arrives exactly at the end of warm-up and can never fit in KV memory:
    it is rejected at t = 5, the run ends there, and the window [5, 5] has length 0."""
    (tmp_path / "t.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-01-01 00:00:00,100,20\n2024-01-01 00:00:05,9000000,20\n"
    )
    scn = h100_8b_scenario(tmp_path, "t.csv", sim={"warmup_s": 5.0})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        s = simulate(scn, "fixed").summary
    assert s["sim_time_s"] == 5.0 and s["output_tokens"] == 20
    for key in ("throughput_tokens_per_s", "goodput_tokens_per_s", "speedup"):
        assert math.isnan(s[key]), key
    assert s["unmeasured_reason"] == unmeasured_reason(5.0, 5.0)
    texts = [str(w.message) for w in seen if w.category is SimWarning]
    assert f"controller 'fixed': {unmeasured_reason(5.0, 5.0)}" in texts


def test_a_measured_run_has_no_reason(tmp_path):
    (tmp_path / "t.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-01-01 00:00:00,100,20\n2024-01-01 00:00:01,100,20\n"
    )
    s = simulate(h100_8b_scenario(tmp_path, "t.csv"), "fixed").summary
    assert s["unmeasured_reason"] == ""
    assert s["throughput_tokens_per_s"] == pytest.approx(40 / s["sim_time_s"])
    assert s["speedup"] > 0
