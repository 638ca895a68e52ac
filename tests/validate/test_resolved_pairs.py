"""``metrics.resolved_pairs``: a ranking is checked on the pairs the real repeats tell apart."""

import pandas as pd
from scipy.stats import mannwhitneyu

from validate.metrics import TOLD_APART_P, repeats_of, resolved_pairs, told_apart


def test_at_three_repeats_only_fully_separated_pairs_are_judged():
    runs = {
        "a": [100.0, 104.0, 98.0],
        "b": [101.0, 103.0, 97.0],  # interleaved with a: not told apart
        "c": [130.0, 126.0, 128.0],  # above every repeat of a and b
    }
    sim = {"a": 110.0, "b": 90.0, "c": 140.0}  # swaps a/b (inside the noise), keeps c on top
    assert resolved_pairs(sim, runs) == {"pairs": 2, "same_order": 2, "swapped": []}
    # one repeat of c among those of a and b: the ranks overlap, neither pair is told apart
    runs["c"] = [130.0, 99.0, 128.0]
    assert resolved_pairs(sim, runs)["pairs"] == 0


def test_a_swapped_pair_outside_the_noise_is_named():
    runs = {"fixed": [20.0, 19.0, 21.0], "dspark": [25.0, 26.0, 24.0]}
    out = resolved_pairs({"fixed": 26.0, "dspark": 21.0}, runs)
    assert out == {"pairs": 1, "same_order": 0, "swapped": [["dspark", "fixed"]]}


def test_more_repeats_tell_a_small_steady_gap_apart_despite_a_wide_range():
    # 20 repeats with an outlier each: their ranges overlap widely, the 5% gap is steady
    base = [100.0 + 0.5 * i for i in range(19)]
    runs = {"x": base + [60.0], "y": [v * 1.05 for v in base] + [150.0]}
    p = mannwhitneyu(runs["x"], runs["y"], alternative="two-sided").pvalue
    assert p <= TOLD_APART_P
    assert resolved_pairs({"x": 1.0, "y": 2.0}, runs) == {
        "pairs": 1,
        "same_order": 1,
        "swapped": [],
    }


def test_one_repeat_or_identical_values_tell_nothing_apart():
    assert resolved_pairs({"x": 1.0, "y": 2.0}, {"x": [10.0], "y": [11.0, 12.0]})["pairs"] == 0
    same = {"x": [2.0, 2.0, 2.0], "y": [2.0, 2.0, 2.0]}
    assert resolved_pairs({"x": 1.0, "y": 2.0}, same)["pairs"] == 0


def test_told_apart_reads_one_metrics_error_rows_and_the_real_repeats():
    rows = pd.DataFrame({"controller": ["fixed", "dspark"], "sim": [26.0, 21.0]})
    real = {
        ("fixed", "w"): [{"m": 20.0}, {"m": 19.0}, {"m": 21.0}],
        ("dspark", "w"): [{"m": 25.0}, {"m": 26.0}, {"m": 24.0}],
    }
    want = {"pairs": 1, "same_order": 0, "swapped": [["dspark", "fixed"]]}
    assert told_apart(rows, repeats_of(real, rows["controller"], "w", "m")) == want
