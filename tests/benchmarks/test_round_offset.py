"""``benchmarks/noise_floor.py``'s round offset of a saved run, by hand."""

import importlib.util
import math
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "noise_floor.py"
_spec = importlib.util.spec_from_file_location("noise_floor", _PATH)
nf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nf)


def test_round_offset_is_the_rounds_weighted_geometric_mean_of_well_sampled_k():
    check = {
        "min_rounds": 20,
        "by_k": {
            "0": {"rounds": 100, "round_ratio": 1.1},
            "1": {"rounds": 300, "round_ratio": 0.9},
            "9": {"rounds": 5, "round_ratio": 5.0},  # too few rounds: left out
        },
    }
    off, nk = nf.round_offset(check)
    assert nk == 2
    assert off == pytest.approx(math.exp((100 * math.log(1.1) + 300 * math.log(0.9)) / 400))


def test_equal_ratios_pool_to_that_ratio():
    check = {
        "min_rounds": 1,
        "by_k": {str(k): {"rounds": k + 1, "round_ratio": 0.97} for k in range(5)},
    }
    assert nf.round_offset(check) == (pytest.approx(0.97), 5)
