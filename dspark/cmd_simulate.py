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
from control.registry import controller_spec
from dspark.args import command_parser, parse_sets, run_folder

#: the printed table: (summary key, header with unit, scale, format)
TABLE = (
    ("controller", "controller", None, "{}"),
    ("load_scale", "load", 1.0, "{:g}"),
    ("throughput_tokens_per_s", "throughput (tok/s)", 1.0, "{:,.0f}"),
    ("goodput_tokens_per_s", "goodput (tok/s)", 1.0, "{:,.0f}"),
    # docs/results-format.md: over plain serving, and over k = 0 with the drafter resident
    ("speedup", "speedup vs no drafter (×)", 1.0, "{:.2f}"),
    ("speedup_resident", "vs k=0+drafter (×)", 1.0, "{:.2f}"),
    ("mean_accepted_length", "accepted/round", 1.0, "{:.2f}"),
    ("acceptance_rate", "â", 1.0, "{:.3f}"),
    ("tpot_p50_s", "TPOT p50 (ms)", 1e3, "{:.1f}"),
    ("tpot_p99_s", "TPOT p99 (ms)", 1e3, "{:.1f}"),
    ("ttft_p99_s", "TTFT p99 (ms)", 1e3, "{:,.0f}"),
    ("gpu_busy_fraction", "GPU busy (%)", 100.0, "{:.1f}"),
    ("requests_unfinished", "unfinished", 1.0, "{:.0f}"),
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = command_parser(
        subparsers, "simulate", "simulate controllers on a GPU-cluster scenario", __doc__
    )
    p.add_argument("config", help="scenario TOML (see configs/)")
    p.add_argument(
        "--controller",
        action="append",
        default=None,
        metavar="SPEC",
        help="controller to run, repeatable: NAME, NAME:key=value,... (e.g. fixed:k=0) "
        "or NAME@FILE.toml (its [controller.NAME] table, e.g. a tuned "
        "best_config.toml, whose [scenario] table, if any, applies to the whole run); "
        "default: the scenario's [sim] controllers",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--out",
        default=None,
        help="run folder (default: a new runs/simulate-<date>-<time>); an existing "
        "run folder is refused unless --overwrite",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run folder --out names if it holds a run",
    )
    p.add_argument("--no-out", action="store_true", help="write no run folder")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the summary rows as a JSON list (one object per row)",
    )
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
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes that run the sweep's points (controller × load); the run folder is "
        "the same as with 1 (default 1)",
    )
    p.add_argument(
        "--storage",
        default=None,
        metavar="URL",
        help="run the points as an Optuna study on this storage (journal: the run folder's "
        "study.journal, journal:PATH, sqlite:///PATH, postgresql://...): the same command "
        "on other machines joins it, a killed worker's point is run again, and each command "
        "writes its run folder once every point is done",
    )
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
        return controller_spec(spec)
    return spec


def tuned_scenario(specs: list[str], sets: dict[str, Any]) -> dict[str, Any]:
    """The ``[scenario]`` tables of the ``NAME@FILE.toml`` specs (a study with
    ``scenario_params`` tunes scenario keys, e.g. the drafter's block size, beside the
    controller) as one dict of dotted overrides for the whole run: every controller is
    compared on the same scenario. Two files that set one key differently, or a file that
    contradicts a ``--set``, are a one-line error naming both."""
    from tuning.export import load_best_scenario

    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for spec in specs:
        if "@" not in spec:
            continue
        path = spec.split("@", 1)[1]
        for key, value in load_best_scenario(path).items():
            if key in sets and sets[key] != value:
                raise DSparkError(
                    f"{path}: [scenario] {key} = {value!r} contradicts --set {key}={sets[key]!r}"
                )
            if key in out and out[key] != value:
                raise DSparkError(
                    f"{path}: [scenario] {key} = {value!r} contradicts {origin[key]}'s "
                    f"{out[key]!r}: the controllers of one run share one scenario"
                )
            out[key], origin[key] = value, path
    return out


def format_table(df) -> str:
    """The summary rows with units in the headers and human numbers (14,620, not 1.462e+04)."""
    import pandas as pd

    from control.metrics import json_safe

    cols = [(k, h, sc, f) for k, h, sc, f in TABLE if k in df.columns]
    shown = pd.DataFrame(
        {
            h: [
                "—" if json_safe(v) is None else f.format(v * sc if sc is not None else v)
                for v in df[k]
            ]
            for k, h, sc, f in cols
        }
    )
    return shown.to_string(index=False)


def _study_url(storage: str | None, out: str | None, workers: int) -> str | None:
    """``--storage`` as a checked storage URL (None without it)."""
    if storage is None:
        return None
    from tuning.storage import resolve_url
    from tuning.sweep import check_storage

    return check_storage(resolve_url(storage, out), workers)


def _study_runner(url: str | None, workers: int, bar: Any) -> Any:
    """With ``--storage``: the sweep's points as an Optuna study (:mod:`tuning.sweep`)."""
    if url is None:
        return None
    from tuning.sweep import run_sweep

    return lambda sweep: run_sweep(sweep, url, workers, bar)


def run(args: argparse.Namespace) -> int:
    import json

    from control.metrics import json_safe
    from sim import compare, load_scenario

    check_seed(args.seed)
    loads = _parse_loads(args.loads)
    if args.workers < 1:
        raise DSparkError(f"--workers {args.workers}: allowed an integer >= 1")
    out = None if args.no_out else run_folder(args.out, args.overwrite, "simulate")
    url = _study_url(args.storage, out, args.workers)
    sets = parse_sets(args.set)
    tuned = tuned_scenario(args.controller or [], sets)
    if tuned and not args.json and not args.quiet:
        print(
            "scenario overrides from the tuned configs: "
            + ", ".join(f"{k}={v!r}" for k, v in tuned.items())
        )
    scn = load_scenario(args.config, {**tuned, **sets} or None)
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
            out_dir=out,
            load_scales=loads,
            trace=args.trace,
            progress=bar,
            workers=args.workers,
            runner=_study_runner(url, args.workers, bar),
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
        print(json.dumps(rows, indent=1))
    else:
        print(f"scenario {scn.name}, seed {args.seed}")
        print(format_table(df))
        if out is not None:
            print(f"run folder: {out}")
    return 0
