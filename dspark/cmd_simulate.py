"""``dspark simulate CONFIG.toml``: compare controllers on identical simulated arrivals.

Runs every named controller (default: the scenario's ``[sim] controllers``) on the same seed, so
arrivals, lengths and per-request acceptance are identical, prints one row per controller × load
scale, and writes the run folder (results.csv, summary.json, requests.csv, config.toml; with
--trace also rounds.csv and controller_trace.csv).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from control.errors import DSparkError
from dspark.args import parse_sets

TABLE_COLUMNS = (
    "controller",
    "load_scale",
    "throughput_tokens_per_s",
    "goodput_tokens_per_s",
    "speedup",
    "mean_accepted_length",
    "acceptance_rate",
    "tpot_p50_s",
    "tpot_p99_s",
    "ttft_p99_s",
    "gpu_busy_fraction",
    "requests_unfinished",
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "simulate",
        help="simulate controllers on a GPU-cluster scenario",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("config", help="scenario TOML (see configs/)")
    p.add_argument(
        "--controller",
        action="append",
        default=None,
        metavar="SPEC",
        help="controller to run, repeatable: NAME, NAME:key=value,... (e.g. fixed:k=0) "
        "or NAME@FILE.toml (its [controller.NAME] table, e.g. a tuned "
        "best_config.toml); default: the scenario's [sim] controllers",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--out", default="runs/simulate", help="run folder (default runs/simulate)")
    p.add_argument("--no-out", action="store_true", help="write no run folder")
    p.add_argument("--json", action="store_true", help="print the summary rows as JSON")
    p.add_argument(
        "--trace", action="store_true", help="also write rounds.csv and controller_trace.csv"
    )
    p.add_argument("--loads", default="1", help="comma-separated load scales, e.g. 0.5,1,2")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a scenario key, e.g. workload.rate_rps=3 (TOML value)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _parse_loads(text: str) -> list[float]:
    import math

    try:
        loads = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DSparkError(f"--loads {text!r}: expected comma-separated numbers") from None
    if not loads or any(not math.isfinite(x) or x <= 0 for x in loads):
        raise DSparkError(f"--loads {text!r}: load scales must be finite numbers > 0")
    return loads


def check_seed(seed: int) -> int:
    if seed < 0:
        raise DSparkError(f"--seed {seed}: allowed an integer >= 0")
    return seed


def _names_file(head: str) -> bool:
    from pathlib import Path

    return head.startswith("<") or Path(head).is_file()


def parse_controller_spec(spec: str) -> str | tuple[str, Any, str]:
    """``NAME``, ``NAME:key=value,...`` or ``NAME@FILE.toml`` -> compare() entry with a label."""
    from control.configio import read_toml

    if "@" in spec:
        name, path = spec.split("@", 1)
        tables = read_toml(path).get("controller", {})
        if not isinstance(tables, dict):
            raise DSparkError(
                f"{path}: controller = {tables!r}: expected a table "
                f"[controller.{name}] for --controller {spec!r}"
            )
        table = tables.get(name)
        if table is None:
            raise DSparkError(f"{path}: no [controller.{name}] table for --controller {spec!r}")
        if not isinstance(table, dict):
            raise DSparkError(
                f"{path}: controller.{name} = {table!r}: expected a table "
                f"[controller.{name}] for --controller {spec!r}"
            )
        return (name, table, f"{name}@{path.rsplit('/', 1)[-1].removesuffix('.toml')}")
    if ":" in spec:
        name, body = spec.split(":", 1)
        cfg = parse_sets([kv for kv in body.split(",") if kv.strip()])
        return (name, cfg, spec)
    return spec


def run(args: argparse.Namespace) -> int:
    import json

    from control.metrics import json_safe
    from sim import compare, load_scenario

    check_seed(args.seed)
    loads = _parse_loads(args.loads)
    scn = load_scenario(args.config, parse_sets(args.set) or None)
    names = (
        [parse_controller_spec(c) for c in args.controller]
        if args.controller
        else list(scn.sim.controllers)
    )
    bar = None
    if not args.quiet and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=len(names) * len(loads), desc="simulate", unit="run", file=sys.stderr)
    try:
        df = compare(
            scn,
            names,
            seed=args.seed,
            out_dir=None if args.no_out else args.out,
            load_scales=loads,
            trace=args.trace,
            progress=bar,
        )
    except DSparkError as e:  # a check of the generated requests: name the scenario file
        msg = str(e)
        head = msg.split(": ", 1)[0]
        raise DSparkError(msg if _names_file(head) else f"{args.config}: {msg}") from None
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        rows = [{k: json_safe(v) for k, v in r.items()} for r in df.to_dict("records")]
        print(json.dumps(rows[0] if len(rows) == 1 else rows, indent=1))
    else:
        import pandas as pd

        with pd.option_context(
            "display.width", 200, "display.max_columns", 30, "display.float_format", "{:.4g}".format
        ):
            print(f"scenario {scn.name}, seed {args.seed}")
            print(df[list(TABLE_COLUMNS)].to_string(index=False))
        if not args.no_out:
            print(f"run folder: {args.out}")
    return 0
