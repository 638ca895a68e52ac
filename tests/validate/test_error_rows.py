"""``metrics.error_rows``: each prediction against the median of its real repeats."""

import pytest

from validate.metrics import error_rows


def test_one_row_per_controller_group_and_metric():
    preds = {("dspark", "code"): {"a": 110.0, "b": 1.0}}
    real = {
        ("dspark", "code"): [{"a": 90.0, "b": 2.0}, {"a": 100.0, "b": 2.0}, {"a": 120.0, "b": 2.0}]
    }
    rows = error_rows(preds, real, ("a", "b"), "workload")
    assert rows == [
        {
            "controller": "dspark",
            "workload": "code",
            "metric": "a",
            "sim": 110.0,
            "real": 100.0,
            "real_spread": pytest.approx(30.0),  # (120 - 90) / 100
            "error_pct": pytest.approx(10.0),
        },
        {
            "controller": "dspark",
            "workload": "code",
            "metric": "b",
            "sim": 1.0,
            "real": 2.0,
            "real_spread": 0.0,
            "error_pct": pytest.approx(-50.0),
        },
    ]
