"""control.metrics: the speculation metrics' one definition and the JSON cleaner."""

import json
import math

import numpy as np

from control.metrics import (
    json_safe,
    mean_accepted_length,
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
