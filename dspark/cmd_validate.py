"""``dspark validate [CONFIG]``: calibrate the simulator on the real engine, predict held-out runs,
measure them, and write the error table (``kind = "validate"`` run folder).

The last line printed is ``validate_max_abs_error_pct=<x>``: the largest |error| over held-out
controllers x workloads, for throughput and mean accepted length.
"""

from __future__ import annotations

import argparse
from typing import Any

from dspark.args import parse_sets


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("validate", help="measure how well the simulator predicts the engine",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("config", nargs="?", default=None,
                   help="validate TOML (default: configs/validate.toml)")
    p.add_argument("--out", default="runs/validate", help="run folder (default: runs/validate)")
    p.add_argument("--fast", action="store_true",
                   help="tiny random models, small grid and prompt sets "
                   "(CI; configs/validate_tiny.toml)")
    p.add_argument("--repeats", type=int, default=None, help="real runs per pair (override)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (TOML value), e.g. --set engine.device='\"cuda\"'")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dspark.validation.config import load_validate
    from dspark.validation.run import format_table, run_validate

    path = args.config
    if path is None and args.fast:
        path = str(Path(__file__).resolve().parents[1] / "configs" / "validate_tiny.toml")
    ov = parse_sets(args.set)
    if args.repeats is not None:
        ov["repeats"] = args.repeats
    cfg = load_validate(path, ov)
    summary = run_validate(cfg, Path(args.out), quiet=args.quiet)
    import pandas as pd

    err = pd.read_csv(Path(args.out) / "errors.csv")
    print(format_table(err))
    fitted = Path(args.out) / "errors_fitted.csv"
    if fitted.is_file():
        print("\n# statistical acceptance model fitted on the calibration traces (separate):")
        print(format_table(pd.read_csv(fitted)))
    print(f"\nrank agreement (throughput): {summary['rank_agreement']}")
    print(f"headline errors within the real runs' spread: "
          f"{summary['headline_errors_within_real_spread']} of {summary['headline_errors']}; "
          f"largest spread {summary['max_real_spread_pct']:.1f}%")
    print(f"runtime: {summary['runtime_s']:.0f} s; run folder: {args.out}")
    print(f"validate_max_abs_error_pct={summary['max_abs_error_pct']:.3f}")
    return 0
