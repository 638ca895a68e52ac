"""``validate.tables``: the error table, the rank orders and the text table both parts print."""

import pandas as pd
import pytest

from validate.tables import (
    BATCHED_ERROR_COLUMNS,
    ERROR_COLUMNS,
    error_table,
    format_table,
    rank_orders,
)

PREDS = {("a", "light"): {"m": 10.0}, ("b", "light"): {"m": 30.0}}
REAL = {
    ("a", "light"): [{"m": 19.0}, {"m": 20.0}, {"m": 21.0}],
    ("b", "light"): [{"m": 14.0}, {"m": 16.0}, {"m": 15.0}],
}


def test_error_table_columns_and_values():
    err = error_table(PREDS, REAL, ("m",), "load", {"rate_rps": {"light": 2.5}})
    assert tuple(err.columns) == BATCHED_ERROR_COLUMNS
    a, b = err.to_dict("records")
    assert a == {
        "controller": "a",
        "load": "light",
        "rate_rps": 2.5,
        "metric": "m",
        "sim": 10.0,
        "real": 20.0,
        "real_spread": pytest.approx(10.0),  # (21 - 19) / 20
        "error_pct": -50.0,
    }
    assert (b["real"], b["error_pct"]) == (15.0, 100.0)


@pytest.mark.parametrize("higher_is_better", [True, False])
def test_rank_orders_by_direction(higher_is_better):
    err = error_table(PREDS, REAL, ("m",), "load")
    r = rank_orders(err, REAL, "load", ["light"], "m", higher_is_better)["light"]
    # simulated: b (30) above a (10); real: a (20) above b (15): the orders disagree either way
    assert r["sim_order"] == (["b", "a"] if higher_is_better else ["a", "b"])
    assert r["real_order"] == (["a", "b"] if higher_is_better else ["b", "a"])
    assert r["agree"] is False
    assert r["real_repeats"] == {"a": [19.0, 20.0, 21.0], "b": [14.0, 16.0, 15.0]}
    # every repeat of a lies above every repeat of b: Mann-Whitney p = 0.1, told apart, swapped
    assert r["told_apart"] == {"pairs": 1, "same_order": 0, "swapped": [["a", "b"]]}


def test_format_table_aligns_the_columns_of_either_part():
    batch1 = pd.DataFrame(
        [["fixed", "code", "tpot_p50_s", 1.2345678, 1.0, 1.5, 23.4]], columns=ERROR_COLUMNS
    )
    assert format_table(batch1).splitlines() == [
        "controller     workload   metric                           sim        real  spread%   error%",
        "fixed          code       tpot_p50_s                    1.2346           1     1.50   +23.40",
    ]
    batched = pd.DataFrame(
        [["dspark", "light", 2.5, "ttft_p50_s", 0.5, 0.25, 0.0, 100.0]],
        columns=BATCHED_ERROR_COLUMNS,
    )
    assert format_table(batched).splitlines() == [
        "controller     load              rate/s metric                           sim        real  spread%   error%",
        "dspark         light              2.500 ttft_p50_s                       0.5        0.25     0.00  +100.00",
    ]
