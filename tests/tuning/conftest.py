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


class StudyPoll:
    """The trials of one study, read again at each call through one storage and one loaded
    study: a test polling a study under a running ``dspark tune`` (to kill a process at a chosen
    moment) would otherwise open a storage and read every trial afresh per poll (~0.1 s of CPU
    on PostgreSQL, a replay of the whole journal on a file), CPU the processes under test need.
    Optuna's storages read the trials written since the last call (the journal's new lines, the
    database's unfinished trials). Raises what ``optuna.load_study`` raises (``KeyError``,
    ``ValueError``) while the study is not there."""

    def __init__(self, url: str, name: str = "dspark-throughput") -> None:
        self.url, self.name = url, name
        self._storage: optuna.storages.BaseStorage | None = None
        self._study: optuna.Study | None = None

    def trials(self, states: tuple | None = None) -> list:
        from tuning.storage import make_storage

        if self._study is None:
            if self._storage is None:
                self._storage = make_storage(self.url)
            self._study = optuna.load_study(study_name=self.name, storage=self._storage)
        return self._study.get_trials(states=states)


def run_tune(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m dspark tune ARGS`` (no flags added), run to its end: :func:`run_cli`."""
    return run_cli([sys.executable, "-m", "dspark", "tune", *args], timeout)
