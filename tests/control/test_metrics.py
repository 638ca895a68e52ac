"""control.metrics: the speculation metrics' one definition, the two spreads and the JSON
cleaner."""

import json
import math

import numpy as np

from control.metrics import (
    half_range_pct_of_mean,
    json_safe,
    mean_accepted_length,
    range_pct_of_median,
    record_metrics,
    round_totals,
    speculation_metrics,
)
from control.types import RoundRecord


def test_definitions_by_hand():
    # rounds: (n, k) = (3, 3), (1, 4), (0, 2): Σn = 4, rejections = 2, Σk = 9
    t = round_totals([3, 1, 0], [3, 4, 2])
    assert t == {"rounds": 3, "accepted": 4, "rejected_rounds": 2, "drafted": 9}
    m = speculation_metrics(**t, accepted_emitted=3)
    assert m["mean_accepted_length"] == 1 + 4 / 3
    assert m["acceptance_rate"] == 4 / 6
    assert m["vpr"] == 4 / 9
    assert m["du"] == 3 / 9
    assert "du" not in speculation_metrics(**t)


def test_empty_is_nan():
    m = speculation_metrics(**round_totals([], []))
    assert all(math.isnan(v) for v in m.values())
    assert math.isnan(mean_accepted_length(0, 0))


def test_record_metrics_uses_accepted_not_emitted():
    recs = [
        RoundRecord(
            request_id=0,
            round=i,
            now_s=0.0,
            k=4,
            drafted=4,
            accepted=n,
            emitted=n + 1,
            draft_s=0.0,
            verify_s=0.0,
            context_tokens=0,
        )
        for i, n in enumerate((4, 2))
    ]
    assert record_metrics(recs)["mean_accepted_length"] == 1 + 6 / 2


def test_json_safe():
    v = {
        "a": float("nan"),
        "b": [np.float64(1.5), np.int64(2), (np.bool_(True), float("inf"))],
        3: {"c": None, "d": "x"},
    }
    out = json_safe(v)
    assert out == {"a": None, "b": [1.5, 2, [True, None]], "3": {"c": None, "d": "x"}}
    assert type(out["b"][1]) is int and type(out["b"][2][0]) is bool
    json.dumps(out, allow_nan=False)


def test_the_two_spreads_by_hand():
    # range over median: validation's real_spread, (120 - 90) / 100
    assert range_pct_of_median([90.0, 100.0, 120.0]) == 30.0
    assert range_pct_of_median([5.0, 5.0]) == 0.0
    assert math.isnan(range_pct_of_median([-1.0, 0.0, 1.0]))  # median 0
    # half range over mean: a report's ± over seeds, (110 - 90) / 2 / 100; NaN seeds dropped
    assert half_range_pct_of_mean([90.0, 110.0, float("nan")]) == 10.0
    assert math.isnan(half_range_pct_of_mean([100.0, float("nan")]))  # one seed: no spread
    assert math.isnan(half_range_pct_of_mean([-1.0, 1.0]))  # mean 0
    # two measures, not two spellings of one: 1, 2, 6 -> 5 / 2 and 2.5 / 3
    assert range_pct_of_median([1.0, 2.0, 6.0]) == 250.0
    assert half_range_pct_of_mean([1.0, 2.0, 6.0]) == 2.5 / 3 * 100
