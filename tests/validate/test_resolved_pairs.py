"""``metrics.resolved_pairs``: a ranking is checked on the pairs the real runs tell apart."""

import math

import pandas as pd

from dspark.validation.metrics import resolved_pairs, told_apart


def test_only_pairs_whose_gap_exceeds_both_spreads_are_judged():
    real = {"a": 100.0, "b": 102.0, "c": 130.0}  # a-b 2% apart, c ~25% above both
    spread = {"a": 5.0, "b": 3.0, "c": 4.0}
    sim = {"a": 110.0, "b": 90.0, "c": 140.0}  # swaps a/b (inside the noise), keeps c on top
    out = resolved_pairs(sim, real, spread)
    assert out == {"pairs": 2, "same_order": 2, "swapped": []}


def test_a_swapped_pair_outside_the_noise_is_named():
    real = {"fixed": 20.0, "dspark": 25.0}  # 22% apart
    out = resolved_pairs({"fixed": 26.0, "dspark": 21.0}, real, {"fixed": 10.0, "dspark": 12.0})
    assert out == {"pairs": 1, "same_order": 0, "swapped": [["dspark", "fixed"]]}


def test_a_gap_inside_either_spread_or_an_unknown_spread_tells_nothing_apart():
    real = {"x": 10.0, "y": 11.0}  # 9.5% apart
    sim = {"x": 11.0, "y": 10.0}
    assert resolved_pairs(sim, real, {"x": 2.0, "y": 9.6})["pairs"] == 0
    assert resolved_pairs(sim, real, {"x": 2.0, "y": math.nan})["pairs"] == 0
    assert resolved_pairs(sim, real, {"x": 2.0, "y": 9.4})["swapped"] == [["x", "y"]]


def test_told_apart_reads_one_metrics_error_rows():
    rows = pd.DataFrame(
        {
            "controller": ["fixed", "dspark"],
            "sim": [26.0, 21.0],
            "real": [20.0, 25.0],
            "real_spread": [10.0, 12.0],
        }
    )
    assert told_apart(rows) == {"pairs": 1, "same_order": 0, "swapped": [["dspark", "fixed"]]}
