"""``benchmarks/slo_field_search.py``: its first two trials are the default and the shipped
knee config, its specs parse to the configs they name, and a trial scores its worst part."""

import importlib.util
import sys
from pathlib import Path

import optuna
import pytest

from control.dspark import DSparkConfig
from control.registry import make_config

_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location(
    "slo_field_search", _ROOT / "benchmarks" / "slo_field_search.py"
)
fs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fs)
_sv_spec = importlib.util.spec_from_file_location(
    "slo_value", _ROOT / "benchmarks" / "slo_value.py"
)
sv = importlib.util.module_from_spec(_sv_spec)
_sv_spec.loader.exec_module(sv)


def _config(spec: str) -> DSparkConfig:
    name, cfg, _ = sv.parse_spec(spec, None)
    assert name == "dspark"
    return make_config(name, cfg)


def test_the_first_trial_is_the_default_with_the_ranks_hurdle_off():
    spec = fs.spec_of(fs.suggest(optuna.trial.FixedTrial(fs.START[0])))
    assert _config(spec) == DSparkConfig(slo_rank_hurdle=0.0)


def test_the_second_trial_is_the_shipped_knee_config():
    spec = fs.spec_of(fs.suggest(optuna.trial.FixedTrial(fs.START[1])))
    assert _config(spec) == _config(f"dspark@{_ROOT / 'configs' / 'dspark_knee.toml'}")


def test_switched_options_enter_only_when_on():
    p = dict(fs.START[0], life_on=True, slo_life_horizon=0.5, hor_on=True, slo_horizon_rounds=8.0)
    fields = fs.suggest(optuna.trial.FixedTrial(p))
    assert fields["slo_life_horizon"] == 0.5 and fields["slo_horizon_rounds"] == 8.0
    assert "slo_congested_wait" not in fields
    cfg = _config(fs.spec_of(fields))
    assert (cfg.slo_life_horizon, cfg.slo_horizon_rounds, cfg.slo_calibrate) == (0.5, 8.0, False)


def test_a_trial_scores_its_worst_part():
    pts = fs.points(seeds=(1, 2), past=(1,))
    assert pts == [("conv", 1.24, 1), ("conv", 1.24, 2), ("code", 1.61, 1), ("code", 1.61, 2),
                   ("conv", 1.5, 1)]  # fmt: skip
    ref = [0.90, 0.92, 0.90, 0.90, 0.40]
    s, parts = fs.score([0.91, 0.92, 0.89, 0.90, 0.43], ref, 2)
    assert parts == pytest.approx((0.005, -0.005, 0.03))
    assert s == pytest.approx(-0.005)
