"""Tuning speed: a 200-trial study of the standard tuning config with 2 workers.

The standard tuning config (configs/tune_standard.toml) tunes the dspark controller for
capacity at SLO on four open-loop variants of the tiny scenario (one H100, Llama-3.1-8B with a
Llama-3.2-1B drafter, batch 2 to 96), one simulator seed each: the knees (the default config's
capacity) are searched before the first trial, then a trial bisects each workload's capacity
within ±20 % of its knee (about five simulations per workload).

Times the study only (journal file in a temporary folder, seeded TPE, median pruner); the
held-out evaluation is not part of it. Last line: ``tune_seconds_200_trials=<seconds>``.

    python benchmarks/tune_speed.py [--trials 200] [--workers 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from optuna.trial import TrialState

from tuning.config import load_tuning_config
from tuning.storage import resolve_url
from tuning.study import run_study

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--config", default=str(ROOT / "configs" / "tune_standard.toml"))
    args = ap.parse_args()
    cfg = load_tuning_config(args.config, n_trials=args.trials)
    with tempfile.TemporaryDirectory(prefix="tune-speed-") as d:
        url = resolve_url(None, d)
        t0 = time.perf_counter()
        study = run_study(cfg, url, workers=args.workers)
        seconds = time.perf_counter() - t0
        trials = study.get_trials()
        best, best_n = study.best_value, study.best_trial.number
        n = {s.name: sum(t.state == s for t in trials) for s in TrialState}
    done = n["COMPLETE"] + n["PRUNED"]
    print(
        f"study: {done} trials ({n['COMPLETE']} complete, {n['PRUNED']} pruned, "
        f"{n['FAIL']} failed) with {args.workers} workers"
    )
    print(
        f"best {cfg.tune.objective}: {best:.4g} (trial {best_n}; first start point: "
        f"{trials[0].value:.4g})"
    )
    print(f"tune_seconds_{args.trials}_trials={seconds:.1f}")


if __name__ == "__main__":
    main()
