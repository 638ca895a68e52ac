"""Calibration of the roofline against Vidur's profiled Llama-2-70B non-attention step times
(../shared/data/vidur-70b/, TP4/TP8 on A100 and H100): the shipped defaults hold every cell
within 15% and are the least-squares fit (benchmarks/calibrate_vidur.py)."""

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
calibrate_vidur = pytest.importorskip("calibrate_vidur")

if not calibrate_vidur.DATA.is_file():
    pytest.skip(f"{calibrate_vidur.DATA} not present", allow_module_level=True)


@pytest.fixture(scope="module")
def table():
    return calibrate_vidur.cells()


def test_every_cell_within_15_percent(table):
    err = calibrate_vidur.predict(table) / table["seconds"].to_numpy() - 1
    assert len(table) == 28  # 2 GPUs x 2 TP x (5 decode batches + 2 prefills)
    worst = int(np.argmax(np.abs(err)))
    assert np.abs(err).max() < 0.15, table.iloc[worst].to_dict()
    assert np.sqrt(np.mean(err**2)) < 0.08
    # the step the issue named: 70B TP8 on H100 at batch 1 is no longer ~40% too fast
    h8 = (table["preset"] == "H100-SXM") & (table["tp"] == 8) & (table["tokens"] == 1)
    assert abs(err[h8.to_numpy()][0]) < 0.10


def test_shipped_defaults_are_the_fit(table):
    from sim.hardware import ALLREDUCE_LATENCY_S, NVLINK_EFFICIENCY, WEIGHT_READ_GROWTH

    values, err_fit = calibrate_vidur.fit(table)
    assert ALLREDUCE_LATENCY_S["A100-SXM-80GB"] == pytest.approx(
        values["allreduce_latency_s[A100-SXM-80GB]"], rel=0.05
    )
    assert ALLREDUCE_LATENCY_S["H100-SXM"] == pytest.approx(
        values["allreduce_latency_s[H100-SXM]"], rel=0.05
    )
    assert NVLINK_EFFICIENCY == pytest.approx(values["nvlink_efficiency"], rel=0.05)
    assert WEIGHT_READ_GROWTH == pytest.approx(values["weight_read_growth"], rel=0.05)
    # rounding the fit costs under half a point of RMS error
    err = calibrate_vidur.predict(table) / table["seconds"].to_numpy() - 1
    assert np.sqrt(np.mean(err**2)) < np.sqrt(np.mean(err_fit**2)) + 0.005


def test_decode_weight_reads_grow_with_batch():
    from sim.hardware import hardware_preset
    from sim.latency import Roofline
    from sim.models import ModelConfig

    roof = Roofline(ModelConfig(preset="Llama-2-70B").resolved(), hardware_preset("H100-SXM"), 8)
    one, b64 = roof.nonattention_seconds(1), roof.nonattention_seconds(64)
    assert 1.05 < b64 / one < 1.20  # profiled: +9% (A100 TP4) to +17% (H100 TP8)
    assert roof.weight_read_factor(64) == roof.weight_read_factor(4096) == pytest.approx(1.13)
