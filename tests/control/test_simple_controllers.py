"""Table-driven tests of fixed, hf-heuristic, ema-hysteresis and confidence-stop."""

from __future__ import annotations

import pytest

from control import make_controller
from control.errors import ConfigError
from tests.control.helpers import obs, run


def ks(decisions):
    return [d.k for d in decisions]


def test_fixed_constant_and_cached():
    c = make_controller("fixed", {"k": 3, "mode": "threshold", "beta": 0.9})
    ds = run(c, [obs(3, 0), obs(3, 3), obs(3, 1)])
    assert ks(ds) == [3, 3, 3, 3]
    assert all(d is ds[0] for d in ds) and ds[0].mode == "threshold" and ds[0].beta == 0.9
    assert c.state() == {"k": 3, "rounds": 3}
    c.reset()
    assert c.state()["rounds"] == 0


@pytest.mark.parametrize(
    "config, rounds, expected",
    [
        # the example: from 5, [all accepted, partial, all accepted] -> 7, 6, 8
        ({}, [(5, 5), (7, 3), (6, 6)], [5, 7, 6, 8]),
        # floor at 1: k = max(1, k - 1)
        ({"k0": 2}, [(2, 0), (1, 0), (1, 0)], [2, 1, 1, 1]),
        # cap at k_max
        ({"k0": 5, "k_max": 8}, [(5, 5), (7, 7), (8, 8)], [5, 7, 8, 8]),
        # a round that drafted nothing counts as all accepted (HF: n_matches == k)
        ({"k0": 3}, [(0, 0)], [3, 5]),
    ],
)
def test_hf_heuristic_table(config, rounds, expected):
    c = make_controller("hf-heuristic", config)
    assert ks(run(c, [obs(d, n) for d, n in rounds])) == expected
    c.reset()
    assert c.decide(0.0).k == c.config.k0 and c.state()["rounds"] == 0


def test_hf_heuristic_bad_config():
    with pytest.raises(ConfigError, match="k0 = 9 > k_max = 4"):
        make_controller("hf-heuristic", {"k0": 9, "k_max": 4})


def test_ema_hysteresis_table():
    cfg = {
        "candidates": [1, 2, 4],
        "k0": 2,
        "ema_coef": 0.5,
        "up_ratio": 0.75,
        "down_ratio": 0.4,
        "warmup_rounds": 0,
        "update_rounds": 1,
    }
    c = make_controller("ema-hysteresis", cfg)
    # ema: 2 (>= 0.75*2 -> up to 4); 1.5 (<= 0.4*4 -> down to 2); 1.75 (>= 1.5 -> up to 4);
    # 2.875 (between 1.6 and 3 -> stay); 3.4375 (>= 3 -> top of ladder, stay)
    ds = run(c, [obs(2, 2), obs(4, 1), obs(2, 2), obs(4, 4), obs(4, 4)])
    assert ks(ds) == [2, 4, 2, 4, 4, 4]
    assert c.state()["ema_accepted"] == 3.4375
    # at the bottom of the ladder a low EMA stays at the first candidate
    c2 = make_controller("ema-hysteresis", {**cfg, "k0": 1})
    assert ks(run(c2, [obs(1, 0), obs(1, 0)])) == [1, 1, 1]


def test_ema_hysteresis_warmup_and_interval():
    cfg = {
        "candidates": [1, 2, 4],
        "k0": 1,
        "ema_coef": 1.0,
        "warmup_rounds": 3,
        "update_rounds": 2,
    }
    c = make_controller("ema-hysteresis", cfg)
    # every round all accepted (ema = n = k): up only at round 3 (warm-up) then every 2nd round
    ds = run(c, [obs(1, 1), obs(1, 1), obs(1, 1), obs(2, 2), obs(2, 2), obs(4, 4)])
    assert ks(ds) == [1, 1, 1, 2, 2, 4, 4]


@pytest.mark.parametrize(
    "bad, msg",
    [
        ({"candidates": [1, 3, 2]}, "increasing"),
        ({"k0": 7}, "not one of the candidates"),
        ({"down_ratio": 0.9, "up_ratio": 0.8}, "must be < up_ratio"),
    ],
)
def test_ema_hysteresis_bad_config(bad, msg):
    with pytest.raises(ConfigError, match=msg):
        make_controller("ema-hysteresis", bad)


def test_confidence_stop_fixed_tau():
    c = make_controller("confidence-stop", {"k_max": 7, "tau": 0.3})
    ds = run(c, [obs(2, 1, conf=(0.9, 0.2)), obs(7, 7, conf=(0.9,) * 7)])
    assert ks(ds) == [7, 7, 7] and all(d.tau == 0.3 and d.mode == "strict" for d in ds)
    assert c.state()["tau"] == 0.3


def test_confidence_stop_adapts_to_target():
    cfg = {
        "k_max": 6,
        "tau": 0.0,
        "adapt": "target",
        "target_accept": 0.5,
        "bins": 10,
        "window_pairs": 64,
        "min_bin_pairs": 4,
        "update_rounds": 4,
        "tau_max": 0.9,
    }
    c = make_controller("confidence-stop", cfg)
    # each round: tokens of confidence 0.95, 0.85 accepted, then a 0.35 one refused, and a
    # 0.15 token after the rejection that was never verified (must not be counted).
    rounds = [obs(4, 2, conf=(0.95, 0.85, 0.35, 0.15)) for _ in range(4)]
    ds = run(c, rounds)
    assert [d.tau for d in ds] == [0.0, 0.0, 0.0, 0.0, 0.4]  # upper edge of bin [0.3, 0.4)
    assert c.count[1] == 0 and c.count[3] == 4 and c.accepted[3] == 0
    assert c.count[9] == 4 and c.accepted[9] == 4
    # the window (64 pairs) forgets: bin 3 ages out once 64 newer pairs came, tau falls back
    more = [obs(4, 4, conf=(0.95, 0.95, 0.85, 0.85)) for _ in range(16)]
    run(c, more)
    assert c.count[3] == 0 and c.tau == 0.0


def test_confidence_stop_tau_clamped_and_bad_config():
    c = make_controller(
        "confidence-stop",
        {
            "adapt": "target",
            "bins": 4,
            "min_bin_pairs": 1,
            "update_rounds": 1,
            "tau_max": 0.5,
            "tau": 0.1,
        },
    )
    run(c, [obs(1, 0, conf=(0.9,))])
    assert c.tau == 0.5  # bin [0.75, 1) has acceptance 0 -> 1.0, clamped to 0.5
    with pytest.raises(ConfigError, match=r"tau_min = 0\.6 > tau_max = 0\.5"):
        make_controller("confidence-stop", {"tau_min": 0.6, "tau_max": 0.5})


def test_other_controllers_ignore_set_future():
    c = make_controller("fixed", {"k": 2})
    c.set_future(9)
    assert c.decide(0.0).k == 2
