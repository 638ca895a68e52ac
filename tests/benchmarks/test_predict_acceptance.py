"""benchmarks/predict_acceptance.py: the fixed-k walk over a position trace takes each round's
run (capped at k) plus the target's token; the population oracle of prompts that all accept
alike is always within 10%, and of prompts that differ it is right only on balanced draws."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "predict_acceptance", ROOT / "benchmarks" / "predict_acceptance.py"
)
pa = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pa)


class _Rec:
    def __init__(self, run: int) -> None:
        self.run_length = run


def _set(name: str, runs: list[list[int]]) -> dict:
    return {"name": name, "positions": [[_Rec(r) for r in p] for p in runs], "rollouts": []}


def test_the_walk_takes_each_rounds_run_capped_at_k_plus_one_token():
    L = np.array([3, 2, 1, 0, 0, 5, 4, 3, 2, 1, 0])
    # k = 6: rounds at 0 (3 + 1), 4 (0 + 1) and 5 (5 + 1): 3 rounds, 11 tokens
    assert pa.walk(L, 6) == (4 + 1 + 6, 3)
    # k = 2: 0 (2 + 1), 3 (0 + 1), 4 (0 + 1), 5 (2 + 1), 8 (2 + 1): 11 tokens in 5 rounds
    assert pa.walk(L, 2) == (11, 5)
    assert pa.walk(np.zeros(7, dtype=int), 4) == (7, 7)  # nothing accepted: a token a round
    # pooled: tokens over rounds of both traces, not the mean of their ratios
    assert pa.accepted_length([L, np.zeros(7, dtype=int)], 6) == pytest.approx(18 / 10)


def test_the_oracle_is_exact_on_alike_prompts_and_misses_on_unbalanced_draws():
    alike = [_set("code-test-1", [[1, 0] * 8] * 6), _set("code-test-2", [[1, 0] * 8] * 6)]
    assert pa.oracle(alike, 4, 200, 0) == {3: 1.0, 6: 1.0, 12: 1.0}
    # half the prompts accept everything, half nothing: a 3-prompt draw is never balanced
    mixed = [_set("prose-test-1", [[0] * 16] * 12 + [list(range(16, 0, -1))] * 12)]
    got = pa.oracle(mixed, 4, 400, 0)
    assert got[3] == 0.0 and 0.0 < got[12] < 1.0
