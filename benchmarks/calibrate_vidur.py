"""Fit the roofline's collective and weight-read defaults to Vidur's profiled Llama-2-70B table.

``../shared/data/vidur-70b/nonattention_times.csv`` (Agrawal et al., "Vidur", MLSys 2024, MIT)
holds predicted per-step GPU times of Llama-2-70B without attention, lm_head and embedding, at
TP4/TP8 on A100 and H100 DGX nodes (decode batches 1-64, prefills of 512 and 2048 tokens). The
model's matching quantity is ``Roofline.nonattention_seconds(tokens)``.

Fitted (least squares on log time, bw_efficiency 0.8 and compute_efficiency 0.65 held at their
defaults): the all-reduce latency per GPU preset, the NVLink efficiency of ring all-reduce, the
weight-read growth with tokens. Prints the fit, then every cell with the shipped defaults'
error; ``tests/sim/test_calibration.py`` checks the same cells.

    .venv/bin/python benchmarks/calibrate_vidur.py
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = ROOT.parent / "shared" / "data" / "vidur-70b" / "nonattention_times.csv"
SKUS = {"a100": "A100-SXM-80GB", "h100": "H100-SXM"}
MODELS = {"Llama-2-70b-hf": "Llama-2-70B"}


def cells(path: Path = DATA):
    """The table's distinct cells (decode rows do not depend on context): a DataFrame with
    ``preset``, ``model``, ``tp``, ``phase``, ``tokens`` (new tokens of the forward) and
    ``seconds``."""
    import pandas as pd

    d = pd.read_csv(path)
    d = d.drop_duplicates(["model", "sku", "tp", "phase", "batch", "new_tokens"]).copy()
    d["preset"] = d["sku"].map(SKUS)
    d["model"] = d["model"].map(MODELS)
    d["tokens"] = d["batch"] * d["new_tokens"]
    return d.reset_index(drop=True)


def predict(d, overrides: dict | None = None, per_preset: dict | None = None) -> np.ndarray:
    """The model's non-attention seconds for each cell: presets' defaults, ``overrides``
    (HardwareConfig fields), and ``per_preset`` ({preset: {field: value}})."""
    from sim.hardware import HardwareConfig
    from sim.latency import Roofline
    from sim.models import ModelConfig

    out = []
    for r in d.itertuples():
        kw = dict(overrides or {})
        kw.update((per_preset or {}).get(r.preset, {}))
        hw = dataclasses.replace(HardwareConfig(preset=r.preset), **kw).resolved()
        roof = Roofline(ModelConfig(preset=r.model).resolved(), hw, int(r.tp))
        out.append(roof.nonattention_seconds(float(r.tokens)))
    return np.array(out)


def fit(d) -> tuple[dict, np.ndarray]:
    """Least squares on log(model / profiled): returns the fitted values and relative errors."""
    from scipy.optimize import least_squares

    def unpack(x):
        lat = {p: {"allreduce_latency_s": v} for p, v in zip(SKUS.values(), x[:2])}
        return {"nvlink_efficiency": x[2], "weight_read_growth": x[3]}, lat

    def resid(x):
        over, lat = unpack(x)
        return np.log(predict(d, over, lat) / d["seconds"].to_numpy())

    r = least_squares(
        resid, [5e-5, 5e-5, 0.5, 0.1], bounds=([0.0, 0.0, 0.05, 0.0], [5e-4, 5e-4, 1.0, 1.0])
    )
    over, lat = unpack(r.x)
    values = {
        **over,
        **{f"allreduce_latency_s[{p}]": v["allreduce_latency_s"] for p, v in lat.items()},
    }
    return values, np.expm1(r.fun)


def main() -> int:
    d = cells()
    values, err_fit = fit(d)
    print("fit (least squares on log time):")
    for k, v in values.items():
        print(f"  {k} = {v:.4g}")
    print(f"  RMS error {np.sqrt(np.mean(err_fit**2)):.3f}, worst {np.abs(err_fit).max():.3f}")
    err = predict(d) / d["seconds"].to_numpy() - 1
    print("shipped defaults (sim/hardware.py):")
    for r, e in zip(d.itertuples(), err):
        print(
            f"  {r.preset:14s} TP{r.tp} {r.phase:7s} tokens {r.tokens:5d}: profiled "
            f"{r.seconds * 1e3:7.2f} ms, model {r.seconds * (1 + e) * 1e3:7.2f} ms, "
            f"{e:+.1%}"
        )
    print(f"  RMS error {np.sqrt(np.mean(err**2)):.3f}, worst {np.abs(err).max():.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
