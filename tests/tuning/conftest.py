"""Shared fixtures of the tuning tests: the tiny tuning config and a quiet Optuna."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tune_tiny.toml"


@pytest.fixture(autouse=True)
def _quiet_optuna():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield


@pytest.fixture
def tiny_cfg():
    from tuning.config import load_tuning_config

    return load_tuning_config(TINY)
