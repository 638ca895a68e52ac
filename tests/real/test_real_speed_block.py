"""``benchmarks/real_speed.py``: the block drafter's last line and its confidence ECE."""

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import real_speed  # noqa: E402

from real.block_train import ece  # noqa: E402


def test_block_line_ratios():
    g = {"block_vs_ar": 1.2, "conv_vs_ar": 0.8, "feat_vs_ar": 1.0, "tf_vs_ar": None}
    line = real_speed.block_line(g, 0.25, 0.04)
    assert line == (
        "real_block_draft_cost_vs_ar_k4=0.250 real_block_speedup_vs_ar=1.200 "
        "real_block_vs_best_ar_drafter=1.200 block_conf_ece=0.040"
    )
    assert real_speed.block_line({}, None, None).count("nan") == 4


def test_block_conf_ece_counts_verified_positions(tmp_path):
    """Round 1 drafted 3, accepted 1: positions 0 (hit, 0.9) and 1 (miss, 0.8) verified, 2 not;
    round 2 drafted 2, accepted 2: both hits (0.7, 0.6); other methods' rounds are left out."""
    pd.DataFrame(
        {
            "controller": ["block/fixed-k3", "block/dspark", "conv/fixed-k3"],
            "confidences": ["0.9 0.8 0.1", "0.7 0.6", "0.5"],
            "drafted": [3, 2, 1],
            "accepted": [1, 2, 0],
        }
    ).to_csv(tmp_path / "rounds.csv", index=False)
    got = ece(*real_speed.block_slots(tmp_path / "rounds.csv"))
    conf, hit = np.array([0.9, 0.8, 0.7, 0.6]), np.array([1.0, 0.0, 1.0, 1.0])
    assert got == pytest.approx(ece(conf, hit))
    # bins 9, 8, 7, 6 hold one each: mean |conf - hit| = (0.1 + 0.8 + 0.3 + 0.4) / 4
    assert got == pytest.approx(0.4)
    assert real_speed.block_slots(tmp_path / "missing.csv") is None


def test_the_floor_line_gives_what_a_calibrated_head_scores_on_the_same_slots(tmp_path):
    """Outcomes drawn from the confidences themselves score far below a head that is off by
    0.3 on every slot; the line names the run's ECE, its slot count and that floor."""
    from real.block_train import ece_floor

    rng = np.random.default_rng(3)
    conf = rng.uniform(0.2, 0.9, 2000)
    mean, p95 = ece_floor(conf, 100, np.random.default_rng(0))
    assert 0.0 < mean < p95 < 0.05
    hit = (rng.random(2000) < conf - 0.3).astype(float)  # a head 0.3 too confident
    assert ece(conf, hit) > 0.25 > p95
    pd.DataFrame(
        {
            "controller": ["block/fixed-k3", "block/fixed-k3"],
            "confidences": ["0.9 0.8 0.1", "0.7 0.6"],
            "drafted": [3, 2],
            "accepted": [1, 2],
        }
    ).to_csv(tmp_path / "rounds.csv", index=False)
    line = real_speed.floor_line(real_speed.block_slots(tmp_path / "rounds.csv"), draws=50)
    assert line.startswith("block confidence ECE 0.400 over 4 verified slots; a calibrated head")
    assert real_speed.floor_line(None) is None
