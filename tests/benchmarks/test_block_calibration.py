"""benchmarks/block_calibration.py: the head's logits are recovered exactly from a run's raw
confidences, each pass replays from a fresh calibrator, prequentially and per request, as the
engine would have predicted; runs that recalibrated online, a missing column and a bad
calibrator are one line each."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from control.errors import DSparkError
from real.block_recalibration import OnlineCalibration

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "block_calibration", ROOT / "benchmarks" / "block_calibration.py"
)
bc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bc)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


#: (controller, request, round, head logits of the drafted slots, drafted, accepted)
ROUNDS = [
    ("block/fixed-k4", 0, 0, [2.0, 1.0, -0.5, 0.3], 4, 2),
    ("block/fixed-k4", 0, 1, [1.5, 0.5, 0.2, 0.1], 4, 4),
    ("block/fixed-k4", 1, 0, [0.4, 2.5, 1.0, 0.0], 4, 0),
    ("block/dspark", 0, 0, [3.0, 1.0], 2, 1),
    ("block/dspark", 1, 0, [], 0, 0),
    ("fixed-k4", 0, 0, [1.0], 1, 1),  # not a block method: left out
]


def write_run(folder: Path, recalibrated: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    flag = "true" if recalibrated else "false"
    (folder / "config.toml").write_text(f"[engine]\nblock_recalibration = {flag}\n")
    rows = [
        {
            "controller": c,
            "request_id": r,
            "round": k,
            "confidences": " ".join(repr(float(sigmoid(v))) for v in z) if z else np.nan,
            "drafted": d,
            "accepted": n,
        }
        for c, r, k, z, d, n in ROUNDS
    ]
    path = folder / "rounds.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_the_logits_and_verified_slots_are_recovered(tmp_path):
    passes = bc.load_passes(write_run(tmp_path))
    assert len(passes) == 2
    k4, ds = passes
    assert [(r, len(z), y.tolist()) for r, z, y in k4] == [
        (0, 3, [1.0, 1.0, 0.0]),
        (0, 4, [1.0, 1.0, 1.0, 1.0]),
        (1, 1, [0.0]),
    ]
    assert np.allclose(k4[0][1], [2.0, 1.0, -0.5], rtol=0, atol=1e-12)
    assert [(r, y.tolist()) for r, _, y in ds] == [(0, [1.0, 0.0]), (1, [])]


def test_a_pass_replays_prequentially_from_a_fresh_calibrator(tmp_path):
    passes = bc.load_passes(write_run(tmp_path))
    conf, hit = bc.replay(passes, "shipped")
    z = np.concatenate([z for rows in passes for _, z, _ in rows])
    assert np.allclose(conf, sigmoid(z), rtol=0, atol=1e-12)
    conf, hit = bc.replay(passes, "default")
    want = []
    for rows in passes:  # by hand: each pass fresh, predict then learn, keyed by request
        rc = OnlineCalibration()
        for rid, z, y in rows:
            if not len(z):
                rc.idle(rid)
                continue
            want += rc.apply(z[None, :], [rid])[0].tolist()
            rc.learn(z, y, [rid] * len(z))
    assert conf.tolist() == want
    assert hit.tolist() == [1, 1, 0, 1, 1, 1, 1, 0, 1, 0]
    # the first round of each pass is the shipped head (nothing learned yet)
    assert conf[0] == pytest.approx(sigmoid(2.0), abs=1e-12)
    assert conf[8] == pytest.approx(sigmoid(3.0), abs=1e-12)


def test_bad_inputs_are_one_line(tmp_path, capsys):
    with pytest.raises(DSparkError, match="--block-recalibration off"):
        bc.load_passes(write_run(tmp_path / "on", recalibrated=True))
    path = write_run(tmp_path / "cut")
    pd.read_csv(path).drop(columns=["accepted"]).to_csv(path, index=False)
    with pytest.raises(DSparkError, match=r"missing column.*accepted"):
        bc.load_passes(path)
    good = write_run(tmp_path / "good")
    assert bc.main([str(good), "--calibrators", "x:bin_widht=1", "--draws", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bin_widht" in err[0]
    assert bc.main([str(good), "--draws", "20"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("block_ece_shipped_max=") and "block_ece_floor_max=" in last
