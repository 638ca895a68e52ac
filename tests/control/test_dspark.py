"""The ``dspark`` confidence scheduler: seed rule, block timing, guards, invariants."""

from __future__ import annotations

import itertools
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control import make_controller
from control.configio import from_mapping, to_toml
from control.dspark import DSparkConfig, k_of_alpha
from control.errors import ConfigError
from control.types import OBSERVATION_FIELDS
from control.window import a_hat_of
from tests.control.helpers import obs, run


def seed_config(**kw):
    base = {
        "policy": "seed",
        "alpha_kp": 0.0,
        "alpha_kd": 0.0,
        "alpha_ki": 0.05,
        "beta_kp": 0.0,
        "beta_kd": 0.0,
        "beta_ki": 0.05,
        "warmup_rounds": 0,
        "min_update_rounds": 1,
        "block_tokens": 16,
        "snap_tokens": 0,
        "window_rounds": 2,
        "slo_tpot_s": 0.002,
        "anomaly_detector": "off",
    }
    base.update(kw)
    return base


# (drafted, accepted); emitted = accepted + 1 = 16, 8+8, 4+12, 13+3, 16: blocks of 16 tokens
# close after rounds 0, 2, 4, 6, 7.
SCRIPT = [(15, 15), (15, 7), (15, 7), (15, 3), (15, 11), (15, 12), (15, 2), (15, 15)]


def test_seed_rule_reproduced_exactly():
    c = make_controller("dspark", seed_config())
    rounds = [obs(d, n, draft_s=0.01, verify_s=0.02) for d, n in SCRIPT]
    ds = run(c, rounds)
    assert [i for i, d in enumerate(ds) if d.block_end] == [1, 3, 5, 7, 8]
    # first block end, by hand: window = round 1 only: â = 15/15 = 1; TPOT = 0.03/16 s,
    # latency_ratio = 0.9375: α = 0.8 + 0.05·(1 − 0.6), β = 0.85 − 0.05·(0.9375 − 1)
    assert ds[1].beta == 0.85 - 0.05 * (0.9375 - 1)
    # the seed's two lines, literally, over the whole script (window of 2 rounds)
    alpha, beta, gamma = 0.8, 0.85, 0.05
    expected = []
    for end in (0, 2, 4, 6, 7):
        win = SCRIPT[max(0, end - 1) : end + 1]
        a_hat = a_hat_of([n for _, n in win], [d for d, _ in win])
        ratio = (0.03 * len(win) / sum(n + 1 for _, n in win)) / 0.002
        alpha = alpha + gamma * (a_hat - 0.6)
        beta = min(0.99, max(0.7, beta - gamma * (ratio - 1)))
        expected.append((alpha, beta, k_of_alpha(alpha, 10, 3, 15)))
    assert expected[0][0] == 0.8 + 0.05 * (1.0 - 0.6)
    # replay again, reading α from state() right after each block end
    c.reset()
    got = []
    for o in rounds:
        c.observe(o)
        d = c.decide(o.now_s)
        if d.block_end:
            got.append((c.state()["alpha"], d.beta, d.k))
    assert got == expected
    assert expected[-1][1] == 0.7 and expected[3][2] == 9  # the clip and a k step exercised


def test_block_end_flag_only_on_first_decision_and_cached():
    c = make_controller("dspark", seed_config(window_rounds=4))
    assert c.decide(0.0) is c.decide(0.0)
    c.observe(obs(15, 15))  # closes a block (16 tokens)
    d1, d2 = c.decide(0.0), c.decide(0.0)
    assert d1.block_end and not d2.block_end and d2 is c.decide(0.0)
    assert (d1.k, d1.beta, d1.mode) == (d2.k, d2.beta, d2.mode)


def test_warmup_and_min_interval():
    c = make_controller("dspark", seed_config(warmup_rounds=3, min_update_rounds=3))
    # a block closes every round (16 tokens each)
    for _ in range(8):
        c.observe(obs(15, 15))
        c.decide(0.0)
    # updates at rounds 3, 6 only (warm-up 3 rounds, then every >= 3 rounds)
    assert c.state()["updates"] == 2 and c.state()["block_index"] == 8


def test_k_hysteresis():
    # α moves by 0.02 per block (â = 1, a_target 0.6): α·10 crosses 8.5 -> 9 after 3 blocks
    cfg = seed_config(k_hysteresis=2, slo_tpot_s=1.0)
    c = make_controller("dspark", cfg)
    ks = []
    for _ in range(12):
        c.observe(obs(15, 15))
        ks.append(c.decide(0.0).k)
    assert ks[0] == 8 and 9 not in ks and ks[-1] >= 10
    assert all(b - a in (0, 2, 3) for a, b in itertools.pairwise(ks))


def test_retry_cap_and_cooldown():
    c = make_controller("dspark", seed_config(retry_cap=3, cooldown_rounds=2, block_tokens=512))
    ds = run(
        c,
        [
            obs(8, 0),
            obs(8, 0),
            obs(8, 1),
            obs(8, 0),
            obs(8, 0),
            obs(8, 0),
            obs(0, 0),
            obs(0, 0),
            obs(8, 0),
        ],
    )
    # 2 fails, a success resets, then 3 fails -> 2 plain rounds -> back to k
    assert [d.k for d in ds] == [8, 8, 8, 8, 8, 8, 0, 0, 8, 8]
    assert c.state()["cooldowns"] == 1 and c.state()["fails"] == 1
    # rounds that drafted nothing do not count as failures
    c.reset()
    run(c, [obs(0, 0)] * 5)
    assert c.decide(0.0).k == 8


def collapse_stream(high_rounds=40, low_rounds=12, recover_rounds=80):
    """Blocks of 16 tokens; high acceptance (n=15 of 15), a collapse (n=1 of 15), recovery."""
    return (
        [obs(15, 15)] * high_rounds
        + [obs(15, 1), obs(15, 1)] * (low_rounds // 2)
        + [obs(15, 15)] * recover_rounds
    )


@pytest.mark.parametrize("detector", ["zscore", "cusum"])
@pytest.mark.parametrize("action", ["strict", "reset", "raise_beta"])
def test_anomaly_guard_actions_and_recovery(detector, action):
    cfg = seed_config(
        mode="threshold",
        anomaly_detector=detector,
        anomaly_action=action,
        window_rounds=4,
        recovery_blocks=2,
        baseline_min_blocks=3,
        alpha_ki=0.5,
        slo_tpot_s=1.0,
        cusum_limit=0.1,
        beta_raise=0.05,
    )
    c = make_controller("dspark", cfg)
    hist = []
    for o in collapse_stream():
        d = c.decide(0.0)
        hist.append((d, c.state()))
        c.observe(o)
    flagged = [i for i, (_, s) in enumerate(hist) if s["anomaly"]]
    assert flagged, "collapse not detected"
    first = flagged[0]
    d, s = hist[first]
    if action == "strict":
        assert d.mode == "strict"
    if action == "reset":
        assert s["alpha_integrator"] == 0.8 and s["beta_integrator"] == 0.85
    if action == "raise_beta":
        assert d.beta == pytest.approx(hist[first - 1][0].beta + 0.05) or d.beta == 0.99
    assert all(dd.mode == "threshold" for dd, ss in hist if not ss["anomaly"])
    # recovery begins at round 52; back to normal within window flush + recovery_blocks + slack
    assert max(flagged) < 52 + 12
    assert hist[-1][1]["anomaly"] is False and hist[-1][0].mode == "threshold"


def test_lossy_accept_guard():
    cfg = seed_config(
        mode="threshold",
        lossy_limit=0.2,
        anomaly_action="strict",
        window_rounds=2,
        recovery_blocks=1,
    )
    c = make_controller("dspark", cfg)
    ds = run(c, [obs(15, 15, lossy=1), obs(15, 15, lossy=8), obs(15, 15), obs(15, 15), obs(15, 15)])
    assert [d.mode for d in ds[1:]] == ["threshold", "strict", "strict", "threshold", "threshold"]
    assert c.state()["anomalies"] == 2


def test_wall_clock_tpot_source():
    c = make_controller("dspark", seed_config(tpot_source="wall_clock", window_rounds=4))
    run(c, [obs(7, 7, now_s=0.1), obs(7, 7, now_s=0.116)])  # 16 tokens: block 1
    assert c.state()["latency_ratio"] == pytest.approx(0.016 / 8 / 0.002)


def test_state_has_the_trace_fields_and_reset_restores():
    c = make_controller("dspark")
    run(c, [obs(8, 3, draft_s=0.01, verify_s=0.03, ends=(1,))] * 50)
    st_ = c.state()
    for key in (
        "k",
        "alpha",
        "beta",
        "a_hat",
        "latency_ratio",
        "alpha_integrator",
        "beta_integrator",
        "anomaly",
        "cooldown",
        "block_index",
        "rounds",
    ):
        assert key in st_
    c.reset()
    fresh = make_controller("dspark").state()
    assert c.state() == fresh


@pytest.mark.parametrize(
    "bad, msg",
    [
        ({"alpha_min": 1.2, "alpha_max": 1.0}, "alpha_min = 1.2 > alpha_max = 1.0"),
        ({"alpha0": 0.5, "alpha_min": 0.6}, "alpha0 = 0.5 outside"),
        ({"beta_min": 0.9, "beta_max": 0.8}, "beta_min = 0.9 > beta_max = 0.8"),
        ({"beta0": 0.75, "beta_min": 0.8}, "beta0 = 0.75 outside"),
        ({"k_min": 9, "k_max": 4}, "k_min = 9 > k_max = 4"),
        ({"snap_tokens": 32, "block_tokens": 32}, "snap_tokens = 32 must be < block_tokens"),
        (
            {"alpha_ki": 11.0},
            r"controller.dspark.alpha_ki = 11.0 is out of range; allowed \[0.0, 10.0\]",
        ),
        ({"retry_cap": 4}, r"retry_cap = 4 is out of range; allowed \[1, 3\]"),
        ({"gain": 1.0}, "unknown key 'controller.dspark.gain'"),
    ],
)
def test_bad_configs_are_one_line(bad, msg):
    with pytest.raises(ConfigError, match=msg) as e:
        make_controller("dspark", bad)
    assert "\n" not in str(e.value)


def test_config_has_20_plus_documented_ranged_fields_and_round_trips():
    import dataclasses

    fields = dataclasses.fields(DSparkConfig)
    assert len(fields) >= 20
    for f in fields:
        m = f.metadata
        assert m["doc"] and (m["choices"] or (m["lo"] is not None and m["hi"] is not None)), f.name
    cfg = DSparkConfig(mode="threshold", alpha_kp=0.3, anomaly_detector="cusum")
    assert from_mapping(DSparkConfig, tomllib.loads(to_toml(cfg))) == cfg
    assert cfg.alpha0 == 0.8 and cfg.beta0 == 0.85


# --- property tests ---------------------------------------------------------------------------

round_st = st.tuples(
    st.integers(0, 15),
    st.integers(0, 15),
    st.floats(0.0, 0.05),
    st.floats(0.0, 0.2),
    st.integers(0, 15),
    st.lists(st.integers(0, 15), max_size=2),
)
config_st = st.fixed_dictionaries(
    {
        "policy": st.sampled_from(["goodput", "seed"]),
        "mode": st.sampled_from(["strict", "threshold"]),
        "alpha_kp": st.floats(0, 10),
        "alpha_ki": st.floats(0, 10),
        "alpha_kd": st.floats(0, 10),
        "beta_kp": st.floats(0, 10),
        "beta_ki": st.floats(0, 10),
        "beta_kd": st.floats(0, 10),
        "d_filter": st.floats(0.01, 1.0),
        "block_tokens": st.integers(16, 40),
        "snap_tokens": st.integers(0, 15),
        "warmup_rounds": st.integers(0, 5),
        "min_update_rounds": st.integers(1, 3),
        "window_rounds": st.integers(1, 20),
        "anomaly_detector": st.sampled_from(["zscore", "cusum", "off"]),
        "anomaly_action": st.sampled_from(["reset", "raise_beta", "strict"]),
        "k_hysteresis": st.integers(1, 3),
        "slo_tpot_s": st.floats(0.001, 0.1),
    }
)


@settings(max_examples=120, deadline=None)
@given(cfg=config_st, stream=st.lists(round_st, max_size=120))
def test_invariants_hold_for_any_stream(cfg, stream):
    c = make_controller("dspark", cfg)
    conf = c.config
    t = 0.0
    for drafted, acc, dr_s, ve_s, lossy, ends in stream:
        d = c.decide(t)
        n = min(acc, drafted)
        emitted = n + 1
        t += dr_s + ve_s
        c.observe(
            obs(
                drafted,
                n,
                now_s=t,
                draft_s=dr_s,
                verify_s=ve_s,
                lossy=min(lossy, n),
                ends=tuple(e for e in ends if e < emitted),
            )
        )
        s = c.state()
        assert conf.alpha_min <= s["alpha"] <= conf.alpha_max
        assert conf.alpha_min <= s["alpha_integrator"] <= conf.alpha_max
        assert conf.beta_min <= s["beta"] <= conf.beta_max
        assert conf.beta_min <= s["beta_integrator"] <= conf.beta_max
        if conf.policy == "seed":
            assert d.k == 0 or conf.k_min <= d.k <= conf.k_max
            assert conf.k_min <= s["k"] <= conf.k_max
        else:  # goodput: any length the plan pays for, α at most 1 (pure goodput)
            assert 0 <= d.k <= conf.k_max and s["k"] == conf.k_max
            assert s["alpha"] <= 1.0
        assert d.mode == conf.mode or (d.mode == "strict" and conf.anomaly_action == "strict")


@settings(max_examples=60, deadline=None)
@given(
    detector=st.sampled_from(["zscore", "cusum"]),
    action=st.sampled_from(["reset", "raise_beta", "strict"]),
    high=st.integers(0, 60),
    low=st.integers(1, 30),
    low_n=st.integers(0, 5),
    window=st.integers(1, 16),
    recovery=st.integers(1, 4),
)
def test_returns_to_normal_after_anomaly(detector, action, high, low, low_n, window, recovery):
    cfg = seed_config(
        mode="threshold",
        anomaly_detector=detector,
        anomaly_action=action,
        window_rounds=window,
        recovery_blocks=recovery,
        alpha_ki=0.5,
        slo_tpot_s=1.0,
    )
    c = make_controller("dspark", cfg)
    stream = [obs(15, 15)] * high + [obs(15, low_n)] * low
    for o in stream:
        c.decide(0.0)
        c.observe(o)
    # recovered input: every round fills a 16-token block. The window flushes in `window`
    # rounds (= blocks), the baseline no longer falls, then `recovery` clean block ends.
    # A retry-cap cool-down still running adds its rounds (no block closes during k = 0).
    bound = window + recovery + 2 + DSparkConfig().cooldown_rounds
    for _ in range(bound):
        c.decide(0.0)
        c.observe(obs(15, 15))
    d = c.decide(0.0)
    s = c.state()
    assert not s["anomaly"] and s["cooldown"] == 0
    assert d.mode == "threshold" and d.k >= 3


def test_replaying_a_trace_twice_gives_identical_decisions():
    from pathlib import Path

    import pandas as pd

    from control.types import records_from_rows

    path = Path(__file__).parents[2] / "examples" / "trace_small.csv"
    recs = records_from_rows(pd.read_csv(path).to_dict("records"))

    def once():
        c = make_controller("dspark", {"block_tokens": 32, "warmup_rounds": 4})
        out = []
        for r in recs:
            out.append((c.decide(r.now_s), tuple(sorted(c.state().items(), key=str))))
            c.observe(r.observation())
        return out

    a, b = once(), once()
    assert a == b
    assert sum(d.block_end for d, _ in a) >= 5


@settings(max_examples=60, deadline=None)
@given(
    cfg=config_st,
    stream=st.lists(round_st, max_size=120),
    name=st.sampled_from(["dspark", "fixed", "hf-heuristic", "analytic", "ema-hysteresis"]),
)
def test_observe_values_is_observe(cfg, stream, name):
    """The positional fast path the simulator calls has exactly the effect of observe()."""
    a = make_controller(name, cfg if name == "dspark" else None)
    b = make_controller(name, cfg if name == "dspark" else None)
    t = 0.0
    for drafted, acc, dr_s, ve_s, lossy, ends in stream:
        assert a.decide(t) == b.decide(t)
        n = min(acc, drafted)
        t += dr_s + ve_s
        o = obs(
            drafted,
            n,
            now_s=t,
            draft_s=dr_s,
            verify_s=ve_s,
            lossy=min(lossy, n),
            ends=tuple(e for e in ends if e <= n),
        )
        a.observe(o)
        b.observe_values(*(getattr(o, f) for f in OBSERVATION_FIELDS))
        assert a.state() == b.state()
    assert a.decide(t) == b.decide(t)
