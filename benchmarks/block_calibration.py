"""How well does online recalibration calibrate the block drafter's confidence head, and how
well could any calibration do on the same slots?

Input: the ``rounds.csv`` of ``benchmarks/real_speed.py`` runs made with
``--block-recalibration off`` (so the recorded confidences are the head's own, ``σ(z)``, and
its logits ``z`` are recovered exactly). In such runs no controller reads the confidences
(fixed k, and ``dspark`` on its outcomes), so which slots are verified does not depend on the
calibration: replaying the verified slots through a calibrator, round by round and request by
request, gives exactly the confidences an engine running that calibrator would have recorded.

Each of the run's method passes (``block/*`` controllers) is replayed from a fresh calibrator,
as the engine starts each pass from the shipped calibration: each round's slots are predicted
with the calibrator fitted on the rounds before it (prequential), then learned; a round that
drafted nothing forgets a little of its request's offset, as the engine's drafter does.
Printed per run and calibrator: the expected calibration error (10 bins, as ``real_speed.py``'s
``block_conf_ece``) and the mean confidence less the accepted share; and the ECE a perfectly
calibrated head would show on the same sample (outcomes drawn from the confidences the default
calibrator gave, ``--draws`` times: mean and 95th percentile), the floor any calibration meets
on that many slots.

    .venv/bin/python benchmarks/block_calibration.py RUN/unseen-t0/rounds.csv ... \\
        [--calibrators "shipped;map:bin_width=0,request_precision=0;default"]

A calibrator is ``shipped`` (the head as trained), ``default`` (``RecalibrationConfig()``) or
``NAME:key=value,...`` (``RecalibrationConfig`` fields set). Last line:
``block_ece_<calibrator>_max=…`` per calibrator over the runs, then ``block_ece_floor_max=…``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from control.configio import from_mapping, parse_sets  # noqa: E402
from control.errors import DSparkError  # noqa: E402
from real.block_recalibration import (  # noqa: E402
    OnlineCalibration,
    RecalibrationConfig,
    verified_slots,
)
from real.block_train import ece, ece_floor  # noqa: E402

DEFAULT_CALIBRATORS = "shipped;map:bin_width=0,request_precision=0;default"


def load_passes(path: Path) -> list[list[tuple[int, np.ndarray, np.ndarray]]]:
    """Per method pass of the run, its rounds in order: ``(request, logits z, outcomes)`` of
    the slots verification decided (none in a round that drafted nothing). A run that
    recalibrated online is refused (its recorded confidences are not the head's own)."""
    import pandas as pd

    cfg = path.parent / "config.toml"
    if cfg.is_file() and "block_recalibration = false" not in cfg.read_text():
        raise DSparkError(
            f"{path}: recorded with online recalibration; run real_speed.py with "
            "--block-recalibration off so the confidences are the head's own"
        )
    df = pd.read_csv(path)
    missing = {"controller", "request_id", "round", "confidences", "drafted", "accepted"} - set(
        df.columns
    )
    if missing:
        raise DSparkError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
    df = df[df["controller"].astype(str).str.startswith("block/")]
    passes = []
    for _, g in df.groupby("controller", sort=False):
        g = g.sort_values(["request_id", "round"], kind="stable")
        rows = []
        for rid, c, d, n in zip(g["request_id"], g["confidences"], g["drafted"], g["accepted"]):
            cs = np.array(str(c).split() if isinstance(c, str) else [], dtype=float)
            cs = np.clip(cs, 1e-12, 1.0 - 1e-12)
            z, y = verified_slots(list(np.log(cs) - np.log1p(-cs)), int(d), int(n))
            rows.append((int(rid), np.array(z, dtype=float), np.array(y, dtype=float)))
        passes.append(rows)
    return passes


def calibrator(spec: str) -> OnlineCalibration | None:
    """``shipped`` (None: the head's own), ``default`` or ``NAME:key=value,...``."""
    if spec == "shipped":
        return None
    sets = parse_sets([kv for kv in spec.split(":", 1)[1].split(",") if kv]) if ":" in spec else {}
    return OnlineCalibration(from_mapping(RecalibrationConfig, sets, f"calibrator {spec!r}"))


def replay(passes, spec: str) -> tuple[np.ndarray, np.ndarray]:
    """Prequential confidences and outcomes of every verified slot under calibrator ``spec``."""
    conf, hit = [], []
    for rows in passes:
        rc = calibrator(spec)
        for rid, z, y in rows:
            if not len(z):  # a round without a draft (the engine's drafter calls idle)
                if rc is not None:
                    rc.idle(rid)
                continue
            if rc is None:
                conf.append(1.0 / (1.0 + np.exp(-z)))
            else:
                conf.append(rc.apply(z[None, :], [rid])[0])
                rc.learn(z, y, [rid] * len(z))
            hit.append(y)
    return np.concatenate(conf), np.concatenate(hit)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rounds", nargs="+", help="rounds.csv of runs with recalibration off")
    ap.add_argument("--calibrators", default=DEFAULT_CALIBRATORS, help="';'-separated")
    ap.add_argument("--draws", type=int, default=1000, help="draws of the calibrated floor")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    specs = [s.strip() for s in a.calibrators.split(";") if s.strip()]
    try:
        for s in specs:
            calibrator(s)
        runs = [(p, load_passes(Path(p))) for p in a.rounds]
    except (DSparkError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(a.seed)
    worst = dict.fromkeys(specs, 0.0)
    worst_floor = 0.0
    for path, passes in runs:
        n = sum(len(z) for rows in passes for _, z, _ in rows)
        print(f"{path}: {len(passes)} passes, {n} verified slots")
        confs = {}
        for s in specs:
            conf, hit = confs[s] = replay(passes, s)
            score = ece(conf, hit)
            worst[s] = max(worst[s], score)
            print(
                f"  {s:44s} ECE {score:.4f}  confidence - accepted {conf.mean() - hit.mean():+.4f}"
            )
        conf, _ = confs["default"] if "default" in confs else replay(passes, "default")
        mean, p95 = ece_floor(conf, a.draws, rng)
        worst_floor = max(worst_floor, mean)
        print(f"  {'a calibrated head on these slots':44s} ECE {mean:.4f} (95%: {p95:.4f})")
    names = {s: s.split(":", 1)[0] for s in specs}
    print(
        " ".join(f"block_ece_{names[s]}_max={worst[s]:.4f}" for s in specs)
        + f" block_ece_floor_max={worst_floor:.4f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
