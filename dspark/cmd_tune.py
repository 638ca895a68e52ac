"""``dspark tune CONFIG.toml``: tune a controller on the simulator with Optuna.

Runs the study of a tuning config (configs/tune_*.toml) with N worker processes on one storage
(a journal file in the run folder by default; ``--storage postgresql://...`` for several
machines), exports the best config as ``best_config.toml`` and judges it against every baseline
and the references (clairvoyant, rate oracle) on the held-out workloads (evaluation.csv). ``--resume`` continues a study;
``--trials`` is the total across all runs and workers. Watch a study live with
``optuna-dashboard <storage>`` (e.g. ``optuna-dashboard runs/tune/study.journal``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dspark.args import command_parser
from tuning.config import OBJECTIVES, SAMPLERS


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = command_parser(subparsers, "tune", "tune a controller on the simulator (Optuna)", __doc__)
    p.add_argument("config", help="tuning config TOML (see configs/tune_*.toml)")
    p.add_argument(
        "--trials",
        type=int,
        default=None,
        metavar="N",
        help="trials in total across workers (default: the config's n_trials)",
    )
    p.add_argument(
        "--storage",
        default=None,
        metavar="URL",
        help="memory | journal (default: OUT/study.journal) | PATH.journal | "
        "sqlite:///PATH | postgresql://USER@HOST/DB",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="W",
        help="worker processes on the storage (default 1)",
    )
    p.add_argument(
        "--objective", choices=OBJECTIVES, default=None, help="override the config's objective"
    )
    p.add_argument(
        "--controller", default=None, metavar="NAME", help="override the controller to tune"
    )
    p.add_argument(
        "--sampler",
        choices=SAMPLERS,
        default=None,
        help="override the config's sampler",
    )
    p.add_argument("--seed", type=int, default=None, help="override the sampler seed")
    p.add_argument("--study-name", default=None, help="override the study name")
    p.add_argument(
        "--out", default=None, metavar="DIR", help="run folder (default runs/tune-<study name>)"
    )
    p.add_argument("--resume", action="store_true", help="continue the study if it exists")
    p.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def run(args: argparse.Namespace) -> int:
    from control.errors import DSparkError
    from tuning.config import load_tuning_config
    from tuning.evaluate import table
    from tuning.run import tune

    if args.workers < 1:
        raise DSparkError(f"--workers {args.workers}: must be >= 1")
    if args.trials is not None and args.trials < 1:
        raise DSparkError(f"--trials {args.trials}: must be >= 1")
    cfg = load_tuning_config(
        args.config,
        n_trials=args.trials,
        objective=args.objective,
        controller=args.controller,
        sampler=args.sampler,
        seed=args.seed,
        study_name=args.study_name,
    )
    out = args.out or f"runs/tune-{cfg.study_name()}"
    progress = not args.quiet

    def log(msg: str) -> None:
        if not args.quiet:
            print(f"tune: {msg}", file=sys.stderr)

    summary = tune(
        cfg,
        out,
        storage=args.storage,
        workers=args.workers,
        resume=args.resume,
        progress=progress,
        evaluate_heldout=not args.no_eval,
        log=log,
    )
    print(
        f"study {summary['study_name']} ({summary['storage']}): {summary['n_trials']} trials "
        f"({summary['n_complete']} complete, {summary['n_pruned']} pruned), "
        f"best trial {summary['best_trial']}: {summary['objective']} = {summary['best_value']}"
    )
    print("best params: " + ", ".join(f"{k}={_fmt(v)}" for k, v in summary["best_params"].items()))
    if summary.get("best_is_default"):
        print(
            f"the best trial is the untuned default (a start point): none of the "
            f"{summary['n_trials']} trials beat it on {summary['objective']}"
        )
    if summary.get("best_scenario"):
        from tuning.scenario import scenario_line

        print(
            f"tuned scenario: {scenario_line(summary['best_scenario'])} "
            f"({summary['controller']}-tuned runs with it; every other entry, each scenario's own)"
        )
    if not args.no_eval:
        import pandas as pd

        df = pd.read_csv(f"{out}/evaluation.csv")
        print(
            f"held-out evaluation (mean over {df['workload'].nunique()} workloads x "
            f"{df['seed'].nunique()} seeds):"
        )
        with pd.option_context("display.width", 160, "display.max_columns", 20):
            print(table(df).to_string(float_format=lambda v: f"{v:.4g}"))
        for line in summary.get("tuned_vs_default", {}).get("lines", []):
            print(line)
    print(f"run folder: {out}  (optuna-dashboard {summary['storage'].removeprefix('journal:')})")
    return 0


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
