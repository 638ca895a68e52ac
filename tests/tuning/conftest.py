"""Shared fixtures of the tuning tests: the tiny tuning config and a quiet Optuna."""

from __future__ import annotations

import subprocess
import sys
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


def tune_cli(*args: str) -> list[str]:
    """The command line of a quick ``dspark tune ARGS`` run (quiet, no held-out evaluation)."""
    return [sys.executable, "-m", "dspark", "tune", *args, "--quiet", "--no-eval"]


def run_cli(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """``cmd`` run to its end from the repository root, its output captured as text; past
    ``timeout`` it fails with the end of what the command wrote to stderr."""
    try:
        return subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise AssertionError(
            f"{cmd[2:5]} still running after {timeout} s; stderr: {err[-2000:]}"
        ) from e


def run_tune(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m dspark tune ARGS`` (no flags added), run to its end: :func:`run_cli`."""
    return run_cli([sys.executable, "-m", "dspark", "tune", *args], timeout)
