"""``benchmarks/controller_value.py``: the B = 256 target's bound on the clairvoyant cells."""

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "controller_value.py"
_spec = importlib.util.spec_from_file_location("controller_value", _PATH)
cv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cv)


def _cell(regime: str, load: str, glob_value: float, best: float, rate: float, tuned: float, clv):
    fixed = dict.fromkeys(cv.FIXED_K, 0.5)
    fixed[2] = glob_value
    return {
        "regime": regime,
        "load": load,
        "metric": "throughput",
        "fixed": fixed,
        "best": best,
        "v": {"rate-oracle": rate, "dspark-tuned": tuned, "clairvoyant": clv},
    }


def test_needed_share_is_the_target_over_what_the_held_cells_and_the_clairvoyant_give():
    cells = [
        _cell("iid-0.75", "B=256", 100.0, 101.0, 103.0, 102.0, 110.0),  # causal best 1.03
        _cell("markov", "B=256", 100.0, 100.0, 100.0, 100.0, 120.0),
        _cell("decay", "B=256", 100.0, 100.0, 100.0, 100.0, 105.0),
        _cell("markov", "B=1", 100.0, 100.0, 100.0, 100.0, 999.0),  # other loads do not count
    ]
    share = cv.b256_needed_share(cells, 2, ("iid",))
    want = (cv.B256_TARGET**3 / 1.03 / (1.20 * 1.05)) ** 0.5
    assert share == pytest.approx(want)
    # every cell held: nothing left to ask of
    assert cv.b256_needed_share(cells, 2, ("iid", "markov", "decay")) is None


def test_tpot_cells_count_lower_as_better():
    c = _cell("iid-0.75", "B=256", 2.0, 1.0, 1.0, 1.0, 1.0)
    c["metric"] = "tpot"
    assert cv._vs_glob(c, 1.0, 2) == pytest.approx(2.0)  # half the TPOT: twice as good
