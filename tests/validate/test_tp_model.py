"""``dspark validate --part tp``'s model of a TP = N engine: the TP = 1 latency table with every
target pass charged the sharded layers' extra time (exact arithmetic on a small table)."""

import pandas as pd
import pytest

from real.tp_profile import side_by_side_factor
from validate.tp import agree_overhead_s, tp_table


def _coll():
    rows = []
    for t, ar, sh in ((1, 1e-4, 2e-3), (4, 1.2e-4, 2.4e-3), (16, 2e-4, 4e-3)):
        rows.append({"kind": "all_reduce", "tokens": t, "seconds": ar, "seconds_mean": 2 * ar})
        rows.append({"kind": "sharded", "tokens": t, "seconds": sh, "seconds_mean": 1.5 * sh})
    return pd.DataFrame(rows)


def test_tp_table_charges_each_target_pass_the_sharded_layers_means():
    table = pd.DataFrame(
        {
            "model": ["target", "target", "target", "drafter"],
            "batch": [1, 1, 2, 1],
            "new_tokens": [1, 4, 8, 1],
            "context_tokens": [0, 0, 0, 0],
            "seconds": [5e-3, 6e-3, 9e-3, 5e-4],
        }
    )
    proj1 = {1: 1e-3, 4: 1.2e-3, 16: 2e-3}  # full-width projections at TP = 1
    out = tp_table(table, proj1, _coll(), layers=2)
    # T = batch x new tokens: 1, 4 and 16 (points on a line: the fitted line goes through them)
    want = [
        5e-3 + 2 * (1.5 * 2e-3 - 1e-3),
        6e-3 + 2 * (1.5 * 2.4e-3 - 1.2e-3),
        9e-3 + 2 * (1.5 * 4e-3 - 2e-3),
        5e-4,  # the drafter is replicated: its rows stand
    ]
    assert out["seconds"].tolist() == pytest.approx(want, rel=1e-12)
    assert table["seconds"].tolist()[0] == 5e-3  # the input is not modified


def test_agree_overhead_prices_each_reading_as_the_broadcast_or_smallest_all_reduce():
    assert agree_overhead_s(_coll(), 3) == pytest.approx(3 * 2e-4, rel=1e-12)
    medians_only = _coll().drop(columns="seconds_mean")
    assert agree_overhead_s(medians_only, 3) == pytest.approx(3 * 1e-4, rel=1e-12)
    bc = [{"kind": "broadcast", "tokens": t, "seconds_mean": m} for t, m in ((1, 3e-5), (4, 5e-5))]
    with_bc = pd.concat([_coll(), pd.DataFrame(bc)], ignore_index=True)
    assert agree_overhead_s(with_bc, 2) == pytest.approx(2 * 4e-5, rel=1e-12)  # their mean


def test_tp_table_uses_the_least_squares_line_over_the_profiled_sizes():
    """One size's mean is noisy; the table charges the line through all of them."""
    coll = pd.DataFrame(
        {"kind": ["sharded"] * 3, "tokens": [1, 2, 3], "seconds_mean": [2e-3, 4e-3, 3e-3]}
    )
    proj1 = {1: 1e-3, 2: 1e-3, 3: 1e-3}  # flat full-width projections
    table = pd.DataFrame(
        {"model": ["target"] * 2, "batch": [1, 1], "new_tokens": [1, 3], "seconds": [5e-3, 5e-3]}
    )
    # the line through (1, 2), (2, 4), (3, 3) ms: slope 0.5 ms, intercept 2 ms
    out = tp_table(table, proj1, coll, layers=2)
    want = [5e-3 + 2 * (2.5e-3 - 1e-3), 5e-3 + 2 * (3.5e-3 - 1e-3)]
    assert out["seconds"].tolist() == pytest.approx(want, rel=1e-12)


def test_ranks_side_by_side_slow_the_unsharded_rest_and_the_drafter():
    """With a ``replicated`` profile (full-width projections on every rank at once) at f times
    the one-process time, the pass's rest and the drafter's rows cost f times their TP = 1 time."""
    proj1 = {1: 1e-3, 4: 1.2e-3, 16: 2e-3}
    coll = _coll()
    side = [{"kind": "replicated", "tokens": t, "seconds_mean": 1.25 * v} for t, v in proj1.items()]
    coll = pd.concat([coll, pd.DataFrame(side)], ignore_index=True)
    table = pd.DataFrame(
        {
            "model": ["target", "drafter"],
            "batch": [1, 1],
            "new_tokens": [4, 1],
            "seconds": [6e-3, 5e-4],
        }
    )
    out = tp_table(table, proj1, coll, layers=2)
    rest = 6e-3 - 2 * 1.2e-3  # the pass without its projections
    want = [1.25 * rest + 2 * 1.5 * 2.4e-3, 1.25 * 5e-4]
    assert out["seconds"].tolist() == pytest.approx(want, rel=1e-12)


def test_a_measured_drafter_factor_replaces_the_projections_factor_on_the_drafter_rows():
    """The drafter's own draft phases timed on every rank at once (``drafter_factor``) scale its
    rows and the draft-phase rows; the target's rows keep the projections' side-by-side
    factor."""
    proj1 = {1: 1e-3, 4: 1.2e-3, 16: 2e-3}
    side = [{"kind": "replicated", "tokens": t, "seconds_mean": 1.25 * v} for t, v in proj1.items()]
    coll = pd.concat([_coll(), pd.DataFrame(side)], ignore_index=True)
    table = pd.DataFrame(
        {
            "model": ["target", "drafter", "draft-phase"],
            "batch": [1, 1, 1],
            "new_tokens": [4, 1, 3],
            "seconds": [6e-3, 5e-4, 2e-3],
        }
    )
    out = tp_table(table, proj1, coll, layers=2, drafter_factor=1.4)
    rest = 6e-3 - 2 * 1.2e-3
    assert out["seconds"].tolist() == pytest.approx(
        [1.25 * rest + 2 * 1.5 * 2.4e-3, 1.4 * 5e-4, 1.4 * 2e-3], rel=1e-12
    )


def test_side_by_side_factor_is_the_ratio_of_summed_means_over_the_common_draft_lengths():
    alone = {1: [1e-3, 3e-3], 4: [6e-3], 8: [9.0]}  # k = 8 was not timed side by side
    side = {1: [3e-3], 4: [9e-3], 2: [5.0]}  # nor k = 2 alone
    assert side_by_side_factor(alone, side) == pytest.approx((3e-3 + 9e-3) / (2e-3 + 6e-3))
    assert side_by_side_factor({}, side) == 1.0
