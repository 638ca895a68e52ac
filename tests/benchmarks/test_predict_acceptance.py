"""benchmarks/predict_acceptance.py: the population oracle of prompts that all accept alike is
always within 10%, and of prompts that differ it is right only on balanced draws."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from control.types import PositionRecord

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "predict_acceptance", ROOT / "benchmarks" / "predict_acceptance.py"
)
pa = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pa)


def _set(name: str, runs: list[list[int]]) -> dict:
    pos = [[PositionRecord(i, t, r, ()) for t, r in enumerate(p)] for i, p in enumerate(runs)]
    return {"name": name, "positions": pos, "rollouts": []}


def test_the_oracle_is_exact_on_alike_prompts_and_misses_on_unbalanced_draws():
    alike = [_set("code-test-1", [[1, 0] * 8] * 6), _set("code-test-2", [[1, 0] * 8] * 6)]
    assert pa.oracle(alike, 4, 200, 0) == {3: 1.0, 6: 1.0, 12: 1.0}
    # half the prompts accept everything, half nothing: a 3-prompt draw is never balanced
    mixed = [_set("prose-test-1", [[0] * 16] * 12 + [list(range(16, 0, -1))] * 12)]
    got = pa.oracle(mixed, 4, 400, 0)
    assert got[3] == 0.0 and 0.0 < got[12] < 1.0
