"""The search space through optuna.trial.FixedTrial: ranges, log scales, conditional fields."""

from __future__ import annotations

import dataclasses

import optuna
import pytest

from control import controller_config_class, controller_names, make_config
from tuning.space import (
    SEED_POINT,
    config_to_params,
    defaults,
    params_to_config,
    space,
    start_points,
    suggest_config,
    suggest_params,
)

THRESHOLD_ONLY = ("beta0", "beta_min", "beta_max", "beta_kp", "beta_ki", "beta_kd", "lossy_limit")


def _meta(controller):
    return {f.name: f.metadata for f in dataclasses.fields(controller_config_class(controller))}


@pytest.mark.parametrize("controller", controller_names())
def test_random_trials_stay_in_range_and_make_valid_configs(controller):
    dims = {d.name: d for d in space(controller)}
    meta = _meta(controller)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(150):
        t = study.ask()
        cfg = suggest_config(t, controller)
        assert isinstance(cfg, controller_config_class(controller))
        for name, v in t.params.items():
            if name.endswith(":on"):
                continue
            d = dims[name]
            if d.kind == "categorical":
                assert v in d.choices
            else:
                assert d.lo <= v <= d.hi, (name, v)
                m = meta[name]
                assert m["lo"] is None or v >= m["lo"]
                assert m["hi"] is None or v <= m["hi"]
                assert getattr(cfg, name) == v
        study.tell(t, 0.0)


def test_dspark_space_covers_its_knobs_with_log_gains_and_block_range():
    dims = {d.name: d for d in space("dspark")}
    for g in ("alpha_kp", "alpha_ki", "alpha_kd", "beta_kp", "beta_ki", "beta_kd"):
        assert dims[g].log and dims[g].zero_switch and dims[g].lo > 0
    assert (dims["block_tokens"].lo, dims["block_tokens"].hi) == (16, 512)
    assert dims["block_tokens"].kind == "int" and dims["block_tokens"].log
    assert dims["k_max"].lo_from == ("k_min", 0)
    assert dims["alpha_min"].hi_from == ("alpha0", 0) and dims["alpha_max"].lo_from == ("alpha0", 0)
    # not knobs: the service's SLO, how TPOT is measured, the model's attention span, the
    # weight of a measured cost profile (it acts only where an engine seeds one, and the
    # tuning scenarios' simulated engines do not), whether the drafter has a confidence head
    # to plan on (the deployment's drafter, not a gain)
    fixed = {
        "slo_tpot_s",
        "tpot_source",
        "span_tokens",
        "profile_prior_rounds",
        "acceptance_source",
    }
    assert not fixed & set(dims)
    # every other field of the config is tuned, but the policy (a study pins it)
    names = {f.name for f in dataclasses.fields(controller_config_class("dspark"))}
    assert names - set(dims) == fixed | {"policy"}
    # the seed policy's α → k fields only under the seed policy, goodput's only under goodput
    assert dict(dims["k_ref"].when) == {"policy": ("seed",)}
    assert dict(dims["prior_trials"].when) == {"policy": ("goodput",)}
    for name in THRESHOLD_ONLY:
        assert dict(dims[name].when) == {"mode": ("threshold",)}


def _strict_params():
    return config_to_params("dspark", {"mode": "strict"})


def test_threshold_fields_are_suggested_only_in_threshold_mode():
    strict = _strict_params()
    assert strict["mode"] == "strict"
    assert not any(p.split(":")[0] in THRESHOLD_ONLY for p in strict)
    # FixedTrial raises on a parameter it does not hold: strict mode never asks for β fields
    cfg = suggest_config(optuna.trial.FixedTrial(strict), "dspark")
    assert cfg.mode == "strict"
    thr = config_to_params("dspark", {"mode": "threshold", "beta0": 0.9, "beta_kp": 0.5})
    for name in ("beta0", "beta_min", "beta_max", "lossy_limit", "beta_kp:on", "beta_kp"):
        assert name in thr
    cfg = suggest_config(optuna.trial.FixedTrial(thr), "dspark")
    assert (cfg.mode, cfg.beta0, cfg.beta_kp) == ("threshold", 0.9, 0.5)
    # ... and threshold mode does ask for them
    missing = {k: v for k, v in thr.items() if k != "beta0"}
    with pytest.raises(ValueError, match="beta0"):
        suggest_config(optuna.trial.FixedTrial(missing), "dspark")


def test_gain_switch_off_means_exactly_zero_and_magnitude_is_not_asked():
    p = _strict_params()
    assert p["alpha_kp:on"] is False and "alpha_kp" not in p
    p["alpha_ki:on"] = False
    del p["alpha_ki"]
    cfg = suggest_config(optuna.trial.FixedTrial(p), "dspark")
    assert cfg.alpha_kp == 0.0 and cfg.alpha_ki == 0.0


def test_conditional_fields_follow_the_anomaly_detector():
    p = _strict_params()
    p["anomaly_detector"] = "off"
    for k in (
        "anomaly_z",
        "anomaly_sigma_floor",
        "baseline_ema",
        "baseline_min_blocks",
        "anomaly_action",
        "recovery_blocks",
    ):
        p.pop(k)
    assert suggest_config(optuna.trial.FixedTrial(p), "dspark").anomaly_detector == "off"
    p["anomaly_detector"] = "cusum"
    with pytest.raises(ValueError, match="cusum_slack"):
        suggest_config(optuna.trial.FixedTrial(p), "dspark")


def test_dependent_bounds_keep_configs_valid():
    pin = {"policy": "seed"}
    p = config_to_params(
        "dspark",
        {"mode": "strict", "k_min": 6, "k_max": 6, "block_tokens": 16, "snap_tokens": 15},
        pin,
    )
    cfg = suggest_config(optuna.trial.FixedTrial(p), "dspark", pin)
    assert (cfg.k_min, cfg.k_max, cfg.snap_tokens) == (6, 6, 15)
    # a sampler can never draw k_max below k_min or snap_tokens >= block_tokens
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(200):
        t = study.ask()
        c = suggest_config(t, "dspark")
        assert c.k_min <= c.k_max and c.snap_tokens < c.block_tokens
        assert c.alpha_min <= c.alpha0 <= c.alpha_max
        study.tell(t, 0.0)


def test_pinned_mode_is_not_suggested():
    params = suggest_params(
        optuna.trial.FixedTrial(
            dict(config_to_params("dspark", {"mode": "threshold"}, {"mode": "threshold"}).items())
        ),
        "dspark",
        {"mode": "threshold"},
    )
    assert params["mode"] == "threshold"
    p = config_to_params("dspark", None, {"mode": "threshold"})
    assert "mode" not in p and "beta0" in p


@pytest.mark.parametrize("controller", controller_names())
def test_start_points_round_trip(controller):
    points = start_points(controller)
    if controller in SEED_POINT:
        pin = {"policy": "seed"}
        seeded = start_points(controller, pin)
        seed_cfg = params_to_config(controller, seeded[0], pin)
        assert (seed_cfg.policy, seed_cfg.mode, seed_cfg.alpha0, seed_cfg.beta0) == (
            "seed",
            "threshold",
            0.8,
            0.85,
        )
        assert params_to_config(controller, seeded[1], pin) == make_config(controller, pin)
        assert len(seeded) == 2
        # a study of the default (goodput) policy does not enqueue the seed policy's point
        assert points == [config_to_params(controller)]
    else:
        assert points == [config_to_params(controller)]
        assert params_to_config(controller, points[0]) == make_config(controller)


def test_defaults_outside_a_narrowed_range_are_refused():
    with pytest.raises(ValueError, match="k_ref"):
        config_to_params("dspark", {"k_ref": 1.5}, {"policy": "seed"})  # outside [2, 32]
    assert defaults("fixed") == {"k": 4, "mode": "strict", "beta": 0.85}
