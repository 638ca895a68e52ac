"""``dspark capacity SCENARIO.toml``: each controller's capacity at the scenario's SLOs.

Capacity at SLO is the highest load scale at which at least ``--attainment`` of the requests
meet both the TTFT and the TPOT SLO of the scenario's ``[slo]`` table, found by bisection on
identical arrivals (each seed's arrival times scaled), per seed. Prints the median over seeds
with its range and writes a run folder (capacity.csv, probes.csv, summary.json, config.toml)
that ``dspark report`` reads.
"""

from __future__ import annotations

import argparse
from typing import Any

from control.errors import DSparkError
from dspark.args import add_out_args, command_parser, parse_sets, run_folder


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = command_parser(subparsers, "capacity", "capacity at SLO of each controller", __doc__)
    p.add_argument("config", help="scenario TOML with an [slo] table (see configs/)")
    p.add_argument(
        "--controller",
        action="append",
        default=None,
        metavar="SPEC",
        help="controller, repeatable: NAME, NAME:key=value,... or NAME@FILE.toml "
        "(default: the scenario's [sim] controllers)",
    )
    p.add_argument(
        "--attainment",
        type=float,
        default=0.9,
        help="share of requests that must meet both SLOs, in (0, 1] (default 0.9)",
    )
    p.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    p.add_argument(
        "--range",
        default="0.05,20",
        metavar="LO,HI",
        help="load scales searched (default 0.05,20)",
    )
    p.add_argument(
        "--start",
        type=float,
        default=None,
        help="first load scale probed (default 1, or the nearest end of --range)",
    )
    p.add_argument("--rel-tol", type=float, default=0.02, help="bisection precision (default 0.02)")
    p.add_argument("--workers", type=int, default=1, help="processes (default 1)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", action="store_true", help="print the per-controller rows as JSON")
    p.add_argument("--no-out", action="store_true", help="write no run folder")
    add_out_args(p, "capacity")
    return p


def _floats(text: str, flag: str, n: int | None = None) -> list[float]:
    import math

    try:
        xs = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DSparkError(f"{flag} {text!r}: expected comma-separated numbers") from None
    if not xs or (n is not None and len(xs) != n) or any(not math.isfinite(x) for x in xs):
        want = f"{n} finite numbers" if n else "finite numbers"
        raise DSparkError(f"{flag} {text!r}: expected {want}")
    return xs


def _seeds(text: str) -> list[int]:
    out = []
    for x in text.split(","):
        x = x.strip()
        if not x.isdigit():
            raise DSparkError(f"--seeds {text!r}: expected comma-separated integers >= 0")
        out.append(int(x))
    return out


def config_of(args: argparse.Namespace):
    from control.errors import ConfigError
    from sim.capacity import CapacityConfig

    lo, hi = _floats(args.range, "--range", 2)
    if not 0 < lo < hi:
        raise DSparkError(f"--range {args.range!r}: expected 0 < LO < HI")
    if not 0.0 < args.attainment <= 1.0:
        raise DSparkError(f"--attainment {args.attainment!r}: allowed (0, 1]")
    if not 0.0 < args.rel_tol < 1.0:
        raise DSparkError(f"--rel-tol {args.rel_tol!r}: allowed (0, 1)")
    if args.workers < 1:
        raise DSparkError(f"--workers {args.workers}: allowed an integer >= 1")
    start = min(max(1.0, lo), hi) if args.start is None else args.start
    try:
        return CapacityConfig(
            attainment=args.attainment, start=start, lo=lo, hi=hi, rel_tol=args.rel_tol
        )
    except ConfigError as e:
        raise DSparkError(str(e).replace("start =", "--start")) from None


def check_has_slo(path: str) -> None:
    """The scenario file must state its SLOs: capacity at SLO means nothing without them."""
    from control.configio import read_toml

    if "slo" not in read_toml(path):
        raise DSparkError(
            f"{path}: no [slo] table: capacity at SLO needs the scenario's SLOs "
            "(add [slo] with ttft_s and tpot_s)"
        )


def run(args: argparse.Namespace) -> int:
    import json

    from control.metrics import json_safe
    from dspark.cmd_simulate import parse_controller_spec
    from sim import load_scenario
    from sim.capacity import capacity, summarize_capacity, write_capacity_folder
    from sim.compare import _items

    cc = config_of(args)
    seeds = _seeds(args.seeds)
    check_has_slo(args.config)
    out = None if args.no_out else run_folder(args.out, args.overwrite, "capacity")
    scn = load_scenario(args.config, parse_sets(args.set) or None)
    specs = (
        [parse_controller_spec(c) for c in args.controller]
        if args.controller
        else list(scn.sim.controllers)
    )
    items = _items(specs)
    results = capacity(scn, items, seeds, cc, workers=args.workers)
    lost = [r for r in results if not r.crossed]
    if lost:
        r = lost[0]
        side = "met" if r.missed != r.missed else "missed"
        edge = cc.hi if side == "met" else cc.lo
        raise DSparkError(
            f"{args.config}: {r.controller} (seed {r.seed}) {side} the {cc.attainment:g} "
            f"attainment target at load scale {edge:g}: the range searched [{cc.lo:g}, "
            f"{cc.hi:g}] never crosses it; widen --range"
        )
    rows = summarize_capacity(results)
    if out is not None:
        write_capacity_folder(out, scn, seeds, cc, results, rows)
    if args.json:
        print(json.dumps([{k: json_safe(v) for k, v in r.items()} for r in rows], indent=1))
        return 0
    print(
        f"scenario {scn.name}: capacity at SLO (TTFT ≤ {scn.slo.ttft_s:g} s, TPOT ≤ "
        f"{scn.slo.tpot_s * 1e3:g} ms for ≥ {cc.attainment:.0%} of requests), "
        f"seeds {','.join(map(str, seeds))}"
    )
    best = max(r["capacity_load_scale"] for r in rows)
    for r in sorted(rows, key=lambda r: -r["capacity_load_scale"]):
        print(
            f"  {r['controller']:<28} load {r['capacity_load_scale']:.3f} "
            f"[{r['capacity_min']:.3f}, {r['capacity_max']:.3f}]  "
            f"{r['capacity_rps']:.2f} req/s  {r['capacity_load_scale'] / best:.3f} of best"
        )
    if out is not None:
        print(f"run folder: {out}")
    return 0
