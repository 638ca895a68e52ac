"""``dspark validate [CONFIG]``: calibrate the simulator on the real engine, predict held-out runs,
measure them, and write the error table (``kind = "validate"`` run folder).

Exit status 1 when a headline is above its configured tolerance (``max_error_pct``,
``batched.max_error_pct``, or ``--max-error`` for both; 0 = off), after the full report.

The last line printed is ``validate_max_abs_error_pct=<x> validate_latency_only_max_abs_error_pct=<z>``:
x is the largest |error| over held-out controllers x workloads, for throughput and mean accepted
length, of the PREDICTIVE variant (acceptance predicted from the drafter's confidences on the
held-out prompts, calibrated on the calibration prompts); z the largest throughput |error| with
acceptance replayed from the target's own traces of the held-out prompts (latency only: its
accepted lengths are exact by construction and not counted); with the batched part
(``parts`` holds ``batched``, or ``--part batched``) it also holds
``validate_batched_max_abs_error_pct=<y>``: the largest |error| over held-out controllers x
loads for throughput, TPOT p50 and TTFT p50 (alone when only the batched part runs).
"""

from __future__ import annotations

import argparse
from typing import Any

from dspark.args import command_parser, parse_sets


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = command_parser(
        subparsers, "validate", "measure how well the simulator predicts the engine", __doc__
    )
    p.add_argument(
        "config", nargs="?", default=None, help="validate TOML (default: configs/validate.toml)"
    )
    p.add_argument("--out", default="runs/validate", help="run folder (default: runs/validate)")
    p.add_argument(
        "--fast",
        action="store_true",
        help="tiny random models, small grid and prompt sets (CI; configs/validate_tiny.toml)",
    )
    p.add_argument("--repeats", type=int, default=None, help="real runs per pair (override)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (TOML value), e.g. --set engine.device='\"cuda\"'",
    )
    p.add_argument(
        "--part",
        choices=("all", "batch1", "batched", "tp"),
        default=None,
        help="run only this part (default: the config's parts; all = both)",
    )
    p.add_argument(
        "--max-error",
        type=float,
        default=None,
        metavar="PCT",
        help="exit 1 when a headline |error| is above PCT (overrides the config's "
        "max_error_pct and batched.max_error_pct; 0 = off)",
    )
    p.add_argument(
        "--reanalyze",
        action="store_true",
        help="batched part only: predict and compare again from the measurements "
        "already in --out (its config.toml; no engine run), e.g. after a "
        "simulator change",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from validate.config import load_validate
    from validate.run import run_validate

    path = args.config
    if args.reanalyze:
        return _reanalyze(args)
    if args.part == "tp":  # tensor parallelism (issue 16): its own part, validate/tp.py
        return _run_tp(args)
    if path is None and args.fast:
        path = str(Path(__file__).resolve().parents[1] / "configs" / "validate_tiny.toml")
    ov = parse_sets(args.set)
    if args.repeats is not None:
        ov["repeats"] = args.repeats
    if args.part is not None:
        ov["parts"] = ["batch1", "batched"] if args.part == "all" else [args.part]
    _tolerance_overrides(args, ov)
    cfg = load_validate(path, ov)
    summary = run_validate(cfg, Path(args.out), quiet=args.quiet)
    last = []
    if "batch1" in cfg.parts:
        _print_batch1(summary, args.out)
        last.append(f"validate_max_abs_error_pct={summary['max_abs_error_pct']:.3f}")
        last.append(
            "validate_latency_only_max_abs_error_pct="
            f"{summary['latency_only_max_abs_error_pct']:.3f}"
        )
    if "batched" in cfg.parts:
        _print_batched(summary["batched"], args.out)
        last.append(
            f"validate_batched_max_abs_error_pct={summary['batched']['max_abs_error_pct']:.3f}"
        )
    print(" ".join(last))
    fails = []
    if "batch1" in cfg.parts:
        fails += _over(
            summary["max_abs_error_pct"], cfg.max_error_pct, "validate_max_abs_error_pct"
        )
    if "batched" in cfg.parts:
        fails += _over(
            summary["batched"]["max_abs_error_pct"],
            cfg.batched.max_error_pct,
            "validate_batched_max_abs_error_pct",
        )
    return _exit(fails)


def _run_tp(args: argparse.Namespace) -> int:
    """``dspark validate --part tp [--fast] [--repeats N] [--set tp.KEY=VALUE]``."""
    import sys
    from pathlib import Path

    import pandas as pd

    from control.configio import from_mapping
    from validate.tp import run_tp
    from validate.tp_setup import TPValidateConfig

    data = {k.removeprefix("tp."): v for k, v in parse_sets(args.set).items()}
    if args.fast:
        data.setdefault("tiny", True)
    if args.repeats is not None:
        data["repeats"] = args.repeats
    cfg = from_mapping(TPValidateConfig, data, source="<command line>", prefix="tp")

    def log(msg: str) -> None:
        if not args.quiet:
            print(f"[validate tp] {msg}", file=sys.stderr, flush=True)

    summary = run_tp(cfg, Path(args.out), log)
    df = pd.DataFrame(summary["rows"])
    print(f"\n# TP = {summary['tp']} predicted from TP = 1 + measured collectives (errors_tp.csv)")
    print(df.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(f"tp runtime: {summary['runtime_s']:.0f} s", file=sys.stderr)
    print(f"validate_tp_max_abs_error_pct={summary['max_abs_error_pct']:.3f}")
    return 0


def _tolerance_overrides(args: argparse.Namespace, ov: dict) -> None:
    if args.max_error is not None:
        if args.max_error < 0:
            from control.errors import DSparkError

            raise DSparkError(f"--max-error {args.max_error:g}: must be >= 0")
        ov["max_error_pct"] = args.max_error
        ov["batched.max_error_pct"] = args.max_error


def _over(value: float, tolerance: float, name: str) -> list[str]:
    """``[message]`` when a tolerance is set and ``value`` is above it (or not a number)."""
    import math

    if tolerance > 0 and not value <= tolerance:
        return [
            f"{name}={value:.3f} is above the tolerance {tolerance:g}%"
            + (" (not a number)" if math.isnan(value) else "")
        ]
    return []


def _exit(fails: list[str]) -> int:
    import sys

    for f in fails:
        print(f"dspark: validate: {f}", file=sys.stderr)
    return 1 if fails else 0


def _reanalyze(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from control.errors import DSparkError
    from validate.batched_analysis import analyze_batched
    from validate.config import load_validate
    from validate.harness import log_fn

    out = Path(args.out)
    if not (out / "batched" / "measure.json").is_file():
        raise DSparkError(
            f"{out}: no batched measurements (batched/measure.json); run "
            f"`dspark validate --part batched --out {out}` first"
        )
    ov = parse_sets(args.set)
    _tolerance_overrides(args, ov)
    cfg = load_validate(args.config or out / "config.toml", ov)
    s = analyze_batched(cfg, out, log_fn(args.quiet))
    p = out / "summary.json"
    summary = json.loads(p.read_text()) if p.is_file() else {"kind": "validate"}
    summary["batched"] = s
    from control.metrics import json_safe

    p.write_text(json.dumps(json_safe(summary), indent=1))
    _print_batched(s, args.out)
    print(f"validate_batched_max_abs_error_pct={s['max_abs_error_pct']:.3f}")
    return _exit(
        _over(
            s["max_abs_error_pct"], cfg.batched.max_error_pct, "validate_batched_max_abs_error_pct"
        )
    )


def _print_batched(s: dict, out: str) -> None:
    from pathlib import Path

    import pandas as pd

    from validate.tables import format_table

    print(
        "\n# batched: continuous batching under Poisson arrivals (real.serve), "
        f"capacity {s['capacity_probe'].get('capacity_rps_used', s['capacity_probe']['requests_per_s']):.3f} requests/s "
        f"(probe: {s['capacity_probe']['requests_per_s']:.3f})"
    )
    print(format_table(pd.read_csv(Path(out) / "errors_batched.csv")))
    print(
        f"rank agreement ({s['rank_orders'][next(iter(s['rank_orders']))]['metric']}, "
        f"per load): {s['rank_agreement']}"
    )
    for ld, r in s["rank_orders"].items():
        print(f"  {ld}: sim {r['sim_order']} real {r['real_order']}{_told_apart(r)}")
    print(
        "targets (|error| <= "
        + ", ".join(f"{m} {t:g}%" for m, t in s["targets_pct"].items())
        + f"): {s['within_target']}"
    )
    print(
        f"headline errors within the real runs' spread: "
        f"{s['headline_errors_within_real_spread']} of {s['headline_errors']}; "
        f"largest spread {s['max_real_spread_pct']:.1f}%"
    )
    lc = s.get("latency_check")
    if lc:
        print(
            f"latency model on the real runs' own rounds (real / table): draft + verify median "
            f"{lc['round_ratio_median']:.2f}, range {lc['round_ratio_min']:.2f}-"
            f"{lc['round_ratio_max']:.2f} (the machine's speed per run); draft alone "
            f"{lc['draft_ratio_median']:.2f}, verify alone {lc['verify_ratio_median']:.2f}"
        )
    if s.get("noise_floor"):
        print(noise_line(s["noise_floor"], "batched"))
    if s.get("speed_corrected_max_abs_error_pct") is not None:
        print(
            f"diagnostic, each run predicted at its own measured speed "
            f"(errors_batched_speed_corrected.csv): max |error| "
            f"{s['speed_corrected_max_abs_error_pct']:.1f}%"
        )
    print(
        f"batched runtime: {s['runtime_s']:.0f} s; files: {out}/errors_batched.csv, {out}/batched/"
    )


def _told_apart(order: dict) -> str:
    """The pairs the real runs tell apart (``metrics.resolved_pairs``), as a short clause."""
    t = order.get("told_apart")
    return "" if t is None else f" ({told_apart_text(t)})"


def told_apart_text(t: dict) -> str:
    """``metrics.resolved_pairs``' result in words."""
    from validate.metrics import TOLD_APART_P

    swaps = "".join(f"; swapped {a} / {b}" for a, b in t["swapped"])
    return (
        f"pairs the real repeats tell apart, Mann-Whitney p <= {TOLD_APART_P:g}: "
        f"{t['same_order']} of {t['pairs']} in the same order{swaps}"
    )


def _print_batch1(summary: dict, out: str) -> None:
    from pathlib import Path

    import pandas as pd

    from validate.tables import format_table

    print("# predicted: acceptance from the drafter's confidences on the held-out prompts")
    print(format_table(pd.read_csv(Path(out) / "errors.csv")))
    for name, title in (
        ("errors_replay.csv", "latency only: acceptance replayed from the target's own traces"),
        ("errors_fitted.csv", "i.i.d. acceptance model fitted on the calibration traces"),
    ):
        if (Path(out) / name).is_file():
            print(f"\n# {title} ({name}):")
            print(format_table(pd.read_csv(Path(out) / name)))
    print(f"\nrank agreement (throughput, predicted): {summary['rank_agreement']}")
    for w, r in summary["rank_orders"].items():
        print(f"  {w}: sim {r['sim_order']} real {r['real_order']}{_told_apart(r)}")
    print(f"rank agreement (throughput, replay): {summary['rank_agreement_replay']}")
    print(
        f"headline errors within the real runs' spread (rows with spread > 0): "
        f"{summary['headline_errors_within_real_spread']} of "
        f"{summary['headline_errors_with_spread']} ({summary['headline_errors']} rows in all); "
        f"largest spread {summary['max_real_spread_pct']:.1f}%"
    )
    lc = summary.get("latency_check_by_k") or {}
    if lc.get("max_abs_round_error_pct") is not None:
        print(
            f"per-k round cost (draft + verify) of the held-out real rounds against the "
            f"simulator's table: max |error| {lc['max_abs_round_error_pct']:.1f}% over k with "
            f">= {lc['min_rounds']} rounds (uncorrected profile: "
            f"{lc['max_abs_round_error_pct_uncorrected']:.1f}%)"
        )
    ps = summary.get("prompt_sample")
    if ps:
        k = next(iter(ps.values()))["fixed_k"]
        print(
            f"prompt sample (fixed k = {k} over the greedy traces): "
            + ", ".join(
                f"{w} {v['prompts']} prompts, accepted length {v['accepted_length']:.2f} "
                f"± {v['se_pct']:.1f}%"
                for w, v in ps.items()
            )
            + " (standard error over the prompts, itself rough from a few: an accepted-length "
            "error of about that size is the sample's, not the simulator's)"
        )
    nf = summary.get("noise_floor") or {}
    for key, what in (("predictive", "predicted"), ("latency_only", "latency-only")):
        if nf.get(key):
            print(noise_line(nf[key], what))
    print(f"runtime: {summary['runtime_s']:.0f} s; run folder: {out}")


def noise_line(f: dict, what: str) -> str:
    """One line of ``metrics.noise_floor``'s figures."""
    need = f["repeats_needed_for_p10"]
    return (
        f"noise floor ({what}): a simulator exact on every true value would score max |error| "
        f"{f['max_abs_error_pct_p50']:.1f}% (p90 {f['max_abs_error_pct_p90']:.1f}%) on these "
        f"{f['repeats']} repeats (one run's sd: median {f['run_sd_pct_median']:.1f}% over the "
        f"{f['noisy_rows']} of {f['rows']} rows that vary), over a target in "
        f"{100 * f['p_over_target']:.0f}% of draws; "
        + (f"{need} repeats bring that to <= 10%" if need else "no repeat count up to 50 does")
    )
